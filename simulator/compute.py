"""Time of transformer pieces on one GPU, built from the cost model's kernels.

One decoder layer under tensor parallelism t runs the GEMMs QKV (n = (q + 2kv)/t,
k = h), O (n = h, k = q/t), gate+up (n = 2f/t, k = h) and down (n = h, k = f/t),
causal attention over its heads/t, two RMSNorms, SwiGLU and two residual adds,
and — when t > 1 — two all-reduces of the m·h activations (Megatron's f and g).
Backward runs each GEMM twice (dX: m×k×n, dW: k×n×m), the attention backward,
the elementwise ops again and the same two all-reduces.

The head is the LM head (n = vocab/t) followed by a float32 log-softmax, or a
scalar value head for critics and reward models.

Host and device are two resources. Besides those kernels the engine
dispatches many small ops (views, casts, RoPE's rotations, masks, splits, the
sampler's bookkeeping); how many is a fact about placeflow's engine, counted
by `tests/test_engines.py::test_engine_op_counts_match_the_simulator` (every
dispatched aten op, less the kernels costed above). One op's host dispatch
costs `op_overhead_s`, the profile's smallest elementwise add, which a
profiler loop of back-to-back adds measures at the dispatch rate (launch-bound
on a GPU). How the two resources combine (`overlapped_s`):

- CPU: the host is the device. Each kernel's measured time includes its own
  dispatch; the extra ops run one after another in the same thread, so they add.
- GPU, eager: launches are asynchronous and overlap the kernels, so a piece of
  work costs max(device time, every launched op × op dispatch): the host bounds
  the step only when dispatch outruns the device (small models, small batches).
- GPU, CUDA-graph replay (`DECODE_GRAPHS`: vLLM's decode): the layers' launches
  become one graph launch; what the host still dispatches per decode step is
  the step's own ops outside the layers (input preparation, sampling, stop
  checks; `EXTRA_OPS_DECODE_STEP` of placeflow's engine stands for them).

Every function is memoised on its arguments in the cost model's memo, because
the planner asks the same questions for thousands of plans.
"""

from __future__ import annotations

from collections.abc import Mapping

from placeflow.models import Feature, ModelSpec
from placeflow.profiles.costmodel import CostModel
from placeflow.profiles.schema import CollectiveKind, ElementwiseKind, Scope
from placeflow.workload import RolloutEngine

# Dispatched ops of the engine not costed as kernels (see the module docstring).
EXTRA_OPS_LAYER_FORWARD = 50  # per decoder layer, prefill or training forward
EXTRA_OPS_LAYER_BACKWARD = 95  # per decoder layer, backward
EXTRA_OPS_LAYER_DECODE = 56  # per decoder layer, one decode step with the KV cache
EXTRA_OPS_CALL_FORWARD = 39  # per forward: embedding, positions, mask, final norm, head
EXTRA_OPS_CALL_BACKWARD = 39  # per backward: the same ops' gradients and the loss
EXTRA_OPS_DECODE_STEP = 68  # per decode step: embedding, head, sampling, stop checks
OP_OVERHEAD_BYTES = 1024  # the profile's smallest elementwise point

# Kernels costed above, per piece (each is one launch): 4 GEMMs, attention, 2 RMSNorms,
# 2 adds and SwiGLU in a layer's forward, plus its 2 all-reduces under TP; the backward
# runs 8 GEMMs, the attention backward, 4 norm, 2 add and 2 SwiGLU kernels.
KERNELS_LAYER_FORWARD = 10
KERNELS_LAYER_BACKWARD = 17
KERNELS_TP_ALL_REDUCES = 2
KERNELS_HEAD_FORWARD = {False: 2, True: 1}  # by value_head: LM head + log-softmax, or one GEMM
KERNELS_HEAD_BACKWARD = {False: 3, True: 2}

# Whether an engine's decode step replays a CUDA graph (on a GPU; never on CPU).
DECODE_GRAPHS: Mapping[RolloutEngine, bool] = {
    RolloutEngine.BUILTIN: False,
    RolloutEngine.VLLM: True,
}


def op_overhead_s(cm: CostModel) -> float:
    """Host dispatch of one small op: the profile's smallest elementwise add."""
    return cm.elementwise_s(ElementwiseKind.ADD, OP_OVERHEAD_BYTES)


# Features of ModelSpec whose kernels this module prices; experts and latent
# attention have other GEMMs, so such a model is refused rather than mispriced.
PRICED_FEATURES = frozenset({Feature.QK_NORM, Feature.HEAD_DIM})


def overlapped_s(cm: CostModel, device_s: float, num_kernels: int, num_extra_ops: int) -> float:
    """Time of work whose kernels take `device_s` and whose host dispatches
    `num_kernels` kernels plus `num_extra_ops` framework ops (module docstring).

    CPU: device_s + extra · op. GPU: max(device_s, (kernels + extra) · op).
    """
    op_s = op_overhead_s(cm)
    if cm.device_kind == "cpu":
        return device_s + num_extra_ops * op_s
    return max(device_s, (num_kernels + num_extra_ops) * op_s)


def _gemm_shapes(model: ModelSpec, t: int) -> tuple[tuple[int, int], ...]:
    """(n, k) of the four GEMMs of one layer on one TP rank."""
    model.require_features(PRICED_FEATURES, "the simulator's cost model")
    h, f = model.hidden_size, model.ffn_hidden_size
    qkv = (model.q_size + 2 * model.kv_heads_per_rank(t) * model.head_dim * t) // t
    return ((qkv, h), (h, model.q_size // t), (2 * f // t, h), (h, f // t))


def _tp_kernels(t: int) -> int:
    return KERNELS_TP_ALL_REDUCES if t > 1 else 0


def layer_forward_kernels_s(
    cm: CostModel, model: ModelSpec, t: int, batch: int, seq: int, *, decode_kv_len: int = 0
) -> float:
    """Device time of one layer's forward kernels on one rank (no host dispatch).

    With `decode_kv_len` > 0 the attention is a decode step against that many
    cached tokens (seq must then be 1).
    """
    key = ("layer_fwd_kernels", model, t, batch, seq, decode_kv_len)
    hit = cm.memo.get(key)
    if hit is not None:
        return hit
    m = batch * seq
    b = model.dtype.num_bytes
    time_s = sum(cm.gemm_s(m, n, k) for n, k in _gemm_shapes(model, t))
    heads, kv_heads = model.num_heads // t, model.kv_heads_per_rank(t)
    if decode_kv_len:
        time_s += cm.attn_decode_s(batch, decode_kv_len, heads, kv_heads, model.head_dim)
    else:
        time_s += cm.attn_prefill_s(batch, seq, heads, kv_heads, model.head_dim)
    act = m * model.hidden_size * b
    time_s += 2 * cm.elementwise_s(ElementwiseKind.RMSNORM, act)
    time_s += 2 * cm.elementwise_s(ElementwiseKind.ADD, act)
    time_s += cm.elementwise_s(ElementwiseKind.SILU_MUL, m * 2 * model.ffn_hidden_size // t * b)
    time_s += 2 * cm.collective_s(CollectiveKind.ALL_REDUCE, act, t, Scope.INTRA)
    cm.memo[key] = time_s
    return time_s


def layer_forward_s(cm: CostModel, model: ModelSpec, t: int, batch: int, seq: int) -> float:
    """One layer's eager forward (prefill, scoring or training) on one rank."""
    kernels = layer_forward_kernels_s(cm, model, t, batch, seq)
    return overlapped_s(
        cm, kernels, KERNELS_LAYER_FORWARD + _tp_kernels(t), EXTRA_OPS_LAYER_FORWARD
    )


def layer_backward_s(cm: CostModel, model: ModelSpec, t: int, batch: int, seq: int) -> float:
    """One layer's backward (no recomputation) on one rank."""
    key = ("layer_bwd", model, t, batch, seq)
    hit = cm.memo.get(key)
    if hit is not None:
        return hit
    m = batch * seq
    b = model.dtype.num_bytes
    time_s = sum(cm.gemm_s(m, k, n) + cm.gemm_s(k, n, m) for n, k in _gemm_shapes(model, t))
    heads, kv_heads = model.num_heads // t, model.kv_heads_per_rank(t)
    time_s += cm.attn_prefill_s(batch, seq, heads, kv_heads, model.head_dim, backward=True)
    act = m * model.hidden_size * b
    # The backward of norms, SwiGLU and adds reads about twice what the forward does.
    time_s += 4 * cm.elementwise_s(ElementwiseKind.RMSNORM, act)
    time_s += 2 * cm.elementwise_s(ElementwiseKind.ADD, act)
    time_s += 2 * cm.elementwise_s(ElementwiseKind.SILU_MUL, m * 2 * model.ffn_hidden_size // t * b)
    time_s += 2 * cm.collective_s(CollectiveKind.ALL_REDUCE, act, t, Scope.INTRA)
    time_s = overlapped_s(
        cm, time_s, KERNELS_LAYER_BACKWARD + _tp_kernels(t), EXTRA_OPS_LAYER_BACKWARD
    )
    cm.memo[key] = time_s
    return time_s


def _head_forward_kernels_s(
    cm: CostModel, model: ModelSpec, t: int, tokens: int, *, value_head: bool
) -> float:
    if value_head:
        return cm.gemm_s(tokens, 1, model.hidden_size)
    vocab = model.vocab_size // t
    return cm.gemm_s(tokens, vocab, model.hidden_size) + cm.elementwise_s(
        ElementwiseKind.SOFTMAX, tokens * vocab * 4
    )


def head_forward_s(
    cm: CostModel, model: ModelSpec, t: int, tokens: int, *, value_head: bool
) -> float:
    """LM head plus float32 log-softmax over the vocabulary shard, or a scalar value head;
    with the forward's framework ops outside the layers."""
    kernels = _head_forward_kernels_s(cm, model, t, tokens, value_head=value_head)
    return overlapped_s(cm, kernels, KERNELS_HEAD_FORWARD[value_head], EXTRA_OPS_CALL_FORWARD)


def head_backward_s(
    cm: CostModel, model: ModelSpec, t: int, tokens: int, *, value_head: bool
) -> float:
    n = 1 if value_head else model.vocab_size // t
    k = model.hidden_size
    time_s = cm.gemm_s(tokens, k, n) + cm.gemm_s(k, n, tokens)
    if not value_head:
        time_s += cm.elementwise_s(ElementwiseKind.SOFTMAX, tokens * n * 4)
    return overlapped_s(cm, time_s, KERNELS_HEAD_BACKWARD[value_head], EXTRA_OPS_CALL_BACKWARD)


def decode_step_s(
    cm: CostModel,
    model: ModelSpec,
    tg: int,
    pg: int,
    batch: int,
    kv_len: int,
    *,
    engine: RolloutEngine = RolloutEngine.BUILTIN,
) -> float:
    """One decode step of `batch` sequences at KV length `kv_len` through all pg stages,
    as `engine` runs it: host dispatch and device time combined per step (module docstring).

    A single decode batch passes the stages one after another, so pipeline
    parallelism in generation splits memory, not time (plus one send per stage).
    """
    key = ("decode_step", model, tg, pg, batch, kv_len, engine)
    hit = cm.memo.get(key)
    if hit is not None:
        return hit
    layer = layer_forward_kernels_s(cm, model, tg, batch, 1, decode_kv_len=kv_len)
    p2p = (pg - 1) * cm.collective_s(
        CollectiveKind.SEND_RECV, batch * model.hidden_size * model.dtype.num_bytes, 2, Scope.INTRA
    )
    device_s = (
        model.num_layers * layer
        + _head_forward_kernels_s(cm, model, tg, batch, value_head=False)
        + p2p
    )
    if cm.device_kind == "cuda" and DECODE_GRAPHS[engine]:
        # One graph launch replaces the layers' and the head's launches.
        time_s = max(device_s, (1 + EXTRA_OPS_DECODE_STEP) * op_overhead_s(cm))
    else:
        # The decode step's own ops replace the forward's: the sampler's step is not a
        # scoring call.
        kernels = model.num_layers * (KERNELS_LAYER_FORWARD + _tp_kernels(tg))
        kernels += KERNELS_HEAD_FORWARD[False]
        extra = model.num_layers * EXTRA_OPS_LAYER_DECODE + EXTRA_OPS_DECODE_STEP
        time_s = overlapped_s(cm, device_s, kernels, extra)
    cm.memo[key] = time_s
    return time_s
