"""Resource pools: one Ray placement group per device set of a plan.

Bundle i of a set's placement group is the set's i-th device, and the worker
of rank i is scheduled on it. A bundle is {"CPU": 1} for a CPU pool (one
logical worker) and {"GPU": 1, "CPU": cpus_per_gpu} for a CUDA pool. A set on
one node is STRICT_PACK (all bundles on one node); a set spanning nodes is
PACK, as few nodes as possible. (Ray does not promise that PACK puts bundles
i..i+gpus_per_node-1 on one node; the plan's TP-in-node rule assumes it.)

Before anything is created the plan's needs are checked against what Ray
reports (`check_resources`), so a plan too big for the cluster fails with a
clear message instead of waiting for devices that will never come.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import ray
from ray.exceptions import GetTimeoutError
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group

from placeflow.executor.errors import InsufficientResourcesError, PlacementTimeoutError
from placeflow.hardware import DeviceKind
from placeflow.plan import DeviceSet, Plan


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
    pools = []
    for i, s in enumerate(plan.sets):
        kind = plan.pool_of(i).gpu.kind
        group = placement_group(
            [bundle(kind, cpus_per_gpu=cpus_per_gpu)] * s.num_devices,
            strategy=strategy(plan, i),
            name=f"placeflow-{plan.name}-set{i}",
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
