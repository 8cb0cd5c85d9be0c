"""Generator stage: the generator set is a set of its own in the stage structure.

    (7b)  M_k >= gen_t[k]                                     for every k

with gen_t[0] = Σ_u (s_u + e_u)·g[u] (weight sync, then generation) and
gen_t[k] = 0 for the later stages (planner.variables). The sync also keeps the
actor's training set busy; that is in stage_t[actor, 0] and so in (6).
Sets run in parallel within a stage, so the generator's load enters the
stage's maximum, not a sum.
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
