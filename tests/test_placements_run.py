"""Every plan the planner emits runs: the best plan of each of PPO's 15 placements, and GPU plans
rehearsed on CPU workers.

The oracle is the planner itself: whatever it chooses for the 8 logical CPU
workers of examples/clusters/cpu8.toml (two nodes of four; the parallelism and
ZeRO stages it picks) must train two PPO steps with finite metrics. A GPU plan
rehearsed here keeps its exact layout: the pipeline plans of the quickstart's
search run that way, as the planner no longer stages the tiny models on cpu8.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from placeflow.cli import main
from placeflow.cluster import load_cluster
from placeflow.errors import SpecError
from placeflow.executor.loop import check_executable, tokenizer_for
from placeflow.executor.rehearsal import check_host_memory, rehearsal_plan
from placeflow.executor.run import RunConfig, read_metrics, run_plan
from placeflow.hardware import DeviceKind
from placeflow.plan import load_plan
from placeflow.planner import PlannerResult, plan_search
from placeflow.profiles.registry import fitted_cost_model
from placeflow.workload import Role, load_workload

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
NUM_PPO_PLACEMENTS = 15  # Bell(4): actor, critic, ref, reward


@pytest.fixture(scope="module")
def cpu8_search() -> PlannerResult:
    cluster = load_cluster(EXAMPLES / "clusters" / "cpu8.toml")
    workload = load_workload(EXAMPLES / "workloads" / "ppo-tiny-rm-cpu.toml")
    costs = {p.profile: fitted_cost_model(p.profile) for p in cluster.pools}
    return plan_search(cluster, workload, costs, time_limit_s=60.0)


@pytest.mark.parametrize("index", range(NUM_PPO_PLACEMENTS))
def test_best_plan_of_every_ppo_placement_runs(
    ray_cluster: None, tmp_path: Path, cpu8_search: PlannerResult, index: int
) -> None:
    assert len(cpu8_search.per_placement) == NUM_PPO_PLACEMENTS
    best = cpu8_search.per_placement[index].best
    assert best is not None, cpu8_search.per_placement[index].reason
    result = run_plan(best.plan, tmp_path / "run", RunConfig(steps=2, progress=False))
    assert [r.step for r in result.records] == [0, 1]
    for rec in result.records:
        for key in ("pg_loss", "value_loss", "grad_norm", "kl_ref", "reward_mean", "entropy"):
            assert math.isfinite(rec.metrics[key]), (best.plan.name, key, rec.metrics)
        assert {"generate", "reward", "values", "actor_update", "critic_update"} <= set(rec.phases)


def test_the_planner_keeps_cpu8_to_data_parallel_layouts(cpu8_search: PlannerResult) -> None:
    # The parametrised test above is only as strong as the layouts it meets. On these 8
    # CPU workers a pipeline stage's send waits for its receiver (gloo; priced with the
    # paired floor, `CostModel._paired_floor_s`), and the tiny model fits a worker whole:
    # no placement's best plan splits a role into stages, so the pipeline plans the
    # planner emits are run below as GPU plans rehearsed on CPU workers instead.
    plans = [pr.best.plan for pr in cpu8_search.per_placement if pr.best is not None]
    assert plans and all(p.parallelism[r].train.p == 1 for p in plans for r in p.workload.roles)


def _quickstart_best(tmp_path: Path) -> Path:
    out = tmp_path / "best.toml"
    code = main(
        [
            "plan",
            "--cluster",
            str(EXAMPLES / "clusters" / "h100x16.toml"),
            "--workload",
            str(EXAMPLES / "workloads" / "ppo-llama2-7b.toml"),
            "--out",
            str(out),
            "--out-dir",
            str(tmp_path / "per-placement"),
        ]
    )
    assert code == 0
    return out


def test_rehearsal_keeps_the_layout(tmp_path: Path) -> None:
    plan = load_plan(_quickstart_best(tmp_path))
    assert len(list((tmp_path / "per-placement").glob("*.toml"))) == NUM_PPO_PLACEMENTS
    tiny = rehearsal_plan(plan)
    assert tiny.sets == plan.sets
    assert all(tiny.pool_of(i).gpu.kind is DeviceKind.CPU for i in range(len(tiny.sets)))
    assert [(p.num_nodes, p.gpus_per_node) for p in tiny.cluster.pools] == [
        (p.num_nodes, p.gpus_per_node) for p in plan.cluster.pools
    ]
    for role in plan.workload.roles:
        par, rpar = plan.parallelism[role], tiny.parallelism[role]
        assert (rpar.train, rpar.tg, rpar.pg, rpar.zero) == (par.train, par.tg, par.pg, par.zero)
        model = tiny.workload.models[role]
        assert model.num_layers % par.train.p == 0 and model.supports_tp(par.train.t)
    # Roles that share a model keep sharing one (the reference starts from the policy).
    assert tiny.workload.models[Role.ACTOR] == tiny.workload.models[Role.REF]
    b = tiny.workload.batch
    for role in (Role.ACTOR, Role.CRITIC):
        assert b.num_samples % (tiny.parallelism[role].train.d * b.mini_batches) == 0


def test_rehearsal_refuses_when_workers_do_not_fit_in_memory(tmp_path: Path) -> None:
    tiny = rehearsal_plan(load_plan(_quickstart_best(tmp_path)))
    with pytest.raises(SpecError, match=r"runs 16 worker processes.*1.0 GiB free"):
        check_host_memory(tiny, available_bytes=1 << 30)


def test_quickstart_best_plan_rehearses_end_to_end(ray_session: None, tmp_path: Path) -> None:
    # The README's promise: plan on 16 H100, then check the chosen plan's wiring here.
    plan_path = _quickstart_best(tmp_path)
    run_dir = tmp_path / "run"
    code = main(
        ["run", str(plan_path), "--rehearse", "--steps", "2", "--run-dir", str(run_dir)]
        + ["--no-progress"]
    )
    assert code == 0
    lines = read_metrics(run_dir)
    assert [m["step"] for m in lines] == [0, 1]
    assert all(math.isfinite(m["pg_loss"]) and math.isfinite(m["value_loss"]) for m in lines)
    manifest = (run_dir / "manifest.json").read_text()
    assert load_plan(plan_path).content_hash() in manifest and "rehearsal_of" in manifest


def test_a_pipeline_plan_the_planner_emits_rehearses_end_to_end(
    ray_session: None, tmp_path: Path
) -> None:
    # A per-placement plan of the quickstart's search whose roles run in pipeline stages
    # (on 16 H100 the planner splits the actor or critic into p = 2 in several
    # placements), rehearsed on CPU workers with its exact layout: two PPO steps.
    _quickstart_best(tmp_path)
    staged = [
        path
        for path in sorted((tmp_path / "per-placement").glob("*.toml"))
        if any(par.train.p > 1 for par in load_plan(path).parallelism.values())
    ]
    assert staged
    run_dir = tmp_path / "run"
    code = main(
        ["run", str(staged[0]), "--rehearse", "--steps", "2", "--run-dir", str(run_dir)]
        + ["--no-progress"]
    )
    assert code == 0
    lines = read_metrics(run_dir)
    assert [m["step"] for m in lines] == [0, 1]
    assert all(math.isfinite(m["pg_loss"]) and math.isfinite(m["value_loss"]) for m in lines)


GPU_WORKLOADS = ("ppo-llama2-7b", "ppo-llama2-7b-async", "grpo-qwen2.5-7b", "safe-rlhf-llama2-7b")
CPU_WORKLOADS = ("grpo-tiny-cpu", "remax-tiny-cpu", "ppo-tiny-rm-cpu", "safe-rlhf-tiny-cpu")
PAIRS = [(c, w) for c in ("h100x16", "hetero") for w in GPU_WORKLOADS] + [
    ("cpu8", w) for w in CPU_WORKLOADS
]


@pytest.mark.parametrize(("cluster_name", "workload_name"), PAIRS)
def test_executor_accepts_every_plan_the_planner_emits(
    cluster_name: str, workload_name: str
) -> None:
    # No refusal left that the planner can trigger: every placement's best plan of every
    # example pair is one the executor takes (GPU plans here as rehearsals of their layout).
    cluster = load_cluster(EXAMPLES / "clusters" / f"{cluster_name}.toml")
    workload = load_workload(EXAMPLES / "workloads" / f"{workload_name}.toml")
    costs = {p.profile: fitted_cost_model(p.profile) for p in cluster.pools}
    result = plan_search(cluster, workload, costs, time_limit_s=30.0)
    plans = [pr.best.plan for pr in result.per_placement if pr.best is not None]
    assert plans
    for plan in plans:
        check_executable(plan)
        on_cpu = plan if plan.pool_of(0).gpu.kind is DeviceKind.CPU else rehearsal_plan(plan)
        check_executable(on_cpu)
        tokenizer_for(on_cpu)
