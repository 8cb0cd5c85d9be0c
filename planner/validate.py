"""An independent check of a plan, written without the solver's model.

It re-derives from the plan alone: device counts per pool within the
cluster, sets disjoint and inside their pools, divisibility (p·t·d equals the
set's devices, t divides the heads, p the layers, tg divides t, TP inside a
node) — through `Plan`'s own validation — and memory per device in every
phase from the plan's simulation (the simulator's memory model, not the
solver's linearised one). The caller passes the estimate it already made, so
a plan is simulated once.

A generator set apart (the actor generating on devices of its own) is checked
the same way — it counts in its pool, holds the actor alone, tg divides its
devices, its memory (generation shard and KV cache) fits — and also for what
`Plan` checks against the training set only: the generation TP groups (tg
consecutive ranks) stay within one node of the generator's own pool.
"""

from __future__ import annotations

from pathlib import Path

from placeflow.plan import Plan, plan_from_dict, plan_to_dict
from placeflow.profiles.costmodel import CostModel
from placeflow.simulator import StepEstimate, simulate
from placeflow.workload import Role


def validate_plan(
    plan: Plan,
    costs: CostModel | dict[str, CostModel] | None = None,
    *,
    estimate: StepEstimate | None = None,
) -> list[str]:
    """Problems found (empty when the plan is sound).

    Memory is read from `estimate` when given (the plan's own simulation);
    otherwise the plan is simulated with `costs`.
    """
    if estimate is None and costs is None:
        raise ValueError("validate_plan needs the plan's estimate or cost models to simulate it")
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
    problems.extend(_generator_problems(plan))
    if estimate is None:
        assert costs is not None
        estimate = simulate(plan, costs)
    if not estimate.feasible:
        problems.append(f"memory: {estimate.infeasible_reason}")
    return problems


def _generator_problems(plan: Plan) -> list[str]:
    """Generation TP groups of a generator set apart that leave one node of its pool."""
    gen_set = plan.generator_set()
    if gen_set is None:
        return []
    s, pool = plan.sets[gen_set], plan.pool_of(gen_set)
    tg = plan.parallelism[Role.ACTOR].tg
    problems = []
    for first in range(s.first_device, s.first_device + s.num_devices, tg):
        nodes = {d // pool.gpus_per_node for d in range(first, first + tg)}
        if len(nodes) > 1:
            problems.append(
                f"generator set ({s.num_devices} devices from {s.first_device}): generation "
                f"tensor group of devices {first}..{first + tg - 1} spans nodes {sorted(nodes)}"
            )
    return problems
