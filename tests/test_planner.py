"""Planner: CP-SAT against brute force, constraint families, validator, statuses, CLI."""

import dataclasses
import itertools
import json
import math
import random

import pytest

from placeflow.catalogue import CATALOGUE
from placeflow.cli import main
from placeflow.cluster import ClusterSpec, PoolSpec
from placeflow.hardware import HARDWARE
from placeflow.planner import Infeasible, Objective, Status, plan_search
from placeflow.planner.costtable import CostTable, build_cost_table
from placeflow.planner.generators import with_generators
from placeflow.planner.solution import assign_devices, solution_to_plan
from placeflow.planner.solve import SetChoice, solve
from placeflow.planner.space import (
    PlacementKind,
    candidate_counts,
    enumerate_placements,
    parallelism_options,
)
from placeflow.planner.validate import validate_plan
from placeflow.planner.variables import MIB
from placeflow.profiles.registry import fitted_cost_model
from placeflow.workload import Algorithm, BatchSpec, Role, Workload

PPO_ROLES = (Role.ACTOR, Role.CRITIC, Role.REF, Role.REWARD)


@pytest.fixture(scope="module")
def h100():
    return {"h100-sxm": fitted_cost_model("h100-sxm")}


def cluster(num_nodes, gpus_per_node, memory_gib=80.0, price=2.0):
    # No reserve: these tests shrink memory until it binds, down to a fraction of a GiB
    # (the reserve's own tests are in test_offload.py).
    gpu = dataclasses.replace(
        HARDWARE["h100-sxm"], memory_bytes=int(memory_gib * 2**30), reserve_bytes=0
    )
    return ClusterSpec(
        name="c",
        pools=(
            PoolSpec(
                name="h100",
                gpu=gpu,
                num_nodes=num_nodes,
                gpus_per_node=gpus_per_node,
                price_per_gpu_hour=price,
            ),
        ),
    )


def workload(models, algorithm=Algorithm.PPO, prompts=64, prompt_len=256, response_len=256):
    return Workload(
        name="w",
        algorithm=algorithm,
        models=models,
        batch=BatchSpec(
            prompts_per_step=prompts,
            samples_per_prompt=2 if algorithm is Algorithm.GRPO else 1,
            prompt_len=prompt_len,
            response_len=response_len,
            mini_batches=2,
        ),
        reward_function="arith" if Role.REWARD not in models else None,
    )


def test_placement_enumeration_counts_and_kinds():
    ppo = enumerate_placements(PPO_ROLES)
    assert len(ppo) == 15 and len(enumerate_placements(tuple(Role))) == 52
    kinds = [p.kind for p in ppo]
    assert kinds.count(PlacementKind.COLOCATE) == 1
    assert kinds.count(PlacementKind.STANDALONE) == 1
    assert kinds.count(PlacementKind.SPLIT) == 1
    assert len({p.sets for p in ppo}) == 15


def test_candidate_counts_respect_node_boundaries():
    pool = cluster(3, 8).pools[0]
    assert candidate_counts(pool) == [1, 2, 4, 8, 16, 24]
    # Whole-node counts: k nodes with at most two binary digits 1 in k, and the whole pool.
    big = cluster(15, 8).pools[0]
    nodes = [1, 2, 3, 4, 5, 6, 8, 9, 10, 12, 15]
    assert candidate_counts(big) == [1, 2, 4] + [8 * k for k in nodes]


def test_parallelism_options_respect_divisibility():
    pool = cluster(2, 8).pools[0]
    model = CATALOGUE["qwen2.5-7b"]  # 28 heads, 4 KV heads, 28 layers
    for par in parallelism_options(model, Role.ACTOR, 8, pool):
        assert par.train.world_size == 8
        assert model.num_heads % par.train.t == 0 and model.num_layers % par.train.p == 0
        assert par.train.t % par.tg == 0 and par.train.t <= 8
    assert {p.train.t for p in parallelism_options(model, Role.ACTOR, 8, pool)} == {1, 2, 4}


def objective_value(choice, table, table_cluster, one_step_off=False):
    """Brute-force objective of one complete choice, as the model defines it (time units, MiB).

    `choice` is (sets, options, generator): the actor's weight sync keeps its set busy in
    the generation stage, and the generator set is one more set there (or, one step off,
    runs beside all three stages).
    """
    sets, options, gen = choice
    sync = table.to_units(gen.sync_s) if gen else 0
    stages = [
        max(
            sum(table.to_units(options[r].stage_s[k]) for r in roles)
            + (sync if k == 0 and Role.ACTOR in roles else 0)
            for roles, _ in sets
        )
        for k in range(3)
    ]
    gen_load = table.to_units(gen.load_s) if gen else 0
    if one_step_off:
        step = max(sum(stages), gen_load)
    else:
        stages[0] = max(stages[0], gen_load)
        step = sum(stages)
    gpus = sum(n for _, n in sets) + (gen.num_gpus if gen else 0)
    return step * (table_cluster.num_gpus + 1) + gpus


def _fits(placement, opts, cap):
    return all(
        sum(math.ceil(opts[r].resident_bytes / MIB) for r in s)
        + math.ceil(opts[rp].transient_bytes / MIB)
        <= cap
        for s in placement.sets
        for rp in s
    )


def brute_force(placements, table: CostTable, cl: ClusterSpec, one_step_off=False):
    """(best objective, whether the best choice has a generator set) over every choice."""
    pool = cl.pools[0]
    cap = pool.gpu.memory_bytes // MIB
    best, best_gen = math.inf, False
    counts = sorted({k[2] for k in table.options})
    for placement in placements:
        for ns in itertools.product(counts, repeat=len(placement.sets)):
            if sum(ns) > pool.num_gpus:
                continue
            keys = {
                r: (r, pool.name, n)
                for roles, n in zip(placement.sets, ns, strict=True)
                for r in roles
            }
            if any(k not in table.options for k in keys.values()):
                continue
            roles = list(keys)
            sets = list(zip(placement.sets, ns, strict=True))
            for combo in itertools.product(*(table.options[keys[r]] for r in roles)):
                opts = dict(zip(roles, combo, strict=True))
                if not _fits(placement, opts, cap):
                    continue
                gens = [None]
                if opts[Role.ACTOR].gen_apart:
                    gens = [
                        g
                        for g in table.generators
                        if sum(ns) + g.num_gpus <= pool.num_gpus
                        and math.ceil((g.resident_bytes + g.transient_bytes) / MIB) <= cap
                    ]
                for gen in gens:
                    value = objective_value((sets, opts, gen), table, cl, one_step_off)
                    if value < best:
                        best, best_gen = value, gen is not None
    return best, best_gen


SMALL_MODELS = ["tiny-llama", "tiny-llama-m", "smollm2-135m", "qwen2.5-0.5b"]


def truncated(table: CostTable, keep: int = 3) -> CostTable:
    """At most `keep` options per role and count, with (where the table has them) one
    generating apart, one without recomputation and one offloading the optimizer."""
    options = {}
    for key, opts in table.options.items():
        picks = [
            next((o for o in opts if wanted(o)), None)
            for wanted in (
                lambda o: o.gen_apart,
                lambda o: not o.par.recompute,
                lambda o: o.par.offload_optimizer,
            )
        ]
        chosen = list(dict.fromkeys(o for o in picks if o is not None))
        rest = [o for o in opts if o not in chosen]
        options[key] = chosen + rest[: max(0, keep - len(chosen))]
    return dataclasses.replace(table, options=options)


@pytest.mark.parametrize("seed", range(8))
def test_cpsat_optimum_equals_brute_force(h100, seed):
    rng = random.Random(seed)
    nodes, per_node = rng.choice([(1, 4), (1, 8), (2, 4), (2, 8)])
    algorithm = rng.choice([Algorithm.PPO, Algorithm.GRPO])
    roles = PPO_ROLES if algorithm is Algorithm.PPO else (Role.ACTOR, Role.REF)
    models = {r: CATALOGUE[rng.choice(SMALL_MODELS)] for r in roles}
    if algorithm is Algorithm.GRPO:
        models = {r: models[Role.ACTOR] for r in roles}
    # Memory tight enough that colocation is sometimes infeasible.
    cl = cluster(nodes, per_node, memory_gib=rng.choice([4.0, 8.0, 80.0]))
    wl = workload(
        models, algorithm, prompts=rng.choice([16, 64]), response_len=rng.choice([64, 512])
    )
    wl = dataclasses.replace(wl, max_staleness=int(rng.random() < 0.4))
    # The same (truncated) space for both, generator options included.
    table = truncated(with_generators(build_cost_table(wl, cl, h100), wl, cl, h100))
    placements = enumerate_placements(wl.roles)
    expected, _ = brute_force(placements, table, cl, wl.asynchronous)
    kwargs = {"tokens_per_step": 1.0, "one_step_off": wl.asynchronous}
    if math.isinf(expected):
        with pytest.raises(Infeasible):
            solve(placements, table, cl, Objective.THROUGHPUT, **kwargs)
        return
    sol = solve(placements, table, cl, Objective.THROUGHPUT, **kwargs)
    assert sol.status is Status.OPTIMAL
    sets = [(s.roles, s.num_gpus) for s in sol.sets]
    choice = (sets, sol.options, sol.generator)
    assert objective_value(choice, table, cl, wl.asynchronous) == expected
    plan = solution_to_plan(sol, wl, cl)
    assert validate_plan(plan, h100) == []


# --- constraint families: one feasible and one infeasible case each ----------


def test_gpu_budget_feasible_and_infeasible(h100):
    wl = workload({r: CATALOGUE["qwen2.5-0.5b"] for r in PPO_ROLES})
    sol = solve(
        enumerate_placements(wl.roles),
        build_cost_table(wl, cluster(1, 4), h100),
        cluster(1, 4),
        Objective.THROUGHPUT,
        tokens_per_step=1.0,
    )
    assert sum(s.num_gpus for s in sol.sets) <= 4
    # Standalone placement alone needs 4 sets: impossible on 2 GPUs.
    two = cluster(1, 2)
    standalone = [p for p in enumerate_placements(wl.roles) if p.kind is PlacementKind.STANDALONE]
    with pytest.raises(Infeasible):
        solve(
            standalone,
            build_cost_table(wl, two, h100),
            two,
            Objective.THROUGHPUT,
            tokens_per_step=1.0,
        )


def test_memory_feasible_and_infeasible(h100):
    models = {r: CATALOGUE["llama-2-7b"] for r in PPO_ROLES}
    wl = workload(models)
    roomy = cluster(1, 8)
    colocate = [p for p in enumerate_placements(wl.roles) if p.kind is PlacementKind.COLOCATE]
    assert (
        solve(
            colocate,
            build_cost_table(wl, roomy, h100),
            roomy,
            Objective.THROUGHPUT,
            tokens_per_step=1.0,
        ).status
        is Status.OPTIMAL
    )
    tight = cluster(1, 2, memory_gib=24.0)  # four 7B models cannot share 2 x 24 GiB
    with pytest.raises(Infeasible, match=r"memory|fits on no"):
        solve(
            colocate,
            build_cost_table(wl, tight, h100),
            tight,
            Objective.THROUGHPUT,
            tokens_per_step=1.0,
        )


def test_stage_objective_feasible_and_target_infeasible(h100):
    wl = workload({r: CATALOGUE["qwen2.5-0.5b"] for r in PPO_ROLES})
    cl = cluster(1, 8)
    table = build_cost_table(wl, cl, h100)
    placements = enumerate_placements(wl.roles)
    fast = solve(placements, table, cl, Objective.THROUGHPUT, tokens_per_step=1.0)
    tokens = wl.batch.tokens_per_step
    ok = solve(
        placements,
        table,
        cl,
        Objective.GPUS,
        tokens_per_step=tokens,
        target_tokens_per_s=0.5 * tokens / fast.step_s,
    )
    assert sum(s.num_gpus for s in ok.sets) <= sum(s.num_gpus for s in fast.sets)
    with pytest.raises(Infeasible, match="reaches"):
        solve(
            placements,
            table,
            cl,
            Objective.GPUS,
            tokens_per_step=tokens,
            target_tokens_per_s=10 * tokens / fast.step_s,
        )


def test_device_assignment_packs_and_validator_catches_overuse(h100):
    cl = cluster(2, 8)
    sets = (
        SetChoice(roles=(Role.ACTOR,), pool="h100", num_gpus=8),
        SetChoice(roles=(Role.CRITIC,), pool="h100", num_gpus=4),
        SetChoice(roles=(Role.REF,), pool="h100", num_gpus=2),
        SetChoice(roles=(Role.REWARD,), pool="h100", num_gpus=2),
    )
    firsts = [s.first_device for s in assign_devices(sets, cl)]
    assert firsts == [0, 8, 12, 14]


def test_search_end_to_end_and_infeasible_reason(h100):
    wl = workload({r: CATALOGUE["qwen2.5-0.5b"] for r in PPO_ROLES})
    result = plan_search(cluster(1, 8), wl, h100, time_limit_s=20)
    assert result.status is Status.OPTIMAL
    assert len(result.per_placement) == 15
    assert result.best.estimate.feasible
    assert result.best.estimate.tokens_per_s == max(r.estimate.tokens_per_s for r in result.ranked)
    huge = workload({r: CATALOGUE["llama-2-70b"] for r in PPO_ROLES})
    with pytest.raises(Infeasible, match=r"role .* fits on no candidate"):
        plan_search(cluster(1, 2), huge, h100, time_limit_s=10)


def test_cost_objective_needs_prices(h100):
    wl = workload({r: CATALOGUE["qwen2.5-0.5b"] for r in PPO_ROLES})
    cl = cluster(1, 4)
    no_price = dataclasses.replace(
        cl, pools=(dataclasses.replace(cl.pools[0], price_per_gpu_hour=None),)
    )
    with pytest.raises(ValueError, match="price_per_gpu_hour"):
        plan_search(no_price, wl, h100, objective=Objective.COST, time_limit_s=10)
    result = plan_search(cl, wl, h100, objective=Objective.COST, time_limit_s=10)
    assert result.best.price_per_mtoken is not None


def test_cli_plan_json_and_out(tmp_path, capsys):
    out = tmp_path / "best.toml"
    code = main(
        [
            "plan",
            "--cluster",
            "examples/clusters/h100x16.toml",
            "--workload",
            "examples/workloads/ppo-llama2-7b.toml",
            "--json",
            "--out",
            str(out),
            "--time-limit",
            "30",
        ]
    )
    data = json.loads(capsys.readouterr().out)
    assert code == 0
    assert {"status", "solve_s", "best", "per_placement"} <= set(data)
    assert {
        "placement",
        "placement_kind",
        "gpus_per_set",
        "parallelism",
        "iteration_s",
        "tokens_per_s",
    } <= set(data["best"])
    assert len(data["per_placement"]) == 15
    # Every row is proven (a plan, or infeasible for a reason), so the search is optimal.
    assert data["status"] == "optimal"
    for row in data["per_placement"]:
        assert row["status"] in ("optimal", "infeasible")
        assert ("plan_hash" in row) == (row["status"] == "optimal"), row
    code = main(["simulate", str(out), "--json"])
    sim = json.loads(capsys.readouterr().out)
    assert code == 0 and sim["feasible"]
    assert sim["iteration_s"] == pytest.approx(data["best"]["iteration_s"])


def test_heterogeneous_cluster_puts_each_set_on_one_pool():
    costs = {
        "h100-sxm": fitted_cost_model("h100-sxm"),
        "a100-80gb": fitted_cost_model("a100-80gb"),
    }
    from placeflow.cluster import load_cluster

    cl = load_cluster("examples/clusters/hetero.toml")
    wl = workload({r: CATALOGUE["qwen2.5-0.5b"] for r in PPO_ROLES})
    result = plan_search(cl, wl, costs, time_limit_s=30)
    for ranked in result.ranked:
        plan = ranked.plan
        assert validate_plan(plan, costs) == []
        for s in plan.sets:
            pool = plan.cluster.pool(s.pool)
            assert s.first_device + s.num_devices <= pool.num_gpus


def test_each_ranked_plan_is_simulated_once_and_validated_from_that(h100, monkeypatch):
    import placeflow.planner.search as search_mod
    import placeflow.planner.validate as validate_mod

    calls = {"search": 0, "validate": 0}

    def counting(key, real):
        def wrapped(*args, **kwargs):
            calls[key] += 1
            return real(*args, **kwargs)

        return wrapped

    monkeypatch.setattr(search_mod, "simulate", counting("search", search_mod.simulate))
    monkeypatch.setattr(validate_mod, "simulate", counting("validate", validate_mod.simulate))
    wl = workload({r: CATALOGUE["qwen2.5-0.5b"] for r in PPO_ROLES})
    result = plan_search(cluster(1, 8), wl, h100, time_limit_s=30)
    planned = sum(1 for row in result.per_placement if row.best is not None)
    assert planned >= len(result.ranked) and calls == {"search": planned, "validate": 0}
    # The validator still finds a memory problem in the estimate it is handed.
    best = result.best
    short = dataclasses.replace(
        best.estimate, feasible=False, infeasible_reasons=("set #1 over by 1 GiB",)
    )
    assert any(
        p.startswith("memory:") for p in validate_mod.validate_plan(best.plan, estimate=short)
    )
