"""Stage structure: the step time the objective minimises.

    (6)  load[P,j,k]                       load of set j in stage k (planner.variables)
    (7)  M_k >= load[P,j,k]                for every P, j, k
    (7b) M_k >= the generator set's load   (planner.constraints.generator_stage;
         for one-step-off asynchronous steps (8c) there replaces (7b) and (8))
    (8)  T = Σ_k M_k

(7) needs no enforcement literal: the sets of a placement not chosen have
y = 0 by (2), so their loads are 0 but for the weight sync term of the actor's
set, Σ_u s_u·g[u], which the chosen placement's actor set carries too.

Stages are generation, forward calls and updates (planner.costtable): calls on
one set add up, sets run in parallel within a stage, stages add up. Times are
integers in the cost table's time unit (`CostTable.time_unit_s`). The load of
the actor's set includes the weight sync to a generator set, when it has one.
"""

from __future__ import annotations

from ortools.sat.python import cp_model

from placeflow.planner.constraints.generator_stage import (
    add_generator_overlap,
    add_generator_stage,
)
from placeflow.planner.costtable import NUM_STAGES
from placeflow.planner.space import Placement
from placeflow.planner.variables import Variables


def add_stages(
    model: cp_model.CpModel,
    v: Variables,
    placements: list[Placement],
    horizon: int,
    *,
    one_step_off: bool = False,
) -> cp_model.IntVar:
    """Adds (6)-(8) and (7b) (or (8c) for one-step-off steps), and returns T."""
    stage_max = [model.new_int_var(0, horizon, f"M[{k}]") for k in range(NUM_STAGES)]
    for p, placement in enumerate(placements):
        for j in range(len(placement.sets)):
            for k in range(NUM_STAGES):
                load = v.load[(p, j, k)]  # (6)
                model.add(stage_max[k] >= load)  # (7)
    total = model.new_int_var(0, NUM_STAGES * horizon, "T")
    if one_step_off:
        add_generator_overlap(model, v, stage_max, total)  # (8c)
        return total
    add_generator_stage(model, v, stage_max)  # (7b)
    model.add(total == sum(stage_max))  # (8)
    return total
