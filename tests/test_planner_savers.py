"""The memory savers in the search space: recomputation and optimizer offload per role.

Oracle: the same solve over the same table with the saver's options removed. Where
the planner picks a saver, the plan without it must be slower (or impossible); the
plan TOML records the choice.
"""

import dataclasses
from pathlib import Path

import pytest
from test_planner import PPO_ROLES, cluster, workload

from placeflow.catalogue import CATALOGUE
from placeflow.plan import plan_from_dict, plan_to_dict
from placeflow.planner import Infeasible, Objective
from placeflow.planner.costtable import CostTable, build_cost_table
from placeflow.planner.solution import solution_to_plan
from placeflow.planner.solve import solve
from placeflow.planner.space import enumerate_placements, parallelism_options
from placeflow.planner.validate import validate_plan
from placeflow.profiles.registry import fitted_cost_model
from placeflow.workload import Role


@pytest.fixture(scope="module")
def h100():
    return {"h100-sxm": fitted_cost_model("h100-sxm")}


def without(table: CostTable, saver) -> CostTable:
    options = {k: [o for o in opts if not saver(o)] for k, opts in table.options.items()}
    return dataclasses.replace(table, options={k: v for k, v in options.items() if v})


def best(table, cl, wl):
    return solve(
        enumerate_placements(wl.roles), table, cl, Objective.THROUGHPUT, tokens_per_step=1.0
    )


def test_savers_are_offered_to_trained_roles_only():
    pool = cluster(1, 8).pools[0]
    model = CATALOGUE["llama-2-7b"]
    actor = parallelism_options(model, Role.ACTOR, 8, pool)
    assert {(p.recompute, p.offload_optimizer) for p in actor} == {
        (True, False),
        (True, True),
        (False, False),
        (False, True),
    }
    ref = parallelism_options(model, Role.REF, 8, pool)
    assert {(p.recompute, p.offload_optimizer) for p in ref} == {(False, False)}


def test_offload_chosen_where_it_wins_and_recorded_in_the_plan(h100):
    # Four 13B models on 8 x 40 GiB: the Adam state does not fit beside the rest.
    wl = workload({r: CATALOGUE["llama-2-13b"] for r in PPO_ROLES})
    cl = cluster(1, 8, memory_gib=40.0)
    table = build_cost_table(wl, cl, h100)
    sol = best(table, cl, wl)
    assert any(o.par.offload_optimizer for o in sol.options.values())
    try:
        plain = best(without(table, lambda o: o.par.offload_optimizer), cl, wl)
        assert plain.objective_value > sol.objective_value
    except Infeasible:
        pass  # without offload nothing fits at all
    plan = solution_to_plan(sol, wl, cl)
    assert validate_plan(plan, h100) == []
    again = plan_from_dict(plan_to_dict(plan), "t", Path("."))
    assert again.parallelism == plan.parallelism


def test_recompute_off_chosen_where_memory_allows(h100):
    wl = workload({r: CATALOGUE["qwen2.5-0.5b"] for r in PPO_ROLES})
    cl = cluster(1, 8)
    table = build_cost_table(wl, cl, h100)
    sol = best(table, cl, wl)
    assert not sol.options[Role.ACTOR].par.recompute
    always = best(
        without(table, lambda o: not o.par.recompute and o.role in (Role.ACTOR, Role.CRITIC)),
        cl,
        wl,
    )
    assert always.objective_value > sol.objective_value
