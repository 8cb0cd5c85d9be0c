"""Generator memory: the generator set's devices hold the generation shard and KV cache.

    (10)  Σ_u ⌈(W_u + K_u) / MiB⌉ · g[u] <= Σ_u ⌊C_{q'_u} / MiB⌋ · g[u]

with W_u = M/tg_u the generation shard and K_u the KV cache of option u
(planner.generators); the generator holds no gradients or optimizer state and
no other role, so nothing else is added. `generators.with_generators` keeps
only options that fit; (10) keeps the model exact for any table it is given.
"""

from __future__ import annotations

import math

from ortools.sat.python import cp_model

from placeflow.cluster import ClusterSpec
from placeflow.planner.costtable import CostTable
from placeflow.planner.variables import MIB, Variables


def add_generator_memory(
    model: cp_model.CpModel, v: Variables, table: CostTable, cluster: ClusterSpec
) -> None:
    capacity_mib = {p.name: p.gpu.usable_bytes // MIB for p in cluster.pools}
    terms = v.generator_terms(table)
    gs = [var for _, var in terms]
    used = [math.ceil((u.resident_bytes + u.transient_bytes) / MIB) for u, _ in terms]
    cap = [capacity_mib[u.pool] for u, _ in terms]
    model.add(
        cp_model.LinearExpr.weighted_sum(gs, used) <= cp_model.LinearExpr.weighted_sum(gs, cap)
    )  # (10)
