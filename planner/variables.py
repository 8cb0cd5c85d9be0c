"""Decision variables of the placement model (CP-SAT booleans).

Notation (used by every constraint module's docstring):
- P ranges over placements; S_{P,j} is the j-th set of placement P;
- q over pools, with G_q devices and capacity C_q bytes per device;
- n over candidate GPU counts of pool q (`space.candidate_counts`);
- o over the options of role r on (q, n) in the cost table; O^apart ⊆ those of
  the actor that leave generation to a generator set (`RoleOption.gen_apart`);
- u over the generator options (`planner.generators`): m_u devices of pool q'_u,
  trained on pool q_u, sync time s_u, generation time e_u.

Variables:
- x[P] = 1 iff placement P is chosen;
- y[P, j, q, n] = 1 iff set j of P gets n devices of pool q;
- z[r, q, n, o] = 1 iff role r runs option o (on n devices of pool q);
- g[u] = 1 iff the actor generates on a generator set with option u.

Linear expressions of a role's choice, built once and used by the constraints
(CP-SAT sees the option sums directly, which propagates better than
equality-defined auxiliary integers):
- stage_t[r, k] = Σ_o t_k(o)·z[r,q,n,o]    (time of role r in stage k, in the
  table's time unit); for the actor, stage 0 also holds the weight sync,
  which keeps its training set busy: stage_t[actor, 0] += Σ_u s_u·g[u]
- gen_t[k] = Σ_u (s_u + e_u)·g[u] for k = 0, else 0 (the generator set's load)
- res_mib[r] = Σ_o ⌈res(o)⌉·z,  tr_mib[r] = Σ_o ⌈tr(o)⌉·z   (MiB per device)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ortools.sat.python import cp_model

from placeflow.planner.costtable import NUM_STAGES, CostTable, RoleOption, TableKey
from placeflow.planner.space import Placement
from placeflow.workload import Role

if TYPE_CHECKING:
    from placeflow.planner.generators import GeneratorOption

MIB = 1 << 20

YKey = tuple[int, int, str, int]  # placement index, set index, pool, count


@dataclass
class Variables:
    x: dict[int, cp_model.IntVar]
    y: dict[YKey, cp_model.IntVar]
    z: dict[tuple[TableKey, int], cp_model.IntVar]
    g: dict[int, cp_model.IntVar]  # index into CostTable.generators
    stage_t: dict[tuple[Role, int], cp_model.LinearExpr]
    res_mib: dict[Role, cp_model.LinearExpr]
    tr_mib: dict[Role, cp_model.LinearExpr]
    gen_t: list[cp_model.LinearExpr]

    def generator_terms(self, table: CostTable) -> list[tuple[GeneratorOption, cp_model.IntVar]]:
        return [(table.generators[u], var) for u, var in self.g.items()]

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
    x = {p: model.new_bool_var(f"x[{p}]") for p in range(len(placements))}
    y = {}
    usable: set[TableKey] = set()  # (role, pool, count) that some set can actually take
    for p, placement in enumerate(placements):
        for j, roles in enumerate(placement.sets):
            for q in pools:
                for n in sorted(counts[q]):
                    # A set can take a count only if every role in it has an option there.
                    if all((r, q, n) in table.options for r in roles):
                        y[(p, j, q, n)] = model.new_bool_var(f"y[{p},{j},{q},{n}]")
                        usable.update((r, q, n) for r in roles)
    z = {
        (key, o): model.new_bool_var(f"z[{key[0]},{key[1]},{key[2]},{o}]")
        for key, opts in table.options.items()
        if key in usable
        for o in range(len(opts))
    }
    g = {u: model.new_bool_var(f"g[{u}]") for u in range(len(table.generators))}
    v = Variables(x=x, y=y, z=z, g=g, stage_t={}, res_mib={}, tr_mib={}, gen_t=[])
    gens = v.generator_terms(table)
    gs = [var for _, var in gens]
    sync = [table.to_units(u.sync_s) for u, _ in gens]
    for role in {key[0] for key in table.options}:
        terms = v.role_terms(table, role)
        zs = [z for _, z in terms]
        for k in range(NUM_STAGES):
            coeffs = [table.to_units(o.stage_s[k]) for o, _ in terms]
            if role is Role.ACTOR and k == 0:
                v.stage_t[(role, k)] = cp_model.LinearExpr.weighted_sum(zs + gs, coeffs + sync)
            else:
                v.stage_t[(role, k)] = cp_model.LinearExpr.weighted_sum(zs, coeffs)
        v.res_mib[role] = cp_model.LinearExpr.weighted_sum(
            zs, [math.ceil(o.resident_bytes / MIB) for o, _ in terms]
        )
        v.tr_mib[role] = cp_model.LinearExpr.weighted_sum(
            zs, [math.ceil(o.transient_bytes / MIB) for o, _ in terms]
        )
    load = cp_model.LinearExpr.weighted_sum(gs, [table.to_units(u.load_s) for u, _ in gens])
    v.gen_t = [load if k == 0 else cp_model.LinearExpr.constant(0) for k in range(NUM_STAGES)]
    return v
