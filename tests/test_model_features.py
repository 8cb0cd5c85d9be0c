"""Models beyond a dense Llama layer (Qwen3's wider heads and QK-norm, experts, latent
attention): priced where the cost model knows their kernels, refused by name elsewhere
(the executor's engines do not run experts or latent attention yet)."""

import dataclasses
from pathlib import Path

import pytest

from placeflow.catalogue import CATALOGUE
from placeflow.errors import SpecError
from placeflow.executor.rehearsal import rehearsal_plan
from placeflow.plan import load_plan
from placeflow.profiles.registry import fitted_cost_model
from placeflow.simulator import simulate
from placeflow.workload import Role

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def _with_model(name: str):
    plan = load_plan(EXAMPLES / "plans" / "ppo-7b-colocate-h100x16.toml")
    model = CATALOGUE[name]
    workload = dataclasses.replace(
        plan.workload, models={role: model for role in plan.workload.models}
    )
    return dataclasses.replace(plan, workload=workload)


def test_qwen3_wider_heads_are_priced_by_their_head_dim():
    plan = _with_model("qwen3-8b")
    cm = fitted_cost_model(plan.cluster.pools[0].profile)
    est = simulate(plan, cm)
    assert est.iteration_s > 0
    # The same model with heads as wide as hidden / heads (32 x 128 = 4096 either way
    # for the 8B) is priced identically; Qwen3-32B's 64 x 128 heads on 5,120 are not.
    wide = CATALOGUE["qwen3-32b"]
    narrow = dataclasses.replace(wide, head_dim=80)
    assert narrow.q_size == 5120 < wide.q_size
    assert narrow.kv_cache_bytes_per_token < wide.kv_cache_bytes_per_token


@pytest.mark.parametrize(
    ("name", "feature"),
    [("qwen3-30b-a3b", "mixture of experts"), ("deepseek-v3", "multi-head latent attention")],
)
def test_experts_and_latent_attention_are_priced_and_experts_rehearsed(name, feature):
    plan = _with_model(name)
    cm = fitted_cost_model(plan.cluster.pools[0].profile)
    est = simulate(plan, cm)  # priced: no refusal; too big for 16 GPUs is a memory verdict
    assert est.feasible or "short by" in (est.infeasible_reason or "")
    if feature == "mixture of experts":  # rehearsed with a tiny mixture of experts
        assert rehearsal_plan(plan).workload.models[Role.ACTOR].moe is not None
        return
    with pytest.raises(SpecError, match=f"{feature}.*rehearsal"):
        rehearsal_plan(plan)


def test_every_over_capacity_set_is_reported_and_no_time_is_given():
    import json

    from placeflow.plan import DeviceSet

    plan = load_plan(EXAMPLES / "plans" / "ppo-7b-split-h100x16.toml")
    big = CATALOGUE["llama-2-70b"]
    workload = dataclasses.replace(plan.workload, models={r: big for r in plan.workload.models})
    plan = dataclasses.replace(plan, workload=workload)
    est = simulate(plan, fitted_cost_model(plan.cluster.pools[0].profile))
    over = [s for s in est.sets if s.peak_memory_bytes > s.capacity_bytes]
    assert not est.feasible and len(over) >= 2
    assert len(est.infeasible_reasons) >= len(over)
    for s in over:
        assert f"set #{s.index + 1}" in est.infeasible_reason
    data = json.loads(json.dumps(est.to_json()))
    assert data["iteration_s"] is None and data["tokens_per_s"] is None
    assert data["infeasible_reasons"] == list(est.infeasible_reasons)
    assert isinstance(plan.sets[0], DeviceSet)


def test_the_executor_refuses_what_its_engines_do_not_run():
    from placeflow.executor.loop import check_executable

    with pytest.raises(SpecError, match=r"latent attention.*the executor's engines"):
        check_executable(_with_model("deepseek-v3"))
    check_executable(_with_model("qwen3-8b"))  # QK-norm: run by the engines
    with pytest.raises(SpecError, match="expert TP"):  # experts with t > 1: not run
        check_executable(_with_model("qwen3-30b-a3b"))


def _with_parallelism(plan, role, **train):
    par = plan.parallelism[role]
    layout = dataclasses.replace(par.train, **train)
    parallelism = dict(plan.parallelism)
    parallelism[role] = dataclasses.replace(par, train=layout)
    return dataclasses.replace(plan, parallelism=parallelism)


def test_expert_parallel_is_a_plan_axis_for_moe_models_only(tmp_path):
    from placeflow.plan import plan_to_dict, save_plan

    plan = _with_model("qwen3-30b-a3b")
    actor = next(iter(plan.parallelism))
    d = plan.parallelism[actor].train.d
    moe = _with_parallelism(plan, actor, e=d)
    assert plan_to_dict(moe)["parallelism"][actor.value]["e"] == d
    assert load_plan(save_plan(moe, tmp_path / "moe.toml")).parallelism[actor].train.e == d
    with pytest.raises(SpecError, match="needs a mixture-of-experts model"):
        _with_parallelism(_with_model("qwen3-8b"), actor, e=d)
    with pytest.raises(SpecError, match="must divide data parallel"):
        _with_parallelism(plan, actor, e=d + 1)
