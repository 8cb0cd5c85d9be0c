"""Hardware: the devices a cluster pool is made of, named by their profile.

A pool in a cluster names its device by a profile name (`h100-sxm`,
`a100-80gb`, `cpu`). `GpuSpec` holds the facts the planner needs besides the
profile's timings: memory capacity and whether the device is a CUDA GPU or a
logical CPU worker. On CPU a "device" is one logical worker process; its memory
is a share of host memory, set per pool (`memory_gib`) or by the default here.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from placeflow.errors import SpecError, UnknownNameError

GIB = 1 << 30


class DeviceKind(StrEnum):
    CUDA = "cuda"
    CPU = "cpu"


@dataclass(frozen=True, kw_only=True)
class GpuSpec:
    """One device type. `memory_bytes` is the capacity usable by one worker."""

    name: str
    kind: DeviceKind
    memory_bytes: int
    profile: str

    def __post_init__(self) -> None:
        if self.memory_bytes <= 0:
            raise SpecError(
                f"device {self.name!r}: memory_bytes must be positive, got {self.memory_bytes}"
            )


def _gpu(name: str, gib: int) -> GpuSpec:
    return GpuSpec(name=name, kind=DeviceKind.CUDA, memory_bytes=gib * GIB, profile=name)


# Nominal capacities from the vendors' datasheets; the CPU default is a quarter of
# this 24 GiB development machine, for 4 logical workers. The H800, H20, A800,
# B200 and GB200 profiles are datasheet profiles (`placeflow.profiles.siblings`).
HARDWARE: dict[str, GpuSpec] = {
    g.name: g
    for g in (
        _gpu("h100-sxm", 80),
        _gpu("a100-80gb", 80),
        _gpu("h800", 80),
        _gpu("h20", 96),
        _gpu("a800-80gb", 80),
        _gpu("b200", 180),
        _gpu("gb200", 186),
        GpuSpec(name="cpu", kind=DeviceKind.CPU, memory_bytes=5 * GIB, profile="cpu"),
    )
}


def get_hardware(name: str) -> GpuSpec:
    try:
        return HARDWARE[name]
    except KeyError:
        raise UnknownNameError("gpu", name, list(HARDWARE)) from None
