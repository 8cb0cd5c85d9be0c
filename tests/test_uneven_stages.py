"""Uneven pipeline stages in the simulator: the heaviest stage sets a call's pace and a
rank's memory; NeMo RL's DeepSeek-V3 rows, which need them, simulate."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest

from placeflow.catalogue import CATALOGUE
from placeflow.layout import TrainLayout
from placeflow.plan import RoleParallelism, load_plan
from placeflow.profiles.registry import fitted_cost_model
from placeflow.simulator import callcosts, memory, simulate

ROOT = Path(__file__).resolve().parents[1]
LLAMA = CATALOGUE["llama-2-7b"]


def test_a_call_runs_at_the_pace_of_its_heaviest_stage() -> None:
    """6 layers split 4 + 2 cost what 8 layers split 4 + 4 cost: each micro-batch waits
    for the 4-layer stage (same head, same send/recv)."""
    cm = fitted_cost_model("a100-80gb")
    uneven = RoleParallelism(train=TrainLayout(p=2, first_stage_layers=4), micro_batch=2)
    even = RoleParallelism(train=TrainLayout(p=2), micro_batch=2)
    six, eight = (dataclasses.replace(LLAMA, num_layers=n) for n in (6, 8))
    got = callcosts.forward_cost(cm, six, uneven, 16, 512, value_head=False, trained=True)
    want = callcosts.forward_cost(cm, eight, even, 16, 512, value_head=False, trained=True)
    assert got.time_s == pytest.approx(want.time_s, rel=1e-12)
    one_stage_each = RoleParallelism(train=TrainLayout(p=2), micro_batch=2)
    fewer = callcosts.forward_cost(cm, six, one_stage_each, 16, 512, value_head=False, trained=True)
    assert got.time_s > fewer.time_s


def test_a_rank_holds_its_heaviest_stages_share_of_the_weights() -> None:
    """DeepSeek-V3's 61 layers over 16 stages of at most 4: a rank of t = 1 holds 4/61
    of the dense parameters (1/16 = 3.8/61 for an even split) and 4/61 / e of the experts."""
    model = CATALOGUE["deepseek-v3"]
    layout = TrainLayout(p=16, d=16, e=16, first_stage_layers=3, last_stage_layers=2)
    dense, experts = memory.dense_and_expert_params(model, value_head=False)
    (got_dense, d), (got_experts, expert_dp) = memory.shard_params(model, layout, value_head=False)
    assert got_dense == pytest.approx(dense * 4 / 61) and d == 16
    assert got_experts == pytest.approx(experts * 4 / 61 / 16) and expert_dp == 1
    act = memory.training_activation_bytes(
        model, layout, micro_batch=1, seq=1024, num_micro=32, recompute=True, value_head=False
    )
    sbh = 1024 * model.hidden_size
    # Recomputation keeps each of the 4 layers' inputs for p micro-batches in flight plus
    # one layer's full activations, and the logits twice (forward and gradient).
    full_layer = sbh * (10 + 24 / 1) * model.dtype.num_bytes / 2
    logits = 2 * 1024 * model.vocab_size * 4.0
    per_micro = 4 * 2 * sbh * model.dtype.num_bytes / 2 + full_layer
    assert act == pytest.approx(16 * per_micro + logits)


@pytest.mark.parametrize("name", ["nemo-rl-v0.6-deepseek-v3-on", "nemo-rl-v0.6-deepseek-v3-1off"])
def test_deepseek_v3_published_plans_simulate(name: str) -> None:
    plan = load_plan(ROOT / "examples" / "published" / f"{name}.toml")
    est = simulate(plan, fitted_cost_model("h100-sxm"))
    assert est.feasible, est.infeasible_reason
    assert math.isfinite(est.iteration_s) and est.iteration_s > 0
    actor = plan.parallelism[next(iter(plan.parallelism))]
    assert actor.train.stage_layers(61) == (3,) + (4,) * 14 + (2,)
    if plan.generator_set() is None:
        assert actor.gen_layout().stage_layers(61) == (15, 16, 16, 14)


def test_uneven_stages_round_trip_through_toml_and_bad_splits_are_refused(tmp_path: Path) -> None:
    from placeflow.errors import SpecError
    from placeflow.plan import plan_from_dict, plan_to_dict, save_plan

    plan = load_plan(ROOT / "examples" / "published" / "nemo-rl-v0.6-deepseek-v3-1off.toml")
    again = load_plan(save_plan(plan, tmp_path / "again.toml"))
    assert again.content_hash() == plan.content_hash()
    data = plan_to_dict(plan)
    assert data["parallelism"]["actor"]["first_stage_layers"] == 3
    for role in ("actor", "ref"):
        del data["parallelism"][role]["first_stage_layers"]
    with pytest.raises(SpecError, match=r"role actor: pipeline p=16 must split the 61 layers"):
        plan_from_dict(data, "plan", tmp_path)
