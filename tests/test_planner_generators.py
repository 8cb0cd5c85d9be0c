"""Planner: the actor's generator set apart — options, constraints (4), (7b), (8c), (9), (10),
validator, and plans where a generator set wins."""

import dataclasses
import math
from pathlib import Path

import pytest
from test_planner import (
    brute_force,
    cluster,
    objective_value,
    truncated,
    workload,
)

from placeflow.catalogue import CATALOGUE
from placeflow.phases import Phase
from placeflow.plan import DeviceSet, Plan, plan_from_dict, plan_to_dict
from placeflow.planner import Infeasible, Objective, Status, plan_search
from placeflow.planner.costtable import build_cost_table
from placeflow.planner.generators import GeneratorOption, generator_option, with_generators
from placeflow.planner.solution import solution_to_plan
from placeflow.planner.solve import solve
from placeflow.planner.space import PlacementKind, enumerate_placements
from placeflow.planner.validate import validate_plan
from placeflow.planner.variables import MIB
from placeflow.profiles.registry import fitted_cost_model
from placeflow.workload import Algorithm, Role

SMALL = CATALOGUE["qwen2.5-0.5b"]


@pytest.fixture(scope="module")
def h100():
    return {"h100-sxm": fitted_cost_model("h100-sxm")}


def grpo(async_one_step_off=False, prompts=64, response_len=512):
    wl = workload(
        {r: SMALL for r in (Role.ACTOR, Role.REF)},
        Algorithm.GRPO,
        prompts=prompts,
        response_len=response_len,
    )
    return dataclasses.replace(wl, max_staleness=int(async_one_step_off))


def table_for(wl, cl, costs):
    return with_generators(build_cost_table(wl, cl, costs), wl, cl, costs)


def apart_only(table):
    """The table with the actor forced to generate on a generator set."""
    options = {
        k: [o for o in v if o.gen_apart or k[0] is not Role.ACTOR] for k, v in table.options.items()
    }
    return dataclasses.replace(table, options={k: v for k, v in options.items() if v})


def solve_all(table, cl, wl, **kwargs):
    kwargs.setdefault("tokens_per_step", 1.0)
    return solve(
        enumerate_placements(wl.roles),
        table,
        cl,
        kwargs.pop("objective", Objective.THROUGHPUT),
        one_step_off=wl.asynchronous,
        **kwargs,
    )


# --- options -------------------------------------------------------------------


def test_generator_options_hold_shard_and_kv_and_are_pareto(h100):
    cl, wl = cluster(2, 8), grpo()
    table = table_for(wl, cl, h100)
    assert table.generators
    for g in table.generators:
        assert g.num_gpus % g.tg == 0 and g.tg <= 8 and SMALL.supports_tp(g.tg)
        assert g.resident_bytes == pytest.approx(SMALL.num_bytes() / g.tg)
        assert g.resident_bytes + g.transient_bytes <= cl.pools[0].gpu.memory_bytes
        assert not any(o.dominates(g) for o in table.generators)
    apart = [o for opts in table.options.values() for o in opts if o.gen_apart]
    assert apart and all(o.role is Role.ACTOR and o.stage_s[0] == 0.0 for o in apart)


def test_generator_option_needs_room_for_one_sequence(h100):
    wl = grpo()
    pool = cluster(1, 8).pools[0]
    cm = h100["h100-sxm"]
    assert generator_option(wl, (pool, cm), pool, cm, 2, 1) is not None
    # The 1 GiB generation shard fills a 1 GiB device: no KV cache fits.
    tiny = cluster(1, 8, memory_gib=SMALL.num_bytes() / 2**30).pools[0]
    assert generator_option(wl, (tiny, cm), tiny, cm, 2, 1) is None


# --- constraints: feasible and infeasible ----------------------------------------


def test_generator_choice_feasible_and_infeasible(h100):
    """(9): a trainer option that leaves generation apart needs a generator option."""
    cl, wl = cluster(1, 8), grpo()
    forced = apart_only(table_for(wl, cl, h100))
    sol = solve_all(forced, cl, wl)
    assert sol.generator is not None and sol.options[Role.ACTOR].gen_apart
    with pytest.raises(Infeasible):
        solve_all(dataclasses.replace(forced, generators=()), cl, wl)


def test_generator_budget_feasible_and_infeasible(h100):
    """(4): the generator's devices count in the pool's budget."""
    cl, wl = cluster(1, 4), grpo()
    sol = solve_all(apart_only(table_for(wl, cl, h100)), cl, wl)
    assert sum(s.num_gpus for s in sol.sets) + sol.generator.num_gpus <= 4
    one = cluster(1, 1)  # training and generation apart need two devices at least
    with pytest.raises(Infeasible):
        solve_all(apart_only(table_for(wl, one, h100)), one, wl)


def test_generator_memory_feasible_and_infeasible(h100):
    """(10): the generator's shard and KV cache fit its devices."""
    cl, wl = cluster(1, 8), grpo()
    forced = apart_only(table_for(wl, cl, h100))
    assert solve_all(forced, cl, wl).status is Status.OPTIMAL
    capacity = cl.pools[0].gpu.memory_bytes
    over = tuple(
        dataclasses.replace(g, transient_bytes=capacity - g.resident_bytes + MIB)
        for g in forced.generators
    )
    with pytest.raises(Infeasible):
        solve_all(dataclasses.replace(forced, generators=over), cl, wl)


def test_generator_stage_sync_adds_and_one_step_off_overlaps(h100):
    """(7b) in synchronous steps, (8c) one step off: T against hand-computed stage sums."""
    cl = cluster(1, 8)
    for one_step_off in (False, True):
        wl = grpo(async_one_step_off=one_step_off)
        table = apart_only(table_for(wl, cl, h100))
        sol = solve_all(table, cl, wl)
        g = sol.generator
        sets = [(s.roles, s.num_gpus) for s in sol.sets]
        trainer = [
            sum(table.to_units(o.stage_s[k]) for o in sol.options.values()) for k in range(3)
        ]
        trainer[0] += table.to_units(g.sync_s)  # actor and ref share one set here
        if len(sets) == 1:
            expected = (
                max(sum(trainer), table.to_units(g.load_s))
                if one_step_off
                else max(trainer[0], table.to_units(g.load_s)) + trainer[1] + trainer[2]
            )
            assert table.to_units(sol.step_s) == expected
        value = objective_value((sets, sol.options, g), table, cl, one_step_off)
        assert sol.objective_value == value
    # A step that only overlapping reaches: feasible one step off, infeasible synchronously.
    wl_async = grpo(async_one_step_off=True)
    table = apart_only(table_for(wl_async, cl, h100))
    fast = solve_all(table, cl, wl_async)
    target = {"objective": Objective.GPUS, "tokens_per_step": 1.0}
    target["target_tokens_per_s"] = 1.0 / fast.step_s
    assert solve_all(table, cl, wl_async, **target).generator is not None
    with pytest.raises(Infeasible):
        solve_all(table, cl, grpo(), **target)


# --- plans, validator, search --------------------------------------------------------


def test_generator_plan_validates_and_round_trips(h100):
    cl, wl = cluster(2, 8), grpo()
    sol = solve_all(apart_only(table_for(wl, cl, h100)), cl, wl)
    plan = solution_to_plan(sol, wl, cl)
    gen_set = plan.generator_set()
    assert gen_set is not None and plan.sets[gen_set].num_devices == sol.generator.num_gpus
    assert plan.parallelism[Role.ACTOR].tg == sol.generator.tg
    assert "-gen-" in plan.name
    assert validate_plan(plan, h100) == []
    again = plan_from_dict(plan_to_dict(plan), "test", Path("."))
    assert again.content_hash() == plan.content_hash()


def test_validator_catches_generator_across_nodes_and_short_memory(h100):
    cl, wl = cluster(2, 4), grpo()
    par = solve_all(apart_only(table_for(wl, cl, h100)), cl, wl).options
    parallelism = {r: o.par for r, o in par.items()}
    trainer = DeviceSet(roles=(Role.ACTOR, Role.REF), pool="h100", first_device=0, num_devices=2)
    parallelism = {
        r: dataclasses.replace(
            p, train=dataclasses.replace(p.train, p=1, t=1, d=2), tg=2 if r is Role.ACTOR else 1
        )
        for r, p in parallelism.items()
    }
    across = DeviceSet(roles=(Role.ACTOR,), pool="h100", first_device=3, num_devices=2)
    across = dataclasses.replace(across, generator=True)
    plan = Plan(name="p", workload=wl, cluster=cl, sets=(trainer, across), parallelism=parallelism)
    assert any("spans nodes" in p for p in validate_plan(plan, h100))
    inside = dataclasses.replace(across, first_device=4)
    ok = Plan(name="p", workload=wl, cluster=cl, sets=(trainer, inside), parallelism=parallelism)
    assert validate_plan(ok, h100) == []
    small = cluster(2, 4, memory_gib=SMALL.num_bytes() / 2 / 2**30 + 0.001)
    short = dataclasses.replace(ok, cluster=small)
    assert any(
        p.startswith("memory:") and "phase generate" in p for p in validate_plan(short, h100)
    )


def test_planner_picks_generator_where_brute_force_says_it_is_best(h100):
    cl, wl = cluster(1, 8), grpo(async_one_step_off=True)
    table = truncated(table_for(wl, cl, h100))
    best, best_has_generator = brute_force(enumerate_placements(wl.roles), table, cl, True)
    assert best_has_generator and math.isfinite(best)
    sol = solve_all(table, cl, wl)
    assert sol.generator is not None and sol.objective_value == best
    result = plan_search(cl, wl, h100, time_limit_s=20)
    assert result.best.generator_gpus > 0
    assert any(p.name is Phase.WEIGHT_SYNC for p in result.best.estimate.phases)
    assert result.best.estimate.feasible and validate_plan(result.best.plan, h100) == []
    assert len(result.per_placement) == 2
    assert {pr.placement.kind for pr in result.per_placement} == {
        PlacementKind.COLOCATE,
        PlacementKind.STANDALONE,
    }


def test_generator_option_fields_are_consistent():
    g = GeneratorOption(
        trainer_pool="a",
        pool="a",
        num_gpus=2,
        tg=1,
        kv_seqs=4,
        gen_s=3.0,
        sync_s=1.0,
        resident_bytes=1.0,
        transient_bytes=1.0,
    )
    assert g.load_s == 4.0
    assert g.dominates(dataclasses.replace(g, num_gpus=4))
    assert not g.dominates(dataclasses.replace(g, num_gpus=4, sync_s=0.5))
