"""simulate(plan, cost_model) -> StepEstimate: one RL step of a plan, phase by phase.

Steps: (1) the workload's dataflow graph; (2) each call's time and transient
memory on its device set (`callcosts`, `rolecosts`); (3) resident memory per set and the KV
capacity left for generation; (4) the transitions the placement needs
(`reshard` for a colocated actor, `weight_sync` for a generator apart); (5) the
discrete-event schedule; (6) memory feasibility per set and phase.

In one-step-off asynchronous mode (workload `async_one_step_off`, with a
generator set apart from the trainer) the graph is unrolled over three steps
in which step k+1's generation waits only for the weights of step k−1; the
iteration time is the steady-state distance between the ends of steps 2 and 3.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from typing import cast

from placeflow.dataflow import CallKind, dataflow_calls
from placeflow.layout import GenLayout, gen_shard_bytes
from placeflow.phases import Phase
from placeflow.plan import Plan
from placeflow.profiles.costmodel import CostModel
from placeflow.profiles.schema import Scope
from placeflow.simulator import callcosts, memory
from placeflow.simulator.estimate import PhaseInterval, SetEstimate, StepEstimate
from placeflow.simulator.lengths import LengthModel
from placeflow.simulator.rolecosts import (
    kv_bytes_per_seq,
    needs_reshard,
    reshard_scope,
    resident_bytes,
    role_call_costs,
    with_dispatch,
)
from placeflow.simulator.schedule import Span, Work, schedule
from placeflow.workload import Role

CONTROLLER = -1

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
    actor = plan.workload.models[Role.ACTOR]
    zero = plan.parallelism[Role.ACTOR].zero
    precision = plan.workload.generation_precision
    extra = (
        0.0
        if gen_set is not None
        else memory.colocated_gen_extra_bytes(actor, gen, zero, precision)
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


def _role_costs_on(
    plan: Plan,
    cms: CostModels,
    role: Role,
    set_index: int,
    gen: GenLayout | None,
    kv_seqs: int,
) -> dict[Phase, tuple[int, callcosts.CallCost]]:
    """`role`'s call costs on set `set_index`'s devices, priced with its pool's profile."""
    found = role_call_costs(
        plan.workload,
        role,
        plan.parallelism[role],
        _cm(plan, cms, set_index),
        first_device=plan.sets[set_index].first_device,
        gpus_per_node=plan.pool_of(set_index).gpus_per_node,
        gen=gen,
        kv_seqs=kv_seqs,
    )
    return {phase: (set_index, _contended(plan, set_index, c)) for phase, c in found.items()}


def _cost_calls(
    plan: Plan, cms: CostModels, resident: list[float]
) -> tuple[list[_Call], list[str]]:
    wl = plan.workload
    gen_set_index, kv_seqs, problem = _kv_seqs(plan, resident)
    costs: dict[Phase, tuple[int, callcosts.CallCost]] = {}
    for role in wl.roles:
        set_index = plan.set_of(role)
        gen = _gen_layout(plan) if role is Role.ACTOR and kv_seqs else None
        costs.update(_role_costs_on(plan, cms, role, set_index, gen, kv_seqs))
        if role is Role.ACTOR and kv_seqs and gen_set_index != set_index:
            # A generator set apart generates on its own pool's devices: its profile.
            on_gen = _role_costs_on(plan, cms, role, gen_set_index, gen, kv_seqs)
            for phase in (Phase.GENERATE, Phase.GENERATE_BASELINE):
                if phase in on_gen:
                    costs[phase] = on_gen[phase]
    if problem:
        infinite = callcosts.CallCost(time_s=math.inf, transient_bytes=0.0, busy_s=0.0)
        costs[Phase.GENERATE] = (gen_set_index, infinite)
    out: list[_Call] = []
    for call, preds in dataflow_calls(wl):
        if call.kind == CallKind.CONTROLLER:
            zero = callcosts.CallCost(time_s=0.0, transient_bytes=0.0, busy_s=0.0)
            out.append(_Call(phase=call.phase, roles=(), sets=(), cost=zero, preds=preds))
            continue
        assert call.role is not None
        set_index, cost = costs[call.phase]
        if call.kind == CallKind.GENERATE:
            set_index = gen_set_index
        out.append(
            _Call(phase=call.phase, roles=(call.role,), sets=(set_index,), cost=cost, preds=preds)
        )
    return _with_transitions(plan, cms, out), [problem] if problem else []


def _contended(plan: Plan, set_index: int, cost: callcosts.CallCost) -> callcosts.CallCost:
    """Stretch a call on CPU workers that share fewer cores than the set keeps busy.

    A phase of a set keeps all the set's devices busy; on a node with fewer
    physical cores than that (PoolSpec.cores_per_node) each worker gets
    cores / workers of a core. GPU pools are never stretched.
    """
    s, pool = plan.sets[set_index], plan.pool_of(set_index)
    nodes = {d // pool.gpus_per_node for d in s.devices()}
    per_node = max(sum(1 for d in s.devices() if d // pool.gpus_per_node == n) for n in nodes)
    factor = pool.contention(per_node)
    if factor == 1.0:
        return cost
    return dataclasses.replace(cost, time_s=cost.time_s * factor, busy_s=cost.busy_s * factor)


def _with_transitions(plan: Plan, cms: CostModels, costed: list[_Call]) -> list[_Call]:
    """Insert reshard (colocated actor) or weight_sync (generator apart) before generation."""
    actor = plan.workload.models[Role.ACTOR]
    actor_set, gen_set = plan.set_of(Role.ACTOR), plan.generator_set()
    gen = _gen_layout(plan)
    cm = _cm(plan, cms, actor_set)
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
            cm, actor, par.tg, par.pg, scope, lora=plan.workload.lora_of(Role.ACTOR)
        )
        phase, sets = Phase.WEIGHT_SYNC, (actor_set, gen_set)
    elif needs_reshard(gen, par.zero):
        scope = reshard_scope(
            plan.sets[actor_set].first_device, plan.pool_of(actor_set).gpus_per_node, gen
        )
        cost = callcosts.reshard_cost(cm, actor, gen, scope, train_zero=par.zero)
        phase, sets = Phase.RESHARD, (actor_set,)
    else:
        return costed
    # The transition is one Ray call per rank too; its bytes go over the collectives.
    cost = _contended(plan, actor_set, with_dispatch(cm, cost, 0))
    transition = _Call(phase=phase, roles=(Role.ACTOR,), sets=sets, cost=cost, preds=())
    result = [transition]
    for c in costed:
        if c.phase in (Phase.GENERATE, Phase.GENERATE_BASELINE):
            c = _Call(
                phase=c.phase, roles=c.roles, sets=c.sets, cost=c.cost, preds=(*c.preds, phase)
            )
        result.append(c)
    return result


def _hosts(plan: Plan, sets: tuple[int, ...]) -> tuple[tuple[Hashable, int], ...]:
    """(pool, node) -> devices of `sets` there, on pools whose cores are shared."""
    busy: dict[Hashable, int] = {}
    for i in sets:
        pool = plan.pool_of(i)
        if pool.cores_per_node is None:
            continue
        for d in plan.sets[i].devices():
            host = (pool.name, d // pool.gpus_per_node)
            busy[host] = busy.get(host, 0) + 1
    return tuple(busy.items())


def _shared_cores(plan: Plan) -> dict[Hashable, int]:
    """Cores of every node of the pools that declare them (`schedule`'s shared hosts)."""
    return {
        (pool.name, n): pool.cores_per_node
        for pool in plan.cluster.pools
        if pool.cores_per_node is not None
        for n in range(pool.num_nodes)
    }


def _tasks(plan: Plan, costed: list[_Call], num_steps: int) -> list[Work]:
    """Tasks of `num_steps` unrolled steps (one-step-off when num_steps > 1).

    Step k's calls after generation wait for step k−1's updates. The weight
    sync feeding generation k carries the weights of update k−2 and is ordered
    just before step k−1's calls, so that generation k overlaps training k−1.
    """
    order = {c.phase: i for i, c in enumerate(costed)}
    updates = [c.phase for c in costed if c.phase in (Phase.ACTOR_UPDATE, Phase.CRITIC_UPDATE)]
    generation = (Phase.WEIGHT_SYNC, Phase.GENERATE, Phase.GENERATE_BASELINE)
    tasks = []
    for k in range(num_steps):
        for c in costed:
            preds: list[Hashable] = [(k, p) for p in c.preds]
            priority = k * 100 + order[c.phase]
            if c.phase is Phase.WEIGHT_SYNC and k > 0:
                priority = (k - 1) * 100 - 1
                if k >= 2:
                    preds.append((k - 2, Phase.ACTOR_UPDATE))
            elif k > 0 and c.phase not in generation:
                preds.extend((k - 1, u) for u in updates)
            tasks.append(
                Work(
                    id=(k, c.phase),
                    sets=c.sets,
                    duration_s=c.cost.time_s,
                    preds=tuple(preds),
                    priority=priority,
                    hosts=_hosts(plan, c.sets),
                )
            )
    return tasks


def simulate(plan: Plan, costs: CostModel | CostModels) -> StepEstimate:
    """Predict one RL step of `plan`.

    `costs` is one cost model for every pool, or cost models by profile name
    (each set is costed with its pool's profile; see `cost_models_for`).
    """
    cms: CostModels = {"*": costs} if isinstance(costs, CostModel) else costs
    resident = [_resident_bytes(plan, i) for i in range(len(plan.sets))]
    costed, problems = _cost_calls(plan, cms, resident)
    notes: list[str] = []
    num_steps = 1
    if plan.workload.async_one_step_off:
        if plan.generator_set() is None:
            notes.append(
                "async_one_step_off needs a generator set apart from the trainer; "
                "simulated synchronously"
            )
        else:
            num_steps = 3
    raw_slots = schedule(_tasks(plan, costed, num_steps), _shared_cores(plan))
    # Work ids are (step, phase) pairs (see _tasks).
    slots = cast(dict[tuple[int, Phase], Span], raw_slots)
    by_phase = {c.phase: c for c in costed}
    phases = tuple(
        PhaseInterval(
            name=phase,
            roles=by_phase[phase].roles,
            device_set=by_phase[phase].sets[0] if by_phase[phase].sets else CONTROLLER,
            set_label=plan.sets[by_phase[phase].sets[0]].label()
            if by_phase[phase].sets
            else "controller",
            start_s=slot.start_s,
            end_s=slot.end_s,
            step=step,
            detail=by_phase[phase].cost.detail,
        )
        for (step, phase), slot in sorted(slots.items(), key=lambda kv: (kv[1].start_s, kv[0][0]))
    )
    step_end = [max(s.end_s for (k, _), s in slots.items() if k == i) for i in range(num_steps)]
    iteration_s = step_end[-1] - step_end[-2] if num_steps > 1 else step_end[0]
    sets, mem_problems = _set_estimates(plan, costed, resident, iteration_s)
    problems.extend(mem_problems)
    wl = plan.workload
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
    )


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
