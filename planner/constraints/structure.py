"""Structure: one placement, one device count per set, one option per role.

    (1)  Σ_P x[P] = 1
    (2)  Σ_{q,n} y[P,j,q,n] = x[P]                       for every P, j
    (3)  Σ_o z[r,q,n,o] = Σ_P y[P, j_P(r), q, n]          for every r, q, n

where j_P(r) is the set of P holding r. With (1) and (2) exactly one set
count is active per role, so (3) picks exactly one option per role, on the
pool and count of its set.
"""

from __future__ import annotations

from ortools.sat.python import cp_model

from placeflow.planner.costtable import CostTable
from placeflow.planner.space import Placement
from placeflow.planner.variables import Variables


def add_structure(
    model: cp_model.CpModel, v: Variables, placements: list[Placement], table: CostTable
) -> None:
    model.add_exactly_one(v.x.values())  # (1)
    for p, placement in enumerate(placements):
        for j in range(len(placement.sets)):
            counts = [var for (pp, jj, _, _), var in v.y.items() if (pp, jj) == (p, j)]
            model.add(sum(counts) == v.x[p])  # (2)
    sets_by_key: dict[tuple[object, str, int], list[cp_model.IntVar]] = {}
    for (p, j, q, n), var in v.y.items():
        for role in placements[p].sets[j]:
            sets_by_key.setdefault((role, q, n), []).append(var)
    for key, opts in table.options.items():
        if (key, 0) not in v.z:
            continue  # no set can take this count: the role's options there are not modelled
        chosen = [v.z[(key, o)] for o in range(len(opts))]
        model.add(sum(chosen) == sum(sets_by_key[key]))  # (3)
