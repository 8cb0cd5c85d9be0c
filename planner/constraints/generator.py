"""Generator set: the actor generates apart exactly when it trains without generating.

    (9)  Σ_{u : q_u = q} g[u] = Σ_{P, j, f : A(f) = 1, q_f = q} y[P,j,f]    for every pool q

With (1) and (2) exactly one set holding the actor is chosen, so (9) makes the
plan have at most one generator set, one exactly when the actor's option
leaves generation to it (no generation, reshard or KV cache on the training
set), and the generator's weight sync is costed from the pool the actor
trains on.
"""

from __future__ import annotations

from ortools.sat.python import cp_model

from placeflow.cluster import ClusterSpec
from placeflow.planner.costtable import CostTable
from placeflow.planner.variables import Variables


def add_generator_choice(
    model: cp_model.CpModel, v: Variables, table: CostTable, cluster: ClusterSpec
) -> None:
    for pool in cluster.pools:
        gens = [var for u, var in v.generator_terms(table) if u.trainer_pool == pool.name]
        apart = [var for f, var in v.set_terms() if f.gen_apart and f.pool == pool.name]
        model.add(sum(gens) == sum(apart))  # (9)
