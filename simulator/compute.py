"""Time of transformer pieces on one GPU, built from the cost model's kernels.

One decoder layer under tensor parallelism t runs the GEMMs QKV (n = (q + 2kv)/t,
k = h), O (n = h, k = q/t), gate+up (n = 2f/t, k = h) and down (n = h, k = f/t),
causal attention over its heads/t, two RMSNorms, SwiGLU and two residual adds,
and — when t > 1 — two all-reduces of the m·h activations (Megatron's f and g).
Backward runs each GEMM twice (dX: m×k×n, dW: k×n×m), the attention backward,
the elementwise ops again and the same two all-reduces.

The head is the LM head (n = vocab/t) followed by a float32 log-softmax, or a
scalar value head for critics and reward models.

Framework ops. Besides those kernels the engine dispatches many small ops
(views, casts, RoPE's rotations, masks, splits, the sampler's bookkeeping); on
small models they are a large share of the time. Each costs the dispatch
overhead of one op, which the profile measures as its smallest elementwise add
(`op_overhead_s`); how many there are is a fact about placeflow's engine,
counted by `tests/test_engines.py::test_engine_op_counts_match_the_simulator`
(every dispatched aten op, less the kernels costed above).

Every function is memoised on its arguments in the cost model's memo, because
the planner asks the same questions for thousands of plans.
"""

from __future__ import annotations

from placeflow.models import Feature, ModelSpec
from placeflow.profiles.costmodel import CostModel
from placeflow.profiles.schema import CollectiveKind, ElementwiseKind, Scope

# Dispatched ops of the engine not costed as kernels (see the module docstring).
EXTRA_OPS_LAYER_FORWARD = 50  # per decoder layer, prefill or training forward
EXTRA_OPS_LAYER_BACKWARD = 95  # per decoder layer, backward
EXTRA_OPS_LAYER_DECODE = 56  # per decoder layer, one decode step with the KV cache
EXTRA_OPS_CALL_FORWARD = 39  # per forward: embedding, positions, mask, final norm, head
EXTRA_OPS_CALL_BACKWARD = 39  # per backward: the same ops' gradients and the loss
EXTRA_OPS_DECODE_STEP = 68  # per decode step: embedding, head, sampling, stop checks
OP_OVERHEAD_BYTES = 1024  # the profile's smallest elementwise point


def op_overhead_s(cm: CostModel) -> float:
    """Dispatch overhead of one small op: the profile's smallest elementwise add."""
    return cm.elementwise_s(ElementwiseKind.ADD, OP_OVERHEAD_BYTES)


# Features of ModelSpec whose kernels this module prices; experts and latent
# attention have other GEMMs, so such a model is refused rather than mispriced.
PRICED_FEATURES = frozenset({Feature.QK_NORM, Feature.HEAD_DIM})


def _gemm_shapes(model: ModelSpec, t: int) -> tuple[tuple[int, int], ...]:
    """(n, k) of the four GEMMs of one layer on one TP rank."""
    model.require_features(PRICED_FEATURES, "the simulator's cost model")
    h, f = model.hidden_size, model.ffn_hidden_size
    qkv = (model.q_size + 2 * model.kv_heads_per_rank(t) * model.head_dim * t) // t
    return ((qkv, h), (h, model.q_size // t), (2 * f // t, h), (h, f // t))


def layer_forward_s(
    cm: CostModel, model: ModelSpec, t: int, batch: int, seq: int, *, decode_kv_len: int = 0
) -> float:
    """One layer's forward on one rank for `batch` sequences of `seq` new tokens.

    With `decode_kv_len` > 0 the attention is a decode step against that many
    cached tokens (seq must then be 1).
    """
    key = ("layer_fwd", model, t, batch, seq, decode_kv_len)
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
    extra = EXTRA_OPS_LAYER_DECODE if decode_kv_len else EXTRA_OPS_LAYER_FORWARD
    time_s += extra * op_overhead_s(cm)
    cm.memo[key] = time_s
    return time_s


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
    time_s += EXTRA_OPS_LAYER_BACKWARD * op_overhead_s(cm)
    cm.memo[key] = time_s
    return time_s


def head_forward_s(
    cm: CostModel, model: ModelSpec, t: int, tokens: int, *, value_head: bool
) -> float:
    """LM head plus float32 log-softmax over the vocabulary shard, or a scalar value head;
    with the forward's framework ops outside the layers."""
    calls = EXTRA_OPS_CALL_FORWARD * op_overhead_s(cm)
    if value_head:
        return cm.gemm_s(tokens, 1, model.hidden_size) + calls
    vocab = model.vocab_size // t
    return (
        cm.gemm_s(tokens, vocab, model.hidden_size)
        + cm.elementwise_s(ElementwiseKind.SOFTMAX, tokens * vocab * 4)
        + calls
    )


def head_backward_s(
    cm: CostModel, model: ModelSpec, t: int, tokens: int, *, value_head: bool
) -> float:
    n = 1 if value_head else model.vocab_size // t
    k = model.hidden_size
    time_s = cm.gemm_s(tokens, k, n) + cm.gemm_s(k, n, tokens)
    time_s += EXTRA_OPS_CALL_BACKWARD * op_overhead_s(cm)
    if not value_head:
        time_s += cm.elementwise_s(ElementwiseKind.SOFTMAX, tokens * n * 4)
    return time_s


def decode_step_s(
    cm: CostModel, model: ModelSpec, tg: int, pg: int, batch: int, kv_len: int
) -> float:
    """One decode step of `batch` sequences at KV length `kv_len` through all pg stages.

    A single decode batch passes the stages one after another, so pipeline
    parallelism in generation splits memory, not time (plus one send per stage).
    """
    layers = model.num_layers * layer_forward_s(cm, model, tg, batch, 1, decode_kv_len=kv_len)
    # The decode step's own ops replace the forward's: the sampler's step is not a scoring call.
    head = head_forward_s(cm, model, tg, batch, value_head=False)
    head += (EXTRA_OPS_DECODE_STEP - EXTRA_OPS_CALL_FORWARD) * op_overhead_s(cm)
    p2p = (pg - 1) * cm.collective_s(
        CollectiveKind.SEND_RECV, batch * model.hidden_size * model.dtype.num_bytes, 2, Scope.INTRA
    )
    return layers + head + p2p
