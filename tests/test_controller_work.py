"""The controller's own work between the calls (rule-based reward, advantages): measured
through the executor's code, priced from the profile, scheduled on the driver.

Oracles: the units each step's work is priced at, counted by hand from the batch; a
step whose driver scores and computes advantages is the same step without them plus
what lies on its critical path, worked out by hand from the schedule's order (the
executor's `RLLoop._forwards` and `_train`); Safe-RLHF's dual step by its formula.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest
import torch
from test_ray_roundtrip import GET_S, LAUNCH_S, DriverCosts
from test_simulator import tiny_plan

from placeflow.executor.loop import step_advantages
from placeflow.fields import Field
from placeflow.layout import TrainLayout
from placeflow.phases import Phase
from placeflow.plan import DeviceSet, RoleParallelism
from placeflow.profiles import controller_work
from placeflow.profiles.controller_work import (
    ADVANTAGE_KIND,
    CONTROLLER_KINDS,
    advantage_probe,
    measure_advantages,
    measure_rule_reward,
)
from placeflow.profiles.framework import ENGINE_KINDS
from placeflow.profiles.schema import FrameworkKind, Op, Source, load_profile_file
from placeflow.simulator import simulate
from placeflow.simulator.rolecosts import controller_work_s, rule_reward_on_driver
from placeflow.simulator.simulate import CONTROLLER
from placeflow.workload import Algorithm, Role

ROOT = Path(__file__).resolve().parents[1]


def _costs(per_response: float, advantage_s: float) -> DriverCosts:
    """DriverCosts whose profile holds controller entries: `rule_reward` at `per_response`
    seconds a response, every advantage kind at `advantage_s` whatever the length."""

    class EntryCosts(DriverCosts):
        def framework_s(self, kind, num_units=1):
            if kind is FrameworkKind.RULE_REWARD:
                return per_response * num_units
            if kind in ADVANTAGE_KIND.values():
                return advantage_s
            return None

    return EntryCosts(profile_name="c", dtype_bytes=4, rooflines={}, series={})


def _bare() -> DriverCosts:
    return DriverCosts(profile_name="d", dtype_bytes=4, rooflines={}, series={})


def _plan():
    two = RoleParallelism(train=TrainLayout(d=2), micro_batch=4, recompute=False)
    return tiny_plan(
        [DeviceSet(roles=(Role.ACTOR, Role.REF), pool="cpu", first_device=0, num_devices=2)],
        {Role.ACTOR: two, Role.REF: two},
    )


def test_controller_kinds_are_not_the_engine_s() -> None:
    """The framework profiler measures the engine's kinds; these are this module's."""
    assert not set(CONTROLLER_KINDS) & set(ENGINE_KINDS)
    assert set(ADVANTAGE_KIND) == set(Algorithm)


def test_controller_work_units_by_hand() -> None:
    """GRPO with a rule reward: 8 responses scored, advantages at the batch's longest
    length; ReMax scores its 4 greedy baselines too; a reward model or reward Ray tasks
    leave the driver nothing to score; a profile without entries prices nothing."""
    plan = _plan()
    wl = plan.workload
    cm = _costs(per_response=1e-3, advantage_s=0.25)
    assert rule_reward_on_driver(wl)
    assert controller_work_s(wl, Phase.REWARD, cm) == pytest.approx(8e-3)
    assert controller_work_s(wl, Phase.ADVANTAGE, cm) == pytest.approx(0.25)
    remax = dataclasses.replace(wl, algorithm=Algorithm.REMAX)
    assert controller_work_s(remax, Phase.REWARD, cm) == pytest.approx((8 + 4) * 1e-3)
    tasks = dataclasses.replace(wl, reward_workers=2)
    assert not rule_reward_on_driver(tasks)
    assert controller_work_s(tasks, Phase.REWARD, cm) is None
    model = dataclasses.replace(
        wl, models={**wl.models, Role.REWARD: wl.models[Role.ACTOR]}, reward_function=None
    )
    assert controller_work_s(model, Phase.REWARD, cm) is None
    assert controller_work_s(wl, Phase.REWARD, _bare()) is None


def test_scoring_behind_the_launches_and_advantages_before_the_updates_by_hand() -> None:
    """The driver scores after it has launched ref and old, and collects them after it;
    it computes the advantages after both collects and before the update's launches.

    With DriverCosts alone (2 ranks: 2 launches a call, one get after it) ref runs from
    its launches to its end, T_ref = base[ref] - G (its get follows at once), and old
    right after on the set, T_old = base[old] (its interval starts after ref's get).
    A reward R longer than both runs: from ref's start the driver launches old (2L),
    scores (R) and gets ref's result (G), which ends ref's interval, then old's (G),
    old's interval; then A before the update's launches. The step grows by
    2L + R + G + A − T_ref − T_old. A reward that ends within ref's run changes no
    forward's interval, and the step grows by A only."""
    plan = _plan()
    base = simulate(plan, _bare())
    before = {p.name: p.duration_s for p in base.phases}
    t_ref, t_old = before[Phase.REF_LOGPROB] - GET_S, before[Phase.OLD_LOGPROB]
    assert before.get(Phase.REWARD) is None and before[Phase.ADVANTAGE] == 0.0
    r, a = 10 * (t_ref + t_old), 0.25
    slow = simulate(plan, _costs(per_response=r / 8, advantage_s=a))
    after = {p.name: p.duration_s for p in slow.phases}
    launches = 2 * LAUNCH_S
    assert slow.iteration_s == pytest.approx(
        base.iteration_s + launches + r + GET_S + a - t_ref - t_old
    )
    assert after[Phase.REWARD] == pytest.approx(r)
    assert after[Phase.ADVANTAGE] == pytest.approx(a)
    assert after[Phase.REF_LOGPROB] == pytest.approx(launches + r + GET_S)
    assert after[Phase.OLD_LOGPROB] == pytest.approx(GET_S)
    for p in slow.phases:
        if p.name in (Phase.REWARD, Phase.ADVANTAGE):
            assert p.device_set == CONTROLLER and p.set_label == "controller"
    assert not slow.notes  # `arith`: the profile's own checker
    wl = dataclasses.replace(plan.workload, reward_function="math")
    notes = simulate(dataclasses.replace(plan, workload=wl), _costs(r / 8, a)).notes
    assert any("'math' is priced as the built-in arith" in n for n in notes)
    r_hidden = (t_ref - launches) / 2
    assert r_hidden > 0
    quick = simulate(plan, _costs(per_response=r_hidden / 8, advantage_s=a))
    got = {p.name: p.duration_s for p in quick.phases}
    assert quick.iteration_s == pytest.approx(base.iteration_s + a)
    for phase in (Phase.REF_LOGPROB, Phase.OLD_LOGPROB, Phase.GENERATE):
        assert got[phase] == pytest.approx(before[phase])


@pytest.mark.parametrize("algorithm", list(Algorithm))
def test_advantage_probe_runs_the_executor_s_advantages(algorithm: Algorithm) -> None:
    """The probe's batch is what `step_advantages` needs for each algorithm; Safe-RLHF's
    multiplier takes its dual step max(0, λ + lr (mean cost − limit))."""
    w, batch = advantage_probe(algorithm, 8)
    out, metrics, multiplier = step_advantages(w, batch, 1.0)
    adv = out.tensors[Field.ADVANTAGES]
    assert adv.shape[0] == controller_work.CONTROLLER_SAMPLES
    assert torch.isfinite(adv).all()
    if algorithm is Algorithm.SAFE_RLHF:
        mean_cost = float(batch.tensors[Field.COSTS].mean())
        expected = max(0.0, 1.0 + w.rl.lambda_lr * (mean_cost - w.rl.cost_limit))
        assert multiplier == pytest.approx(expected)
        assert metrics["lagrange_multiplier"] == pytest.approx(expected)
    else:
        assert multiplier == 1.0


def test_measurements_give_positive_entries_of_their_kinds() -> None:
    reward = measure_rule_reward((2, 4), repeats=3, warmup=1)
    assert [(e.params["kind"], e.params["num_units"]) for e in reward] == [
        ("rule_reward", 2),
        ("rule_reward", 4),
    ]
    adv = measure_advantages((Algorithm.PPO, Algorithm.GRPO), (4,), repeats=3, warmup=1)
    assert [e.params["kind"] for e in adv] == ["advantage_ppo", "advantage_grpo"]
    for e in (*reward, *adv):
        assert e.op is Op.FRAMEWORK and e.source is Source.MEASURED and e.repeats == 3
        assert 0 < e.p10_s <= e.median_s <= e.p90_s


def test_main_adds_its_kinds_and_keeps_the_profile_s_other_entries(tmp_path: Path) -> None:
    path = tmp_path / "cpu.json"
    shutil.copy(ROOT / "profiles" / "data" / "cpu.json", path)
    before = load_profile_file(path)
    others = [e for e in before.entries if e.params.get("kind") != "rule_reward"]
    assert (
        controller_work.main(["--add-to", str(path), "--kinds", "rule_reward", "--repeats", "3"])
        == 0
    )
    after = load_profile_file(path)
    mine = [e for e in after.entries if e.params.get("kind") == "rule_reward"]
    assert [e.params["num_units"] for e in mine] == list(controller_work.REWARD_RESPONSES)
    assert len(after.entries) == len(others) + len(mine)
    assert "controller_work" in after.provenance.notes
    assert json.loads(path.read_text())["schema"] == "placeflow-profile"
