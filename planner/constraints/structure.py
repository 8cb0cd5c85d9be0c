"""Structure: one placement, and one set option (devices and role options) per set.

    (1)  Σ_P x[P] = 1
    (2)  Σ_f y[P,j,f] = x[P]                       for every P, j

A set option fixes the set's pool and device count and one option per role of
the set (`planner.setfront`), so (1) and (2) pick exactly one device count per
set and exactly one option per role; the memory of the set (5) holds by
construction of its options.
"""

from __future__ import annotations

from ortools.sat.python import cp_model

from placeflow.planner.variables import Variables


def add_structure(model: cp_model.CpModel, v: Variables) -> None:
    model.add_exactly_one(v.x.values())  # (1)
    for (p, _), terms in v.y.items():
        model.add(sum(var for _, var in terms) == v.x[p])  # (2)
