"""ClusterSpec: pools of identical nodes, loadable from TOML.

```toml
name = "h100x16"
[[pools]]
gpu = "h100-sxm"          # a hardware / profile name (placeflow.hardware)
num_nodes = 2
gpus_per_node = 8
price_per_gpu_hour = 2.5  # optional, USD; needed by the `cost` objective
memory_gib = 80           # optional override of the device's memory
reserve_gib = 3           # optional override of its reserve (placeflow.hardware)
profile = "h100-sxm"      # optional: another profile name or a profile file path
```

A CPU pool's devices are logical workers of one core each; `cores_per_node`
(CPU pools only) says how many physical cores a node really has. When a phase
keeps more workers of a node busy than it has cores, they share them, and the
simulator stretches the phase by workers / cores (`PoolSpec.contention`).

A heterogeneous cluster has several `[[pools]]`; a device set never spans pools.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from placeflow.errors import SpecError
from placeflow.hardware import GIB, DeviceKind, GpuSpec, get_hardware
from placeflow.tomlio import Table, load_spec

# More GPUs than any cluster built so far (the largest are ~100k): a bigger number is a
# typo (1.6e9 for 16), and the planner costs every whole-node count of a pool.
MAX_CLUSTER_GPUS = 131_072


def _check_size(what: str, num_gpus: int) -> None:
    if num_gpus > MAX_CLUSTER_GPUS:
        raise SpecError(
            f"{what} has {num_gpus:,} GPUs; at most {MAX_CLUSTER_GPUS:,} are supported "
            "(more than the largest clusters built; check num_nodes and gpus_per_node)"
        )


@dataclass(frozen=True, kw_only=True)
class PoolSpec:
    """`num_nodes` nodes of `gpus_per_node` devices of one type."""

    name: str
    gpu: GpuSpec
    num_nodes: int
    gpus_per_node: int
    price_per_gpu_hour: float | None = None
    profile: str = ""
    cores_per_node: int | None = None  # CPU pools: physical cores shared by the workers

    def __post_init__(self) -> None:
        if self.num_nodes <= 0:
            raise SpecError(
                f"pool {self.name!r}: num_nodes must be at least 1, got {self.num_nodes}"
            )
        if self.gpus_per_node <= 0:
            raise SpecError(
                f"pool {self.name!r}: gpus_per_node must be at least 1, got {self.gpus_per_node}"
            )
        _check_size(f"pool {self.name!r}", self.num_nodes * self.gpus_per_node)
        if self.price_per_gpu_hour is not None and self.price_per_gpu_hour < 0:
            raise SpecError(
                f"pool {self.name!r}: price_per_gpu_hour must be >= 0, "
                f"got {self.price_per_gpu_hour}"
            )
        if not self.profile:
            object.__setattr__(self, "profile", self.gpu.profile)
        if self.cores_per_node is not None:
            if self.gpu.kind is not DeviceKind.CPU:
                raise SpecError(
                    f"pool {self.name!r}: cores_per_node applies to CPU pools only "
                    f"({self.gpu.name} devices do not share cores)"
                )
            if self.cores_per_node <= 0:
                raise SpecError(
                    f"pool {self.name!r}: cores_per_node must be at least 1, "
                    f"got {self.cores_per_node}"
                )

    def contention(self, busy_devices_per_node: float) -> float:
        """How much slower each of that many busy devices of one node runs (>= 1; a
        fraction where devices are busy part of the time, on average)."""
        return max(1.0, self.busy_per_core(busy_devices_per_node))

    def busy_per_core(self, busy_devices_per_node: float) -> float:
        """That many busy devices of one node per core of it (CPU workers; below 1 where
        they leave cores idle); 1 where the pool does not declare its cores."""
        if self.cores_per_node is None:
            return 1.0
        return min(busy_devices_per_node, self.gpus_per_node) / self.cores_per_node

    @property
    def num_gpus(self) -> int:
        return self.num_nodes * self.gpus_per_node


@dataclass(frozen=True, kw_only=True)
class ClusterSpec:
    name: str
    pools: tuple[PoolSpec, ...]

    def __post_init__(self) -> None:
        if not self.pools:
            raise SpecError(f"cluster {self.name!r}: needs at least one [[pools]] entry")
        names = [p.name for p in self.pools]
        if len(set(names)) != len(names):
            raise SpecError(f"cluster {self.name!r}: pool names must be unique, got {names}")
        _check_size(f"cluster {self.name!r}", self.num_gpus)

    @property
    def num_gpus(self) -> int:
        return sum(p.num_gpus for p in self.pools)

    def pool(self, name: str) -> PoolSpec:
        for p in self.pools:
            if p.name == name:
                return p
        raise SpecError(
            f"cluster {self.name!r}: no pool {name!r}; pools: {[p.name for p in self.pools]}"
        )


_POOL_KEYS = (
    "name",
    "gpu",
    "num_nodes",
    "gpus_per_node",
    "price_per_gpu_hour",
    "memory_gib",
    "reserve_gib",
    "profile",
    "cores_per_node",
)


def _pool_from_table(t: Table, index: int) -> PoolSpec:
    t.reject_unknown(_POOL_KEYS)
    gpu = get_hardware(t.get_str("gpu"))
    memory_bytes, reserve_bytes, source = gpu.memory_bytes, gpu.reserve_bytes, gpu.reserve_source
    if t.has("memory_gib"):
        memory_gib = t.get_float("memory_gib")
        if memory_gib <= 0:
            raise SpecError(f"{t.where}: memory_gib must be positive, got {memory_gib}")
        memory_bytes = int(memory_gib * GIB)
    if t.has("reserve_gib"):
        reserve_gib = t.get_float("reserve_gib")
        reserve_bytes, source = int(reserve_gib * GIB), "set in the cluster file"
        if not 0 <= reserve_bytes < memory_bytes:
            raise SpecError(
                f"{t.where}: reserve_gib must be 0 or more and below the device's "
                f"{memory_bytes / GIB:g} GiB, got {reserve_gib}"
            )
    elif reserve_bytes >= memory_bytes:
        raise SpecError(
            f"{t.where}: memory_gib {memory_bytes / GIB:g} leaves nothing after the device's "
            f"{reserve_bytes / GIB:g} GiB reserve; give more memory_gib or a smaller reserve_gib"
        )
    gpu = dataclasses.replace(
        gpu, memory_bytes=memory_bytes, reserve_bytes=reserve_bytes, reserve_source=source
    )
    return PoolSpec(
        name=t.get_str("name", f"pool{index}"),
        gpu=gpu,
        num_nodes=t.get_int("num_nodes"),
        gpus_per_node=t.get_int("gpus_per_node"),
        price_per_gpu_hour=t.optional_float("price_per_gpu_hour"),
        profile=t.get_str("profile", gpu.profile),
        cores_per_node=t.get_int("cores_per_node") if t.has("cores_per_node") else None,
    )


def cluster_from_dict(data: dict, where: str = "cluster") -> ClusterSpec:
    t = Table(data, where)
    t.reject_unknown(("name", "pools"))
    pools = tuple(_pool_from_table(pt, i) for i, pt in enumerate(t.tables("pools")))
    return ClusterSpec(name=t.get_str("name", "cluster"), pools=pools)


def load_cluster(path: str | Path) -> ClusterSpec:
    return load_spec(path, cluster_from_dict)


def cluster_to_dict(c: ClusterSpec) -> dict[str, Any]:
    """The TOML table of a cluster; `cluster_from_dict` reads it back to an equal value."""
    pools = []
    for p in c.pools:
        pool: dict[str, Any] = {
            "name": p.name,
            "gpu": p.gpu.name,
            "num_nodes": p.num_nodes,
            "gpus_per_node": p.gpus_per_node,
            "memory_gib": p.gpu.memory_bytes / GIB,
            "profile": p.profile,
        }
        if p.gpu.reserve_bytes != get_hardware(p.gpu.name).reserve_bytes:
            pool["reserve_gib"] = p.gpu.reserve_bytes / GIB  # the default is left out: same hash
        if p.price_per_gpu_hour is not None:
            pool["price_per_gpu_hour"] = p.price_per_gpu_hour
        if p.cores_per_node is not None:
            pool["cores_per_node"] = p.cores_per_node
        pools.append(pool)
    return {"name": c.name, "pools": pools}
