"""Memory: what a set keeps resident plus any one call's transient fits each device.

    (5)  Σ_{r ∈ S_{P,j}} RES_r + TR_{r'} <= Σ_{q,n} C_q · y[P,j,q,n]
         for every P, j and r' ∈ S_{P,j}, enforced only if x[P]

with RES_r = res_mib[r] and TR_r = tr_mib[r] (planner.variables). Colocated
roles keep their weights (and trained roles their gradients and optimizer
state) on the devices throughout; calls run one at a time on a set, so only
one role's transient memory (activations, logits, or the actor's KV cache and
generation weights) is added at once. Bytes are rounded up to MiB for usage
and down for capacity, so a rounded solution is never optimistic.
"""

from __future__ import annotations

from ortools.sat.python import cp_model

from placeflow.cluster import ClusterSpec
from placeflow.planner.space import Placement
from placeflow.planner.variables import MIB, Variables


def add_memory(
    model: cp_model.CpModel, v: Variables, placements: list[Placement], cluster: ClusterSpec
) -> None:
    capacity_mib = {p.name: p.gpu.memory_bytes // MIB for p in cluster.pools}
    for p, placement in enumerate(placements):
        for j, roles in enumerate(placement.sets):
            keys = [(q, var) for (pp, jj, q, _), var in v.y.items() if (pp, jj) == (p, j)]
            cap = cp_model.LinearExpr.weighted_sum(
                [var for _, var in keys], [capacity_mib[q] for q, _ in keys]
            )
            resident = cp_model.LinearExpr.sum([v.res_mib[r] for r in roles])
            for r_prime in roles:
                model.add(resident + v.tr_mib[r_prime] <= cap).only_enforce_if(v.x[p])  # (5)
