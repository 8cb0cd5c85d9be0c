"""Hardware: the devices a cluster pool is made of, named by their profile.

A pool in a cluster names its device by a profile name (`h100-sxm`,
`a100-80gb`, `cpu`). `GpuSpec` holds the facts the planner needs besides the
profile's timings: memory capacity and whether the device is a CUDA GPU or a
logical CPU worker. On CPU a "device" is one logical worker process; its memory
is a share of host memory, set per pool (`memory_gib`) or by the default here.

Not all of a GPU's memory holds tensors: the CUDA context, NCCL's communication
buffers and the caching allocator's fragmentation take a share before any
model is loaded. `reserve_bytes` books it; plans are sized against
`usable_bytes`. The figure for the CUDA GPUs (`CUDA_RESERVE_BYTES`) is not
measured here (the H100 measurements in ../shared/h100-measured/ record kernel
times, not the context's size); where it comes from is in `CUDA_RESERVE_SOURCE`.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from placeflow.errors import SpecError, UnknownNameError

GIB = 1 << 30


class DeviceKind(StrEnum):
    CUDA = "cuda"
    CPU = "cpu"


# Per CUDA device: 1 GiB for the CUDA context (PyTorch users report 0.7-0.8 GiB taken by
# the first CUDA call, before any tensor: discuss.pytorch.org/t/81330 "~700+MB",
# /t/73021 723 MiB), plus 2 GiB for NCCL buffers and allocator fragmentation, a
# placeflow assumption (not measured) of the same order as the context.
CUDA_RESERVE_BYTES = 3 * GIB
CUDA_RESERVE_SOURCE = (
    "CUDA context ~1 GiB from public PyTorch reports (0.7-0.8 GiB at first CUDA call); "
    "NCCL buffers and allocator fragmentation 2 GiB: assumed, not measured"
)


@dataclass(frozen=True, kw_only=True)
class GpuSpec:
    """One device type. `memory_bytes` is the capacity of one worker's device;
    `reserve_bytes` of it never hold tensors (context, buffers, fragmentation)."""

    name: str
    kind: DeviceKind
    memory_bytes: int
    profile: str
    reserve_bytes: int = 0
    reserve_source: str = ""

    def __post_init__(self) -> None:
        if self.memory_bytes <= 0:
            raise SpecError(
                f"device {self.name!r}: memory_bytes must be positive, got {self.memory_bytes}"
            )
        if not 0 <= self.reserve_bytes < self.memory_bytes:
            raise SpecError(
                f"device {self.name!r}: reserve_bytes must be at least 0 and below the "
                f"{self.memory_bytes} bytes of memory, got {self.reserve_bytes}"
            )

    @property
    def usable_bytes(self) -> int:
        """Memory plans may book: capacity less the reserve."""
        return self.memory_bytes - self.reserve_bytes


def _gpu(name: str, gib: int) -> GpuSpec:
    return GpuSpec(
        name=name,
        kind=DeviceKind.CUDA,
        memory_bytes=gib * GIB,
        profile=name,
        reserve_bytes=CUDA_RESERVE_BYTES,
        reserve_source=CUDA_RESERVE_SOURCE,
    )


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
