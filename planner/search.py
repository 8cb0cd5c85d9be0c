"""plan_search: the planner end to end.

1. Cost table of every role's options (`costtable`), with the actor's
   generator-set options (`generators`): each placement's best plan may or may
   not give the actor a generator set apart.
2. One CP-SAT solve per placement over the set options (`setfront`, shared by
   all placements): the per-placement table. The optimum over all placements
   is the least of the per-placement optima, so no solve over all placements
   is needed, and the search is proven optimal exactly when every row is
   (proven optimal, or proven infeasible with a reason about the workload).
   Each solve returns the canonical plan among those its model finds equally
   good (`planner.model`'s tie-break), so a row's plan does not depend on the
   solver's settings or search.
3. Each resulting plan is checked by the independent validator and re-scored
   by the full simulator; plans are ranked by the objective on the simulator's
   numbers.
4. Staleness (workload max_staleness = B >= 2, a plan with a generator set):
   the stage model cannot see what a deeper buffer of rollouts buys (it prices
   expected step costs, and with them any staleness >= 1 runs at the longer of
   generation and training), so each row's plan is simulated at every staleness
   1..B, whose unrolled schedule draws each step's generation from the length
   distribution and books the trainer's weight snapshots. The plan keeps the
   least staleness whose throughput is within `STALENESS_TOLERANCE` of the best
   feasible one: every extra update of lag costs the learner, so it is taken
   only where it pays.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass

from placeflow.cluster import ClusterSpec
from placeflow.executable import executable_problems
from placeflow.plan import Plan
from placeflow.planner.costtable import CostTable, build_cost_table
from placeflow.planner.generators import with_generators
from placeflow.planner.model import Objective
from placeflow.planner.setfront import SetFronts
from placeflow.planner.solution import solution_to_plan
from placeflow.planner.solve import (
    Infeasible,
    Solution,
    SolverTimeout,
    Status,
    infeasibility_reason,
    solve,
)
from placeflow.planner.space import Placement, PlacementKind, enumerate_placements
from placeflow.planner.validate import validate_plan
from placeflow.profiles.costmodel import CostModel
from placeflow.simulator import StepEstimate, simulate
from placeflow.workload import Workload

TABLE_SHARE = 0.4  # of the time limit, at most, for the cost table
SOLVE_SHARE = 0.9  # by then the per-placement solves should be done
MIN_ROW_S = 5.0  # every placement's solve gets at least this long, even past SOLVE_SHARE
STALENESS_TOLERANCE = 0.01  # a deeper buffer must buy more than this share of tokens/s


@dataclass(frozen=True, kw_only=True)
class RankedPlan:
    plan: Plan
    kind: PlacementKind
    estimate: StepEstimate
    model_step_s: float  # the solver's stage-structured estimate
    price_per_mtoken: float | None  # USD per million tokens, when prices are known
    # Why `placeflow run` would refuse the plan (placeflow.executable); empty: it runs it.
    executor_problems: tuple[str, ...] = ()

    @property
    def generator_gpus(self) -> int:
        """Devices of the actor's generator set apart from its training set; 0 if colocated."""
        gen_set = self.plan.generator_set()
        return 0 if gen_set is None else self.plan.sets[gen_set].num_devices


@dataclass(frozen=True, kw_only=True)
class PlacementResult:
    placement: Placement
    status: Status  # optimal or feasible with a plan, infeasible (or feasible) without
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


def least_staleness(
    plan: Plan, costs: dict[str, CostModel], estimate: StepEstimate | None = None
) -> tuple[Plan, StepEstimate]:
    """`plan` at the least staleness (1..its workload's max_staleness) whose simulated
    tokens/s is within STALENESS_TOLERANCE of the best feasible one, and its estimate
    (module docstring, 4). Plans that cannot run asynchronously come back as they are."""
    wl = plan.workload
    estimate = estimate if estimate is not None else simulate(plan, costs)
    if wl.max_staleness < 2 or plan.generator_set() is None:
        return plan, estimate
    options = [(wl.max_staleness, plan, estimate)]
    for k in range(1, wl.max_staleness):
        p = dataclasses.replace(plan, workload=dataclasses.replace(wl, max_staleness=k))
        options.append((k, p, simulate(p, costs)))
    feasible = [o for o in options if o[2].feasible]
    if not feasible:
        return plan, estimate
    best = max(o[2].tokens_per_s for o in feasible)
    _, chosen, est = min(
        (o for o in feasible if o[2].tokens_per_s >= (1 - STALENESS_TOLERANCE) * best),
        key=lambda o: o[0],
    )
    return chosen, est


def _rank(plan: Plan, solution: Solution, costs: dict[str, CostModel]) -> RankedPlan:
    plan, estimate = least_staleness(plan, costs)
    problems = validate_plan(plan, estimate=estimate)
    assert not problems, f"the solver returned a plan the validator rejects: {problems}"
    return RankedPlan(
        plan=plan,
        kind=solution.placement.kind,
        estimate=estimate,
        model_step_s=solution.step_s,
        price_per_mtoken=_price_per_mtoken(plan, estimate),
        executor_problems=tuple(executable_problems(plan)),
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

    The time limit is CPU time of this process, not wall time, so that the load
    of a shared machine slows the search but does not change its result: the
    cost table gets at most TABLE_SHARE of it (coarse to fine, see
    `build_cost_table`), the per-placement solves share what is left up to
    SOLVE_SHARE, each at least MIN_ROW_S of CP-SAT's deterministic time (so
    that no row is lost to the clock; a row cut short keeps its best plan with
    status feasible). The status is optimal only when the table is complete and every
    row is proven (optimal, or infeasible for a reason about the workload).
    """
    start, wall_start = time.process_time(), time.perf_counter()
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
    if not table.options:
        raise Infeasible(infeasibility_reason(table, objective, target_tokens_per_s))
    fronts = SetFronts(table, cluster)
    solve_deadline = start + SOLVE_SHARE * time_limit_s
    results: list[PlacementResult] = []
    solutions: list[Solution] = []
    for i, placement in enumerate(placements):
        if progress:
            progress(i, len(placements))
        left = (solve_deadline - time.process_time()) / (len(placements) - i)
        row, sol = _solve_row(
            placement,
            table,
            fronts,
            cluster,
            workload,
            costs,
            objective=objective,
            target_tokens_per_s=target_tokens_per_s,
            time_limit_s=max(MIN_ROW_S, left),
        )
        results.append(row)
        if sol is not None:
            solutions.append(sol)
    if progress:
        progress(len(placements), len(placements))
    if not solutions:
        timed_out = [r for r in results if r.status is Status.FEASIBLE]
        if timed_out:
            raise SolverTimeout(timed_out[0].reason or "")
        raise Infeasible(infeasibility_reason(table, objective, target_tokens_per_s))
    proven = table.complete and all(r.status is not Status.FEASIBLE for r in results)
    candidates = [r.best for r in results if r.best is not None]
    unique = {c.plan.content_hash(): c for c in candidates}
    ranked = sorted(unique.values(), key=_sort_key(objective, target_tokens_per_s))
    return PlannerResult(
        status=Status.OPTIMAL if proven else Status.FEASIBLE,
        objective=objective,
        solve_s=time.perf_counter() - wall_start,
        best=ranked[0],
        ranked=tuple(ranked[:top_k]),
        per_placement=tuple(results),
    )


def _solve_row(
    placement: Placement,
    table: CostTable,
    fronts: SetFronts,
    cluster: ClusterSpec,
    workload: Workload,
    costs: dict[str, CostModel],
    *,
    objective: Objective,
    target_tokens_per_s: float | None,
    time_limit_s: float,
) -> tuple[PlacementResult, Solution | None]:
    """One placement's row: its best plan and status, or why it has none."""
    try:
        sol = solve(
            [placement],
            table,
            cluster,
            objective,
            tokens_per_step=float(workload.batch.tokens_per_step),
            target_tokens_per_s=target_tokens_per_s,
            time_limit_s=time_limit_s,
            one_step_off=workload.asynchronous,
            fronts=fronts,
        )
    except Infeasible as exc:
        if not table.complete:  # not proven: a count the table skipped might fit
            reason = f"no plan among the GPU counts costed within the time limit: {exc}"
            row = PlacementResult(
                placement=placement, status=Status.FEASIBLE, best=None, reason=reason
            )
        else:
            row = PlacementResult(
                placement=placement, status=Status.INFEASIBLE, best=None, reason=str(exc)
            )
        return row, None
    except SolverTimeout as exc:
        row = PlacementResult(
            placement=placement, status=Status.FEASIBLE, best=None, reason=str(exc)
        )
        return row, None
    scored = _rank(solution_to_plan(sol, workload, cluster), sol, costs)
    return PlacementResult(placement=placement, status=sol.status, best=scored, reason=None), sol
