"""Generator stage: the generator set is a set of its own in the stage structure.

Synchronous steps (the default):

    (7b)  M_k >= gen_t[k]                                     for every k

Asynchronous one-step-off steps (workload `async_one_step_off`): generation of
step k+1 overlaps training of step k, so in the steady state the generator set
and the training sets run side by side and the step takes the longer of the two:

    (8c)  T = max(Σ_k M_k, gen_t[0])                  in place of (7b) and (8)

with gen_t[0] = Σ_u (s_u + e_u)·g[u] (weight sync, then generation) and
gen_t[k] = 0 for the later stages (planner.variables). The sync also keeps the
actor's training set busy; that is in stage_t[actor, 0] and so in (6).
Sets run in parallel within a stage, so the generator's load enters the
stage's maximum, not a sum. A plan without a generator set runs synchronously
in either mode (the simulator's rule), and then gen_t = 0.
"""

from __future__ import annotations

from collections.abc import Sequence

from ortools.sat.python import cp_model

from placeflow.planner.variables import Variables


def add_generator_stage(
    model: cp_model.CpModel, v: Variables, stage_max: Sequence[cp_model.IntVar]
) -> None:
    for k, load in enumerate(v.gen_t):
        model.add(stage_max[k] >= load)  # (7b)


def add_generator_overlap(
    model: cp_model.CpModel,
    v: Variables,
    stage_max: Sequence[cp_model.IntVar],
    total: cp_model.IntVar,
) -> None:
    model.add_max_equality(total, [cp_model.LinearExpr.sum(stage_max), v.gen_t[0]])  # (8c)
