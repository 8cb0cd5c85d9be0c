"""Datasheet completion: roofline entries for what an imported GPU profile lacks.

Vidur measured forward GEMMs, norms and NCCL all-reduce / send-recv; placeflow
also needs backward GEMMs, LM-head GEMMs, attention, the optimizer step, the
other collectives, inter-node collectives and host copies. This module adds
them as `datasheet` entries computed from the vendor's figures (`DatasheetFigures`)
and efficiencies *derived from the same profile's imported measurements*
(`derive_efficiencies`), never assumed:

    compute ops:   t = t0 + max(F / (P * e_c), B / (W_hbm * e_m))
    intra-node:    t = floor(n) + B_bus / W_bus(n)          (per world size n)
    inter-node:    t = t_lat + B_bus / (W_inter * e_link)
    host copies:   t = t_p2p + B / (W_host * e_p2p)

F and B are `placeflow.profiles.ops.flops` / `bytes_moved` (B_bus includes the
nccl-tests bus factor). e_c is the median achieved fraction of peak of the
largest imported GEMMs; t0 and e_m are a least-squares fit t = t0 + B / (W_hbm e_m)
over the single-token (m = 1) imported GEMMs, which are bound by reading the
weights; elementwise-like ops (optimizer, softmax) use the achieved fraction of
the largest imported norms/activations instead. floor(n) and W_bus(n) come from
the imported intra-node all-reduce of world size n; e_p2p from the imported
intra-node send/recv; e_link and t_lat from an imported inter-node send/recv when
the profile has one, otherwise e_p2p and the largest imported collective floor.

Departures worth knowing: attention uses the GEMM compute efficiency (Vidur's
attention files were not published), which flatters attention kernels; a
datasheet entry is one computed value (p10 = p90 = median, repeats = 1).
fp16 (Vidur's dtype) and bf16 run at the same speed on A100 and H100.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field

import numpy as np

from placeflow.catalogue import CATALOGUE
from placeflow.errors import SpecError
from placeflow.models import DType, ModelSpec
from placeflow.profiles import ops
from placeflow.profiles.schema import (
    CollectiveKind,
    CopyDirection,
    ElementwiseKind,
    Entry,
    Op,
    Profile,
    Provenance,
    Scope,
    Source,
)

GB = 1e9
_DTYPE_BYTES = 2  # fp16 / bf16


@dataclass(frozen=True, kw_only=True)
class DatasheetFigures:
    """Vendor figures for one GPU. Bandwidths in bytes/s per direction, per GPU."""

    name: str
    peak_bf16_flops_per_s: float  # dense tensor-core bf16 (= fp16)
    hbm_bytes_per_s: float
    nvlink_bytes_per_s: float  # per direction, per GPU, through NVSwitch
    inter_node_bytes_per_s: float  # per GPU, one NIC per GPU
    host_link_bytes_per_s: float  # PCIe, per direction
    sources: str

    def __post_init__(self) -> None:
        for name in (
            "peak_bf16_flops_per_s",
            "hbm_bytes_per_s",
            "nvlink_bytes_per_s",
            "inter_node_bytes_per_s",
            "host_link_bytes_per_s",
        ):
            if not getattr(self, name) > 0:
                raise SpecError(f"datasheet {self.name!r}: {name} must be positive")

    def describe(self) -> str:
        return (
            f"{self.name}: {self.peak_bf16_flops_per_s / 1e12:g} TFLOP/s dense bf16, "
            f"HBM {self.hbm_bytes_per_s / 1e12:g} TB/s, NVLink {self.nvlink_bytes_per_s / GB:g} GB/s "
            f"per direction, inter-node {self.inter_node_bytes_per_s / GB:g} GB/s per GPU, "
            f"host link {self.host_link_bytes_per_s / GB:g} GB/s per direction ({self.sources})"
        )


H100_SXM = DatasheetFigures(
    name="H100 SXM5 80GB",
    peak_bf16_flops_per_s=989e12,
    hbm_bytes_per_s=3.35e12,
    nvlink_bytes_per_s=450 * GB,  # NVLink 4: 900 GB/s bidirectional
    inter_node_bytes_per_s=50 * GB,  # DGX H100: one 400 Gb/s NDR ConnectX-7 per GPU
    host_link_bytes_per_s=64 * GB,  # PCIe Gen5 x16: 128 GB/s bidirectional
    sources="NVIDIA H100 datasheet; DGX H100 user guide",
)

A100_80GB_SXM = DatasheetFigures(
    name="A100 SXM4 80GB",
    peak_bf16_flops_per_s=312e12,
    hbm_bytes_per_s=2.0e12,  # HBM2e, 2,039 GB/s
    nvlink_bytes_per_s=300 * GB,  # NVLink 3: 600 GB/s bidirectional
    inter_node_bytes_per_s=25 * GB,  # HybridFlow's testbed: 200 Gb/s between nodes
    host_link_bytes_per_s=32 * GB,  # PCIe Gen4 x16: 64 GB/s bidirectional
    sources="NVIDIA A100 datasheet; HybridFlow (arXiv 2409.19256) testbed",
)


@dataclass(frozen=True, kw_only=True)
class NetworkEfficiencies:
    """Collective floors and bandwidths derived from a profile's imported collectives."""

    allreduce_floor_s: Mapping[int, float] = field(hash=False)  # intra-node, per world size
    allreduce_bus_bytes_per_s: Mapping[int, float] = field(hash=False)
    p2p_floor_s: float
    p2p_fraction: float  # of NVLink, intra-node send/recv
    inter_latency_s: float
    inter_fraction: float  # of the inter-node figure
    inter_from: str  # where inter_fraction came from

    def describe(self) -> str:
        worlds = ", ".join(
            f"{n} GPUs floor {self.allreduce_floor_s[n] * 1e6:.1f} us, "
            f"bus {self.allreduce_bus_bytes_per_s[n] / GB:.0f} GB/s"
            for n in sorted(self.allreduce_floor_s)
        )
        return (
            f"intra-node all-reduce: {worlds}; send/recv floor {self.p2p_floor_s * 1e6:.1f} us, "
            f"{self.p2p_fraction:.3f} of NVLink; inter-node latency "
            f"{self.inter_latency_s * 1e6:.1f} us, {self.inter_fraction:.3f} of the inter-node "
            f"figure ({self.inter_from})"
        )


@dataclass(frozen=True, kw_only=True)
class Efficiencies:
    """Achieved fractions and fixed costs derived from a profile's imported entries."""

    compute_fraction: float  # e_c: median over the largest GEMMs
    compute_fraction_p10_p90: tuple[float, float]
    fixed_s: float  # t0: intercept of the m = 1 GEMM fit
    hbm_fraction: float  # e_m: slope of the m = 1 GEMM fit
    decode_hbm_fraction_range: tuple[float, float]  # achieved (t0 not removed), larger half
    elementwise_hbm_fraction: float
    network: NetworkEfficiencies

    def describe(self) -> str:
        lo, hi = self.compute_fraction_p10_p90
        dlo, dhi = self.decode_hbm_fraction_range
        return (
            f"compute {self.compute_fraction:.3f} of peak (largest GEMMs, p10-p90 {lo:.2f}-{hi:.2f}); "
            f"m=1 GEMM fit: t0 {self.fixed_s * 1e6:.2f} us, {self.hbm_fraction:.3f} of HBM "
            f"(achieved {dlo:.2f}-{dhi:.2f} on the larger half); elementwise "
            f"{self.elementwise_hbm_fraction:.3f} of HBM; {self.network.describe()}"
        )


def _imported(profile: Profile, op: Op) -> list[Entry]:
    return [e for e in profile.entries_for(op) if e.source is Source.IMPORTED]


def _compute_fraction(gemms: list[Entry], fig: DatasheetFigures) -> tuple[float, float, float]:
    """Median (p10, p90) achieved fraction of peak over GEMMs in the top decile of FLOPs."""
    flops = np.array([ops.flops(Op.GEMM, e.params) for e in gemms])
    times = np.array([e.median_s for e in gemms])
    top = flops >= np.quantile(flops, 0.9)
    frac = flops[top] / times[top] / fig.peak_bf16_flops_per_s
    p10, p50, p90 = np.quantile(frac, [0.1, 0.5, 0.9])
    return float(p50), float(p10), float(p90)


def _decode_fit(gemms: list[Entry], fig: DatasheetFigures) -> tuple[float, float, float, float]:
    """t0 and e_m from t = t0 + B / (W e_m) over the smallest-m GEMMs; achieved range too."""
    m_min = min(int(e.params["m"]) for e in gemms)
    small = [e for e in gemms if int(e.params["m"]) == m_min]
    num_bytes = np.array([ops.bytes_moved(Op.GEMM, e.params, _DTYPE_BYTES) for e in small])
    times = np.array([e.median_s for e in small])
    slope, intercept = np.polyfit(num_bytes, times, 1)
    achieved = num_bytes / times / fig.hbm_bytes_per_s
    larger = num_bytes >= np.median(num_bytes)
    return (
        max(float(intercept), 0.0),
        float(1.0 / slope / fig.hbm_bytes_per_s),
        float(achieved[larger].min()),
        float(achieved[larger].max()),
    )


def _elementwise_fraction(entries: list[Entry], fig: DatasheetFigures) -> float:
    """Median achieved HBM fraction of the largest tenth of imported elementwise entries."""
    num_bytes = np.array([ops.bytes_moved(Op.ELEMENTWISE, e.params, _DTYPE_BYTES) for e in entries])
    times = np.array([e.median_s for e in entries])
    top = num_bytes >= np.quantile(num_bytes, 0.9)
    return float(np.median(num_bytes[top] / times[top] / fig.hbm_bytes_per_s))


def _collective_fit(entries: list[Entry]) -> tuple[float, float]:
    """(floor_s, bus bytes/s) of one series: floor from sizes <= 64 KiB, bandwidth from the
    top octave of sizes after removing the floor."""
    sizes = [int(e.params["num_bytes"]) for e in entries]
    floor = statistics.median(e.median_s for e, s in zip(entries, sizes, strict=True) if s <= 1 << 16)
    top = [e for e, s in zip(entries, sizes, strict=True) if s >= max(sizes) / 2]
    bus = statistics.median(
        ops.bytes_moved(Op.COLLECTIVE, e.params, _DTYPE_BYTES) / (e.median_s - floor) for e in top
    )
    return floor, bus


def _series(entries: list[Entry], kind: CollectiveKind, scope: Scope) -> dict[int, list[Entry]]:
    out: dict[int, list[Entry]] = {}
    for e in entries:
        if e.params["kind"] == kind.value and e.params["scope"] == scope.value:
            out.setdefault(int(e.params["world_size"]), []).append(e)
    return out


def _network_efficiencies(profile: Profile, fig: DatasheetFigures) -> NetworkEfficiencies:
    colls = _imported(profile, Op.COLLECTIVE)
    allreduce = _series(colls, CollectiveKind.ALL_REDUCE, Scope.INTRA)
    p2p = _series(colls, CollectiveKind.SEND_RECV, Scope.INTRA).get(2)
    if not allreduce or p2p is None:
        raise SpecError(f"profile {profile.name!r}: needs imported intra-node all-reduce and send/recv")
    fits = {n: _collective_fit(es) for n, es in allreduce.items()}
    p2p_floor, p2p_bw = _collective_fit(p2p)
    inter = _series(colls, CollectiveKind.SEND_RECV, Scope.INTER).get(2)
    floors = [f for f, _ in fits.values()] + [p2p_floor]
    if inter is not None:
        inter_floor, inter_bw = _collective_fit(inter)
        inter_fraction = inter_bw / fig.inter_node_bytes_per_s
        inter_from = "imported inter-node send/recv"
        floors.append(inter_floor)
    else:
        inter_fraction = p2p_bw / fig.nvlink_bytes_per_s
        inter_from = "no inter-node measurement: the intra-node send/recv fraction of NVLink"
    return NetworkEfficiencies(
        allreduce_floor_s={n: f for n, (f, _) in fits.items()},
        allreduce_bus_bytes_per_s={n: b for n, (_, b) in fits.items()},
        p2p_floor_s=p2p_floor,
        p2p_fraction=p2p_bw / fig.nvlink_bytes_per_s,
        inter_latency_s=max(floors),
        inter_fraction=inter_fraction,
        inter_from=inter_from,
    )


def derive_efficiencies(profile: Profile, figures: DatasheetFigures) -> Efficiencies:
    """The achieved fractions of `figures` that the profile's imported entries show."""
    gemms = _imported(profile, Op.GEMM)
    elementwise = _imported(profile, Op.ELEMENTWISE)
    if not gemms or not elementwise:
        raise SpecError(f"profile {profile.name!r}: needs imported GEMM and elementwise entries")
    compute, c10, c90 = _compute_fraction(gemms, figures)
    fixed_s, hbm, d_lo, d_hi = _decode_fit(gemms, figures)
    return Efficiencies(
        compute_fraction=compute,
        compute_fraction_p10_p90=(c10, c90),
        fixed_s=fixed_s,
        hbm_fraction=hbm,
        decode_hbm_fraction_range=(d_lo, d_hi),
        elementwise_hbm_fraction=_elementwise_fraction(elementwise, figures),
        network=_network_efficiencies(profile, figures),
    )
