"""GPU budget: the sets of the chosen placement fit in each pool.

    (4)  Σ_{P,j,f : q_f = q} n_f · y[P,j,f] + Σ_{u : q'_u = q} m_u · g[u] <= G_q   for every pool q

(the second sum: the actor's generator set, planner.constraints.generator).

Sets take whole nodes or power-of-two divisors of a node (planner.space), so
any selection within G_q (generator set included) packs into the pool's
nodes; `solution.assign_devices` does the packing and the validator re-checks it.
"""

from __future__ import annotations

from ortools.sat.python import cp_model

from placeflow.cluster import ClusterSpec
from placeflow.planner.costtable import CostTable
from placeflow.planner.variables import Variables


def gpus_used(v: Variables, table: CostTable, pool: str) -> cp_model.LinearExpr:
    keys = [(f.num_gpus, var) for f, var in v.set_terms() if f.pool == pool]
    keys += [(u.num_gpus, var) for u, var in v.generator_terms(table) if u.pool == pool]
    return cp_model.LinearExpr.weighted_sum([var for _, var in keys], [n for n, _ in keys])


def add_gpu_budget(
    model: cp_model.CpModel, v: Variables, table: CostTable, cluster: ClusterSpec
) -> None:
    for pool in cluster.pools:
        model.add(gpus_used(v, table, pool.name) <= pool.num_gpus)  # (4)
