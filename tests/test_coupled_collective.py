"""Collectives through two groupings of a set's ranks in turn: measured, priced, charged.

Oracles: the probe's groupings of 2 and 4 ranks, by hand; the cost model's coupled
wait from hand-made entries (the pairs' wait plus the coupled entry beyond the pairs'
entry, none beyond it, the pairs' alone without the entry), and the view's wait over
its stretch; the calls of the example PPO plan whose actor (TP 2, ZeRO-3 over d = 2)
shares 2 cores with 4 workers: each of the actor's forwards and updates costs its
collectives on a rank's path (the probe's count) times what the coupled entry
measured beyond the pairs', its generation and the other roles' calls nothing more.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from handmade import with_framework

from placeflow.phases import Phase
from placeflow.plan import Plan, load_plan
from placeflow.profiles.costmodel import CostModel, sliced
from placeflow.profiles.registry import fitted_cost_model, load_profile
from placeflow.profiles.schema import CollectiveKind, FrameworkKind, Op, Scope, Source
from placeflow.profiles.shared_cores import SHARED_KINDS, measure_coupled_collective, pairings
from placeflow.simulator import callcosts, simulate
from placeflow.simulator.simulate import _cost_calls, _resident_bytes, collectives_on
from placeflow.workload import Role

PLANS = Path(__file__).resolve().parents[1] / "examples" / "plans"
HAND_SLICING = {1: 4e-3, 2: 4.2e-3, 3: 7e-3, 4: 10e-3}  # 2.5x at 2 ranks per core


def test_the_probe_pairs_ranks_once_or_in_two_groupings_by_hand() -> None:
    assert pairings(4, coupled=False) == [[[0, 1], [2, 3]]]
    # Ranks 0-1 and 2-3, then each with the other pair's: 0-2 and 1-3.
    assert pairings(4, coupled=True) == [[[0, 1], [2, 3]], [[0, 2], [1, 3]]]
    assert pairings(8, coupled=True)[1] == [[0, 4], [1, 5], [2, 6], [3, 7]]
    # Two ranks make one pair only.
    assert pairings(2, coupled=True) == [[[0, 1]]]
    assert FrameworkKind.COUPLED_COLLECTIVE in SHARED_KINDS


def _hand(shared_s: float | None, coupled_s: float | None) -> CostModel:
    cm = with_framework(fitted_cost_model("cpu"), FrameworkKind.SHARED_COMPUTE, HAND_SLICING)
    pairs = None if shared_s is None else {1: shared_s}
    coupled = None if coupled_s is None else {1: coupled_s}
    cm = with_framework(cm, FrameworkKind.SHARED_COLLECTIVE, pairs)
    return with_framework(cm, FrameworkKind.COUPLED_COLLECTIVE, coupled)


def test_the_coupled_wait_is_the_pairs_wait_and_what_the_coupled_probe_adds_by_hand() -> None:
    own = fitted_cost_model("cpu").collective_s(CollectiveKind.ALL_REDUCE, 4096, 2, Scope.INTRA)
    assert own > 0
    # The pairs' entry 1 ms over the probe's own all-reduce stretched 2.5x: a 1 ms wait;
    # the coupled entry 0.8 ms over the pairs' entry: 1.8 ms.
    pairs = own * 2.5 + 1e-3
    cm = _hand(pairs, pairs + 0.8e-3)
    assert sliced(2.0, cm.slicing()) == pytest.approx(2.5)
    assert cm.partner_wait_s() == pytest.approx(1e-3)
    assert cm.coupled_wait_s() == pytest.approx(1.8e-3)
    # A pairs' entry below the stretched all-reduce leaves no pairs' wait; what coupling
    # adds is measured apart from it and still counts.
    low = _hand(own * 2.0, own * 2.0 + 0.5e-3)
    assert low.partner_wait_s() == 0.0
    assert low.coupled_wait_s() == pytest.approx(0.5e-3)
    # A coupled entry below the pairs' adds nothing; without it, the pairs' wait.
    assert _hand(pairs, pairs - 0.3e-3).coupled_wait_s() == pytest.approx(1e-3)
    assert _hand(pairs, None).coupled_wait_s() == pytest.approx(1e-3)
    assert _hand(None, pairs).coupled_wait_s() == 0.0


def test_the_coupled_view_waits_the_coupled_wait_over_its_stretch_by_hand() -> None:
    own = fitted_cost_model("cpu").collective_s(CollectiveKind.ALL_REDUCE, 4096, 2, Scope.INTRA)
    cm = _hand(own * 2.5 + 1e-3, own * 2.5 + 1.8e-3)
    view = cm.shared_cores(2.5)
    coupled = view.coupled()
    assert view.shared_wait_s == pytest.approx(1e-3 / 2.5)
    assert coupled.shared_wait_s == pytest.approx(1.8e-3 / 2.5)
    assert coupled.shared_stretch == view.shared_stretch and coupled.shared
    for size in (4096, 1 << 20):
        base = view.collective_s(CollectiveKind.ALL_GATHER, size, 2, Scope.INTRA)
        got = coupled.collective_s(CollectiveKind.ALL_GATHER, size, 2, Scope.INTRA)
        assert got - base == pytest.approx(0.8e-3 / 2.5)
    # Not a shared view (the model itself, ranks on cores of their own, a GPU profile):
    # no partner's slice to wait for.
    assert cm.coupled() is cm
    assert cm.own_cores(1.3).coupled().shared_wait_s == 0.0
    gpu = fitted_cost_model("h100-sxm")
    assert gpu.shared_cores(2.0).coupled() is gpu


def _ppo_colocate() -> Plan:
    return load_plan(PLANS / "ppo-tiny-cpu4-colocate.toml")


def test_only_zero3_over_data_parallel_pairs_with_tensor_parallelism_interleaves() -> None:
    plan = _ppo_colocate()
    actor, ref, critic = (plan.parallelism[r] for r in (Role.ACTOR, Role.REF, Role.CRITIC))
    assert actor.train.t == 2 and actor.train.d == 2 and actor.zero == 3
    assert callcosts.interleaves_groups(actor)
    assert ref.train.t == 2 and ref.zero != 3 and not callcosts.interleaves_groups(ref)
    assert critic.train.t == 1 and not callcosts.interleaves_groups(critic)


def _call_times(plan: Plan, cm: CostModel) -> dict[Phase, float]:
    resident = [_resident_bytes(plan, i) for i in range(len(plan.sets))]
    calls, problems = _cost_calls(plan, {"*": cm}, resident)
    assert not problems
    return {c.phase: c.cost.time_s for c in calls}


def test_the_interleaved_actor_s_calls_pay_the_coupled_probe_s_extra_per_collective() -> None:
    plan = _ppo_colocate()
    cm = fitted_cost_model("cpu")
    extra = 0.7e-3
    pairs = cm.framework_s(FrameworkKind.SHARED_COLLECTIVE, 1)
    assert pairs is not None
    coupled = with_framework(cm, FrameworkKind.COUPLED_COLLECTIVE, {1: pairs + extra})
    plain = with_framework(cm, FrameworkKind.COUPLED_COLLECTIVE, None)
    with_entry, without = _call_times(plan, coupled), _call_times(plan, plain)
    actor_set = plan.set_of(Role.ACTOR)
    counted = collectives_on(plan, {"*": cm}, Role.ACTOR, actor_set, None, 0)
    # The view divides each wait by the set's stretch and the call is stretched by it
    # after: each collective on a rank's path costs `extra` more, no more and no less.
    for phase in (Phase.OLD_LOGPROB, Phase.ACTOR_UPDATE):
        assert counted[phase] >= 10, phase
        assert with_entry[phase] - without[phase] == pytest.approx(
            counted[phase] * extra, rel=1e-6
        ), phase
    # The generation (tg = 1, its own groups), the transition and the other roles' calls
    # are priced as before.
    for phase, t in without.items():
        if phase not in (Phase.OLD_LOGPROB, Phase.ACTOR_UPDATE):
            assert with_entry[phase] == pytest.approx(t, rel=1e-12), phase
    # Simulated, the step takes longer by at least the update's extra.
    slow, fast = simulate(plan, coupled), simulate(plan, plain)
    assert slow.iteration_s > fast.iteration_s + counted[Phase.ACTOR_UPDATE] * extra * 0.9


def test_a_plan_without_interleaved_groups_is_priced_as_before() -> None:
    plan = load_plan(PLANS / "ppo-tiny-cpu4-split.toml")
    assert not any(callcosts.interleaves_groups(p) for p in plan.parallelism.values())
    cm = fitted_cost_model("cpu")
    pairs = cm.framework_s(FrameworkKind.SHARED_COLLECTIVE, 1)
    assert pairs is not None
    a = simulate(plan, with_framework(cm, FrameworkKind.COUPLED_COLLECTIVE, {1: pairs + 1e-3}))
    b = simulate(plan, with_framework(cm, FrameworkKind.COUPLED_COLLECTIVE, None))
    assert a.iteration_s == b.iteration_s


def test_the_shipped_cpu_profile_holds_both_probes_measured_together() -> None:
    profile = load_profile("cpu")
    got = {
        e.params["kind"]: e
        for e in profile.entries_for(Op.FRAMEWORK)
        if e.params["kind"] in ("shared_collective", "coupled_collective")
    }
    assert set(got) == {"shared_collective", "coupled_collective"}
    assert all(e.source is Source.MEASURED for e in got.values())
    assert "kind coupled_collective, shared_collective): measured" in profile.provenance.notes


@pytest.mark.slow
def test_measure_coupled_collective_spawns_ranks_that_wait() -> None:
    entry = measure_coupled_collective(iterations=20, repeats=3)
    assert entry.op is Op.FRAMEWORK and entry.params == {
        "kind": "coupled_collective",
        "num_units": 1,
    }
    assert entry.source is Source.MEASURED and entry.repeats == 3
    assert 0 < entry.p10_s <= entry.median_s <= entry.p90_s < 1.0
