"""Datasheet completion: roofline entries for what an imported GPU profile lacks.

Vidur measured forward GEMMs, norms and NCCL all-reduce / send-recv; placeflow
also needs backward GEMMs, LM-head GEMMs, attention, the optimizer step, the
other collectives, inter-node collectives and host copies. This module adds
them as `datasheet` entries computed from the vendor's figures (`DatasheetFigures`)
and efficiencies *derived from the same profile's imported measurements*
(`derive_efficiencies`), never assumed:

    compute ops:   t = t0 + max(F / (P * e_c), B / (W_hbm * e_m))
    intra-node:    t = floor(n) + B_bus / W_bus(n)          (per world size n)
    inter-node:    ring  t = t_lat + x_ring(N) * t_hop + B_bus / (W_inter * e_link)
                   tree  t = t_lat + x_tree(N) * t_hop + B / (0.45 * W_inter * e_link)

The expert-parallel all-to-all (dispatch and combine of routed tokens) is one
more collective kind: B_bus = (n-1)/n of each rank's send buffer, over the
all-reduce's NVSwitch bus bandwidth within a node and entirely over the NIC
across nodes (an entry has one rank per node; where a group has several on a
node, the cost model sends only the share that leaves it over the NIC,
`CostModel.collective_s`).
    host copies:   t = t_p2p + B / (W_host * e_p2p)

F and B are `placeflow.profiles.ops.flops` / `bytes_moved` (B_bus includes the
nccl-tests bus factor). e_c is the median achieved fraction of peak of the
largest imported GEMMs; t0 and e_m are a least-squares fit t = t0 + B / (W_hbm e_m)
over the single-token (m = 1) imported GEMMs, which are bound by reading the
weights; elementwise-like ops (optimizer, softmax) use instead the median
achieved fraction of the largest tenth of imported elementwise entries (mostly
SiLU-and-multiply). floor(n) and W_bus(n) come from the imported intra-node
all-reduce of world size n (median time at <= 64 KiB; bus bandwidth over the top
octave of sizes after removing the floor); t_p2p and e_p2p likewise from the
imported intra-node send/recv; t_lat is the largest imported collective floor;
e_link is the achieved fraction of an imported inter-node send/recv where the
profile has one, else e_p2p (a point-to-point transfer over NVLink standing in
for one over the NIC).

Across N nodes (an inter-node entry of world size N has one rank per node) the
latency follows the algorithm NCCL runs, as its tuning model
(`src/graph/tuning.cc`, `ncclTopoTuneModel`) counts it: a ring crosses the
network nInterSteps times (2(N-1) for an all-reduce, N-1 for an all-gather,
a reduce-scatter or a broadcast's chain), the all-reduce's double binary tree
2 log2(N) times, a send/recv or an all-to-all (each rank's own sends, side by
side) once. t_lat stands for the 2-node case, the one that was measured or
taken as the floor; every network step beyond it costs t_hop, one send/recv's
floor over the network where the profile imported one, else over NVLink (a
lower bound: a NIC hop is no faster). x_ring(N) and x_tree(N) count those extra
steps: 2(N-2) and 2(ceil(log2 N)-1) for an all-reduce, N-2 for the other rings,
0 for the rest. An all-reduce takes the faster of the two, as NCCL's tuner
does: the tree's bus bandwidth is 0.9 of the ring's and its algorithm
bandwidth half its bus bandwidth (tuning.cc), so it moves the B logical bytes
at 0.45 of the link and wins only where latency dominates (small messages over
many nodes).

Datasheet entries only fill series (see `ops.series_key`) that have no entry
yet, so that no interpolated curve mixes measured and computed points.

Departures worth knowing: attention uses the GEMM compute efficiency (Vidur's
attention files were not published), which flatters attention kernels; a
datasheet entry is one computed value (p10 = p90 = median, repeats = 1).
fp16 (Vidur's dtype) and bf16 run at the same speed on A100 and H100.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field, replace

import numpy as np

from placeflow.catalogue import CATALOGUE
from placeflow.errors import SpecError
from placeflow.models import DType, Feature, ModelSpec
from placeflow.profiles import ops
from placeflow.profiles.schema import (
    CollectiveKind,
    CopyDirection,
    ElementwiseKind,
    Entry,
    Op,
    Profile,
    Scope,
    Source,
)

GB = 1e9
_DTYPE_BYTES = DType.BF16.num_bytes  # datasheet entries are bf16 (fp16 alike)


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
    # Dense FP8 (e4m3) tensor-core peak; 0: no FP8 tensor cores (Ampere).
    peak_fp8_flops_per_s: float = 0.0

    @property
    def fp8_gemm_speedup(self) -> float:
        """How much faster a GEMM runs in FP8 than in bf16 on the datasheet: the ratio of
        the dense peaks (the bytes a GEMM reads halve too), 0 without FP8."""
        return self.peak_fp8_flops_per_s / self.peak_bf16_flops_per_s

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
            f"HBM {self.hbm_bytes_per_s / 1e12:g} TB/s, "
            f"NVLink {self.nvlink_bytes_per_s / GB:g} GB/s per direction, "
            f"inter-node {self.inter_node_bytes_per_s / GB:g} GB/s per GPU, "
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
    peak_fp8_flops_per_s=1979e12,  # dense FP8, H100 datasheet
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
    inter_latency_s: float  # a collective over 2 nodes
    inter_hop_s: float  # each further network step (module docstring)
    inter_fraction: float  # of the inter-node figure
    inter_from: str  # where inter_fraction and inter_hop_s came from

    def describe(self) -> str:
        worlds = ", ".join(
            f"{n} GPUs floor {self.allreduce_floor_s[n] * 1e6:.1f} us, "
            f"bus {self.allreduce_bus_bytes_per_s[n] / GB:.0f} GB/s"
            for n in sorted(self.allreduce_floor_s)
        )
        return (
            f"intra-node all-reduce: {worlds}; send/recv floor {self.p2p_floor_s * 1e6:.1f} us, "
            f"{self.p2p_fraction:.3f} of NVLink; inter-node latency "
            f"{self.inter_latency_s * 1e6:.1f} us over 2 nodes, {self.inter_hop_s * 1e6:.1f} us "
            f"per further network step, {self.inter_fraction:.3f} of the inter-node "
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
            f"compute {self.compute_fraction:.3f} of peak "
            f"(largest GEMMs, p10-p90 {lo:.2f}-{hi:.2f}); "
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
    small_bytes = max(1 << 16, min(sizes))
    floor = statistics.median(
        e.median_s for e, s in zip(entries, sizes, strict=True) if s <= small_bytes
    )
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
        raise SpecError(
            f"profile {profile.name!r}: needs imported intra-node all-reduce and send/recv"
        )
    fits = {n: _collective_fit(es) for n, es in allreduce.items()}
    p2p_floor, p2p_bw = _collective_fit(p2p)
    inter = _series(colls, CollectiveKind.SEND_RECV, Scope.INTER).get(2)
    floors = [f for f, _ in fits.values()] + [p2p_floor]
    if inter is not None:
        inter_floor, inter_bw = _collective_fit(inter)
        inter_fraction = inter_bw / fig.inter_node_bytes_per_s
        inter_from = "imported inter-node send/recv"
        floors.append(inter_floor)
        hop = inter_floor
    else:
        inter_fraction = p2p_bw / fig.nvlink_bytes_per_s
        inter_from = (
            "no inter-node measurement: the intra-node send/recv fraction of NVLink and floor"
        )
        hop = p2p_floor
    return NetworkEfficiencies(
        allreduce_floor_s={n: f for n, (f, _) in fits.items()},
        allreduce_bus_bytes_per_s={n: b for n, (_, b) in fits.items()},
        p2p_floor_s=p2p_floor,
        p2p_fraction=p2p_bw / fig.nvlink_bytes_per_s,
        inter_latency_s=max(floors),
        inter_hop_s=hop,
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


def _geometric_sizes(lo: int, hi: int, per_octave: int) -> list[int]:
    """Even byte counts at `per_octave` points per doubling within [lo, hi]."""
    first, last = math.ceil(math.log2(lo) * per_octave), math.floor(math.log2(hi) * per_octave)
    return sorted({2 * round(2 ** (i / per_octave) / 2) for i in range(first, last + 1)})


def _octaves(lo: int, hi: int) -> tuple[int, ...]:
    """Powers of two from lo to hi (both powers of two)."""
    return tuple(1 << i for i in range(lo.bit_length() - 1, hi.bit_length()))


@dataclass(frozen=True, kw_only=True)
class CompletionGrid:
    """Where datasheet entries are computed. One point per octave: a roofline is smooth."""

    tp_degrees: tuple[int, ...] = (1, 2, 4, 8)
    lm_head_tokens: tuple[int, ...] = _octaves(1, 1 << 15)
    # Backward GEMMs happen in training only, where micro-batches hold >= 256 tokens.
    train_tokens: tuple[int, ...] = _octaves(1 << 8, 1 << 15)
    prefill_batches: tuple[int, ...] = (1, 8)
    prefill_seqs: tuple[int, ...] = _octaves(1 << 7, 1 << 15)
    decode_batches: tuple[int, ...] = (1, 16, 256)
    decode_kv_lens: tuple[int, ...] = _octaves(1 << 7, 1 << 15)
    optimizer_params: tuple[int, ...] = _octaves(1 << 16, 1 << 34)
    softmax_bytes: tuple[int, ...] = _octaves(1 << 12, 1 << 32)
    copy_bytes: tuple[int, ...] = _octaves(1 << 12, 1 << 34)
    collective_sizes_per_octave: int = 2  # over the imported collectives' size range
    # Up to 128 nodes: a 1,024-GPU cluster of 8-GPU nodes (the scaling table's largest).
    inter_world_sizes: tuple[int, ...] = (2, 4, 8, 16, 32, 64, 128)
    inter_max_bytes: int = 1 << 35  # the bf16 gradients of 16B parameters on one rank


def gpu_models() -> tuple[ModelSpec, ...]:
    """The catalogue's dense models meant for GPUs (the fp32 `tiny-*` models run on CPU;
    experts and latent attention have kernels of their own, not completed here)."""
    return tuple(
        m
        for m in CATALOGUE.values()
        if m.dtype is not DType.FP32 and not m.features & {Feature.MOE, Feature.MLA}
    )


def attention_heads(models: Iterable[ModelSpec], tp_degrees: Iterable[int]) -> set[tuple[int, ...]]:
    """(heads, kv_heads, head_dim) per rank over the TP degrees that divide the heads.

    With more ranks than KV heads each rank keeps one replicated KV head (vLLM,
    Megatron); a KV head count that does not divide evenly is skipped.
    """
    out: set[tuple[int, ...]] = set()
    for m in models:
        head_dim = m.head_dim
        for t in tp_degrees:
            if m.num_heads % t or (m.num_kv_heads >= t and m.num_kv_heads % t):
                continue
            out.add((m.num_heads // t, max(1, m.num_kv_heads // t), head_dim))
    return out


Shape = tuple[Op, dict[str, int | str]]


def _gemm(m: int, n: int, k: int) -> Shape:
    return Op.GEMM, {"m": m, "n": n, "k": k}


def _backward(m: int, n: int, k: int) -> Iterator[Shape]:
    """dX = dY W^T is (m, k, n); dW = X^T dY is (k, n, m)."""
    yield _gemm(m, k, n)
    yield _gemm(k, n, m)


def _gemm_shapes(
    profile: Profile, models: tuple[ModelSpec, ...], grid: CompletionGrid
) -> Iterator[Shape]:
    train = set(grid.train_tokens)
    for e in _imported(profile, Op.GEMM):
        m, n, k = (int(e.params[p]) for p in ("m", "n", "k"))
        if m in train:
            yield from _backward(m, n, k)
    for model in models:
        for t in grid.tp_degrees:
            n = math.ceil(model.vocab_size / t)  # vocab-parallel LM head
            for m in grid.lm_head_tokens:
                yield _gemm(m, n, model.hidden_size)
            for m in grid.train_tokens:
                yield from _backward(m, n, model.hidden_size)


def _attention_shapes(models: tuple[ModelSpec, ...], grid: CompletionGrid) -> Iterator[Shape]:
    for heads, kv, head_dim in sorted(attention_heads(models, grid.tp_degrees)):
        per_head = {"num_heads": heads, "num_kv_heads": kv, "head_dim": head_dim}
        for op in (Op.ATTN_PREFILL_FWD, Op.ATTN_PREFILL_BWD):
            for b in grid.prefill_batches:
                for s in grid.prefill_seqs:
                    yield op, {"batch": b, "seq": s, **per_head}
        for b in grid.decode_batches:
            for kv_len in grid.decode_kv_lens:
                yield Op.ATTN_DECODE, {"batch": b, "kv_len": kv_len, **per_head}


def _memory_op_shapes(grid: CompletionGrid) -> Iterator[Shape]:
    for n in grid.optimizer_params:
        yield Op.OPTIMIZER, {"num_params": n}
    for num_bytes in grid.softmax_bytes:
        yield Op.ELEMENTWISE, {"kind": ElementwiseKind.SOFTMAX.value, "num_bytes": num_bytes}
    for direction in CopyDirection:
        for num_bytes in grid.copy_bytes:
            yield Op.COPY, {"direction": direction.value, "num_bytes": num_bytes}


def _collective_shapes(
    profile: Profile, eff: Efficiencies, grid: CompletionGrid
) -> Iterator[Shape]:
    imported = [int(e.params["num_bytes"]) for e in _imported(profile, Op.COLLECTIVE)]
    per_octave = grid.collective_sizes_per_octave
    sizes = _geometric_sizes(min(imported), max(imported), per_octave)
    # Across nodes up to a whole gradient: beyond its last point a series is extrapolated
    # in proportion (`CostModel`), which would scale a many-node ring's latency with it.
    inter_sizes = _geometric_sizes(
        min(imported), max(max(imported), grid.inter_max_bytes), per_octave
    )
    intra_kinds = (
        CollectiveKind.ALL_GATHER,
        CollectiveKind.REDUCE_SCATTER,
        CollectiveKind.BROADCAST,
        CollectiveKind.ALL_TO_ALL,
    )
    for kind in CollectiveKind:
        scopes = [(Scope.INTER, grid.inter_world_sizes)]
        if kind in intra_kinds:
            scopes.append((Scope.INTRA, tuple(sorted(eff.network.allreduce_floor_s))))
        for scope, worlds in scopes:
            # A send/recv is between two ranks whatever the group: world size 2 only.
            for world in (2,) if kind is CollectiveKind.SEND_RECV else worlds:
                for size in inter_sizes if scope is Scope.INTER else sizes:
                    yield (
                        Op.COLLECTIVE,
                        {
                            "kind": kind.value,
                            "world_size": world,
                            "scope": scope.value,
                            "num_bytes": size,
                        },
                    )


def datasheet_time_s(
    op: Op, params: Mapping[str, int | str], fig: DatasheetFigures, eff: Efficiencies
) -> float:
    """The roofline time of one op (see the module docstring for the formulas)."""
    net = eff.network
    if op is Op.COPY:
        return net.p2p_floor_s + int(params["num_bytes"]) / (
            fig.host_link_bytes_per_s * net.p2p_fraction
        )
    if op is Op.COLLECTIVE:
        bus_bytes = ops.bytes_moved(op, params, _DTYPE_BYTES)
        world = int(params["world_size"])
        if params["scope"] == Scope.INTER.value:
            return inter_node_s(
                CollectiveKind(str(params["kind"])), int(params["num_bytes"]), world, fig, net
            )
        if params["kind"] == CollectiveKind.SEND_RECV.value:
            return net.p2p_floor_s + bus_bytes / (fig.nvlink_bytes_per_s * net.p2p_fraction)
        if world not in net.allreduce_floor_s:
            raise SpecError(f"no imported intra-node all-reduce of {world} GPUs to derive from")
        return net.allreduce_floor_s[world] + bus_bytes / net.allreduce_bus_bytes_per_s[world]
    hbm_fraction = (
        eff.elementwise_hbm_fraction if op in (Op.ELEMENTWISE, Op.OPTIMIZER) else eff.hbm_fraction
    )
    compute_s = ops.flops(op, params) / (fig.peak_bf16_flops_per_s * eff.compute_fraction)
    memory_s = ops.bytes_moved(op, params, _DTYPE_BYTES) / (fig.hbm_bytes_per_s * hbm_fraction)
    return eff.fixed_s + max(compute_s, memory_s)


# NCCL's tuning model (src/graph/tuning.cc): the tree's bus bandwidth is 0.9 of the ring's,
# and its algorithm bandwidth is half its bus bandwidth.
TREE_BANDWIDTH_FRACTION = 0.9 * 0.5


def extra_network_steps(kind: CollectiveKind, nodes: int) -> tuple[int, int | None]:
    """(ring, tree) network steps of a collective over `nodes` nodes beyond those of the
    same collective over 2 (module docstring); tree None where NCCL runs a ring only."""
    if nodes < 2:
        raise SpecError(f"an inter-node collective spans at least 2 nodes, got {nodes}")
    if kind is CollectiveKind.ALL_REDUCE:
        return 2 * (nodes - 2), 2 * (math.ceil(math.log2(nodes)) - 1)
    if kind in (CollectiveKind.ALL_GATHER, CollectiveKind.REDUCE_SCATTER, CollectiveKind.BROADCAST):
        return nodes - 2, None
    return 0, None  # send/recv, all-to-all: one network step whatever the group


def inter_node_s(
    kind: CollectiveKind,
    num_bytes: int,
    nodes: int,
    fig: DatasheetFigures,
    net: NetworkEfficiencies,
) -> float:
    """A collective of `num_bytes` over `nodes` nodes, one rank (and NIC) on each, as NCCL
    runs it: a ring, or for an all-reduce the faster of a ring and a tree (module
    docstring)."""
    link = fig.inter_node_bytes_per_s * net.inter_fraction
    bus = num_bytes * ops.collective_bus_factor(kind, nodes)
    ring_steps, tree_steps = extra_network_steps(kind, nodes)
    ring = net.inter_latency_s + ring_steps * net.inter_hop_s + bus / link
    if tree_steps is None:
        return ring
    tree = (
        net.inter_latency_s
        + tree_steps * net.inter_hop_s
        + num_bytes / (TREE_BANDWIDTH_FRACTION * link)
    )
    return min(ring, tree)


def completion_notes(figures: DatasheetFigures, eff: Efficiencies) -> str:
    return (
        f"Completed with datasheet roofline entries (source=datasheet) for backward and LM-head "
        f"GEMMs, attention prefill/backward/decode, the AdamW step, softmax, all-gather, "
        f"reduce-scatter, broadcast and all-to-all within a node, all collectives across nodes "
        f"(one NIC per GPU; an all-to-all across nodes sends all its bus bytes over the NIC) and "
        f"host copies, from {figures.describe()}. Efficiencies derived from this "
        f"profile's imported entries: {eff.describe()}. Attention uses the GEMM compute fraction "
        f"(no attention measurements were imported), which flatters attention kernels. "
        f"Imported fp16 and datasheet bf16 entries run at the same speed on this GPU."
    )


def complete_with_datasheet(
    profile: Profile,
    figures: DatasheetFigures,
    *,
    models: Iterable[ModelSpec] | None = None,
    grid: CompletionGrid | None = None,
) -> Profile:
    """`profile` plus datasheet entries for the series it lacks; its own series always win.

    `models` (default: the catalogue's GPU models) give the LM-head and attention
    shapes; the backward GEMMs are those of the profile's imported forward GEMMs.
    """
    eff = derive_efficiencies(profile, figures)
    chosen = gpu_models() if models is None else tuple(models)
    grid = grid or CompletionGrid()
    # Whole series, not just points: a datasheet point between two measured ones
    # would make the interpolated curve jump between two sources.
    have = {(e.op, ops.series_key(e.op, e.params)) for e in profile.entries}
    added: dict[object, Entry] = {}
    shapes = (
        *_gemm_shapes(profile, chosen, grid),
        *_attention_shapes(chosen, grid),
        *_memory_op_shapes(grid),
        *_collective_shapes(profile, eff, grid),
    )
    for op, params in shapes:
        if (op, ops.series_key(op, params)) in have:
            continue
        t = datasheet_time_s(op, params, figures, eff)
        entry = Entry(
            op=op, params=params, median_s=t, p10_s=t, p90_s=t, repeats=1, source=Source.DATASHEET
        )
        added.setdefault(entry.key(), entry)
    entries = (*profile.entries, *added.values())
    sources = {e.source for e in entries}
    prov = profile.provenance
    return replace(
        profile,
        provenance=replace(
            prov,
            source=sources.pop() if len(sources) == 1 else Source.MIXED,
            notes=f"{prov.notes} {completion_notes(figures, eff)}".strip(),
        ),
        entries=entries,
        grid={
            **profile.grid,
            "datasheet": asdict(grid),
            "datasheet_models": [m.name for m in chosen],
        },
    )
