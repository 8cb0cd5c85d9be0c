"""The calls of one role on one device set, costed: shared by the simulator and the planner.

`role_call_costs` answers "what do this role's calls cost with this
parallelism on these devices" without a whole Plan, so that the planner's
cost table and the simulator's full step use the same phase model.
`call_cost` prices one of the calls; `call_key` and `resident_key` name the
fields of the parallelism a call's cost and the resident bytes read, so that
the planner, which asks for thousands of parallelisms, prices each key once.

Every call is also a controller -> worker Ray call whose round trip carries
the rank's shard of the batch there and its result back (`call_payload`);
the profile's `dispatch` entry prices it (`CostModel.dispatch_s`), paid once
per call before the device work. The driver makes the ranks' calls one after
another, though, and takes their results one after another: a call to R ranks
also costs it R − 1 launches before the last rank starts and R − 1 gets after
the first result (`call_driver_work`, the profile's `ray_launch` and `ray_get`
entries), which the simulator schedules on the controller, where they queue
behind each other and share the driver's host cores with its workers.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache

from placeflow.dataflow import CallKind, ModelCall, dataflow_calls
from placeflow.fields import SEQUENCE, call_inputs, call_outputs
from placeflow.layout import GenLayout, TrainLayout
from placeflow.models import ModelSpec
from placeflow.phases import Phase
from placeflow.plan import RoleParallelism
from placeflow.profiles.costmodel import CostModel, piecewise, sliced, woken
from placeflow.profiles.schema import DispatchKind, FrameworkKind, Scope
from placeflow.simulator import callcosts, memory
from placeflow.simulator.lengths import LengthModel
from placeflow.workload import Algorithm, BatchSpec, LoRASpec, Precision, Role, Workload


def span_scope(first_device: int, gpus_per_node: int, groups: Iterable[list[int]]) -> Scope:
    """INTER if any group's devices (rank i on device first_device + i) span nodes."""
    for ranks in groups:
        if len({(first_device + r) // gpus_per_node for r in ranks}) > 1:
            return Scope.INTER
    return Scope.INTRA


def fewest_ranks_per_node(
    first_device: int, gpus_per_node: int, groups: Iterable[list[int]]
) -> int:
    """The fewest ranks of one group on one node (rank i on device first_device + i):
    how many NICs a ring over the group can use in parallel where it crosses nodes
    (`CostModel.collective_s`'s `ranks_per_node`)."""
    fewest = None
    for ranks in groups:
        on_node = Counter((first_device + r) // gpus_per_node for r in ranks)
        least = min(on_node.values())
        fewest = least if fewest is None else min(fewest, least)
    return fewest or 1


def most_ranks_per_node(first_device: int, gpus_per_node: int, ranks: int) -> int:
    """The most of `ranks` ranks (rank i on device first_device + i) on one node."""
    return max(Counter((first_device + r) // gpus_per_node for r in range(ranks)).values())


@cache
def dp_ranks_per_node(first_device: int, gpus_per_node: int, layout: TrainLayout) -> int:
    """`fewest_ranks_per_node` of the data-parallel groups (gradient reduction, ZeRO)."""
    return fewest_ranks_per_node(first_device, gpus_per_node, layout.dp_groups())


@cache
def expert_dp_ranks_per_node(first_device: int, gpus_per_node: int, layout: TrainLayout) -> int:
    """`fewest_ranks_per_node` of the expert data-parallel groups (expert gradients)."""
    return fewest_ranks_per_node(first_device, gpus_per_node, layout.expert_dp_groups())


@cache
def dp_scope(first_device: int, gpus_per_node: int, layout: TrainLayout) -> Scope:
    """Scope of the data-parallel groups of `layout` on a set starting at `first_device`."""
    return span_scope(first_device, gpus_per_node, layout.dp_groups())


@cache
def ep_scope(first_device: int, gpus_per_node: int, layout: TrainLayout) -> Scope:
    """Scope of the expert-parallel groups of `layout` (the MoE all-to-alls)."""
    return span_scope(first_device, gpus_per_node, layout.ep_groups())


@cache
def cp_placement(first_device: int, gpus_per_node: int, layout: TrainLayout) -> tuple[Scope, int]:
    """(scope, fewest ranks per node) of the context-parallel groups: where the ring
    sends or Ulysses all-to-alls of `forward_cost` / `train_cost` run."""
    groups = layout.cp_groups()
    return (
        span_scope(first_device, gpus_per_node, groups),
        fewest_ranks_per_node(first_device, gpus_per_node, groups),
    )


@cache
def reshard_placement(first_device: int, gpus_per_node: int, gen: GenLayout) -> tuple[Scope, int]:
    """(scope, fewest ranks per node) of a colocated reshard's all-gathers: its micro-DP
    groups, and with expert parallelism also the expert-parallel groups the experts are
    gathered from (`CostModel.collective_s`'s `ranks_per_node` where they cross nodes)."""
    groups = gen.micro_dp_groups()
    if gen.train.e > 1:
        groups = groups + gen.train.ep_groups()
    return (
        span_scope(first_device, gpus_per_node, groups),
        fewest_ranks_per_node(first_device, gpus_per_node, groups),
    )


def train_seq_len(workload: Workload) -> int:
    """Tokens per sample in forward and training calls: prompt plus mean response."""
    return _train_seq_len(workload.batch)


@cache
def _train_seq_len(batch: BatchSpec) -> int:
    return batch.prompt_len + max(1, round(LengthModel.of(batch).mean))


@cache
def train_scopes(
    first_device: int, gpus_per_node: int, layout: TrainLayout
) -> tuple[Scope, Scope, int, int, int]:
    """(dp_scope, ep_scope, dp_ranks_per_node, expert_dp_ranks_per_node,
    ep_ranks_per_node) of `layout` on a set starting at `first_device`: what a forward or
    update call's collectives read, looked up once per call (the planner prices
    thousands)."""
    return (
        dp_scope(first_device, gpus_per_node, layout),
        ep_scope(first_device, gpus_per_node, layout),
        dp_ranks_per_node(first_device, gpus_per_node, layout),
        expert_dp_ranks_per_node(first_device, gpus_per_node, layout),
        fewest_ranks_per_node(first_device, gpus_per_node, layout.ep_groups()),
    )


def kv_bytes_per_seq(workload: Workload, gen: GenLayout) -> float:
    """KV cache reserved per sequence per GPU (prompt plus maximum response)."""
    actor = workload.models[Role.ACTOR]
    batch = workload.batch
    return (batch.prompt_len + batch.response_len) * memory.kv_bytes_per_token_per_gpu(
        actor, gen.tg, gen.pg, workload.kv_cache_dtype
    )


def rollout_sync_cost(
    cm: CostModel,
    model: ModelSpec,
    gen: GenLayout,
    scope: Scope,
    *,
    train_zero: int = 1,
    ranks_per_node: int = 1,
) -> callcosts.CallCost:
    """A colocated actor's sync of its rollout engine before it generates: the reshard
    where the layouts call for one (`callcosts.reshard_cost`), then each rank's load of
    its generation shard into the engine (`callcosts.rollout_load_s`). Where no reshard
    is needed the load is all there is, but it is still a call to every rank and a copy
    of the weights, as the executor's `sync_rollout` makes it. `scope` and
    `ranks_per_node` are the reshard groups' (`reshard_placement`)."""
    load_s = callcosts.rollout_load_s(cm, model, gen.tg, gen.pg)
    if needs_reshard(gen, train_zero):
        base = callcosts.reshard_cost(
            cm, model, gen, scope, train_zero=train_zero, ranks_per_node=ranks_per_node
        )
    else:
        base = callcosts.CallCost(
            time_s=0.0, transient_bytes=0.0, busy_s=0.0, detail={"buckets": 0}
        )
    return callcosts.CallCost(
        time_s=base.time_s + load_s,
        transient_bytes=base.transient_bytes,
        busy_s=base.busy_s + load_s,
        detail={**base.detail, "load_s": load_s},
    )


def needs_reshard(gen: GenLayout, zero: int) -> bool:
    """A colocated actor reshards when generation groups span training ranks (dg > 1),
    when its training ranks hold only 1/e of the experts, or when ZeRO-3 left each rank
    1/d of its shard (FSDP gathers it before generating)."""
    return gen.dg > 1 or gen.train.e > 1 or (zero == 3 and gen.train.d > 1)


# Bytes per token a call's Batch carries: an int64 token id and a bool mask, plus one
# float32 per-token tensor per other field (`placeflow.fields.call_inputs`: old and
# reference logprobs, advantages, values and returns into an update; logprobs or values
# back from a scoring call, the rollout's logprobs back from a generation).
TOKEN_BYTES = 8 + 1
FLOAT_BYTES = 4


@dataclass(frozen=True, kw_only=True)
class Payload:
    """What one rank's call carries there (its arguments) and back (its result): bytes
    and tensors, each tensor pickled and moved on its own (`CostModel.dispatch_s`)."""

    in_bytes: int
    out_bytes: int
    in_tensors: int
    out_tensors: int

    @property
    def num_bytes(self) -> int:
        return self.in_bytes + self.out_bytes

    @property
    def num_tensors(self) -> int:
        return self.in_tensors + self.out_tensors


# A transition's call (reshard, weight sync): no tensors either way, its bytes go over
# the collectives.
NO_PAYLOAD = Payload(in_bytes=0, out_bytes=0, in_tensors=0, out_tensors=0)


def call_payload(workload: Workload, call: ModelCall, samples_per_rank: int) -> Payload:
    """The payload of one rank's `call` on `samples_per_rank` samples, from the fields the
    controller sends it (`call_inputs`) and those it answers with (`call_outputs`).

    A generation takes its prompts as token lists (no tensors) and answers with the
    rollout's batch; another call takes the sequence and its float fields, each
    priced at one float per token of the sample (prompt + mean response). The actor's
    update reads one behaviour-policy field whichever it is, so the count does not
    depend on asynchrony."""
    n, seq = samples_per_rank, train_seq_len(workload)
    outputs = call_outputs(call.kind)
    if call.kind == CallKind.GENERATE:
        return Payload(
            in_bytes=n * workload.batch.prompt_len * TOKEN_BYTES,
            out_bytes=n * seq * (TOKEN_BYTES + FLOAT_BYTES),
            in_tensors=0,
            out_tensors=outputs,
        )
    inputs = call_inputs(workload, call.phase, off_policy=False)
    floats = len(inputs) - len(SEQUENCE)
    return Payload(
        in_bytes=n * seq * (TOKEN_BYTES + floats * FLOAT_BYTES),
        out_bytes=n * seq * FLOAT_BYTES * outputs,
        in_tensors=len(inputs),
        out_tensors=outputs,
    )


@dataclass(frozen=True, kw_only=True)
class DriverWork:
    """The controller's own serial work for one call to `ranks` ranks, beyond what the
    call's cost holds (`with_dispatch`: its round trip less one launch): the driver
    pickles and submits every rank's arguments before the call's clock starts
    (`launch_s`; the executor stamps a call's start once its `.remote()` calls have
    returned, `executor.timeline.StepClock.launch`), and unpickles the other ranks'
    results before it has the call's output (`collect_s`). `get_s` is one rank's
    result unpickled: the first rank's is in the call's round trip, where the driver
    takes it as the call ends; a one-step-off rollout's are taken later
    (`simulate._tasks`)."""

    launch_s: float
    collect_s: float
    get_s: float = 0.0


def driver_work(cm: CostModel, ranks: int, payload: Payload) -> DriverWork | None:
    """`DriverWork` of a call sent to `ranks` ranks, each with `payload`; None where the
    profile has no `ray_launch` and `ray_get` entries (its driver host was not measured)."""
    launch = cm.driver_s(DispatchKind.RAY_LAUNCH, payload.in_bytes, payload.in_tensors)
    get = cm.driver_s(DispatchKind.RAY_GET, payload.out_bytes, payload.out_tensors)
    if launch is None or get is None:
        return None
    return DriverWork(launch_s=ranks * launch, collect_s=(ranks - 1) * get, get_s=get)


def call_driver_work(
    workload: Workload,
    call: ModelCall,
    par: RoleParallelism,
    cm: CostModel,
    *,
    ranks: int,
    gen: GenLayout | None = None,
) -> DriverWork | None:
    """`driver_work` of one model call of `call.role` sent to the `ranks` workers of its
    set, with the payloads `call_cost`'s round trip carries (a generation needs `gen`)."""
    return driver_work(cm, ranks, call_payload(workload, call, rank_samples(call, par, gen)))


def controller_work_s(workload: Workload, phase: Phase, cm: CostModel) -> float | None:
    """The driver's own seconds of a step's controller work `phase`, as the executor does
    it between the calls (`profiles.controller_work`): `reward`, the rule-based reward's
    decode and scoring of every response (and of ReMax's greedy baselines, a second
    batch of one per prompt); `advantage`, the algorithm's advantages over responses of
    the batch's longest length (its padded width). None where the profile has no such
    entries (GPU profiles: the driver's host was not measured) or the step has no such
    work (a reward model scores instead of a function, or Ray tasks do)."""
    from placeflow.profiles.controller_work import ADVANTAGE_KIND

    batch = workload.batch
    if phase is Phase.ADVANTAGE:
        return cm.framework_s(ADVANTAGE_KIND[workload.algorithm], batch.response_len)
    if phase is not Phase.REWARD or not rule_reward_on_driver(workload):
        return None
    scored = [batch.num_samples]
    if workload.algorithm is Algorithm.REMAX:
        scored.append(batch.prompts_per_step)
    times = [cm.framework_s(FrameworkKind.RULE_REWARD, n) for n in scored]
    return None if None in times else sum(t for t in times if t is not None)


def rule_reward_on_driver(workload: Workload) -> bool:
    """Whether the driver scores the responses with a reward function itself (the
    executor's `RLLoop._forwards`: no reward model, no `reward_workers` tasks)."""
    return (
        workload.reward_function is not None
        and Role.REWARD not in workload.models
        and not workload.reward_workers
    )


def rank_samples(call: ModelCall, par: RoleParallelism, gen: GenLayout | None) -> int:
    """Samples one rank of `call` works on: a generation replica's share (a generation
    needs `gen`), else a DP rank's."""
    if call.kind == CallKind.GENERATE:
        assert gen is not None, "a generation call is sent to its generation replicas"
        return math.ceil(call.num_samples / gen.num_replicas)
    return math.ceil(call.num_samples / par.train.d)


def with_dispatch(cm: CostModel, cost: callcosts.CallCost, payload: Payload) -> callcosts.CallCost:
    """`cost` plus the Ray round trip of a call carrying `payload` there and back, less
    the driver's launch of it where the profile measured one: that comes before the
    call's clock starts, on the controller (`driver_work`)."""
    dispatch_s = cm.dispatch_s(DispatchKind.RAY_CALL, payload.num_bytes, payload.num_tensors)
    launch = cm.driver_s(DispatchKind.RAY_LAUNCH, payload.in_bytes, payload.in_tensors)
    if launch is not None:
        # Never below a tenth of the round trip: the call still goes there and back.
        dispatch_s = max(dispatch_s / 10, dispatch_s - launch)
    return callcosts.CallCost(
        time_s=cost.time_s + dispatch_s,
        transient_bytes=cost.transient_bytes,
        busy_s=cost.busy_s + dispatch_s,
        detail={
            **cost.detail,
            "dispatch_s": dispatch_s,
            "payload_bytes": payload.num_bytes,
            "payload_tensors": payload.num_tensors,
        },
    )


def role_calls(workload: Workload, role: Role) -> tuple[ModelCall, ...]:
    """The calls `role` makes in one step, in the dataflow's order."""
    return tuple(call for call, _ in dataflow_calls(workload) if call.role is role)


def call_key(call: ModelCall, par: RoleParallelism) -> tuple[object, ...]:
    """The fields of `par` that `call_cost` reads for `call` (besides the device set, the
    generation KV budget and the workload): two parallelisms with the same key give the
    call the same cost, so that a caller pricing many may price each key once.

    A generation call reads only its generation layout's tg, pg and number of
    replicas (`GenLayout.num_replicas`, d·t·p/(tg·pg)): the training layout's
    split of the devices does not matter to it (the reshard before it does)."""
    if call.kind == CallKind.GENERATE:
        lay = par.train
        key = (par.tg, par.pg, lay.d * (lay.t * lay.p) // (par.tg * par.pg))
        # an offloaded actor reloads its training shard first: its layout matters then
        return (*key, par.train, par.zero) if par.offload_params else key
    if call.kind == CallKind.FORWARD:
        return (par.train, par.forward_micro, par.zero, par.offload_params)
    return (
        par.train,
        par.train_micro,
        par.zero,
        par.recompute,
        par.offload_optimizer,
        par.optimizer_step,
        par.offload_params,
    )


def gemm_model(workload: Workload, call: ModelCall, cm: CostModel) -> CostModel:
    """The cost model a call's GEMMs run under: FP8 (`CostModel.fp8`) for generation
    with generation_precision fp8, and for the trained roles' (actor, critic)
    forward and update calls with train_precision fp8 (TransformerEngine trains
    them; the frozen roles' engines stay in bf16); else `cm`."""
    if call.kind == CallKind.GENERATE:
        fp8 = workload.generation_precision is Precision.FP8
    else:
        trained = call.role is not None and call.role.trained
        fp8 = trained and workload.train_precision is Precision.FP8
    return cm.fp8() if fp8 else cm


def call_cost(
    workload: Workload,
    call: ModelCall,
    par: RoleParallelism,
    cm: CostModel,
    *,
    first_device: int,
    gpus_per_node: int,
    gen: GenLayout | None = None,
    kv_seqs: int = 0,
    tail_left: float = 0.5,
    training_devices: bool = True,
) -> callcosts.CallCost:
    """Cost of one call of `call.role` (a generation needs `gen` and kv_seqs >= 1;
    `tail_left` sets where its longest sequence ends, `GenerationShape.tail_left`).

    `training_devices`: the call runs on the role's own set (False for the actor's
    generation on a generator set apart, which pays no `offload_params` reload)."""
    assert call.role is not None, "controller-side calls have no device cost"
    model = workload.models[call.role]
    seq = train_seq_len(workload)
    cp_scope, cp_rpn = cp_placement(first_device, gpus_per_node, par.train)
    if call.kind == CallKind.GENERATE:
        assert gen is not None and kv_seqs >= 1, "callers check the KV capacity first"
        shape = callcosts.GenerationShape(
            num_seqs=rank_samples(call, par, gen),
            prompt_len=workload.batch.prompt_len,
            lengths=LengthModel.of(workload.batch),  # a greedy baseline: same in expectation
            kv_capacity_seqs=kv_seqs,
            engine=workload.rollout_engine,
            kv_dtype=workload.kv_cache_dtype,
            tail_left=tail_left,
            weights_from_memory=callcosts.weights_from_memory(
                cm,
                model,
                gen,
                most_ranks_per_node(first_device, gpus_per_node, gen.train.world_size),
            ),
        )
        cost = callcosts.generation_cost(gemm_model(workload, call, cm), model, gen, shape)
    elif call.kind == CallKind.FORWARD:
        dp, ep, dp_rpn, _, ep_rpn = train_scopes(first_device, gpus_per_node, par.train)
        cost = callcosts.forward_cost(
            gemm_model(workload, call, cm),
            model,
            par,
            call.num_samples,
            seq,
            value_head=call.role.has_value_head,
            trained=call.role.trained,
            ep_scope=ep,
            ep_ranks_per_node=ep_rpn,
            dp_scope=dp,
            dp_ranks_per_node=dp_rpn,
            cp_scope=cp_scope,
            cp_ranks_per_node=cp_rpn,
        )
    else:
        dp, ep, dp_rpn, expert_dp_rpn, ep_rpn = train_scopes(first_device, gpus_per_node, par.train)
        cost = callcosts.train_cost(
            gemm_model(workload, call, cm),
            model,
            par,
            call.num_samples,
            seq,
            workload.batch.ppo_epochs,
            workload.batch.mini_batches,
            dp,
            value_head=call.role.has_value_head,
            ep_scope=ep,
            ep_ranks_per_node=ep_rpn,
            dp_ranks_per_node=dp_rpn,
            expert_dp_ranks_per_node=expert_dp_rpn,
            lora=workload.lora_of(call.role),
            cp_scope=cp_scope,
            cp_ranks_per_node=cp_rpn,
        )
    if training_devices:
        cost = with_param_reload(cm, workload, call, par, cost)
    return with_dispatch(cm, cost, call_payload(workload, call, rank_samples(call, par, gen)))


def with_param_reload(
    cm: CostModel,
    workload: Workload,
    call: ModelCall,
    par: RoleParallelism,
    cost: callcosts.CallCost,
) -> callcosts.CallCost:
    """`cost` plus what `offload_params` adds to a call on the role's training devices.

    The weights come back over the host link before the call (a generation: before
    the reshard into the rollout engine, which reads them) and are on the device
    while it runs; an update also grows its gradients and, having changed the
    weights, copies them back to host memory after. A forward-only call drops its
    device copy (the host copy is still current). Unchanged without offload_params.
    """
    if not par.offload_params:
        return cost
    assert call.role is not None
    weights, grads = memory.offloaded_param_bytes(
        workload.models[call.role],
        par,
        trained=call.role.trained,
        value_head=call.role.has_value_head,
        lora=workload.lora_of(call.role),
    )
    reload_s = cm.copy_s("h2d", int(weights))
    transient = weights
    if call.kind == CallKind.TRAIN:
        reload_s += cm.copy_s("d2h", int(weights))
        transient += grads
    return callcosts.CallCost(
        time_s=cost.time_s + reload_s,
        transient_bytes=cost.transient_bytes + transient,
        busy_s=cost.busy_s + reload_s,
        detail={**cost.detail, "param_reload_s": reload_s},
    )


def role_call_costs(
    workload: Workload,
    role: Role,
    par: RoleParallelism,
    cm: CostModel,
    *,
    first_device: int,
    gpus_per_node: int,
    gen: GenLayout | None = None,
    kv_seqs: int = 0,
    tail_left: float = 0.5,
    training_devices: bool = True,
) -> dict[Phase, callcosts.CallCost]:
    """Cost of every call `role` makes in one step (generation only with `gen` and kv_seqs >= 1;
    `training_devices` as for `call_cost`)."""
    return {
        call.phase: call_cost(
            workload,
            call,
            par,
            cm,
            first_device=first_device,
            gpus_per_node=gpus_per_node,
            gen=gen,
            kv_seqs=kv_seqs,
            tail_left=tail_left,
            training_devices=training_devices,
        )
        for call in role_calls(workload, role)
        if call.kind != CallKind.GENERATE or gen is not None
    }


def colocated_generation_bytes(workload: Workload, par: RoleParallelism) -> float:
    """What the actor's colocated generation adds on its training devices beyond their
    resident state, before its KV cache: the generation weights beyond the training
    shard it keeps (`memory.colocated_gen_extra_bytes`), and with `offload_params`
    that training shard too, which is then not resident."""
    actor = workload.models[Role.ACTOR]
    extra = memory.colocated_gen_extra_bytes(
        actor, par.gen_layout(), par.zero, workload.generation_precision
    )
    weights, _ = memory.offloaded_param_bytes(
        actor, par, trained=True, value_head=False, lora=workload.lora_of(Role.ACTOR)
    )
    return extra + weights


def resident_key(par: RoleParallelism) -> tuple[object, ...]:
    """The fields of `par` that `resident_bytes` reads: equal keys, equal bytes."""
    return (par.train, par.zero, par.offload_optimizer, par.offload_params)


def resident_bytes(
    model: ModelSpec, role: Role, par: RoleParallelism, lora: LoRASpec | None = None
) -> float:
    """Bytes per GPU a role keeps between its calls (weights; plus grads and Adam if trained;
    with `lora`, the workload's adapters for this role, `Workload.lora_of`)."""
    if role.trained:
        return memory.trained_resident_bytes_per_gpu(
            model, par, value_head=role.has_value_head, lora=lora
        )
    return memory.frozen_resident_bytes_per_gpu(model, par, value_head=role.has_value_head)


def crowded_call_s(cm: CostModel, ranks_per_core: float, wakes: bool = True) -> float:
    """What a call to the ranks of a set that keeps `ranks_per_core` busy ranks per core
    of a shared CPU host costs beyond what the simulator composes for it (the launches
    staggered while the first ranks already run, each rank's cold start after sleeping
    through the others' calls, the replies' wait for a core), or less: the profile's
    measured fixed time of such a call (`CostModel.shared_calls`) less the simulator's
    price of the same call with nothing to do, its round trip (`with_dispatch`)
    stretched as the call is (`sliced` on `CostModel.slicing`), its ranks' wake-up
    after sleeping through one round trip (`woken`, stretched likewise; only where the
    call is charged its ranks' wake-up, `wakes`: a model call, not a transition) and
    the driver's launches and gets (`driver_work`). Piecewise linear in
    `ranks_per_core` between the measured points, the first's below them and the
    last's beyond; 0 where the profile has no such entries (GPU profiles).

    Below 0 where the composition prices the empty call above its measured time: the
    round-trip entries time one actor called on its own with a payload, one call after
    another, and on the 2-core VM of `benchmarks/results/cpu_host_2026-11-27_1515.json`
    the composition gave 4.3-13.4 ms for the calls to 1-4 ranks that took 3.2-9.9 ms.
    A call is then priced at the measured empty call plus its own work, as it is where
    the composition falls short.

    A transition (`wakes` False) on a profile with `empty_call` entries
    (`CostModel.empty_calls`: a call that does nothing, timed from its last launch) is
    measured against those instead: the probe's fixed time above holds its first
    forward's cold start, which a transition does not pay. Its composition is then the
    round trip stretched and the driver's gets (the launches come before the entries'
    clock, as before a phase's), so that a transition costs the measured empty call
    plus its own work (and, after its ranks idled longer than the entries' probe did,
    the empty call's measured wake-up, `CostModel.empty_wake_curve`, which the schedule
    charges by that idle time)."""
    empty = cm.empty_calls() if not wakes else ()
    points = empty or cm.shared_calls()
    if not points:
        return 0.0

    def excess() -> tuple[tuple[float, float], ...]:
        idle = callcosts.CallCost(time_s=0.0, transient_bytes=0.0, busy_s=0.0)
        round_trip = with_dispatch(cm, idle, NO_PAYLOAD).time_s
        cores = cm.profile_cores
        assert cores is not None  # shared_calls needs them
        out = []
        for per_core, measured in points:
            ranks = round(per_core * cores)
            driver = driver_work(cm, ranks, NO_PAYLOAD)
            # Between its calls a probe rank slept about one round trip: its wake-up
            # is in the measured time too (`CostModel.wake_curve`, stretched as the call).
            stretch = sliced(per_core, cm.slicing())
            wake = woken(round_trip, cm.wake_curve()) if wakes else 0.0
            priced = (round_trip + wake) * stretch
            if driver is not None:
                priced += driver.collect_s + (0.0 if empty else driver.launch_s)
            out.append((per_core, measured - priced))
        return tuple(out)

    return piecewise(cm.remember(("crowded call excess", wakes), excess), ranks_per_core)
