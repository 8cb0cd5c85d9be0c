"""Import Vidur's measured GPU operator and collective profiles into a placeflow Profile.

Vidur (microsoft/vidur, MIT licence) published forward-operator timings of
transformer layers (sarathi-serve kernels, fp16, GPU kernel times from
torch.profiler) and NCCL collective timings for A100 and H100 DGX machines. This
module reads those CSVs and maps each timed operator to a placeflow op:

- `compute/<gpu>/<org>/<model>/mlp.csv`: one row per (model shape, num_tokens,
  tensor-parallel degree t). With head_dim = n_embd / n_head and m = num_tokens:
  attn_pre_proj -> gemm (m, (n_head + 2 n_kv_head) head_dim / t, n_embd);
  attn_post_proj -> gemm (m, n_embd, n_head head_dim / t);
  mlp_up_proj -> gemm (m, (2 if gated else 1) n_expanded_embd / t, n_embd);
  mlp_down_proj -> gemm (m, n_embd, n_expanded_embd / t);
  input_layernorm, post_attention_layernorm -> elementwise rmsnorm over m n_embd fp16;
  mlp_act -> elementwise silu_mul over m 2 n_expanded_embd / t fp16;
  add -> elementwise add over m n_embd fp16.
  `n_expanded_embd` is the per-branch FFN size (Vidur's `mlp_hidden_dim`; Qwen-72B
  lists 24576, half its HF `intermediate_size`), and the gated up-projection
  computes both branches in one GEMM (sarathi's `ColumnParallelLinear(2 * ffn)`).
- `network/<gpu>_dgx/{all_reduce,send_recv}.csv`: `size` is bytes (fp16 elements
  times 2), `num_workers` the ranks, `devices_per_node` how many of them share a
  node: ranks on more than one node make the row an inter-node measurement.

Where this departs from a plain copy:
- Vidur gives min/max/mean/median/std per row, not percentiles. p10/p90 are the
  normal quantiles median -/+ 1.2816 std, clamped to the observed [min, max].
- Rows that map to the same (op, params) (duplicate rows, shared shapes across
  models, both norms of a layer) merge by the median of their medians (p10 and
  p90 likewise); `repeats` is the sum of the rows' repeats (20 timed layer
  repeats per operator row; 3 per collective row, each itself the median of 11
  NCCL calls).
- Non-gated models (phi-2) contribute GEMMs only: their block uses LayerNorm,
  GELU and a three-way parallel-residual add, which are not the rmsnorm /
  silu_mul / add kernels placeflow's elementwise kinds mean.
- The token and byte grids are dense (every 8-32 tokens, every 8 KiB); they are
  thinned to a geometric subset so that the shipped files stay small.
"""

from __future__ import annotations

import csv
import math
import statistics
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from placeflow.errors import SpecError
from placeflow.profiles.schema import (
    CollectiveKind,
    ElementwiseKind,
    Entry,
    Op,
    Profile,
    Provenance,
    Scope,
    Source,
)

VIDUR_REPO = "microsoft/vidur"
VIDUR_COMMIT = "7d47513"
VIDUR_COMMIT_DATE = "2024-11-19"
VIDUR_GPUS = ("h100", "a100")
DEVICE_NAMES = {
    "h100": "NVIDIA H100 80GB HBM3 SXM (Vidur's DGX measurements)",
    "a100": "NVIDIA A100-SXM4-80GB (Vidur's DGX measurements)",
}

# Vidur's profilers: 20 repeats of the layer per operator row (ACTIVE_STEPS in
# vidur/profiling/mlp/mlp_wrapper.py), 3 per collective row (collectives_wrapper.py).
OPERATOR_REPEATS = 20
COLLECTIVE_REPEATS = 3
_Z_P90 = 1.2816  # standard-normal 90th percentile
_FP16_BYTES = 2

# Default thinning: points kept per doubling of the size axis.
TOKENS_PER_OCTAVE = 2
BYTES_PER_OCTAVE = 4


@dataclass(frozen=True, kw_only=True)
class Timing:
    """One op's time at one shape, in seconds, and how many timed repeats stand behind it."""

    median_s: float
    p10_s: float
    p90_s: float
    repeats: int


@dataclass(frozen=True, kw_only=True)
class LayerShape:
    """The shape columns of one row of a Vidur `mlp.csv`."""

    n_head: int
    n_kv_head: int
    n_embd: int
    n_expanded_embd: int
    gated: bool
    num_tokens: int
    tp: int

    @staticmethod
    def from_row(row: dict[str, str]) -> LayerShape:
        return LayerShape(
            n_head=int(row["n_head"]),
            n_kv_head=int(row["n_kv_head"]),
            n_embd=int(row["n_embd"]),
            n_expanded_embd=int(row["n_expanded_embd"]),
            gated=row["use_gated_mlp"].strip().lower() == "true",
            num_tokens=int(row["num_tokens"]),
            tp=int(row["num_tensor_parallel_workers"]),
        )


def operator_params(name: str, s: LayerShape) -> tuple[Op, dict[str, int | str]] | None:
    """The placeflow op and params of Vidur operator `name` at shape s, or None if not mapped."""
    m, t = s.num_tokens, s.tp
    head_dim = s.n_embd // s.n_head
    if name == "attn_pre_proj":
        return Op.GEMM, {"m": m, "n": (s.n_head + 2 * s.n_kv_head) * head_dim // t, "k": s.n_embd}
    if name == "attn_post_proj":
        return Op.GEMM, {"m": m, "n": s.n_embd, "k": s.n_head * head_dim // t}
    if name == "mlp_up_proj":
        branches = 2 if s.gated else 1
        return Op.GEMM, {"m": m, "n": branches * s.n_expanded_embd // t, "k": s.n_embd}
    if name == "mlp_down_proj":
        return Op.GEMM, {"m": m, "n": s.n_embd, "k": s.n_expanded_embd // t}
    if not s.gated:
        return None  # LayerNorm / GELU / parallel-residual block (phi-2): see module docstring
    hidden_bytes = m * s.n_embd * _FP16_BYTES
    if name in ("input_layernorm", "post_attention_layernorm"):
        return Op.ELEMENTWISE, {"kind": ElementwiseKind.RMSNORM.value, "num_bytes": hidden_bytes}
    if name == "mlp_act":
        act_bytes = m * 2 * s.n_expanded_embd // t * _FP16_BYTES
        return Op.ELEMENTWISE, {"kind": ElementwiseKind.SILU_MUL.value, "num_bytes": act_bytes}
    if name == "add":
        return Op.ELEMENTWISE, {"kind": ElementwiseKind.ADD.value, "num_bytes": hidden_bytes}
    return None  # emb, attn_rope: no placeflow op


MAPPED_OPERATORS = (
    "attn_pre_proj",
    "attn_post_proj",
    "mlp_up_proj",
    "mlp_down_proj",
    "input_layernorm",
    "post_attention_layernorm",
    "mlp_act",
    "add",
)


def row_timing(row: dict[str, str], name: str, repeats: int) -> Timing:
    """Seconds from a row's `time_stats.<name>.*` columns (milliseconds)."""
    stat = {s: float(row[f"time_stats.{name}.{s}"]) * 1e-3 for s in ("min", "max", "median", "std")}
    median = stat["median"]
    return Timing(
        median_s=median,
        p10_s=min(median, max(stat["min"], median - _Z_P90 * stat["std"])),
        p90_s=max(median, min(stat["max"], median + _Z_P90 * stat["std"])),
        repeats=repeats,
    )


def merge_timings(timings: list[Timing]) -> Timing:
    """Median of medians (p10 and p90 likewise); repeats add up."""
    median = statistics.median(t.median_s for t in timings)
    return Timing(
        median_s=median,
        p10_s=min(median, statistics.median(t.p10_s for t in timings)),
        p90_s=max(median, statistics.median(t.p90_s for t in timings)),
        repeats=sum(t.repeats for t in timings),
    )


def geometric_subset(values: Iterable[int], per_octave: int) -> set[int]:
    """The values nearest (in log distance) to a grid of `per_octave` points per doubling.

    The smallest and largest values are always kept, so the thinned grid spans
    the same range as the dense one.
    """
    ordered = sorted(set(values))
    if not ordered:
        return set()
    lo, hi = math.log2(ordered[0]), math.log2(ordered[-1])
    logs = [math.log2(v) for v in ordered]
    kept = {ordered[0], ordered[-1]}
    for i in range(math.floor(lo * per_octave), math.ceil(hi * per_octave) + 1):
        target = i / per_octave
        j = min(range(len(ordered)), key=lambda j: abs(logs[j] - target))
        kept.add(ordered[j])
    return kept


def _read_csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def _entries(
    groups: dict[tuple[Op, tuple[tuple[str, int | str], ...]], list[Timing]],
) -> list[Entry]:
    out = []
    for (op, params), timings in groups.items():
        t = merge_timings(timings)
        out.append(
            Entry(
                op=op,
                params=dict(params),
                median_s=t.median_s,
                p10_s=t.p10_s,
                p90_s=t.p90_s,
                repeats=t.repeats,
                source=Source.IMPORTED,
            )
        )
    return out


def operator_files(vidur_dir: Path, gpu: str) -> list[Path]:
    return sorted((vidur_dir / "compute" / gpu).glob("*/*/mlp.csv"))


def read_operator_entries(vidur_dir: Path, gpu: str, *, tokens_per_octave: int) -> list[Entry]:
    """GEMM and elementwise entries from every model's `mlp.csv`, merged and thinned."""
    groups: dict[tuple[Op, tuple[tuple[str, int | str], ...]], list[Timing]] = {}
    for path in operator_files(vidur_dir, gpu):
        rows = _read_csv(path)
        kept_tokens = geometric_subset((int(r["num_tokens"]) for r in rows), tokens_per_octave)
        for row in rows:
            shape = LayerShape.from_row(row)
            if shape.num_tokens not in kept_tokens:
                continue
            for name in MAPPED_OPERATORS:
                mapped = operator_params(name, shape)
                if mapped is None or f"time_stats.{name}.median" not in row:
                    continue
                op, params = mapped
                key = (op, tuple(sorted(params.items())))
                groups.setdefault(key, []).append(row_timing(row, name, OPERATOR_REPEATS))
    return _thin_elementwise(_entries(groups), BYTES_PER_OCTAVE)


def _thin_elementwise(entries: list[Entry], per_octave: int) -> list[Entry]:
    """Keep a geometric subset of each elementwise kind's sizes (shapes of all models merge)."""
    kept: dict[str, set[int]] = {}
    for kind in ElementwiseKind:
        sizes = [
            int(e.params["num_bytes"])
            for e in entries
            if e.op is Op.ELEMENTWISE and e.params["kind"] == kind.value
        ]
        kept[kind.value] = geometric_subset(sizes, per_octave)
    return [
        e
        for e in entries
        if e.op is not Op.ELEMENTWISE or int(e.params["num_bytes"]) in kept[str(e.params["kind"])]
    ]


def _network_rows(vidur_dir: Path, gpu: str) -> Iterator[tuple[CollectiveKind, dict[str, str]]]:
    for kind in (CollectiveKind.ALL_REDUCE, CollectiveKind.SEND_RECV):
        path = vidur_dir / "network" / f"{gpu}_dgx" / f"{kind.value}.csv"
        for row in _read_csv(path):
            yield kind, row


def read_network_entries(
    vidur_dir: Path, gpu: str, *, bytes_per_octave: int, inter_node: bool
) -> list[Entry]:
    """All-reduce and send/recv entries; inter-node rows only if `inter_node`."""
    rows = list(_network_rows(vidur_dir, gpu))
    kept_sizes = geometric_subset((int(r["size"]) for _, r in rows), bytes_per_octave)
    groups: dict[tuple[Op, tuple[tuple[str, int | str], ...]], list[Timing]] = {}
    for kind, row in rows:
        size = int(row["size"])
        world = int(row["num_workers"])
        scope = Scope.INTRA if int(row["devices_per_node"]) >= world else Scope.INTER
        if size not in kept_sizes or (scope is Scope.INTER and not inter_node):
            continue
        params: dict[str, int | str] = {
            "kind": kind.value,
            "world_size": world,
            "scope": scope.value,
            "num_bytes": size,
        }
        key = (Op.COLLECTIVE, tuple(sorted(params.items())))
        groups.setdefault(key, []).append(row_timing(row, kind.value, COLLECTIVE_REPEATS))
    return _entries(groups)


def import_vidur(
    vidur_dir: Path,
    gpu: str,
    *,
    tokens_per_octave: int = TOKENS_PER_OCTAVE,
    bytes_per_octave: int = BYTES_PER_OCTAVE,
    inter_node: bool = True,
    import_date: str = "",
) -> Profile:
    """A profile of Vidur's measurements for `gpu` ("h100" or "a100"); every entry is imported.

    `inter_node=False` leaves out the collectives Vidur measured across nodes
    (their fabric may not be the one a profile is meant to model).
    """
    if gpu not in VIDUR_GPUS:
        raise SpecError(f"Vidur GPU {gpu!r} not supported; use one of {', '.join(VIDUR_GPUS)}")
    if not operator_files(vidur_dir, gpu):
        raise SpecError(f"{vidur_dir}: no compute/{gpu}/<org>/<model>/mlp.csv; is it Vidur's data?")
    operators = read_operator_entries(vidur_dir, gpu, tokens_per_octave=tokens_per_octave)
    network = read_network_entries(
        vidur_dir, gpu, bytes_per_octave=bytes_per_octave, inter_node=inter_node
    )
    models = [f"{p.parent.parent.name}/{p.parent.name}" for p in operator_files(vidur_dir, gpu)]
    notes = (
        f"Imported from {VIDUR_REPO} (commit {VIDUR_COMMIT}, {VIDUR_COMMIT_DATE}, MIT licence): "
        f"forward-operator GEMMs and norms of {', '.join(models)} (fp16, sarathi-serve kernels, "
        f"GPU kernel times from torch.profiler) and NCCL all-reduce / send-recv on {gpu}_dgx. "
        "p10/p90 are median -/+ 1.2816 std clamped to [min, max]; rows of one shape merge by the "
        f"median of medians; grids thinned to {tokens_per_octave} token counts and "
        f"{bytes_per_octave} collective sizes per octave."
        + ("" if inter_node else " Inter-node collectives left out.")
    )
    return Profile(
        name=f"vidur-{gpu}",
        device_kind="cuda",
        provenance=Provenance(
            source=Source.IMPORTED,
            device_name=DEVICE_NAMES[gpu],
            torch_version="n/a (imported)",
            dtype="fp16",
            date=f"{VIDUR_COMMIT_DATE} (Vidur {VIDUR_COMMIT})"
            + (f", imported {import_date}" if import_date else ""),
            host={
                "machine": f"{gpu}_dgx: 8 GPUs on NVSwitch per node, measured by Vidur's authors",
                "vidur_repo": VIDUR_REPO,
                "vidur_commit": VIDUR_COMMIT,
                "licence": "MIT",
            },
            notes=notes,
        ),
        entries=tuple(operators + network),
        grid={
            "vidur_models": models,
            "tokens_per_octave": tokens_per_octave,
            "bytes_per_octave": bytes_per_octave,
        },
    )
