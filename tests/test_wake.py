"""A call to a rank that slept: measured, priced, scheduled.

Oracles: the paired differences of `wake_samples` from a fake clock whose call costs
a known refill after a sleep (1 ms of work, 2 ms more after 10 ms or longer asleep,
0.1 ms a millisecond below), by hand; the entries' median, floored p10 and the
sleeps left out, by hand; the cost model's curve and `woken` between and beyond its
points, by hand from hand-made entries; the schedule's charge from the idle time of
a call's sets (never-run sets: the last point), by hand on both schedulers; a
simulated CPU plan's model calls charged the hand-made refill stretched as the call
is, its reshard not; the fixed time of a crowded call less the probe's own wake-up,
by hand, and a transition's (which is charged no wake-up) without taking it off; the
empty call's wake-up curve from the `empty_call` probe's pause through hand-made
`empty_wake` entries, by hand, and a CPU plan's reshard charged it at its set's idle
time read off the simulated timeline (the first step's: the curve's last point).
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
from fidelity_cpu import make_plan
from handmade import with_framework

from placeflow.phases import Phase
from placeflow.profiles.costmodel import CostModel, sliced, woken
from placeflow.profiles.registry import fitted_cost_model, load_profile
from placeflow.profiles.schema import FrameworkKind, Op, Source, load_profile_file, save_profile
from placeflow.profiles.shared_cores import (
    WAKE_FLOOR_S,
    main,
    measure_wake_call,
    wake_entries,
    wake_samples,
)
from placeflow.simulator import simulate
from placeflow.simulator.estimate import PhaseInterval
from placeflow.simulator.schedule import Work, schedule
from placeflow.workload import Role


class _FakeHost:
    """A thread whose call takes 1 ms of CPU, plus 0.1 ms per millisecond it slept just
    before, at most 2 ms (a refill that saturates)."""

    def __init__(self) -> None:
        self.now = 0.0
        self.slept_s = 0.0

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept_s = seconds  # CPU time does not advance asleep

    def call(self) -> None:
        self.now += 1e-3 + min(2e-3, 0.1 * self.slept_s)
        self.slept_s = 0.0


def test_wake_samples_are_the_cold_call_less_the_hot_one_by_hand() -> None:
    host = _FakeHost()
    samples = wake_samples(host.call, (1, 5, 30), pairs=3, sleep=host.sleep, clock=host.clock)
    # After 1 ms asleep: 0.1 ms more; after 5 ms: 0.5 ms; after 30 ms: the 2 ms cap.
    assert samples == {
        1: pytest.approx([1e-4] * 3),
        5: pytest.approx([5e-4] * 3),
        30: pytest.approx([2e-3] * 3),
    }


def test_wake_entries_hold_the_median_a_floored_p10_and_leave_out_no_cost() -> None:
    entries = wake_entries(
        {
            1: [-2e-4, -1e-4, 0.0, 1e-4],  # median -5e-5: no measurable cost, no entry
            3: [-9e-4, -8e-4, 6e-4, 7e-4, 8e-4],  # median 6e-4, p10 below 0: floored
            30: [2e-3, 2e-3, 2e-3],
        }
    )
    assert [e.params for e in entries] == [
        {"kind": "wake_call", "num_units": 3},
        {"kind": "wake_call", "num_units": 30},
    ]
    three, thirty = entries
    assert three.median_s == pytest.approx(6e-4) and three.p10_s == WAKE_FLOOR_S
    assert three.p90_s == pytest.approx(7.6e-4)  # inclusive deciles of the five: by hand
    assert three.repeats == 5 and three.source is Source.MEASURED
    assert (thirty.median_s, thirty.p10_s, thirty.p90_s) == pytest.approx((2e-3,) * 3)


def _with_wake(cm: CostModel, extra_s: dict[int, float] | None) -> CostModel:
    """`cm` with hand-made `wake_call` entries, extra seconds by ms asleep (None: none)."""
    return with_framework(cm, FrameworkKind.WAKE_CALL, extra_s)


# 0.5 ms after 1 ms asleep, 0.4 ms (noise: held at 0.5) after 3 ms, 2 ms after 10 ms.
HAND = {1: 0.5e-3, 3: 0.4e-3, 10: 2e-3}


def test_the_wake_curve_runs_from_zero_through_the_entries_never_down() -> None:
    curve = _with_wake(fitted_cost_model("cpu"), HAND).wake_curve()
    assert [x for x, _ in curve] == pytest.approx([0.0, 1e-3, 3e-3, 10e-3])
    assert [y for _, y in curve] == pytest.approx([0.0, 0.5e-3, 0.5e-3, 2e-3])
    assert woken(0.0, curve) == 0.0
    assert woken(0.5e-3, curve) == pytest.approx(0.25e-3)  # half way to the first point
    assert woken(2e-3, curve) == pytest.approx(0.5e-3)
    assert woken(6.5e-3, curve) == pytest.approx(1.25e-3)  # half way from 3 ms to 10 ms
    assert woken(1.0, curve) == pytest.approx(2e-3) and woken(math.inf, curve) == 2e-3
    # No entries, or a GPU profile: no charge.
    assert _with_wake(fitted_cost_model("cpu"), None).wake_curve() == ()
    assert fitted_cost_model("h100-sxm").wake_curve() == ()
    assert woken(1.0) == 0.0


CURVE = ((0.0, 0.0), (0.01, 2.0))  # seconds asleep -> extra seconds (large, to read)


def test_the_schedule_charges_each_call_its_sets_idle_time_by_hand() -> None:
    # Set 0: a (never ran: the curve's last point, 2 s) then b right after it (idle 0:
    # nothing); c waits for a 5 ms controller task after b (idle 5 ms: 1 s).
    tasks = [
        Work(id="a", sets=(0,), duration_s=1.0, wake=CURVE),
        Work(id="b", sets=(0,), duration_s=1.0, preds=("a",), wake=CURVE),
        Work(id="gap", sets=(), duration_s=0.005, preds=("b",)),
        Work(id="c", sets=(0,), duration_s=1.0, preds=("gap",), wake=CURVE),
    ]
    spans = schedule(tasks)
    assert (spans["a"].end_s, spans["a"].wake_s) == pytest.approx((3.0, 2.0))
    assert (spans["b"].end_s, spans["b"].wake_s) == pytest.approx((4.0, 0.0))
    assert spans["c"].start_s == pytest.approx(4.005)
    assert (spans["c"].end_s, spans["c"].wake_s) == pytest.approx((6.005, 1.0))
    # On a shared host (one worker per set, 2 cores: no crowding) the same charges.
    host = ("cpu", 0)
    shared = [dataclasses.replace(t, hosts=((host, 1.0),) if t.sets else ()) for t in tasks]
    again = schedule(shared, {host: 2}, {}, {})
    for key in ("a", "b", "c"):
        assert again[key].end_s == pytest.approx(spans[key].end_s), key
        assert again[key].wake_s == pytest.approx(spans[key].wake_s), key
    # Work over two sets pays for the one idle longest: set 1 never ran.
    both = schedule(
        [*tasks[:2], Work(id="d", sets=(0, 1), duration_s=1.0, preds=("b",), wake=CURVE)]
    )
    assert both["d"].wake_s == pytest.approx(2.0)


def test_a_cpu_plan_s_model_calls_pay_the_refill_stretched_its_reshard_not() -> None:
    plan = make_plan("colocate", "tiny-llama", 8)  # 4 workers on 2 cores
    cm = _with_wake(fitted_cost_model("cpu"), HAND)
    estimate = simulate(plan, cm)
    stretch = sliced(2.0, cm.slicing())
    by_phase = {p.name: p for p in estimate.phases}
    assert "wake_s" not in by_phase[Phase.RESHARD].detail
    # The first call on the set is the reshard: every model call follows another on it.
    for phase in (Phase.GENERATE, Phase.REF_LOGPROB, Phase.OLD_LOGPROB, Phase.ACTOR_UPDATE):
        paid = by_phase[phase].detail.get("wake_s", 0.0)
        assert 0.0 <= paid <= 2e-3 * stretch * (1 + 1e-9), phase
    # Generation waits for the driver's launch after the reshard: charged for that gap.
    assert by_phase[Phase.GENERATE].detail["wake_s"] > 0
    # Without the entries: no charge, and the step is shorter.
    bare = simulate(plan, _with_wake(cm, None))
    assert all("wake_s" not in p.detail for p in bare.phases)
    assert bare.iteration_s < estimate.iteration_s


def test_a_crowded_call_s_fixed_time_leaves_out_the_probe_s_wake_up_by_hand() -> None:
    from placeflow.profiles.schema import DispatchKind
    from placeflow.simulator.rolecosts import crowded_call_s

    cm = fitted_cost_model("cpu")
    # The composition's round trip (`test_shared_cores`): the call's less the driver's
    # launch, never below a tenth of it.
    call = cm.dispatch_s(DispatchKind.RAY_CALL, 0, 0)
    launch = cm.driver_s(DispatchKind.RAY_LAUNCH, 0, 0)
    assert launch is not None
    trip = max(call / 10, call - launch)
    without = crowded_call_s(_with_wake(cm, None), 2.0)
    assert without > 0  # the shipped profile's measured excess at 2 ranks per core
    # A refill of `without` / 4 at any sleep: the probe's ranks paid it after each round
    # trip, stretched as the call is: what the composition now leaves out is that less.
    flat = without / 4 / sliced(2.0, cm.slicing())
    woke = _with_wake(cm, {1: flat, 1000: flat})
    assert woken(trip, woke.wake_curve()) == pytest.approx(flat * min(1.0, trip / 1e-3))
    expected = without - woken(trip, woke.wake_curve()) * sliced(2.0, cm.slicing())
    assert crowded_call_s(woke, 2.0) == pytest.approx(expected)
    # A transition is charged no wake-up, so its composition holds none to leave out
    # (measured against the probe's entries where the profile has no empty calls) ...
    no_empty = with_framework(woke, FrameworkKind.EMPTY_CALL, None)
    assert crowded_call_s(no_empty, 2.0, wakes=False) == pytest.approx(without)
    # ... and against its empty calls where it has them, whatever the wake curve.
    assert woke.empty_calls()
    assert crowded_call_s(woke, 2.0, wakes=False) == pytest.approx(
        crowded_call_s(cm, 2.0, wakes=False)
    )


def test_a_transition_costs_the_measured_empty_call_plus_its_own_work_by_hand() -> None:
    from placeflow.simulator.rolecosts import crowded_call_s
    from placeflow.simulator.simulate import _cost_calls

    cm = fitted_cost_model("cpu")
    plan = make_plan("colocate", "tiny-llama", 8)  # 4 ranks on the pool's 2 cores
    costed, _ = _cost_calls(plan, {"*": cm}, [0.0])
    (reshard,) = [c.cost for c in costed if c.phase is Phase.RESHARD]
    crowd = crowded_call_s(cm, 2.0, wakes=False)
    assert reshard.detail["crowded_call_s"] == pytest.approx(crowd)
    # by hand: the load and the round trip stretched at 2 ranks per core, then the
    # measured empty call to 4 ranks less its composition without a wake-up
    work = reshard.detail["load_s"] + reshard.detail["dispatch_s"]
    assert reshard.time_s == pytest.approx(work * sliced(2.0, cm.slicing()) + crowd)


def test_the_command_adds_only_the_kinds_it_is_given(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import placeflow.profiles.shared_cores as shared_cores

    path = tmp_path / "cpu.json"
    save_profile(load_profile("cpu"), path)
    before = load_profile_file(path)
    # The command refuses a host with other cores than the profile's: this one has them.
    cores = int(before.provenance.host["cpu_count"])
    monkeypatch.setattr(shared_cores.os, "cpu_count", lambda: cores)
    monkeypatch.setattr(
        shared_cores, "measure_wake_call", lambda: wake_entries({10: [2e-3], 30: [2.5e-3]})
    )
    assert main(["--add-to", str(path), "--kinds", "wake_call"]) == 0
    after = load_profile_file(path)
    kinds = {str(e.params["kind"]) for e in before.entries_for(Op.FRAMEWORK)}
    kept = [e for e in before.entries_for(Op.FRAMEWORK) if e.params["kind"] != "wake_call"]
    woke = [e for e in after.entries_for(Op.FRAMEWORK) if e.params["kind"] == "wake_call"]
    assert [e.params["num_units"] for e in woke] == [10, 30]
    assert [e for e in after.entries_for(Op.FRAMEWORK) if e.params["kind"] != "wake_call"] == kept
    assert "shared_compute" in kinds and "--kinds wake_call" in after.provenance.notes


@pytest.mark.slow
def test_measure_wake_call_times_real_forwards() -> None:
    entries = measure_wake_call(pairs=2)
    # Noise may leave a short sleep without an entry; what is there is well formed.
    for e in entries:
        assert e.params["kind"] == "wake_call" and e.params["num_units"] in (1, 3, 10, 30, 100)
        assert 0 < e.p10_s <= e.median_s <= e.p90_s < 1.0 and e.repeats == 2


# 0.2 ms after 10 ms idle, 0.1 ms (noise: held at 0.2) after 30 ms, 0.6 ms after 100 ms.
EMPTY_HAND = {10: 0.2e-3, 30: 0.1e-3, 100: 0.6e-3}


def test_the_empty_call_s_wake_curve_starts_at_the_probe_s_pause_never_down() -> None:
    from placeflow.profiles.grid import EMPTY_CALL_PAUSE_S

    cm = with_framework(fitted_cost_model("cpu"), FrameworkKind.EMPTY_WAKE, EMPTY_HAND)
    curve = cm.empty_wake_curve()
    assert EMPTY_CALL_PAUSE_S == 3e-3
    assert [x for x, _ in curve] == pytest.approx([3e-3, 10e-3, 30e-3, 100e-3])
    assert [y for _, y in curve] == pytest.approx([0.0, 0.2e-3, 0.2e-3, 0.6e-3])
    # The `empty_call` entries already hold the probe's own 3 ms idle: nothing below it.
    assert woken(0.0, curve) == 0.0 and woken(3e-3, curve) == 0.0
    assert woken(6.5e-3, curve) == pytest.approx(0.1e-3)  # half way from 3 ms to 10 ms
    assert woken(65e-3, curve) == pytest.approx(0.4e-3)  # half way from 30 ms to 100 ms
    assert woken(math.inf, curve) == pytest.approx(0.6e-3)
    # No entries, or a GPU profile: no curve.
    assert fitted_cost_model("cpu").empty_wake_curve() == ()
    assert fitted_cost_model("h100-sxm").empty_wake_curve() == ()


def test_a_cpu_plan_s_transitions_pay_the_empty_call_s_wake_up_by_their_idle_time() -> None:
    from fidelity_cpu import PLANS, as_run, fixed_lengths, load_plan

    base = fitted_cost_model("cpu")
    cm = with_framework(base, FrameworkKind.EMPTY_WAKE, EMPTY_HAND)
    curve = cm.empty_wake_curve()
    # A colocated plan's one step: its reshard is the set's first call, idle since ever.
    colocated = make_plan("colocate", "tiny-llama", 8)
    (reshard,) = [p for p in simulate(colocated, cm).phases if p.name is Phase.RESHARD]
    assert reshard.detail["wake_s"] == pytest.approx(0.6e-3)
    # A one-step-off generator set: each weight sync over both sets pays the curve at the
    # longer of their idle times, read off the simulated timeline by hand.
    plan = as_run(fixed_lengths(load_plan(PLANS / "grpo-tiny-cpu2-async.toml")))
    actor_set, gen_set = plan.set_of(Role.ACTOR), plan.generator_set()
    assert gen_set is not None
    estimate = simulate(plan, cm)
    syncs = [p for p in estimate.phases if p.name is Phase.WEIGHT_SYNC]
    assert len(syncs) >= 3

    def idle_on(s: int, sync: PhaseInterval) -> float:
        ends = [
            p.end_s
            for p in estimate.phases
            if p is not sync
            and p.end_s <= sync.start_s + 1e-12
            and (p.device_set == s or p.name is Phase.WEIGHT_SYNC)
        ]
        return sync.start_s - max(ends) if ends else math.inf

    paid = []
    for sync in syncs:
        idle = max(idle_on(actor_set, sync), idle_on(gen_set, sync))
        assert sync.detail.get("wake_s", 0.0) == pytest.approx(woken(idle, curve), abs=1e-12)
        paid.append(sync.detail.get("wake_s", 0.0))
    assert min(paid) < max(paid)  # not one charge for all: the idle times differ
    # The model calls' charges are their own kinds' (`wake_calls`), not this curve:
    # without the entries only the transitions change.
    for plan_ in (colocated, plan):
        with_curve, bare = simulate(plan_, cm), simulate(plan_, base)
        bare_of = {(q.step, q.name): q for q in bare.phases}
        assert len(bare_of) == len(with_curve.phases)
        for p in with_curve.phases:
            q = bare_of[p.step, p.name]
            if p.name in (Phase.RESHARD, Phase.WEIGHT_SYNC):
                assert "wake_s" not in q.detail
            else:
                assert p.detail.get("wake_s", 0.0) == pytest.approx(q.detail.get("wake_s", 0.0))


def test_empty_wake_samples_are_the_idle_call_less_the_call_after_the_pause_by_hand() -> None:
    from placeflow.profiles.shared_cores import empty_wake_samples

    slept = [0.0]

    def sleep(seconds: float) -> None:
        slept[0] = seconds

    def call() -> float:  # its own time: 1 ms, plus 10 µs a ms idle, at most 1 ms more
        return 1e-3 + min(1e-3, 0.01 * slept[0])

    samples = empty_wake_samples(call, (10, 30, 300), pairs=2, base_s=3e-3, sleep=sleep)
    # by hand: (1 ms + 10 µs · idle ms) less the same after 3 ms, the cap at 100 ms
    assert samples == {
        10: pytest.approx([0.07e-3] * 2),
        30: pytest.approx([0.27e-3] * 2),
        300: pytest.approx([0.97e-3] * 2),
    }


@pytest.mark.slow
def test_measure_empty_wake_times_real_empty_calls(ray_session: None) -> None:
    from placeflow.profiles.shared_cores import EMPTY_WAKE_IDLE_MS, measure_empty_wake

    entries = measure_empty_wake(cores=1, pairs=2, warmup=1)
    # Noise may leave an idle time without an entry; what is there is well formed.
    for e in entries:
        assert e.params["kind"] == "empty_wake" and e.params["num_units"] in EMPTY_WAKE_IDLE_MS
        assert 0 < e.p10_s <= e.median_s <= e.p90_s < 1.0 and e.repeats == 2
