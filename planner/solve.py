"""Solving: a pure function from the model's inputs to a solution with an explicit status.

`solve` does not mutate its inputs, read globals or print. It returns a
`Solution` whose status is OPTIMAL or FEASIBLE (the time limit stopped the
search), or raises `Infeasible` (with the reason) or `SolverTimeout` (the
limit passed before any solution).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from ortools.sat.python import cp_model

from placeflow.cluster import ClusterSpec
from placeflow.errors import SpecError
from placeflow.planner.costtable import CostTable, RoleOption
from placeflow.planner.generators import GeneratorOption
from placeflow.planner.model import BuiltModel, Objective, build_model
from placeflow.planner.setfront import SetFronts
from placeflow.planner.space import Placement
from placeflow.workload import Role


class Status(StrEnum):
    OPTIMAL = "optimal"
    FEASIBLE = "feasible"
    INFEASIBLE = "infeasible"


class Infeasible(SpecError):
    """No plan satisfies the constraints; the message says why."""


class SolverTimeout(SpecError):
    """The time limit passed before the solver found any plan."""


@dataclass(frozen=True, kw_only=True)
class SetChoice:
    roles: tuple[Role, ...]
    pool: str
    num_gpus: int
    generator: bool = False  # the actor's generator set (DeviceSet.generator)


@dataclass(frozen=True, kw_only=True)
class Solution:
    status: Status
    placement: Placement
    sets: tuple[SetChoice, ...]
    options: dict[Role, RoleOption]
    generator: GeneratorOption | None  # the actor's generator set apart, if it has one
    step_s: float  # the model's stage-structured step time
    solve_s: float
    objective_value: int
    objective_bound: int  # proven lower bound (equals the value when optimal)


# CP-SAT settings. The set-option models are small (one option per set): probing and
# repeated presolve rounds cost more than they save there (about 2.5 times faster
# without, `benchmarks/planner_phases.py`). Which optimum a solve returns does not
# depend on them: the tie-break makes it unique (planner.model).
SOLVER_PARAMETERS: dict[str, int | bool] = {
    "cp_model_probing_level": 0,
    "max_presolve_iterations": 1,
}
# The tie-break's solves start from an optimal hint under one more constraint: their
# presolve costs more than their search.
TIE_BREAK_PARAMETERS = {**SOLVER_PARAMETERS, "cp_model_presolve": False}
# A tie-break chunk's mixed-radix span stays below this, so that its values are exact
# in the double-precision parts of the solver too.
MAX_TIE_BREAK_SPAN = 2**53


def solve(
    placements: list[Placement],
    table: CostTable,
    cluster: ClusterSpec,
    objective: Objective,
    *,
    tokens_per_step: float,
    target_tokens_per_s: float | None = None,
    time_limit_s: float = 30.0,
    num_workers: int = 1,  # the set-option models are small: one worker proves them fastest
    one_step_off: bool = False,
    fronts: SetFronts | None = None,
) -> Solution:
    """Solve over `placements`. `one_step_off`: the workload's asynchronous mode, in which
    a generator set overlaps training (constraint (8c)). `fronts`: the set options of
    `table` (`planner.setfront`), shared between the solves of one search.

    Two phases: the least objective, then, among the choices that reach it, the least
    tie-break (`planner.model`), so that the plan does not depend on the solver's
    search. A chunk of the tie-break cut short by the time limit keeps the best
    choice found: still optimal in the objective, but then not necessarily the
    canonical one among equals.
    """
    roles = {r for placement in placements for block in placement.sets for r in block}
    if roles - {key[0] for key in table.options}:
        raise Infeasible(infeasibility_reason(table, objective, target_tokens_per_s))
    built = build_model(
        placements,
        table,
        cluster,
        objective,
        tokens_per_step=tokens_per_step,
        target_tokens_per_s=target_tokens_per_s,
        one_step_off=one_step_off,
        fronts=fronts,
    )
    solver = _solver(time_limit_s, num_workers, SOLVER_PARAMETERS)
    code = solver.solve(built.model)
    if code == cp_model.INFEASIBLE:
        raise Infeasible(infeasibility_reason(table, objective, target_tokens_per_s))
    if code not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        if code == cp_model.MODEL_INVALID:
            raise AssertionError(built.model.validate())
        raise SolverTimeout(
            f"no plan found within the solver's limit of {time_limit_s:g} s of deterministic "
            "time; raise --time-limit"
        )
    value, bound = round(solver.objective_value), round(solver.best_objective_bound)
    spent_s, used_s = solver.deterministic_time, solver.wall_time
    final = solver
    if code == cp_model.OPTIMAL:
        built.model.add(built.objective <= value)
        for chunk in _tie_break_chunks(built.tie_break):
            built.model.clear_hints()
            for var in _decisions(built):
                built.model.add_hint(var, final.boolean_value(var))
            built.model.minimize(chunk)
            tie = _solver(max(time_limit_s - spent_s, 0.0), num_workers, TIE_BREAK_PARAMETERS)
            tie_code = tie.solve(built.model)
            spent_s, used_s = spent_s + tie.deterministic_time, used_s + tie.wall_time
            if tie_code not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
                break
            final = tie
            if tie_code != cp_model.OPTIMAL:
                break
            built.model.add(chunk <= round(tie.objective_value))
    return _solution(
        final,
        built,
        placements,
        table,
        status=Status.OPTIMAL if code == cp_model.OPTIMAL else Status.FEASIBLE,
        solve_s=used_s,
        objective_value=value,
        objective_bound=bound,
    )


def _solver(
    time_limit_s: float, num_workers: int, parameters: dict[str, int | bool]
) -> cp_model.CpSolver:
    solver = cp_model.CpSolver()
    # Deterministic time (CP-SAT's measure of work, about seconds of one core): the
    # same limit gives the same answer however loaded the machine is.
    solver.parameters.max_deterministic_time = time_limit_s
    solver.parameters.num_workers = num_workers
    for name, setting in parameters.items():
        setattr(solver.parameters, name, setting)
    return solver


def _decisions(built: BuiltModel) -> list[cp_model.IntVar]:
    v = built.variables
    return [*v.x.values(), *(var for _, var in v.set_terms()), *v.g.values()]


def _tie_break_chunks(
    groups: list[list[tuple[int, cp_model.IntVar]]],
) -> list[cp_model.LinearExpr]:
    """The tie-break S as mixed-radix sums over consecutive groups, each chunk's span
    (the product of its group sizes) below MAX_TIE_BREAK_SPAN; minimising the chunks
    one after the other, most significant first, minimises S."""
    chunks: list[list[list[tuple[int, cp_model.IntVar]]]] = []
    span = MAX_TIE_BREAK_SPAN
    for group in groups:
        if span * len(group) > MAX_TIE_BREAK_SPAN:
            chunks.append([])
            span = 1
        chunks[-1].append(group)
        span *= len(group)
    exprs = []
    for chunk in chunks:
        variables, coeffs, weight = [], [], 1
        for group in reversed(chunk):
            variables += [var for _, var in group]
            coeffs += [rank * weight for rank, _ in group]
            weight *= len(group)
        exprs.append(cp_model.LinearExpr.weighted_sum(variables, coeffs))
    return exprs


def _solution(
    solver: cp_model.CpSolver,
    built: BuiltModel,
    placements: list[Placement],
    table: CostTable,
    *,
    status: Status,
    solve_s: float,
    objective_value: int,
    objective_bound: int,
) -> Solution:
    v = built.variables
    p = next(i for i, var in v.x.items() if solver.boolean_value(var))
    placement = placements[p]
    chosen = [
        next(f for f, var in v.y[(p, j)] if solver.boolean_value(var))
        for j in range(len(placement.sets))
    ]
    sets = tuple(SetChoice(roles=f.roles, pool=f.pool, num_gpus=f.num_gpus) for f in chosen)
    options = {role: opt for f in chosen for role, opt in zip(f.roles, f.options, strict=True)}
    generator = next((u for u, var in v.generator_terms(table) if solver.boolean_value(var)), None)
    return Solution(
        status=status,
        placement=placement,
        sets=sets,
        options=options,
        generator=generator,
        step_s=solver.value(built.step) * table.time_unit_s,
        solve_s=solve_s,
        objective_value=objective_value,
        objective_bound=objective_bound,
    )


def infeasibility_reason(
    table: CostTable, objective: Objective, target_tokens_per_s: float | None
) -> str:
    """The telling reason: a role that fits nowhere, else memory together, else the target."""
    roles_with_options = {k[0] for k in table.options}
    for role, (short, where) in sorted(table.shortfall.items(), key=lambda kv: kv[1][0]):
        if role not in roles_with_options:
            return (
                f"role {role} fits on no candidate device count: its smallest memory "
                f"shortfall is {short / 2**30:.2f} GiB per GPU ({where}); "
                "use more or larger GPUs"
            )
    if objective is Objective.GPUS:
        return (
            f"no plan within the cluster reaches {target_tokens_per_s:g} tokens/s; "
            "lower the target or add GPUs"
        )
    # Each role fits alone somewhere; say how many devices each needs at least.
    least = {
        role: min(n for (r, _, n) in table.options if r == role) for role in roles_with_options
    }
    need = ", ".join(f"{role} {n}" for role, n in sorted(least.items()))
    return (
        "the roles do not fit the cluster together: alone, each needs at least this many "
        f"devices to fit in memory: {need} ({sum(least.values())} if every role is placed apart); "
        "colocating them adds up their memory per device. Add GPUs or use smaller models"
    )
