"""Each kind of call after the rank's other calls and a pause: measured, priced, charged.

Oracles: the differences of `turn_samples` from a fake host whose calls cost a known
refill after another call and after a sleep, by hand; the entries' kinds on the two
models and a pause without cost left out, by hand; the cost model's curve of a call
between the two models' weight bytes (a linear mix by hand, its first point held back
to 0 idle), at each end; a measured profile's missing entries costing nothing and an
unmeasured profile's calls paying the reference forward's `wake_call` curve; a
simulated CPU plan charging only its update where only the update's entries exist; a
TP 2 rank's forward charged at its half of the model's bytes and its TP 1 generation at
the whole model's, by hand; the command adding only its kinds to a profile.
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

import pytest
from fidelity_cpu import make_plan
from handmade import with_framework

import placeflow.profiles.wake_calls as wake_calls
from placeflow.catalogue import CATALOGUE
from placeflow.dataflow import CallKind
from placeflow.phases import Phase
from placeflow.profiles.costmodel import CostModel, sliced, woken
from placeflow.profiles.grid import WAKE_KINDS, WAKE_KINDS_OF, wake_model_bytes
from placeflow.profiles.registry import fitted_cost_model, load_profile
from placeflow.profiles.schema import FrameworkKind, Op, load_profile_file, save_profile
from placeflow.profiles.wake_calls import (
    engine_calls,
    entries_of,
    main,
    measure_wake_calls,
    turn_samples,
)
from placeflow.simulator import simulate
from placeflow.workload import Role


class _FakeRank:
    """A thread whose calls take 1 ms (a), 2 ms (b) and 4 ms (c) of CPU, plus 0.5 ms
    when the call before it on the thread was another one, plus 0.1 ms per
    millisecond the thread slept just before, at most 2 ms."""

    WORK: ClassVar[dict[str, float]] = {"a": 1e-3, "b": 2e-3, "c": 4e-3}

    def __init__(self) -> None:
        self.now = 0.0
        self.slept_s = 0.0
        self.last: str | None = None

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept_s = seconds  # CPU time does not advance asleep

    def call(self, name: str) -> None:
        switch = 0.5e-3 if self.last not in (None, name) else 0.0
        self.now += self.WORK[name] + switch + min(2e-3, 0.1 * self.slept_s)
        self.slept_s, self.last = 0.0, name

    def calls(self) -> list[wake_calls.Call]:
        return [(n, lambda n=n: self.call(n)) for n in self.WORK]


def test_turn_samples_are_each_call_in_turn_less_itself_hot_by_hand() -> None:
    rank = _FakeRank()
    samples = turn_samples(rank.calls(), (1, 5, 30), rounds=2, sleep=rank.sleep, clock=rank.clock)
    # Every call in turn follows another call (0.5 ms) and the pause: 0.1 ms after 1 ms,
    # 0.5 ms after 5 ms, the 2 ms cap after 30 ms; hot, it follows itself awake.
    for name in ("a", "b", "c"):
        assert samples[name] == {
            1: pytest.approx([0.6e-3] * 2),
            5: pytest.approx([1.0e-3] * 2),
            30: pytest.approx([2.5e-3] * 2),
        }, name


def test_the_entries_are_each_call_s_kind_on_either_model_without_costless_pauses() -> None:
    samples = {
        "generate": {1: [1e-3, 2e-3, 3e-3], 30: [4e-3]},
        "forward": {1: [-1e-3, 0.0, 1e-4], 30: [2e-3]},  # 1 ms: median 0, no entry
        "train": {1: [5e-4], 30: [3e-3]},
    }
    small = entries_of(samples, large=False)
    large = entries_of(samples, large=True)
    assert [(e.params["kind"], e.params["num_units"], e.median_s) for e in small] == [
        ("wake_generate", 1, pytest.approx(2e-3)),
        ("wake_generate", 30, pytest.approx(4e-3)),
        ("wake_forward", 30, pytest.approx(2e-3)),
        ("wake_update", 1, pytest.approx(5e-4)),
        ("wake_update", 30, pytest.approx(3e-3)),
    ]
    assert [e.params["kind"] for e in large] == [
        "wake_generate_large",
        "wake_generate_large",
        "wake_forward_large",
        "wake_update_large",
        "wake_update_large",
    ]
    assert all(e.p10_s > 0 for e in (*small, *large))
    # Every wake kind but the reference forward's after itself is one of a call's, and
    # the engine's calls are named by the call kinds the cost model reads.
    named = {k for k in FrameworkKind if k.value.startswith("wake_")} - {FrameworkKind.WAKE_CALL}
    assert set(WAKE_KINDS) == named
    assert [name for name, _ in engine_calls("tiny-llama")] == list(WAKE_KINDS_OF)
    assert set(WAKE_KINDS_OF) == {k.value for k in CallKind} - {"controller"}


def _flat(curve: tuple[tuple[float, float], ...]) -> list[float]:
    """A curve's points, flat (pytest.approx compares flat sequences)."""
    return [v for point in curve for v in point]


def _with(cm: CostModel, entries: dict[FrameworkKind, dict[int, float] | None]) -> CostModel:
    for kind, times in entries.items():
        cm = with_framework(cm, kind, times)
    return cm


def _bare(cm: CostModel) -> CostModel:
    """`cm` without any of the calls' wake-up entries."""
    return _with(cm, {k: None for k in WAKE_KINDS})


def test_a_call_s_curve_mixes_the_two_models_by_its_weight_bytes_by_hand() -> None:
    small_bytes, large_bytes = wake_model_bytes()
    cm = _with(
        _bare(fitted_cost_model("cpu")),
        {
            FrameworkKind.WAKE_UPDATE: {1: 1e-3, 30: 3e-3},
            FrameworkKind.WAKE_UPDATE_LARGE: {1: 3e-3, 10: 2e-3, 30: 7e-3},
        },
    )
    # At the small model's bytes and below: its curve, its first point held back to 0
    # idle (a call right after another pays the switch); at 10 ms, by hand on the line
    # from 1 ms to 30 ms.
    lo = cm.call_wake_curve(CallKind.TRAIN.value, small_bytes / 2)
    assert woken(0.0, lo) == pytest.approx(1e-3) and woken(1e-3, lo) == pytest.approx(1e-3)
    assert woken(10e-3, lo) == pytest.approx(1e-3 + 2e-3 * 9 / 29)
    assert woken(1.0, lo) == pytest.approx(3e-3)
    # At the large model's bytes and beyond: its curve, held at 3 ms where it dips.
    hi = cm.call_wake_curve(CallKind.TRAIN.value, large_bytes * 4)
    assert [x for x, _ in hi] == pytest.approx([0.0, 1e-3, 10e-3, 30e-3])
    assert [y for _, y in hi] == pytest.approx([3e-3, 3e-3, 3e-3, 7e-3])
    # A quarter of the way: 3/4 of the small curve and 1/4 of the large one at each point.
    quarter = small_bytes + (large_bytes - small_bytes) / 4
    mid = cm.call_wake_curve(CallKind.TRAIN.value, quarter)
    at_1 = 0.75 * 1e-3 + 0.25 * 3e-3
    at_10 = 0.75 * (1e-3 + 2e-3 * 9 / 29) + 0.25 * 3e-3  # the large curve held at 3 ms
    assert [x for x, _ in mid] == pytest.approx([0.0, 1e-3, 10e-3, 30e-3])
    assert [y for _, y in mid] == pytest.approx([at_1, at_1, at_10, 0.75 * 3e-3 + 0.25 * 7e-3])


def test_missing_entries_cost_nothing_measured_and_the_forward_s_curve_unmeasured() -> None:
    small_bytes, large_bytes = wake_model_bytes()
    bare = _with(_bare(fitted_cost_model("cpu")), {FrameworkKind.WAKE_CALL: {10: 1e-3, 30: 2e-3}})
    # Measured, the small forward without entries (no cost at any pause): the large
    # one's curve times the share, from 0 idle.
    measured = _with(bare, {FrameworkKind.WAKE_FORWARD_LARGE: {30: 4e-3}})
    assert _flat(measured.call_wake_curve("forward", large_bytes)) == pytest.approx(
        _flat(((0.0, 4e-3), (0.03, 4e-3)))
    )
    half = (small_bytes + large_bytes) / 2
    assert _flat(measured.call_wake_curve("forward", half)) == pytest.approx(
        [0.0, 2e-3, 0.03, 2e-3]
    )
    assert _flat(measured.call_wake_curve("forward", small_bytes)) == pytest.approx(
        _flat(((0.0, 0.0), (0.03, 0.0)))
    )
    # Measured, a kind with no entry on either model: no charge.
    for call in ("generate", "train"):
        assert measured.call_wake_curve(call, large_bytes) == ()
    # Not measured at all: the reference forward's `wake_call` curve for every call; on
    # a GPU profile, nothing.
    for call in ("generate", "forward", "train"):
        assert bare.call_wake_curve(call, small_bytes) == bare.wake_curve() != ()
    assert fitted_cost_model("h100-sxm").call_wake_curve("forward", small_bytes) == ()


def test_a_cpu_plan_charges_each_call_its_own_kind_s_curve() -> None:
    plan = make_plan("colocate", "tiny-llama", 8)  # 4 workers on 2 cores
    base = _with(_bare(fitted_cost_model("cpu")), {FrameworkKind.WAKE_CALL: None})
    # Only the update pays after a pause: the forward and generation have no entries.
    cm = _with(base, {FrameworkKind.WAKE_UPDATE: {1: 5e-3, 100: 5e-3}})
    estimate = simulate(plan, cm)
    by_phase = {p.name: p for p in estimate.phases}
    stretch = sliced(2.0, cm.slicing())
    paid = by_phase[Phase.ACTOR_UPDATE].detail["wake_s"]
    # The update follows the old log-probs on the same ranks: the curve's 5 ms at any
    # idle time, stretched as the call is (at most the crowd's stretch).
    assert 0.0 < paid <= 5e-3 * stretch * (1 + 1e-9)
    for phase in (Phase.GENERATE, Phase.REF_LOGPROB, Phase.OLD_LOGPROB, Phase.RESHARD):
        assert "wake_s" not in by_phase[phase].detail, phase
    # Without any entries at all: no charge, and the step is shorter.
    bare = simulate(plan, base)
    assert all("wake_s" not in p.detail for p in bare.phases)
    assert bare.iteration_s < estimate.iteration_s


def test_a_rank_s_weight_bytes_pick_its_point_between_the_two_models() -> None:
    from placeflow.simulator.simulate import _cost_calls, _stretch, busy_fraction

    small_bytes, large_bytes = wake_model_bytes()
    # tiny-llama-m with TP 2: each rank holds half of its 12.3 MB (6.2 MB), between the
    # two models' bytes; its generation gathers the whole model (TP 1 there).
    plan = make_plan("colocate-tp2", "tiny-llama-m", 8)
    cm = _with(
        _bare(fitted_cost_model("cpu")),
        {
            FrameworkKind.WAKE_FORWARD: {30: 1e-3},
            FrameworkKind.WAKE_FORWARD_LARGE: {30: 9e-3},
            FrameworkKind.WAKE_GENERATE: {30: 2e-3},
            FrameworkKind.WAKE_GENERATE_LARGE: {30: 10e-3},
        },
    )
    costed, _ = _cost_calls(plan, {"*": cm}, [0.0] * len(plan.sets))
    by_phase = {c.phase: c for c in costed}
    lay = plan.parallelism[Role.ACTOR]
    assert (lay.train.t, lay.tg) == (2, 1)
    shard = CATALOGUE["tiny-llama-m"].num_bytes() / 2
    share = (shard - small_bytes) / (large_bytes - small_bytes)
    for phase, small, large, share_of in (
        (Phase.OLD_LOGPROB, 1e-3, 9e-3, share),
        (Phase.GENERATE, 2e-3, 10e-3, 1.0),  # the whole model: the large curve
    ):
        call = by_phase[phase]
        factor = _stretch(plan, {"*": cm}, call.sets[0], busy_fraction(call.cost))
        extra = (small * (1 - share_of) + large * share_of) * factor
        assert _flat(call.wake) == pytest.approx([0.0, extra, 0.03, extra]), phase


def test_the_command_adds_only_its_kinds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "cpu.json"
    save_profile(load_profile("cpu"), path)
    before = load_profile_file(path)
    made = entries_of({"forward": {10: [2e-3]}, "train": {30: [4e-3]}}, large=True)
    monkeypatch.setattr(wake_calls, "measure_wake_calls", lambda: made)
    assert main(["--add-to", str(path)]) == 0
    after = load_profile_file(path)
    names = {k.value for k in WAKE_KINDS}
    ours = [e for e in after.entries_for(Op.FRAMEWORK) if e.params["kind"] in names]
    assert [(e.params["kind"], e.params["num_units"]) for e in ours] == [
        ("wake_forward_large", 10),
        ("wake_update_large", 30),
    ]
    kept = [e for e in before.entries_for(Op.FRAMEWORK) if e.params["kind"] not in names]
    assert [e for e in after.entries_for(Op.FRAMEWORK) if e.params["kind"] not in names] == kept
    assert "placeflow.profiles.wake_calls" in after.provenance.notes


def test_the_command_refuses_a_gpu_profile(tmp_path: Path) -> None:
    path = tmp_path / "h100.json"
    save_profile(load_profile("h100-sxm"), path)
    with pytest.raises(SystemExit) as raised:
        main(["--add-to", str(path)])
    assert raised.value.code == 2


@pytest.mark.slow
def test_measure_wake_calls_times_the_engine_s_real_calls() -> None:
    entries = measure_wake_calls(rounds=1)
    names = {k.value for k in WAKE_KINDS}
    # Noise may leave a pause without an entry; what is there is well formed.
    assert entries
    for e in entries:
        assert e.params["kind"] in names and e.params["num_units"] in (1, 3, 10, 30, 100)
        assert 0 < e.p10_s <= e.median_s <= e.p90_s < 1.0 and e.repeats == 1
