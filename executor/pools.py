"""Resource pools: one Ray placement group per device set of a plan.

Bundle i of a set's placement group is the set's i-th device, and the worker
of rank i is scheduled on it. A bundle is {"CPU": 1} for a CPU pool (one
logical worker) and {"GPU": 1, "CPU": cpus_per_gpu} for a CUDA pool. A set on
one node is STRICT_PACK (all bundles on one node); a set spanning nodes is
PACK.

Nodes. The plan's node k of a pool (devices k*gpus_per_node ...) is pinned to
one Ray node with a bundle label selector on `ray.io/node-id`, so that the
TP-in-node rule and the plan's split across nodes hold on a real cluster
(`assign_nodes`): the plan nodes its sets use, in pool and index order, take
room for the devices they use on the Ray nodes in the order Ray lists them, as
many per Ray node as its free resources hold. On one machine (a local Ray with enough
CPU slots) every logical node of a CPU pool lands on that machine.

Before anything is created the plan's needs are checked against what Ray
reports (`check_resources`), so a plan too big for the cluster fails with a
clear message instead of waiting for devices that will never come.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import ray
from ray.exceptions import GetTimeoutError
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group

from placeflow.executor.errors import InsufficientResourcesError, PlacementTimeoutError
from placeflow.hardware import DeviceKind
from placeflow.plan import DeviceSet, Plan

NODE_ID_LABEL = "ray.io/node-id"  # the label Ray gives every node (its node id)


def bundle(kind: DeviceKind, *, cpus_per_gpu: int = 1) -> dict[str, float]:
    """The Ray resources of one device, also the resources its worker actor asks for."""
    if kind is DeviceKind.CUDA:
        return {"GPU": 1.0, "CPU": float(cpus_per_gpu)}
    return {"CPU": 1.0}


def strategy(plan: Plan, set_index: int) -> str:
    s = plan.sets[set_index]
    per_node = plan.pool_of(set_index).gpus_per_node
    nodes = {d // per_node for d in s.devices()}
    return "STRICT_PACK" if len(nodes) == 1 else "PACK"


def required_resources(plan: Plan, *, cpus_per_gpu: int = 1) -> dict[str, float]:
    """Sum of all bundles of the plan."""
    total: dict[str, float] = {}
    for i, s in enumerate(plan.sets):
        for name, amount in bundle(plan.pool_of(i).gpu.kind, cpus_per_gpu=cpus_per_gpu).items():
            total[name] = total.get(name, 0.0) + amount * s.num_devices
    return total


NodeKey = tuple[str, int]  # (pool name, node index in the pool)


def used_nodes(plan: Plan) -> dict[NodeKey, int]:
    """The plan nodes its device sets occupy, in pool order then node index, each with
    the number of its devices the sets use."""
    used: dict[NodeKey, int] = {}
    for i, s in enumerate(plan.sets):
        for d in s.devices():
            key = (s.pool, d // plan.pool_of(i).gpus_per_node)
            used[key] = used.get(key, 0) + 1
    order = [p.name for p in plan.cluster.pools]
    return dict(sorted(used.items(), key=lambda kv: (order.index(kv[0][0]), kv[0][1])))


def assign_nodes(
    plan: Plan, nodes: Sequence[Mapping[str, Any]], *, cpus_per_gpu: int = 1
) -> dict[NodeKey, str]:
    """Ray node id per plan node (`nodes` as `ray.nodes()` lists them).

    Raises InsufficientResourcesError naming the plan node no Ray node can hold.
    """
    free = [(str(n["NodeID"]), dict(n.get("Resources", {}))) for n in nodes if n.get("Alive", True)]
    out: dict[NodeKey, str] = {}
    for key, num_devices in used_nodes(plan).items():
        pool = plan.cluster.pool(key[0])
        need = {
            k: v * num_devices for k, v in bundle(pool.gpu.kind, cpus_per_gpu=cpus_per_gpu).items()
        }
        for node_id, res in free:
            if all(res.get(k, 0.0) >= v for k, v in need.items()):
                for k, v in need.items():
                    res[k] -= v
                out[key] = node_id
                break
        else:
            have = "; ".join(
                f"{node_id[:8]}: " + ", ".join(f"{r.get(k, 0.0):g} {k}" for k in need)
                for node_id, r in free
            )
            wanted = ", ".join(f"{v:g} {k}" for k, v in need.items())
            raise InsufficientResourcesError(
                f"plan {plan.name!r}: node {key[1]} of pool {key[0]!r} needs {wanted} on one Ray "
                f"node; the Ray nodes have (free after the plan's other nodes) {have}. Add a node "
                "of that size or plan for the cluster Ray has"
            )
    return out


def check_resources(plan: Plan, available: Mapping[str, float], *, cpus_per_gpu: int = 1) -> None:
    """Raise InsufficientResourcesError naming what the plan needs and what Ray has."""
    needed = required_resources(plan, cpus_per_gpu=cpus_per_gpu)
    short = {k: v for k, v in needed.items() if available.get(k, 0.0) < v}
    if short:
        sets = ", ".join(f"{s.label()}: {s.num_devices}" for s in plan.sets)
        lacking = ", ".join(
            f"{v:g} {k} (Ray reports {available.get(k, 0.0):g})" for k, v in short.items()
        )
        raise InsufficientResourcesError(
            f"plan {plan.name!r} needs {lacking} for its device sets ({sets}); start Ray with "
            "more resources (ray.init(num_cpus=...) / more nodes) or use a smaller plan"
        )


@dataclass(frozen=True, kw_only=True)
class ResourcePool:
    set_index: int
    device_set: DeviceSet
    kind: DeviceKind
    placement_group: PlacementGroup


def create_pools(plan: Plan, *, timeout_s: float, cpus_per_gpu: int = 1) -> list[ResourcePool]:
    """One ready placement group per device set; removes what it made if any is not ready."""
    check_resources(plan, ray.cluster_resources(), cpus_per_gpu=cpus_per_gpu)
    node_of = assign_nodes(plan, ray.nodes(), cpus_per_gpu=cpus_per_gpu)
    pools = []
    for i, s in enumerate(plan.sets):
        kind = plan.pool_of(i).gpu.kind
        per_node = plan.pool_of(i).gpus_per_node
        group = placement_group(
            [bundle(kind, cpus_per_gpu=cpus_per_gpu)] * s.num_devices,
            strategy=strategy(plan, i),
            name=f"placeflow-{plan.name}-set{i}",
            bundle_label_selector=[
                {NODE_ID_LABEL: node_of[(s.pool, d // per_node)]} for d in s.devices()
            ],
        )
        pools.append(ResourcePool(set_index=i, device_set=s, kind=kind, placement_group=group))
    try:
        ray.get([p.placement_group.ready() for p in pools], timeout=timeout_s)
    except GetTimeoutError:
        message = (
            f"plan {plan.name!r}: placement groups not ready within {timeout_s:g} s; Ray has "
            f"{_devices(ray.available_resources())} free of {_devices(ray.cluster_resources())} "
            "(are other placement groups or actors holding the devices?)"
        )
        remove_pools(pools)
        raise PlacementTimeoutError(message) from None
    return pools


def remove_pools(pools: list[ResourcePool]) -> None:
    """Remove the placement groups, killing any actor still on them. Ray frees the devices
    asynchronously, within a second or so; a later `create_pools` waits for them."""
    for p in pools:
        remove_placement_group(p.placement_group)


def _devices(resources: Mapping[str, float]) -> dict[str, float]:
    return {k: resources[k] for k in ("CPU", "GPU") if k in resources}
