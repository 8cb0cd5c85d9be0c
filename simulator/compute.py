"""Time of transformer pieces on one GPU, built from the cost model's kernels.

One decoder layer under tensor parallelism t runs the GEMMs QKV (n = (q + 2kv)/t,
k = h), O (n = h, k = q/t), gate+up (n = 2f/t, k = h) and down (n = h, k = f/t),
causal attention over its heads/t, two RMSNorms, SwiGLU and two residual adds,
and — when t > 1 — two all-reduces of the m·h activations (Megatron's f and g).
Backward runs each GEMM twice (dX: m×k×n, dW: k×n×m), the attention backward,
the elementwise ops again and the same two all-reduces.

The head is the LM head (n = vocab/t) followed by a float32 log-softmax, or a
scalar value head for critics and reward models. Outside the layers, t > 1 adds
one all-reduce of the m·h activations each way (`_tp_edge_s`): in the forward the
vocabulary-parallel embedding's output (each rank holds vocab/t rows: Megatron's
VocabParallelEmbedding, vLLM's, the built-in engine's `_embed`), in the backward
the LM head input's gradient (its copy to the t ranks); with sequence
parallelism Megatron scatters the embedding's output and gathers the head's input
instead, a reduce-scatter and an all-gather of the same bytes, priced as the one
all-reduce they add up to. A decode step also
gathers its logits over the vocabulary shards (vLLM and the built-in engine
sample from whole logits). A training or scoring forward's log-softmax is taken
as Megatron takes it, over the shard with scalar reductions, which are left out;
the built-in engine gathers those logits too (README, simulator fidelity).

Host and device are two resources. Besides those kernels the engine
dispatches many small ops (views, casts, RoPE's rotations, masks, splits, the
sampler's bookkeeping); how many is a fact about placeflow's engine, counted
by `tests/test_engines.py::test_engine_op_counts_match_the_simulator` (every
dispatched aten op, less the kernels costed above). One op's host dispatch
costs `op_overhead_s`, the profile's smallest elementwise add, which a
profiler loop of back-to-back adds measures at the dispatch rate (launch-bound
on a GPU).

Where the profile has framework entries (`placeflow.profiles.framework`, the
`cpu` profile) the host work of a piece is measured rather than counted: the
engine's own code timed per layer forward, backward and decode step, per call
outside the layers and per decode step outside them, at a size where kernels
are negligible, less what this module prices for those kernels at that size
(`framework_host_s`). On this CPU that is several microseconds per op
(Python, `nn.Module` calls, the dispatcher, autograd), 4-8x the bare add's
price. The optimizer's host time (AdamW's loop over tensors, gradient
clipping) is `optimizer_host_s`, per layer and per call. GPU profiles have no
such entries and keep the counted ops. How the two resources combine
(`overlapped_s`):

- CPU: the host is the device. Each kernel's measured time includes its own
  dispatch; the extra ops run one after another in the same thread, so they add.
- GPU, eager: launches are asynchronous and overlap the kernels, so a piece of
  work costs max(device time, every launched op × op dispatch): the host bounds
  the step only when dispatch outruns the device (small models, small batches).
- GPU, CUDA-graph replay (`placeflow.workload.decode_graphed`: vLLM's decode,
  and the built-in engine's with tg = 1): the layers' launches become one graph
  launch; what the host still dispatches per decode step is the step's own ops
  outside the layers (input preparation, sampling, stop checks;
  `EXTRA_OPS_DECODE_STEP` of placeflow's engine stands for them). The built-in
  engine captures its graph once per generation (`graph_capture_s`).

Mixture of experts (`ModelSpec.moe`). A layer's time is the mean over the
model's layers, so that callers multiply by the layer count as for a dense
model: `dense_layers` layers run the dense MLP above, the others an MoE block.
An MoE block on one rank, with m tokens, E experts of FFN size f_e, top-k
routing, expert parallelism e and expert TP = t (Megatron-core's ETP = TP):

- the router GEMM (m, E, h) and its top-k softmax;
- the dispatch all-to-all over the e ranks of the expert-parallel group (each
  rank sends its m·k routed token copies of h values: m·k·h·bytes) and the
  combine all-to-all back (same bytes); the backward runs both again;
- the routed experts: the rank holds E/e experts, sliced by t. The e ranks of
  its group send it T = e·m tokens' routes; a = E·(1 − (1 − k/E)^T) distinct
  experts are touched in expectation, each by T·k/a rows, so the rank runs
  a/e grouped GEMMs of T·k/a rows (gate+up n = 2·f_e/t, down k = f_e/t). For
  training batches a = E and each expert gets T·k/E rows; for a decode step of
  B tokens only the touched experts' weights are read, which bounds the
  weight bytes of a small decode batch;
- shared experts (every token): a dense SwiGLU MLP of `shared_ffn_hidden_size`
  sliced by t.

Generation keeps e = 1 inside a replica: the experts are spread over its tg
ranks or sliced by tg. vLLM's `--enable-expert-parallel` sets EP = TP x DP
(docs.vllm.ai, "Expert Parallel Deployment"); placeflow's generation replicas
are independent engines (DP = 1 each), so EP = tg. Spread or sliced, each rank
holds M/(tg·pg) and runs the same FLOPs in expectation, and the token
exchange (vLLM's default all-gather / reduce-scatter backend) moves what the
TP all-reduce already priced moves, so the two are priced alike. An engine
spanning the dg replicas of a training replica (EP = tg·dg) would hold fewer
expert bytes per rank; that layout is not modelled.

Multi-head latent attention (`ModelSpec.mla`, DeepSeek-V3) is priced as its
projections plus standard attention: q down (m, q_lora, h) and kv down
(m, kv_lora + rope, h) replicated on every TP rank, q up (m, heads/t·(nope +
rope), q_lora), kv up (m, heads/t·(nope + v), kv_lora), o (m, h, heads/t·v);
prefill and training attention over heads/t heads of head size nope + rope
(the value's smaller head size not credited); a decode step attends, as vLLM
and FlashMLA do with absorbed weights, over the compressed cache: one shared
KV head of kv_lora + rope dims per token. The absorbed decode's own GEMM
shapes are not modelled (the prefill projections stand for them).

Context and sequence parallelism (`SequenceSplit`, training and forward calls
only; generation has neither). With context parallelism cp a rank runs the
GEMMs, norms and MLP of batch·seq/cp tokens. Its attention:

- ring (Megatron-core CP): causal attention balanced as Megatron cuts a
  sequence, 2·cp chunks with rank i holding chunks i and 2·cp − 1 − i, so each
  rank runs 1/cp of the whole sequence's attention (assumed exact), in cp steps
  of equal work. Steps 1..cp − 1 each wait for the neighbour's K/V chunk, the
  rank's batch·seq/cp tokens × kv heads/t × head size × 2 (K and V) × bytes,
  sent over the CP group's link while the previous step computes: a step costs
  max(attention step, send/recv), the first step attention only. The backward
  sends K/V and their gradients, twice the bytes per step.
- Ulysses (DeepSpeed-Ulysses, verl): an all-to-all over the cp ranks trades
  sequence for heads before attention (the rank's Q, K and V: tokens/cp ×
  (heads + 2·kv heads)/t × head size), attention runs over the whole sequence
  with heads/(t·cp) heads (KV heads repeated up to cp where fewer, as verl
  does), and an all-to-all of the output (tokens/cp × heads/t × head size)
  trades back; the backward runs both again. All-to-alls use the profile's
  all-to-all entries as the MoE dispatch does (`all_to_all_bytes`' convention:
  the rank's buffer).

Sequence parallelism over t (Megatron SP) replaces each of the layer's two
all-reduces of the m·h activations by a reduce-scatter and an all-gather of the
same logical bytes, and the norms and residual adds run on m/t tokens.

Every function is memoised on its arguments through `CostModel.remember`, because
the planner asks the same questions for thousands of plans.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass

from placeflow.catalogue import get_model
from placeflow.layout import CPKind, TrainLayout
from placeflow.models import Feature, ModelSpec
from placeflow.profiles import framework as ref
from placeflow.profiles.costmodel import CostModel
from placeflow.profiles.schema import CollectiveKind, ElementwiseKind, FrameworkKind, Scope
from placeflow.workload import GRAPH_WARMUP_RUNS, RolloutEngine, decode_graphed

# Dispatched ops of the engine not costed as kernels (see the module docstring).
EXTRA_OPS_LAYER_FORWARD = 50  # per decoder layer, prefill or training forward
EXTRA_OPS_LAYER_BACKWARD = 95  # per decoder layer, backward
EXTRA_OPS_LAYER_DECODE = 56  # per decoder layer, one decode step with the KV cache
EXTRA_OPS_CALL_FORWARD = 39  # per forward: embedding, positions, mask, final norm, head
EXTRA_OPS_CALL_BACKWARD = 39  # per backward: the same ops' gradients and the loss
EXTRA_OPS_DECODE_STEP = 67  # per decode step: embedding, head, sampling, stop checks
OP_OVERHEAD_BYTES = 1024  # the profile's smallest elementwise point

# An MoE block's extra launches: router, top-k, permute, unpermute, the dispatch and
# combine all-to-alls, shared experts; the backward runs each about twice.
KERNELS_MOE_FORWARD = 8
KERNELS_MOE_BACKWARD = 14

# Kernels costed above, per piece (each is one launch): 4 GEMMs, attention, 2 RMSNorms,
# 2 adds and SwiGLU in a layer's forward, plus its 2 all-reduces under TP; the backward
# runs 8 GEMMs, the attention backward, 4 norm, 2 add and 2 SwiGLU kernels.
KERNELS_LAYER_FORWARD = 10
KERNELS_LAYER_BACKWARD = 17
KERNELS_TP_ALL_REDUCES = 2
KERNELS_HEAD_FORWARD = {False: 2, True: 1}  # by value_head: LM head + log-softmax, or one GEMM
KERNELS_HEAD_BACKWARD = {False: 3, True: 2}


def op_overhead_s(cm: CostModel) -> float:
    """Host dispatch of one small op: the profile's smallest elementwise add."""
    return cm.elementwise_s(ElementwiseKind.ADD, OP_OVERHEAD_BYTES)


# Features of ModelSpec whose kernels this module prices (module docstring).
PRICED_FEATURES = frozenset({Feature.QK_NORM, Feature.HEAD_DIM, Feature.MOE, Feature.MLA})


def framework_host_s(cm: CostModel, kind: FrameworkKind, scale: float = 1.0) -> float | None:
    """The engine's host time of one piece of `kind` beyond its kernels, from the
    profile's framework entries; None where the profile has none.

    Each entry was timed through the engine on the reference model at a reference
    size (`placeflow.profiles.framework`), kernels included; what the cost model
    prices for those kernels at that size is taken off (at least 0), so that the
    kernels, priced at the real size, are not counted twice. `scale` is the piece's
    size in the entries' units (`num_units`: multiples of the smallest size's tokens,
    or of its hidden activations for a layer, see `host_scale`): with entries at
    several sizes the host time is the piecewise-linear curve through them, extended
    beyond them along its first or last segment (never below 0); with one it is that
    entry's.
    """

    def residuals() -> tuple[tuple[int, float], ...] | None:
        units = cm.framework_units(kind)
        if not units:
            return None
        points = []
        for u in units:
            measured = cm.framework_s(kind, u)
            assert measured is not None
            points.append((u, max(0.0, measured - _reference_kernels_s(cm, kind, u))))
        return tuple(points)

    points = cm.remember(("framework_host", kind), residuals)
    if points is None:
        return None
    if len(points) == 1:
        return points[0][1]
    # The segment that holds `scale`, or the first or last one beyond the points.
    i = next((i for i in range(1, len(points) - 1) if scale < points[i][0]), len(points) - 1)
    (u0, r0), (u1, r1) = points[i - 1], points[i]
    return max(0.0, r0 + (r1 - r0) * (scale - u0) / (u1 - u0))


def host_scale(model: ModelSpec, kind: FrameworkKind, tokens: int) -> float:
    """A piece of `kind` of `tokens` tokens (a decode step: sequences) in framework
    entries' units (`placeflow.profiles.framework`): its tokens over the smallest
    reference size's; for a layer's pieces also its hidden size over the reference
    model's, since the elementwise work a layer adds beyond its priced kernels runs over
    tokens x hidden."""
    batch, seq = ref.reference_shape(kind, 1)
    scale = tokens / (batch * seq)
    if kind in ref.LAYER_KINDS:
        scale *= model.hidden_size / get_model(ref.REFERENCE_MODEL).hidden_size
    return scale


def _reference_kernels_s(cm: CostModel, kind: FrameworkKind, units: int = 1) -> float:
    """What the cost model prices for the kernels inside a framework entry's piece timed
    at `units` (`placeflow.profiles.framework.reference_shape`)."""
    model = get_model(ref.REFERENCE_MODEL)
    b, s = ref.reference_shape(kind, units)
    if kind is FrameworkKind.LAYER_FORWARD:
        return layer_forward_kernels_s(cm, model, 1, b, s)
    if kind is FrameworkKind.LAYER_BACKWARD:
        return layer_backward_kernels_s(cm, model, 1, b, s)
    if kind is FrameworkKind.LAYER_DECODE:
        return layer_forward_kernels_s(cm, model, 1, b, 1, decode_kv_len=ref.REFERENCE_DECODE_KV)
    if kind is FrameworkKind.CALL_FORWARD:
        return _head_forward_kernels_s(cm, model, 1, b * s, value_head=False)
    if kind is FrameworkKind.CALL_BACKWARD:
        return _head_backward_kernels_s(cm, model, 1, b * s, value_head=False)
    if kind is FrameworkKind.DECODE_STEP:
        return _head_forward_kernels_s(cm, model, 1, b, value_head=False)
    layer_params = _layer_params(model)
    if kind is FrameworkKind.LOAD_LAYER:  # the layer's weights copied in
        return cm.copy_s("h2d", layer_params * model.dtype.num_bytes)
    outside = model.num_params(value_head=False) - model.num_layers * layer_params
    if kind is FrameworkKind.LOAD_CALL:  # the weights outside the layers
        return cm.copy_s("h2d", outside * model.dtype.num_bytes)
    # The weight sync's three copies of the bytes: the trainer's pack, the loopback
    # message (`profiles.framework._LoopbackLink`) and the generator's unpack.
    if kind is FrameworkKind.SYNC_LAYER:
        return 3 * cm.copy_s("h2d", layer_params * model.dtype.num_bytes)
    if kind is FrameworkKind.SYNC_CALL:
        return 3 * cm.copy_s("h2d", outside * model.dtype.num_bytes)
    # FSDP2's pieces: their copies, on the reference's group of one rank (the shard is
    # the whole unit).
    if kind in _FSDP_KINDS:
        unit = layer_params if kind in _FSDP_LAYER_KINDS else outside
        backward = kind in (FrameworkKind.FSDP_LAYER_BACKWARD, FrameworkKind.FSDP_CALL_BACKWARD)
        return fsdp_copies_s(cm, unit * model.dtype.num_bytes, 1, backward=backward)
    # The optimizer's pieces, whole step or AdamW alone: AdamW's kernels over the weights.
    if kind in (FrameworkKind.OPTIMIZER_LAYER, FrameworkKind.ADAMW_LAYER):
        return cm.optimizer_s(layer_params)
    assert kind in (FrameworkKind.OPTIMIZER_CALL, FrameworkKind.ADAMW_CALL)
    return cm.optimizer_s(outside)


_FSDP_LAYER_KINDS = (FrameworkKind.FSDP_LAYER_FORWARD, FrameworkKind.FSDP_LAYER_BACKWARD)
_FSDP_KINDS = (
    *_FSDP_LAYER_KINDS,
    FrameworkKind.FSDP_CALL_FORWARD,
    FrameworkKind.FSDP_CALL_BACKWARD,
)


def fsdp_copies_s(cm: CostModel, unit_bytes: float, d: int, *, backward: bool) -> float:
    """FSDP2's copies of one unit whose gathered weights are `unit_bytes`, on a rank of a
    group of `d`, in a forward (or, `backward`, a backward): an unshard copies the rank's
    shard into the all-gather buffer and the gathered buffer out into the parameters; a
    backward unshards again, and its gradients' reduce-scatter copies the gradients in
    and the rank's shard out."""
    one = cm.copy_s("h2d", int(unit_bytes / d)) + cm.copy_s("h2d", int(unit_bytes))
    return 2 * one if backward else one


def fsdp_host_s(
    cm: CostModel,
    num_layers: int,
    layer_bytes: float,
    root_bytes: float,
    d: int,
    *,
    backward: bool,
) -> float:
    """What ZeRO-3's FSDP2 adds to a rank's host work in one forward (or, `backward`, one
    backward) of `num_layers` layer units and the root's, over a group of `d`, beyond
    the bytes its collectives move between ranks (`CostModel.collective_s`): per unit
    the profile's fsdp entry less its copies at the reference's size (hooks, unshard and
    reshard bookkeeping), plus the unit's copies at its own size (`fsdp_copies_s`). 0
    where the profile has no fsdp layer entries (GPU profiles, older CPU ones)."""
    if backward:
        kinds = (FrameworkKind.FSDP_LAYER_BACKWARD, FrameworkKind.FSDP_CALL_BACKWARD)
    else:
        kinds = (FrameworkKind.FSDP_LAYER_FORWARD, FrameworkKind.FSDP_CALL_FORWARD)
    per_layer, per_call = (framework_host_s(cm, kind) for kind in kinds)
    if per_layer is None:
        return 0.0
    layer = per_layer + fsdp_copies_s(cm, layer_bytes, d, backward=backward)
    # The profiler leaves a per-call entry out where two layer counts cannot tell it
    # from zero (`profiles.framework`): the root's own host work beyond its copies is 0.
    root = (per_call or 0.0) + fsdp_copies_s(cm, root_bytes, d, backward=backward)
    return num_layers * layer + root


def _layer_params(model: ModelSpec) -> int:
    """Parameters of one decoder layer (the difference one more layer makes)."""
    more = dataclasses.replace(model, num_layers=model.num_layers + 1)
    return more.num_params(value_head=False) - model.num_params(value_head=False)


def overlapped_s(
    cm: CostModel,
    device_s: float,
    num_kernels: int,
    num_extra_ops: int,
    host: FrameworkKind | None = None,
    scale: float = 1.0,
) -> float:
    """Time of work whose kernels take `device_s` and whose host dispatches
    `num_kernels` kernels plus framework work: the profile's measured framework
    time of the piece `host` at `scale` (`framework_host_s`) where it has one, else
    `num_extra_ops` ops at one small op's price (module docstring).

    CPU: device_s + host (`cpu_host_s`). GPU: max(device_s, kernels · op + host).
    """
    if cm.device_kind == "cpu":
        return device_s + cpu_host_s(cm, num_extra_ops, host, scale)
    host_s = framework_host_s(cm, host, scale) if host is not None else None
    if host_s is not None:
        return _combined_s(cm, device_s, num_kernels, host_s)
    return max(device_s, (num_kernels + num_extra_ops) * op_overhead_s(cm))


def cpu_host_s(
    cm: CostModel, num_extra_ops: int, host: FrameworkKind | None = None, scale: float = 1.0
) -> float:
    """The host time a CPU adds to a piece's kernels (`overlapped_s`): the profile's
    framework time of `host` at `scale` where it has one, else `num_extra_ops` small ops;
    0 on a GPU, where the host overlaps the kernels."""
    if cm.device_kind != "cpu":
        return 0.0
    host_s = framework_host_s(cm, host, scale) if host is not None else None
    return host_s if host_s is not None else num_extra_ops * op_overhead_s(cm)


def _combined_s(cm: CostModel, device_s: float, num_kernels: int, host_s: float) -> float:
    """Host and device combined: added on a CPU, overlapped on a GPU (module docstring)."""
    if cm.device_kind == "cpu":
        return device_s + host_s
    return max(device_s, num_kernels * op_overhead_s(cm) + host_s)


def optimizer_host_s(
    cm: CostModel, model: ModelSpec, num_layers: int, partitions: int = 1
) -> float:
    """The engine's host time of one optimizer step (AdamW's per-tensor loop and the
    gradient clipping) over `num_layers` layers and the tensors outside them, beyond
    `CostModel.optimizer_s`'s kernel time; 0 where the profile has no framework entries.

    `partitions` > 1: a ZeRO-1/2 rank, whose AdamW steps only its partition of the
    tensors (`ZeroRedundancyOptimizer`, about 1/partitions of them) while the clipping
    still reads every gradient: the AdamW part (the profile's adamw entries, at most
    the whole step's) is divided by `partitions`. Without adamw entries (profiles
    measured before them) the whole step is priced, as for one partition."""
    per_layer = framework_host_s(cm, FrameworkKind.OPTIMIZER_LAYER)
    if per_layer is None:
        return 0.0
    # (a per-call entry the profiler left out, not told from zero: 0, `fsdp_host_s`)
    per_call = framework_host_s(cm, FrameworkKind.OPTIMIZER_CALL) or 0.0
    if partitions > 1:
        adam_layer = framework_host_s(cm, FrameworkKind.ADAMW_LAYER)
        adam_call = framework_host_s(cm, FrameworkKind.ADAMW_CALL)
        if adam_layer is not None and adam_call is not None:
            kept = 1 - 1 / partitions
            per_layer -= min(adam_layer, per_layer) * kept
            per_call -= min(adam_call, per_call) * kept
    return num_layers * per_layer + per_call


def _attention_gemm_shapes(model: ModelSpec, t: int) -> tuple[tuple[int, int], ...]:
    """(n, k) of one layer's attention projections on one TP rank."""
    model.require_features(PRICED_FEATURES, "the simulator's cost model")
    h, heads = model.hidden_size, model.num_heads // t
    mla = model.mla
    if mla is None:
        qkv = (model.q_size + 2 * model.kv_heads_per_rank(t) * model.head_dim * t) // t
        return ((qkv, h), (h, model.q_size // t))
    if mla.q_lora_rank:
        q: tuple[tuple[int, int], ...] = (
            (mla.q_lora_rank, h),
            (heads * mla.qk_head_dim, mla.q_lora_rank),
        )
    else:
        q = ((heads * mla.qk_head_dim, h),)
    return (
        *q,
        (mla.kv_lora_rank + mla.qk_rope_head_dim, h),
        (heads * (mla.qk_nope_head_dim + mla.v_head_dim), mla.kv_lora_rank),
        (h, heads * mla.v_head_dim),
    )


def _mlp_gemm_shapes(h: int, ffn: int, t: int) -> tuple[tuple[int, int], ...]:
    """(n, k) of a SwiGLU MLP's gate+up and down GEMMs on one TP rank."""
    return ((2 * ffn // t, h), (h, ffn // t))


def _tp_kernels(t: int) -> int:
    return KERNELS_TP_ALL_REDUCES if t > 1 else 0


@dataclass(frozen=True, kw_only=True)
class SequenceSplit:
    """How a training or forward layer's tokens are split beyond data parallelism
    (module docstring): context parallelism `cp` of `kind` over a group in
    `cp_scope` with at least `cp_ranks_per_node` of its ranks per node, and
    Megatron's sequence parallelism over t."""

    cp: int = 1
    kind: CPKind = CPKind.RING
    sequence_parallel: bool = False
    cp_scope: Scope = Scope.INTRA
    cp_ranks_per_node: int = 1

    @classmethod
    def of(
        cls, layout: TrainLayout, cp_scope: Scope = Scope.INTRA, cp_ranks_per_node: int = 1
    ) -> SequenceSplit:
        return cls(
            cp=layout.cp,
            kind=layout.cp_kind,
            sequence_parallel=layout.sequence_parallel,
            cp_scope=cp_scope if layout.cp > 1 else Scope.INTRA,
            cp_ranks_per_node=cp_ranks_per_node if layout.cp > 1 else 1,
        )

    def tokens(self, tokens: int) -> int:
        """Tokens one context-parallel rank holds: ceil(tokens/cp)."""
        return -(-tokens // self.cp)


NO_SPLIT = SequenceSplit()


def _split_kernels(split: SequenceSplit) -> int:
    """Extra launches of a layer's pass: a P2P per ring step, Ulysses' two all-to-alls,
    SP's second collective per all-reduce it replaces."""
    launches = KERNELS_TP_ALL_REDUCES if split.sequence_parallel else 0
    if split.cp > 1:
        launches += split.cp - 1 if split.kind is CPKind.RING else 2
    return launches


def context_attention_s(
    cm: CostModel,
    model: ModelSpec,
    t: int,
    batch: int,
    seq: int,
    split: SequenceSplit,
    *,
    backward: bool,
) -> float:
    """One rank's attention (forward or backward) of `batch` sequences of `seq` tokens
    split over `split.cp` context-parallel ranks, communication included (module
    docstring: ring steps as max(compute, send/recv), Ulysses' two all-to-alls)."""
    heads, kv_heads, head_dim = _attention_shape(model, t, decode=False)
    b = model.dtype.num_bytes
    rank_tokens = split.tokens(batch * seq)
    cp = split.cp
    if split.kind is CPKind.ULYSSES:
        attn_s = cm.attn_prefill_s(
            batch, seq, heads // cp, max(1, kv_heads // cp), head_dim, backward=backward
        )
        a2a = functools.partial(
            cm.collective_s,
            CollectiveKind.ALL_TO_ALL,
            world_size=cp,
            scope=split.cp_scope,
            ranks_per_node=split.cp_ranks_per_node,
        )
        qkv_bytes = rank_tokens * (heads + 2 * kv_heads) * head_dim * b
        out_bytes = rank_tokens * heads * head_dim * b
        return attn_s + a2a(num_bytes=qkv_bytes) + a2a(num_bytes=out_bytes)
    rank_s = cm.attn_prefill_s(batch, seq, heads, kv_heads, head_dim, backward=backward) / cp
    step_s = rank_s / cp  # the rank's share of the attention, in cp equal steps
    kv_chunk_bytes = 2 * rank_tokens * kv_heads * head_dim * b * (2 if backward else 1)
    send_s = cm.collective_s(CollectiveKind.SEND_RECV, kv_chunk_bytes, 2, split.cp_scope)
    return step_s + (cp - 1) * max(step_s, send_s)


def _tp_collectives_s(
    cm: CostModel, act_bytes: int, t: int, split: SequenceSplit, between_s: float = 0.0
) -> float:
    """The layer's two TP collectives of `act_bytes`: all-reduces, or with sequence
    parallelism a reduce-scatter plus an all-gather each. `between_s`: the layer's other
    work on a rank, which its collectives split evenly, so that each follows its share of
    it (what a collective costs on a CPU host depends on it, `CostModel.collective_s`)."""
    if t <= 1:
        return 0.0
    if not split.sequence_parallel:
        after = between_s / KERNELS_TP_ALL_REDUCES
        return 2 * cm.collective_s(
            CollectiveKind.ALL_REDUCE, act_bytes, t, Scope.INTRA, after_s=after
        )
    after = between_s / (2 * KERNELS_TP_ALL_REDUCES)
    return 2 * (
        cm.collective_s(CollectiveKind.REDUCE_SCATTER, act_bytes, t, Scope.INTRA, after_s=after)
        + cm.collective_s(CollectiveKind.ALL_GATHER, act_bytes, t, Scope.INTRA, after_s=after)
    )


def active_experts(num_experts: int, experts_per_token: int, num_tokens: int) -> float:
    """Expected distinct experts that `num_tokens` tokens touch: E·(1 − (1 − k/E)^T)."""
    return num_experts * (1.0 - (1.0 - experts_per_token / num_experts) ** num_tokens)


def all_to_all_bytes(model: ModelSpec, tokens: int) -> int:
    """One rank's send buffer of one dispatch (or combine): tokens·k·h·bytes."""
    assert model.moe is not None
    return tokens * model.moe.experts_per_token * model.hidden_size * model.dtype.num_bytes


def _expert_gemms_s(
    cm: CostModel, model: ModelSpec, t: int, e: int, tokens: int, *, backward: bool
) -> float:
    """The routed experts' GEMMs of one rank (module docstring), forward or backward.

    The rank's g = a/e expert GEMMs run as one grouped GEMM (Megatron's grouped
    GEMM, vLLM's fused MoE kernel), priced as one GEMM whose weight dimension
    is the g weights side by side: (rows, n, g·k) forward, (rows, k, g·n) and
    (k, g·n, rows) backward; the same FLOPs and weight bytes as the g GEMMs,
    with one launch.
    """
    moe = model.moe
    assert moe is not None
    routed = e * tokens  # tokens whose routes the rank's EP group exchanges
    touched = active_experts(moe.num_experts, moe.experts_per_token, routed)
    rows = max(1, math.ceil(routed * moe.experts_per_token / touched))
    group = max(1, round(touched / e))
    time_s = 0.0
    for n, k in _mlp_gemm_shapes(model.hidden_size, moe.expert_ffn_hidden_size, t):
        if backward:
            time_s += cm.gemm_s(rows, k, group * n) + cm.gemm_s(k, group * n, rows)
        else:
            time_s += cm.gemm_s(rows, n, group * k)
    return time_s


def _moe_mlp_s(
    cm: CostModel,
    model: ModelSpec,
    t: int,
    e: int,
    tokens: int,
    ep_scope: Scope,
    *,
    backward: bool,
    ep_ranks_per_node: int = 1,
) -> float:
    """Device time of one MoE block (router, all-to-alls, experts, shared experts) on one
    rank; across nodes its all-to-alls send over the NICs of the `ep_ranks_per_node`
    ranks of an expert-parallel group on each node (`CostModel.collective_s`)."""
    moe = model.moe
    assert moe is not None
    h, b, num_e = model.hidden_size, model.dtype.num_bytes, moe.num_experts
    passes = 2 if backward else 1  # elementwise backward reads about twice the forward
    time_s = (
        cm.gemm_s(tokens, h, num_e) + cm.gemm_s(h, num_e, tokens)
        if backward
        else cm.gemm_s(tokens, num_e, h)
    )
    time_s += passes * cm.elementwise_s(ElementwiseKind.SOFTMAX, tokens * num_e * 4)
    time_s += _expert_gemms_s(cm, model, t, e, tokens, backward=backward)
    routed_rows = tokens * moe.experts_per_token
    time_s += passes * cm.elementwise_s(
        ElementwiseKind.SILU_MUL, routed_rows * 2 * moe.expert_ffn_hidden_size // t * b
    )
    # Dispatch and combine (forward), and their gradients (backward).
    time_s += 2 * cm.collective_s(
        CollectiveKind.ALL_TO_ALL,
        all_to_all_bytes(model, tokens),
        e,
        ep_scope,
        ranks_per_node=ep_ranks_per_node,
    )
    if moe.shared_ffn_hidden_size:
        for n, k in _mlp_gemm_shapes(h, moe.shared_ffn_hidden_size, t):
            if backward:
                time_s += cm.gemm_s(tokens, k, n) + cm.gemm_s(k, n, tokens)
            else:
                time_s += cm.gemm_s(tokens, n, k)
        time_s += passes * cm.elementwise_s(
            ElementwiseKind.SILU_MUL, tokens * 2 * moe.shared_ffn_hidden_size // t * b
        )
    return time_s


def _dense_mlp_s(cm: CostModel, model: ModelSpec, t: int, tokens: int, *, backward: bool) -> float:
    b = model.dtype.num_bytes
    shapes = _mlp_gemm_shapes(model.hidden_size, model.ffn_hidden_size, t)
    if backward:
        time_s = sum(cm.gemm_s(tokens, k, n) + cm.gemm_s(k, n, tokens) for n, k in shapes)
        passes = 2
    else:
        time_s = sum(cm.gemm_s(tokens, n, k) for n, k in shapes)
        passes = 1
    silu_bytes = tokens * 2 * model.ffn_hidden_size // t * b
    return time_s + passes * cm.elementwise_s(ElementwiseKind.SILU_MUL, silu_bytes)


def _mean_mlp_s(
    cm: CostModel,
    model: ModelSpec,
    t: int,
    e: int,
    tokens: int,
    ep_scope: Scope,
    *,
    backward: bool,
    ep_ranks_per_node: int = 1,
) -> float:
    """The MLP part of a layer, averaged over the model's dense and MoE layers."""
    if model.moe is None:
        return _dense_mlp_s(cm, model, t, tokens, backward=backward)
    moe_s = _moe_mlp_s(
        cm, model, t, e, tokens, ep_scope, backward=backward, ep_ranks_per_node=ep_ranks_per_node
    )
    dense_s = (
        _dense_mlp_s(cm, model, t, tokens, backward=backward) if model.num_dense_layers else 0.0
    )
    return (model.num_moe_layers * moe_s + model.num_dense_layers * dense_s) / model.num_layers


def _attention_shape(model: ModelSpec, t: int, *, decode: bool) -> tuple[int, int, int]:
    """(heads, kv heads, head size) per rank of the attention kernel."""
    heads = model.num_heads // t
    if model.mla is not None and decode:
        return heads, 1, model.mla.kv_lora_rank + model.mla.qk_rope_head_dim
    if model.mla is not None:
        return heads, heads, model.head_dim
    return heads, model.kv_heads_per_rank(t), model.head_dim


def _moe_kernels(model: ModelSpec, *, backward: bool) -> int:
    if model.moe is None:
        return 0
    per_layer = KERNELS_MOE_BACKWARD if backward else KERNELS_MOE_FORWARD
    return round(per_layer * model.num_moe_layers / model.num_layers)


def layer_forward_kernels_s(
    cm: CostModel,
    model: ModelSpec,
    t: int,
    batch: int,
    seq: int,
    *,
    decode_kv_len: int = 0,
    e: int = 1,
    ep_scope: Scope = Scope.INTRA,
    ep_ranks_per_node: int = 1,
    split: SequenceSplit = NO_SPLIT,
    host_s: float = 0.0,
) -> float:
    """Device time of one layer's forward kernels on one rank (no host dispatch);
    the mean over the layers for a mixture of experts. `seq` is the whole sample's
    length; a context-parallel rank runs its `split` share of it.

    With `decode_kv_len` > 0 the attention is a decode step against that many
    cached tokens (seq must then be 1). `host_s`: the layer's host time on a CPU
    (`cpu_host_s`), which runs between its TP collectives as its kernels do.
    """

    def compute() -> float:
        m = split.tokens(batch * seq)
        b = model.dtype.num_bytes
        time_s = sum(cm.gemm_s(m, n, k) for n, k in _attention_gemm_shapes(model, t))
        heads, kv_heads, head_dim = _attention_shape(model, t, decode=bool(decode_kv_len))
        if decode_kv_len:
            time_s += cm.attn_decode_s(batch, decode_kv_len, heads, kv_heads, head_dim)
        elif split.cp > 1:
            time_s += context_attention_s(cm, model, t, batch, seq, split, backward=False)
        else:
            time_s += cm.attn_prefill_s(batch, seq, heads, kv_heads, head_dim)
        time_s += _mean_mlp_s(
            cm, model, t, e, m, ep_scope, backward=False, ep_ranks_per_node=ep_ranks_per_node
        )
        act = m * model.hidden_size * b
        local = act // t if split.sequence_parallel else act  # SP: norms on m/t tokens
        time_s += 2 * cm.elementwise_s(ElementwiseKind.RMSNORM, local)
        time_s += 2 * cm.elementwise_s(ElementwiseKind.ADD, local)
        time_s += _tp_collectives_s(cm, act, t, split, time_s + host_s)
        return time_s

    return cm.remember(
        (
            "layer_fwd_kernels",
            model,
            t,
            batch,
            seq,
            decode_kv_len,
            e,
            ep_scope,
            ep_ranks_per_node,
            split,
            host_s,
        ),
        compute,
    )


def layer_forward_s(
    cm: CostModel,
    model: ModelSpec,
    t: int,
    batch: int,
    seq: int,
    *,
    e: int = 1,
    ep_scope: Scope = Scope.INTRA,
    ep_ranks_per_node: int = 1,
    split: SequenceSplit = NO_SPLIT,
) -> float:
    """One layer's eager forward (prefill, scoring or training) on one rank."""
    kind = FrameworkKind.LAYER_FORWARD
    scale = host_scale(model, kind, split.tokens(batch * seq))
    kernels = layer_forward_kernels_s(
        cm, model, t, batch, seq, e=e, ep_scope=ep_scope, ep_ranks_per_node=ep_ranks_per_node,
        split=split, host_s=cpu_host_s(cm, EXTRA_OPS_LAYER_FORWARD, kind, scale),
    )  # fmt: skip
    launches = KERNELS_LAYER_FORWARD + _tp_kernels(t) + _moe_kernels(model, backward=False)
    launches += _split_kernels(split)
    return overlapped_s(cm, kernels, launches, EXTRA_OPS_LAYER_FORWARD, kind, scale)


def layer_backward_kernels_s(
    cm: CostModel,
    model: ModelSpec,
    t: int,
    batch: int,
    seq: int,
    *,
    e: int = 1,
    ep_scope: Scope = Scope.INTRA,
    ep_ranks_per_node: int = 1,
    split: SequenceSplit = NO_SPLIT,
    host_s: float = 0.0,
) -> float:
    """Device time of one layer's backward kernels (no recomputation) on one rank;
    `host_s` as for `layer_forward_kernels_s`."""

    def compute() -> float:
        m = split.tokens(batch * seq)
        b = model.dtype.num_bytes
        time_s = sum(
            cm.gemm_s(m, k, n) + cm.gemm_s(k, n, m) for n, k in _attention_gemm_shapes(model, t)
        )
        if split.cp > 1:
            time_s += context_attention_s(cm, model, t, batch, seq, split, backward=True)
        else:
            heads, kv_heads, head_dim = _attention_shape(model, t, decode=False)
            time_s += cm.attn_prefill_s(batch, seq, heads, kv_heads, head_dim, backward=True)
        time_s += _mean_mlp_s(
            cm, model, t, e, m, ep_scope, backward=True, ep_ranks_per_node=ep_ranks_per_node
        )
        act = m * model.hidden_size * b
        local = act // t if split.sequence_parallel else act  # SP: norms on m/t tokens
        # The backward of norms and adds reads about twice what the forward does.
        time_s += 4 * cm.elementwise_s(ElementwiseKind.RMSNORM, local)
        time_s += 2 * cm.elementwise_s(ElementwiseKind.ADD, local)
        time_s += _tp_collectives_s(cm, act, t, split, time_s + host_s)
        return time_s

    key = (
        "layer_bwd_kernels", model, t, batch, seq, e, ep_scope, ep_ranks_per_node, split, host_s
    )  # fmt: skip
    return cm.remember(key, compute)


def layer_backward_s(
    cm: CostModel,
    model: ModelSpec,
    t: int,
    batch: int,
    seq: int,
    *,
    e: int = 1,
    ep_scope: Scope = Scope.INTRA,
    ep_ranks_per_node: int = 1,
    split: SequenceSplit = NO_SPLIT,
) -> float:
    """One layer's backward (no recomputation) on one rank; the mean over layers for MoE."""
    kind = FrameworkKind.LAYER_BACKWARD
    scale = host_scale(model, kind, split.tokens(batch * seq))
    kernels = layer_backward_kernels_s(
        cm, model, t, batch, seq, e=e, ep_scope=ep_scope, ep_ranks_per_node=ep_ranks_per_node,
        split=split, host_s=cpu_host_s(cm, EXTRA_OPS_LAYER_BACKWARD, kind, scale),
    )  # fmt: skip
    launches = KERNELS_LAYER_BACKWARD + _tp_kernels(t) + _moe_kernels(model, backward=True)
    launches += _split_kernels(split)
    return overlapped_s(cm, kernels, launches, EXTRA_OPS_LAYER_BACKWARD, kind, scale)


def _tp_edge_s(cm: CostModel, model: ModelSpec, t: int, tokens: int, after_s: float) -> float:
    """The one TP all-reduce of `tokens` hidden activations outside the layers, each way
    (module docstring): the vocabulary-parallel embedding's output in a forward, the LM
    head input's gradient in a backward; after `after_s` of the call's other work
    outside the layers (what a collective costs on a CPU host depends on it,
    `CostModel.collective_s`). 0 without tensor parallelism."""
    if t <= 1:
        return 0.0
    act = tokens * model.hidden_size * model.dtype.num_bytes
    return cm.collective_s(CollectiveKind.ALL_REDUCE, act, t, Scope.INTRA, after_s=after_s)


def _tp_edge_kernels(t: int) -> int:
    """Launches of `_tp_edge_s`'s collective: one under tensor parallelism."""
    return 1 if t > 1 else 0


def _head_forward_kernels_s(
    cm: CostModel, model: ModelSpec, t: int, tokens: int, *, value_head: bool
) -> float:
    """The head's kernels, and under tensor parallelism the embedding's all-reduce
    (`_tp_edge_s`), which every model of a TP layout runs, critics included."""
    if value_head:
        time_s = cm.gemm_s(tokens, 1, model.hidden_size)
    else:
        vocab = model.vocab_size // t
        time_s = cm.gemm_s(tokens, vocab, model.hidden_size) + cm.elementwise_s(
            ElementwiseKind.SOFTMAX, tokens * vocab * 4
        )
    return time_s + _tp_edge_s(cm, model, t, tokens, time_s)


def head_forward_s(
    cm: CostModel, model: ModelSpec, t: int, tokens: int, *, value_head: bool
) -> float:
    """LM head plus float32 log-softmax over the vocabulary shard, or a scalar value head;
    with the forward's framework ops outside the layers."""
    kernels = _head_forward_kernels_s(cm, model, t, tokens, value_head=value_head)
    return overlapped_s(
        cm,
        kernels,
        KERNELS_HEAD_FORWARD[value_head] + _tp_edge_kernels(t),
        EXTRA_OPS_CALL_FORWARD,
        FrameworkKind.CALL_FORWARD,
        host_scale(model, FrameworkKind.CALL_FORWARD, tokens),
    )


def _head_backward_kernels_s(
    cm: CostModel, model: ModelSpec, t: int, tokens: int, *, value_head: bool
) -> float:
    n = 1 if value_head else model.vocab_size // t
    k = model.hidden_size
    time_s = cm.gemm_s(tokens, k, n) + cm.gemm_s(k, n, tokens)
    if value_head:
        return time_s  # a value head is whole on every rank: its input's gradient too
    time_s += cm.elementwise_s(ElementwiseKind.SOFTMAX, tokens * n * 4)
    return time_s + _tp_edge_s(cm, model, t, tokens, time_s)


def head_backward_s(
    cm: CostModel, model: ModelSpec, t: int, tokens: int, *, value_head: bool
) -> float:
    kernels = _head_backward_kernels_s(cm, model, t, tokens, value_head=value_head)
    return overlapped_s(
        cm,
        kernels,
        KERNELS_HEAD_BACKWARD[value_head] + (0 if value_head else _tp_edge_kernels(t)),
        EXTRA_OPS_CALL_BACKWARD,
        FrameworkKind.CALL_BACKWARD,
        host_scale(model, FrameworkKind.CALL_BACKWARD, tokens),
    )


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
    graphed = decode_graphed(engine, cm.device_kind, tg)
    return _decode_step_s(cm, model, tg, pg, batch, kv_len, graphed=graphed)


def _logits_gather_s(cm: CostModel, model: ModelSpec, tg: int, batch: int, after_s: float) -> float:
    """A TP decode step's all-gather of its `batch` rows of logits over the vocabulary
    shards, which the engines sample from whole (module docstring); after the head's
    `after_s`. 0 without tensor parallelism."""
    if tg <= 1:
        return 0.0
    logits = batch * model.vocab_size * model.dtype.num_bytes
    return cm.collective_s(CollectiveKind.ALL_GATHER, logits, tg, Scope.INTRA, after_s=after_s)


def graph_capture_s(cm: CostModel, model: ModelSpec, batch: int, kv_len: int) -> float:
    """The built-in engine's CUDA-graph capture of its decode step, once per generation
    (tg = 1, `placeflow.workload.decode_graphed`): `GRAPH_WARMUP_RUNS` eager runs of the
    step, then the captured run, whose launches cost the host what an eager run's do."""
    eager = _decode_step_s(cm, model, 1, 1, batch, kv_len, graphed=False)
    return (GRAPH_WARMUP_RUNS + 1) * eager


def _decode_step_s(
    cm: CostModel, model: ModelSpec, tg: int, pg: int, batch: int, kv_len: int, *, graphed: bool
) -> float:
    def compute() -> float:
        kind = FrameworkKind.LAYER_DECODE
        between = cpu_host_s(cm, EXTRA_OPS_LAYER_DECODE, kind, host_scale(model, kind, batch))
        layer = layer_forward_kernels_s(
            cm, model, tg, batch, 1, decode_kv_len=kv_len, host_s=between
        )
        p2p = (pg - 1) * cm.collective_s(
            CollectiveKind.SEND_RECV,
            batch * model.hidden_size * model.dtype.num_bytes,
            2,
            Scope.INTRA,
        )
        head = _head_forward_kernels_s(cm, model, tg, batch, value_head=False)
        device_s = model.num_layers * layer + head + _logits_gather_s(cm, model, tg, batch, head)
        device_s += p2p
        if graphed:
            # One graph launch replaces the layers' and the head's launches.
            time_s = max(device_s, (1 + EXTRA_OPS_DECODE_STEP) * op_overhead_s(cm))
        else:
            # The decode step's own ops replace the forward's: the sampler's step is not a
            # scoring call.
            kernels = model.num_layers * (
                KERNELS_LAYER_FORWARD + _tp_kernels(tg) + _moe_kernels(model, backward=False)
            )
            # The embedding's all-reduce and the logits' gather outside the layers:
            kernels += KERNELS_HEAD_FORWARD[False] + 2 * _tp_edge_kernels(tg)
            layer_host, step_host = (
                framework_host_s(cm, kind, host_scale(model, kind, batch))
                for kind in (FrameworkKind.LAYER_DECODE, FrameworkKind.DECODE_STEP)
            )
            if layer_host is None or step_host is None:
                extra = model.num_layers * EXTRA_OPS_LAYER_DECODE + EXTRA_OPS_DECODE_STEP
                time_s = overlapped_s(cm, device_s, kernels, extra)
            else:
                host_s = model.num_layers * layer_host + step_host
                time_s = _combined_s(cm, device_s, kernels, host_s)
        return time_s

    return cm.remember(("decode_step", model, tg, pg, batch, kv_len, graphed), compute)


# --- LoRA (placeflow/lora.py) ------------------------------------------------------------


def base_weight_grad_s(
    cm: CostModel, model: ModelSpec, t: int, batch: int, seq: int, *, value_head: bool
) -> tuple[float, float]:
    """(one layer, the head) of the weight-gradient GEMMs of a dense model's backward,
    k×n×m each: what a LoRA backward skips, its base weights being frozen. A critic's
    value head stays trained (lora.py), so its head term is 0."""
    m = batch * seq
    shapes = _attention_gemm_shapes(model, t) + _mlp_gemm_shapes(
        model.hidden_size, model.ffn_hidden_size, t
    )
    layer = sum(cm.gemm_s(k, n, m) for n, k in shapes)
    head = 0.0 if value_head else cm.gemm_s(model.hidden_size, model.vocab_size // t, m)
    return layer, head


def lora_layer_s(
    cm: CostModel,
    model: ModelSpec,
    t: int,
    batch: int,
    seq: int,
    shapes: tuple[tuple[int, int], ...],
    rank: int,
    *,
    backward: bool,
) -> float:
    """The adapters' GEMMs of one layer on one TP rank: per adapted (in, out) projection
    x·A (m, r, in) then ·B (m, out, r), the rank holding in/t or out/t of the sharded
    side (either way r·(in + out)/t parameters, as Megatron shards the adapters with
    their layer); the backward runs each GEMM twice (input and weight gradients)."""
    m = batch * seq
    time_s = 0.0
    for fan_in, fan_out in shapes:
        down = cm.gemm_s(m, rank, max(1, fan_in // t))
        up = cm.gemm_s(m, max(1, fan_out // t), rank)
        time_s += 2 * (down + up) if backward else down + up
    return time_s
