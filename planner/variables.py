"""Decision variables of the placement model (CP-SAT booleans).

Notation (used by every constraint module's docstring):
- P ranges over placements; S_{P,j} is the j-th set of placement P;
- q over pools, with G_q devices and capacity C_q bytes per device;
- n over candidate GPU counts of pool q (`space.candidate_counts`);
- f over the set options of S_{P,j} on pool q (`planner.setfront`): n_f devices
  and one option per role of the set, together within memory (constraint (5)),
  on the Pareto front of (n_f, L_0(f), L_1(f), L_2(f)) with L_k the set's stage
  loads; A(f) = 1 iff the actor is in the set and leaves generation to a
  generator set;
- u over the generator options (`planner.generators`): m_u devices of pool q'_u,
  trained on pool q_u, sync time s_u, generation time e_u.

Variables:
- x[P] = 1 iff placement P is chosen;
- y[P, j, f] = 1 iff set j of P runs set option f (on its n_f devices of pool q_f);
- g[u] = 1 iff the actor generates on a generator set with option u.

Linear expressions built once and used by the constraints:
- load[P, j, k] = Σ_f L_k(f)·y[P,j,f]  (in the table's time unit); for the set
  holding the actor, stage 0 also holds the weight sync, which keeps its
  training set busy: load[P, j_P(actor), 0] += Σ_u s_u·g[u]
- gen_t[k] = Σ_u (s_u + e_u)·g[u] for k = 0, else 0 (the generator set's load)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ortools.sat.python import cp_model

from placeflow.planner.costtable import NUM_STAGES, CostTable
from placeflow.planner.setfront import MIB, SetFronts, SetOption
from placeflow.planner.space import Placement
from placeflow.workload import Role

if TYPE_CHECKING:
    from placeflow.cluster import ClusterSpec
    from placeflow.planner.generators import GeneratorOption

__all__ = ["MIB", "Variables", "make_variables"]

SetKey = tuple[int, int]  # placement index, set index


@dataclass
class Variables:
    x: dict[int, cp_model.IntVar]
    y: dict[SetKey, list[tuple[SetOption, cp_model.IntVar]]]
    g: dict[int, cp_model.IntVar]  # index into CostTable.generators
    load: dict[tuple[int, int, int], cp_model.LinearExpr]  # (P, j, k)
    gen_t: list[cp_model.LinearExpr]

    def generator_terms(self, table: CostTable) -> list[tuple[GeneratorOption, cp_model.IntVar]]:
        return [(table.generators[u], var) for u, var in self.g.items()]

    def set_terms(self) -> list[tuple[SetOption, cp_model.IntVar]]:
        """(set option, y) pairs of every set of every placement."""
        return [term for terms in self.y.values() for term in terms]


def make_variables(
    model: cp_model.CpModel,
    placements: list[Placement],
    table: CostTable,
    cluster: ClusterSpec,
    fronts: SetFronts,
) -> Variables:
    x = {p: model.new_bool_var(f"x[{p}]") for p in range(len(placements))}
    y: dict[SetKey, list[tuple[SetOption, cp_model.IntVar]]] = {}
    for p, placement in enumerate(placements):
        for j, roles in enumerate(placement.sets):
            y[(p, j)] = [
                (f, model.new_bool_var(f"y[{p},{j},{pool.name},{f.num_gpus},{i}]"))
                for pool in cluster.pools
                for i, f in enumerate(fronts.across_counts(roles, pool.name))
            ]
    g = {u: model.new_bool_var(f"g[{u}]") for u in range(len(table.generators))}
    v = Variables(x=x, y=y, g=g, load={}, gen_t=[])
    gens = v.generator_terms(table)
    gs = [var for _, var in gens]
    sync = [table.to_units(u.sync_s) for u, _ in gens]
    for (p, j), terms in y.items():
        ys = [var for _, var in terms]
        for k in range(NUM_STAGES):
            coeffs = [f.stage_units[k] for f, _ in terms]
            if k == 0 and Role.ACTOR in placements[p].sets[j]:
                v.load[(p, j, k)] = cp_model.LinearExpr.weighted_sum(ys + gs, coeffs + sync)
            else:
                v.load[(p, j, k)] = cp_model.LinearExpr.weighted_sum(ys, coeffs)
    load = cp_model.LinearExpr.weighted_sum(gs, [table.to_units(u.load_s) for u, _ in gens])
    v.gen_t = [load if k == 0 else cp_model.LinearExpr.constant(0) for k in range(NUM_STAGES)]
    return v
