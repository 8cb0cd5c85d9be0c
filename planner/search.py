"""plan_search: the planner end to end.

1. Cost table of every role's options (`costtable`), with the actor's
   generator-set options (`generators`): each placement's best plan may or may
   not give the actor a generator set apart.
2. CP-SAT over all placements for the optimum (`solve`), and once per
   placement for the per-placement table.
3. Each resulting plan is checked by the independent validator and re-scored
   by the full simulator; plans are ranked by the objective on the simulator's
   numbers.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from placeflow.cluster import ClusterSpec
from placeflow.plan import Plan
from placeflow.planner.costtable import build_cost_table
from placeflow.planner.generators import with_generators
from placeflow.planner.model import Objective
from placeflow.planner.solution import solution_to_plan
from placeflow.planner.solve import Infeasible, Solution, SolverTimeout, Status, solve
from placeflow.planner.space import Placement, PlacementKind, enumerate_placements
from placeflow.planner.validate import validate_plan
from placeflow.profiles.costmodel import CostModel
from placeflow.simulator import StepEstimate, simulate
from placeflow.workload import Workload

TABLE_SHARE = 0.4  # of the time limit, at most, for the cost table
SOLVE_SHARE = 0.8  # by then the per-placement solves stop
RESCORE_SHARE = 0.1  # kept for re-scoring the global solution with the simulator


@dataclass(frozen=True, kw_only=True)
class RankedPlan:
    plan: Plan
    kind: PlacementKind
    estimate: StepEstimate
    model_step_s: float  # the solver's stage-structured estimate
    price_per_mtoken: float | None  # USD per million tokens, when prices are known

    @property
    def generator_gpus(self) -> int:
        """Devices of the actor's generator set apart from its training set; 0 if colocated."""
        gen_set = self.plan.generator_set()
        return 0 if gen_set is None else self.plan.sets[gen_set].num_devices


@dataclass(frozen=True, kw_only=True)
class PlacementResult:
    placement: Placement
    best: RankedPlan | None
    reason: str | None  # why no plan, when best is None


@dataclass(frozen=True, kw_only=True)
class PlannerResult:
    status: Status
    objective: Objective
    solve_s: float
    best: RankedPlan
    ranked: tuple[RankedPlan, ...]
    per_placement: tuple[PlacementResult, ...]


def _price_per_mtoken(plan: Plan, estimate: StepEstimate) -> float | None:
    usd_per_hour = 0.0
    for s in plan.sets:
        price = plan.pool_of(plan.sets.index(s)).price_per_gpu_hour
        if price is None or not estimate.tokens_per_s:
            return None
        usd_per_hour += price * s.num_devices
    return usd_per_hour / 3600 / estimate.tokens_per_s * 1e6


def _rank(plan: Plan, solution: Solution, costs: dict[str, CostModel]) -> RankedPlan:
    problems = validate_plan(plan, costs)
    assert not problems, f"the solver returned a plan the validator rejects: {problems}"
    estimate = simulate(plan, costs)
    return RankedPlan(
        plan=plan,
        kind=solution.placement.kind,
        estimate=estimate,
        model_step_s=solution.step_s,
        price_per_mtoken=_price_per_mtoken(plan, estimate),
    )


def _sort_key(objective: Objective, target: float | None) -> Callable[[RankedPlan], tuple]:
    def key(r: RankedPlan) -> tuple:
        tps = r.estimate.tokens_per_s
        if objective is Objective.COST:
            return (r.price_per_mtoken if r.price_per_mtoken is not None else float("inf"), -tps)
        if objective is Objective.GPUS:
            return (tps < (target or 0), r.plan.num_gpus, -tps)
        return (-tps, r.plan.num_gpus)

    return key


def plan_search(
    cluster: ClusterSpec,
    workload: Workload,
    costs: dict[str, CostModel],
    *,
    objective: Objective = Objective.THROUGHPUT,
    target_tokens_per_s: float | None = None,
    time_limit_s: float = 60.0,
    top_k: int = 5,
    progress: Callable[[int, int], None] | None = None,
    table_progress: Callable[[int, int], None] | None = None,
) -> PlannerResult:
    """Search placements, GPU counts and parallelism; raises Infeasible or SolverTimeout.

    The time limit covers the whole search: the cost table gets at most
    TABLE_SHARE of it (coarse to fine, see `build_cost_table`), the per-placement
    solves what is left up to SOLVE_SHARE, the seeded global solve and the
    re-scoring the rest. A search cut short by the limit reports status feasible.
    """
    start = time.perf_counter()
    table = with_generators(
        build_cost_table(
            workload,
            cluster,
            costs,
            deadline=start + TABLE_SHARE * time_limit_s,
            progress=table_progress,
        ),
        workload,
        cluster,
        costs,
        deadline=start + TABLE_SHARE * time_limit_s,
    )
    placements = enumerate_placements(workload.roles)
    tokens = float(workload.batch.tokens_per_step)
    solve_deadline = start + SOLVE_SHARE * time_limit_s
    remaining = solve_deadline - time.perf_counter()
    per_limit = max(0.2, remaining / len(placements))
    results: list[PlacementResult] = []
    solutions: list[Solution] = []
    bounds_known = True
    for i, placement in enumerate(placements):
        if progress:
            progress(i, len(placements))
        if i and time.perf_counter() + per_limit > solve_deadline:
            bounds_known = False
            reason = f"not solved: the time limit of {time_limit_s:g} s ran out; raise --time-limit"
            results.append(PlacementResult(placement=placement, best=None, reason=reason))
            continue
        try:
            sol = solve(
                [placement],
                table,
                cluster,
                objective,
                tokens_per_step=tokens,
                target_tokens_per_s=target_tokens_per_s,
                time_limit_s=per_limit,
                one_step_off=workload.async_one_step_off,
            )
        except Infeasible as exc:
            results.append(PlacementResult(placement=placement, best=None, reason=str(exc)))
            continue
        except SolverTimeout as exc:
            bounds_known = False
            results.append(PlacementResult(placement=placement, best=None, reason=str(exc)))
            continue
        solutions.append(sol)
        scored = _rank(solution_to_plan(sol, workload, cluster), sol, costs)
        results.append(PlacementResult(placement=placement, best=scored, reason=None))
    if progress:
        progress(len(placements), len(placements))
    # The whole model chooses the placement. Seeded with the best per-placement solution
    # and bounded below by the least per-placement bound (exact: the optimum over all
    # placements is the least of the per-placement optima), it closes the gap at once.
    seed = min(solutions, key=lambda s: s.objective_value, default=None)
    try:
        overall: Solution | None = solve(
            placements,
            table,
            cluster,
            objective,
            time_limit_s=max(
                0.2, (1 - RESCORE_SHARE) * time_limit_s - (time.perf_counter() - start)
            ),
            hint=seed,
            lower_bound=min(s.objective_bound for s in solutions)
            if seed and bounds_known
            else None,
            tokens_per_step=tokens,
            target_tokens_per_s=target_tokens_per_s,
            one_step_off=workload.async_one_step_off,
        )
    except SolverTimeout:
        if seed is None:
            raise
        overall = None  # out of time: the per-placement plans found are the answer
    status = overall.status if overall is not None else Status.FEASIBLE
    if not table.complete or any(s.status is Status.FEASIBLE for s in solutions):
        status = Status.FEASIBLE
    candidates = [r.best for r in results if r.best is not None]
    if overall is not None:
        candidates.insert(0, _rank(solution_to_plan(overall, workload, cluster), overall, costs))
    unique = {c.plan.content_hash(): c for c in candidates}
    ranked = sorted(unique.values(), key=_sort_key(objective, target_tokens_per_s))
    return PlannerResult(
        status=status,
        objective=objective,
        solve_s=time.perf_counter() - start,
        best=ranked[0],
        ranked=tuple(ranked[:top_k]),
        per_placement=tuple(results),
    )
