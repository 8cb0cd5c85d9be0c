"""Whether a CPU profile describes this host: its identity against the one the profile
recorded, and a few of the profile's GEMMs re-timed here.

A CPU profile is measured on one machine. A later session, a CI runner or a user's
machine may be another one with the same name in /proc/cpuinfo ("AMD EPYC" covers
several generations, with and without AVX-512) whose kernels run at another speed:
on 2026-11-27 this project's 2-core VM ran twelve of the shipped `cpu` profile's
GEMMs at a median 1.62x of the times the profile holds (0.8-3.1x each). The
simulator prices every call from those kernels, so each prediction made with the
profile is off by about that ratio, and a comparison of measured and simulated runs
says nothing of the model. The fidelity
benchmark refuses such a host and `placeflow validate` says so next to its table.

Identity alone cannot decide (older profiles record only the model name, and two
hosts of one kind can differ in speed), so the re-timed kernels are the evidence and
the identity's differences are reported with them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from placeflow.errors import SpecError
from placeflow.profiles.ops import flops
from placeflow.profiles.schema import Entry, FrameworkKind, Op, Profile, Source

# The fields of a profile's `provenance.host` that say which CPU measured it.
IDENTITY_KEYS = ("cpu_model", "cpu_family", "cpu_model_number", "cpu_isa", "cpu_count")
# Re-timed GEMMs: from the small ones a tiny model's layers run (where a host's
# per-call overhead shows: on 2026-11-27 this VM ran the shipped profile's 1 x 896 x
# 896 GEMM 2.5x slower, its 8192 x 896 x 1152 one 1.7x) to the large, a dozen taking
# a few seconds in all.
MIN_GEMM_S, MAX_GEMM_S = 2e-5, 2e-2
DEFAULT_POINTS = 12
# Within this ratio either way the kernels are taken as the profile's. A VM's own
# speed moves: this project's 2-core VM re-timed a profile it had measured minutes
# before at 0.96x to 1.36x of its times within two minutes, so a narrower band would
# call a host's own profile another host's.
DEFAULT_TOLERANCE = 0.5
# The most the GEMMs' and the engine pieces' speeds may stand apart (either way) for one
# profile brought to a host's speed by them (`at_host_speed`) to describe that host: on
# the VM that measured the fidelity profile they read 0.9x and 0.7x (1.3x apart); on a
# VM of another CPU family, 0.7x and 0.24x (2.9x apart; README, thirtieth round), and
# Ray's own calls there followed the engine's pieces (0.2-0.3x), which two ratios
# cannot carry: every entry not re-timed is scaled by the GEMMs'.
MAX_SPEEDS_APART = 2.0


def cpuinfo_fields(path: Path = Path("/proc/cpuinfo")) -> dict[str, str]:
    """The first processor's fields of Linux's /proc/cpuinfo (empty elsewhere)."""
    fields: dict[str, str] = {}
    with contextlib.suppress(OSError), open(path, encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                break  # the first processor's block ends at its blank line
            key, _, value = line.partition(":")
            fields[key.strip()] = value.strip()
    return fields


def host_identity(cpuinfo: Path = Path("/proc/cpuinfo")) -> dict[str, object]:
    """This host's CPU as a profile records it: the model name, family, model number
    and stepping (/proc/cpuinfo), the vector ISA torch's kernels use here
    (`torch.backends.cpu.get_cpu_capability`, e.g. AVX2 or AVX512) and the core count."""
    import torch

    info = cpuinfo_fields(cpuinfo)
    out: dict[str, object] = {"cpu_count": os.cpu_count()}
    for key, name in (("cpu_model", "model name"), ("cpu_family", "cpu family")):
        if name in info:
            out[key] = info[name]
    if "model" in info:
        out["cpu_model_number"] = info["model"]
    if "stepping" in info:
        out["cpu_stepping"] = info["stepping"]
    out["cpu_isa"] = torch.backends.cpu.get_cpu_capability()
    return out


def identity_differences(recorded: Mapping[str, object], here: Mapping[str, object]) -> list[str]:
    """The identity fields that the profile recorded and that differ here, as
    "field: profile's value vs this host's". A field the profile did not record is
    unknown, not a difference."""
    return [
        f"{key}: {recorded[key]!r} in the profile, {here[key]!r} here"
        for key in IDENTITY_KEYS
        if key in recorded and key in here and str(recorded[key]) != str(here[key])
    ]


def drift_points(profile: Profile, count: int = DEFAULT_POINTS) -> tuple[Entry, ...]:
    """Up to `count` measured GEMM entries of `profile` to re-time: those of
    MIN_GEMM_S..MAX_GEMM_S, spread evenly over their range of flops (the smallest,
    the largest and evenly between), in order of flops."""
    gemms = sorted(
        (
            e
            for e in profile.entries
            if e.op is Op.GEMM
            and e.source is Source.MEASURED
            and MIN_GEMM_S <= e.median_s <= MAX_GEMM_S
        ),
        key=lambda e: (flops(e.op, e.params), sorted(e.params.items())),
    )
    if len(gemms) <= count:
        return tuple(gemms)
    step = (len(gemms) - 1) / (count - 1) if count > 1 else 0.0
    return tuple(gemms[round(i * step)] for i in range(count))


# Times entries' points on this host: seconds per entry, in their order.
Timer = Callable[[Profile, Sequence[Entry]], Sequence[float]]


def retime(profile: Profile, entries: Sequence[Entry]) -> list[float]:
    """`entries` timed here as the profiler timed them: one torch thread and the
    profile's stored timing settings (`profiler.add_cpu_kernels` does the same)."""
    from placeflow.profiles.grid import GridPoint
    from placeflow.profiles.profiler import time_on_one_thread, timing_grid

    points = tuple(GridPoint(op=e.op, params=e.params) for e in entries)
    timed, _ = time_on_one_thread(timing_grid(profile), points, progress=False)
    by_key = {e.key(): e.median_s for e in timed}
    return [by_key.get(e.key(), math.nan) for e in entries]


@dataclass(frozen=True)
class HostCheck:
    """A CPU profile against this host: `ratios` are this host's time over the
    profile's for each re-timed GEMM (`entries`); `ratio` is their median."""

    profile_name: str
    differences: tuple[str, ...]
    entries: tuple[Entry, ...]
    ratios: tuple[float, ...]
    tolerance: float = DEFAULT_TOLERANCE

    @property
    def ratio(self) -> float | None:
        """The median of the finite ratios; None where no GEMM could be re-timed."""
        good = [r for r in self.ratios if math.isfinite(r) and r > 0]
        return statistics.median(good) if good else None

    @property
    def ok(self) -> bool:
        """Whether this host runs the profile's kernels within `tolerance` of its times
        (a profile with nothing to re-time is taken as this host's)."""
        r = self.ratio
        return r is None or abs(math.log(r)) <= math.log1p(self.tolerance)

    def summary(self) -> str:
        """One line: the ratio, the identity's differences and, when off, what to do."""
        r = self.ratio
        if r is None:
            return f"profile {self.profile_name!r}: no measured GEMM to re-time on this host"
        head = (
            f"profile {self.profile_name!r}: this host runs its GEMMs at {r:.2f}x the "
            f"profile's times (median of {len(self.entries)} re-timed here)"
        )
        seen = "; ".join(self.differences) if self.differences else "identity recorded alike"
        if self.ok:
            return f"{head}; within {self.tolerance:.0%} ({seen})"
        return (
            f"{head}, outside {self.tolerance:.0%}: it was measured on another host "
            f"({seen}), so predictions made with it are off by about that ratio. "
            "Profile this host with `placeflow profile --device cpu --out cpu-here.json` "
            "and pass `--profile cpu-here.json`."
        )

    def to_json(self) -> dict[str, object]:
        return {
            "profile": self.profile_name,
            "ratio": self.ratio,
            "ok": self.ok,
            "tolerance": self.tolerance,
            "differences": list(self.differences),
            "gemms": [
                {"params": dict(e.params), "profile_s": e.median_s, "ratio": r}
                for e, r in zip(self.entries, self.ratios, strict=True)
            ],
        }


def check_host(
    profile: Profile,
    *,
    count: int = DEFAULT_POINTS,
    tolerance: float = DEFAULT_TOLERANCE,
    timer: Timer | None = None,
    here: Mapping[str, object] | None = None,
) -> HostCheck:
    """Re-time up to `count` of `profile`'s GEMMs (`drift_points`) with `timer`
    (default `retime`) and compare this host's identity (`here`, default
    `host_identity()`) with the one the profile recorded. Only a CPU profile can be
    checked against this host's CPU."""
    if profile.device_kind != "cpu":
        raise SpecError(
            f"profile {profile.name!r} is a {profile.device_kind} profile; only a CPU "
            "profile can be checked against this host's CPU"
        )
    entries = drift_points(profile, count)
    times = list((timer or retime)(profile, entries)) if entries else []
    ratios = tuple(t / e.median_s for t, e in zip(times, entries, strict=True))
    identity = host_identity() if here is None else here
    return HostCheck(
        profile_name=profile.name,
        differences=tuple(identity_differences(profile.provenance.host, identity)),
        entries=entries,
        ratios=ratios,
        tolerance=tolerance,
    )


# The engine's pieces re-timed for the speed of the host's Python work (`check_framework`):
# a decoder layer's forward and backward beyond their kernels, at the smallest size,
# where the profile's entries are all host work. Not the per-call pieces (the call's
# forward and backward outside the layers): each is an intercept, t(L1) - L1 * slope,
# the difference of two larger timings, and re-timed alone it moves from one check to
# the next by far more than the host does. On the 2-core VM on 2026-11-29 re-timings
# in a row read the fidelity profile's layer pieces at 0.61-0.68x (forward) and
# 0.63-0.79x (backward), its call pieces at 0.43-0.48x and 0.09-0.75x
# (`benchmarks/fidelity_cpu.py`'s profile, 18:08-18:10 UTC, idle host); at the median
# over all four, the synchronous generator plan's engine calls, timed in the run as
# fast as alone (`benchmarks/inrun_calls.py`), were priced 19-25 % too fast (README,
# twenty-seventh round).
FRAMEWORK_CHECK_KINDS = (FrameworkKind.LAYER_FORWARD, FrameworkKind.LAYER_BACKWARD)
FRAMEWORK_CHECK_REPEATS = 10  # about 2 s on the 2-core VM

# Times `FRAMEWORK_CHECK_KINDS`' entries here: one per kind, at the smallest size.
FrameworkTimer = Callable[[], Sequence[Entry]]


def _retime_framework() -> list[Entry]:
    from placeflow.profiles.framework import measure_framework

    return measure_framework(
        repeats=FRAMEWORK_CHECK_REPEATS, kinds=FRAMEWORK_CHECK_KINDS, sizes=(0,)
    )


def check_framework(profile: Profile, *, timer: FrameworkTimer | None = None) -> float | None:
    """This host's time for the engine's own host work over the profile's: the median,
    over `FRAMEWORK_CHECK_KINDS`, of each piece re-timed here at the smallest size (with
    `timer`, default `placeflow.profiles.framework.measure_framework`) over the
    profile's entry of the same kind and size; None where the profile has none of them.

    GEMMs do not tell it: on the 2-core VM on 2026-11-29 three re-timings of the
    engine's pieces read 0.71x the fidelity profile's times each (a piece 0.25-1.31x)
    while its GEMMs read 0.89-0.94x, and at the GEMMs' ratio the phases made mostly of
    such host work (the tiny model's) had been priced up to 55 % too slow (their steps
    7-34 %), the larger model's within 10 % (README, twenty-third round). Only the
    layers' pieces are re-timed (`FRAMEWORK_CHECK_KINDS`: the per-call ones are too
    noisy alone; README, twenty-seventh round)."""
    if profile.device_kind != "cpu":
        raise SpecError(
            f"profile {profile.name!r} is a {profile.device_kind} profile; only a CPU "
            "profile can be checked against this host's CPU"
        )
    kinds = {k.value for k in FRAMEWORK_CHECK_KINDS}
    stored = {
        (e.params["kind"], e.params["num_units"]): e.median_s
        for e in profile.entries
        if e.op is Op.FRAMEWORK and e.params.get("kind") in kinds and e.median_s > 0
    }
    if not stored:
        return None
    ratios = [
        e.median_s / stored[key]
        for e in (timer or _retime_framework)()
        if (key := (e.params["kind"], e.params["num_units"])) in stored and e.median_s > 0
    ]
    return statistics.median(ratios) if ratios else None


def speeds_apart(
    gemm_ratio: float | None, work_ratio: float | None, limit: float = MAX_SPEEDS_APART
) -> str | None:
    """Why a profile cannot be brought to this host's speed, or None where it can: the
    GEMMs' speed (`HostCheck.ratio`) and the engine pieces' (`check_framework`) more
    than `limit` times apart either way, a sign that the profile was made on another
    kind of host. None where either speed is unknown."""
    if gemm_ratio is None or work_ratio is None or gemm_ratio <= 0 or work_ratio <= 0:
        return None
    apart = max(gemm_ratio / work_ratio, work_ratio / gemm_ratio)
    if apart <= limit:
        return None
    return (
        f"this host runs the profile's GEMMs at {gemm_ratio:.2f}x its times and the "
        f"engine's pieces at {work_ratio:.2f}x, {apart:.1f}x apart (more than {limit:g}x): "
        "the profile was made on another kind of host, and the entries neither check "
        "re-times (Ray's calls, copies, the shared-cores probes) cannot be brought to "
        "this one's speed. Profile this host with `placeflow profile --device cpu --out "
        "cpu-here.json` and pass `--profile cpu-here.json`"
    )


def sized_piece_s(median_s: float, smallest_s: float, ratio: float, work_ratio: float) -> float:
    """One of the engine's pieces timed at a size above its smallest (`median_s`; the
    same kind at its smallest size: `smallest_s`) brought to a host where the GEMMs run
    at `ratio` times the profile's and the smallest pieces at `work_ratio`: the part the
    smallest size takes (the interpreter's dispatch of the piece's ops) at `work_ratio`,
    what the size adds (the ops' own work over its tokens, kernels like the GEMMs) at
    `ratio`. A size that reads faster than the smallest (the samples' noise) is all
    dispatch.

    One ratio for the whole piece priced the larger ones too fast: on the AMD VM on
    2026-12-06 the layers' pieces re-timed at 0.62-0.84x the profile's at their
    smallest size and 0.90-1.03x at 8 x 32 and 32 x 32 tokens (its GEMMs 0.95x), and
    the fidelity runs' phases at one ratio came out 23 % too fast at the median (README,
    forty-first round)."""
    return min(median_s, smallest_s) * work_ratio + max(median_s - smallest_s, 0.0) * ratio


def _smallest_sized_pieces(profile: Profile) -> dict[str, float]:
    """The median time of each of the engine's pieces sized in tokens or sequences
    (`framework.measured_units`: more than one size) that the profile holds at several
    sizes, at its smallest (`sized_piece_s`). The controller's work is sized in responses
    or tokens of Python loops, all of it the interpreter's: not one of them."""
    from placeflow.profiles.framework import measured_units

    sized = {k.value for k in FrameworkKind if len(measured_units(k)) > 1}
    sizes: dict[str, dict[int, float]] = {}
    for e in profile.entries:
        if e.op is Op.FRAMEWORK and e.params["kind"] in sized:
            sizes.setdefault(str(e.params["kind"]), {})[int(e.params["num_units"])] = e.median_s
    return {k: by[min(by)] for k, by in sizes.items() if len(by) > 1}


def at_host_speed(
    profile: Profile, ratio: float, *, checked: str, host_work_ratio: float | None = None
) -> Profile:
    """`profile` with every entry's times (median, p10, p90) times `ratio`, this host's
    GEMM times over the profile's (`HostCheck.ratio`, measured at `checked`, a date):
    the profile brought to the speed this host runs at now. With `host_work_ratio`
    (`check_framework`), the engine's pieces (`framework.ENGINE_KINDS`: the entries
    whose like that check re-times, the engine's Python beyond its kernels) and the
    controller's (`controller_work.CONTROLLER_KINDS`) and the reshard's host work
    (`reshard_host.RESHARD_KINDS`) are scaled by that instead, a piece timed at several
    sizes only in the part its smallest size takes (`sized_piece_s`); the rest (kernels,
    copies, collectives, Ray's calls, the shared-cores probes, the calls' wake-up
    entries of `profiles.wake_calls`) by `ratio`.

    A VM's speed moves by tens of percent from one hour to the next, and every CPU
    entry is the host's own work (kernels, the engine's Python, Ray's calls, copies),
    so a profile measured at another moment misprices every call by about the ratio:
    in two fidelity runs on 2026-11-27 with the same code and profile, the second's
    steps took a median 0.82x the first's, where the checks at their starts re-timed
    the profile's GEMMs at 1.17x and 0.95x (0.82 apart). One ratio for every entry is
    an approximation: the GEMMs' own ratios spread by tens of percent around it, and
    the Python's speed moves apart from the kernels' (`check_framework`)."""
    for r in (ratio, host_work_ratio):
        if r is not None and not (math.isfinite(r) and r > 0):
            raise SpecError(f"a host speed ratio must be a positive number, got {r}")

    from placeflow.profiles.controller_work import CONTROLLER_KINDS
    from placeflow.profiles.framework import ENGINE_KINDS
    from placeflow.profiles.reshard_host import RESHARD_KINDS

    # The controller's work between calls is Python on the driver like the engine's, and
    # so is the reshard's beside its gathers.
    engine = {k.value for k in (*ENGINE_KINDS, *CONTROLLER_KINDS, *RESHARD_KINDS)}
    smallest = _smallest_sized_pieces(profile)

    def factor(e: Entry) -> float:
        if host_work_ratio is None or e.op is not Op.FRAMEWORK or e.params["kind"] not in engine:
            return ratio
        base = smallest.get(str(e.params["kind"]))
        if base is None or e.median_s <= 0:
            return host_work_ratio
        return sized_piece_s(e.median_s, base, ratio, host_work_ratio) / e.median_s

    def scaled(e: Entry) -> Entry:
        r = factor(e)
        return dataclasses.replace(e, median_s=e.median_s * r, p10_s=e.p10_s * r, p90_s=e.p90_s * r)

    entries = tuple(scaled(e) for e in profile.entries)
    note = (
        f" Host speed: every entry's times x{ratio:.3f}, the median of this host's re-timed "
        f"GEMMs over the profile's at {checked} (`placeflow.profiles.hostcheck`)."
    )
    if host_work_ratio is not None:
        note += (
            f" The engine's pieces x{host_work_ratio:.3f} instead, the median of them "
            "re-timed then over the profile's (a piece timed at several sizes: what its "
            "smallest takes, the rest at the GEMMs' ratio)."
        )
    provenance = dataclasses.replace(profile.provenance, notes=profile.provenance.notes + note)
    return dataclasses.replace(profile, entries=entries, provenance=provenance)
