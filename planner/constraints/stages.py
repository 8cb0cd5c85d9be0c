"""Stage structure: the step time the objective minimises.

    (6)  L[P,j,k] = Σ_{r ∈ S_{P,j}} stage_t[r,k]                  load of set j in stage k
    (7)  M_k >= L[P,j,k]                   for every P, j, k, enforced only if x[P]
    (7b) M_k >= the generator set's load   (planner.constraints.generator_stage;
         for one-step-off asynchronous steps (8c) there replaces (7b) and (8))
    (8)  T = Σ_k M_k

Stages are generation, forward calls and updates (planner.costtable): calls on
one set add up, sets run in parallel within a stage, stages add up. Times are
integers in the cost table's time unit (`CostTable.time_unit_s`). The actor's
stage_t includes the weight sync to a generator set, when it has one.
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
        for roles_in_set in placement.sets:
            for k in range(NUM_STAGES):
                load = sum(v.stage_t[(r, k)] for r in roles_in_set)  # (6)
                model.add(stage_max[k] >= load).only_enforce_if(v.x[p])  # (7)
    total = model.new_int_var(0, NUM_STAGES * horizon, "T")
    if one_step_off:
        add_generator_overlap(model, v, stage_max, total)  # (8c)
        return total
    add_generator_stage(model, v, stage_max)  # (7b)
    model.add(total == sum(stage_max))  # (8)
    return total
