"""From a solver solution to a Plan: device assignment and the plan value.

Devices are assigned per pool, largest set first: whole-node sets take the
next free nodes; sub-node sets (power-of-two divisors of a node) fill the
remaining nodes first-fit, which never fails when their sizes divide one
another and the total fits (constraint (4)). The actor's generator set, when
the solution has one, is packed like any other set and listed last; the
actor's generation tensor size is the generator option's tg (pg = 1).
"""

from __future__ import annotations

import dataclasses

from placeflow.cluster import ClusterSpec
from placeflow.errors import SpecError
from placeflow.plan import DeviceSet, Plan
from placeflow.planner.solve import SetChoice, Solution
from placeflow.workload import Role, Workload


def assign_devices(sets: tuple[SetChoice, ...], cluster: ClusterSpec) -> list[DeviceSet]:
    """First device of each set, in the order given; raises SpecError if they do not pack."""
    firsts: dict[int, int] = {}
    for pool in cluster.pools:
        per_node = pool.gpus_per_node
        free = [per_node] * pool.num_nodes  # free devices at the end of each node
        order = sorted(
            (i for i, s in enumerate(sets) if s.pool == pool.name), key=lambda i: -sets[i].num_gpus
        )
        for i in order:
            n = sets[i].num_gpus
            if n >= per_node:
                k = n // per_node
                start = next(
                    (
                        a
                        for a in range(pool.num_nodes - k + 1)
                        if all(f == per_node for f in free[a : a + k])
                    ),
                    None,
                )
                if start is None:
                    raise SpecError(f"sets of pool {pool.name!r} do not pack into its nodes")
                for a in range(start, start + k):
                    free[a] = 0
                firsts[i] = start * per_node
            else:
                node = next((a for a, f in enumerate(free) if f >= n), None)
                if node is None:
                    raise SpecError(f"sets of pool {pool.name!r} do not pack into its nodes")
                firsts[i] = node * per_node + per_node - free[node]
                free[node] -= n
    return [
        DeviceSet(
            roles=s.roles,
            pool=s.pool,
            first_device=firsts[i],
            num_devices=s.num_gpus,
            generator=s.generator,
        )
        for i, s in enumerate(sets)
    ]


def solution_to_plan(solution: Solution, workload: Workload, cluster: ClusterSpec) -> Plan:
    choices = solution.sets
    parallelism = {role: opt.par for role, opt in solution.options.items()}
    gen = solution.generator
    if gen is not None:
        choices += (
            SetChoice(roles=(Role.ACTOR,), pool=gen.pool, num_gpus=gen.num_gpus, generator=True),
        )
        parallelism[Role.ACTOR] = dataclasses.replace(parallelism[Role.ACTOR], tg=gen.tg, pg=1)
    sets = assign_devices(choices, cluster)
    plan = Plan(
        name="candidate",
        workload=workload,
        cluster=cluster,
        sets=tuple(sets),
        parallelism=parallelism,
    )
    kind = f"{solution.placement.kind}{'-gen' if gen is not None else ''}"
    name = f"{workload.name}-{kind}-{plan.content_hash()[:8]}"
    return Plan(
        name=name, workload=workload, cluster=cluster, sets=tuple(sets), parallelism=parallelism
    )
