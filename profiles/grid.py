"""ProfilerGrid: which kernels the profiler times, at which shapes.

A grid is plain data: explicit GEMM, attention and decode shapes, elementwise
and optimizer sizes, collectives and copies, plus the timer's warm-up, repeats
and per-point time budget. Tests build small grids directly; the two factories
`ProfilerGrid.quick(device)` and `ProfilerGrid.full(device)` derive the shapes
from the catalogue (`placeflow.catalogue.CATALOGUE`):

- GEMMs are the weight matmuls of one transformer layer plus the LM head, under
  tensor parallelism t in {1, 2, 4, 8} (t must divide the heads, the KV heads
  and the FFN size; the vocabulary is padded up as Megatron does), with C[m, n]
  = A[m, k] @ B[k, n] and m the token count:

      qkv      n = (q_size + 2·kv_size) / t   k = hidden
      o_proj   n = hidden                     k = q_size / t
      gate_up  n = 2·ffn / t                  k = hidden
      down     n = hidden                     k = ffn / t
      lm_head  n = ceil(vocab / t)            k = hidden

  Training adds each one's backward: dX = dY @ Wᵀ is (m, k, n) and dW = Xᵀ @ dY
  is (k, n, m), the token count being dW's reduction dimension. All are timed
  as plain contiguous matmuls (the transposes of a real backward are not
  reproduced). A dW shape has the token count in k, so each token count makes
  its own one-point series along m; the cost model bridges such series by its
  nearest-series rule.
- Token counts, attention sequence lengths and sizes are geometric, so that a
  series can be interpolated in log-log space and checked leave-one-out. A
  series (fixed n, k for GEMMs; fixed heads for attention) keeps only the
  points under the grid's work cap, and is dropped whole if fewer than
  `MIN_SERIES_POINTS` remain: a 2-point series can neither be interpolated
  with confidence nor be checked leave-one-out.

On CPU (fp32, ~50-150 GFLOP/s on two cores) the factories use the small
catalogue models and cap each GEMM at 3 GFLOP (quick) or 20 GFLOP (full), about
0.03-0.2 s a call; on CUDA (bf16) the full grid covers the whole catalogue.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from placeflow.catalogue import CATALOGUE
from placeflow.errors import SpecError
from placeflow.models import DType, ModelSpec
from placeflow.profiles.schema import (
    CollectiveKind,
    CopyDirection,
    ElementwiseKind,
    FrameworkKind,
    Op,
)

# Bytes per element by profile dtype name, from the one definition (DType.num_bytes).
DTYPE_BYTES = {d.value: d.num_bytes for d in DType}
DEVICES = ("cpu", "cuda")
TP_DEGREES = (1, 2, 4, 8)
MIN_SERIES_POINTS = 5
SMALL_MODELS = ("tiny-llama", "tiny-llama-m", "tiny-qwen2", "smollm2-135m", "qwen2.5-0.5b")


def _check_positive(where: str, **values: int) -> None:
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise SpecError(f"{where}: {name} must be a positive integer, got {value!r}")


@dataclass(frozen=True, kw_only=True, order=True)
class GemmShape:
    """C[m, n] = A[m, k] @ B[k, n]."""

    m: int
    n: int
    k: int

    def __post_init__(self) -> None:
        _check_positive("gemm shape", m=self.m, n=self.n, k=self.k)

    def params(self) -> dict[str, int | str]:
        return {"m": self.m, "n": self.n, "k": self.k}


@dataclass(frozen=True, kw_only=True, order=True)
class AttnShape:
    """Causal prefill attention: `batch` sequences of `seq` tokens, grouped-query heads."""

    batch: int
    seq: int
    num_heads: int
    num_kv_heads: int
    head_dim: int

    def __post_init__(self) -> None:
        _check_positive("attention shape", **self.params_int())
        if self.num_heads % self.num_kv_heads:
            raise SpecError(
                f"attention shape: num_kv_heads={self.num_kv_heads} must divide "
                f"num_heads={self.num_heads}"
            )

    def params_int(self) -> dict[str, int]:
        return {
            "batch": self.batch,
            "seq": self.seq,
            "num_heads": self.num_heads,
            "num_kv_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
        }

    def params(self) -> dict[str, int | str]:
        return dict(self.params_int())


@dataclass(frozen=True, kw_only=True, order=True)
class DecodeShape:
    """Decode attention: one query token per sequence against `kv_len` cached tokens."""

    batch: int
    kv_len: int
    num_heads: int
    num_kv_heads: int
    head_dim: int

    def __post_init__(self) -> None:
        _check_positive("decode shape", **self.params_int())
        if self.num_heads % self.num_kv_heads:
            raise SpecError(
                f"decode shape: num_kv_heads={self.num_kv_heads} must divide "
                f"num_heads={self.num_heads}"
            )

    def params_int(self) -> dict[str, int]:
        return {
            "batch": self.batch,
            "kv_len": self.kv_len,
            "num_heads": self.num_heads,
            "num_kv_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
        }

    def params(self) -> dict[str, int | str]:
        return dict(self.params_int())


@dataclass(frozen=True, kw_only=True)
class GridPoint:
    """One point to time: an op and its parameters (as in `schema.OP_PARAMS`)."""

    op: Op
    params: Mapping[str, int | str]


def _no_duplicates(where: str, values: Iterable[object]) -> None:
    seen: set[object] = set()
    for v in values:
        if v in seen:
            raise SpecError(f"profiler grid: {where} lists {v!r} twice")
        seen.add(v)


@dataclass(frozen=True, kw_only=True)
class ProfilerGrid:
    """What to time on one device. Sizes are bytes (`_bytes`) or element counts.

    Prefill attention shapes are timed forward and backward. Elementwise ops are
    timed at every (kind, size) pair, collectives at every (kind, world size,
    size) triple (sizes are the full logical tensor, nccl-tests convention),
    copies in both directions (on CPU a copy between two host buffers: what
    an offload does on a CPU worker, whose device is the host). `point_budget_s` bounds the sampling
    time of one point (at least three samples are always taken). `origin`
    records how a factory derived the shapes; it is informational.
    """

    device: str
    dtype: str
    gemm_shapes: tuple[GemmShape, ...] = ()
    attn_prefill_shapes: tuple[AttnShape, ...] = ()
    attn_decode_shapes: tuple[DecodeShape, ...] = ()
    elementwise_kinds: tuple[ElementwiseKind, ...] = ()
    elementwise_bytes: tuple[int, ...] = ()
    optimizer_num_params: tuple[int, ...] = ()
    collective_kinds: tuple[CollectiveKind, ...] = ()
    collective_world_sizes: tuple[int, ...] = ()
    collective_bytes: tuple[int, ...] = ()
    copy_bytes: tuple[int, ...] = ()
    dispatch_bytes: tuple[int, ...] = ()  # Ray call round trips (profiles/ray_roundtrip.py)
    warmup: int = 2
    repeats: int = 10
    point_budget_s: float = 1.0
    origin: Mapping[str, Any] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        if self.device not in DEVICES:
            raise SpecError(f"profiler grid: device must be one of {DEVICES}, got {self.device!r}")
        if self.dtype not in DTYPE_BYTES:
            known = ", ".join(DTYPE_BYTES)
            raise SpecError(f"profiler grid: dtype {self.dtype!r} unknown; known: {known}")
        if isinstance(self.warmup, bool) or not isinstance(self.warmup, int) or self.warmup < 0:
            raise SpecError(f"profiler grid: warmup must be an integer >= 0, got {self.warmup!r}")
        _check_positive("profiler grid", repeats=self.repeats)
        if not self.point_budget_s > 0:
            raise SpecError(f"profiler grid: point_budget_s must be > 0, got {self.point_budget_s}")
        # Accept plain strings for the kinds, as a TOML or JSON grid would give them.
        kinds = tuple(ElementwiseKind(k) for k in self.elementwise_kinds)
        object.__setattr__(self, "elementwise_kinds", kinds)
        ckinds = tuple(CollectiveKind(k) for k in self.collective_kinds)
        object.__setattr__(self, "collective_kinds", ckinds)
        self._check_sizes()
        self._check_collectives()

    def _check_sizes(self) -> None:
        for name in ("gemm_shapes", "attn_prefill_shapes", "attn_decode_shapes"):
            _no_duplicates(name, getattr(self, name))
        for name in ("elementwise_bytes", "optimizer_num_params", "copy_bytes", "dispatch_bytes"):
            values = getattr(self, name)
            _no_duplicates(name, values)
            for v in values:
                _check_positive(f"profiler grid {name}", value=v)
        _no_duplicates("elementwise_kinds", self.elementwise_kinds)
        # silu_mul splits its input in two halves, so sizes must hold an even element count.
        unit = 2 * DTYPE_BYTES[self.dtype]
        bad = [b for b in self.elementwise_bytes if b % unit]
        if bad:
            raise SpecError(f"profiler grid: elementwise_bytes {bad} must be multiples of {unit}")

    def _check_collectives(self) -> None:
        _no_duplicates("collective_kinds", self.collective_kinds)
        _no_duplicates("collective_world_sizes", self.collective_world_sizes)
        _no_duplicates("collective_bytes", self.collective_bytes)
        given = [bool(self.collective_kinds), bool(self.collective_world_sizes)]
        given.append(bool(self.collective_bytes))
        if any(given) and not all(given):
            raise SpecError(
                "profiler grid: collectives need collective_kinds, collective_world_sizes and "
                "collective_bytes together (or none of them)"
            )
        for ws in self.collective_world_sizes:
            if isinstance(ws, bool) or not isinstance(ws, int) or ws < 2:
                raise SpecError(f"profiler grid: collective world sizes must be >= 2, got {ws!r}")
            # Every rank holds an equal shard of the logical tensor.
            unit = ws * DTYPE_BYTES[self.dtype]
            bad = [b for b in self.collective_bytes if b % unit]
            if bad:
                raise SpecError(
                    f"profiler grid: collective_bytes {bad} must be multiples of {unit} "
                    f"(world size {ws} x {DTYPE_BYTES[self.dtype]} bytes per element)"
                )

    # --- the points -----------------------------------------------------
    def points(self) -> tuple[GridPoint, ...]:
        """Every non-collective point, in timing order (collectives run in their own processes)."""
        out = [GridPoint(op=Op.GEMM, params=s.params()) for s in self.gemm_shapes]
        for a in self.attn_prefill_shapes:
            out.append(GridPoint(op=Op.ATTN_PREFILL_FWD, params=a.params()))
            out.append(GridPoint(op=Op.ATTN_PREFILL_BWD, params=a.params()))
        out += [GridPoint(op=Op.ATTN_DECODE, params=d.params()) for d in self.attn_decode_shapes]
        for kind in self.elementwise_kinds:
            out += [
                GridPoint(op=Op.ELEMENTWISE, params={"kind": kind.value, "num_bytes": b})
                for b in self.elementwise_bytes
            ]
        out += [
            GridPoint(op=Op.OPTIMIZER, params={"num_params": n}) for n in self.optimizer_num_params
        ]
        for direction in CopyDirection:
            out += [
                GridPoint(op=Op.COPY, params={"direction": direction.value, "num_bytes": b})
                for b in self.copy_bytes
            ]
        return tuple(out)

    def num_collective_points(self) -> int:
        n = len(self.collective_kinds) * len(self.collective_world_sizes)
        return n * len(self.collective_bytes)

    def to_json(self) -> dict[str, Any]:
        """The grid as a JSON-serialisable dict (recorded in `Profile.grid`)."""
        return {
            "device": self.device,
            "dtype": self.dtype,
            "gemm_shapes": [s.params() for s in self.gemm_shapes],
            "attn_prefill_shapes": [s.params() for s in self.attn_prefill_shapes],
            "attn_decode_shapes": [s.params() for s in self.attn_decode_shapes],
            "elementwise_kinds": [k.value for k in self.elementwise_kinds],
            "elementwise_bytes": list(self.elementwise_bytes),
            "optimizer_num_params": list(self.optimizer_num_params),
            "collective_kinds": [k.value for k in self.collective_kinds],
            "collective_world_sizes": list(self.collective_world_sizes),
            "collective_bytes": list(self.collective_bytes),
            "copy_bytes": list(self.copy_bytes),
            "dispatch_bytes": list(self.dispatch_bytes),
            "warmup": self.warmup,
            "repeats": self.repeats,
            "point_budget_s": self.point_budget_s,
            "origin": dict(self.origin),
        }

    # --- factories ------------------------------------------------------
    @staticmethod
    def quick(device: str, *, num_devices: int | None = None) -> ProfilerGrid:
        """A few minutes on a 2-core CPU; every op kind, >= 5 points per series.

        `num_devices` (CUDA only) bounds the collective world sizes; by default
        the number of GPUs torch sees.
        """
        return _from_recipe(_quick_recipe(device, _num_gpus(device, num_devices)))

    @staticmethod
    def full(device: str, *, num_devices: int | None = None) -> ProfilerGrid:
        """The shipped-profile grid: denser sizes; on CUDA, the whole catalogue."""
        return _from_recipe(_full_recipe(device, _num_gpus(device, num_devices)))


# --- recipes: how the factories derive a grid -----------------------------


@dataclass(frozen=True, kw_only=True)
class _Recipe:
    """The knobs of a factory grid; recorded as the grid's `origin`."""

    device: str
    dtype: str
    models: tuple[str, ...]
    token_counts: tuple[int, ...]
    max_gemm_flops: float
    attn_batches: tuple[int, ...]
    attn_seqs: tuple[int, ...]
    max_attn_flops: float
    decode_batches: tuple[int, ...]
    decode_kv_lens: tuple[int, ...]
    max_kv_cache_bytes: int
    elementwise_bytes: tuple[int, ...]
    optimizer_num_params: tuple[int, ...]
    collective_world_sizes: tuple[int, ...]
    collective_bytes: tuple[int, ...]
    copy_bytes: tuple[int, ...]
    warmup: int
    repeats: int
    point_budget_s: float


def geometric(lo: int, hi: int, factor: int = 2) -> tuple[int, ...]:
    """lo, lo·factor, lo·factor², ... up to hi inclusive."""
    out = [lo]
    while out[-1] * factor <= hi:
        out.append(out[-1] * factor)
    return tuple(out)


def _num_gpus(device: str, num_devices: int | None) -> int:
    if device not in DEVICES:
        raise SpecError(f"profiler grid: device must be one of {DEVICES}, got {device!r}")
    if device == "cpu":
        return 0
    if num_devices is not None:
        return num_devices
    import torch  # only the CUDA factory asks torch how many GPUs there are

    return torch.cuda.device_count()


KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30
# Host copies on CPU (offloads on CPU workers): a tiny model's shard up to a large one's.
CPU_COPY_BYTES = geometric(4 * KIB, 256 * MIB)
# Ray call payloads: a scoring call's shard of a small batch up to a large rollout.
DISPATCH_BYTES = geometric(1 * KIB, 64 * MIB, 4)
# A per-tensor dispatch entry's tensors: small, so that their count is what is timed.
DISPATCH_TENSOR_BYTES = 64
# The `shared_collective` entry's probe (`profiles.shared_cores`): an all-reduce of
# SHARED_PROBE_BYTES within pairs of ranks, SHARED_RANKS_PER_CORE busy ranks per core:
# small, so that the wait, not the bandwidth, is measured.
SHARED_PROBE_BYTES = 4096
SHARED_PROBE_WORLD = 2
SHARED_RANKS_PER_CORE = 2  # the most oversubscription the shared entries are measured at
# The driver's pause before each `empty_call` probe's call (its ranks idle; about a
# phase's collection and launches on the 2-core VM): the `empty_wake` entries' curve
# starts there (`CostModel.empty_wake_curve`).
EMPTY_CALL_PAUSE_S = 0.003
# The framework profiler's reference model (`profiles.framework`: the engine's pieces
# are timed through it, and the shared-cores probes and the calls' wake-up run it).
REFERENCE_MODEL = "tiny-llama"
# The `cold_weights` entries' model (`profiles.shared_cores`): the GEMM weights a pass
# reads, 12.3 MB, past a core's own cache and within the last-level cache here.
COLD_MODEL = "tiny-llama-m"


def cold_model_bytes() -> int:
    """The weights of `COLD_MODEL` (`CostModel.cold_weights_s` scales its entries by
    bytes over these)."""
    return CATALOGUE[COLD_MODEL].num_bytes()


# A model call's kind (the dataflow's `CallKind` values, in an actor rank's order) -> the
# kinds of its wake-up entries on `REFERENCE_MODEL` and on `COLD_MODEL`
# (`profiles.wake_calls` measures them, `CostModel.call_wake_curve` reads them).
WAKE_KINDS_OF: Mapping[str, tuple[FrameworkKind, FrameworkKind]] = {
    "generate": (FrameworkKind.WAKE_GENERATE, FrameworkKind.WAKE_GENERATE_LARGE),
    "forward": (FrameworkKind.WAKE_FORWARD, FrameworkKind.WAKE_FORWARD_LARGE),
    "train": (FrameworkKind.WAKE_UPDATE, FrameworkKind.WAKE_UPDATE_LARGE),
}
WAKE_KINDS = tuple(k for pair in WAKE_KINDS_OF.values() for k in pair)


def wake_model_bytes() -> tuple[int, int]:
    """The weights of the two models the calls' wake-up entries are measured on
    (`profiles.wake_calls`): `REFERENCE_MODEL`'s and `COLD_MODEL`'s
    (`CostModel.call_wake_curve` interpolates between them by a rank's weight bytes)."""
    return CATALOGUE[REFERENCE_MODEL].num_bytes(), cold_model_bytes()


def _quick_recipe(device: str, num_gpus: int) -> _Recipe:
    if device == "cpu":
        return _Recipe(
            device="cpu", dtype="fp32",
            models=("tiny-llama", "tiny-llama-m", "smollm2-135m", "qwen2.5-0.5b"),
            token_counts=geometric(1, 1024), max_gemm_flops=3e9,
            attn_batches=(1,), attn_seqs=geometric(32, 1024), max_attn_flops=3e9,
            decode_batches=(1, 8), decode_kv_lens=geometric(64, 8192),
            max_kv_cache_bytes=256 * MIB,
            elementwise_bytes=geometric(4 * KIB, 64 * MIB),
            optimizer_num_params=geometric(1 << 12, 1 << 22),
            collective_world_sizes=(2, 4), collective_bytes=geometric(4 * KIB, 16 * MIB),
            copy_bytes=geometric(4 * KIB, 64 * MIB), warmup=1, repeats=7, point_budget_s=0.25,
        )  # fmt: skip
    return _Recipe(
        device="cuda", dtype="bf16",
        models=("llama-3.1-8b", "qwen2.5-7b", "qwen2.5-0.5b"),
        token_counts=geometric(1, 8192, 2), max_gemm_flops=1e15,
        attn_batches=(1,), attn_seqs=geometric(128, 16384), max_attn_flops=1e15,
        decode_batches=(1, 16, 64), decode_kv_lens=geometric(128, 32768, 2),
        max_kv_cache_bytes=8 * GIB,
        elementwise_bytes=geometric(64 * KIB, 1 * GIB, 4),
        optimizer_num_params=geometric(1 << 16, 1 << 28, 4),
        collective_world_sizes=tuple(w for w in (2, 4, 8) if w <= num_gpus),
        collective_bytes=geometric(4 * KIB, 1 * GIB, 4),
        copy_bytes=geometric(64 * KIB, 1 * GIB, 4), warmup=3, repeats=10, point_budget_s=0.3,
    )  # fmt: skip


def _full_recipe(device: str, num_gpus: int) -> _Recipe:
    if device == "cpu":
        return _Recipe(
            device="cpu", dtype="fp32", models=SMALL_MODELS,
            token_counts=geometric(1, 8192), max_gemm_flops=2e10,
            attn_batches=(1, 4), attn_seqs=geometric(16, 4096), max_attn_flops=2e10,
            decode_batches=(1, 4, 16, 64), decode_kv_lens=geometric(16, 16384),
            max_kv_cache_bytes=1 * GIB,
            elementwise_bytes=geometric(1 * KIB, 256 * MIB),
            optimizer_num_params=geometric(1 << 10, 1 << 26),
            collective_world_sizes=(2, 4), collective_bytes=geometric(1 * KIB, 64 * MIB),
            copy_bytes=CPU_COPY_BYTES, warmup=2, repeats=10, point_budget_s=0.6,
        )  # fmt: skip
    return _Recipe(
        device="cuda", dtype="bf16", models=tuple(CATALOGUE),
        token_counts=geometric(1, 32768), max_gemm_flops=1e15,
        attn_batches=(1, 4), attn_seqs=geometric(64, 32768), max_attn_flops=1e15,
        decode_batches=(1, 4, 16, 64, 256), decode_kv_lens=geometric(64, 65536),
        max_kv_cache_bytes=16 * GIB,
        elementwise_bytes=geometric(16 * KIB, 2 * GIB),
        optimizer_num_params=geometric(1 << 14, 1 << 29),
        collective_world_sizes=tuple(w for w in (2, 4, 8) if w <= num_gpus),
        collective_bytes=geometric(1 * KIB, 2 * GIB),
        copy_bytes=geometric(4 * KIB, 2 * GIB), warmup=5, repeats=20, point_budget_s=0.5,
    )  # fmt: skip


def _tp_degrees(model: ModelSpec) -> tuple[int, ...]:
    """TP degrees that split heads, KV heads and the FFN evenly."""
    dims = (model.num_heads, model.num_kv_heads, model.ffn_hidden_size)
    return tuple(t for t in TP_DEGREES if all(d % t == 0 for d in dims))


def layer_gemms(model: ModelSpec, tp: int) -> dict[str, tuple[int, int]]:
    """(n, k) of each weight matmul of one layer and the LM head under TP degree `tp`."""
    h = model.hidden_size
    return {
        "qkv": ((model.q_size + 2 * model.kv_size) // tp, h),
        "o_proj": (h, model.q_size // tp),
        "gate_up": (2 * model.ffn_hidden_size // tp, h),
        "down": (h, model.ffn_hidden_size // tp),
        "lm_head": (-(-model.vocab_size // tp), h),
    }


def _series(sizes: Iterable[int]) -> tuple[int, ...]:
    """The sizes of one series, or none if fewer than MIN_SERIES_POINTS passed the caps."""
    kept = tuple(sizes)
    return kept if len(kept) >= MIN_SERIES_POINTS else ()


def _gemm_shapes(r: _Recipe) -> tuple[GemmShape, ...]:
    shapes: set[GemmShape] = set()
    for name in r.models:
        model = CATALOGUE[name]
        for tp in _tp_degrees(model):
            for n, k in layer_gemms(model, tp).values():
                # Forward (m, n, k) and dX (m, k, n): series along the token count m.
                for nn, kk in ((n, k), (k, n)):
                    ms = _series(m for m in r.token_counts if 2 * m * nn * kk <= r.max_gemm_flops)
                    shapes.update(GemmShape(m=m, n=nn, k=kk) for m in ms)
                # dW (k, n, m): tokens are the reduction dim, one point per token count.
                shapes.update(
                    GemmShape(m=k, n=n, k=m)
                    for m in r.token_counts
                    if 2 * m * n * k <= r.max_gemm_flops
                )
    return tuple(sorted(shapes))


def _head_configs(models: tuple[str, ...]) -> list[tuple[int, int, int]]:
    """(heads, kv_heads, head_dim) per rank of each model under each valid TP degree."""
    out: set[tuple[int, int, int]] = set()
    for name in models:
        model = CATALOGUE[name]
        for tp in _tp_degrees(model):
            out.add((model.num_heads // tp, model.num_kv_heads // tp, model.head_dim))
    return sorted(out)


def _attn_shapes(r: _Recipe) -> tuple[AttnShape, ...]:
    shapes: list[AttnShape] = []
    for h, kv, d in _head_configs(r.models):
        for b in r.attn_batches:
            # The backward (2.5x the forward's FLOPs) is the costlier of the two timed ops.
            bwd_flops = {s: 2.5 * 2.0 * b * s * s * h * d for s in r.attn_seqs}
            seqs = _series(s for s in r.attn_seqs if bwd_flops[s] <= r.max_attn_flops)
            shapes += [
                AttnShape(batch=b, seq=s, num_heads=h, num_kv_heads=kv, head_dim=d) for s in seqs
            ]
    return tuple(shapes)


def _decode_shapes(r: _Recipe) -> tuple[DecodeShape, ...]:
    dtype_bytes = DTYPE_BYTES[r.dtype]
    shapes: list[DecodeShape] = []
    for h, kv, d in _head_configs(r.models):
        for b in r.decode_batches:
            cache_bytes = {n: 2 * b * n * kv * d * dtype_bytes for n in r.decode_kv_lens}
            lens = _series(n for n in r.decode_kv_lens if cache_bytes[n] <= r.max_kv_cache_bytes)
            shapes += [
                DecodeShape(batch=b, kv_len=n, num_heads=h, num_kv_heads=kv, head_dim=d)
                for n in lens
            ]
    return tuple(shapes)


def _from_recipe(r: _Recipe) -> ProfilerGrid:
    has_collectives = bool(r.collective_world_sizes)
    origin = {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(r).items()}
    origin["tp_degrees"] = list(TP_DEGREES)
    origin["min_series_points"] = MIN_SERIES_POINTS
    return ProfilerGrid(
        device=r.device,
        dtype=r.dtype,
        gemm_shapes=_gemm_shapes(r),
        attn_prefill_shapes=_attn_shapes(r),
        attn_decode_shapes=_decode_shapes(r),
        elementwise_kinds=tuple(ElementwiseKind),
        elementwise_bytes=r.elementwise_bytes,
        optimizer_num_params=r.optimizer_num_params,
        collective_kinds=tuple(CollectiveKind) if has_collectives else (),
        collective_world_sizes=r.collective_world_sizes,
        collective_bytes=r.collective_bytes if has_collectives else (),
        copy_bytes=r.copy_bytes,
        dispatch_bytes=DISPATCH_BYTES,
        warmup=r.warmup,
        repeats=r.repeats,
        point_budget_s=r.point_budget_s,
        origin=origin,
    )
