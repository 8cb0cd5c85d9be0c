"""An independent check of a plan, written without the solver's model.

It re-derives from the plan alone: device counts per pool within the
cluster, sets disjoint and inside their pools, divisibility (p·t·d equals the
set's devices, t divides the heads, p the layers, tg divides t, TP inside a
node) — through `Plan`'s own validation — and memory per device in every
phase through the simulator's memory model.
"""

from __future__ import annotations

from pathlib import Path

from placeflow.plan import Plan, plan_from_dict, plan_to_dict
from placeflow.profiles.costmodel import CostModel
from placeflow.simulator import simulate


def validate_plan(plan: Plan, costs: CostModel | dict[str, CostModel]) -> list[str]:
    """Problems found (empty when the plan is sound)."""
    problems = []
    for pool in plan.cluster.pools:
        used = sum(s.num_devices for s in plan.sets if s.pool == pool.name)
        if used > pool.num_gpus:
            problems.append(f"pool {pool.name!r}: {used} devices used of {pool.num_gpus}")
    try:
        # Rebuilding from the plan's TOML table re-runs every divisibility and layout check.
        plan_from_dict(plan_to_dict(plan), "validator", Path("."))
    except ValueError as exc:
        problems.append(str(exc))
        return problems
    estimate = simulate(plan, costs)
    if not estimate.feasible:
        problems.append(f"memory: {estimate.infeasible_reason}")
    return problems
