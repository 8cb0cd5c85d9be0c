"""The engine's framework overhead: profiled through the engine, priced by the simulator,
and CPU cores shared by calls that run at once.

Oracles: hand-made piece times whose slopes and intercepts are computed by hand;
a cost model whose every kernel costs a round number, so that each priced piece
is the framework entry computed by hand; processor-sharing schedules worked out
on paper.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch

from placeflow.catalogue import get_model
from placeflow.layout import TrainLayout
from placeflow.profiles import framework
from placeflow.profiles.controller_work import (
    ADVANTAGE_LENS,
    CONTROLLER_KINDS,
    REWARD_RESPONSES,
)
from placeflow.profiles.costmodel import CostModel
from placeflow.profiles.grid import WAKE_KINDS
from placeflow.profiles.registry import fitted_cost_model, load_profile
from placeflow.profiles.reshard_host import RESHARD_KINDS
from placeflow.profiles.schema import (
    CollectiveKind,
    ElementwiseKind,
    Entry,
    FrameworkKind,
    Op,
    Scope,
    Source,
)
from placeflow.profiles.shared_cores import SHARED_KINDS
from placeflow.simulator import callcosts, compute
from placeflow.simulator.schedule import Work, schedule

GEMM_S, ATTN_S, ELEM_S, OPT_S = 10e-6, 20e-6, 4e-6, 50e-6
MODEL = get_model("tiny-llama")
L = MODEL.num_layers
# Per layer forward: 4 GEMMs, attention, 2 norms + 2 adds + SwiGLU, at any size.
LAYER_FWD_KERNELS = 4 * GEMM_S + ATTN_S + 5 * ELEM_S
# Backward: 8 GEMMs, the attention backward, 4 norms + 2 adds, SwiGLU twice.
LAYER_BWD_KERNELS = 8 * GEMM_S + ATTN_S + 8 * ELEM_S
HEAD_FWD_KERNELS = GEMM_S + ELEM_S  # LM head + log-softmax
FRAMEWORK = {
    FrameworkKind.LAYER_FORWARD: 500e-6,
    FrameworkKind.LAYER_BACKWARD: 900e-6,
    FrameworkKind.LAYER_DECODE: 450e-6,
    FrameworkKind.CALL_FORWARD: 300e-6,
    FrameworkKind.CALL_BACKWARD: 700e-6,
    FrameworkKind.DECODE_STEP: 600e-6,
    FrameworkKind.OPTIMIZER_LAYER: 1000e-6,
    FrameworkKind.OPTIMIZER_CALL: 700e-6,
    FrameworkKind.ADAMW_LAYER: 800e-6,
    FrameworkKind.ADAMW_CALL: 400e-6,
}
ADAMW_KINDS = (FrameworkKind.ADAMW_LAYER, FrameworkKind.ADAMW_CALL)


@dataclasses.dataclass(frozen=True, kw_only=True)
class RoundCosts(CostModel):
    """Round kernel times; framework entries from `entries` (None: the profile has none)."""

    entries: dict[FrameworkKind, float] | None = None
    op_s: float = 1e-6

    def gemm_s(self, m: int, n: int, k: int) -> float:
        return GEMM_S

    def attn_prefill_s(self, *args: int, backward: bool = False) -> float:
        return ATTN_S

    def attn_decode_s(self, *args: int) -> float:
        return ATTN_S

    def elementwise_s(self, kind: str, num_bytes: int) -> float:
        small_add = kind == ElementwiseKind.ADD and num_bytes == compute.OP_OVERHEAD_BYTES
        return self.op_s if small_add else ELEM_S

    def optimizer_s(self, num_params: int) -> float:
        return OPT_S

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
        return 0.0 if world_size <= 1 else 30e-6

    def framework_s(self, kind: FrameworkKind, num_units: int = 1) -> float | None:
        if self.entries is None or kind not in self.entries:
            return None
        entry = self.entries[kind]
        # A tuple: the values at each of `framework.measured_units(kind)`.
        if isinstance(entry, tuple):
            return entry[framework.measured_units(kind).index(num_units)]
        return entry

    def framework_units(self, kind: FrameworkKind) -> tuple[int, ...]:
        if self.entries is None or kind not in self.entries:
            return ()
        return framework.measured_units(kind) if isinstance(self.entries[kind], tuple) else (1,)


def _costs(device_kind: str = "cpu", entries: Any = FRAMEWORK) -> RoundCosts:
    return RoundCosts(
        profile_name="round", dtype_bytes=4, rooflines={}, series={}, device_kind=device_kind,
        entries=entries,
    )  # fmt: skip


def test_cpu_pieces_cost_their_kernels_plus_the_measured_host_time() -> None:
    cm = _costs()
    # Kernels cost the same at every size here, so each piece is its entry exactly:
    # kernels + (entry − the same kernels at the reference size).
    assert compute.layer_forward_s(cm, MODEL, 1, 8, 32) == pytest.approx(500e-6)
    assert compute.layer_backward_s(cm, MODEL, 1, 8, 32) == pytest.approx(900e-6)
    assert compute.head_forward_s(cm, MODEL, 1, 256, value_head=False) == pytest.approx(300e-6)
    head_bwd = compute.head_backward_s(cm, MODEL, 1, 256, value_head=False)
    assert head_bwd == pytest.approx(700e-6)
    # A decode step: L layers' decode entry plus the step's own.
    step = compute.decode_step_s(cm, MODEL, 1, 1, 8, 40)
    assert step == pytest.approx(L * 450e-6 + 600e-6)
    # The optimizer's host time beyond its kernel, per layer and per call.
    assert compute.optimizer_host_s(cm, MODEL, L) == pytest.approx(
        L * (1000e-6 - OPT_S) + (700e-6 - OPT_S)
    )
    # Its per-call entry left out by the profiler (not told from zero): the layers' alone.
    no_call = {k: v for k, v in FRAMEWORK.items() if k is not FrameworkKind.OPTIMIZER_CALL}
    assert compute.optimizer_host_s(_costs(entries=no_call), MODEL, L) == pytest.approx(
        L * (1000e-6 - OPT_S)
    )


def test_a_zero_partition_runs_adamw_over_its_share_of_the_tensors_only() -> None:
    """Whole step 1000 µs a layer and 700 µs a call, AdamW alone 800 and 400 µs, AdamW's
    kernels OPT_S (50 µs) in both: beyond the kernels the step's host time is 950 / 650 µs,
    AdamW's 750 / 350 µs. A rank stepping 1/4 of the tensors keeps the clipping's 200 /
    300 µs and a quarter of AdamW's: 387.5 µs a layer and 387.5 µs a call."""
    cm = _costs()
    assert compute.optimizer_host_s(cm, MODEL, L, 4) == pytest.approx(L * 387.5e-6 + 387.5e-6)
    # One partition (ZeRO 0 or 3, d = 1): the whole step, as before.
    whole = L * 950e-6 + 650e-6
    assert compute.optimizer_host_s(cm, MODEL, L, 1) == pytest.approx(whole)
    # A profile without AdamW's own entries prices the whole step on every partition.
    older = {k: v for k, v in FRAMEWORK.items() if k not in ADAMW_KINDS}
    assert compute.optimizer_host_s(_costs(entries=older), MODEL, L, 4) == pytest.approx(whole)
    # AdamW timed above the whole step (noise) takes off at most the step's host time.
    noisy = {**FRAMEWORK, FrameworkKind.ADAMW_LAYER: 2000e-6}
    assert compute.optimizer_host_s(_costs(entries=noisy), MODEL, L, 4) == pytest.approx(
        L * 950e-6 / 4 + 387.5e-6
    )


@pytest.mark.parametrize(("zero", "partitions"), [(0, 1), (1, 4), (2, 4), (3, 1)])
def test_an_update_prices_the_optimizer_over_its_zero_partition(zero: int, partitions: int) -> None:
    """ZeRO-1/2 over d = 4 (`ZeroRedundancyOptimizer`): each rank's AdamW over a quarter of
    the tensors; ZeRO-0 steps every tensor, ZeRO-3 (FSDP) a shard of every tensor."""
    cm = _costs()
    lay = TrainLayout(d=4)
    dp = callcosts._DPGroups(scope=Scope.INTRA, ranks_per_node=4, expert_ranks_per_node=4)
    _, opt_s = callcosts._dp_sync_and_optimizer_s(cm, MODEL, lay, zero, 1, dp, value_head=False)
    assert opt_s == pytest.approx(OPT_S + compute.optimizer_host_s(cm, MODEL, L, partitions))


def test_host_time_is_the_curve_through_the_sizes() -> None:
    """Entries at three sizes: a layer's forward of 1 x 4 tokens (num_units 1) 500 µs,
    of 8 x 32 (num_units 64) 1,130 µs and of 32 x 32 (num_units 256) 2,090 µs, the
    kernels LAYER_FWD_KERNELS at every size (round costs): 10 µs of host time more per
    unit up to 64 units, 5 µs per unit from there (and beyond, along the last segment).
    A piece of T tokens of a model of hidden h is T/4 · h/128 units."""
    entries: dict[FrameworkKind, Any] = dict(FRAMEWORK)
    entries[FrameworkKind.LAYER_FORWARD] = (500e-6, 1130e-6, 2090e-6)
    entries[FrameworkKind.CALL_FORWARD] = (300e-6, 300e-6 + 63 * 2e-6, 300e-6 + 255 * 2e-6)
    entries[FrameworkKind.LAYER_DECODE] = (450e-6, 450e-6 + 7 * 5e-6, 450e-6 + 63 * 5e-6)
    cm = _costs(entries=entries)
    host_1 = 500e-6 - LAYER_FWD_KERNELS

    def host(units: float) -> float:
        return host_1 + min(units - 1, 63) * 10e-6 + max(units - 64, 0) * 5e-6

    for tokens in (4, 128, 256, 512, 1024, 4096):
        got = compute.layer_forward_s(cm, MODEL, 1, max(1, tokens // 4), 4)
        assert got == pytest.approx(LAYER_FWD_KERNELS + host(tokens / 4)), tokens
    # Twice the hidden size: twice the units for the same tokens (a layer's pieces).
    wide = dataclasses.replace(MODEL, hidden_size=2 * MODEL.hidden_size)
    got = compute.layer_forward_s(cm, wide, 1, 8, 4)  # 32 tokens: 8 units x 2
    assert got == pytest.approx(LAYER_FWD_KERNELS + host(16))
    # The call's own pieces scale with tokens only: 2 µs a unit.
    head = compute.head_forward_s(cm, wide, 1, 32, value_head=False)
    assert head == pytest.approx(300e-6 + 7 * 2e-6)
    # A decode step of 4 sequences: 3 units more than one, 5 µs a unit for each layer.
    step = compute.decode_step_s(cm, MODEL, 1, 1, 4, 40)
    assert step == pytest.approx(L * (450e-6 + 3 * 5e-6) + 600e-6)
    # Never below zero where the curve falls past the last size.
    falling: dict[FrameworkKind, Any] = dict(FRAMEWORK)
    falling[FrameworkKind.CALL_FORWARD] = (300e-6, 200e-6, 2 * HEAD_FWD_KERNELS)
    cm = _costs(entries=falling)
    assert compute.framework_host_s(cm, FrameworkKind.CALL_FORWARD, 1000) == 0
    assert compute.framework_host_s(cm, FrameworkKind.CALL_FORWARD, 1) == pytest.approx(
        300e-6 - HEAD_FWD_KERNELS
    )


def test_host_time_is_never_negative() -> None:
    # An entry cheaper than the priced kernels at the reference size adds nothing.
    cheap = {k: 1e-6 for k in FrameworkKind}
    cm = _costs(entries=cheap)
    assert compute.layer_forward_s(cm, MODEL, 1, 8, 32) == pytest.approx(LAYER_FWD_KERNELS)
    assert compute.layer_backward_s(cm, MODEL, 1, 8, 32) == pytest.approx(LAYER_BWD_KERNELS)
    assert compute.optimizer_host_s(cm, MODEL, L) == 0.0


def test_gpu_overlaps_the_measured_host_time_with_the_kernels() -> None:
    cm = _costs("cuda")
    host = 500e-6 - LAYER_FWD_KERNELS
    launches = compute.KERNELS_LAYER_FORWARD * 1e-6
    assert compute.layer_forward_s(cm, MODEL, 1, 8, 32) == pytest.approx(
        max(LAYER_FWD_KERNELS, launches + host)
    )


def test_without_framework_entries_the_extra_ops_are_priced_as_before() -> None:
    cm = _costs(entries=None)
    assert compute.layer_forward_s(cm, MODEL, 1, 8, 32) == pytest.approx(
        LAYER_FWD_KERNELS + compute.EXTRA_OPS_LAYER_FORWARD * 1e-6
    )
    device = L * LAYER_FWD_KERNELS + HEAD_FWD_KERNELS
    extra = L * compute.EXTRA_OPS_LAYER_DECODE + compute.EXTRA_OPS_DECODE_STEP
    assert compute.decode_step_s(cm, MODEL, 1, 1, 8, 40) == pytest.approx(device + extra * 1e-6)
    assert compute.optimizer_host_s(cm, MODEL, L) == 0.0


def test_slopes_and_intercepts_by_hand(monkeypatch: pytest.MonkeyPatch) -> None:
    """Piece times built from known per-layer and per-call costs come back as entries."""
    (l1, l2), (n1, n2) = framework.LAYER_COUNTS, framework.DECODE_STEPS

    def times(per_layer: float, per_call: float) -> tuple[list[float], list[float]]:
        # Three samples per size, spread ±10 %: every kind is linear in them.
        return tuple(  # type: ignore[return-value]
            [(per_call + n * per_layer) * f for f in (0.9, 1.0, 1.1)] for n in (l1, l2)
        )

    fwd = times(400e-6, 300e-6)
    bwd = times(800e-6, 700e-6)
    train = tuple([f + b for f, b in zip(fwd[i], bwd[i], strict=True)] for i in (0, 1))

    def decode(steps: int) -> tuple[list[float], list[float]]:
        # 2 ms of prefill and setup per call, then steps x (layers x 450 µs + 600 µs).
        return tuple(  # type: ignore[return-value]
            [(2e-3 + steps * (n * 450e-6 + 600e-6)) * f for f in (0.9, 1.0, 1.1)] for n in (l1, l2)
        )

    fake = {
        "forward": fwd,
        "train": train,
        "decode_short": decode(n1),
        "decode_long": decode(n2),
        "step": times(1000e-6, 700e-6),
        "adamw": times(750e-6, 200e-6),
        "load": times(120e-6, 90e-6),
        "sync": times(450e-6, 130e-6),
        # FSDP2 adds 250 µs a layer and 180 µs a call to a forward, 600 and 350 µs to a
        # backward.
        "fsdp_forward": times(400e-6 + 250e-6, 300e-6 + 180e-6),
        "fsdp_train": times(400e-6 + 250e-6 + 800e-6 + 600e-6, 300e-6 + 180e-6 + 700e-6 + 350e-6),
    }
    # The same pieces at both sizes; the optimizer step, the load, the weight sync and the
    # FSDP pieces at the smallest only.
    weights = ("step", "adamw", "load", "sync", "fsdp_forward", "fsdp_train")
    later = {k: v for k, v in fake.items() if k not in weights}
    sized = [fake] + [later] * (len(framework.FORWARD_SIZES) - 1)

    def samples(repeats: int, warmup: int, size: int, names: frozenset[str]) -> Any:
        assert set(sized[size]) <= names
        return sized[size]

    monkeypatch.setattr(framework, "_paired_samples", samples)
    measured = framework.measure_framework()
    keys = [(FrameworkKind(e.params["kind"]), e.params["num_units"]) for e in measured]
    assert sorted(keys) == sorted(
        (kind, units) for kind in expected_kinds() for units in framework.measured_units(kind)
    )
    assert {units for _, units in keys} == {1, 8, 64, 256}
    entries = {FrameworkKind(e.params["kind"]): e for e in measured}
    expected = {
        FrameworkKind.LAYER_FORWARD: 400e-6,
        FrameworkKind.CALL_FORWARD: 300e-6,
        FrameworkKind.LAYER_BACKWARD: 800e-6,
        FrameworkKind.CALL_BACKWARD: 700e-6,
        FrameworkKind.LAYER_DECODE: 450e-6,
        FrameworkKind.DECODE_STEP: 600e-6,
        FrameworkKind.OPTIMIZER_LAYER: 1000e-6,
        FrameworkKind.OPTIMIZER_CALL: 700e-6,
        FrameworkKind.ADAMW_LAYER: 750e-6,
        FrameworkKind.ADAMW_CALL: 200e-6,
        FrameworkKind.LOAD_LAYER: 120e-6,
        FrameworkKind.LOAD_CALL: 90e-6,
        FrameworkKind.SYNC_LAYER: 450e-6,
        FrameworkKind.SYNC_CALL: 130e-6,
        FrameworkKind.FSDP_LAYER_FORWARD: 250e-6,
        FrameworkKind.FSDP_CALL_FORWARD: 180e-6,
        FrameworkKind.FSDP_LAYER_BACKWARD: 600e-6,
        FrameworkKind.FSDP_CALL_BACKWARD: 350e-6,
    }
    assert set(entries) == expected_kinds()
    for kind, value in expected.items():
        e = entries[kind]
        assert e.median_s == pytest.approx(value), kind
        # numpy's linear p10 of 3 samples (0.9, 1.0, 1.1) is 0.92, its p90 1.08.
        assert e.p10_s == pytest.approx(0.92 * value) and e.p90_s == pytest.approx(1.08 * value)
        assert e.op is Op.FRAMEWORK and e.source is Source.MEASURED


def expected_kinds() -> set[FrameworkKind]:
    others = (*SHARED_KINDS, *CONTROLLER_KINDS, *RESHARD_KINDS, *WAKE_KINDS)
    return set(FrameworkKind) - set(others)


def test_the_timers_run_the_engine() -> None:
    import torch.distributed as dist

    weights = {"step", "adamw", "load", "sync", "fsdp_forward", "fsdp_train"}
    names = frozenset({"forward", "train", "decode_short", "decode_long", *weights})
    with framework.one_rank_group():
        pieces = framework._pieces(2, 0, names)
        assert set(pieces) == names
        assert all(timer() > 0 for timer in pieces.values())
    assert not dist.is_initialized()  # the group of one is gone again
    large = framework._pieces(2, 1, names - weights)
    assert set(large) == {"forward", "train", "decode_short", "decode_long"}
    assert all(timer() > 0 for timer in large.values())


def test_the_fsdp_pieces_need_their_group_of_one() -> None:
    from placeflow.errors import MeasurementError

    with pytest.raises(MeasurementError, match="one_rank_group"):
        framework._pieces(2, 0, frozenset({"fsdp_forward"}))


def test_the_fsdp_piece_runs_the_model_the_engine_shards() -> None:
    """The FSDP-wrapped reference model is the engine's ZeRO-3 model: on a group of one
    its log-probabilities are the unwrapped model's, bit for bit, and its parameters are
    FSDP2's sharded DTensors."""
    from torch.distributed.tensor import DTensor

    from placeflow.executor.engines.transformer import Arch, Transformer, random_full

    spec = get_model(framework.REFERENCE_MODEL)
    plain = Transformer(Arch.of(spec))
    plain.load_shards(random_full(plain.arch, seed=0))
    ids = torch.randint(0, spec.vocab_size, (2, 8), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids, dtype=torch.bool)
    with framework.one_rank_group():
        sharded = framework._fsdp_model(spec)
        assert all(isinstance(p, DTensor) for p in sharded.parameters())
        with torch.no_grad():
            assert torch.equal(sharded(ids, mask), plain(ids, mask))


def test_the_cpu_profile_carries_measured_framework_entries_and_gpu_profiles_none() -> None:
    entries = load_profile("cpu").entries_for(Op.FRAMEWORK)
    # The shipped profile's VM was gone before the reshard's host entries were measured
    # (profiles.reshard_host): it has none, and the simulator prices that work at 0 there;
    # nor the calls' wake-up entries (profiles.wake_calls): its calls pay the reference
    # forward's wake_call curve; nor the decode's and training step's stretch entries
    # (profiles.shared_cores, 2026-12-03): its calls follow the forward's curve; nor the
    # empty call's wake-up (`empty_wake`, same date): its transitions pay none.
    own_curves = {FrameworkKind.SHARED_DECODE, FrameworkKind.SHARED_TRAIN}
    later = {FrameworkKind.EMPTY_WAKE}
    expected = set(FrameworkKind) - set(RESHARD_KINDS) - set(WAKE_KINDS) - own_curves - later
    assert {FrameworkKind(e.params["kind"]) for e in entries} == expected
    assert {e.source for e in entries} == {Source.MEASURED}
    cm = fitted_cost_model("cpu")
    for e in entries:  # the fitted model answers each entry exactly
        kind = FrameworkKind(e.params["kind"])
        assert cm.framework_s(kind, int(e.params["num_units"])) == e.median_s
        if kind in CONTROLLER_KINDS:  # (timed by profiles.controller_work)
            assert cm.framework_units(kind) in (REWARD_RESPONSES, ADVANTAGE_LENS)
        elif kind not in SHARED_KINDS:  # (timed by profiles.shared_cores)
            assert cm.framework_units(kind) == framework.measured_units(kind)
    for gpu in ("h100-sxm", "a100-80gb"):
        assert not load_profile(gpu).entries_for(Op.FRAMEWORK)
        assert fitted_cost_model(gpu).framework_s(FrameworkKind.LAYER_FORWARD) is None


def _spans(tasks: list[Work], cores: dict[str, int] | None) -> dict[object, tuple[float, float]]:
    return {k: (s.start_s, s.end_s) for k, s in schedule(tasks, cores).items()}


def test_calls_on_one_host_share_its_cores() -> None:
    # Two 2-worker calls on disjoint sets of a 2-core host: 4 busy workers, each call at
    # half speed while both run. The short one (4 s alone) ends at 8 s; the long one has
    # done 4 of its 10 s by then, and runs the other 6 s alone: ends at 14 s.
    tasks = [
        Work(id="long", sets=(0,), duration_s=10.0, hosts=(("h", 2),)),
        Work(id="short", sets=(1,), duration_s=4.0, hosts=(("h", 2),)),
        Work(id="after", sets=(1,), duration_s=1.0, preds=("short",), hosts=(("h", 2),)),
    ]
    got = _spans(tasks, {"h": 2})
    assert got["short"] == pytest.approx((0.0, 8.0))
    # "after" starts at 8 s beside "long": both at half speed; it ends at 10 s, by when
    # "long" has 10 − 4 − 1 = 5 s left, alone: 15 s.
    assert got["after"] == pytest.approx((8.0, 10.0))
    assert got["long"] == pytest.approx((0.0, 15.0))
    # Without shared cores the plain list schedule.
    plain = _spans(tasks, None)
    assert plain == {"long": (0.0, 10.0), "short": (0.0, 4.0), "after": (4.0, 5.0)}


def test_a_call_alone_keeps_its_own_stretch() -> None:
    # 4 workers on a 2-core host: the duration already counts 4/2; alone it is not
    # stretched again. On another host, or with enough cores, nothing changes.
    alone = [Work(id="a", sets=(0,), duration_s=3.0, hosts=(("h", 4),))]
    assert _spans(alone, {"h": 2}) == {"a": (0.0, 3.0)}
    apart = [
        Work(id="a", sets=(0,), duration_s=3.0, hosts=(("h", 2),)),
        Work(id="b", sets=(1,), duration_s=3.0, hosts=(("g", 2),)),
    ]
    assert _spans(apart, {"h": 2, "g": 2}) == {"a": (0.0, 3.0), "b": (0.0, 3.0)}
    roomy = [
        Work(id="a", sets=(0,), duration_s=3.0, hosts=(("h", 2),)),
        Work(id="b", sets=(1,), duration_s=3.0, hosts=(("h", 2),)),
    ]
    assert _spans(roomy, {"h": 4}) == {"a": (0.0, 3.0), "b": (0.0, 3.0)}


def test_replacing_one_ops_entries_keeps_the_other_ops_notes() -> None:
    """Re-measuring the round trips must not drop the framework entries' provenance (the
    note after it) and vice versa: each op's note is replaced in place."""
    from placeflow.profiles.schema import Op, op_note, op_note_text, with_op_entries

    profile = load_profile("cpu")
    notes = profile.provenance.notes
    assert op_note(Op.DISPATCH, "") in notes and op_note(Op.FRAMEWORK, "") in notes
    dispatch_text = op_note_text(notes, Op.DISPATCH)
    assert dispatch_text is not None
    dispatch = tuple(e for e in profile.entries if e.op is Op.DISPATCH)[:2]
    again = with_op_entries(profile, Op.DISPATCH, dispatch, op_note(Op.DISPATCH, ": new."))
    # The dispatch note replaced (moved to the end), every other note as it was.
    expected = notes.replace(op_note(Op.DISPATCH, dispatch_text), "")
    assert again.provenance.notes == expected + op_note(Op.DISPATCH, ": new.")
    assert op_note_text(again.provenance.notes, Op.FRAMEWORK) == op_note_text(notes, Op.FRAMEWORK)
    assert tuple(e for e in again.entries if e.op is Op.DISPATCH) == dispatch
    assert (
        len(again.entries)
        == len(profile.entries) - len([e for e in profile.entries if e.op is Op.DISPATCH]) + 2
    )
    framework = with_op_entries(profile, Op.FRAMEWORK, (), op_note(Op.FRAMEWORK, ": none."))
    assert framework.provenance.notes.startswith(notes.split(op_note(Op.FRAMEWORK, ""))[0])
    assert framework.provenance.notes.endswith(op_note(Op.FRAMEWORK, ": none."))


def test_some_kinds_are_measured_from_their_pieces_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """`--kinds load_layer load_call`: only the load piece is timed, at the smallest size,
    and only its two kinds come back (20 us per layer, 50 us per call by hand)."""
    asked: list[tuple[int, frozenset[str]]] = []
    (l1, l2) = framework.LAYER_COUNTS

    def samples(repeats: int, warmup: int, size: int, names: frozenset[str]) -> Any:
        asked.append((size, names))
        if size > 0:
            return {}
        return {"load": tuple([50e-6 + n * 20e-6] * 3 for n in (l1, l2))}

    monkeypatch.setattr(framework, "_paired_samples", samples)
    kinds = (FrameworkKind.LOAD_LAYER, FrameworkKind.LOAD_CALL)
    measured = framework.measure_framework(kinds=kinds)
    assert all(names == {"load"} for _, names in asked)
    got = {FrameworkKind(e.params["kind"]): e.median_s for e in measured}
    assert got == pytest.approx({FrameworkKind.LOAD_LAYER: 20e-6, FrameworkKind.LOAD_CALL: 50e-6})


def test_the_loopback_sync_delivers_the_trainers_weights_to_the_generator() -> None:
    """The weight-sync piece runs the real sync: over `_LoopbackLink` the generator rank
    ends with exactly the trainer's tensors (one trainer rank, one generator rank)."""
    from placeflow.executor.engines.transformer import Arch, random_full
    from placeflow.executor.reshard import MemoryMeter
    from placeflow.executor.weight_sync import sync_disjoint
    from placeflow.layout import TrainLayout
    from placeflow.reshard_plan import (
        WEIGHT_SYNC_BUCKET_BYTES,
        GeneratorLayout,
        TinyLlama,
        plan_disjoint,
    )

    spec = get_model(framework.REFERENCE_MODEL)
    weights = random_full(Arch.of(spec), seed=3)
    plan = plan_disjoint(
        TinyLlama.from_model_spec(spec), TrainLayout(), GeneratorLayout(), WEIGHT_SYNC_BUCKET_BYTES
    )
    link = framework._LoopbackLink()
    _, sent = sync_disjoint(plan, 0, weights, MemoryMeter(), link=link)
    received, got = sync_disjoint(plan, 1, None, MemoryMeter(), link=link)
    assert sent == got == spec.num_bytes()
    assert set(received) == set(weights)
    for name, tensor in weights.items():
        assert torch.equal(received[name], tensor), name
    assert not link.sent


def test_a_full_remeasure_keeps_the_shared_cores_entries_and_their_note(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`python -m placeflow.profiles.framework --add-to FILE` replaces the engine's kinds
    and keeps what `profiles.shared_cores` measured: its entries and its note sentence;
    and what `profiles.controller_work` measured, said to be kept."""
    from placeflow.profiles import profiler
    from placeflow.profiles.schema import load_profile_file
    from placeflow.profiles.shared_cores import shared_collective_note

    source = Path(framework.__file__).parent / "data" / "cpu.json"
    path = tmp_path / "cpu.json"
    path.write_text(source.read_text())
    before = load_profile_file(path)
    # (the shipped profile predates the decode's and training step's stretch entries and
    # the empty call's wake-up)
    shared = {k.value for k in SHARED_KINDS} - {"shared_decode", "shared_train", "empty_wake"}
    kept = [e for e in before.entries_for(Op.FRAMEWORK) if e.params["kind"] in shared]
    assert {e.params["kind"] for e in kept} == shared
    controller = {k.value for k in CONTROLLER_KINDS}
    driver = [e for e in before.entries_for(Op.FRAMEWORK) if e.params["kind"] in controller]
    assert {e.params["kind"] for e in driver} == controller
    engine = [
        dataclasses.replace(e, median_s=2 * e.median_s, p10_s=2 * e.p10_s, p90_s=2 * e.p90_s)
        for e in before.entries_for(Op.FRAMEWORK)
        if e.params["kind"] not in shared | controller
    ]
    monkeypatch.setattr(framework, "measure_framework", lambda **_: engine)
    monkeypatch.setattr(profiler, "cpu_busy_fraction", lambda: 0.0)
    assert framework.main(["--add-to", str(path)]) == 0
    after = load_profile_file(path)
    got = after.entries_for(Op.FRAMEWORK)
    assert [e for e in got if e.params["kind"] in shared] == kept
    assert [e for e in got if e.params["kind"] in controller] == driver
    assert "controller_work" in after.provenance.notes
    remeasured = sorted(
        (e.params["kind"], e.median_s) for e in got if e not in kept and e not in driver
    )
    assert remeasured == sorted((e.params["kind"], e.median_s) for e in engine)
    sentence = shared_collective_note(before)
    assert sentence and shared_collective_note(after) == sentence
    assert "shared_compute" in sentence


def _fake_pairs(bad_calls: int) -> tuple[list[int], Any]:
    """A `_paired_samples` whose first `bad_calls` calls time the forward at 1 and 5 ms
    (2 and 6 layers: 1 ms a layer, -1 ms a call) and the later ones at 4 and 8 ms
    (1 ms a layer, 2 ms a call)."""
    calls = [0]

    def fake(repeats: int, warmup: int, size: int, names: frozenset[str]) -> Any:
        calls[0] += 1
        small, large = (1e-3, 5e-3) if calls[0] <= bad_calls else (4e-3, 8e-3)
        return {"forward": ([small] * repeats, [large] * repeats)}

    return calls, fake


def test_a_size_with_a_negative_cost_is_timed_again(monkeypatch: pytest.MonkeyPatch) -> None:
    kinds = (FrameworkKind.LAYER_FORWARD, FrameworkKind.CALL_FORWARD)
    calls, fake = _fake_pairs(bad_calls=1)
    monkeypatch.setattr(framework, "_paired_samples", fake)
    entries = framework.measure_framework(repeats=3, warmup=0, kinds=kinds)
    sizes = len(framework._TIMED_UNITS)
    # The first size needed a second attempt; every size ends at 1 ms a layer, 2 a call.
    assert calls[0] == sizes + 1 and len(entries) == 2 * sizes
    got = {(e.params["kind"], round(e.median_s, 9)) for e in entries}
    assert got == {("layer_forward", 1e-3), ("call_forward", 2e-3)}


def test_a_cost_negative_in_every_attempt_is_left_out_or_a_clear_error(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from placeflow.errors import MeasurementError

    calls, fake = _fake_pairs(bad_calls=100)
    monkeypatch.setattr(framework, "_paired_samples", fake)
    kinds = (FrameworkKind.LAYER_FORWARD, FrameworkKind.CALL_FORWARD)
    # The per-call part stays at -1 ms: left out with a warning, the 1 ms a layer kept.
    with caplog.at_level("WARNING"):
        entries = framework.measure_framework(repeats=3, warmup=0, kinds=kinds)
    sizes = len(framework._TIMED_UNITS)
    assert calls[0] == framework.MAX_ATTEMPTS * sizes
    assert {(e.params["kind"], round(e.median_s, 9)) for e in entries} == {("layer_forward", 1e-3)}
    assert "left out call_forward (-1.000 ms at p10" in caplog.text
    # Nothing left at all: a clear error, not an empty profile part.
    with pytest.raises(MeasurementError, match=r"3 attempts \(call_forward \(-1.000 ms"):
        framework.measure_framework(repeats=3, warmup=0, kinds=(FrameworkKind.CALL_FORWARD,))


def test_a_profile_keeps_its_kernels_when_a_host_overhead_part_fails(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    from placeflow.cli import main
    from placeflow.errors import MeasurementError
    from placeflow.profiles import profiler

    def noisy() -> list[Entry]:
        raise MeasurementError("too busy")

    shared = Entry(
        op=Op.FRAMEWORK, params={"kind": "shared_collective", "num_units": 1}, median_s=1e-3,
        p10_s=1e-3, p90_s=1e-3, repeats=1, source=Source.MEASURED,
    )  # fmt: skip
    monkeypatch.setattr(profiler, "measure_framework", noisy)
    monkeypatch.setattr(profiler, "measure_shared_collective", lambda: shared)
    monkeypatch.setattr(profiler, "measure_coupled_collective", noisy)
    monkeypatch.setattr(profiler, "measure_shared_compute", lambda **kind: [])
    monkeypatch.setattr(profiler, "measure_shared_call", noisy)
    monkeypatch.setattr(profiler, "measure_empty_call", noisy)
    monkeypatch.setattr(profiler, "measure_empty_wake", noisy)
    monkeypatch.setattr(profiler, "measure_wake_call", noisy)
    monkeypatch.setattr(profiler, "measure_cold_weights", noisy)
    monkeypatch.setattr(profiler, "measure_paired_collective", noisy)
    monkeypatch.setattr(profiler, "measure_ray_background", noisy)
    monkeypatch.setattr(profiler, "measure_reshard_host", noisy)
    monkeypatch.setattr(profiler, "measure_wake_calls", noisy)
    monkeypatch.setattr(profiler, "measure_rule_reward", noisy)
    monkeypatch.setattr(profiler, "measure_advantages", list)
    with caplog.at_level("WARNING"):
        assert profiler._host_overhead() == [shared]
    text = caplog.text
    assert "framework overhead not measured (too busy)" in text
    assert "python -m placeflow.profiles.framework --add-to PROFILE" in text
    assert "shared call not measured" in text
    assert "empty call not measured" in text
    assert "placeflow.profiles.shared_cores --kinds empty_call --add-to PROFILE" in text
    assert "empty call's wake-up not measured" in text
    assert "placeflow.profiles.shared_cores --kinds empty_wake --add-to PROFILE" in text
    assert "controller work not measured" in text
    assert "wake call not measured" in text
    assert "placeflow.profiles.shared_cores --kinds wake_call --add-to PROFILE" in text
    assert "cold weights not measured" in text
    assert "placeflow.profiles.shared_cores --kinds cold_weights --add-to PROFILE" in text
    assert "paired collective not measured" in text
    assert "placeflow.profiles.shared_cores --kinds paired_collective --add-to PROFILE" in text
    assert "Ray background not measured" in text
    assert "calls' wake-up not measured" in text
    assert "python -m placeflow.profiles.wake_calls --add-to PROFILE" in text
    assert "coupled collective not measured" in text
    assert "placeflow.profiles.shared_cores --kinds coupled_collective --add-to PROFILE" in text
    assert "placeflow.profiles.shared_cores --kinds ray_background --add-to PROFILE" in text
    assert "reshard host work not measured" in text
    assert "placeflow.profiles.reshard_host --add-to PROFILE" in text
    # A measurement error that reaches the CLI is one line and exit 1, not a traceback.

    def fails(*args: Any, **kwargs: Any) -> Any:
        raise MeasurementError("rank 1 hung")

    monkeypatch.setattr(profiler, "profile_device", fails)
    assert main(["profile", "--device", "cpu", "--out", str(tmp_path / "p.json")]) == 1


FSDP = {
    **FRAMEWORK,
    FrameworkKind.FSDP_LAYER_FORWARD: 250e-6,
    FrameworkKind.FSDP_CALL_FORWARD: 180e-6,
    FrameworkKind.FSDP_LAYER_BACKWARD: 600e-6,
    FrameworkKind.FSDP_CALL_BACKWARD: 350e-6,
}


@dataclasses.dataclass(frozen=True, kw_only=True)
class CopyCosts(RoundCosts):
    """`RoundCosts` whose copies run at 10 GB/s (0.1 ns a byte)."""

    def copy_s(self, direction: str, num_bytes: int) -> float:
        return num_bytes * 1e-10


def test_fsdp_host_work_is_its_entry_with_its_copies_at_the_units_bytes() -> None:
    """tiny-llama (fp32): a layer holds 184,576 parameters (738,304 bytes), the root
    65,664 (an untied embedding and head, the final norm: 262,656 bytes). The entries
    were timed on a group of one, where an unshard copies the whole unit twice (in and
    out): the layer's forward entry holds 2 x 73.8304 µs of copies, 250 − 147.6608 =
    102.3392 µs of the rest. On a rank of d = 2 its unshard copies the half shard in and
    the whole out: 36.9152 + 73.8304 µs, so a layer costs 102.3392 + 110.7456 = 213.0848
    µs, the root 180 − 52.5312 + 39.3984 = 166.8672 µs; a forward of both layers and the
    root 2 x 213.0848 + 166.8672 = 593.0368 µs. A backward's entry holds four copies (the
    unshard again, the gradients in, the shard out), its rank's two halves and two
    wholes: 600 − 295.3216 + 221.4912 = 526.1696 µs a layer, 350 − 105.0624 + 78.7968 =
    323.7344 µs the root, 1,376.0736 µs in all."""
    cm = CopyCosts(
        profile_name="round", dtype_bytes=4, rooflines={}, series={}, device_kind="cpu",
        entries=FSDP,
    )  # fmt: skip
    assert compute._layer_params(MODEL) == 184_576
    units = callcosts.fsdp_units(MODEL, TrainLayout(d=2), value_head=False)
    assert (units.layers, units.layer_bytes, units.root_bytes) == (2, 738_304, 262_656)
    forward = compute.fsdp_host_s(cm, 2, 738_304, 262_656, 2, backward=False)
    assert forward == pytest.approx(593.0368e-6)
    backward = compute.fsdp_host_s(cm, 2, 738_304, 262_656, 2, backward=True)
    assert backward == pytest.approx(1376.0736e-6)
    # Without the entries (GPU profiles, older CPU ones): nothing.
    assert compute.fsdp_host_s(_costs(), 2, 738_304, 262_656, 2, backward=False) == 0.0
    # A per-call entry the profiler left out (not told from zero): the layers' as
    # above and the root's copies alone, 2 x 526.1696 + 78.7968 = 1,131.136 µs.
    no_call = {k: v for k, v in FSDP.items() if k is not FrameworkKind.FSDP_CALL_BACKWARD}
    cm = CopyCosts(
        profile_name="round", dtype_bytes=4, rooflines={}, series={}, device_kind="cpu",
        entries=no_call,
    )  # fmt: skip
    assert compute.fsdp_host_s(cm, 2, 738_304, 262_656, 2, backward=True) == pytest.approx(
        1131.136e-6
    )


def test_a_zero3_call_pays_fsdps_host_work_per_micro_batch() -> None:
    """A ZeRO-3 forward of 16 samples at micro-batch 4 over d = 2 runs 2 micro-batches a
    rank: each pays the three units' gathers (30 µs each here) and FSDP2's host work of
    a forward (593.0368 µs, above) beyond the same call at zero 0. An update's
    micro-batch pays a forward's and a backward's host work (1,969.1104 µs) beyond its
    gathers and reduce-scatters, which `_fsdp_update_s` prices."""
    from placeflow.plan import RoleParallelism

    cm = CopyCosts(
        profile_name="round", dtype_bytes=4, rooflines={}, series={}, device_kind="cpu",
        entries=FSDP,
    )  # fmt: skip

    def par(zero: int) -> RoleParallelism:
        return RoleParallelism(train=TrainLayout(d=2), micro_batch=4, zero=zero, recompute=False)

    def forward(zero: int) -> float:
        cost = callcosts.forward_cost(cm, MODEL, par(zero), 16, 32, value_head=False, trained=True)
        return cost.time_s

    assert forward(3) - forward(0) == pytest.approx(2 * (3 * 30e-6 + 593.0368e-6))

    def pipeline(zero: int) -> float:
        cost = callcosts.train_cost(
            cm, MODEL, par(zero), 16, 32, 1, 1, Scope.INTRA, value_head=False
        )
        return cost.detail["pipeline_s"]

    host = 2 * (593.0368e-6 + 1376.0736e-6)
    assert pipeline(3) - pipeline(0) == pytest.approx(host)
