"""What both exports read off a plan: a device set as nodes x GPUs per node, and names."""

from __future__ import annotations

from placeflow.lora import LoRATargets
from placeflow.plan import Plan
from placeflow.workload import LoRASpec, Role


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


# PEFT's module names of each target set of placeflow/lora.py (Llama/Qwen projections).
LORA_MODULES = {
    LoRATargets.ALL_LINEAR: ("all-linear",),
    LoRATargets.ATTENTION: ("q_proj", "k_proj", "v_proj", "o_proj"),
}


def lora_alpha(lora: LoRASpec) -> int | float:
    """The adapters' alpha as trainers take it: alpha = rank when the workload leaves it 0."""
    alpha = lora.alpha or lora.rank
    return int(alpha) if float(alpha).is_integer() else alpha


def lora_target_modules(lora: LoRASpec, *, verl_list: bool = False) -> str:
    """PEFT target modules: `all-linear`, or the projections' names (a Hydra list for
    verl's overrides, space-separated words for argparse's nargs)."""
    modules = LORA_MODULES[lora.targets]
    if lora.targets is LoRATargets.ALL_LINEAR:
        return modules[0]
    return f"[{','.join(modules)}]" if verl_list else " ".join(modules)
