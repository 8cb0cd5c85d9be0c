"""Per-GPU memory of a role in each phase.

- Weights, gradients and optimizer state: mixed-precision Adam keeps 16 bytes
  per parameter before sharding (bf16 weights 2 + bf16 grads 2 + fp32 master,
  exp_avg and exp_avg_sq 12; an fp32 model keeps weights 4, grads 4 and the two
  moments 8: also 16). ZeRO stage z over d ranks shards the optimizer state
  (z >= 1), the gradients (z >= 2) and the weights (z = 3).
- Training activations per layer and micro-batch follow Korthikanti et al.
  (2022) with tensor parallelism: s·b·h·(10 + 24/t) bytes in bf16 — their
  5·a·s/(h·t) attention-score term is dropped because fused attention (SDPA,
  FlashAttention) never stores the scores. Full recomputation keeps only each
  layer's input (2·s·b·h) plus one layer's activations. 1F1B keeps at most p
  micro-batches in flight on the first stage.
- Logits: float32 log-softmax over the vocabulary shard, kept for backward.
- Optimizer offload: the Adam state lives in host memory outside the role's
  update. With the device step it is resident only while the update runs
  (reloaded before, written back after); with the host step (`OptimizerStep.HOST`,
  DeepSpeed's CPU Adam) it never comes back: the device keeps bf16 weights and
  gradients only, no moments and no fp32 master. The KV cache is never kept
  across phases: generation frees it, so there is nothing of it to offload.
- Parameter offload (`offload_params`, verl's `param_offload`): outside the
  role's own calls its weights, and a trained role's gradients, are in host
  memory; each call brings the weights back (an update grows its gradients
  again), so they count in that call's transient memory, not in the set's
  resident state. What is left resident is the Adam state (none with
  optimizer offload too).
- Frozen roles (ref, reward, cost) keep bf16 weights only; with zero = 3 they
  shard them over d like FSDP/ZeRO-3 inference, and each forward gathers one
  layer's full (t·p-sharded) weights at a time.
- Generation: the KV cache, 2·layers·kv_heads·head_dim·bytes per token, split
  over tg (heads) and pg (layers); with multi-head latent attention the
  compressed latent and RoPE key, layers·(kv_lora_rank + rope dims)·bytes,
  split over pg only (every TP rank keeps the whole latent, as vLLM does). As
  vLLM sizes it, the cache gets the share `gpu_memory_utilization` of what a
  device has left after its reserve and the resident state; a replica runs at
  most `max_num_seqs` sequences at once.
- Uneven pipeline stages (`TrainLayout.first_stage_layers` / `last_stage_layers`):
  a rank holds the heaviest stage's share of the parameters, k_max/L of them
  over t (as for even stages, the embedding and head are spread with the layers),
  and its activations are those of k_max layers.
- LoRA (`LoRASpec`, `placeflow/lora.py`): the base weights are frozen and kept
  like a forward-only role's (the model's dtype, over t·p, and over d with
  zero = 3); gradients and Adam state exist for the adapters only, which are
  sharded as the layers they adapt (over t·p) and by ZeRO over d like any
  trained parameter. Activations are those of full training: the backward
  still needs every layer's input gradient.
- Context parallelism cp (`TrainLayout.cp`, ring or Ulysses): a rank holds
  1/cp of every sequence's tokens, so its activations and logits are those of
  seq/cp tokens (Ulysses' attention holds the whole sequence for heads/cp heads:
  the same count, and fused attention stores no scores either way). Weights are
  whole on every cp rank (t·p-sharded as before); gradient reduction and ZeRO's
  sharding span the d·cp ranks that hold the same weights, as Megatron-core's
  distributed optimizer shards over the data-parallel group with context
  parallelism.
- Sequence parallelism (`TrainLayout.sequence_parallel`): Korthikanti et al.
  (2022), "Reducing Activation Recomputation in Large Transformer Models"
  (arXiv 2205.05198), Table 2: per layer sbh·(10 + 24/t + 5as/(ht)) with tensor
  parallelism becomes sbh·(34/t + 5as/(ht)) with sequence parallelism — the
  layer norms', dropouts' and residuals' 10·sbh are split over t too (the
  score term is dropped as above); with full recomputation the kept layer input
  is split over t as well, 2·sbh/t (their §5).
- Mixture of experts (`shard_params`): a rank of layout p-t-d-e holds the
  dense parameters / (t·p) and the routed experts' parameters / (t·p·e);
  ZeRO shards the dense part's state over d and the experts' over the
  expert-data-parallel group d·cp/e. Generation ranks hold M/(tg·pg) as before
  (experts spread over the replica's tg ranks).
"""

from __future__ import annotations

from placeflow.layout import GenLayout, TrainLayout, generation_shard_bytes
from placeflow.models import ModelSpec
from placeflow.plan import RoleParallelism
from placeflow.workload import KVCacheDType, LoRASpec, Precision

ADAM_BYTES_PER_PARAM = 16


def expert_params(model: ModelSpec) -> int:
    """Parameters of the routed experts (0 for a dense model); the rest is dense."""
    if model.moe is None:
        return 0
    per_expert = 3 * model.hidden_size * model.moe.expert_ffn_hidden_size
    return model.num_moe_layers * model.moe.num_experts * per_expert


def dense_and_expert_params(model: ModelSpec, *, value_head: bool) -> tuple[int, int]:
    """(dense parameters, routed-expert parameters): the split every per-rank size uses."""
    experts = expert_params(model)
    return model.num_params(value_head=value_head) - experts, experts


def _model_parallel_ways(model: ModelSpec, layout: TrainLayout) -> float:
    """Into how many parts t·p splits the layers' parameters for the heaviest rank: t·p,
    or t·L/k_max with uneven stages (embedding and head are spread with the layers)."""
    if layout.uneven:
        return layout.t * model.num_layers / layout.heaviest_stage_layers(model.num_layers)
    return layout.t * layout.p


def trained_shard_params(
    model: ModelSpec, layout: TrainLayout, lora: LoRASpec | None, *, value_head: bool
) -> tuple[tuple[float, int], ...]:
    """`shard_params` of the parameters a role trains: all of them, or with LoRA the
    adapters only (over t·p, replicated over d like dense weights)."""
    if lora is None:
        return shard_params(model, layout, value_head=value_head)
    return ((lora.params(model) / _model_parallel_ways(model, layout), layout.num_weight_replicas),)


def shard_params(
    model: ModelSpec, layout: TrainLayout, *, value_head: bool
) -> tuple[tuple[float, int], ...]:
    """(parameters on one GPU, size of the data-parallel group that replicates them):
    the dense part over d·cp, the routed experts over the expert-DP group d·cp/e."""
    dense, experts = dense_and_expert_params(model, value_head=value_head)
    mp = _model_parallel_ways(model, layout)
    parts: tuple[tuple[float, int], ...] = ((dense / mp, layout.num_weight_replicas),)
    if experts:
        parts += ((experts / (mp * layout.e), layout.expert_dp),)
    return parts


def weight_bytes_per_gpu(
    model: ModelSpec, t: int, p: int, *, value_head: bool, e: int = 1
) -> float:
    """Weights of one rank of a t·p model-parallel group, experts over e, nothing split
    over data parallelism: `kept_weight_bytes_per_gpu` without ZeRO-3, for shapes that
    have no data-parallel size (a generation replica, a training shard's t·p block)."""
    dense, experts = dense_and_expert_params(model, value_head=value_head)
    return (dense + experts / e) * model.dtype.num_bytes / (t * p)


def training_state_bytes_per_gpu(
    model: ModelSpec,
    layout: TrainLayout,
    zero: int,
    *,
    value_head: bool,
    lora: LoRASpec | None = None,
) -> float:
    """Weights + gradients + optimizer state on one GPU under ZeRO stage `zero`; with
    LoRA the frozen base's weights plus the adapters' weights, gradients and state."""
    w = g = model.dtype.num_bytes
    opt = ADAM_BYTES_PER_PARAM - w - g
    total = 0.0
    if lora is not None:
        total += kept_weight_bytes_per_gpu(model, layout, zero, value_head=value_head)
    for shard, d in trained_shard_params(model, layout, lora, value_head=value_head):
        per_param = {
            0: w + g + opt,
            1: w + g + opt / d,
            2: w + (g + opt) / d,
            3: (w + g + opt) / d,
        }[zero]
        total += shard * per_param
    return total


def optimizer_state_bytes_per_gpu(
    model: ModelSpec,
    layout: TrainLayout,
    zero: int,
    *,
    value_head: bool,
    lora: LoRASpec | None = None,
) -> float:
    """The Adam state part of `training_state_bytes_per_gpu` (what offloading moves)."""
    opt = ADAM_BYTES_PER_PARAM - 2 * model.dtype.num_bytes
    return _state_part(model, layout, lora, value_head, opt, zero >= 1)


def _state_part(
    model: ModelSpec,
    layout: TrainLayout,
    lora: LoRASpec | None,
    value_head: bool,
    per_param: float,
    sharded: bool,
) -> float:
    """`per_param` bytes of every trained parameter on a rank, over its data-parallel
    sharding group when ZeRO shards this part (`sharded`)."""
    return sum(
        shard * per_param / (d if sharded else 1)
        for shard, d in trained_shard_params(model, layout, lora, value_head=value_head)
    )


def gradient_bytes_per_gpu(
    model: ModelSpec,
    layout: TrainLayout,
    zero: int,
    *,
    value_head: bool,
    lora: LoRASpec | None = None,
) -> float:
    """The gradient part of `training_state_bytes_per_gpu` (sharded over d from ZeRO-2)."""
    return _state_part(model, layout, lora, value_head, model.dtype.num_bytes, zero >= 2)


def offloaded_param_bytes(
    model: ModelSpec,
    par: RoleParallelism,
    *,
    trained: bool,
    value_head: bool,
    lora: LoRASpec | None = None,
) -> tuple[float, float]:
    """(weights, gradients) per GPU that `offload_params` keeps in host memory between
    the role's calls: the weights the rank keeps (with LoRA the base and the adapters)
    and, for a trained role, its gradients; 0 bytes without offload_params."""
    if not par.offload_params:
        return 0.0, 0.0
    if not trained:
        return frozen_weight_bytes_per_gpu(model, par, value_head=value_head), 0.0
    lay, zero = par.train, par.zero
    grads = gradient_bytes_per_gpu(model, lay, zero, value_head=value_head, lora=lora)
    state = training_state_bytes_per_gpu(model, lay, zero, value_head=value_head, lora=lora)
    adam = optimizer_state_bytes_per_gpu(model, lay, zero, value_head=value_head, lora=lora)
    return state - adam - grads, grads


def logits_bytes(model: ModelSpec, t: int, tokens: int, *, value_head: bool) -> float:
    return 0.0 if value_head else tokens * model.vocab_size / t * 4.0


def training_activation_bytes(
    model: ModelSpec,
    layout: TrainLayout,
    micro_batch: int,
    seq: int,
    num_micro: int,
    *,
    recompute: bool,
    value_head: bool,
) -> float:
    """Peak activation memory of a pipeline stage during 1F1B: the heaviest stage's
    layers with p micro-batches in flight (the first stage's count; an upper bound
    when uneven stages give the first stage fewer layers). A rank holds seq/cp of
    each sample's tokens; sequence parallelism splits the rest over t too
    (module docstring: Korthikanti's sbh·(34/t) and 2·sbh/t)."""
    tokens = cp_tokens(micro_batch * seq, layout.cp)
    sbh = tokens * model.hidden_size
    bytes_scale = model.dtype.num_bytes / 2  # Korthikanti's constants are for 2-byte dtypes
    if layout.sequence_parallel:
        full_layer = sbh * (34 / layout.t) * bytes_scale
        layer_input = 2 * sbh / layout.t * bytes_scale
    else:
        full_layer = sbh * (10 + 24 / layout.t) * bytes_scale
        layer_input = 2 * sbh * bytes_scale
    layers = layout.heaviest_stage_layers(model.num_layers)
    per_micro = layers * layer_input + full_layer if recompute else layers * full_layer
    in_flight = min(layout.p, num_micro)
    logits = 2 * logits_bytes(model, layout.t, tokens, value_head=value_head)
    return in_flight * per_micro + logits


def cp_tokens(tokens: int, cp: int) -> int:
    """Tokens one context-parallel rank holds of `tokens`: ceil(tokens/cp)."""
    return -(-tokens // cp)


def forward_activation_bytes(
    model: ModelSpec,
    t: int,
    micro_batch: int,
    seq: int,
    *,
    value_head: bool,
    sequence_parallel: bool = False,
) -> float:
    """Transient memory of a forward-only call: one layer's buffers plus the logits
    (`seq`: the tokens one rank holds, seq/cp under context parallelism); sequence
    parallelism splits the hidden-size buffers (norms, residual) over t."""
    tokens = micro_batch * seq
    b = model.dtype.num_bytes
    hidden = 4 * model.hidden_size / t if sequence_parallel else 4 * model.hidden_size
    layer = tokens * (hidden + 3 * model.ffn_hidden_size // t) * b
    return layer + logits_bytes(model, t, tokens, value_head=value_head)


def kv_bytes_per_token_per_gpu(
    model: ModelSpec, tg: int, pg: int, kv_dtype: KVCacheDType = KVCacheDType.AUTO
) -> float:
    """KV cache bytes of one token on one generation GPU; an fp8 cache (vLLM's
    kv_cache_dtype="fp8") keeps 1 byte per element instead of the model dtype's."""
    scale = 1 / model.dtype.num_bytes if kv_dtype is KVCacheDType.FP8 else 1
    if model.mla is not None:
        return model.kv_cache_bytes_per_token / pg * scale
    kv_heads_per_rank = model.kv_heads_per_rank(tg)
    elt = model.dtype.num_bytes * scale
    return 2 * model.num_layers / pg * kv_heads_per_rank * model.head_dim * elt


def trained_resident_bytes_per_gpu(
    model: ModelSpec, par: RoleParallelism, *, value_head: bool, lora: LoRASpec | None = None
) -> float:
    """What a trained role keeps on a device between its calls.

    Weights, gradients and Adam state under ZeRO; with optimizer offload (either
    step) the Adam state part (fp32 master and moments) is in host memory, with
    parameter offload the weights and gradients.
    """
    state = training_state_bytes_per_gpu(
        model, par.train, par.zero, value_head=value_head, lora=lora
    )
    if par.offload_optimizer:
        state -= optimizer_state_bytes_per_gpu(
            model, par.train, par.zero, value_head=value_head, lora=lora
        )
    weights, grads = offloaded_param_bytes(
        model, par, trained=True, value_head=value_head, lora=lora
    )
    return state - weights - grads


def kept_weight_bytes_per_gpu(
    model: ModelSpec, layout: TrainLayout, zero: int, *, value_head: bool
) -> float:
    """Weights a rank of `layout` keeps: its t·p shard (experts / e), and with zero = 3
    1/d of the dense part and 1/(d/e) of the experts (ZeRO-3 / FSDP)."""
    return sum(
        shard * model.dtype.num_bytes / (d if zero == 3 else 1)
        for shard, d in shard_params(model, layout, value_head=value_head)
    )


def frozen_weight_bytes_per_gpu(
    model: ModelSpec, par: RoleParallelism, *, value_head: bool
) -> float:
    """Weights of a forward-only role per device: M/(t·p), and M/(t·p·d) with zero = 3
    (kept there between calls unless `offload_params`: `frozen_resident_bytes_per_gpu`)."""
    return kept_weight_bytes_per_gpu(model, par.train, par.zero, value_head=value_head)


def frozen_resident_bytes_per_gpu(
    model: ModelSpec, par: RoleParallelism, *, value_head: bool
) -> float:
    """What a forward-only role keeps on a device between its calls: its weights, or
    nothing when they are offloaded."""
    if par.offload_params:
        return 0.0
    return frozen_weight_bytes_per_gpu(model, par, value_head=value_head)


def gathered_layer_bytes(model: ModelSpec, t: int) -> float:
    """One decoder layer's weights on a tensor-parallel rank, as ZeRO-3 gathers them:
    params_per_layer·bytes/t (embeddings and head are gathered once, not counted)."""
    return model.num_params_per_layer * model.dtype.num_bytes / t


def kv_capacity_seqs(
    free_bytes: float, kv_bytes_per_seq: float, gpu_memory_utilization: float, max_num_seqs: int
) -> int:
    """Sequences a generation replica runs at once: floor(u·free / kv_per_seq), at most
    max_num_seqs; `free_bytes` is what remains after the reserve and resident state."""
    if free_bytes <= 0:
        return 0
    return min(max_num_seqs, int(gpu_memory_utilization * free_bytes // kv_bytes_per_seq))


def generation_weight_bytes(model: ModelSpec, precision: Precision = Precision.BF16) -> float:
    """Bytes of the generation copy of `model`'s weights: its dtype's, or 1 per parameter
    in FP8 (vLLM's quantization="fp8"; the per-tensor scales are negligible)."""
    if precision is Precision.FP8:
        return model.num_bytes() / model.dtype.num_bytes
    return float(model.num_bytes())


def colocated_gen_extra_bytes(
    model: ModelSpec, gen: GenLayout, zero: int, precision: Precision = Precision.BF16
) -> float:
    """Generation weights a colocated actor adds beyond the training weights it keeps:
    M/(tg·pg) − M/(t·p), or − M/(t·p·d) under ZeRO-3, whose ranks keep 1/d of their
    t·p shard and must gather the rest before generating. An FP8 generation copy is
    a quantised copy of its own (M/2 for bf16 weights), reusing none of the training
    weights' memory."""
    if precision is Precision.FP8:
        return generation_shard_bytes(int(generation_weight_bytes(model, precision)), gen)
    kept = kept_weight_bytes_per_gpu(model, gen.train, zero, value_head=False)
    return generation_shard_bytes(model.num_bytes(), gen) - kept
