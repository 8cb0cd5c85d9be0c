"""Per-op features: how the cost model reads an entry's parameters.

For each op this module says
- `series_key`: the parameters that stay fixed along one interpolation series
  (a GEMM's n and k; a collective's kind, world size and scope),
- `size`: the one parameter that varies along the series (a GEMM's m, a
  collective's bytes), interpolated in log-log space,
- `flops` and `bytes_moved`: the work, for the roofline fit and extrapolation.

Attention FLOPs count the causal half of the score and value matmuls
(2·b·s²·heads·head_dim forward); backward is 2.5x forward (dQ, dK, dV and the
recomputed scores), as FlashAttention's authors count it.
"""

from __future__ import annotations

from placeflow.profiles.schema import CollectiveKind, Op, Params

SeriesKey = tuple[int | str, ...]

_SIZE_PARAM: dict[Op, str] = {
    Op.GEMM: "m",
    Op.ATTN_PREFILL_FWD: "seq",
    Op.ATTN_PREFILL_BWD: "seq",
    Op.ATTN_DECODE: "kv_len",
    Op.ELEMENTWISE: "num_bytes",
    Op.OPTIMIZER: "num_params",
    Op.COLLECTIVE: "num_bytes",
    Op.COPY: "num_bytes",
    Op.DISPATCH: "num_bytes",
    Op.FRAMEWORK: "num_units",
}

# Parameters that must match exactly for two series to be compared at all
# (a string such as the collective kind); numeric key parts are compared in log space.
EXACT_KEY_PARAMS = frozenset({"kind", "scope", "direction", "world_size"})


def size_param(op: Op) -> str:
    return _SIZE_PARAM[op]


def series_key(op: Op, params: Params) -> SeriesKey:
    from placeflow.profiles.schema import OP_PARAMS

    size = _SIZE_PARAM[op]
    return tuple(params[k] for k in OP_PARAMS[op] if k != size)


def series_key_names(op: Op) -> tuple[str, ...]:
    from placeflow.profiles.schema import OP_PARAMS

    return tuple(k for k in OP_PARAMS[op] if k != _SIZE_PARAM[op])


def size(op: Op, params: Params) -> float:
    return float(params[_SIZE_PARAM[op]])


def collective_bus_factor(kind: str, world_size: int) -> float:
    """Bytes each rank moves per byte of the logical tensor (nccl-tests bus bandwidth)."""
    n = world_size
    if kind == CollectiveKind.ALL_REDUCE:
        return 2.0 * (n - 1) / n
    if kind in (
        CollectiveKind.ALL_GATHER,
        CollectiveKind.REDUCE_SCATTER,
        CollectiveKind.ALL_TO_ALL,
    ):
        # All-to-all: each rank keeps 1/n of its buffer and sends the rest (nccl-tests).
        return (n - 1) / n
    return 1.0  # broadcast, send_recv


def flops(op: Op, params: Params) -> float:
    p = params
    if op is Op.GEMM:
        return 2.0 * int(p["m"]) * int(p["n"]) * int(p["k"])
    if op in (Op.ATTN_PREFILL_FWD, Op.ATTN_PREFILL_BWD):
        b, s = int(p["batch"]), int(p["seq"])
        fwd = 2.0 * b * s * s * int(p["num_heads"]) * int(p["head_dim"])
        return fwd if op is Op.ATTN_PREFILL_FWD else 2.5 * fwd
    if op is Op.ATTN_DECODE:
        return 4.0 * int(p["batch"]) * int(p["kv_len"]) * int(p["num_heads"]) * int(p["head_dim"])
    if op is Op.OPTIMIZER:
        return 12.0 * int(p["num_params"])
    return 0.0  # elementwise work is bandwidth-bound; collectives and copies move bytes


def bytes_moved(op: Op, params: Params, dtype_bytes: int) -> float:
    """Bytes through memory (compute ops) or over the link per rank (collectives)."""
    p = params
    if op is Op.GEMM:
        m, n, k = int(p["m"]), int(p["n"]), int(p["k"])
        return float((m * k + k * n + m * n) * dtype_bytes)
    if op in (Op.ATTN_PREFILL_FWD, Op.ATTN_PREFILL_BWD):
        b, s, d = int(p["batch"]), int(p["seq"]), int(p["head_dim"])
        qkvo = b * s * d * (2 * int(p["num_heads"]) + 2 * int(p["num_kv_heads"])) * dtype_bytes
        return float(qkvo if op is Op.ATTN_PREFILL_FWD else 2 * qkvo)
    if op is Op.ATTN_DECODE:
        b, d = int(p["batch"]), int(p["head_dim"])
        kv = 2 * b * int(p["kv_len"]) * int(p["num_kv_heads"]) * d * dtype_bytes
        return float(kv + 2 * b * int(p["num_heads"]) * d * dtype_bytes)
    if op is Op.ELEMENTWISE:
        return 2.0 * int(p["num_bytes"])  # read once, write once
    if op is Op.OPTIMIZER:
        # fp32 AdamW: read param, grad, exp_avg, exp_avg_sq; write param and both moments.
        return 28.0 * int(p["num_params"])
    if op is Op.COLLECTIVE:
        return int(p["num_bytes"]) * collective_bus_factor(str(p["kind"]), int(p["world_size"]))
    if op is Op.FRAMEWORK:
        return float(int(p["num_units"]))  # host work: time in proportion to the pieces
    return float(int(p["num_bytes"]))  # copy; dispatch: the payload serialised and sent
