"""Collectives of ranks that share their host's cores: measured, priced, simulated.

Oracles: the view adds the partner wait (the profile's entry less the probe
all-reduce's own stretched time) divided by the contention to every collective
within a host and nothing else (hand-computed from the entries); a
data-parallel update on an oversubscribed CPU set pays exactly its collectives'
count times that wait more than on free cores, counted by hand from the
layout (per optimizer step: one gradient all-reduce and one parameter
all-gather for ZeRO-1); a call beside another set's on a crowded host ends when
the rates and each collective's wait, worked out by hand, say; the count of a
tensor-parallel forward's collectives, by hand from its layers and
micro-batches; the time slices' overhead from hand-made entries, and a call's
stretch and a crowded host's rates with it, by hand; the blocked share of a
collective from where a hand-made `shared_collective` entry lands between its
probe's entry alone and stretched, by hand, and a collective's blocked time (that share
of its latency-sized part, the entry at the probe's size) kept out of a shared view's
stretch, by hand; a generation's and an update's stretch by their own hand-made curves
(a decode's, a training step's), and a call with a curve of its own beside another on a
crowded host, by hand; the measurements spawn real gloo ranks.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from fidelity_cpu import make_plan
from handmade import with_framework

from placeflow.phases import Phase
from placeflow.plan import load_plan
from placeflow.profiles.costmodel import CostModel, sliced
from placeflow.profiles.registry import fitted_cost_model, load_profile
from placeflow.profiles.schema import CollectiveKind, Entry, FrameworkKind, Op, Scope, Source
from placeflow.profiles.shared_cores import (
    SENTENCE,
    SharedCoresError,
    measure_shared_collective,
    measure_shared_compute,
    paired_stretch_samples,
    shared_collective_note,
    with_shared_entries,
)
from placeflow.simulator import simulate
from placeflow.simulator.estimate import StepEstimate
from placeflow.simulator.schedule import Work, schedule
from placeflow.simulator.simulate import collectives_on, cost_models_for
from placeflow.workload import Role

PLANS = Path(__file__).resolve().parents[1] / "examples" / "plans"


def _entry_s() -> float:
    [entry] = [
        e
        for e in load_profile("cpu").entries_for(Op.FRAMEWORK)
        if e.params["kind"] == FrameworkKind.SHARED_COLLECTIVE.value
    ]
    assert entry.source is Source.MEASURED
    return entry.median_s


def _wait_s(cm: CostModel) -> float:
    """The partner wait by hand: the entry (the whole wall time a 4 KiB all-reduce within a
    pair adds at 2 busy ranks per core) less that all-reduce's own profiled time,
    stretched as the host's slices stretch it at 2 ranks per core."""
    own = cm.collective_s(CollectiveKind.ALL_REDUCE, 4096, 2, Scope.INTRA)
    entry = cm.framework_s(FrameworkKind.SHARED_COLLECTIVE, 1)
    assert entry is not None
    return max(0.0, entry - own * sliced(2.0, cm.slicing()))


def _without_wait(cm: CostModel) -> CostModel:
    """`cm` with the `shared_collective` entry left out of its profile: rates only."""
    kept = {k: v for k, v in cm.series.items() if k != (Op.FRAMEWORK, ("shared_collective",))}
    return dataclasses.replace(cm, series=kept, _memo={})


def test_the_view_adds_the_measured_wait_to_collectives_within_a_host() -> None:
    cm = fitted_cost_model("cpu")
    wait = _wait_s(cm)
    assert wait == cm.partner_wait_s() and 0 < wait < _entry_s()
    assert cm.shared_cores(1.0) is cm  # free cores: nothing changes
    view = cm.shared_cores(2.0)
    assert view.shared_wait_s == pytest.approx(wait / 2)
    for kind in (CollectiveKind.ALL_REDUCE, CollectiveKind.ALL_GATHER):
        for size in (4096, 1 << 20):
            base = cm.collective_s(kind, size, 2, Scope.INTRA)
            assert view.collective_s(kind, size, 2, Scope.INTRA) == pytest.approx(base + wait / 2)
    # No collective, no wait: one rank, or no bytes.
    assert view.collective_s(CollectiveKind.ALL_REDUCE, 4096, 1, Scope.INTRA) == 0.0
    assert view.collective_s(CollectiveKind.ALL_REDUCE, 0, 2, Scope.INTRA) == 0.0
    # 4 ranks on the profiling host's 2 cores: the entry was timed with them sharing the
    # cores, their waits in it; back to a core per rank (x 2/4), no wait added.
    assert load_profile("cpu").provenance.host["cpu_count"] == 2
    # Its slices' cost at 2 ranks per core is in the entry too: the measured stretch there
    # (beyond the 2x share) comes off as a whole.
    stretch = sliced(2.0, cm.slicing())
    assert stretch > 2.0
    for size in (4096, 1 << 20):
        base = cm.collective_s(CollectiveKind.ALL_REDUCE, size, 4, Scope.INTRA)
        got = view.collective_s(CollectiveKind.ALL_REDUCE, size, 4, Scope.INTRA)
        assert got == pytest.approx(base / stretch)
    # The rest of the model is the same; GPU profiles have no such entry.
    assert view.gemm_s(64, 64, 64) == cm.gemm_s(64, 64, 64)
    assert cm.shared_cores(3.0).shared_wait_s == pytest.approx(wait / 3)
    gpu = fitted_cost_model("h100-sxm")
    assert gpu.shared_cores(2.0) is gpu


def test_an_oversubscribed_dp_update_pays_its_collectives_as_timed_by_hand() -> None:
    # The fidelity benchmark's colocated plan: actor and reference d4 (ZeRO-1, no TP) on a
    # pool of 4 workers on 2 cores, as the profile's 4-rank collectives were timed.
    plan = make_plan("colocate", "tiny-llama", 8)
    pool = plan.cluster.pools[0]
    par = plan.parallelism[Role.ACTOR]
    assert pool.cores_per_node == 2 and par.zero == 1 and par.train.t == par.train.p == 1
    cms = cost_models_for(plan, "cpu")
    shared = simulate(plan, cms)
    # The same plan with the entry left out of the profile: rates only.
    cm = cms["*"]
    bare = simulate(plan, {"*": _without_wait(cm)})
    steps = plan.workload.batch.ppo_epochs * plan.workload.batch.mini_batches
    update = {p.name.value: p.duration_s for p in shared.phases}["actor_update"]
    update_bare = {p.name.value: p.duration_s for p in bare.phases}["actor_update"]
    # Per optimizer step an all-reduce and an all-gather over d = 4: their entries
    # hold the waits of 4 ranks on 2 cores already, so the measured wait adds nothing;
    # each is priced at its entry taken back to a core per rank and less the slices' cost,
    # over the measured stretch S at 2 ranks per core, before the call is stretched by S.
    assert update == pytest.approx(update_bare, rel=1e-9)
    stretch = sliced(2.0, cm.slicing())
    detail = next(p.detail for p in shared.phases if p.name.value == "actor_update")
    lay = par.train
    shard = plan.workload.models[Role.ACTOR].num_params(value_head=False) * 4  # fp32 grads
    assert lay.d == 4 and steps == 2
    assert detail["dp_sync_s"] == pytest.approx(
        sum(
            cm.collective_s(kind, shard, 4, Scope.INTRA) / stretch
            for kind in (CollectiveKind.ALL_REDUCE, CollectiveKind.ALL_GATHER)
        ),
        rel=1e-6,
    )
    # Forwards over d only make no collective: the same.
    for phase in ("ref_logprob", "old_logprob", "generate"):
        a = {p.name.value: p.duration_s for p in shared.phases}[phase]
        b = {p.name.value: p.duration_s for p in bare.phases}[phase]
        assert a == pytest.approx(b, rel=1e-9), phase


def test_the_note_is_kept_and_replaced() -> None:
    profile = load_profile("cpu")
    sentence = shared_collective_note(profile)
    assert sentence.startswith(SENTENCE) and "profiles.shared_cores" in sentence
    entry = next(
        e
        for e in profile.entries_for(Op.FRAMEWORK)
        if e.params["kind"] == FrameworkKind.SHARED_COLLECTIVE.value
    )
    # The other shared kinds, by busy ranks on the profiling host's 2 cores: 1 to 4.
    others = [
        e
        for e in profile.entries_for(Op.FRAMEWORK)
        if e.params["kind"]
        in (
            FrameworkKind.SHARED_COMPUTE.value,
            FrameworkKind.SHARED_CALL.value,
            FrameworkKind.EMPTY_CALL.value,
            FrameworkKind.WAKE_CALL.value,
            FrameworkKind.COLD_WEIGHTS.value,
            FrameworkKind.PAIRED_COLLECTIVE.value,
            FrameworkKind.RAY_BACKGROUND.value,
            FrameworkKind.COUPLED_COLLECTIVE.value,
        )
    ]
    for kind in (
        FrameworkKind.SHARED_COMPUTE,
        FrameworkKind.SHARED_CALL,
        FrameworkKind.EMPTY_CALL,
        FrameworkKind.RAY_BACKGROUND,
    ):
        units = sorted(e.params["num_units"] for e in others if e.params["kind"] == kind.value)
        assert units == [1, 2, 3, 4], kind
    again = with_shared_entries(
        profile, [dataclasses.replace(entry, median_s=1e-3), *others], f"{SENTENCE} re-measured."
    )
    assert shared_collective_note(again) == f"{SENTENCE} re-measured."
    notes = again.provenance.notes
    assert notes.count(SENTENCE) == 1 and "Framework entries (op framework" in notes
    framework = again.entries_for(Op.FRAMEWORK)
    assert len(framework) == len(profile.entries_for(Op.FRAMEWORK))
    assert [e.median_s for e in framework if e.params["kind"] == "shared_collective"] == [1e-3]


@pytest.mark.slow
def test_measure_shared_collective_spawns_ranks_that_wait() -> None:
    entry = measure_shared_collective(iterations=20, repeats=3)
    assert entry.op is Op.FRAMEWORK and entry.params["kind"] == "shared_collective"
    assert entry.source is Source.MEASURED and entry.repeats == 3
    assert 0 < entry.p10_s <= entry.median_s <= entry.p90_s < 1.0


def _check_one_core_entries(entries: list[Entry], kind: str, repeats: int) -> None:
    """Measured on one core: entries at 1 and 2 ranks, each of `repeats` samples."""
    assert [e.params for e in entries] == [
        {"kind": kind, "num_units": 1},
        {"kind": kind, "num_units": 2},
    ]
    for e in entries:
        assert e.op is Op.FRAMEWORK and e.source is Source.MEASURED and e.repeats == repeats
        assert e.p10_s <= e.median_s <= e.p90_s < 10.0


@pytest.mark.slow
def test_measure_shared_compute_spawns_one_to_two_ranks_per_core() -> None:
    entries = measure_shared_compute(cores=1, forwards=2, repeats=2)
    _check_one_core_entries(entries, "shared_compute", 2)
    assert all(e.p10_s > 0 for e in entries)


def _with_slicing(cm: CostModel, times_s: dict[int, float] | None) -> CostModel:
    """`cm` with hand-made `shared_compute` entries, the slowest rank's seconds per forward
    by busy ranks on the profiling host's 2 cores (None: left out of its profile), and
    without its `shared_call` and `wake_call` entries (a call's fixed time and its ranks'
    wake-up kept apart: `test_wake`)."""
    assert cm.profile_cores == 2
    cm = with_framework(cm, FrameworkKind.SHARED_CALL, None)
    cm = with_framework(cm, FrameworkKind.WAKE_CALL, None)
    return with_framework(cm, FrameworkKind.SHARED_COMPUTE, times_s)


# 4 ms alone; 4.2 ms with 2 busy ranks on 2 cores, 7 ms with 3, 10 ms with 4.
HAND = {1: 4e-3, 2: 4.2e-3, 3: 7e-3, 4: 10e-3}


def test_the_slicing_curve_is_the_shared_forward_over_the_alone_one() -> None:
    cm = _with_slicing(fitted_cost_model("cpu"), HAND)
    curve = cm.slicing()
    assert [x for x, _ in curve] == [0.5, 1.0, 1.5, 2.0]
    assert [y for _, y in curve] == pytest.approx([1.0, 1.05, 1.75, 2.5])
    assert sliced(0.25, curve) == 1.0  # below one rank alone: alone
    assert sliced(0.75, curve) == pytest.approx(1.025)  # half way from one to two ranks
    assert sliced(1.25, curve) == pytest.approx(1.4)
    assert sliced(2.0, curve) == pytest.approx(2.5)
    assert sliced(3.0, curve) == pytest.approx(2.5 * 3 / 2)  # the slices' cost held beyond
    # Faster with company than alone (noise): never a speed-up.
    assert _with_slicing(cm, {1: 4e-3, 2: 3.9e-3}).slicing() == ((0.5, 1.0), (1.0, 1.0))
    # No entries, or no recorded cores, or a GPU profile: the share of a core alone.
    for bare in (
        _with_slicing(cm, None),
        dataclasses.replace(cm, profile_cores=None, _memo={}),
        fitted_cost_model("h100-sxm"),
    ):
        assert bare.slicing() == ()
    assert sliced(0.5) == 1.0 and sliced(1.5) == 1.5 and sliced(3.0) == 3.0


def test_an_oversubscribed_forward_is_stretched_by_the_slices_too(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The colocated plan: 4 workers on 2 cores, every forward stretched by the share of a
    # core, 2x; with the hand-made curve 2.5x at 2 ranks per core: 1.25 times the call
    # priced with no curve. (The calls' costs; a phase's interval adds the driver's
    # launches, not stretched. The engine's scalar all-reduces are left out: a
    # collective's partner wait is not stretched, and they are counted elsewhere,
    # tests/test_control_syncs.py.)
    from placeflow.simulator import callcosts
    from placeflow.simulator.simulate import _cost_calls

    monkeypatch.setattr(callcosts, "control_syncs_s", lambda *args, **kwargs: 0.0)

    plan = make_plan("colocate", "tiny-llama", 8)
    cm = fitted_cost_model("cpu")
    resident = [0.0] * len(plan.sets)

    def call_s(model: CostModel) -> dict[str, float]:
        calls, _ = _cost_calls(plan, {"*": model}, resident)
        return {c.phase.value: c.cost.time_s for c in calls}

    sliced, bare = call_s(_with_slicing(cm, HAND)), call_s(_with_slicing(cm, None))
    for phase in ("ref_logprob", "old_logprob", "generate"):
        assert sliced[phase] == pytest.approx(1.25 * bare[phase], rel=1e-9), phase


def test_the_simulator_shares_the_head_node_with_the_driver_at_the_plain_share() -> None:
    # The colocated plan on its 2-core host: every piece of the driver's work (a call's
    # launches and gets) counts as a busy worker there and runs at the share of a core;
    # the model calls' ranks follow the host's curve.
    from placeflow.simulator.simulate import CONTROLLER, _cost_calls, _tasks

    plan = make_plan("colocate", "tiny-llama", 8)
    calls, _ = _cost_calls(plan, {"*": fitted_cost_model("cpu")}, [0.0] * len(plan.sets))
    tasks = _tasks(plan, calls, 1)
    driver = [t for t in tasks if t.sets == (CONTROLLER,)]
    ranks = [t for t in tasks if t.sets and t.sets != (CONTROLLER,)]
    assert driver and ranks
    assert all(t.hosts and not t.sliced for t in driver)
    assert all(t.sliced for t in ranks)


def test_a_set_s_collectives_wait_less_the_slices_in_its_stretch() -> None:
    # The colocated plan (4 workers on 2 cores) with the hand-made curve: its calls are
    # stretched 2.5x afterwards, so the view adds the partner wait / 2.5.
    from placeflow.simulator.simulate import _set_cm

    plan = make_plan("colocate", "tiny-llama", 8)
    cm = _with_slicing(fitted_cost_model("cpu"), HAND)
    assert _set_cm(plan, {"*": cm}, 0).shared_wait_s == pytest.approx(_wait_s(cm) / 2.5)
    # The split plan's sets (2 workers each on the 2 cores) have a core per worker: no
    # partner wait, but the curve stretches their calls 1.05x for what they cost one
    # another, so the view leaves their blocked time as measured (divided by 1.05).
    split = make_plan("split", "tiny-llama", 8)
    own = _set_cm(split, {"*": cm}, 0)
    assert own.shared_wait_s == 0.0 and not own.shared
    assert own.shared_stretch == pytest.approx(1.05)


def test_the_partner_wait_is_the_probe_s_whole_time_less_its_own_by_hand() -> None:
    # The hand-made curve stretches 2.5x at 2 ranks per core; the probe's own all-reduce
    # (4 KiB within a pair) is the profile's entry. An entry 1 ms over that time
    # stretched leaves a 1 ms wait; one that the stretched all-reduce alone already
    # exceeds leaves none (the small collectives' entries hold the wait).
    cm = _with_slicing(fitted_cost_model("cpu"), HAND)
    own = cm.collective_s(CollectiveKind.ALL_REDUCE, 4096, 2, Scope.INTRA)
    assert own > 0
    waiting = with_framework(cm, FrameworkKind.SHARED_COLLECTIVE, {1: own * 2.5 + 1e-3})
    assert waiting.partner_wait_s() == pytest.approx(1e-3)
    assert waiting.shared_cores(2.5).shared_wait_s == pytest.approx(1e-3 / 2.5)
    covered = with_framework(cm, FrameworkKind.SHARED_COLLECTIVE, {1: own * 2.0})
    assert covered.partner_wait_s() == 0.0
    assert with_framework(cm, FrameworkKind.SHARED_COLLECTIVE, None).partner_wait_s() == 0.0


def test_the_blocked_share_is_where_the_probe_lands_between_work_and_waiting_by_hand() -> None:
    # The hand-made curve stretches 2.5x at 2 ranks per core. Were the probe's all-reduce
    # (`own` alone) all work, it would take 2.5 own there; were it all waiting, own. An
    # entry of 1.75 own lands halfway: half of `own` blocked; 1.375 own: a quarter
    # stretched, three quarters blocked; own or less: all blocked; 2.5 own or more: none.
    cm = _with_slicing(fitted_cost_model("cpu"), HAND)
    own = cm.collective_s(CollectiveKind.ALL_REDUCE, 4096, 2, Scope.INTRA)

    def share(whole: float | None) -> float:
        kind = FrameworkKind.SHARED_COLLECTIVE
        return with_framework(
            cm, kind, None if whole is None else {1: whole}
        ).blocked_collective_share()

    assert share(own * 1.75) == pytest.approx(0.5)
    assert share(own * 1.375) == pytest.approx(0.75)
    assert share(own * 0.8) == 1.0 and share(own) == pytest.approx(1.0)
    assert share(own * 2.5) == pytest.approx(0.0) and share(own * 3.0) == 0.0
    assert share(None) == 0.0  # no entry: a collective's time is all work, as before


def _halfway(cm: CostModel) -> CostModel:
    """`cm` with a `shared_collective` entry halfway between the probe's all-reduce alone
    and stretched 2.5x (the hand-made curve at 2 ranks per core): half of it blocked."""
    own = cm.collective_s(CollectiveKind.ALL_REDUCE, 4096, 2, Scope.INTRA)
    return with_framework(cm, FrameworkKind.SHARED_COLLECTIVE, {1: own * 1.75})


def test_a_collective_s_blocked_time_is_the_share_of_its_latency_sized_part_by_hand() -> None:
    # Half blocked: a 4 KiB all-reduce (the probe's size) blocks half its entry; a 1 MiB
    # one half of the 4 KiB entry (at most its own), its bytes beyond that are work; an
    # all-gather reads its own kind's 4 KiB entry; a pipeline's send none (its sender does
    # not block); without the entry nothing.
    base = _with_slicing(fitted_cost_model("cpu"), HAND)
    cm = _halfway(base)
    assert cm.blocked_collective_share() == pytest.approx(0.5)
    AR, AG = CollectiveKind.ALL_REDUCE, CollectiveKind.ALL_GATHER
    small = base.collective_s(AR, 4096, 2, Scope.INTRA)
    big = base.collective_s(AR, 1 << 20, 2, Scope.INTRA)
    assert big > small > 0
    assert cm.blocked_collective_s(AR, 4096, 2, small) == pytest.approx(0.5 * small)
    assert cm.blocked_collective_s(AR, 1 << 20, 2, big) == pytest.approx(0.5 * small)
    gather = base.collective_s(AG, 1 << 20, 2, Scope.INTRA)
    gather_small = base.collective_s(AG, 4096, 2, Scope.INTRA)
    expected = 0.5 * min(gather, gather_small)
    assert cm.blocked_collective_s(AG, 1 << 20, 2, gather) == pytest.approx(expected)
    send = base.collective_s(CollectiveKind.SEND_RECV, 1 << 20, 2, Scope.INTRA)
    assert cm.blocked_collective_s(CollectiveKind.SEND_RECV, 1 << 20, 2, send) == 0.0
    assert base.blocked_collective_s(AR, 1 << 20, 2, big) == 0.0


def test_the_shared_view_does_not_stretch_a_collective_s_blocked_time_by_hand() -> None:
    # A view stretched 2.5x afterwards: a 1 MiB all-reduce costs its worked part (its
    # entry less half the 4 KiB entry) and its blocked part divided by 2.5, so that the
    # stretch gives back the blocked time once; no partner wait (the entry lies below the
    # stretched probe). The worked view prices the worked part alone.
    base = _with_slicing(fitted_cost_model("cpu"), HAND)
    cm = _halfway(base)
    AR = CollectiveKind.ALL_REDUCE
    small = base.collective_s(AR, 4096, 2, Scope.INTRA)
    big = base.collective_s(AR, 1 << 20, 2, Scope.INTRA)
    blocked = 0.5 * small
    view = cm.shared_cores(2.5)
    assert view.shared_wait_s == 0.0
    assert view.collective_s(AR, 1 << 20, 2, Scope.INTRA) == pytest.approx(
        big - blocked + blocked / 2.5
    )
    assert cm.collective_s(AR, 1 << 20, 2, Scope.INTRA) == pytest.approx(big)  # no stretch
    worked = cm.without_blocked_collectives()
    assert worked.collective_s(AR, 1 << 20, 2, Scope.INTRA) == pytest.approx(big - blocked)
    assert view.without_blocked_collectives().collective_s(
        AR, 1 << 20, 2, Scope.INTRA
    ) == pytest.approx(big - blocked)
    assert cm.without_blocked_collectives() is worked  # remembered
    # Four ranks, more than the profiling host's 2 cores: their entries were timed at 2
    # ranks per core (2.5x on the hand-made curve), their blocked part not stretched
    # there; a view stretched 4x takes the worked part back to a core per rank and
    # divides the blocked part by its own stretch, and adds no floor.
    assert cm.profile_cores == 2
    four = base.collective_s(AR, 1 << 20, 4, Scope.INTRA)
    blocked4 = 0.5 * min(four, base.collective_s(AR, 4096, 4, Scope.INTRA))
    assert cm.shared_cores(4.0).collective_s(AR, 1 << 20, 4, Scope.INTRA) == pytest.approx(
        (four - blocked4) / 2.5 + blocked4 / 4.0
    )
    assert cm.collective_s(AR, 1 << 20, 4, Scope.INTRA) == pytest.approx(four)


def test_without_blocked_collectives_changes_nothing_without_a_share() -> None:
    cm = fitted_cost_model("cpu")  # its entry lies above the stretched probe: share 0
    assert cm.blocked_collective_share() == 0.0
    worked = cm.without_blocked_collectives()
    for kind in (CollectiveKind.ALL_REDUCE, CollectiveKind.ALL_GATHER, CollectiveKind.SEND_RECV):
        assert worked.collective_s(kind, 1 << 20, 2, Scope.INTRA) == pytest.approx(
            cm.collective_s(kind, 1 << 20, 2, Scope.INTRA)
        )
    gpu = fitted_cost_model("h100-sxm")  # its collectives are not a CPU host's
    assert gpu.without_blocked_collectives() is gpu
    assert gpu.blocked_collective_share() == 0.0


# A host's measured curve with a slices' overhead of 0.1 at two busy workers per core.
TENTH = ((0.5, 1.0), (1.0, 1.0), (2.0, 2.2))


def test_a_crowded_host_slows_calls_by_the_slices_overhead_by_hand() -> None:
    # Two 2-worker calls on a 2-core host, each on cores of its own when alone (10 s and
    # 4 s). Together 4 workers on 2 cores: stretch 2, with the overhead 0.1 2.2, so each
    # runs at 1/2.2: the short one ends at 8.8 s, the long one has done 4 s by then and
    # runs its other 6 s alone: ends at 14.8 s.
    host = ("cpu", 0)
    long = Work(id="long", sets=(0,), duration_s=10.0, hosts=((host, 2.0),))
    short = Work(id="short", sets=(1,), duration_s=4.0, hosts=((host, 2.0),))
    spans = schedule([long, short], {host: 2}, {}, {host: TENTH})
    assert spans["short"].end_s == pytest.approx(8.8)
    assert spans["long"].end_s == pytest.approx(14.8)


def test_the_driver_s_work_runs_at_the_plain_share_of_a_core_by_hand() -> None:
    # A 4-worker call (10 s alone at 2 per core, its own stretch 2.2 counted) and the
    # driver's 2 s of launches (one worker, `sliced` False) start together on a 2-core
    # host with the TENTH curve. 5 busy workers, 2.5 per core: the call runs at
    # S(2) / S(2.5) = 2.2 / 2.75 = 0.8; the driver at the share of a core alone, 1 / 2.5
    # = 0.4 (the ranks' curve would give 1 / 2.75): it ends at 5 s, the call has done
    # 4 s by then and runs its other 6 s at its own pace: ends at 11 s. As ranks'
    # work, the driver's would end at 5.5 s and the call at 11.1 s.
    host = ("cpu", 0)
    call = Work(id="call", sets=(0,), duration_s=10.0, hosts=((host, 4.0),))
    launch = Work(id="launch", sets=(-1,), duration_s=2.0, hosts=((host, 1.0),), sliced=False)
    spans = schedule([call, launch], {host: 2}, {}, {host: TENTH})
    assert spans["launch"].end_s == pytest.approx(5.0)
    assert spans["call"].end_s == pytest.approx(11.0)
    as_rank = dataclasses.replace(launch, sliced=True)
    spans = schedule([call, as_rank], {host: 2}, {}, {host: TENTH})
    assert spans["launch"].end_s == pytest.approx(5.5)
    assert spans["call"].end_s == pytest.approx(5.5 + (10.0 - 5.5 * 0.8))  # then alone


def test_a_host_crowded_by_another_set_adds_each_collectives_wait_by_hand() -> None:
    # Two 2-worker calls start together on a 2-core host, 10 ms each alone. A makes 4
    # collectives on a rank's path; the host's measured wait is 1 ms at two busy workers
    # per core. Together: 4 workers on 2 cores, crowding 2 against A's own 1 (a = 1).
    # B runs at 1/2 and ends at 20 ms; A at 10 / (10 / (1/2) + 4 * 1 * 1) = 10/24 until
    # then (8.333 ms done), then alone at rate 1: it ends at 20 + 10/6 ms.
    host = ("cpu", 0)
    a = Work(id="a", sets=(0,), duration_s=0.010, hosts=((host, 2.0),), collectives=4)
    b = Work(id="b", sets=(1,), duration_s=0.010, hosts=((host, 2.0),))
    spans = schedule([a, b], {host: 2}, {host: 0.001})
    assert spans["b"].end_s == pytest.approx(0.020)
    assert spans["a"].end_s == pytest.approx(0.020 + 0.010 / 6)
    # No wait measured, or no one else on the host: rates only.
    assert schedule([a, b], {host: 2})["a"].end_s == pytest.approx(0.020)
    assert schedule([a], {host: 2}, {host: 0.001})["a"].end_s == pytest.approx(0.010)
    # A call crowding its host itself (4 workers) holds its own waits already (the shared
    # view); a 1-worker call beside it crowds the host by half a worker per core more:
    # 4 * 1 ms * 0.5 on top of the rate 2 / 2.5.
    c = Work(id="c", sets=(0,), duration_s=0.010, hosts=((host, 4.0),), collectives=4)
    d = Work(id="d", sets=(1,), duration_s=1.0, hosts=((host, 1.0),))
    got = schedule([c, d], {host: 2}, {host: 0.001})["c"].end_s
    assert got == pytest.approx(0.010 / (2 / 2.5) + 4 * 0.001 * 0.5)


def test_the_probe_counts_a_tensor_parallel_forwards_collectives() -> None:
    # PPO split: the critic (t = 2, no DP) on its own 2 workers. Its value forward makes
    # two all-reduces a layer per micro-batch and one outside the layers (its
    # vocabulary-parallel embedding's): 32 samples / micro-batch 8 = 4 micro-batches of
    # 2 layers, 4 x (2 x 2 + 1) = 20 collectives. The reference (d = 2) forward makes none:
    # a frozen model's ranks run their own shard's micro-batches and agree on no count
    # (`callcosts.control_syncs_s` is the trained roles' only).
    plan = load_plan(PLANS / "ppo-tiny-cpu4-split.toml")
    critic = plan.parallelism[Role.CRITIC]
    model = plan.workload.models[Role.CRITIC]
    assert critic.train.t == 2 and critic.train.d == 1 and critic.micro_batch == 8
    layers = model.num_layers
    micro = plan.workload.batch.num_samples // critic.micro_batch
    cms = cost_models_for(plan, "cpu")
    counted = collectives_on(plan, cms, Role.CRITIC, plan.set_of(Role.CRITIC), None, 0)
    assert counted[Phase.VALUES] == pytest.approx(micro * (2 * layers + 1))
    assert collectives_on(plan, cms, Role.REF, plan.set_of(Role.REF), None, 0) == {
        Phase.REF_LOGPROB: 0.0
    }
    # Simulated, the values call runs beside the actor's and reference's forwards on the
    # other two workers: longer with the measured wait than without it.
    cm = cms["*"]
    bare = simulate(plan, {"*": _without_wait(cm)})
    shared = simulate(plan, cms)

    def values(est: StepEstimate) -> float:
        return next(p.duration_s for p in est.phases if p.name is Phase.VALUES)

    assert values(shared) > values(bare) * 1.05


def test_a_call_stretched_on_its_own_is_slowed_by_the_crowd_s_slices_only_beyond() -> None:
    # On a 2-core host with o = 0.1: A keeps 4 workers busy (its duration, 6.6 s, holds
    # its own stretch 2 x 1.1 = 2.2), B 2 workers (1.1 s, no stretch). Together 6 on 2
    # cores: 3 x 1.1 = 3.3, so A runs at 2.2 / 3.3 = 2/3 and B at 1 / 3.3. B ends at
    # 1.1 x 3.3 = 3.63 s; A has done 2.42 s by then and its other 4.18 s alone: 7.81 s.
    host = ("cpu", 0)
    a = Work(id="a", sets=(0,), duration_s=6.6, hosts=((host, 4.0),))
    b = Work(id="b", sets=(1,), duration_s=1.1, hosts=((host, 2.0),))
    spans = schedule([a, b], {host: 2}, {}, {host: TENTH})
    assert spans["b"].end_s == pytest.approx(3.63)
    assert spans["a"].end_s == pytest.approx(7.81)


def _with_calls(cm: CostModel, times_s: dict[int, float]) -> CostModel:
    """`cm` with hand-made `shared_call` entries: a call's fixed seconds by its ranks on
    the profiling host's 2 cores."""
    return with_framework(cm, FrameworkKind.SHARED_CALL, times_s)


def test_a_call_pays_the_fixed_time_its_composition_leaves_out_or_is_credited_by_hand() -> None:
    from placeflow.profiles.schema import DispatchKind
    from placeflow.simulator.rolecosts import crowded_call_s
    from placeflow.simulator.simulate import _cost_calls

    cm = _with_slicing(fitted_cost_model("cpu"), HAND)
    # What the simulator composes for a call with nothing to do to W ranks, by hand: the
    # round trip less the driver's launch (never below a tenth of it), stretched by the
    # hand-made curve at W / 2 ranks per core, and W launches and W - 1 gets.
    trip = cm.dispatch_s(DispatchKind.RAY_CALL, 0, 0)
    launch = cm.driver_s(DispatchKind.RAY_LAUNCH, 0, 0)
    get = cm.driver_s(DispatchKind.RAY_GET, 0, 0)
    assert launch is not None and get is not None
    stretch = {1: 1.0, 2: 1.05, 4: 2.5}

    def priced(w: int) -> float:
        return max(trip / 10, trip - launch) * stretch[w] + w * launch + (w - 1) * get

    # Measured: 1 ms more than that with one rank, 0.5 ms less with two, 3 ms more with 4.
    calls = _with_calls(cm, {1: priced(1) + 1e-3, 2: priced(2) - 0.5e-3, 4: priced(4) + 3e-3})
    points = calls.shared_calls()
    assert [x for x, _ in points] == [0.5, 1.0, 2.0]
    assert [y for _, y in points] == pytest.approx(
        [priced(1) + 1e-3, priced(2) - 0.5e-3, priced(4) + 3e-3]
    )
    # Signed: where the composition prices the empty call above its measured time (two
    # ranks) the call is credited the difference, so that it costs what was measured.
    for per_core, excess in ((0.25, 1e-3), (0.5, 1e-3), (0.75, 0.25e-3), (1.0, -0.5e-3),
                             (1.5, 1.25e-3), (2.0, 3e-3), (3.0, 3e-3)):  # fmt: skip
        assert crowded_call_s(calls, per_core) == pytest.approx(excess, abs=1e-12), per_core
    # No entries (the model without them, a GPU profile): nothing added.
    assert crowded_call_s(cm, 2.0) == 0.0
    assert crowded_call_s(fitted_cost_model("h100-sxm"), 2.0) == 0.0
    # The colocated plan's calls (4 workers on 2 cores: 2 per core) each pay 3 ms more.
    plan = make_plan("colocate", "tiny-llama", 8)
    resident = [0.0] * len(plan.sets)

    def call_s(model: CostModel) -> dict[str, float]:
        costed, _ = _cost_calls(plan, {"*": model}, resident)
        return {c.phase.value: c.cost.time_s for c in costed}

    with_calls, without = call_s(calls), call_s(cm)
    for phase in ("generate", "ref_logprob", "old_logprob", "actor_update"):
        assert with_calls[phase] - without[phase] == pytest.approx(3e-3, rel=1e-9), phase
    # The reshard, a transition, is measured against the profile's empty calls instead.
    assert cm.empty_calls()
    assert with_calls["reshard"] == pytest.approx(without["reshard"], rel=1e-12)
    # Without them it pays the probe's fixed time, as before they were measured.
    no_empty = with_framework(calls, FrameworkKind.EMPTY_CALL, None)
    assert call_s(no_empty)["reshard"] - call_s(with_framework(cm, FrameworkKind.EMPTY_CALL, None))[
        "reshard"
    ] == pytest.approx(3e-3, rel=1e-9)


def test_a_transition_costs_the_measured_empty_call_plus_its_work_by_hand() -> None:
    """`empty_call` entries (a call that does nothing, from its last launch): 2, 2.5 and
    4 ms at 1, 2 and 4 ranks on the profiling host's 2 cores. A transition's composition
    of such a call is the round trip less the launch, stretched by the hand-made curve
    (1, 1.05, 2.5 at 1, 2, 4 ranks), and the driver's W − 1 gets; its excess the
    difference. A model call keeps the probe's (`shared_call`) fixed time."""
    from placeflow.profiles.schema import DispatchKind
    from placeflow.simulator.rolecosts import crowded_call_s

    cm = _with_slicing(fitted_cost_model("cpu"), HAND)
    trip = cm.dispatch_s(DispatchKind.RAY_CALL, 0, 0)
    launch = cm.driver_s(DispatchKind.RAY_LAUNCH, 0, 0)
    get = cm.driver_s(DispatchKind.RAY_GET, 0, 0)
    assert launch is not None and get is not None
    bare = max(trip / 10, trip - launch)
    measured = {1: 2e-3, 2: 2.5e-3, 4: 4e-3}
    empty = with_framework(cm, FrameworkKind.EMPTY_CALL, measured)
    points = empty.empty_calls()
    assert [x for x, _ in points] == [0.5, 1.0, 2.0]
    assert [y for _, y in points] == pytest.approx([2e-3, 2.5e-3, 4e-3])
    excess = {
        0.5: 2e-3 - bare,
        1.0: 2.5e-3 - (bare * 1.05 + get),
        2.0: 4e-3 - (bare * 2.5 + 3 * get),
    }
    for per_core, want in excess.items():
        assert crowded_call_s(empty, per_core, wakes=False) == pytest.approx(want, abs=1e-12)
    # Half way from 1 to 2 ranks per core, and held beyond the last point.
    assert crowded_call_s(empty, 1.5, wakes=False) == pytest.approx(
        (excess[1.0] + excess[2.0]) / 2, abs=1e-12
    )
    assert crowded_call_s(empty, 3.0, wakes=False) == pytest.approx(excess[2.0], abs=1e-12)
    # So a transition with nothing to do at 2 ranks per core, stretched as the simulator
    # stretches it, costs the measured 4 ms after its launches with the driver's gets.
    assert bare * 2.5 + crowded_call_s(empty, 2.0, wakes=False) + 3 * get == pytest.approx(4e-3)
    # A model call (wakes) ignores them: the probe's entries, here none, add nothing.
    assert crowded_call_s(empty, 2.0) == 0.0


@pytest.mark.slow
def test_measure_empty_call_times_calls_to_one_and_two_ranks(ray_session: None) -> None:
    from placeflow.profiles.shared_cores import measure_empty_call

    entries = measure_empty_call(cores=1, samples=5, warmup=1, pause_s=0.001)
    assert [e.params["kind"] for e in entries] == [FrameworkKind.EMPTY_CALL.value] * 2
    assert [e.params["num_units"] for e in entries] == [1, 2]
    assert all(e.repeats == 5 and 0 < e.p10_s <= e.median_s <= e.p90_s for e in entries)


@pytest.mark.slow
def test_measure_shared_call_times_calls_to_one_and_two_ranks(ray_session: None) -> None:
    from placeflow.profiles.shared_cores import measure_shared_call

    entries = measure_shared_call(cores=1, pairs=3, warmup=1)
    # A pair giving a fixed time below 0 (noise) is left out: at most one of the three.
    assert [e.params["num_units"] for e in entries] == [1, 2]
    assert all(e.repeats >= 2 and 0 < e.p10_s <= e.median_s for e in entries)


def test_paired_stretch_samples_score_each_round_against_its_own_rank_alone() -> None:
    """Hand oracle: the host twice as slow in the second round; each W's samples are its
    round's ratio times the median one-rank time (3 ms), so the stretch is the ratio."""
    rounds = [{1: 2e-3, 2: 2.4e-3, 4: 5e-3}, {1: 4e-3, 2: 4.8e-3, 4: 10e-3}]
    samples = paired_stretch_samples(rounds)
    assert samples[1] == [2e-3, 4e-3]
    assert samples[2] == pytest.approx([3.6e-3, 3.6e-3])
    assert samples[4] == pytest.approx([7.5e-3, 7.5e-3])
    with pytest.raises(SharedCoresError, match="one-rank-alone"):
        paired_stretch_samples([{2: 1e-3}])


# A decode that pays the slices more than the forward (HAND) does, and a training step
# that pays them less: 4 ms alone each; at 2 busy ranks per core 3x and 2x.
DECODE_HAND = {1: 4e-3, 2: 4.4e-3, 3: 8e-3, 4: 12e-3}
TRAIN_HAND = {1: 4e-3, 2: 4e-3, 3: 6e-3, 4: 8e-3}


def _with_kinds(cm: CostModel) -> CostModel:
    """`_with_slicing(cm, HAND)` with the hand-made decode and training-step curves too."""
    cm = _with_slicing(cm, HAND)
    cm = with_framework(cm, FrameworkKind.SHARED_DECODE, DECODE_HAND)
    return with_framework(cm, FrameworkKind.SHARED_TRAIN, TRAIN_HAND)


def test_each_kind_of_work_follows_its_own_measured_curve() -> None:
    cm = _with_kinds(fitted_cost_model("cpu"))
    assert [y for _, y in cm.slicing(FrameworkKind.SHARED_DECODE)] == pytest.approx(
        [1.0, 1.1, 2.0, 3.0]
    )
    assert [y for _, y in cm.slicing(FrameworkKind.SHARED_TRAIN)] == pytest.approx(
        [1.0, 1.0, 1.5, 2.0]
    )
    assert cm.slicing() == cm.slicing(FrameworkKind.SHARED_COMPUTE)
    assert [y for _, y in cm.slicing()] == pytest.approx([1.0, 1.05, 1.75, 2.5])
    # A profile without a kind's entries (before 2026-12-03): the forward's curve.
    older = with_framework(cm, FrameworkKind.SHARED_DECODE, None)
    assert older.slicing(FrameworkKind.SHARED_DECODE) == cm.slicing()
    assert _with_slicing(cm, None).slicing(FrameworkKind.SHARED_TRAIN) != ()


def test_a_generation_and_an_update_are_stretched_by_their_own_curves(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The colocated plan, 4 workers on 2 cores (2 busy ranks per core), against the same
    # profile without the decode's and the training step's entries (every call by the
    # forward's curve, 2.5x there): the generation is stretched 3 / 2.5 = 1.2 times as
    # long, the update 2 / 2.5 = 0.8 times, the forwards and the reshard (a transition)
    # as before; each call's fixed crowd time (`crowded_call_s`) is not stretched. (The
    # collectives are left out: their partner waits are not stretched, and the engine's
    # scalar all-reduces are counted elsewhere, tests/test_control_syncs.py.)
    from placeflow.dataflow import CallKind
    from placeflow.simulator import callcosts
    from placeflow.simulator.simulate import _cost_calls, stretch_probe

    monkeypatch.setattr(callcosts, "control_syncs_s", lambda *args, **kwargs: 0.0)
    monkeypatch.setattr(CostModel, "collective_s", lambda self, *args, **kwargs: 0.0)
    assert stretch_probe(CallKind.GENERATE) is FrameworkKind.SHARED_DECODE
    assert stretch_probe(CallKind.TRAIN) is FrameworkKind.SHARED_TRAIN
    assert stretch_probe(CallKind.FORWARD) is FrameworkKind.SHARED_COMPUTE
    assert stretch_probe(None) is FrameworkKind.SHARED_COMPUTE

    plan = make_plan("colocate", "tiny-llama", 8)
    cm = fitted_cost_model("cpu")
    resident = [0.0] * len(plan.sets)

    def call_s(model: CostModel) -> dict[str, float]:
        calls, _ = _cost_calls(plan, {"*": model}, resident)
        return {
            c.phase.value: c.cost.time_s - c.cost.detail.get("crowded_call_s", 0.0) for c in calls
        }

    own, forward = call_s(_with_kinds(cm)), call_s(_with_slicing(cm, HAND))
    assert set(own) >= {"generate", "actor_update", "ref_logprob", "old_logprob", "reshard"}
    for phase in own:
        factor = {"generate": 3 / 2.5, "actor_update": 2 / 2.5}.get(phase, 1.0)
        assert own[phase] == pytest.approx(factor * forward[phase], rel=1e-9), phase


def test_a_call_with_its_own_curve_runs_by_it_beside_another() -> None:
    # Two 2-worker calls of 1 s alone on one 2-core host: B by the host's curve (2x at 2
    # ranks per core) runs at 1/2 while both run and ends at 2 s, having let A, by its
    # own curve (3x there), do 2/3 of its work; A alone then at rate 1: ends at 7/3 s.
    host = ("cpu", 0)
    curve = ((1.0, 1.0), (2.0, 2.0))
    own = ((1.0, 1.0), (2.0, 3.0))
    a = Work(id="a", sets=(0,), duration_s=1.0, hosts=((host, 2.0),), curves=((host, own),))
    b = Work(id="b", sets=(1,), duration_s=1.0, hosts=((host, 2.0),))
    spans = schedule([a, b], cores={host: 2}, slicing={host: curve})
    assert spans["b"].end_s == pytest.approx(2.0)
    assert spans["a"].end_s == pytest.approx(7 / 3)
    # Without its own curve both run by the host's: 2 s each.
    spans = schedule([dataclasses.replace(a, curves=()), b], cores={host: 2}, slicing={host: curve})
    assert spans["a"].end_s == pytest.approx(2.0) == spans["b"].end_s


def test_the_simulator_hands_a_generation_its_own_curve_in_the_schedule() -> None:
    from placeflow.simulator.simulate import _cost_calls, _tasks

    plan = make_plan("colocate", "tiny-llama", 8)
    cm = _with_kinds(fitted_cost_model("cpu"))
    calls, _ = _cost_calls(plan, {"*": cm}, [0.0] * len(plan.sets))
    tasks = {t.id: t for t in _tasks(plan, calls, 1)}
    [host] = {h for t in tasks.values() for h, _ in t.hosts}
    assert tasks[0, Phase.GENERATE].curves == ((host, cm.slicing(FrameworkKind.SHARED_DECODE)),)
    assert tasks[0, Phase.ACTOR_UPDATE].curves == ((host, cm.slicing(FrameworkKind.SHARED_TRAIN)),)
    assert tasks[0, Phase.REF_LOGPROB].curves == () == tasks[0, Phase.RESHARD].curves


@pytest.mark.slow
@pytest.mark.parametrize("kind", [FrameworkKind.SHARED_DECODE, FrameworkKind.SHARED_TRAIN])
def test_measure_shared_compute_times_a_decode_and_a_training_step(kind: FrameworkKind) -> None:
    entries = measure_shared_compute(cores=1, forwards=1, repeats=2, kind=kind)
    _check_one_core_entries(entries, kind.value, 2)
    assert all(e.p10_s > 0 for e in entries)
    with pytest.raises(ValueError, match="not a stretch probe"):
        measure_shared_compute(cores=1, kind=FrameworkKind.SHARED_CALL)
