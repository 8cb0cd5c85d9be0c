"""Decision variables of the placement model (CP-SAT booleans).

Notation (used by every constraint module's docstring):
- P ranges over placements; S_{P,j} is the j-th set of placement P;
- q over pools, with G_q devices and capacity C_q bytes per device;
- n over candidate GPU counts of pool q (`space.candidate_counts`);
- o over the options of role r on (q, n) in the cost table.

Variables:
- x[P] = 1 iff placement P is chosen;
- y[P, j, q, n] = 1 iff set j of P gets n devices of pool q;
- z[r, q, n, o] = 1 iff role r runs option o (on n devices of pool q).
"""

from __future__ import annotations

from dataclasses import dataclass

from ortools.sat.python import cp_model
from placeflow.planner.costtable import CostTable, RoleOption, TableKey
from placeflow.planner.space import Placement

YKey = tuple[int, int, str, int]  # placement index, set index, pool, count


@dataclass
class Variables:
    x: dict[int, cp_model.IntVar]
    y: dict[YKey, cp_model.IntVar]
    z: dict[tuple[TableKey, int], cp_model.IntVar]

    def role_terms(
        self, table: CostTable, role: object
    ) -> list[tuple[RoleOption, cp_model.IntVar]]:
        """(option, z) pairs of one role over all pools and counts."""
        return [(table.options[key][o], var) for (key, o), var in self.z.items() if key[0] == role]


def make_variables(
    model: cp_model.CpModel, placements: list[Placement], table: CostTable, pools: list[str]
) -> Variables:
    counts: dict[str, set[int]] = {q: set() for q in pools}
    for _, q, n in table.options:
        counts[q].add(n)
    x = {p: model.NewBoolVar(f"x[{p}]") for p in range(len(placements))}
    y = {}
    for p, placement in enumerate(placements):
        for j, roles in enumerate(placement.sets):
            for q in pools:
                for n in sorted(counts[q]):
                    # A set can take a count only if every role in it has an option there.
                    if all((r, q, n) in table.options for r in roles):
                        y[(p, j, q, n)] = model.NewBoolVar(f"y[{p},{j},{q},{n}]")
    z = {
        (key, o): model.NewBoolVar(f"z[{key[0]},{key[1]},{key[2]},{o}]")
        for key, opts in table.options.items()
        for o in range(len(opts))
    }
    return Variables(x=x, y=y, z=z)
