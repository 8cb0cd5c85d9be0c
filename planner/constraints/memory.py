"""Memory: what a set keeps resident plus any one call's transient fits each device.

    (5)  Σ_{r ∈ S_{P,j}} RES_r + TR_{r'} <= Σ_{q,n} C_q · y[P,j,q,n]
         for every P, j and r' ∈ S_{P,j}, enforced only if x[P]

with RES_r = Σ res(o) · z[r,q,n,o] and TR_r = Σ tr(o) · z[r,q,n,o] over r's
options. Colocated roles keep their weights (and trained roles their gradients
and optimizer state) on the devices throughout; calls run one at a time on a
set, so only one role's transient memory (activations, logits, or the actor's
KV cache and generation weights) is added at once. Bytes are rounded up to MiB
for usage and down for capacity, so a rounded solution is never optimistic.
"""

from __future__ import annotations

import math

from ortools.sat.python import cp_model
from placeflow.planner.costtable import CostTable
from placeflow.planner.space import Placement
from placeflow.planner.variables import Variables

from placeflow.cluster import ClusterSpec

MIB = 1 << 20


def add_memory(
    model: cp_model.CpModel,
    v: Variables,
    placements: list[Placement],
    table: CostTable,
    cluster: ClusterSpec,
) -> None:
    capacity_mib = {p.name: p.gpu.memory_bytes // MIB for p in cluster.pools}
    res = {
        r: sum(math.ceil(o.resident_bytes / MIB) * z for o, z in v.role_terms(table, r))
        for r in {k[0] for k in table.options}
    }
    tr = {
        r: sum(math.ceil(o.transient_bytes / MIB) * z for o, z in v.role_terms(table, r))
        for r in res
    }
    for p, placement in enumerate(placements):
        for j, roles in enumerate(placement.sets):
            cap = sum(
                capacity_mib[q] * var for (pp, jj, q, _), var in v.y.items() if (pp, jj) == (p, j)
            )
            for r_prime in roles:
                model.Add(sum(res[r] for r in roles) + tr[r_prime] <= cap).OnlyEnforceIf(
                    v.x[p]
                )  # (5)
