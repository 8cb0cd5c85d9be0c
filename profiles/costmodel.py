"""CostModel: the time of an op at a shape, answered from a profile.

Fitting is an explicit step, `CostModel.fit(profile)`; the constructor does
nothing but store what a fit produced.

How a query is answered (all interpolation in log(size)-log(time) space):

1. The op's *series* (its parameters other than the size axis, see
   `placeflow.profiles.ops`) was profiled and the size lies within the profiled
   range: piecewise-linear interpolation in log-log space. Exact at profiled
   points; monotone between two neighbours.
2. The series was profiled but the size lies outside: the roofline's shape,
   anchored at the nearest profiled end (t = t_end · R(x) / R(x_end)), so the
   answer is continuous at the end of the data.
3. The series was not profiled: the nearest profiled series (log distance over
   the numeric key parameters; string parameters and world size must match)
   answers at the same size, scaled by the roofline ratio between the two
   shapes ("efficiency transfer").
4. No series of that op matches (e.g. a collective world size never profiled):
   the fitted roofline alone. Across nodes a world size between two profiled
   ones is answered first, by the two series at the same size, linearly in the
   world size (`_flat_collective_s`): a ring's latency grows with its network
   steps, one per node, which the roofline's one fixed overhead cannot follow.

The roofline per *family* (an op; for collectives an op kind and scope) is
R(F, B) = t0 + max(F / P, B / W): a fixed overhead t0, achieved FLOP/s P and
achieved bytes/s W, fitted by least squares on log time. Collectives move
B = bytes · bus_factor(kind, world) per rank, so W is the bus bandwidth; a
collective kind that was not profiled in a scope borrows the all-reduce's
bus bandwidth and latency there (bandwidth is a property of the link).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np

from placeflow.errors import SpecError
from placeflow.profiles import ops
from placeflow.profiles.grid import (
    DISPATCH_TENSOR_BYTES,
    DTYPE_BYTES,
    EMPTY_CALL_PAUSE_S,
    SHARED_PROBE_BYTES,
    SHARED_PROBE_WORLD,
    SHARED_RANKS_PER_CORE,
    WAKE_KINDS,
    WAKE_KINDS_OF,
    cold_model_bytes,
    wake_model_bytes,
)
from placeflow.profiles.schema import (
    DISPATCH_ENTRY_TENSORS,
    PER_TENSOR,
    CollectiveKind,
    CopyDirection,
    DispatchKind,
    Entry,
    FrameworkKind,
    Op,
    Params,
    Profile,
    Scope,
    Source,
    _check_params,
)

FamilyKey = tuple[str, ...]
_T = TypeVar("_T")
SeriesId = tuple[Op, ops.SeriesKey]


class ProfileCoverageError(SpecError):
    """The profile has no entries from which to answer a query."""


def family_key(op: Op, params: Params) -> FamilyKey:
    if op is Op.COLLECTIVE:
        return (op.value, str(params["kind"]), str(params["scope"]))
    if op in (Op.DISPATCH, Op.FRAMEWORK):
        return (op.value, str(params["kind"]))
    return (op.value,)


@dataclass(frozen=True, kw_only=True)
class Roofline:
    """t = overhead_s + max(flops / flops_per_s, bytes / bytes_per_s)."""

    overhead_s: float
    flops_per_s: float
    bytes_per_s: float

    def time_s(self, flops: float, num_bytes: float) -> float:
        return self.overhead_s + max(flops / self.flops_per_s, num_bytes / self.bytes_per_s)


@dataclass(frozen=True, kw_only=True)
class Series:
    """Profiled points of one series: sizes ascending, unique; median times."""

    sizes: tuple[float, ...]
    times_s: tuple[float, ...]
    params: tuple[Mapping[str, int | str], ...] = field(hash=False)


def fit_roofline(flops: np.ndarray, num_bytes: np.ndarray, times_s: np.ndarray) -> Roofline:
    """Least squares on log time over a coarse-to-fine grid of (t0, P, W).

    A grid search rather than a gradient method because max() makes the loss
    non-smooth and there are only three parameters.
    """
    log_t = np.log(times_s)
    has_flops = bool(np.any(flops > 0))
    with np.errstate(divide="ignore"):
        p_hi = float(np.max(flops / times_s)) if has_flops else 1.0
        w_hi = float(np.max(num_bytes / times_s)) if np.any(num_bytes > 0) else 1.0
    t_min = float(np.min(times_s))
    p_grid = np.geomspace(p_hi / 4, p_hi * 4, 25) if has_flops else np.array([np.inf])
    w_grid = np.geomspace(w_hi / 4, w_hi * 4, 25)
    t0_grid = np.concatenate([[0.0], np.geomspace(t_min / 100, t_min * 1.5, 15)])
    best = (math.inf, 0.0, 1.0, 1.0)
    for _ in range(2):  # coarse pass, then a finer pass around the best point
        f_t = flops[None, :] / p_grid[:, None]  # (P, N)
        b_t = num_bytes[None, :] / w_grid[:, None]  # (W, N)
        roof = np.maximum(f_t[:, None, :], b_t[None, :, :])  # (P, W, N)
        for t0 in t0_grid:
            err = np.log(t0 + roof) - log_t
            loss = np.sum(err * err, axis=-1)
            i, j = np.unravel_index(int(np.argmin(loss)), loss.shape)
            if loss[i, j] < best[0]:
                best = (float(loss[i, j]), float(t0), float(p_grid[i]), float(w_grid[j]))
        _, t0b, pb, wb = best
        p_grid = np.geomspace(pb / 1.3, pb * 1.3, 15) if has_flops else p_grid
        w_grid = np.geomspace(wb / 1.3, wb * 1.3, 15)
        t0_grid = np.unique(np.concatenate([[0.0], np.linspace(t0b * 0.7, t0b * 1.3, 9)]))
    _, t0b, pb, wb = best
    return Roofline(overhead_s=t0b, flops_per_s=pb, bytes_per_s=wb)


def _is_exact(name: str, value: int | str) -> bool:
    return name in ops.EXACT_KEY_PARAMS or isinstance(value, str)


def _index_series(
    series: Mapping[SeriesId, Series],
) -> dict[Op, tuple[list[tuple[int | str, ...]], np.ndarray, list[Series]]]:
    grouped: dict[Op, list[tuple[ops.SeriesKey, Series]]] = {}
    for (op, key), s in series.items():
        grouped.setdefault(op, []).append((key, s))
    index = {}
    for op, items in grouped.items():
        names = ops.series_key_names(op)
        exact = [
            tuple(v for n, v in zip(names, key, strict=True) if _is_exact(n, v)) for key, _ in items
        ]
        logs = np.array(
            [
                [math.log(int(v)) for n, v in zip(names, key, strict=True) if not _is_exact(n, v)]
                for key, _ in items
            ],
            dtype=float,
        ).reshape(len(items), -1)
        index[op] = (list(exact), logs, [s for _, s in items])
    return index


def _series_from_entries(entries: list[Entry]) -> Series:
    op = entries[0].op
    ordered = sorted(entries, key=lambda e: ops.size(op, e.params))
    return Series(
        sizes=tuple(ops.size(op, e.params) for e in ordered),
        times_s=tuple(e.median_s for e in ordered),
        params=tuple(e.params for e in ordered),
    )


def _interp_loglog(sizes: tuple[float, ...], times: tuple[float, ...], x: float) -> float:
    """Piecewise-linear in log-log; caller guarantees sizes[0] <= x <= sizes[-1]."""
    i = int(np.searchsorted(sizes, x))
    if sizes[min(i, len(sizes) - 1)] == x:
        return times[min(i, len(sizes) - 1)]
    x0, x1 = math.log(sizes[i - 1]), math.log(sizes[i])
    y0, y1 = math.log(times[i - 1]), math.log(times[i])
    w = (math.log(x) - x0) / (x1 - x0)
    return math.exp(y0 + w * (y1 - y0))


@dataclass(frozen=True, kw_only=True)
class CostModel:
    """Answers op times from a fitted profile. Build it with `CostModel.fit`."""

    profile_name: str
    dtype_bytes: int
    rooflines: Mapping[FamilyKey, Roofline] = field(hash=False)
    # A CPU profile's "nodes" are groups of logical workers on the host it was measured
    # on: a collective between them takes the same loopback as one within a node.
    host_local: bool = False
    # "cpu" or "cuda": on a GPU the host launches kernels asynchronously, so host
    # dispatch and device time overlap (see placeflow.simulator.compute).
    device_kind: str = "cuda"
    series: Mapping[SeriesId, Series] = field(hash=False)
    # The cost model of the host CPU that drives this device, for work done there (the
    # host optimizer step); `registry.fitted_cost_model` attaches the `cpu` profile's.
    host: CostModel | None = field(default=None, hash=False, compare=False, repr=False)
    # FP8 GEMMs (placeflow.workload.Precision): how much faster a GEMM runs in FP8 than
    # in the profile's dtype, from the device's datasheet (0: no FP8 tensor cores);
    # `registry.fitted_cost_model` sets it. `gemm_scale` multiplies every GEMM time of
    # this model: 1 for the profile's dtype, 1/speedup in the view `fp8()` returns.
    fp8_gemm_speedup: float = 0.0
    gemm_scale: float = 1.0
    # Seconds added to every collective within a host by ranks that share its cores with
    # other busy ranks: 0 here, the measured wait in the view `shared_cores()` returns.
    shared_wait_s: float = 0.0
    # The stretch the simulator applies to the calls this view prices (`shared_cores()`,
    # `own_cores()`; 1 otherwise): what a collective's blocked time is divided by here.
    shared_stretch: float = 1.0
    # False in the view `without_blocked_collectives()`: collectives within a CPU host
    # cost their worked part only there (what a call's ranks spend blocked in them is the
    # difference, `blocked_collective_s`).
    blocked_collectives: bool = True
    # The cores of the host a CPU profile was measured on (its provenance; None for
    # other profiles): its collectives of more ranks than that shared those cores while
    # they were timed. `shared`: this is the view `shared_cores()` returns.
    profile_cores: int | None = None
    shared: bool = False
    # The last-level cache of the host a CPU profile was measured on (its provenance;
    # None for other profiles or where it was not recorded).
    host_cache_bytes: int | None = None
    # The level-2 (a core's own) cache of that host, recorded with its `cold_weights`
    # entries; None for other profiles or where it was not recorded.
    host_l2_bytes: int | None = None
    # Per op: exact key parts, log numeric key parts and the series, for nearest lookups.
    series_index: Mapping[Op, tuple[list[tuple[int | str, ...]], np.ndarray, list[Series]]] = field(
        default_factory=dict, hash=False, compare=False, repr=False
    )
    # Answers already given, by (op, parameter values) or a caller's key (`remember`): the
    # simulator asks the same questions thousands of times while the planner re-scores plans.
    _memo: dict[tuple[object, ...], Any] = field(
        default_factory=dict, hash=False, compare=False, repr=False
    )

    # --- fitting ------------------------------------------------------------
    @staticmethod
    def fit(profile: Profile, *, exclude: Entry | None = None) -> CostModel:
        """Fit rooflines per family and index the series; `exclude` leaves one entry out."""
        dtype_bytes = DTYPE_BYTES.get(profile.provenance.dtype, 2)
        families: dict[FamilyKey, list[Entry]] = {}
        by_series: dict[SeriesId, list[Entry]] = {}
        for e in profile.entries:
            if exclude is not None and e.key() == exclude.key():
                continue
            families.setdefault(family_key(e.op, e.params), []).append(e)
            sid = (e.op, ops.series_key(e.op, e.params))
            by_series.setdefault(sid, []).append(e)
        rooflines = {}
        for fam, entries in families.items():
            rooflines[fam] = fit_roofline(
                np.array([ops.flops(e.op, e.params) for e in entries]),
                np.array([ops.bytes_moved(e.op, e.params, dtype_bytes) for e in entries]),
                np.array([e.median_s for e in entries]),
            )
        series = {sid: _series_from_entries(es) for sid, es in by_series.items()}
        return CostModel(
            profile_name=profile.name,
            dtype_bytes=dtype_bytes,
            host_local=profile.device_kind == "cpu",
            device_kind=profile.device_kind,
            profile_cores=_profile_cores(profile),
            host_cache_bytes=_host_cache_bytes(profile),
            host_l2_bytes=_host_size(profile, "l2_bytes"),
            rooflines=rooflines,
            series=series,
            series_index=_index_series(series),
        )

    # --- queries ------------------------------------------------------------
    def _roofline_for(self, op: Op, params: Params) -> Roofline:
        fam = family_key(op, params)
        if fam in self.rooflines:
            return self.rooflines[fam]
        if op is Op.COLLECTIVE:
            borrowed = (op.value, CollectiveKind.ALL_REDUCE.value, str(params["scope"]))
            if borrowed in self.rooflines:
                return self.rooflines[borrowed]
        raise ProfileCoverageError(
            f"profile {self.profile_name!r} has no entries for {' '.join(fam)}; "
            "profile that op on this hardware or use a profile that covers it"
        )

    def _roof(self, op: Op, params: Params) -> float:
        roof = self._roofline_for(op, params)
        return roof.time_s(ops.flops(op, params), ops.bytes_moved(op, params, self.dtype_bytes))

    def _along_series(self, op: Op, s: Series, params: Params) -> float:
        """Time at params' size along series s (interpolated or roofline-anchored)."""
        x = ops.size(op, params)
        if s.sizes[0] <= x <= s.sizes[-1]:
            return _interp_loglog(s.sizes, s.times_s, x)
        end = 0 if x < s.sizes[0] else -1
        anchor = dict(params)
        anchor[ops.size_param(op)] = int(s.sizes[end])
        return s.times_s[end] * self._roof(op, params) / self._roof(op, anchor)

    def _nearest_series(self, op: Op, params: Params) -> Series | None:
        """The profiled series of `op` closest to params' key (exact parts must match)."""
        index = self.series_index.get(op)
        if index is None:
            return None
        exact, logs, candidates = index
        key = ops.series_key(op, params)
        names = ops.series_key_names(op)
        want_exact = tuple(v for n, v in zip(names, key, strict=True) if _is_exact(n, v))
        want_log = np.array(
            [math.log(int(v)) for n, v in zip(names, key, strict=True) if not _is_exact(n, v)]
        )
        mask = np.array([e == want_exact for e in exact])
        if not mask.any():
            return None
        dist = np.abs(logs - want_log).sum(axis=1) if logs.shape[1] else np.zeros(len(exact))
        dist = np.where(mask, dist, np.inf)
        return candidates[int(np.argmin(dist))]

    def time_s(self, op: Op, params: Params) -> float:
        """Seconds for one call of `op` with `params` (see the module docstring)."""
        params = _check_params(op, params, f"cost query {op}")
        s = self.series.get((op, ops.series_key(op, params)))
        if s is not None:
            return self._along_series(op, s, params)
        ref = self._nearest_series(op, params)
        if ref is None:
            return self._roof(op, params)
        ref_params = dict(ref.params[0])
        ref_params[ops.size_param(op)] = params[ops.size_param(op)]
        return (
            self._along_series(op, ref, ref_params)
            * self._roof(op, params)
            / self._roof(op, ref_params)
        )

    def remember(self, key: tuple[object, ...], compute: Callable[[], _T]) -> _T:
        """`compute()` the first time `key` is asked for, the same answer after: the
        memo of quantities derived from this model (a layer's time, a decode step's, the
        shared part of a training call's)."""
        hit = self._memo.get(key)
        if hit is None:
            hit = self._memo[key] = compute()
        return hit

    # Typed, memoised queries for the simulator. Sizes are clamped to at least one unit.
    # The memo key is (op, *parameter values), built before the parameters' dict, which
    # only a first query needs: the planner asks hundreds of thousands of these.
    def _memo_time(self, op: Op, params: dict[str, int | str]) -> float:
        key = (op, *params.values())
        hit = self._memo.get(key)
        if hit is None:
            hit = self._memo[key] = self.time_s(op, params)
        return hit

    def gemm_s(self, m: int, n: int, k: int) -> float:
        m, n, k = max(1, m), max(1, n), max(1, k)
        key = (Op.GEMM, m, n, k)
        hit = self._memo.get(key)
        if hit is None:
            params: dict[str, int | str] = {"m": m, "n": n, "k": k}
            hit = self._memo[key] = self.time_s(Op.GEMM, params) * self.gemm_scale
        return hit

    def fp8(self) -> CostModel:
        """This model with GEMMs in FP8: each GEMM's time divided by the datasheet's FP8
        speedup (compute and weight-read roofs both halve on Hopper and Blackwell; the
        fixed cost of a small GEMM and the activations' quantisation are not priced,
        so this is the most FP8 gives). Its own memo; SpecError without FP8."""
        if self.fp8_gemm_speedup <= 0:
            raise SpecError(
                f"profile {self.profile_name!r} has no FP8 tensor cores (its datasheet has "
                "no FP8 peak): use bf16, or a pool of H100, H800, H20, B200 or GB200 GPUs"
            )
        return self.remember(
            ("fp8 view",),
            lambda: dataclasses.replace(
                self, gemm_scale=self.gemm_scale / self.fp8_gemm_speedup, _memo={}
            ),
        )

    def shared_cores(self, stretch: float) -> CostModel:
        """This model for ranks whose calls the simulator stretches by `stretch` (> 1):
        their host runs more busy ranks than cores, each getting a share of one and
        paying the time slices' overhead (`sliced` of the busy ranks per core on the
        measured `slicing` curve); the simulator asks for it only there.

        A collective also waits for its partners to be scheduled, which the profile's
        `shared_collective` entry measured (2 ranks per core, `profiles.shared_cores`):
        the view adds it to every collective within a host, divided by `stretch`
        because the simulator stretches the call's whole time by it afterwards; the part
        of a collective its ranks wait blocked (`blocked_collective_s`) is divided by
        `stretch` too, for the same reason. A collective of more ranks than the
        profiling host had cores was timed with its ranks sharing those cores, its
        waits and slices included: the view takes its entry's worked part back to a
        core per rank (times cores / ranks, and less the slices' overhead at that
        sharing) and adds no wait, and the stretch gives it this host's sharing. The
        model itself where none of this applies (no oversubscription, or not a CPU
        profile); no wait where the entry is missing."""
        if stretch <= 1.0 or not self.host_local:
            return self
        return self.remember(
            ("shared view", stretch),
            lambda: dataclasses.replace(
                self,
                shared_wait_s=self.partner_wait_s() / stretch,
                shared_stretch=stretch,
                shared=True,
                _memo={},
            ),
        )

    def own_cores(self, stretch: float) -> CostModel:
        """This model for ranks on cores of their own whose calls the simulator stretches
        by `stretch` (> 1) all the same: busy ranks on a host's other cores cost one
        another (its memory and shared caches; the measured `slicing` curve at one rank
        per core, 1.30x on the 2-core VM's fidelity profile).

        That stretch is the ranks' work's. The part of a collective its ranks wait
        blocked (`blocked_collective_s`) and the latency a partner's data costs after
        compute (`paired_collective_s`) were measured with one rank per core, as these
        ranks run, and a blocked rank does no work to slow down: the view divides both by
        `stretch`, which the simulator multiplies the call by afterwards, as
        `shared_cores` does. No partner wait is added (every rank has its core). On the
        2-core VM a tensor-parallel critic (2 ranks, 38 collectives per update) was
        priced 177 ms per update alone with its blocked part stretched, 151 ms without;
        the executor ran it in 125 ms alone, 60 ms of it off a core, and in 134 ms beside
        the actor's update (`benchmarks/inrun_calls.py --plan ppo-tiny-cpu4-split
        [--serial]`, 2026-11-29). The model itself where the stretch is 1 or the profile
        is not a CPU host's."""
        if stretch <= 1.0 or not self.host_local:
            return self
        return self.remember(
            ("own-cores view", stretch),
            lambda: dataclasses.replace(self, shared_stretch=stretch, _memo={}),
        )

    def partner_wait_s(self) -> float:
        """What a collective adds to a rank's wall time on a host running two busy ranks
        per core beyond its own time there: 0 where the profile has no `shared_collective`
        entry (GPU profiles, older CPU ones).

        The entry (`profiles.shared_cores`) is the whole wall time the probe, an
        all-reduce of SHARED_PROBE_BYTES within a pair, adds to each rank's loop at
        SHARED_RANKS_PER_CORE ranks per core: the all-reduce's own time included. The
        shared view prices a collective as its profiled time stretched by the host's
        sharing plus this wait, so the wait is the entry less the probe's own profiled
        time stretched at the entry's sharing (`sliced`); never below 0, where the
        probe's entry alone already holds more than the whole (a host whose small
        collectives wait on their partners even on cores of their own).
        """
        probe = self._shared_probe_s()
        if probe is None:
            return 0.0
        whole, own = probe
        return max(0.0, whole - own * sliced(SHARED_RANKS_PER_CORE, self.slicing()))

    def coupled_wait_s(self) -> float:
        """What a collective adds to a rank's wall time on a host running two busy ranks
        per core where the call's collectives go through two groupings of its ranks in
        turn (ZeRO-3's gathers over the data-parallel pairs between a tensor-parallel
        layer's all-reduces): the pairs' wait (`partner_wait_s`) and what the profile's
        `coupled_collective` entry measured beyond its `shared_collective` entry, the
        same probe's all-reduce in fixed pairs, timed by the same command. A rank of
        fixed pairs waits for its one partner; here each collective waits on a partner
        that waited on another pair's rank before it, so that every rank of the set runs
        in step with every other and more of its collectives find their partner off its
        core (on the 2-core VM the coupled probe added 2.5-2.9 ms a collective, the fixed
        pairs 1.5-2.0 ms, at compute chunks of 0.3-4.4 ms; `profiles.shared_cores`). The
        pairs' wait alone where the profile has no such entry (older CPU profiles; GPU
        ones: 0)."""
        kind = FrameworkKind.COUPLED_COLLECTIVE
        probe = self._shared_probe_s()
        if (Op.FRAMEWORK, (kind.value,)) not in self.series or probe is None:
            return self.partner_wait_s()
        pairs, _ = probe
        whole = self._memo_time(Op.FRAMEWORK, {"kind": kind.value, "num_units": 1})
        return self.partner_wait_s() + max(0.0, whole - pairs)

    def coupled(self) -> CostModel:
        """This shared view (`shared_cores`) for a call whose collectives interleave two
        groupings of its ranks: every collective within a host waits `coupled_wait_s`
        for its partners instead of `partner_wait_s`, divided by the view's stretch as
        that is. The model itself where it is not a shared view (ranks on cores of their
        own wait for no partner's slice)."""
        if not self.shared:
            return self
        return self.remember(
            ("coupled view",),
            lambda: dataclasses.replace(
                self, shared_wait_s=self.coupled_wait_s() / self.shared_stretch, _memo={}
            ),
        )

    def _shared_probe_s(self) -> tuple[float, float] | None:
        """The `shared_collective` entry (the probe all-reduce's whole time at
        SHARED_RANKS_PER_CORE ranks per core) and the same all-reduce's back-to-back
        entry with a core per rank; None where the profile has no such entry."""
        kind = FrameworkKind.SHARED_COLLECTIVE
        if (Op.FRAMEWORK, (kind.value,)) not in self.series:
            return None

        def probe() -> tuple[float, float]:
            whole = self._memo_time(Op.FRAMEWORK, {"kind": kind.value, "num_units": 1})
            own = self._flat_collective_s(
                CollectiveKind.ALL_REDUCE, SHARED_PROBE_BYTES, SHARED_PROBE_WORLD, Scope.INTRA
            )
            return whole, own

        return self.remember(("shared probe",), probe)

    def blocked_collective_share(self) -> float:
        """The share of a small collective's back-to-back time within a CPU host in which
        its ranks wait blocked rather than compute, as the `shared_collective` entry shows
        it: were the time all work, the probe's all-reduce (SHARED_PROBE_BYTES) would take
        its entry stretched by the host's sharing at SHARED_RANKS_PER_CORE (`sliced`), were
        it all waiting (for the data to cross, for a rank to wake), its entry alone; the
        measured whole between the two gives the share it stretched, and 1 less that is
        blocked (0 to 1). 0 where the profile has no `shared_collective` entry (GPU
        profiles, older CPU ones): the time is all work, as it was priced before. A host
        whose whole is above the stretched entry waits for partners besides
        (`partner_wait_s`). A larger collective's bytes beyond the probe's are copied and
        reduced by its ranks: `blocked_collective_s`. Memoised: every collective within
        a host asks for it."""
        probe = self._shared_probe_s()
        if probe is None:
            return 0.0
        whole, own = probe

        def share() -> float:
            spread = own * (sliced(SHARED_RANKS_PER_CORE, self.slicing()) - 1.0)
            if own <= 0 or spread <= 0:
                return 0.0
            return 1.0 - min(1.0, max(0.0, (whole - own) / spread))

        return self.remember(("blocked share",), share)

    def blocked_collective_s(
        self, kind: CollectiveKind, num_bytes: int, world_size: int, flat: float
    ) -> float:
        """Of a collective within a CPU host whose back-to-back entry is `flat`, the time
        its ranks wait blocked: the blocked share (`blocked_collective_share`, measured
        with the probe's SHARED_PROBE_BYTES) of its latency-sized part, the entry of the
        same kind and ranks at the probe's size (at most `flat`). What a larger one takes
        beyond that is its bytes, which gloo's ranks copy and reduce on their cores: work,
        which a crowded host slows. 0 without the share (and off a CPU host)."""
        if not self.host_local or flat <= 0 or kind is CollectiveKind.SEND_RECV:
            return 0.0
        share = self.blocked_collective_share()
        if share <= 0:
            return 0.0
        small = (
            flat
            if num_bytes <= SHARED_PROBE_BYTES
            else self._flat_collective_s(kind, SHARED_PROBE_BYTES, world_size, Scope.INTRA)
        )
        return share * min(flat, small)

    def without_blocked_collectives(self) -> CostModel:
        """This model (or view) with every collective within a CPU host priced at its
        worked part only (its entry less `blocked_collective_s`, no floor or wait): a call
        priced with `without_paired()`, less the same call priced with this, is the time
        its ranks spend blocked in its collectives. The model itself on other profiles."""
        if not self.host_local:
            return self
        return self.remember(
            ("without blocked collectives",),
            lambda: dataclasses.replace(self, blocked_collectives=False, _memo={}),
        )

    def _framework_points(
        self, kind: FrameworkKind, per: float = 1.0
    ) -> tuple[tuple[float, float], ...]:
        """The profile's framework entries of `kind` as points (num_units / `per`,
        seconds), ascending; () where it has none."""
        units = self.framework_units(kind)
        if not units:
            return ()

        def points() -> tuple[tuple[float, float], ...]:
            out = []
            for u in units:
                t = self.framework_s(kind, u)
                assert t is not None
                out.append((u / per, t))
            return tuple(out)

        return self.remember(("framework points", kind, per), points)

    def _per_core_points(self, kind: FrameworkKind) -> tuple[tuple[float, float], ...]:
        """The profile's framework entries of `kind` measured at num_units = W busy ranks
        on the profiling host, as points (W / cores, seconds), ascending; () where it has
        none or does not record its cores (GPU profiles, older CPU ones)."""
        cores = self.profile_cores
        return () if cores is None else self._framework_points(kind, cores)

    def slicing(self, kind: FrameworkKind = FrameworkKind.SHARED_COMPUTE) -> SliceCurve:
        """How much longer a rank's work takes as the host's busy ranks grow: the
        profile's entries of stretch probe `kind` (`profiles.shared_cores`:
        `shared_compute`, a reference forward; `shared_decode`, a reference decode;
        `shared_train`, a reference training step), the slowest rank's wall time per
        piece with W busy ranks on the profiling host over that with one, as points
        (W / cores, stretch) in busy ranks per core. It holds the share of a core each
        rank gets, the time slices' cost beyond it (cache refills, switches), the slowest
        rank's bad luck where ranks do not divide evenly among the cores, and what ranks
        on cores of their own cost one another (memory and the shared cache). A profile
        without entries of `kind` gives the forward's curve (profiles before 2026-12-03);
        () where it has no forward's either, none for one rank alone, or does not record
        its cores (GPU profiles, older CPU ones): `sliced` is then the share alone."""
        if kind is not FrameworkKind.SHARED_COMPUTE and not self._per_core_points(kind):
            kind = FrameworkKind.SHARED_COMPUTE
        points = self._per_core_points(kind)
        if not points or self.framework_units(kind)[0] != 1:
            return ()

        def curve() -> SliceCurve:
            alone = points[0][1]
            assert alone > 0
            return tuple((x, max(1.0, t / alone)) for x, t in points)

        return self.remember(("slicing", kind), curve)

    def shared_calls(self) -> tuple[tuple[float, float], ...]:
        """The measured fixed time of a driver's call to W Ray actor ranks on the
        profiling host (the profile's `shared_call` entries, `profiles.shared_cores`), as
        points (W / cores in busy ranks per core, seconds); () where the profile has
        none or does not record its cores (GPU profiles, older CPU ones)."""
        return self._per_core_points(FrameworkKind.SHARED_CALL)

    def empty_calls(self) -> tuple[tuple[float, float], ...]:
        """The measured time of a driver's call that does nothing to W Ray actor ranks
        on the profiling host, from its last launch to its last result (the profile's
        `empty_call` entries, `profiles.shared_cores`), as points (W / cores in ranks
        per core, seconds); () where the profile has none or does not record its cores."""
        return self._per_core_points(FrameworkKind.EMPTY_CALL)

    def empty_wake_curve(self) -> WakeCurve:
        """What a call that walks no model (a weight transition's) costs more by how
        long its ranks idled before it: the profile's `empty_wake` entries
        (`profiles.shared_cores`: an empty call after num_units ms idle less after the
        `empty_call` probe's own `grid.EMPTY_CALL_PAUSE_S`) as points (seconds idle,
        extra seconds), from (EMPTY_CALL_PAUSE_S, 0), where the `empty_call` entries
        already hold it, each at least the one before it (a longer idle wakes no
        faster; the entries are differences of noisy times); 0 below that pause
        (`woken` holds the first point). () where the profile has none (GPU profiles,
        older CPU ones)."""
        points = self._framework_points(FrameworkKind.EMPTY_WAKE, 1000)  # ms -> s
        if not points:
            return ()

        return self.remember(
            ("empty wake curve",), lambda: _rising(points, start_s=EMPTY_CALL_PAUSE_S)
        )

    def ray_background(self) -> float:
        """The cores of a run's host that Ray's daemons, its threads in the workers and
        the driver, and the kernel keep busy while the ranks compute: the median of the
        profile's `ray_background` entries (`profiles.shared_cores`; their "times" are
        cores), over every W the probe ran, since within its noise it does not depend on
        W (0.08-0.10 cores at W = 1-4 on the 2-core VM). 0 where the profile has none
        (GPU profiles, older CPU ones)."""
        units = self.framework_units(FrameworkKind.RAY_BACKGROUND)
        if not units:
            return 0.0

        def median() -> float:
            values = [self.framework_s(FrameworkKind.RAY_BACKGROUND, u) for u in units]
            return statistics.median(v for v in values if v is not None)

        return self.remember(("ray background",), median)

    def wake_curve(self) -> WakeCurve:
        """What a call costs more after its rank slept, by how long: the profile's
        `wake_call` entries (`profiles.shared_cores`: the reference forward after a
        sleep of num_units ms, less back to back) as points (seconds asleep, extra
        seconds), from (0, 0), each at least the one before it (a longer sleep leaves
        no warmer cache; the entries are differences of noisy times). () where the
        profile has none (GPU profiles, older CPU ones): `woken` is then 0."""
        points = self._framework_points(FrameworkKind.WAKE_CALL, 1000)  # ms -> s
        if not points:
            return ()
        return self.remember(("wake curve",), lambda: _rising(points))

    def call_wake_curve(self, call: str, weight_bytes: float) -> WakeCurve:
        """What a model call of kind `call` (a dataflow `CallKind` value: "generate",
        "forward" or "train") costs more after its rank ran another call and then idled,
        by how long it idled, for a rank holding `weight_bytes` of its model's weights:
        the profile's entries of that call's kinds (`grid.WAKE_KINDS_OF`, measured by
        `profiles.wake_calls` on the reference model and on `grid.COLD_MODEL`) as points
        (seconds idle, extra seconds). Each model's points are a curve from (0, 0), each
        point at least the one before it; the two are mixed linearly by the weight bytes
        between the two models' (`grid.wake_model_bytes`), held at either model beyond
        them; and the mix's first point is held back to 0 idle, since every measured call
        followed another call and its shortest pause is a scheduler tick: a call right
        after another pays the switch. A profile that measured the calls' wake-up but
        holds no entry of a kind or a pause measured no cost there (0). A profile without
        any of these entries (GPU profiles, older CPU ones) gives `wake_curve`, the
        reference forward after itself, for each call instead."""
        if not any(self.framework_units(k) for k in WAKE_KINDS):
            return self.wake_curve()
        small_kind, large_kind = WAKE_KINDS_OF[call]
        small_bytes, large_bytes = wake_model_bytes()
        share = min(1.0, max(0.0, (weight_bytes - small_bytes) / (large_bytes - small_bytes)))

        def curve() -> WakeCurve:
            lo = _rising(self._framework_points(small_kind, 1000))  # ms -> s
            hi = _rising(self._framework_points(large_kind, 1000))
            idle = sorted({x for x, _ in (*lo, *hi)} - {0.0})
            if not idle:
                return ()
            mix = [woken(x, lo) * (1 - share) + woken(x, hi) * share for x in idle]
            return ((0.0, mix[0]), *zip(idle, mix, strict=True))

        return self.remember(("call wake curve", call, share), curve)

    def cold_weights_s(self, weight_bytes: float, rows: int) -> float:
        """What one pass of GEMMs of `rows` rows over `weight_bytes` of weights costs
        beyond the profile's GEMM entries (timed hot) where those weights outgrow a core's
        own cache and come from the shared one: the profile's `cold_weights` entries
        (`profiles.shared_cores`, a pass over `grid.COLD_MODEL`'s weights), piecewise linear
        in the rows and held beyond the measured ones, scaled by the bytes past the
        level-2 cache over the reference's. 0 where those fit in it, and where the profile
        has no such entries or no level-2 size (GPU profiles, older CPU ones)."""
        l2 = self.host_l2_bytes
        points = self._framework_points(FrameworkKind.COLD_WEIGHTS)
        if l2 is None or not points or weight_bytes <= l2:
            return 0.0
        past = cold_model_bytes() - l2
        return piecewise(points, rows) * (weight_bytes - l2) / past

    def without_paired(self) -> CostModel:
        """This model (or view) with the profile's `paired_collective` entries left out:
        a call priced with this model, less the same call priced without them, is the
        latency its collectives pay beyond their back-to-back entries
        (`paired_collective_s`), which a crowded host does not slow (`simulator.schedule`)."""
        key = (Op.FRAMEWORK, (FrameworkKind.PAIRED_COLLECTIVE.value,))
        if key not in self.series:
            return self
        # Kept, as the shared views are, so that the calls it prices stay remembered
        # from one simulation to the next.
        return self.remember(
            ("without paired",),
            lambda: dataclasses.replace(
                self, series={k: v for k, v in self.series.items() if k != key}, _memo={}
            ),
        )

    def with_probe_wait(self) -> CostModel:
        """This model with every collective that `shared_cores` would charge a partner
        wait charged exactly 1 s more: a call priced with it, less the same call priced
        with this model, is the number of such collectives on a rank's path (what the
        simulator charges waits for when other sets' ranks crowd the host)."""
        return dataclasses.replace(self, shared_wait_s=1.0, _memo={})

    def attn_prefill_s(
        self,
        batch: int,
        seq: int,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        *,
        backward: bool = False,
    ) -> float:
        op = Op.ATTN_PREFILL_BWD if backward else Op.ATTN_PREFILL_FWD
        params: dict[str, int | str] = {
            "batch": max(1, batch),
            "seq": max(1, seq),
            "num_heads": num_heads,
            "num_kv_heads": num_kv_heads,
            "head_dim": head_dim,
        }
        return self._memo_time(op, params)

    def attn_decode_s(
        self, batch: int, kv_len: int, num_heads: int, num_kv_heads: int, head_dim: int
    ) -> float:
        params: dict[str, int | str] = {
            "batch": max(1, batch),
            "kv_len": max(1, kv_len),
            "num_heads": num_heads,
            "num_kv_heads": num_kv_heads,
            "head_dim": head_dim,
        }
        return self._memo_time(Op.ATTN_DECODE, params)

    def elementwise_s(self, kind: str, num_bytes: int) -> float:
        num_bytes = max(1, num_bytes)
        hit = self._memo.get((Op.ELEMENTWISE, kind, num_bytes))
        if hit is None:
            hit = self._memo_time(Op.ELEMENTWISE, {"kind": kind, "num_bytes": num_bytes})
        return hit

    def optimizer_s(self, num_params: int) -> float:
        return self._memo_time(Op.OPTIMIZER, {"num_params": max(1, num_params)})

    def host_optimizer_s(self, num_params: int) -> float:
        """One AdamW step over `num_params` fp32 parameters on the host CPU.

        A CPU profile's host is its device; a GPU profile answers from `host`.
        """
        if self.device_kind == "cpu":
            return self.optimizer_s(num_params)
        if self.host is None:
            raise ProfileCoverageError(
                f"profile {self.profile_name!r}: a host optimizer step is priced with the host "
                "CPU's profile; load the cost model with `fitted_cost_model` (which attaches "
                "the `cpu` profile) or pass `host=` a fitted CPU cost model"
            )
        return self.host.optimizer_s(num_params)

    def copy_s(self, direction: str, num_bytes: int) -> float:
        if num_bytes <= 0:
            return 0.0
        return self._memo_time(Op.COPY, {"direction": direction, "num_bytes": num_bytes})

    def stream_copy_s(self, direction: str, num_bytes: int) -> float:
        """A copy of `num_bytes` whose buffers are in no cache (weights last touched a
        phase ago): at the bandwidth of the profile's largest copy, whose buffers fit in
        no cache, where that is slower than `copy_s` at this size (whose repeated timing
        between the same two buffers keeps a small copy in cache)."""
        if num_bytes <= 0:
            return 0.0
        at_size = self.copy_s(direction, num_bytes)
        series = self.series.get((Op.COPY, (direction,)))
        if series is None:
            return at_size
        largest = int(series.sizes[-1])
        return max(at_size, num_bytes * self.copy_s(direction, largest) / largest)

    def memory_read_s(self, num_bytes: int) -> float:
        """Reading `num_bytes` from memory, not a cache: half a streamed copy of them
        (`stream_copy_s`), since a copy reads each byte and writes it once."""
        return self.stream_copy_s(CopyDirection.H2D.value, num_bytes) / 2

    def dispatch_s(
        self, kind: DispatchKind, num_bytes: int, tensors: int = DISPATCH_ENTRY_TENSORS
    ) -> float:
        """Host time of one controller -> worker call carrying `num_bytes` in `tensors`
        tensors (round trip, `_with_tensors`)."""
        base = self._memo_time(Op.DISPATCH, {"kind": kind.value, "num_bytes": max(1, num_bytes)})
        return self._with_tensors(kind, base, tensors)

    def driver_s(
        self, kind: DispatchKind, num_bytes: int, tensors: int = DISPATCH_ENTRY_TENSORS
    ) -> float | None:
        """The driver's serial seconds for one rank's share of a call (`ray_launch`: its
        arguments of `num_bytes` in `tensors` tensors pickled and submitted; `ray_get`:
        its result unpickled), as profiled; None where the profile has no such entry
        (profiles whose driver host was not measured)."""
        if (Op.DISPATCH, (kind.value,)) not in self.series:
            return None
        base = self._memo_time(Op.DISPATCH, {"kind": kind.value, "num_bytes": max(1, num_bytes)})
        return self._with_tensors(kind, base, tensors)

    def _with_tensors(self, kind: DispatchKind, base_s: float, tensors: int) -> float:
        """`base_s`, timed with `DISPATCH_ENTRY_TENSORS` tensors, for `tensors` of them: each
        one more or fewer adds or takes the profile's per-tensor entry (none where the
        profile has no such entry: the GPU profiles, which import the round trip only).
        Never below a tenth of `base_s`: an empty call still makes its round trip."""
        extra = tensors - DISPATCH_ENTRY_TENSORS
        if extra == 0 or kind not in PER_TENSOR:
            return base_s
        per_tensor = PER_TENSOR[kind].value
        if (Op.DISPATCH, (per_tensor,)) not in self.series:
            return base_s
        params: dict[str, int | str] = {"kind": per_tensor, "num_bytes": DISPATCH_TENSOR_BYTES}
        return max(base_s / 10, base_s + extra * self._memo_time(Op.DISPATCH, params))

    def framework_s(self, kind: FrameworkKind, num_units: int = 1) -> float | None:
        """Host seconds of one piece of the engine's work of `kind` (a layer's forward,
        a decode step's bookkeeping...) at the size `num_units` it was timed at
        (`framework_units`), as profiled; None where the profile has no such entry
        (then the simulator prices the engine's extra ops instead)."""
        if (Op.FRAMEWORK, (kind.value,)) not in self.series:
            return None
        return self._memo_time(Op.FRAMEWORK, {"kind": kind.value, "num_units": num_units})

    def framework_units(self, kind: FrameworkKind) -> tuple[int, ...]:
        """The sizes (num_units) the profile timed `kind` at, ascending; () without any."""
        series = self.series.get((Op.FRAMEWORK, (kind.value,)))
        return () if series is None else tuple(int(u) for u in series.sizes)

    def collective_s(
        self,
        kind: CollectiveKind,
        num_bytes: int,
        world_size: int,
        scope: Scope,
        *,
        ranks_per_node: int = 1,
        after_s: float | None = None,
    ) -> float:
        """A collective over `world_size` ranks; zero for one rank or no bytes.

        Across nodes (`Scope.INTER`) the group's shape matters: `ranks_per_node`
        of its ranks share each node (see `_spanning_collective_s`). The profile's
        inter-node entries are per GPU (one NIC each); 1 prices the group as one
        rank per node.

        Within a CPU host it costs at least what the profile's `paired_collective`
        entries measured for a small one after `after_s` of compute on each rank
        (`paired_collective_s`; None: no compute named, a collective right after another
        as the entries were timed, which costs its entry): see `_paired_floor_s`. Of
        its entry, the part its ranks wait blocked (`blocked_collective_s`) is not
        stretched with their work: the views of a set's ranks (`shared_cores` where they
        share their cores, `own_cores` where each has one) divide that part by the
        stretch the simulator gives their calls.
        """
        if world_size <= 1 or num_bytes <= 0:
            return 0.0
        if self.host_local:
            scope = Scope.INTRA
        if scope is Scope.INTER and ranks_per_node > 1:
            return self._spanning_collective_s(kind, int(num_bytes), world_size, ranks_per_node)
        flat = self._flat_collective_s(kind, int(num_bytes), world_size, scope)
        if scope is not Scope.INTRA:
            return flat
        timed_on = self.profile_cores
        crowded_entry = timed_on is not None and world_size > timed_on
        # Of its time, the part its ranks wait blocked (`blocked_collective_s`) is not
        # stretched by a crowd: a blocked rank leaves its core to another. The rest is
        # work, which the simulator stretches by the call's sharing afterwards (module
        # `simulator.simulate`), so the view divides the blocked part by that stretch.
        blocked = self.blocked_collective_s(kind, int(num_bytes), world_size, flat)
        worked = flat - blocked
        if crowded_entry and self.shared:
            # Its ranks outnumbered the profiling host's cores: the entry holds their
            # waits for one another and the slices' overhead already, at world_size /
            # cores ranks per core. The shared view takes its worked part back to one
            # rank per core (its blocked part was not stretched there either), and adds
            # no wait.
            assert timed_on is not None
            worked /= sliced(world_size / timed_on, self.slicing())
        if not self.blocked_collectives:
            return worked
        own = worked + blocked / self.shared_stretch
        if crowded_entry:
            return own
        return self._paired_floor_s(kind, own, after_s) + self.shared_wait_s

    def _paired_floor_s(self, kind: CollectiveKind, flat: float, after_s: float | None) -> float:
        """A collective within a CPU host of its entry's time `flat` (timed back to back),
        at least the `paired_collective` probe's after `after_s` of compute: a rank that
        computed until the collective finds its partner still computing, and blocks;
        waking it when the data arrives costs a latency the back-to-back entries, whose
        ranks never stop for long, pay less of (on this 2-core VM about 2 ms against
        0.7 ms for a 180 KB all-reduce; README, fidelity). The larger of the two: a
        small collective costs the probe's, a large one its own entry's bandwidth.

        In the views of a set's ranks (`shared_cores`, `own_cores`) the probe's time is
        divided by the view's stretch, which the simulator multiplies every call by
        afterwards: a rank blocked in a collective does no work for the stretch to slow
        (where ranks share cores it leaves its core to another), so the latency is not
        stretched. A point-to-point send (a pipeline stage's to the next) is one too:
        gloo's send waits until its receiver has posted the receive (a sender 5 ms ahead
        of its receiver took 5.15 ms to send 1 KiB and 5.55 ms for 1 MiB, against 0.15
        and 0.39 ms on time; `benchmarks/p2p_rendezvous.py`, 2026-11-29), so a stage
        that computed until its send meets the next stage's rank blocked in its receive,
        or blocks itself, as a collective's ranks do. No floor where `after_s` is None."""
        if after_s is None:
            return flat
        return max(flat, self.paired_collective_s(after_s) / self.shared_stretch)

    def paired_collective_s(self, after_s: float) -> float:
        """What a small collective within a CPU host costs its ranks after `after_s` of
        compute on each: the profile's `paired_collective` entries (`profiles.shared_cores`;
        num_units: the microseconds of compute each rank measured between collectives) as
        a curve, held at its ends. 0 where the profile has none (GPU profiles, older CPU
        ones)."""
        points = self._framework_points(FrameworkKind.PAIRED_COLLECTIVE, per=1e6)
        return piecewise(points, after_s) if points else 0.0

    def _flat_collective_s(
        self, kind: CollectiveKind, num_bytes: int, world_size: int, scope: Scope
    ) -> float:
        num_bytes = max(1, num_bytes)
        hit = self._memo.get((Op.COLLECTIVE, kind.value, world_size, scope.value, num_bytes))
        if hit is not None:
            return hit
        params: dict[str, int | str] = {
            "kind": kind.value,
            "world_size": world_size,
            "scope": scope.value,
            "num_bytes": num_bytes,
        }
        if scope is Scope.INTER and (Op.COLLECTIVE, (kind.value, world_size, scope.value)) not in (
            self.series
        ):
            between = self._between_worlds(kind, num_bytes, world_size)
            if between is not None:
                self._memo[(Op.COLLECTIVE, *params.values())] = between
                return between
        return self._memo_time(Op.COLLECTIVE, params)

    def _between_worlds(self, kind: CollectiveKind, num_bytes: int, nodes: int) -> float | None:
        """An inter-node collective over `nodes` nodes, whose world size was not profiled,
        from the profiled world sizes on either side at the same bytes, linear in the
        world size (module docstring, case 4); None without one on each side."""
        worlds = self.remember(
            ("inter-node worlds", kind),
            lambda: sorted(
                int(key[1])
                for op, key in self.series
                if op is Op.COLLECTIVE and key[0] == kind.value and key[2] == Scope.INTER.value
            ),
        )
        below = [w for w in worlds if w < nodes]
        above = [w for w in worlds if w > nodes]
        if not below or not above:
            return None
        lo, hi = below[-1], above[0]
        t_lo = self._flat_collective_s(kind, num_bytes, lo, Scope.INTER)
        t_hi = self._flat_collective_s(kind, num_bytes, hi, Scope.INTER)
        return t_lo + (t_hi - t_lo) * (nodes - lo) / (hi - lo)

    def _spanning_collective_s(
        self, kind: CollectiveKind, num_bytes: int, world_size: int, ranks_per_node: int
    ) -> float:
        """A collective of n ranks spread over nodes with (at least) g of them on each,
        as NCCL's rings run it.

        NCCL runs one ring per channel and gives each channel its own NIC, so a
        ring that crosses nodes with g ranks on each uses g NICs in parallel: the
        bytes each NIC carries are 1/g of a one-rank-per-node ring's. Priced as the
        inter-node entry of the ring's nodes (at most ceil(n / g): its network
        steps, and so its latency, are those of that many nodes) carrying 1/g of
        the ring's bus bytes, but never faster than the NVLink hops of the same
        ring: the intra-node entry of g ranks carrying the same bus bytes. An
        all-to-all does not share NICs (each rank sends its own share over its own
        NIC): only the (n - g)/(n - 1) of each rank's bus bytes that leave its node
        go over the NIC. Send/recv is one pair.
        """
        n, g = world_size, ranks_per_node
        if not 1 < g < n:
            raise SpecError(
                f"a collective of {n} ranks across nodes has 1 to {n - 1} of them per node; "
                f"got ranks_per_node={g}"
            )
        if kind is CollectiveKind.SEND_RECV:
            return self._flat_collective_s(kind, num_bytes, n, Scope.INTER)
        if kind is CollectiveKind.ALL_TO_ALL:
            leaving = num_bytes * (n - g) / (n - 1)
            return self._flat_collective_s(kind, math.ceil(leaving), n, Scope.INTER)
        bus = num_bytes * ops.collective_bus_factor(kind, n)
        nodes = math.ceil(n / g)
        per_nic = bus / g / ops.collective_bus_factor(kind, nodes)
        nic = self._flat_collective_s(kind, math.ceil(per_nic), nodes, Scope.INTER)
        nvlink = self._flat_collective_s(
            kind, math.ceil(bus / ops.collective_bus_factor(kind, g)), g, Scope.INTRA
        )
        return max(nic, nvlink)


@dataclass(frozen=True, kw_only=True)
class LooReport:
    """Leave-one-out relative errors |pred - measured| / measured, per op and overall."""

    profile_name: str
    num_points: int
    median_rel_err: float
    p90_rel_err: float
    per_op: Mapping[str, tuple[int, float, float]] = field(hash=False)  # n, median, p90


# Measured stretch of a rank's compute by busy ranks per core (`CostModel.slicing`).
SliceCurve = tuple[tuple[float, float], ...]
# Measured extra seconds of a call by the seconds its rank slept before it
# (`CostModel.wake_curve`).
WakeCurve = tuple[tuple[float, float], ...]


def _rising(points: tuple[tuple[float, float], ...], start_s: float = 0.0) -> WakeCurve:
    """Measured wake-up `points` (seconds asleep, extra seconds; ascending) as a curve
    from (`start_s`, 0) through those beyond it, each point at least the one before it:
    a longer sleep leaves no warmer cache, and the entries are differences of noisy
    times. () without points."""
    if not points:
        return ()
    out = [(start_s, 0.0)]
    for asleep_s, extra in points:
        if asleep_s > start_s:
            out.append((asleep_s, max(out[-1][1], extra)))
    return tuple(out)


def woken(idle_s: float, curve: WakeCurve = ()) -> float:
    """What a call costs more after its rank slept `idle_s` seconds (math.inf: it never
    ran before): piecewise linear through the measured `curve` from (0, 0), held at its
    last point beyond it; 0 without a curve."""
    return piecewise(curve, idle_s) if curve else 0.0


def sliced(per_core: float, curve: SliceCurve = ()) -> float:
    """How much longer a busy rank's work takes on a host running `per_core` busy ranks
    per core than alone: piecewise linear through the measured `curve`
    (`CostModel.slicing`), 1 below its first point (one rank alone), and beyond its last
    point (x_n, s_n) that point's stretch scaled with the crowd, s_n · x / x_n (the
    slices' overhead held). Without a curve: the share of a core alone, max(1, x)."""
    if not curve:
        return max(1.0, per_core)
    last_x, last_s = curve[-1]
    if per_core > last_x:
        return last_s * per_core / last_x
    return piecewise(curve, per_core)


def piecewise(points: tuple[tuple[float, float], ...], x: float) -> float:
    """The piecewise-linear curve through `points` (ascending x) at `x`, held at the
    first point's value below them and at the last's beyond."""
    x0, y0 = points[0]
    if x <= x0:
        return y0
    for x1, y1 in points[1:]:
        if x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
        x0, y0 = x1, y1
    return y0


def _host_cache_bytes(profile: Profile) -> int | None:
    """The last-level cache of the host a CPU profile was measured on, from its
    provenance (`profiles.profiler.last_level_cache_bytes`)."""
    return _host_size(profile, "llc_bytes")


def _host_size(profile: Profile, key: str) -> int | None:
    """A size in bytes the provenance's host of a CPU profile records under `key`."""
    size = profile.provenance.host.get(key)
    return int(size) if profile.device_kind == "cpu" and size else None


def _profile_cores(profile: Profile) -> int | None:
    """The CPU cores of the host a CPU profile was measured on, from its provenance."""
    cores = profile.provenance.host.get("cpu_count")
    return int(cores) if profile.device_kind == "cpu" and cores else None


def leave_one_out(profile: Profile) -> LooReport:
    """Predict every measured or imported entry from the profile without it.

    Datasheet entries are excluded from the scoring (they are roofline values by
    construction) but stay in the fit. Series with a single point are skipped:
    leaving it out tests nothing but the cross-series transfer, which is scored
    through the other points anyway.
    """
    per_op: dict[str, list[float]] = {}
    counts: dict[tuple[Op, ops.SeriesKey], int] = {}
    for e in profile.entries:
        sid = (e.op, ops.series_key(e.op, e.params))
        counts[sid] = counts.get(sid, 0) + 1
    for e in profile.entries:
        if e.source is Source.DATASHEET or counts[(e.op, ops.series_key(e.op, e.params))] < 2:
            continue
        model = CostModel.fit(profile, exclude=e)
        pred = model.time_s(e.op, e.params)
        per_op.setdefault(e.op.value, []).append(abs(pred - e.median_s) / e.median_s)
    all_errs = np.array([x for errs in per_op.values() for x in errs])
    if all_errs.size == 0:
        raise ProfileCoverageError(f"profile {profile.name!r} has no measured series to check")
    return LooReport(
        profile_name=profile.name,
        num_points=int(all_errs.size),
        median_rel_err=float(np.median(all_errs)),
        p90_rel_err=float(np.percentile(all_errs, 90)),
        per_op={
            op: (len(errs), float(np.median(errs)), float(np.percentile(errs, 90)))
            for op, errs in sorted(per_op.items())
        },
    )
