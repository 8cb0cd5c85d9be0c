"""The CP-SAT model: variables, the constraint families, and one of three objectives.

Notation as in `planner.variables`; constraints (1)-(10) in `planner.constraints`,
(3) (one option per role) and (5) (memory) in the set options (`planner.setfront`).

Objectives, with T the step time in the table's time unit (8), W the tokens of one step,
N_q = Σ_{P,j,f : q_f = q} n_f·y[P,j,f] + Σ_{u : q'_u = q} m_u·g[u] the GPUs used in pool q
(generator set included), N = Σ_q N_q and R = Σ_q price_q · N_q the price per hour
of the GPUs used (in hundredths of a cent):

- throughput: minimise T·(N_max + 1) + N  (the fastest plan; among equally fast
  ones, the fewest GPUs)
- cost:       minimise R·T                 (price per token = R·T / W; W is fixed)
- gpus:       minimise N·(T_max + 1) + T  subject to  T <= W / target_tokens_per_s
              (the fewest GPUs; among plans with as few, the fastest; T_max the
              largest step the model allows, three times its stage horizon)

Ties. Times are whole units, so several choices often reach the same optimum;
which one a solver returns would depend on its search (its parameters, its
version). The plan is made unique by a second, lexicographic objective over
the choices' canonical ranks (`tie_break_groups`), minimised among the optima
(`planner.solve`). Groups, most significant first: the placement (x[P], by its
index), each set (y[P, j, ·], by the key κ(f) = (Σ_k L_k(f), n_f, L_0(f),
L_1(f), L_2(f), A(f), q_f)) and the generator (g[·], by (m_u, load_u, s_u,
tg_u, q'_u, q_u)). Each group's chosen element has the rank r_i of its key
(0 when the group chooses nothing), and the tie-break value is the mixed-radix
number

    S = Σ_i r_i · Π_{i' > i} |group i'|

which differs between any two choices, so the least S among the optima is one
plan. κ is monotone in dominance (an option no worse in every load and in
devices has a key no greater), so the canonical plan is also the least one
among choices the set fronts pruned.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from ortools.sat.python import cp_model

from placeflow.cluster import ClusterSpec
from placeflow.errors import SpecError
from placeflow.planner.constraints.generator import add_generator_choice
from placeflow.planner.constraints.generator_memory import add_generator_memory
from placeflow.planner.constraints.gpus import add_gpu_budget, gpus_used
from placeflow.planner.constraints.stages import add_stages
from placeflow.planner.constraints.structure import add_structure
from placeflow.planner.costtable import NUM_STAGES, CostTable
from placeflow.planner.setfront import SetFronts
from placeflow.planner.space import Placement
from placeflow.planner.variables import Variables, make_variables


class Objective(StrEnum):
    THROUGHPUT = "throughput"
    COST = "cost"
    GPUS = "gpus"


@dataclass
class BuiltModel:
    model: cp_model.CpModel
    variables: Variables
    step: cp_model.IntVar
    objective: cp_model.LinearExprT
    # The tie-break's groups, most significant first: (rank, variable) pairs.
    tie_break: list[list[tuple[int, cp_model.IntVar]]]


def _ranked(
    keyed: list[tuple[tuple[object, ...], cp_model.IntVar]],
) -> list[tuple[int, cp_model.IntVar]]:
    """Each variable with the rank of its key among the group's (keys are distinct)."""
    order = sorted(range(len(keyed)), key=lambda i: keyed[i][0])
    rank = {i: r for r, i in enumerate(order)}
    return [(rank[i], var) for i, (_, var) in enumerate(keyed)]


def tie_break_groups(v: Variables, table: CostTable) -> list[list[tuple[int, cp_model.IntVar]]]:
    """The tie-break's groups (see the module docstring), most significant first; groups
    of one element (rank 0 whatever the choice) are left out."""
    groups = [[(p, var) for p, var in v.x.items()]]
    for key in sorted(v.y):
        groups.append(
            _ranked(
                [
                    ((sum(f.stage_units), f.num_gpus, *f.stage_units, f.gen_apart, f.pool), var)
                    for f, var in v.y[key]
                ]
            )
        )
    groups.append(
        _ranked(
            [
                ((u.num_gpus, u.load_s, u.sync_s, u.tg, u.pool, u.trainer_pool), var)
                for u, var in v.generator_terms(table)
            ]
        )
    )
    return [g for g in groups if len(g) > 1]


def build_model(
    placements: list[Placement],
    table: CostTable,
    cluster: ClusterSpec,
    objective: Objective,
    *,
    tokens_per_step: float,
    target_tokens_per_s: float | None = None,
    one_step_off: bool = False,
    fronts: SetFronts | None = None,
) -> BuiltModel:
    """The model over `placements`; `fronts` (the set options) may be shared between calls."""
    model = cp_model.CpModel()
    pools = [p.name for p in cluster.pools]
    v = make_variables(model, placements, table, cluster, fronts or SetFronts(table, cluster))
    add_structure(model, v)
    add_gpu_budget(model, v, table, cluster)
    add_generator_choice(model, v, table, cluster)
    add_generator_memory(model, v, table, cluster)
    # No stage exceeds the longest set load; the generator's sync adds to the actor's
    # set and its load is one more set.
    horizon = (
        max((max(f.stage_units) for f, _ in v.set_terms()), default=0)
        + 2 * max((table.to_units(u.load_s) for u in table.generators), default=0)
        + 1
    )
    step = add_stages(model, v, placements, horizon, one_step_off=one_step_off)
    gpus = cp_model.LinearExpr.sum([gpus_used(v, table, q) for q in pools])
    goal: cp_model.LinearExprT
    if objective is Objective.THROUGHPUT:
        goal = step * (cluster.num_gpus + 1) + gpus
    elif objective is Objective.COST:
        prices = {p.name: p.price_per_gpu_hour for p in cluster.pools}
        missing = [q for q, price in prices.items() if price is None]
        if missing:
            raise SpecError(
                f"objective cost needs price_per_gpu_hour for every pool; missing for {missing}"
            )
        rate = model.new_int_var(0, 10**12, "R")
        cents = [round((prices[q] or 0.0) * 10**4) for q in pools]
        model.add(
            rate == cp_model.LinearExpr.weighted_sum([gpus_used(v, table, q) for q in pools], cents)
        )
        cost = model.new_int_var(0, 10**18, "RT")
        model.add_multiplication_equality(cost, [rate, step])
        goal = cost
    else:
        if not target_tokens_per_s or target_tokens_per_s <= 0:
            raise SpecError("objective gpus needs --target-tokens-per-s, a positive number")
        model.add(step <= table.to_units(tokens_per_step / target_tokens_per_s))
        goal = gpus * (NUM_STAGES * horizon + 1) + step
    model.minimize(goal)
    return BuiltModel(
        model=model,
        variables=v,
        step=step,
        objective=goal,
        tie_break=tie_break_groups(v, table),
    )
