"""simulate(plan, cost_model) -> StepEstimate: one RL step of a plan, phase by phase.

Steps: (1) the workload's dataflow graph; (2) each call's time and transient
memory on its device set (`callcosts`, `rolecosts`); (3) resident memory per set and the KV
capacity left for generation; (4) the transitions the placement needs
(`reshard` for a colocated actor, `weight_sync` for a generator apart); (5) the
discrete-event schedule; (6) memory feasibility per set and phase.

The controller is a resource of the schedule too (set CONTROLLER): a call to R
ranks costs it R − 1 launches before the call and R − 1 gets after it
(`rolecosts.DriverWork`, from the profile's `ray_launch` and `ray_get`
entries; none where a profile lacks them, as GPU profiles do), one piece at a
time, on the head node's cores where a CPU pool shares them; what waits for a
call waits for its results on the driver. Its own work between the calls is there
too: it scores the responses with a rule-based reward once it has launched the
step's forward calls and before it collects them (their ends are stamped after it),
and computes the advantages before it launches the updates
(`rolecosts.controller_work_s`, from the profile's entries of
`profiles.controller_work`; none where a profile lacks them). On a CPU set with
more busy workers than cores, collectives also wait for their partners to be scheduled
(`CostModel.shared_cores`); where other sets' calls crowd the host further, the
schedule adds each collective's wait for the extra crowding (`schedule`, with
the count of a call's collectives from `CostModel.with_probe_wait`); the part of a
call its ranks spend blocked in collectives for a partner's data (`latency_on`, from
the profile's `paired_collective` entries) is not slowed by that crowd.

Asynchronous steps (workload `max_staleness` = s >= 1, with a generator set
apart from the trainer) unroll the graph over several steps in which step k's
generation waits only for the weights of update k−1−s, so the generator runs up
to s batches ahead of the trainer. With s = 1 (one-step-off) the weight sync
is a rendezvous of both sets, as the executor's blocking send is, and step k's
training calls wait for the sync feeding generation k+1 (the executor collects
it, with generation k, before it launches them); with s >= 2
the trainer posts its weights and goes on (the executor's non-blocking send
out of a snapshot; up to s−1 snapshots are held, booked as resident on the
trainer's set) and the sync occupies the generator set only.

A buffer of batches only pays when steps differ, so an asynchronous step draws
its generation's longest response from the length distribution: step k's
generation calls are priced at quantile q_k of the batch's longest length
(`lengths.longest_quantiles`: eight strata in a fixed order), and the
iteration time is the mean distance between step ends over one round of the
strata after s + 2 warm-up steps (the first steps' syncs have no update to
wait for), with one step unrolled after it (its sync follows the window's last
update). When the lengths are fixed (or every quantile is clipped at the
maximum) generation does not vary, and the window is two steps.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from placeflow.dataflow import FORWARD_PHASES, CallKind, dataflow_calls
from placeflow.layout import GenLayout, gen_shard_bytes, generation_shard_bytes
from placeflow.phases import Phase
from placeflow.plan import Plan
from placeflow.profiles.costmodel import CostModel, SliceCurve, WakeCurve, sliced
from placeflow.profiles.schema import FrameworkKind, Scope
from placeflow.simulator import callcosts, memory
from placeflow.simulator.estimate import PhaseInterval, SetEstimate, StepEstimate
from placeflow.simulator.lengths import LengthModel, longest_quantiles, tail_left
from placeflow.simulator.rolecosts import (
    NO_PAYLOAD,
    DriverWork,
    call_driver_work,
    colocated_generation_bytes,
    controller_work_s,
    crowded_call_s,
    driver_work,
    kv_bytes_per_seq,
    reshard_placement,
    resident_bytes,
    role_call_costs,
    rollout_sync_cost,
    with_dispatch,
)
from placeflow.simulator.schedule import Span, Work, schedule
from placeflow.workload import Role

CONTROLLER = -1  # the controller's "set": its work runs one piece at a time
_Fact = TypeVar("_Fact")  # a per-node fact of a cost model (`_per_node`)
# The driver's serial work around a call (`rolecosts.DriverWork`), as work ids
# (step, phase, LAUNCH) and (step, phase, COLLECT) beside the call's (step, phase).
LAUNCH, COLLECT = "launch", "collect"

CostModels = Mapping[str, CostModel]


def _cm(plan: Plan, cms: CostModels, set_index: int) -> CostModel:
    """The cost model of a set's pool ("*" stands for every pool)."""
    if "*" in cms:
        return cms["*"]
    return cms[plan.pool_of(set_index).profile]


@dataclass(frozen=True, kw_only=True)
class _Call:
    """A costed call: which phase, roles and sets, and its CallCost."""

    phase: Phase
    roles: tuple[Role, ...]
    sets: tuple[int, ...]
    cost: callcosts.CallCost
    preds: tuple[Phase, ...]
    driver: DriverWork | None = None  # the controller's launches and gets around it
    collectives: float = 0.0  # on a rank's path, waiting for partners (`schedule.Work`)
    latency_s: float = 0.0  # of its time, blocked in collectives (`schedule.Work`)
    wake: WakeCurve = ()  # its ranks' wake-up by their idle time before it (`_wake`)
    on_driver: bool = False  # the controller's own work (rule-based reward, advantages)
    # Per shared host, the stretch curve its ranks follow there where it is not the
    # forward's (`stretch_probe`; `schedule.Work.curves`).
    curves: tuple[tuple[Hashable, SliceCurve], ...] = ()


# The stretch probe whose measured curve a call's ranks follow on a crowded host, by the
# call's kind of work (`CostModel.slicing`): a generation decodes, an update trains; the
# forwards and the weight transitions run the forward's.
_STRETCH_PROBES = {
    CallKind.GENERATE: FrameworkKind.SHARED_DECODE,
    CallKind.TRAIN: FrameworkKind.SHARED_TRAIN,
}


def stretch_probe(kind: CallKind | None) -> FrameworkKind:
    """The stretch probe of a call of `kind` (None: a transition): `_STRETCH_PROBES`."""
    if kind is None:
        return FrameworkKind.SHARED_COMPUTE
    return _STRETCH_PROBES.get(kind, FrameworkKind.SHARED_COMPUTE)


def _call_probes(plan: Plan) -> dict[Phase, FrameworkKind]:
    """Every model call's stretch probe (`stretch_probe`) by its phase."""
    return {call.phase: stretch_probe(call.kind) for call, _ in dataflow_calls(plan.workload)}


def _resident_bytes(plan: Plan, set_index: int) -> float:
    """Weights (and, for trained roles, gradients and optimizer state) kept on each GPU."""
    s = plan.sets[set_index]
    wl = plan.workload
    if s.generator:
        par = plan.parallelism[Role.ACTOR]
        actor = wl.models[Role.ACTOR]
        lora = wl.lora_of(Role.ACTOR)
        adapters = lora.params(actor) * actor.dtype.num_bytes if lora is not None else 0
        weights = memory.generation_weight_bytes(actor, wl.generation_precision)
        return gen_shard_bytes(int(weights) + adapters, par.tg, par.pg)
    return sum(resident_bytes(wl.models[r], r, plan.parallelism[r], wl.lora_of(r)) for r in s.roles)


def _gen_layout(plan: Plan) -> GenLayout:
    gen_set = plan.generator_set()
    devices = plan.sets[gen_set].num_devices if gen_set is not None else None
    return plan.parallelism[Role.ACTOR].gen_layout(devices)


def _kv_seqs(plan: Plan, resident: list[float]) -> tuple[int, int, str | None]:
    """(generation set, sequences whose KV cache fits per GPU, reason if none fits)."""
    gen = _gen_layout(plan)
    gen_set = plan.generator_set()
    set_index = gen_set if gen_set is not None else plan.set_of(Role.ACTOR)
    extra = (
        0.0
        if gen_set is not None
        else colocated_generation_bytes(plan.workload, plan.parallelism[Role.ACTOR])
    )
    capacity = plan.pool_of(set_index).gpu.usable_bytes
    free = capacity - resident[set_index] - extra
    per_seq = kv_bytes_per_seq(plan.workload, gen)
    util = plan.workload.gpu_memory_utilization
    kv_seqs = memory.kv_capacity_seqs(free, per_seq, util, plan.workload.max_num_seqs)
    if kv_seqs >= 1:
        return set_index, kv_seqs, None
    budget = max(free, 0) * util
    return (
        set_index,
        0,
        (
            f"role actor, phase generate: the KV cache of one sequence needs {per_seq:,.0f} bytes "
            f"per GPU but only {budget:,.0f} are free for it (gpu_memory_utilization {util} of "
            f"what {capacity:,} usable bytes leave after resident weights and optimizer state); "
            f"short by {per_seq - budget:,.0f}"
        ),
    )


def _priced(
    plan: Plan,
    cm: CostModel,
    role: Role,
    set_index: int,
    gen: GenLayout | None,
    kv_seqs: int,
    tail_left: float = 0.5,
) -> dict[Phase, callcosts.CallCost]:
    """`role`'s call costs on set `set_index`'s devices, priced with `cm`; where its
    training layout interleaves two groupings of the ranks (`callcosts.interleaves_groups`)
    its forwards and updates with `cm.coupled()` (the shared view's partner wait of such
    collectives), its generation, in the rollout layout's own groups, with `cm`."""
    par = plan.parallelism[role]

    def priced(view: CostModel, gen: GenLayout | None) -> dict[Phase, callcosts.CallCost]:
        # (the actor's generator set apart is not its training set: no offload_params reload)
        return role_call_costs(
            plan.workload,
            role,
            par,
            view,
            first_device=plan.sets[set_index].first_device,
            gpus_per_node=plan.pool_of(set_index).gpus_per_node,
            gen=gen,
            kv_seqs=kv_seqs,
            tail_left=tail_left,
            training_devices=set_index == plan.set_of(role),
        )

    costs = priced(cm, gen)
    if callcosts.interleaves_groups(par) and cm.coupled() is not cm:
        costs |= priced(cm.coupled(), None)  # gen None: every call but the generation
    return costs


def _role_costs_on(
    plan: Plan,
    cms: CostModels,
    role: Role,
    set_index: int,
    gen: GenLayout | None,
    kv_seqs: int,
    tail_left: float = 0.5,
) -> dict[Phase, tuple[int, callcosts.CallCost]]:
    """`role`'s call costs on set `set_index`'s devices, priced with its pool's profile,
    each with the set's view and stretch of its own kind of work (`stretch_probe`)."""
    probes = _call_probes(plan)
    found = _by_probe(
        plan,
        cms,
        set_index,
        probes,
        lambda cm: _priced(plan, cm, role, set_index, gen, kv_seqs, tail_left),
    )
    return {
        phase: (set_index, _contended(plan, cms, set_index, c, probe=probes.get(phase)))
        for phase, c in found.items()
    }


def _by_probe(
    plan: Plan,
    cms: CostModels,
    set_index: int,
    probes: Mapping[Phase, FrameworkKind],
    price: Callable[[CostModel], dict[Phase, _Fact]],
) -> dict[Phase, _Fact]:
    """`price` of the set's view (`_set_cm`), each phase's from the view of its own stretch
    probe (`probes`, the forward's where absent): priced once per view that differs."""
    base = _set_cm(plan, cms, set_index)
    out = price(base)
    for probe in set(probes.values()) - {FrameworkKind.SHARED_COMPUTE}:
        if _stretch(plan, cms, set_index, probe=probe) == _stretch(plan, cms, set_index):
            continue  # (the same view: a set on cores of its own, or no curve of its own)
        view = price(_set_cm(plan, cms, set_index, probe))
        out.update((phase, v) for phase, v in view.items() if probes.get(phase) is probe)
    return out


def collectives_on(
    plan: Plan, cms: CostModels, role: Role, set_index: int, gen: GenLayout | None, kv_seqs: int
) -> dict[Phase, float]:
    """Collectives on a rank's path in each of `role`'s calls on set `set_index` that wait
    for their partners when other work crowds the host (`schedule`): each call priced
    with `CostModel.with_probe_wait` less the same call priced plainly. Empty where the
    pool's cores are not shared (a GPU pool)."""
    cm = _cm(plan, cms, set_index)
    if plan.pool_of(set_index).cores_per_node is None or not cm.host_local:
        return {}
    plain = _priced(plan, cm, role, set_index, gen, kv_seqs)
    probed = _priced(plan, cm.with_probe_wait(), role, set_index, gen, kv_seqs)
    return {phase: max(0.0, probed[phase].time_s - c.time_s) for phase, c in plain.items()}


def latency_on(
    plan: Plan, cms: CostModels, role: Role, set_index: int, gen: GenLayout | None, kv_seqs: int
) -> dict[Phase, float]:
    """Seconds of each of `role`'s calls on set `set_index` (as the schedule gets them,
    stretched by the set's sharing) that its ranks spend blocked in collectives within
    their host: the latency they pay for a partner's data beyond their back-to-back
    entries (the call priced with the set's model less the same call priced
    `CostModel.without_paired`), and the blocked part of those entries
    (`CostModel.blocked_collective_s`: the call priced without paired entries less it
    priced `CostModel.without_blocked_collectives`); times the call's stretch (the
    view divided both by it, `CostModel.collective_s`). Empty where the pool's profile
    has neither (GPU profiles, older CPU ones)."""
    probes = _call_probes(plan)
    cm = _set_cm(plan, cms, set_index)
    if cm.without_paired() is cm and not cm.blocked_collective_share() > 0:
        return {}

    def blocked(cm: CostModel) -> dict[Phase, float]:
        bare = cm.without_paired()
        blocks = cm.blocked_collective_share() > 0
        plain = _priced(plan, bare, role, set_index, gen, kv_seqs)
        # (without paired entries the two are one model: priced once)
        paired = plain if bare is cm else _priced(plan, cm, role, set_index, gen, kv_seqs)
        worked = (
            _priced(plan, bare.without_blocked_collectives(), role, set_index, gen, kv_seqs)
            if blocks
            else plain
        )
        return {
            phase: (
                max(0.0, c.time_s - plain[phase].time_s)
                + max(0.0, plain[phase].time_s - worked[phase].time_s)
            )
            * _stretch(plan, cms, set_index, busy_fraction(c), probes.get(phase))
            for phase, c in paired.items()
        }

    return _by_probe(plan, cms, set_index, probes, blocked)


def _cost_calls(
    plan: Plan, cms: CostModels, resident: list[float]
) -> tuple[list[_Call], list[str]]:
    wl = plan.workload
    gen_set_index, kv_seqs, problem = _kv_seqs(plan, resident)
    costs: dict[Phase, tuple[int, callcosts.CallCost]] = {}
    collectives: dict[Phase, float] = {}
    latency: dict[Phase, float] = {}
    for role in wl.roles:
        set_index = plan.set_of(role)
        gen = _gen_layout(plan) if role is Role.ACTOR and kv_seqs else None
        costs.update(_role_costs_on(plan, cms, role, set_index, gen, kv_seqs))
        collectives.update(collectives_on(plan, cms, role, set_index, gen, kv_seqs))
        latency.update(latency_on(plan, cms, role, set_index, gen, kv_seqs))
        if role is Role.ACTOR and kv_seqs and gen_set_index != set_index:
            # A generator set apart generates on its own pool's devices: its profile.
            on_gen = _role_costs_on(plan, cms, role, gen_set_index, gen, kv_seqs)
            counted = collectives_on(plan, cms, role, gen_set_index, gen, kv_seqs)
            blocked = latency_on(plan, cms, role, gen_set_index, gen, kv_seqs)
            for phase in (Phase.GENERATE, Phase.GENERATE_BASELINE):
                if phase in on_gen:
                    costs[phase] = on_gen[phase]
                    collectives[phase] = counted.get(phase, 0.0)
                    latency[phase] = blocked.get(phase, 0.0)
    if problem:
        infinite = callcosts.CallCost(time_s=math.inf, transient_bytes=0.0, busy_s=0.0)
        costs[Phase.GENERATE] = (gen_set_index, infinite)
    out: list[_Call] = []
    driver_cm = _driver_cm(plan, cms)
    for call, preds in dataflow_calls(wl):
        if call.kind == CallKind.CONTROLLER:
            scoring = controller_work_s(wl, Phase.REWARD, driver_cm)
            if scoring is not None:
                # The rule-based reward: after the generations, which it scores, and
                # before the advantages (its place among the driver's work: `_tasks`).
                sources = tuple(p for p in preds if p in GENERATION_PHASES)
                out.append(_driver_call(Phase.REWARD, scoring, sources))
                preds = (*preds, Phase.REWARD)
            work_s = controller_work_s(wl, call.phase, driver_cm)
            out.append(_driver_call(call.phase, work_s or 0.0, preds))
            continue
        assert call.role is not None
        set_index, cost = costs[call.phase]
        if call.kind == CallKind.GENERATE:
            set_index = gen_set_index
        driver = call_driver_work(
            wl,
            call,
            plan.parallelism[call.role],
            _cm(plan, cms, set_index),
            ranks=plan.sets[set_index].num_devices,
            gen=_gen_layout(plan) if call.kind == CallKind.GENERATE else None,
        )
        out.append(
            _Call(
                phase=call.phase,
                roles=(call.role,),
                sets=(set_index,),
                cost=cost,
                preds=preds,
                driver=driver,
                collectives=collectives.get(call.phase, 0.0),
                latency_s=latency.get(call.phase, 0.0),
                wake=_wake(plan, cms, set_index, cost, call.kind, call.role),
                curves=_own_curves(plan, cms, stretch_probe(call.kind)),
            )
        )
    return _with_transitions(plan, cms, out), [problem] if problem else []


def _driver_cm(plan: Plan, cms: CostModels) -> CostModel:
    """The cost model of the controller's host: the head node's pool's (`_driver_hosts`)."""
    return cms["*"] if "*" in cms else cms[plan.cluster.pools[0].profile]


def _driver_call(phase: Phase, time_s: float, preds: tuple[Phase, ...]) -> _Call:
    """The controller's own work `phase` of `time_s` on the driver, on no device set."""
    cost = callcosts.CallCost(time_s=time_s, transient_bytes=0.0, busy_s=0.0)
    return _Call(phase=phase, roles=(), sets=(), cost=cost, preds=preds, on_driver=True)


GENERATION_PHASES = (Phase.GENERATE, Phase.GENERATE_BASELINE)
# The actor's weight transitions between its layouts or onto a generator apart
# (`_with_transitions`), priced from the measured empty Ray call, not from kernels.
TRANSITION_PHASES = (Phase.RESHARD, Phase.WEIGHT_SYNC)

Draw = Mapping[Phase, float]  # one step's generation seconds by phase


def _generation_draws(plan: Plan, cms: CostModels, resident: list[float]) -> tuple[Draw, ...]:
    """Seconds of each generation call at each quantile of the batch's longest length
    (`lengths.longest_quantiles`), on the generator set; () when they do not vary."""
    gen_set, kv_seqs, problem = _kv_seqs(plan, resident)
    if problem or plan.generator_set() is None:
        return ()
    gen = _gen_layout(plan)
    expected = _role_costs_on(plan, cms, Role.ACTOR, gen_set, gen, kv_seqs)
    draws = []
    for q in longest_quantiles():
        costs = _role_costs_on(plan, cms, Role.ACTOR, gen_set, gen, kv_seqs, tail_left(q))
        draws.append({p: costs[p][1].time_s for p in GENERATION_PHASES if p in costs})
    if all(d == draws[0] for d in draws):
        return ()
    # Centred on the expected call (the synchronous estimate's), so that the draws add
    # spread around it and not a different mean: `last_step`'s rule is the quantile
    # 0.61 of the longest length, a little above its mean.
    shift = {p: expected[p][1].time_s - sum(d[p] for d in draws) / len(draws) for p in draws[0]}
    return tuple({p: max(0.0, t + shift[p]) for p, t in d.items()} for d in draws)


def _snapshot_bytes(plan: Plan) -> float:
    """Bytes per trainer GPU of one weight snapshot awaiting the generator (staleness >= 2).

    A trainer rank packs what a generator replica needs out of its tensor/pipeline
    shard, once for every generator replica it serves (the executor posts one copy
    to each): at most weights/(t·p), the adapters' share with LoRA. An upper
    bound: a generator replica pulls from one weight replica (r mod d·cp), so the
    ranks of the others may hold nothing.
    """
    wl = plan.workload
    actor, lay = wl.models[Role.ACTOR], plan.parallelism[Role.ACTOR].train
    lora = wl.lora_of(Role.ACTOR)
    total = actor.num_bytes() if lora is None else lora.params(actor) * actor.dtype.num_bytes
    return total / (lay.t * lay.p)


def _contention(
    plan: Plan, set_index: int, busy_fraction: float = 1.0, *, clamp: bool = True
) -> float:
    """How much slower each worker of the set runs when `busy_fraction` of them are busy
    on average (>= 1; `PoolSpec.contention` of its most crowded node); with `clamp`
    False its busy workers per core there (`PoolSpec.busy_per_core`, below 1 where they
    leave cores idle)."""
    s, pool = plan.sets[set_index], plan.pool_of(set_index)
    nodes = {d // pool.gpus_per_node for d in s.devices()}
    per_node = max(sum(1 for d in s.devices() if d // pool.gpus_per_node == n) for n in nodes)
    if not clamp:
        return pool.busy_per_core(per_node * busy_fraction)
    return pool.contention(per_node * busy_fraction)


def busy_fraction(cost: callcosts.CallCost) -> float:
    """The share of a call's ranks busy at a time, on average: its busy time over its
    duration (`CallCost.busy_s` leaves out pipeline bubbles, in which a stage waits)."""
    if cost.time_s <= 0:
        return 1.0
    return min(1.0, cost.busy_s / cost.time_s)


def _stretch(
    plan: Plan,
    cms: CostModels,
    set_index: int,
    busy_fraction: float = 1.0,
    probe: FrameworkKind | None = None,
) -> float:
    """How much longer a call of the set takes than one rank alone on the host: the
    measured stretch at its busy workers per core of its most crowded node
    (`costmodel.sliced` on `CostModel.slicing` of the call's stretch probe `probe`,
    the forward's by default: the share of a core each gets, the slices' cost, what
    ranks on cores of their own cost one another); 1 on a pool that does not declare
    its cores (GPU pools)."""
    pool = plan.pool_of(set_index)
    if pool.cores_per_node is None:
        return 1.0
    per_core = _contention(plan, set_index, busy_fraction, clamp=False)
    curve = _cm(plan, cms, set_index).slicing(probe or FrameworkKind.SHARED_COMPUTE)
    return sliced(per_core, curve)


def _set_cm(
    plan: Plan, cms: CostModels, set_index: int, probe: FrameworkKind | None = None
) -> CostModel:
    """The cost model of a set's calls (of stretch probe `probe`, the forward's by
    default): its pool's, with the collectives of ranks that share their cores
    (`CostModel.shared_cores`) where the set oversubscribes them, or of ranks on cores
    of their own that the host's curve stretches all the same (`CostModel.own_cores`:
    their blocked time left as measured)."""
    cm = _cm(plan, cms, set_index)
    stretch = _stretch(plan, cms, set_index, probe=probe)
    if _contention(plan, set_index) <= 1.0:
        return cm.own_cores(stretch)
    return cm.shared_cores(stretch)


def _contended(
    plan: Plan,
    cms: CostModels,
    set_index: int,
    cost: callcosts.CallCost,
    wakes: bool = True,
    probe: FrameworkKind | None = None,
) -> callcosts.CallCost:
    """Stretch a call on CPU workers that share fewer cores than the call keeps busy.

    A call keeps `busy_fraction` of the set's devices busy on average (all of them
    but for a pipeline's bubbles: with m micro-batches over p stages each stage
    works m of every m + p − 1 slots); on a node with fewer physical cores than that
    (PoolSpec.cores_per_node) each busy worker gets cores / busy workers of a core,
    and pays the time slices' measured overhead (`_stretch`). A call on such a pool
    also pays the fixed time its ranks' crowd adds to a Ray call beyond the round
    trip and the driver's work, or is credited what that composition prices above
    the measured empty call (`rolecosts.crowded_call_s`, at the set's ranks per
    core; `wakes`: whether the call is charged its ranks' model-call wake-up, which a
    transition is not, so that its composition leaves the wake out: it pays the empty
    call's own beyond the `empty_call` entries' pause, `_transition_wake`). Never below
    0: the driver's launches and gets, scheduled apart, already hold the measured call
    then. GPU pools are never stretched. `probe`: the call's stretch probe (`stretch_probe`).
    """
    factor = _stretch(plan, cms, set_index, busy_fraction(cost), probe)
    extra = 0.0
    if plan.pool_of(set_index).cores_per_node is not None:
        cm, contention = _cm(plan, cms, set_index), _contention(plan, set_index, clamp=False)
        extra = crowded_call_s(cm, contention, wakes)
    if factor == 1.0 and extra == 0.0:
        return cost
    return dataclasses.replace(
        cost,
        time_s=max(0.0, cost.time_s * factor + extra),
        busy_s=cost.busy_s * factor,
        detail={**cost.detail, "crowded_call_s": extra} if extra else cost.detail,
    )


def _wake(
    plan: Plan,
    cms: CostModels,
    set_index: int,
    cost: callcosts.CallCost,
    kind: CallKind,
    role: Role,
) -> WakeCurve:
    """What a model call of `kind` by `role` on set `set_index` costs more by how long
    its ranks slept before it: its pool's measured `CostModel.call_wake_curve` for that
    kind of call at a rank's weight bytes of the role's model (its t·p model-parallel
    shard, `memory.weight_bytes_per_gpu`, or its generation shard), stretched as the
    call is on a crowded host (`_stretch`: the refill is the ranks' own work). A profile
    without the calls' entries gives the reference forward's `wake_curve` for every
    call. () on pools that do not declare their cores (GPU pools: their profiles hold
    none).

    Model calls only: a forward, backward or generation walks the engine's whole code
    path and its layers' weights, as the reference forward does. A transition (reshard,
    weight sync) copies tensors in order, which the prefetcher streams: inside a CPU run
    the actor's `sync_rollout` took the CPU time it takes alone (0.69 ms,
    `benchmarks/inrun_calls.py`), and charging it the forward's refill put the reshard
    phases of `benchmarks/fidelity_cpu.py` 21-144 % over their measured times. It pays
    the empty call's own wake-up instead (`_transition_wake`)."""
    if plan.pool_of(set_index).cores_per_node is None:
        return ()
    model = plan.workload.models[role]
    if kind == CallKind.GENERATE:
        copy = memory.generation_weight_bytes(model, plan.workload.generation_precision)
        weight_bytes = generation_shard_bytes(int(copy), _gen_layout(plan))
    else:
        lay = plan.parallelism[role].train
        weight_bytes = memory.weight_bytes_per_gpu(
            model, lay.t, lay.p, value_head=role.has_value_head, e=lay.e
        )
    curve = _cm(plan, cms, set_index).call_wake_curve(kind.value, weight_bytes)
    if not curve:
        return ()
    factor = _stretch(plan, cms, set_index, busy_fraction(cost), stretch_probe(kind))
    return tuple((idle, extra * factor) for idle, extra in curve)


def _transition_wake(plan: Plan, cms: CostModels, set_index: int) -> WakeCurve:
    """What a weight transition on the actor's set `set_index` costs more by how long its
    sets idled before it: the pool's measured `CostModel.empty_wake_curve` (an empty
    Ray call after that idle, beyond the `empty_call` entries that price its fixed time,
    `rolecosts.crowded_call_s`); () on pools that do not declare their cores (GPU
    pools). Not the model calls' refill (`_wake`): a transition walks no model."""
    if plan.pool_of(set_index).cores_per_node is None:
        return ()
    return _cm(plan, cms, set_index).empty_wake_curve()


def _with_transitions(plan: Plan, cms: CostModels, costed: list[_Call]) -> list[_Call]:
    """Insert reshard (colocated actor) or weight_sync (generator apart) before generation."""
    actor = plan.workload.models[Role.ACTOR]
    actor_set, gen_set = plan.set_of(Role.ACTOR), plan.generator_set()
    gen = _gen_layout(plan)
    cm = _set_cm(plan, cms, actor_set)
    par = plan.parallelism[Role.ACTOR]
    sets: tuple[int, ...]
    if gen_set is not None:
        # One rank alone is always within a node: only where the two sets start matters.
        same_node = (
            plan.sets[actor_set].pool == plan.sets[gen_set].pool
            and plan.sets[actor_set].first_device // plan.pool_of(actor_set).gpus_per_node
            == plan.sets[gen_set].first_device // plan.pool_of(gen_set).gpus_per_node
        )
        scope = Scope.INTRA if same_node else Scope.INTER
        cost = callcosts.weight_sync_cost(
            cm,
            actor,
            par.tg,
            par.pg,
            scope,
            train=par.train,
            lora=plan.workload.lora_of(Role.ACTOR),
            train_zero=par.zero,
            # (a set within one node gathers within it; one across nodes, its data-
            # parallel replicas spread over them, across)
            gather_scope=(
                Scope.INTRA
                if plan.sets[actor_set].num_devices <= plan.pool_of(actor_set).gpus_per_node
                else Scope.INTER
            ),
        )
        # An offloaded actor's trainer reloads its shard to send it (rolecosts).
        weights, _ = memory.offloaded_param_bytes(
            actor, par, trained=True, value_head=False, lora=plan.workload.lora_of(Role.ACTOR)
        )
        if weights:
            reload_s = cm.copy_s("h2d", int(weights))
            cost = dataclasses.replace(
                cost,
                time_s=cost.time_s + reload_s,
                busy_s=cost.busy_s + reload_s,
                detail={**cost.detail, "param_reload_s": reload_s},
            )
        phase, sets = Phase.WEIGHT_SYNC, (actor_set, gen_set)
    else:
        scope, per_node = reshard_placement(
            plan.sets[actor_set].first_device, plan.pool_of(actor_set).gpus_per_node, gen
        )
        cost = rollout_sync_cost(
            cm, actor, gen, scope, train_zero=par.zero, ranks_per_node=per_node
        )
        phase, sets = Phase.RESHARD, (actor_set,)
    # The transition is one Ray call per rank too; its bytes go over the collectives.
    cost = _contended(plan, cms, actor_set, with_dispatch(cm, cost, NO_PAYLOAD), wakes=False)
    ranks = sum(plan.sets[i].num_devices for i in sets)
    transition = _Call(
        phase=phase,
        roles=(Role.ACTOR,),
        sets=sets,
        cost=cost,
        preds=(),
        driver=driver_work(cm, ranks, NO_PAYLOAD),
        wake=_transition_wake(plan, cms, actor_set),
    )
    result = [transition]
    for c in costed:
        if c.phase in (Phase.GENERATE, Phase.GENERATE_BASELINE):
            c = dataclasses.replace(c, preds=(*c.preds, phase))
        result.append(c)
    return result


def _hosts(
    plan: Plan, sets: tuple[int, ...], busy: float = 1.0
) -> tuple[tuple[Hashable, float], ...]:
    """(pool, node) -> devices of `sets` there that a call keeps busy (`busy` of them on
    average, `busy_fraction`), on pools whose cores are shared."""
    count: dict[Hashable, float] = {}
    for i in sets:
        pool = plan.pool_of(i)
        if pool.cores_per_node is None:
            continue
        for d in plan.sets[i].devices():
            host = (pool.name, d // pool.gpus_per_node)
            count[host] = count.get(host, 0.0) + busy
    return tuple(count.items())


def _shared_cores(plan: Plan) -> dict[Hashable, int]:
    """Cores of every node of the pools that declare them (`schedule`'s shared hosts)."""
    return {
        (pool.name, n): pool.cores_per_node
        for pool in plan.cluster.pools
        if pool.cores_per_node is not None
        for n in range(pool.num_nodes)
    }


def _per_node(
    plan: Plan, cms: CostModels, fact: Callable[[CostModel], _Fact]
) -> dict[Hashable, _Fact]:
    """`fact` of the pool's profile on every node of the pools that declare their cores."""
    return {
        (plan.pool_of(i).name, n): fact(_cm(plan, cms, i))
        for i in range(len(plan.sets))
        if plan.pool_of(i).cores_per_node is not None
        for n in range(plan.pool_of(i).num_nodes)
    }


def _partner_waits(plan: Plan, cms: CostModels) -> dict[Hashable, float]:
    """The measured partner wait of a collective (`CostModel.partner_wait_s`) per node."""
    return _per_node(plan, cms, CostModel.partner_wait_s)


def _slicings(plan: Plan, cms: CostModels) -> dict[Hashable, SliceCurve]:
    """The measured stretch by busy ranks per core (`CostModel.slicing`) per node."""
    return _per_node(plan, cms, CostModel.slicing)


def _own_curves(
    plan: Plan, cms: CostModels, probe: FrameworkKind
) -> tuple[tuple[Hashable, SliceCurve], ...]:
    """Per node, the stretch curve of `probe` where it is not the forward's (a call's own,
    `schedule.Work.curves`); () for the forward's probe."""
    if probe is FrameworkKind.SHARED_COMPUTE:
        return ()
    forward = _slicings(plan, cms)
    own = _per_node(plan, cms, lambda cm: cm.slicing(probe))
    return tuple((h, c) for h, c in own.items() if c != forward[h])


def _backgrounds(plan: Plan, cms: CostModels) -> dict[Hashable, float]:
    """The measured background load of a Ray host (`CostModel.ray_background`) per node."""
    return _per_node(plan, cms, CostModel.ray_background)


def _driver_hosts(plan: Plan) -> tuple[tuple[Hashable, float], ...]:
    """Where the controller's own work keeps a core busy: the cluster's head node (node 0
    of its first pool), where shared cores are declared there (`Work.hosts`)."""
    head = plan.cluster.pools[0]
    return (((head.name, 0), 1.0),) if head.cores_per_node is not None else ()


def _tasks(
    plan: Plan,
    costed: list[_Call],
    num_steps: int,
    staleness: int = 0,
    draws: Sequence[Draw] = (),
) -> list[Work]:
    """Tasks of `num_steps` unrolled steps (asynchronous with `staleness` >= 1).

    Step k's calls after generation wait for step k−1's updates. The weight
    sync feeding generation k carries the weights of update k−1−s. With s = 1
    it holds both sets and is ordered just before step k−1's calls, so that
    generation k overlaps training k−1; with s >= 2 it holds the generator set
    only, just before generation k. Step k's generation calls last `draws[k mod
    len(draws)]` seconds when `draws` are given (module docstring).
    """
    order = {c.phase: i for i, c in enumerate(costed)}
    updates = [c.phase for c in costed if c.phase in (Phase.ACTOR_UPDATE, Phase.CRITIC_UPDATE)]
    generation = (Phase.WEIGHT_SYNC, *GENERATION_PHASES)
    driver = _driver_hosts(plan)
    collected: dict[Hashable, Hashable] = {}  # a call -> the driver's collection of it
    # One-step-off: the executor stamps rollout k (k >= 1) as it ends and takes its
    # results only when it collects the sync feeding generation k+1, with that sync's
    # (`RLLoop._sync_and_collect`): every rank's get is the driver's work there.
    rollout_gets = sum(
        c.driver.collect_s + c.driver.get_s
        for c in costed
        if c.phase in GENERATION_PHASES and c.driver is not None
    )

    # The rule-based reward: the executor scores once it has launched every forward call
    # of the step and collects them after (`RLLoop._forwards`), so that their ends are
    # stamped only then; but where it first waits for ReMax's greedy baseline rollout it
    # stamps the forwards' ends as they come meanwhile, and only their gets wait.
    stamps_after_scoring = Phase.GENERATE_BASELINE not in order and any(
        c.on_driver and c.phase is Phase.REWARD for c in costed
    )
    forwards = [c.phase for c in costed if c.phase in FORWARD_PHASES and c.driver is not None]

    def on_driver(
        work_id: Hashable, duration_s: float, preds: Sequence[Hashable], priority: int
    ) -> Work:
        """Work of the driver's one thread: on the controller, on the head node's cores
        where they are shared, at the plain share of a core (`schedule`)."""
        return Work(
            id=work_id,
            sets=(CONTROLLER,),
            duration_s=duration_s,
            preds=tuple(preds),
            priority=priority,
            hosts=driver,
            sliced=False,
        )

    def gets_later(k: int) -> bool:
        """Rollout k's gets move to the collect of sync k+1 (the first rollout is
        collected as it ends, on-policy; the last has no sync after it)."""
        return staleness == 1 and 1 <= k < num_steps - 1

    tasks = []
    for k in range(num_steps):
        drawn = draws[k % len(draws)] if draws else {}
        for c in costed:
            preds: list[Hashable] = [(k, p) for p in c.preds]
            priority = k * 100 + order[c.phase]
            sets = c.sets
            if c.phase is Phase.WEIGHT_SYNC and k > 0:
                if staleness == 1:
                    priority = (k - 1) * 100 - 1
                else:  # posted by the trainer; received between generations
                    priority, sets = k * 100 - 1, c.sets[-1:]
                if k - 1 - staleness >= 0:
                    preds.append((k - 1 - staleness, Phase.ACTOR_UPDATE))
            elif c.phase not in generation:
                if k > 0:
                    preds.extend((k - 1, u) for u in updates)
                if staleness == 1 and k + 1 < num_steps:
                    # The executor collects the sync that feeds generation k+1 (sent
                    # after update k−1) before it launches step k's training calls.
                    preds.append((k + 1, Phase.WEIGHT_SYNC))
            if c.on_driver:
                if c.phase is Phase.REWARD:
                    preds.extend((k, f, LAUNCH) for f in forwards)
                tasks.append(on_driver((k, c.phase), c.cost.time_s, preds, priority))
                continue
            duration_s = drawn.get(c.phase, c.cost.time_s)
            collect_s = 0.0 if c.driver is None else c.driver.collect_s
            if gets_later(k) and c.phase in GENERATION_PHASES and c.driver is not None:
                duration_s, collect_s = max(0.0, duration_s - c.driver.get_s), 0.0
            collect_after: tuple[Hashable, ...] = ()
            if c.phase is Phase.WEIGHT_SYNC and gets_later(k - 1):
                # Rollout k−1's gets, taken with this sync's results once both are in.
                collect_s += rollout_gets
                collect_after = tuple((k - 1, p) for p in order if p in GENERATION_PHASES)
            if stamps_after_scoring and c.phase in FORWARD_PHASES:
                collect_after = (*collect_after, (k, Phase.REWARD))
            if c.driver is not None:
                # The driver's launches come first and its gets after; what waits for
                # the call waits for its results on the driver (redirected below).
                launch, collect = (k, c.phase, LAUNCH), (k, c.phase, COLLECT)
                tasks.append(on_driver(launch, c.driver.launch_s, preds, priority))
                tasks.append(
                    on_driver(collect, collect_s, ((k, c.phase), *collect_after), priority)
                )
                collected[k, c.phase] = collect
                preds.append(launch)
            tasks.append(
                Work(
                    id=(k, c.phase),
                    sets=sets,
                    duration_s=duration_s,
                    preds=tuple(preds),
                    priority=priority,
                    hosts=_hosts(plan, sets, busy_fraction(c.cost)),
                    collectives=c.collectives,
                    latency_s=c.latency_s,
                    wake=c.wake,
                    curves=c.curves,
                    # A model call's time comes from entries timed without Ray running; a
                    # transition's from the measured empty Ray call (`schedule`).
                    background=c.phase not in TRANSITION_PHASES,
                )
            )
    return [
        dataclasses.replace(
            t, preds=tuple(p if collected.get(p) == t.id else collected.get(p, p) for p in t.preds)
        )
        for t in tasks
    ]


def simulate(plan: Plan, costs: CostModel | CostModels) -> StepEstimate:
    """Predict one RL step of `plan`.

    `costs` is one cost model for every pool, or cost models by profile name
    (each set is costed with its pool's profile; see `cost_models_for`).
    """
    cms: CostModels = {"*": costs} if isinstance(costs, CostModel) else costs
    resident = [_resident_bytes(plan, i) for i in range(len(plan.sets))]
    costed, problems = _cost_calls(plan, cms, resident)
    notes: list[str] = []
    wl = plan.workload
    if wl.reward_function not in (None, "arith") and any(
        c.on_driver and c.phase is Phase.REWARD for c in costed
    ):
        notes.append(
            f"the reward function {wl.reward_function!r} is priced as the built-in arith "
            "checker's decode and scoring on the driver (the profile's rule_reward entries)"
        )
    staleness, warm_up, window = 0, 0, 1
    draws: tuple[Draw, ...] = ()
    if wl.asynchronous:
        if plan.generator_set() is None:
            notes.append(
                f"max_staleness {wl.max_staleness} needs a generator set apart from the "
                "trainer; simulated synchronously"
            )
        else:
            staleness = wl.max_staleness
            draws = _generation_draws(plan, cms, resident)
            warm_up = staleness + 2
            window = len(draws) or 2
    if staleness >= 2:
        actor_set = plan.set_of(Role.ACTOR)
        held = (staleness - 1) * _snapshot_bytes(plan)
        resident[actor_set] += held
        notes.append(
            f"staleness {staleness}: the trainer holds up to {staleness - 1} weight "
            f"snapshot(s) for the generator, {held:,.0f} bytes per GPU of set #{actor_set + 1}"
        )
    # One more step after the window when asynchronous: its weight sync (on the trainer
    # too with staleness 1) follows the window's last update, as in a longer run.
    num_steps = warm_up + window + (1 if staleness else 0)
    tasks = _tasks(plan, costed, num_steps, staleness, draws)
    raw_slots = schedule(
        tasks,
        _shared_cores(plan),
        _partner_waits(plan, cms),
        _slicings(plan, cms),
        _backgrounds(plan, cms),
    )
    sets_of = {t.id: t.sets for t in tasks}  # a k-step-off sync holds the generator only
    slots = _call_intervals(cast(dict[tuple[Any, ...], Span], raw_slots), sets_of)
    by_phase = {c.phase: c for c in costed}
    phases = tuple(
        PhaseInterval(
            name=phase,
            roles=by_phase[phase].roles,
            device_set=_drawn_on(sets_of[step, phase]),
            set_label=_set_label(plan, _drawn_on(sets_of[step, phase])),
            start_s=slot.start_s,
            end_s=slot.end_s,
            step=step,
            detail={**by_phase[phase].cost.detail, "wake_s": slot.wake_s}
            if slot.wake_s
            else by_phase[phase].cost.detail,
        )
        for (step, phase), slot in sorted(slots.items(), key=lambda kv: (kv[1].start_s, kv[0][0]))
        if step < warm_up + window  # the step after the window is not shown
    )
    step_end = [
        max(s.end_s for key, s in raw_slots.items() if cast(tuple[Any, ...], key)[0] == i)
        for i in range(num_steps)
    ]
    last = warm_up + window - 1
    iteration_s = (step_end[last] - step_end[warm_up - 1]) / window if staleness else step_end[0]
    sets, mem_problems = _set_estimates(plan, costed, resident, iteration_s)
    problems.extend(mem_problems)
    tokens = wl.batch.num_samples * (wl.batch.prompt_len + LengthModel.of(wl.batch).mean)
    feasible = not problems and math.isfinite(iteration_s)
    return StepEstimate(
        plan_name=plan.name,
        plan_hash=plan.content_hash(),
        profile_name="+".join(
            sorted({_cm(plan, cms, i).profile_name for i in range(len(plan.sets))})
        ),
        feasible=feasible,
        infeasible_reasons=tuple(problems),
        iteration_s=iteration_s,
        tokens_per_s=tokens / iteration_s if feasible else 0.0,
        samples_per_s=wl.batch.num_samples / iteration_s if feasible else 0.0,
        phases=phases,
        sets=tuple(sets),
        notes=tuple(notes),
        window=window,
    )


def _drawn_on(sets: tuple[int, ...]) -> int:
    """The set a phase is drawn on: its first; the controller's for the driver's work."""
    return sets[0] if sets else CONTROLLER


def _set_label(plan: Plan, device_set: int) -> str:
    return "controller" if device_set == CONTROLLER else plan.sets[device_set].label()


def _call_intervals(
    raw: Mapping[tuple[Any, ...], Span], sets_of: Mapping[Hashable, tuple[int, ...]]
) -> dict[tuple[int, Phase], Span]:
    """Each call's interval as the executor's clock draws it (`executor.timeline`).

    A call's work id is its (step, phase) pair; the driver's launches and gets around
    it add a third element (see _tasks). The interval runs from the call's start (after
    its launches) to the driver's last get of its results, and a call starts no earlier
    than the previous call on its sets ended that way: the next call may already run
    while the driver still takes the previous one's results."""
    out: dict[tuple[int, Phase], Span] = {}
    free: dict[int, float] = {}
    calls = sorted((k for k in raw if len(k) == 2), key=lambda k: (raw[k].start_s, k[0]))
    for key in calls:
        span = raw[key]
        end = raw.get((*key, COLLECT), span).end_s
        start = max([span.start_s, *(free.get(s, 0.0) for s in sets_of[key])])
        out[key[0], key[1]] = Span(id=key, start_s=min(start, end), end_s=end, wake_s=span.wake_s)
        for s in sets_of[key]:
            free[s] = end
    return out


def _set_estimates(
    plan: Plan, costed: list[_Call], resident: list[float], iteration_s: float
) -> tuple[list[SetEstimate], list[str]]:
    out, problems = [], []
    for i, s in enumerate(plan.sets):
        capacity = plan.pool_of(i).gpu.usable_bytes  # less the reserve (placeflow.hardware)
        mem = {"resident": resident[i]}
        busy = 0.0
        for c in costed:
            if i in c.sets:
                mem[c.phase.value] = resident[i] + c.cost.transient_bytes
                busy += c.cost.busy_s
        peak_phase = max(mem, key=lambda k: mem[k])
        peak = mem[peak_phase]
        if peak > capacity:
            owner = next((c.roles for c in costed if c.phase.value == peak_phase), s.roles)
            roles = "+".join(r.value for r in owner)
            problems.append(
                f"role {roles}, phase {peak_phase}: set #{i + 1} ({s.label()}) needs "
                f"{peak:,.0f} bytes per GPU of {capacity:,}; short by {peak - capacity:,.0f}"
            )
        util = (
            min(1.0, busy / iteration_s) if iteration_s > 0 and math.isfinite(iteration_s) else 0.0
        )
        out.append(
            SetEstimate(
                index=i,
                label=s.label(),
                pool=s.pool,
                num_devices=s.num_devices,
                capacity_bytes=capacity,
                resident_bytes=resident[i],
                memory_by_phase=mem,
                peak_memory_bytes=peak,
                busy_s=busy,
                utilisation=util,
                bubble_fraction=1.0 - util,
            )
        )
    return out, problems


def cost_models_for(plan: Plan, profile: str | None = None) -> dict[str, CostModel]:
    """Fitted cost models for the pools of `plan` (or `profile` for all of them)."""
    from placeflow.profiles.registry import fitted_cost_model

    if profile is not None:
        return {"*": fitted_cost_model(profile)}
    return {pool.profile: fitted_cost_model(pool.profile) for pool in plan.cluster.pools}
