"""Time and transient memory of each model call of a plan.

Generation (per generation replica, replicas run in parallel):
- n = ceil(samples / replicas) sequences; the KV cache holds C sequences of
  prompt + max response tokens in the memory left after everything resident.
- n <= C: one batch; prefill of n·prompt tokens, then decode steps s = 1..S
  with n·P(len >= s) sequences still active at KV length prompt + s, S the step
  at which the longest of the n is expected to finish (stragglers).
- n > C: continuous batching keeps C sequences active while the queue drains
  ((n − C)·E[len]/C steps at the mean KV length), then the last C finish as above.
- The decode sum is integrated over `DECODE_POINTS` sampled steps (trapezoid);
  the step cost is smooth in s.

Forward calls: samples split over d ranks, micro-batches of `forward_micro_batch`
samples of prompt + mean response tokens (or, counted in tokens, as many
micro-batches as the rank's tokens need: `plan.MicroBatching`), through p stages: (m + p − 1) stage
times (pipeline fill and drain).

Training: ppo_epochs × mini_batches optimizer steps; each runs 1F1B over its
micro-batches, (m + p − 1)·(f + b [+ f when recomputing]) per stage, then the
gradient reduction over d (all-reduce for ZeRO-0, reduce-scatter then a weight
all-gather otherwise; ZeRO-3 also gathers weights for every micro-batch's
forward and backward), and the optimizer step on the local shard: on the
device, or on the host for `OptimizerStep.HOST` (gradients down, CPU AdamW
priced by the host's profile, weights up). A forward with zero = 3 all-gathers
each layer's weights over d per micro-batch.

Context parallelism cp (`compute.SequenceSplit`): the cp ranks of a sample
share its tokens, so samples still split over d while each rank's layers,
head and pipeline sends carry seq/cp of them; the CP attention's exchange is
priced in `compute.context_attention_s`. Weights are replicated over the d·cp
ranks (`TrainLayout.num_weight_replicas`): gradient reduction, ZeRO's shards
and their gathers span d·cp, as in Megatron-core.

Weight transitions of the actor (colocated reshard, weight sync to a generator
on other devices) take their bytes and buckets from the transfer plans in
`placeflow.reshard_plan`, the same plans the executor performs; the plans are
cached per model and layout because the planner costs thousands of layouts.
"""

from __future__ import annotations

import functools
import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from placeflow.errors import SpecError
from placeflow.layout import (
    GenLayout,
    TrainLayout,
    disjoint_transfer_bytes_per_gen_rank,
    gen_shard_bytes,
    generation_shard_bytes,
    generator_stage_layers,
)
from placeflow.lora import adapted_shapes
from placeflow.models import ModelSpec
from placeflow.plan import RoleParallelism
from placeflow.profiles.costmodel import CostModel
from placeflow.profiles.schema import CollectiveKind, ElementwiseKind, FrameworkKind, Scope
from placeflow.reshard_plan import (
    WEIGHT_SYNC_BUCKET_BYTES,
    GeneratorLayout,
    RankWork,
    TinyLlama,
    plan_disjoint,
    plan_reshard,
    rank_work,
    train_shard,
)
from placeflow.simulator import compute, memory
from placeflow.simulator.lengths import LengthModel
from placeflow.workload import KVCacheDType, LoRASpec, RolloutEngine, decode_graphed

DECODE_POINTS = 12


@dataclass(frozen=True, kw_only=True)
class CallCost:
    """Seconds of one call and the transient bytes per GPU it adds on top of resident state.

    `busy_s` excludes pipeline bubbles (time a stage waits), for utilisation.
    """

    time_s: float
    transient_bytes: float
    busy_s: float
    detail: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)


@dataclass(frozen=True, kw_only=True)
class GenerationShape:
    num_seqs: int  # per replica
    prompt_len: int
    lengths: LengthModel
    kv_capacity_seqs: int
    engine: RolloutEngine = RolloutEngine.BUILTIN  # how a decode step runs (compute.py)
    kv_dtype: KVCacheDType = KVCacheDType.AUTO  # vLLM's kv_cache_dtype
    # Sequences still expected to run at the last decode step (LengthModel.last_step):
    # 0.5 is the expected longest; −ln q its quantile q (one draw of a varying step).
    tail_left: float = 0.5
    # The host's busy workers' generation weights outgrow its last-level cache, so each
    # pass over the weights reads them from memory (`weights_from_memory`).
    weights_from_memory: bool = False


def _decode_sum_s(
    cm: CostModel,
    model: ModelSpec,
    gen: GenLayout,
    n: int,
    shape: GenerationShape,
    static_kv: int | None,
) -> tuple[float, int]:
    """Seconds to decode one batch of n sequences to completion, and the step count.

    Sum over steps 1..S of the step cost, as the trapezoid integral over sampled
    steps plus half of each end value (exact for a constant or linear step cost).
    Step s runs the sequences still going at s and attends over prompt + s tokens;
    where the engine attends over its whole cache (`static_cache`) it runs fixed
    shapes: every step holds all n sequences, finished ones masked, over `static_kv`.
    Each step is priced by `decode_pass_s`.
    """
    prompt, lengths = shape.prompt_len, shape.lengths
    last = lengths.last_step(n, shape.tail_left)
    points = sorted({round(1 + i * (last - 1) / (DECODE_POINTS - 1)) for i in range(DECODE_POINTS)})
    rows = [n if static_kv else max(1, math.ceil(n * lengths.survival(s))) for s in points]
    values = [
        decode_pass_s(cm, model, gen, shape, r, static_kv or prompt + s)
        for s, r in zip(points, rows, strict=True)
    ]
    if len(points) == 1:
        return values[0], last
    integral = sum(
        (s1 - s0) * (v0 + v1) / 2
        for s0, s1, v0, v1 in zip(points, points[1:], values, values[1:], strict=False)
    )
    return integral + (values[0] + values[-1]) / 2, last


def decode_pass_s(
    cm: CostModel, model: ModelSpec, gen: GenLayout, shape: GenerationShape, rows: int, kv_len: int
) -> float:
    """One decode step of `rows` sequences at KV length `kv_len` as a generation of
    `shape` prices it: the step as its engine runs it (`compute.decode_step_s`) plus the
    pass's weights read from the host's shared cache where they outgrow a core's own
    (`CostModel.cold_weights_s`; where they come from memory, `generation_cost` prices
    the reads instead)."""
    step_s = compute.decode_step_s(cm, model, gen.tg, gen.pg, rows, kv_len, engine=shape.engine)
    return step_s + _cold_pass_s(cm, model, gen, shape, rows)


def _cold_pass_s(
    cm: CostModel, model: ModelSpec, gen: GenLayout, shape: GenerationShape, rows: int
) -> float:
    if shape.weights_from_memory:
        return 0.0
    return cm.cold_weights_s(generation_shard_bytes(model.num_bytes(), gen), rows)


def static_cache(cm: CostModel, gen: GenLayout, shape: GenerationShape) -> bool:
    """Whether the engine's decode attends over its whole preallocated cache (prompt +
    max response) rather than the tokens so far: the built-in engine's graphed decode
    runs fixed shapes under a mask (`placeflow.workload.decode_graphed`); vLLM's paged
    attention reads the blocks in use."""
    return shape.engine is RolloutEngine.BUILTIN and decode_graphed(
        shape.engine, cm.device_kind, gen.tg
    )


def weights_from_memory(cm: CostModel, model: ModelSpec, gen: GenLayout, workers: int) -> bool:
    """Whether `workers` generation ranks of `gen` busy on one host hold more weights
    together than its last-level cache (`CostModel.host_cache_bytes`; never where the
    profile does not record one: GPU profiles, whose kernels read device memory anyway).

    On such a host a decode step's small GEMMs wait for their weights from memory:
    in an ad-hoc probe of the engine's `Sampler` (tiny-llama-m, 8 sequences, one
    thread each) a pass over the 12.3 MB of weights took 0.66 ms more with four
    processes on the 2 cores (49 MB, over the 32 MiB cache) than alone."""
    cache = cm.host_cache_bytes
    return cache is not None and workers * generation_shard_bytes(model.num_bytes(), gen) > cache


def generation_cost(
    cm: CostModel, model: ModelSpec, gen: GenLayout, shape: GenerationShape
) -> CallCost:
    n, c, prompt = shape.num_seqs, shape.kv_capacity_seqs, shape.prompt_len
    assert c >= 1, "callers check KV capacity first"
    batch = min(n, c)
    prefill_one = model.num_layers * compute.layer_forward_s(cm, model, gen.tg, batch, prompt)
    prefill_one += compute.head_forward_s(cm, model, gen.tg, batch, value_head=False)
    prefill_s = prefill_one * n / batch
    steady_s = 0.0
    # Each prefill wave is a pass over the weights too.
    cold_prefill_s = _cold_pass_s(cm, model, gen, shape, batch * prompt) * math.ceil(n / batch)
    # The KV length every step attends over where the engine's cache is static.
    static_kv = prompt + shape.lengths.max_len if static_cache(cm, gen, shape) else None
    if n > c:
        steady_steps = (n - c) * shape.lengths.mean / c
        mean_kv = static_kv or prompt + int(shape.lengths.mean / 2)
        steady_s = steady_steps * decode_pass_s(cm, model, gen, shape, c, mean_kv)
    tail_s, steps = _decode_sum_s(cm, model, gen, batch, shape, static_kv)
    # The built-in engine captures its decode graph once per generation (a call); vLLM
    # captures its graphs when the engine starts, outside the step.
    capture_s = compute.graph_capture_s(cm, model, batch, static_kv) if static_kv else 0.0
    kv_bytes = (
        batch
        * (prompt + shape.lengths.max_len)
        * memory.kv_bytes_per_token_per_gpu(model, gen.tg, gen.pg, shape.kv_dtype)
    )
    reads_s = 0.0
    if shape.weights_from_memory:
        # Every prefill and every decode step passes over the replica's weights once;
        # the profile's kernels were timed with theirs in cache.
        passes = math.ceil(n / batch) + (steady_steps if n > c else 0.0) + steps
        shard = generation_shard_bytes(model.num_bytes(), gen)
        reads_s = passes * cm.memory_read_s(int(shard))
    time_s = prefill_s + cold_prefill_s + steady_s + tail_s + reads_s + capture_s
    return CallCost(
        time_s=time_s,
        transient_bytes=kv_bytes,
        busy_s=time_s,
        detail={
            "prefill_s": prefill_s + cold_prefill_s,
            "decode_s": steady_s + tail_s,
            "weight_reads_s": reads_s,
            "graph_capture_s": capture_s,
            "seqs_per_replica": n,
            "kv_capacity_seqs": c,
            "waves": math.ceil(n / c),
            "last_step": steps,
            "engine": shape.engine.value,
        },
    )


@dataclass(frozen=True, kw_only=True)
class FsdpUnits:
    """What ZeRO-3 gathers on one rank, as the executor's FSDP2 runs it
    (`executor.engines.trainer`: `fully_shard` on each decoder layer and on the root):
    one all-gather per unit, a layer's weights or the root's (embedding, final norm,
    head), each over the data-parallel group."""

    layers: int  # decoder layers on the heaviest stage
    layer_bytes: float  # one layer's weights on a tensor-parallel rank
    root_bytes: float  # the weights outside the layers on a rank (its stage's share)


def fsdp_units(model: ModelSpec, lay: TrainLayout, *, value_head: bool) -> FsdpUnits:
    """`FsdpUnits` of `model` in `lay`: the root's weights split over t and, with
    pipeline stages, over p (the first stage holds the embedding, the last the head)."""
    layer = memory.gathered_layer_bytes(model, lay.t)
    per_layer = model.num_params_per_layer
    outside = model.num_params(value_head=value_head) - model.num_layers * per_layer
    return FsdpUnits(
        layers=lay.heaviest_stage_layers(model.num_layers),
        layer_bytes=layer,
        root_bytes=outside * model.dtype.num_bytes / (lay.t * lay.p),
    )


def _fsdp_host_s(cm: CostModel, units: FsdpUnits, d: int, *, backward: bool) -> float:
    """`compute.fsdp_host_s` of `units` over a group of `d`."""
    return compute.fsdp_host_s(
        cm, units.layers, units.layer_bytes, units.root_bytes, d, backward=backward
    )


def interleaves_groups(par: RoleParallelism) -> bool:
    """Whether a rank's collectives in `par`'s training-layout calls (its forwards and
    updates, not its generation) go through two groupings of the set's ranks in turn
    within each layer: ZeRO-3 gathers every layer over its data-parallel pair between
    the tensor-parallel all-reduces of the layer before and its own. Every rank then
    waits on every other in turn, which costs more where ranks share cores
    (`CostModel.coupled`). A gradient reduction after the backward, a stage's send per
    micro-batch or a forward's one control all-reduce meet the other grouping once per
    call or micro-batch, not between the layer's collectives: not counted."""
    lay = par.train
    return lay.t > 1 and par.zero == 3 and lay.num_weight_replicas > 1


@functools.cache
def zero3_tensor_bytes(model: ModelSpec, lay: TrainLayout) -> tuple[tuple[int, int], ...]:
    """(bytes, count) of the weight tensors one training rank of `lay` holds on its first
    stage, each in its tensor-parallel shard: what `TrainEngine.tp_shards` gathers over
    the data-parallel group one tensor at a time under ZeRO-3 (`DTensor.full_tensor`).
    Empty where the transfer plan cannot describe the model (replicated KV heads)."""
    try:
        shapes = TinyLlama.from_model_spec(model)
    except SpecError:
        return ()
    one = TrainLayout(p=lay.p, t=lay.t, d=1)
    sizes = Counter(
        p.numel_of(ranges) * model.dtype.num_bytes
        for p in shapes.params()
        if (ranges := train_shard(shapes, p, one, 0)) is not None
    )
    return tuple(sorted(sizes.items()))


def forward_cost(
    cm: CostModel,
    model: ModelSpec,
    par: RoleParallelism,
    num_samples: int,
    seq: int,
    *,
    value_head: bool,
    trained: bool,
    ep_scope: Scope = Scope.INTRA,
    ep_ranks_per_node: int = 1,
    dp_scope: Scope = Scope.INTRA,
    dp_ranks_per_node: int = 1,
    cp_scope: Scope = Scope.INTRA,
    cp_ranks_per_node: int = 1,
) -> CallCost:
    """One forward call of a role over `num_samples` sequences of `seq` tokens: its
    micro-batches through the pipeline's stages, ZeRO-3's gathers, the head, the stage
    sends, and (`trained`: the actor's and critic's engines, `roles._Trainable`) the
    agreement of the DP ranks on their micro-batch count (`control_syncs_s`). A frozen
    model's engine (`roles.ScoringEngine`: reference, reward, cost) runs the count its
    own shard needs and agrees on nothing."""
    lay = par.train
    split = compute.SequenceSplit.of(lay, cp_scope, cp_ranks_per_node)
    per_rank = math.ceil(num_samples / lay.d)
    mb, num_micro, peak_tokens = par.forward_micro.split(per_rank, seq)
    layers = lay.heaviest_stage_layers(model.num_layers)  # the slowest stage sets the pace
    stage = layers * compute.layer_forward_s(
        cm, model, lay.t, mb, seq, e=lay.e, ep_scope=ep_scope,
        ep_ranks_per_node=ep_ranks_per_node, split=split,
    )  # fmt: skip
    gathered = 0.0
    replicas = lay.num_weight_replicas
    if par.zero == 3 and replicas > 1:
        # ZeRO-3 / FSDP2: each unit (every layer, and the root) is all-gathered over d
        # before its forward, once per micro-batch; one gathered layer is live at a time.
        units = fsdp_units(model, lay, value_head=value_head)
        gathered = units.layer_bytes
        gather = functools.partial(
            cm.collective_s,
            CollectiveKind.ALL_GATHER,
            world_size=replicas,
            scope=dp_scope,
            ranks_per_node=dp_ranks_per_node,
        )
        stage += layers * gather(int(units.layer_bytes)) + gather(int(units.root_bytes))
        stage += _fsdp_host_s(cm, units, replicas, backward=False)
    head = compute.head_forward_s(cm, model, lay.t, split.tokens(mb * seq), value_head=value_head)
    p2p = (
        cm.collective_s(
            CollectiveKind.SEND_RECV,
            _stage_send_bytes(model, split.tokens(mb * seq), lay),
            2,
            Scope.INTRA,
            after_s=stage,  # the stage's forward, then its send (`pipeline.forward_only`)
        )
        if lay.p > 1
        else 0.0
    )
    control = (
        control_syncs_s(
            cm, lay, _DPGroups(scope=dp_scope, ranks_per_node=dp_ranks_per_node), train=False
        )
        if trained
        else 0.0
    )
    time_s = (num_micro + lay.p - 1) * (stage + p2p) + head * num_micro + control
    busy = num_micro * (stage + p2p + head / lay.p) + control
    # Activations are linear in tokens: a full micro-batch's worth (packed: its budget).
    transient = memory.forward_activation_bytes(
        model,
        lay.t,
        1,
        split.tokens(peak_tokens),
        value_head=value_head,
        sequence_parallel=lay.sequence_parallel,
    )
    transient += gathered
    return CallCost(
        time_s=time_s,
        transient_bytes=transient,
        busy_s=busy,
        detail={
            "micro_batches": num_micro,
            "micro_batch": mb,
            **({"micro_batch_tokens": peak_tokens} if par.forward_micro.tokens else {}),
            "control_sync_s": control,
        },
    )


def train_cost(
    cm: CostModel,
    model: ModelSpec,
    par: RoleParallelism,
    num_samples: int,
    seq: int,
    ppo_epochs: int,
    mini_batches: int,
    dp_scope: Scope,
    *,
    value_head: bool,
    ep_scope: Scope = Scope.INTRA,
    ep_ranks_per_node: int = 1,
    dp_ranks_per_node: int = 1,
    expert_dp_ranks_per_node: int = 1,
    lora: LoRASpec | None = None,
    cp_scope: Scope = Scope.INTRA,
    cp_ranks_per_node: int = 1,
) -> CallCost:
    """One update call: `ppo_epochs` x `mini_batches` optimizer steps of 1F1B training
    (of the adapters only, the base frozen, with `lora`: placeflow/lora.py).

    `dp_ranks_per_node` / `expert_dp_ranks_per_node`: the fewest ranks of a (expert)
    data-parallel group on one node, which prices its reduction across nodes
    (`CostModel.collective_s`); they matter only where `dp_scope` is INTER."""
    lay = par.train
    per_rank = math.ceil(num_samples / (mini_batches * lay.d))
    mb, num_micro, peak_tokens = par.train_micro.split(per_rank, seq)
    dp = _DPGroups(
        scope=dp_scope,
        ranks_per_node=dp_ranks_per_node,
        expert_ranks_per_node=expert_dp_ranks_per_node,
    )
    # The planner prices every memory saver of a layout: what they share is remembered.
    split = compute.SequenceSplit.of(lay, cp_scope, cp_ranks_per_node)
    ep = (ep_scope, ep_ranks_per_node)
    args = (model, lay, mb, seq, num_micro, peak_tokens, par.zero, dp, ep, split)
    shared = cm.remember(
        ("train_shared", *args, value_head, lora),
        lambda: _train_shared(cm, *args, value_head=value_head, lora=lora),
    )
    stage = shared.fwd * (2 if par.recompute else 1) + shared.bwd
    pipeline_s = (num_micro + lay.p - 1) * (stage + shared.p2p) + num_micro * shared.head
    opt_s = shared.opt_s
    if par.host_optimizer_step:
        opt_s = cm.remember(
            ("host_optimizer_step", model, lay, par.zero, value_head, lora),
            lambda: _host_optimizer_step_s(
                cm, model, lay, par.zero, value_head=value_head, lora=lora
            ),
        )
    steps = ppo_epochs * mini_batches
    sync_s = shared.sync_s + shared.control_s
    time_s = steps * (pipeline_s + sync_s + opt_s)
    busy = steps * (num_micro * (stage + shared.p2p + shared.head / lay.p) + sync_s + opt_s)
    transient = shared.recompute_bytes if par.recompute else shared.activation_bytes
    offload_s = 0.0
    if par.offload_optimizer and not par.host_optimizer_step:
        # Reload the Adam state before the update and write it back after; while the
        # update runs it is on the device again.
        state, offload_s = cm.remember(
            ("optimizer_offload", model, lay, par.zero, value_head, lora),
            lambda: _optimizer_offload(cm, model, lay, par.zero, value_head=value_head, lora=lora),
        )
        transient += state
        time_s += offload_s
        busy += offload_s
    return CallCost(
        time_s=time_s,
        transient_bytes=transient,
        busy_s=busy,
        detail={
            "optimizer_steps": steps,
            "micro_batches": num_micro,
            "micro_batch": mb,
            **({"micro_batch_tokens": peak_tokens} if par.train_micro.tokens else {}),
            "pipeline_s": pipeline_s,
            "dp_sync_s": shared.sync_s,
            "control_sync_s": shared.control_s,
            "optimizer_s": opt_s,
            "offload_s": offload_s,
            "optimizer_on_host": par.host_optimizer_step,
            "lora_rank": lora.rank if lora is not None else 0,
        },
    )


def _stage_send_bytes(model: ModelSpec, tokens: int, lay: TrainLayout) -> int:
    """Activations a pipeline stage sends per micro-batch: the rank's tokens × h, split
    over t with sequence parallelism (Megatron sends the sequence-parallel shard)."""
    act_bytes = tokens * model.hidden_size * model.dtype.num_bytes
    return act_bytes // lay.t if lay.sequence_parallel else act_bytes


@dataclass(frozen=True, kw_only=True)
class _TrainShared:
    """What one optimizer step of `train_cost` costs whatever the memory savers."""

    fwd: float  # a stage's layer forwards, one micro-batch
    bwd: float  # a stage's layer backwards
    head: float  # the head's forward + backward
    p2p: float  # the pipeline's send/recv per micro-batch
    sync_s: float  # gradient reduction
    control_s: float  # the engine's scalar all-reduces (`control_syncs_s`)
    opt_s: float  # the device optimizer step
    activation_bytes: float  # 1F1B peak activations without recomputation
    recompute_bytes: float  # ... with recomputation


def _train_shared(
    cm: CostModel,
    model: ModelSpec,
    lay: TrainLayout,
    mb: int,
    seq: int,
    num_micro: int,
    peak_tokens: int,
    zero: int,
    dp: _DPGroups,
    ep: tuple[Scope, int],
    split: compute.SequenceSplit,
    *,
    value_head: bool,
    lora: LoRASpec | None = None,
) -> _TrainShared:
    """`_TrainShared` of one layout; with LoRA the base GEMMs' weight gradients are
    skipped and the adapters' GEMMs added (on the rank's seq/cp tokens of a sample)."""
    layers = lay.heaviest_stage_layers(model.num_layers)  # the slowest stage sets the pace
    ep_scope, ep_ranks_per_node = ep  # (scope, fewest ranks per node) of the EP groups
    fwd = layers * compute.layer_forward_s(
        cm, model, lay.t, mb, seq, e=lay.e, ep_scope=ep_scope,
        ep_ranks_per_node=ep_ranks_per_node, split=split,
    )  # fmt: skip
    bwd = layers * compute.layer_backward_s(
        cm, model, lay.t, mb, seq, e=lay.e, ep_scope=ep_scope,
        ep_ranks_per_node=ep_ranks_per_node, split=split,
    )  # fmt: skip
    tokens = split.tokens(mb * seq)
    if lora is not None:
        seq = split.tokens(seq)
    head = compute.head_forward_s(cm, model, lay.t, tokens, value_head=value_head)
    head += compute.head_backward_s(cm, model, lay.t, tokens, value_head=value_head)
    if lora is not None:
        layer_dw, head_dw = compute.base_weight_grad_s(
            cm, model, lay.t, mb, seq, value_head=value_head
        )
        shapes = adapted_shapes(model, lora.targets)
        fwd += layers * compute.lora_layer_s(
            cm, model, lay.t, mb, seq, shapes, lora.rank, backward=False
        )
        bwd += layers * (
            compute.lora_layer_s(cm, model, lay.t, mb, seq, shapes, lora.rank, backward=True)
            - layer_dw
        )
        head -= head_dw
    # A micro-batch's two stage sends: its activations after the stage's forward, its
    # input's gradient after the backward (`pipeline.train_1f1b`).
    send = functools.partial(
        cm.collective_s,
        CollectiveKind.SEND_RECV,
        _stage_send_bytes(model, tokens, lay),
        2,
        Scope.INTRA,
    )
    p2p = send(after_s=fwd) + send(after_s=bwd) if lay.p > 1 else 0.0
    if zero == 3 and lora is None and lay.num_weight_replicas > 1:
        # FSDP2's own host work around each micro-batch's forward and backward (its
        # collectives are `_fsdp_update_s`'s).
        units = fsdp_units(model, lay, value_head=value_head)
        fwd += _fsdp_host_s(cm, units, lay.num_weight_replicas, backward=False)
        bwd += _fsdp_host_s(cm, units, lay.num_weight_replicas, backward=True)
    sync_s, opt_s = _dp_sync_and_optimizer_s(
        cm, model, lay, zero, num_micro, dp, value_head=value_head, lora=lora
    )
    activations = {
        # Linear in tokens: a full micro-batch's worth (packed: up to its token budget).
        recompute: memory.training_activation_bytes(
            model, lay, 1, peak_tokens, num_micro, recompute=recompute, value_head=value_head
        )
        for recompute in (False, True)
    }
    return _TrainShared(
        fwd=fwd,
        bwd=bwd,
        head=head,
        p2p=p2p,
        sync_s=sync_s,
        control_s=control_syncs_s(cm, lay, dp, train=True, zero=zero, ep=ep),
        opt_s=opt_s,
        activation_bytes=activations[False],
        recompute_bytes=activations[True],
    )


def _optimizer_offload(
    cm: CostModel,
    model: ModelSpec,
    lay: TrainLayout,
    zero: int,
    *,
    value_head: bool,
    lora: LoRASpec | None = None,
) -> tuple[int, float]:
    """The Adam state an offloading update reloads (bytes per GPU), and the seconds of
    reloading it before the update and writing it back after."""
    state = int(
        memory.optimizer_state_bytes_per_gpu(model, lay, zero, value_head=value_head, lora=lora)
    )
    return state, cm.copy_s("h2d", state) + cm.copy_s("d2h", state)


def _host_optimizer_step_s(
    cm: CostModel,
    model: ModelSpec,
    lay: TrainLayout,
    zero: int,
    *,
    value_head: bool,
    lora: LoRASpec | None = None,
) -> float:
    """One optimizer step on the host: the rank's gradient partition goes down, the host
    CPU runs AdamW over it (fp32 master and moments in host memory), the updated
    weights come back up in the model's dtype. The partition is the rank's ZeRO
    shard, params/(t·p·d) for zero >= 1, the whole t·p shard for zero = 0."""
    trained = model.num_params(value_head=value_head) if lora is None else lora.params(model)
    shard_params = trained // (lay.t * lay.p)
    partition = math.ceil(shard_params / lay.num_weight_replicas) if zero >= 1 else shard_params
    partition_bytes = partition * model.dtype.num_bytes
    return (
        cm.copy_s("d2h", partition_bytes)
        + cm.host_optimizer_s(partition)
        + cm.copy_s("h2d", partition_bytes)
    )


@dataclass(frozen=True, kw_only=True)
class _DPGroups:
    """Where a layout's data-parallel groups sit: the scope of the DP groups and the
    fewest ranks of a DP / expert-DP group on one node."""

    scope: Scope
    ranks_per_node: int = 1
    expert_ranks_per_node: int = 1


# The engine's bookkeeping all-reduces carry one scalar (an int64 or float64 tensor).
CONTROL_BYTES = 8


def control_syncs_s(
    cm: CostModel,
    lay: TrainLayout,
    dp: _DPGroups,
    *,
    train: bool,
    zero: int = 1,
    ep: tuple[Scope, int] = (Scope.INTRA, 1),
) -> float:
    """The engine's scalar all-reduces, latency-bound, that `_dp_sync_and_optimizer_s`
    (gradients) and the stage sends leave out: a trained role's forward call's agreement
    on its micro-batch count over the data-parallel group (`roles._micro_count`; a
    frozen model's `ScoringEngine` makes none, `forward_cost`), or one
    optimizer step's (`train`): the mini-batch's token count and micro-batch count over
    that group (`roles._global_tokens`, `_micro_count`) and the gradient norm's partial
    sums over TP, over the experts' group, over PP, and over the DP group under FSDP
    (`trainer.grad_norm`). TP and PP groups are priced within a node, as the stage sends
    are. Each also holds its ranks together: the profile's entry was timed with the
    ranks arriving about together, so what they drift apart between two of them (the
    first to arrive waits for the last) is not in it."""

    def over(world: int, scope: Scope, ranks_per_node: int = 1) -> float:
        if world <= 1:
            return 0.0
        return cm.collective_s(
            CollectiveKind.ALL_REDUCE, CONTROL_BYTES, world, scope, ranks_per_node=ranks_per_node
        )

    dp_one = over(lay.num_weight_replicas, dp.scope, dp.ranks_per_node)
    if not train:
        return dp_one
    norm = over(lay.t, Scope.INTRA) + over(lay.p, Scope.INTRA)
    norm += over(lay.e, *ep)
    if zero == 3:
        norm += dp_one
    return 2 * dp_one + norm


def _dp_sync_and_optimizer_s(
    cm: CostModel,
    model: ModelSpec,
    lay: TrainLayout,
    zero: int,
    num_micro: int,
    dp: _DPGroups,
    *,
    value_head: bool,
    lora: LoRASpec | None = None,
) -> tuple[float, float]:
    """Gradient reduction and optimizer step of one rank; a mixture of experts reduces
    its dense gradients over d and its experts' over the expert-DP group d/e (whose
    ranks are a strided subset of a DP group: the DP groups' scope is taken for both,
    each with its own ranks per node)."""
    sync = 0.0
    opt_params = 0
    if lora is not None and zero == 3:
        # The frozen base is sharded over d too: gathered before every micro-batch's
        # forward and backward, as a full model's weights are below.
        for params, d in memory.shard_params(model, lay, value_head=value_head):
            sync += (
                2
                * num_micro
                * cm.collective_s(
                    CollectiveKind.ALL_GATHER,
                    int(params) * model.dtype.num_bytes,
                    d,
                    dp.scope,
                    ranks_per_node=dp.ranks_per_node,
                )
            )
    for params, d in memory.trained_shard_params(model, lay, lora, value_head=value_head):
        shard = int(params)
        # The dense part is reduced over the DP groups (size d), the experts over the
        # expert-DP groups (d / e), each with its own ranks per node.
        rpn = dp.ranks_per_node if d == lay.num_weight_replicas else dp.expert_ranks_per_node
        reduce = functools.partial(
            cm.collective_s,
            num_bytes=shard * model.dtype.num_bytes,
            world_size=d,
            scope=dp.scope,
            ranks_per_node=rpn,
        )
        if zero == 0:
            sync += reduce(CollectiveKind.ALL_REDUCE)
            opt_params += shard
            continue
        opt_params += math.ceil(shard / d)
        if zero == 3 and lora is None and d == lay.num_weight_replicas:
            sync += _fsdp_update_s(cm, model, lay, num_micro, dp, value_head=value_head)
            continue
        # ZeRO-1/2 as the engine runs them (`trainer.TrainEngine.step`): the gradients
        # all-reduced once as one flat buffer (every rank keeps them whole for the norm
        # and clipping), then each rank broadcasts its stepped partition
        # (ZeroRedundancyOptimizer's bucket views: d broadcasts of 1/d, priced as one
        # all-gather). ZeRO-3 without FSDP's units (LoRA, experts) reduce-scatters.
        sync += reduce(
            CollectiveKind.ALL_REDUCE if zero in (1, 2) else CollectiveKind.REDUCE_SCATTER
        )
        gather = reduce(CollectiveKind.ALL_GATHER)
        sync += gather
        if zero == 3:
            sync += 2 * num_micro * gather
    # Kernel time of AdamW over the rank's partition, plus the engine's host time of
    # its per-tensor loop over the heaviest stage's layers (0 without framework entries).
    layers = lay.heaviest_stage_layers(model.num_layers)
    # ZeRO-1/2 (`ZeroRedundancyOptimizer`): each DP rank's AdamW loops over its partition.
    partitions = lay.num_weight_replicas if zero in (1, 2) else 1
    host_s = compute.optimizer_host_s(cm, model, layers, partitions)
    return sync, cm.optimizer_s(opt_params) + host_s


def _fsdp_update_s(
    cm: CostModel,
    model: ModelSpec,
    lay: TrainLayout,
    num_micro: int,
    dp: _DPGroups,
    *,
    value_head: bool,
) -> float:
    """ZeRO-3's collectives in one optimizer step of dense weights, as FSDP2 runs them
    (`fsdp_units`): every micro-batch gathers each layer and the root before its forward
    and each layer again before its backward (the root stays gathered between them,
    FSDP2's `reshard_after_forward` heuristic for the root); the gradients are
    reduce-scattered per unit once, on the last micro-batch (`set_requires_gradient_sync`);
    the optimizer steps on the shards, so nothing is gathered after it."""
    units = fsdp_units(model, lay, value_head=value_head)

    def over_dp(kind: CollectiveKind, num_bytes: float) -> float:
        return cm.collective_s(
            kind,
            int(num_bytes),
            lay.num_weight_replicas,
            dp.scope,
            ranks_per_node=dp.ranks_per_node,
        )

    layer_ag = over_dp(CollectiveKind.ALL_GATHER, units.layer_bytes)
    root_ag = over_dp(CollectiveKind.ALL_GATHER, units.root_bytes)
    layer_rs = over_dp(CollectiveKind.REDUCE_SCATTER, units.layer_bytes)
    root_rs = over_dp(CollectiveKind.REDUCE_SCATTER, units.root_bytes)
    gathers = num_micro * (2 * units.layers * layer_ag + root_ag)
    return gathers + units.layers * layer_rs + root_rs


@dataclass(frozen=True, kw_only=True)
class ColocatedTransfer:
    """What the simulator needs of a colocated reshard plan (per rank, slowest group).

    `slots` counts each distinct slot size: gather output bytes (padded piece
    times group size) -> how many slots of that size the slowest group runs.
    """

    bytes_received_per_gpu: int  # sharded + replicated payload, largest over ranks
    group_size: int
    slots: tuple[tuple[int, int], ...]
    peak_extra_bytes: int  # generation shard + largest slot buffer, largest over ranks


@functools.cache
def colocated_transfer(
    model: ModelSpec, p: int, t: int, tg: int, pg: int
) -> ColocatedTransfer | None:
    """The plan's summary for one training replica; None if the plan cannot shard `model`.

    Data-parallel replicas repeat the same groups, so the plan is built for
    d = 1 and cached on (model, p, t, tg, pg). None when TP exceeds the KV heads
    (Megatron then replicates KV heads, which the plan does not describe).
    """
    gen = GenLayout(train=TrainLayout(p=p, t=t, d=1), tg=tg, pg=pg)
    try:
        plan = plan_reshard(TinyLlama.from_model_spec(model), gen)
    except SpecError:
        return None
    b = model.dtype.num_bytes
    per_group = []
    for group in plan.groups:
        size = len(group.ranks)
        sizes = Counter(slot.padded_numel * size * b for slot in group.slots)
        per_group.append((sum(k * n for k, n in sizes.items()), tuple(sorted(sizes.items()))))
    _, slots = max(per_group)
    return ColocatedTransfer(
        bytes_received_per_gpu=max(
            r.received_sharded_bytes + r.received_replicated_bytes for r in plan.ranks
        ),
        group_size=gen.dg,
        slots=slots,
        peak_extra_bytes=max(r.peak_extra_bytes for r in plan.ranks),
    )


@functools.cache
def colocated_work(model: ModelSpec, p: int, t: int, tg: int, pg: int) -> tuple[RankWork, ...]:
    """Each distinct rank's host work beside the gathers in the colocated plan of one
    training replica (`reshard_plan.rank_work`: pieces copied in, slots, the bytes those
    copies move), for `reshard_host_s`; counted only where a profile prices it (a
    70B plan's 64 ranks take 0.16 s). The plan must be one `colocated_transfer` can
    build."""
    gen = GenLayout(train=TrainLayout(p=p, t=t, d=1), tg=tg, pg=pg)
    plan = plan_reshard(TinyLlama.from_model_spec(model), gen)
    return tuple(sorted({rank_work(plan, r) for r in range(gen.train.world_size)}, key=str))


def reshard_host_s(cm: CostModel, work: RankWork) -> float:
    """One rank's host work in a gathering reshard beyond its all-gathers, as
    `executor.reshard.reshard_colocated` runs it: the profile's `reshard_piece` per piece
    copied into the generation tensors and `reshard_slot` per slot (its send and receive
    buffers), measured on a model whose copies are negligible
    (`placeflow.profiles.reshard_host`), plus the copies' own bytes read and written
    (`device_copy_s`: weights a phase cold). 0 where the profile has no such entries (GPU
    profiles, CPU profiles made before them): the host work is then left out, as it was
    before they were measured."""
    piece = cm.framework_s(FrameworkKind.RESHARD_PIECE)
    slot = cm.framework_s(FrameworkKind.RESHARD_SLOT)
    if piece is None or slot is None:
        return 0.0
    return work.pieces * piece + work.slots * slot + device_copy_s(cm, work.placed_bytes)


def zero3_gather_s(cm: CostModel, model: ModelSpec, lay: TrainLayout, scope: Scope) -> float:
    """A ZeRO-3 training rank's gather of its weights over its data-parallel group before
    a reshard or a weight sync, as `TrainEngine.tp_shards` runs it: one all-gather over
    the d replicas per tensor of its tensor-parallel shard (`zero3_tensor_bytes`), each
    with the profile's `zero3_gather` host work beyond the all-gather (FSDP2's
    `DTensor.full_tensor`, measured by `placeflow.profiles.reshard_host`; 0 where the
    profile has no such entry). One tensor of the whole shard where the transfer plan
    cannot describe the model. 0 with one replica (nothing to gather)."""
    replicas = lay.num_weight_replicas
    if replicas <= 1:
        return 0.0
    train_bytes = memory.weight_bytes_per_gpu(model, lay.t, lay.p, value_head=False, e=lay.e)
    tensors = zero3_tensor_bytes(model, lay) or ((int(train_bytes), 1),)
    host_s = cm.framework_s(FrameworkKind.ZERO3_GATHER) or 0.0
    return sum(
        n * (cm.collective_s(CollectiveKind.ALL_GATHER, size, replicas, scope) + host_s)
        for size, n in tensors
    )


def device_copy_s(cm: CostModel, num_bytes: float) -> float:
    """A copy of `num_bytes` in the device's memory whose buffers were last touched a
    phase ago (weights): the bytes read and written once.

    On a CPU device that is a host-to-host copy streamed from memory
    (`CostModel.stream_copy_s`: the weights are not in a cache after the phase before).
    On a GPU it is a pass over device memory, priced as the elementwise add that moves
    the same bytes: an add of B input bytes reads 2B and writes B, a copy of C bytes
    reads C and writes C, so C = 2B/3 of add input.
    """
    if num_bytes <= 0:
        return 0.0
    if cm.device_kind == "cpu":
        return cm.stream_copy_s("h2d", int(num_bytes))
    return cm.elementwise_s(ElementwiseKind.ADD, math.ceil(2 * num_bytes / 3))


def sync_host_s(cm: CostModel, model: ModelSpec, pg: int, slices_ratio: float = 1.0) -> float:
    """The weight sync's host work per tensor beyond its copies, as the profile measured
    it through `sync_disjoint` (`FrameworkKind.SYNC_LAYER` for each layer of the
    generator rank's stage, `SYNC_CALL` for the tensors outside the layers and the
    call's own; the reference model's copies taken off by `compute.framework_host_s`):
    the trainer's packing of the slices and the generator's allocation of its shard and
    copy of each slice in, one after the other. The entries were timed with one trainer
    rank sending; where several send a generator rank its tensors, in `slices_ratio`
    times as many slices, the work grows with them.
    With TP a layer's tensors are as many, each smaller: the host work per tensor does
    not shrink with tg. 0 where the profile has no such entries (the GPU profiles)."""
    layers = max(generator_stage_layers(model.num_layers, pg))
    per_layer = compute.framework_host_s(cm, FrameworkKind.SYNC_LAYER) or 0.0
    per_call = compute.framework_host_s(cm, FrameworkKind.SYNC_CALL) or 0.0
    return (layers * per_layer + per_call) * slices_ratio


def rollout_load_s(cm: CostModel, model: ModelSpec, tg: int, pg: int) -> float:
    """A generation rank's load of its shard (tg, pg) of `model` into its rollout engine,
    which keeps weights of its own (placeflow's engine copies them in with
    `load_shards`, vLLM with `load_weights`): the shard's bytes copied once
    (`device_copy_s`), and the engine's host work per tensor where the profile measured
    it (`FrameworkKind.LOAD_LAYER` for each layer of the rank's stage, `LOAD_CALL` for
    the tensors outside the layers and the call's own; the reference model's copies,
    timed inside those entries, taken off by `compute.framework_host_s`). The stage
    with the most layers sets the time."""
    shard = gen_shard_bytes(model.num_bytes(), tg, pg)
    layers = max(generator_stage_layers(model.num_layers, pg))
    per_layer = compute.framework_host_s(cm, FrameworkKind.LOAD_LAYER) or 0.0
    per_call = compute.framework_host_s(cm, FrameworkKind.LOAD_CALL) or 0.0
    return device_copy_s(cm, shard) + layers * per_layer + per_call


def reshard_cost(
    cm: CostModel,
    model: ModelSpec,
    gen: GenLayout,
    scope: Scope,
    *,
    train_zero: int = 1,
    ranks_per_node: int = 1,
) -> CallCost:
    """Colocated actor: all-gather inside each micro-DP group (HybridFlow), slot by slot.

    Each slot (bucket) of the plan is one all-gather, so its latency is paid per
    bucket; the slowest group sets the time (groups run in parallel). Where the
    transfer plan cannot describe the model (replicated KV heads; a mixture of
    experts, whose training shard holds 1/e of the experts and whose generation
    shard gathers them from the expert-parallel peers too) the transition is
    priced as dense weights are: one all-gather of the generation shard
    M/(tg·pg) over the ranks whose training shards make it up. Under ZeRO-3
    (`train_zero` = 3, d > 1) each rank first all-gathers its training shard over
    d, priced in the same scope (an approximation: DP groups are not micro-DP groups).
    Across nodes each all-gather is priced with the groups' `ranks_per_node` (their
    fewest ranks on one node: NICs used in parallel, network steps of that many nodes;
    `CostModel.collective_s`).
    """
    model_bytes = model.num_bytes()
    lay = gen.train
    g = ranks_per_node
    gen_shard = generation_shard_bytes(model_bytes, gen)
    train_bytes = memory.weight_bytes_per_gpu(model, lay.t, lay.p, value_head=False, e=lay.e)
    transfer = colocated_transfer(model, lay.p, lay.t, gen.tg, gen.pg) if lay.e == 1 else None
    if transfer is None:
        group = max(2, round(gen_shard / train_bytes))
        time_s = cm.collective_s(
            CollectiveKind.ALL_GATHER, int(gen_shard), group, scope, ranks_per_node=g
        )
        detail: dict[str, Any] = {
            "bytes_received_per_gpu": gen_shard - train_bytes,
            "buckets": 1,
            "gather_group": group,
        }
    else:
        time_s = sum(
            n
            * cm.collective_s(
                CollectiveKind.ALL_GATHER, size, transfer.group_size, scope, ranks_per_node=g
            )
            for size, n in transfer.slots
        )
        # The slowest rank's host work beside its gathers (every rank gathers every slot
        # of its group, so the gathers end together and the host work adds to them).
        host_s = 0.0
        if cm.framework_s(FrameworkKind.RESHARD_PIECE) is not None:
            work = colocated_work(model, lay.p, lay.t, gen.tg, gen.pg)
            host_s = max(reshard_host_s(cm, w) for w in work)
        time_s += host_s
        detail = {
            "bytes_received_per_gpu": transfer.bytes_received_per_gpu,
            "buckets": sum(n for _, n in transfer.slots),
            "peak_extra_bytes_per_gpu": transfer.peak_extra_bytes,
            "host_s": host_s,
        }
    gather_s = zero3_gather_s(cm, model, lay, scope) if train_zero == 3 else 0.0
    time_s += gather_s
    detail["zero3_gather_s"] = gather_s
    # The rank's own training weights become part of its generation shard.
    extra = memory.colocated_gen_extra_bytes(model, gen, train_zero)
    return CallCost(time_s=time_s, transient_bytes=extra, busy_s=time_s, detail=detail)


@functools.cache
def disjoint_buckets(
    model: ModelSpec, tg: int, pg: int, train: TrainLayout, bucket_bytes: int
) -> tuple[tuple[int, ...], int] | None:
    """Bucket sizes (bytes) of the generator rank receiving the most, and the slices it
    receives them in (a tensor's rows from each trainer rank holding part of them, a
    fused tensor's parts apart); None if unplannable.

    One generator replica suffices: every replica receives the same shards.
    None when TP exceeds the KV heads (replicated KV heads, not in the plan).
    """
    try:
        plan = plan_disjoint(
            TinyLlama.from_model_spec(model), train, GeneratorLayout(tg=tg, pg=pg), bucket_bytes
        )
    except SpecError:
        return None
    top = max(plan.ranks, key=lambda t: sum(b.num_bytes for b in t.buckets))
    return tuple(b.num_bytes for b in top.buckets), sum(len(b.sends) for b in top.buckets)


def weight_sync_cost(
    cm: CostModel,
    model: ModelSpec,
    tg: int,
    pg: int,
    scope: Scope,
    *,
    train: TrainLayout | None = None,
    lora: LoRASpec | None = None,
    train_zero: int = 1,
    gather_scope: Scope = Scope.INTRA,
) -> CallCost:
    """Trainer -> generator on other devices: each generator rank receives its shard in buckets.

    Bytes and buckets come from the disjoint plan (`train` defaults to one
    trainer rank: which rank sends does not change what a generator receives, only
    in how many slices, which the host work counts).
    With LoRA the generator keeps the frozen base and receives the adapters only,
    their 1/(tg·pg) share, in buckets (placeflow/lora.py).

    Beyond the messages, as `executor.weight_sync.sync_disjoint` runs it: the sender
    packs each bucket's slices into one message and the receiver copies the message's
    rows into its shard (each a `device_copy_s` of the bytes), both with the host work
    per slice the profile measured (`sync_host_s`), and the generator then loads the
    full shard into its rollout engine (`rollout_load_s`; adapters are not loaded that
    way). A ZeRO-3 trainer (`train_zero` 3) first gathers its shard over its replicas
    (`zero3_gather_s` in `gather_scope`, its replicas' scope), before any message leaves.
    """
    buckets: tuple[int, ...] | None = None
    slices_ratio = 1.0
    if lora is None:
        planned = disjoint_buckets(model, tg, pg, train or TrainLayout(), WEIGHT_SYNC_BUCKET_BYTES)
        # The host entries were timed from one trainer rank: its slices are the unit
        # (the same cached plan where `train` is that rank).
        one_rank = disjoint_buckets(model, tg, pg, TrainLayout(), WEIGHT_SYNC_BUCKET_BYTES)
        if planned is not None:
            buckets = planned[0]
            slices_ratio = planned[1] / one_rank[1] if one_rank is not None else 1.0
    if buckets is None:
        # Adapters, or replicated KV heads (no disjoint plan): bytes/(tg·pg) in full
        # buckets plus the rest.
        total = model.num_bytes() if lora is None else lora.params(model) * model.dtype.num_bytes
        per_rank = disjoint_transfer_bytes_per_gen_rank(total, tg, pg)
        full, rest = divmod(int(per_rank), WEIGHT_SYNC_BUCKET_BYTES)
        buckets = (WEIGHT_SYNC_BUCKET_BYTES,) * full + ((rest,) if rest else ())
    sizes = Counter(buckets)
    # Each bucket is one message, so its latency is paid once per bucket.
    messages_s = sum(
        n * cm.collective_s(CollectiveKind.BROADCAST, size, 2, scope) for size, n in sizes.items()
    )
    copies_s = 2 * device_copy_s(cm, sum(buckets))
    # (adapters: their own few tensors a layer, host work not measured for them)
    host_s = sync_host_s(cm, model, pg, slices_ratio) if lora is None else 0.0
    load_s = rollout_load_s(cm, model, tg, pg) if lora is None else 0.0
    gather_s = (
        zero3_gather_s(cm, model, train, gather_scope)
        if train is not None and train_zero == 3 and lora is None
        else 0.0
    )
    time_s = gather_s + messages_s + copies_s + host_s + load_s
    return CallCost(
        time_s=time_s,
        transient_bytes=0.0,
        busy_s=time_s,
        detail={
            "bytes_per_gen_rank": sum(buckets),
            "buckets": len(buckets),
            "messages_s": messages_s,
            "copies_s": copies_s,
            "host_s": host_s,
            "load_s": load_s,
            "zero3_gather_s": gather_s,
        },
    )
