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
    return BuiltModel(model=model, variables=v, step=step, objective=goal)
