"""What both exports read off a plan: a device set as nodes x GPUs per node, and names."""

from __future__ import annotations

from placeflow.plan import Plan
from placeflow.workload import Role


def nodes_of(plan: Plan, set_index: int) -> tuple[int, int] | None:
    """(nodes, GPUs per node) of a device set, when it is whole nodes or lies in one
    node (frameworks size their pools so); None for a set that straddles nodes."""
    s = plan.sets[set_index]
    per_node = plan.pool_of(set_index).gpus_per_node
    first_node = s.first_device // per_node
    last_node = (s.first_device + s.num_devices - 1) // per_node
    if first_node == last_node:
        return 1, s.num_devices
    if s.first_device % per_node == 0 and s.num_devices % per_node == 0:
        return s.num_devices // per_node, per_node
    return None


def set_label(plan: Plan, role: Role) -> str:
    s = plan.sets[plan.set_of(role)]
    last = s.first_device + s.num_devices - 1
    return f"{'+'.join(r.value for r in s.roles)} on devices {s.first_device}-{last}"
