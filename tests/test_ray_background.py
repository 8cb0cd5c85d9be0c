"""The host's background load (Ray's daemons and threads, the kernel's): the probe's
arithmetic, the cost model's reading of its entries, and the schedule's pricing of it,
each against a hand-computed case."""

from __future__ import annotations

import dataclasses

import pytest
from fidelity_cpu import make_plan
from handmade import with_framework

from placeflow.phases import Phase
from placeflow.profiles.costmodel import CostModel
from placeflow.profiles.registry import fitted_cost_model
from placeflow.profiles.schema import FrameworkKind
from placeflow.profiles.shared_cores import BACKGROUND_FLOOR, background_cores
from placeflow.simulator import simulate
from placeflow.simulator.schedule import Work, schedule

# A host's measured curve with a slices' overhead of 0.1 at two busy workers per core.
TENTH = ((0.5, 1.0), (1.0, 1.0), (2.0, 2.2))
HOST = ("cpu", 0)


def _with_background(cm: CostModel, cores: dict[int, float] | None) -> CostModel:
    return with_framework(cm, FrameworkKind.RAY_BACKGROUND, cores)


def test_the_probe_s_background_is_the_host_s_busy_time_less_the_ranks_and_driver_by_hand() -> None:
    # 1.3 busy CPU seconds over a 0.5 s call, of which the ranks' main threads ran 1.1 s
    # and the driver's 0.15 s: 0.05 s of other work, 0.1 cores.
    assert background_cores(1.3, 1.1, 0.15, 0.5) == pytest.approx(0.1)
    # Ticks can make the difference negative over a short call: floored, never below.
    assert background_cores(1.0, 1.05, 0.0, 0.5) == BACKGROUND_FLOOR
    with pytest.raises(ValueError, match="positive wall time"):
        background_cores(1.0, 0.5, 0.0, 0.0)


def test_the_cost_model_takes_the_median_of_the_background_entries() -> None:
    cm = fitted_cost_model("cpu")
    assert _with_background(cm, {1: 0.08, 2: 0.10, 3: 0.09, 4: 0.30}).ray_background() == (
        pytest.approx(0.095)
    )
    # No entries (older CPU profiles, GPU profiles): no background.
    assert _with_background(cm, None).ray_background() == 0.0
    assert fitted_cost_model("h100-sxm").ray_background() == 0.0


def test_a_model_call_alone_counts_the_host_s_background_among_its_workers_by_hand() -> None:
    # A 2-worker model call of 10 s alone on a 2-core host whose background keeps 0.2 of a
    # core busy: 2.2 workers, 1.1 per core, S(1.1) = 1 + 1.2 * 0.1 = 1.12 over its own
    # S(1) = 1: it ends at 11.2 s. A transition of the same length (timed with Ray up,
    # `background` False) ends at 10 s; without a background both end at 10 s.
    call = Work(id="call", sets=(0,), duration_s=10.0, hosts=((HOST, 2.0),), background=True)
    sync = dataclasses.replace(call, id="sync", background=False)
    assert schedule([call], {HOST: 2}, {}, {HOST: TENTH}, {HOST: 0.2})["call"].end_s == (
        pytest.approx(11.2)
    )
    assert schedule([sync], {HOST: 2}, {}, {HOST: TENTH}, {HOST: 0.2})["sync"].end_s == (
        pytest.approx(10.0)
    )
    assert schedule([call], {HOST: 2}, {}, {HOST: TENTH})["call"].end_s == pytest.approx(10.0)


def test_two_calls_and_the_driver_share_a_host_with_its_background_by_hand() -> None:
    # A 2-worker model call (10 s alone), a 2-worker transition (4 s alone) and the
    # driver's 1 s of launches (one worker at the plain share) start together on a
    # 2-core host with the TENTH curve and 0.2 cores of background. 5 busy workers:
    # the call sees 5.2 (2.6 per core, beyond the curve: S = 2.2 * 2.6 / 2 = 2.86) and
    # runs at S(1) / 2.86 = 1 / 2.86; the transition sees 5 (S(2.5) = 2.75): 1 / 2.75;
    # the driver's share 1 / 2.5. The driver ends first, at 2.5 s; by then the call has
    # done 2.5 / 2.86 s and the transition 2.5 / 2.75 s. Then 4 workers: the call sees
    # 4.2 (S(2.1) = 2.31), the transition 4 (S(2) = 2.2); the transition's 4 - 0.90909
    # = 3.09091 s left take 3.09091 * 2.2 = 6.8 s: it ends at 9.3 s. The call did
    # 6.8 / 2.31 s meanwhile, then runs alone at S(1) / S(1.1) = 1 / 1.12 for the rest.
    call = Work(id="call", sets=(0,), duration_s=10.0, hosts=((HOST, 2.0),), background=True)
    sync = Work(id="sync", sets=(1,), duration_s=4.0, hosts=((HOST, 2.0),))
    launch = Work(id="launch", sets=(-1,), duration_s=1.0, hosts=((HOST, 1.0),), sliced=False)
    spans = schedule([call, sync, launch], {HOST: 2}, {}, {HOST: TENTH}, {HOST: 0.2})
    assert spans["launch"].end_s == pytest.approx(2.5)
    sync_end = 2.5 + (4.0 - 2.5 / 2.75) * 2.2
    assert spans["sync"].end_s == pytest.approx(sync_end)
    done = 2.5 / 2.86 + (sync_end - 2.5) / 2.31
    assert spans["call"].end_s == pytest.approx(sync_end + (10.0 - done) * 1.12)


def test_the_simulator_charges_the_background_to_model_calls_not_transitions() -> None:
    # The colocated CPU plan: with a background entry its model calls take longer and its
    # reshard (a transition) keeps its length; the step takes longer.
    from placeflow.simulator.simulate import _backgrounds, _cost_calls, _tasks

    plan = make_plan("colocate", "tiny-llama", 8)
    cm = fitted_cost_model("cpu")
    loaded = _with_background(cm, {1: 0.1, 2: 0.1})
    assert _backgrounds(plan, {"*": loaded}) == {HOST: pytest.approx(0.1)}
    assert _backgrounds(plan, {"*": _with_background(cm, None)}) == {HOST: 0.0}
    calls, _ = _cost_calls(plan, {"*": loaded}, [0.0] * len(plan.sets))
    tasks = {t.id: t for t in _tasks(plan, calls, 1)}
    assert tasks[0, Phase.RESHARD].background is False
    assert tasks[0, Phase.GENERATE].background is True
    without = simulate(plan, _with_background(cm, None))
    with_bg = simulate(plan, loaded)
    assert with_bg.iteration_s > without.iteration_s
    before, after = without.phase_totals_s(), with_bg.phase_totals_s()
    assert after["generate"] > before["generate"]
    assert after["reshard"] == pytest.approx(before["reshard"], rel=0.02)


@pytest.mark.slow
def test_measure_ray_background_reads_the_host_for_one_and_two_ranks(ray_session: None) -> None:
    from placeflow.profiles.shared_cores import measure_ray_background

    entries = measure_ray_background(cores=1, samples=3, forwards=4)
    assert [e.params["kind"] for e in entries] == [FrameworkKind.RAY_BACKGROUND.value] * 2
    assert [e.params["num_units"] for e in entries] == [1, 2]
    # Cores busy with other work: positive (floored), and below the host's cores.
    assert all(e.repeats == 3 and 0 < e.p10_s <= e.median_s <= e.p90_s for e in entries)
    assert all(e.median_s < 2 for e in entries)
