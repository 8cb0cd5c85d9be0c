"""The cost table: every role's options on every candidate GPU count, costed once.

An option is one (pool, GPU count, parallelism[, KV budget]) for one role,
with its time in each stage of the step, the bytes it keeps on each GPU
(`resident_bytes`) and the most it adds during one of its calls
(`transient_bytes`). Costs come from the simulator's phase model
(`placeflow.simulator.rolecosts`), so that the solver and the simulator agree.

Stages: the step's dataflow has three barriers, so its time is the sum of
three stages: generation (the actor, after its reshard), the forward calls
(reference, old log-probs, values, rewards, costs) and the updates.

The actor's generation time depends on how many sequences' KV cache fit,
which depends on what is colocated with it. The table offers the actor a few
KV budgets (fractions of device memory); the memory constraint then charges
the chosen budget to the actor's set. The full simulator, which re-scores the
top plans, gives generation all the memory left.

Options dominated in every stage time and both memory figures by another
option of the same role, pool and count are dropped (Pareto pruning on arrays,
`planner.pareto`; options are built for the front only).

Each call is priced once per distinct key (`_Prices`): a call's cost depends
on a few fields of the parallelism (`rolecosts.call_key`), so the forward
calls are shared by the memory-saver choices and tg, the updates by tg,
generation by every layout with the same tg, pg and number of replicas, and
the reshard by the micro-batch and savers; the actor's trainer
options (generation apart) reuse the same priced calls. The costs are the
simulator's `rolecosts.call_cost`, so an option's numbers are those the
simulator's `role_call_costs` gives it (`tests/test_planner_table_oracle.py`
checks the table against pricing every option in full).

On a large cluster the table is the search's biggest cost (one entry per
whole-node count). `build_cost_table` takes a deadline: it costs the GPU counts
coarse to fine (powers of two of nodes, then the counts between them by
bisection) and stops at the deadline, so the table always spans the cluster's
sizes; `CostTable.complete` says whether every count was costed.

`planner.generators` adds the actor's options for a generator set apart
(`RoleOption.gen_apart`, `CostTable.generators`).
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING

import numpy as np

from placeflow.cluster import ClusterSpec, PoolSpec
from placeflow.dataflow import CallKind, ModelCall
from placeflow.layout import GenLayout
from placeflow.phases import Phase
from placeflow.plan import RoleParallelism
from placeflow.planner.pareto import pareto_mask
from placeflow.planner.space import candidate_counts, parallelism_options
from placeflow.profiles.costmodel import CostModel
from placeflow.simulator import callcosts
from placeflow.simulator.rolecosts import (
    call_cost,
    call_key,
    colocated_generation_bytes,
    kv_bytes_per_seq,
    reshard_placement,
    resident_bytes,
    resident_key,
    role_calls,
    rollout_sync_cost,
)
from placeflow.workload import Role, Workload

if TYPE_CHECKING:
    from placeflow.planner.generators import GeneratorOption

KV_BUDGET_FRACTIONS = (0.15, 0.3, 0.5, 0.7)
GENERATION_STAGE = (Phase.RESHARD, Phase.GENERATE, Phase.GENERATE_BASELINE)
UPDATE_STAGE = (Phase.ACTOR_UPDATE, Phase.CRITIC_UPDATE)
NUM_STAGES = 3


def stage_of(phase: Phase) -> int:
    if phase in GENERATION_STAGE:
        return 0
    return 2 if phase in UPDATE_STAGE else 1


@dataclass(frozen=True, kw_only=True)
class RoleOption:
    role: Role
    pool: str
    num_gpus: int
    par: RoleParallelism
    kv_seqs: int  # actor only: sequences whose KV cache the budget holds; 0 otherwise
    stage_s: tuple[float, float, float]
    resident_bytes: float
    transient_bytes: float
    # Actor only: generation runs on a generator set apart (planner.generators), so this
    # option costs the training set's calls without generation, reshard or KV cache.
    gen_apart: bool = False

    def dominates(self, other: RoleOption) -> bool:
        mine = (*self.stage_s, self.resident_bytes, self.transient_bytes)
        theirs = (*other.stage_s, other.resident_bytes, other.transient_bytes)
        return all(a <= b for a, b in zip(mine, theirs, strict=True)) and mine != theirs


TableKey = tuple[Role, str, int]  # role, pool name, GPU count


TIME_STEPS = 20_000


@dataclass(frozen=True, kw_only=True)
class CostTable:
    options: dict[TableKey, list[RoleOption]]
    # Smallest memory shortfall seen per role (bytes per GPU), for infeasibility reasons.
    shortfall: dict[Role, tuple[float, str]]
    complete: bool = True  # False when the deadline stopped the build before every count
    # The actor's generator-set options (planner.generators); empty: always colocated.
    generators: tuple[GeneratorOption, ...] = ()
    # The actor's options that leave generation to a generator set (gen_apart), costed
    # with the others; `planner.generators.with_generators` adds them to `options`.
    trainer_options: dict[TableKey, list[RoleOption]] = field(default_factory=dict)

    @cached_property
    def time_unit_s(self) -> float:
        """The solver's time unit: the longest option stage in TIME_STEPS steps (>= 1 µs).

        Integers scaled to the problem keep the model's numbers small, which makes
        CP-SAT's proofs fast; the final ranking uses the simulator's exact times.
        """
        longest = max((max(o.stage_s) for opts in self.options.values() for o in opts), default=0.0)
        return max(1e-6, longest / TIME_STEPS)

    def to_units(self, seconds: float) -> int:
        return round(seconds / self.time_unit_s)


def _stage_times(costs: dict[Phase, callcosts.CallCost]) -> tuple[float, float, float]:
    stages = [0.0] * NUM_STAGES
    for phase, cost in costs.items():
        stages[stage_of(phase)] += cost.time_s
    return stages[0], stages[1], stages[2]


class _Prices:
    """The calls of one role on one (pool, count), each priced once per distinct key.

    A call's cost depends on a few fields of the parallelism only
    (`rolecosts.call_key`): the forward calls not on the memory savers or tg, the
    updates not on tg, generation on tg, pg, the number of replicas and the KV
    budget, the reshard on the layout, tg and ZeRO. Options that share those share
    the priced call.
    """

    def __init__(self, wl: Workload, role: Role, pool: PoolSpec, cm: CostModel) -> None:
        self.wl, self.role, self.pool, self.cm = wl, role, pool, cm
        calls = role_calls(wl, role)
        self.rest = tuple(c for c in calls if c.kind != CallKind.GENERATE)
        self.generate = tuple(c for c in calls if c.kind == CallKind.GENERATE)
        self._memo: dict[tuple[object, ...], callcosts.CallCost] = {}
        self._resident: dict[tuple[object, ...], float] = {}
        self._kv: dict[tuple[object, ...], list[tuple[int, float]]] = {}
        self._generation: dict[tuple[object, ...], float] = {}
        self._generate: dict[tuple[object, ...], float] = {}
        self._reshards: dict[tuple[object, ...], callcosts.CallCost] = {}

    def _price(self, call: ModelCall, par: RoleParallelism) -> callcosts.CallCost:
        key = (call.phase, *call_key(call, par))
        hit = self._memo.get(key)
        if hit is None:
            hit = self._memo[key] = call_cost(
                self.wl, call, par, self.cm, first_device=0, gpus_per_node=self.pool.gpus_per_node
            )
        return hit

    def resident(self, par: RoleParallelism) -> float:
        key = resident_key(par)
        hit = self._resident.get(key)
        if hit is None:
            hit = self._resident[key] = resident_bytes(
                self.wl.models[self.role], self.role, par, self.wl.lora_of(self.role)
            )
        return hit

    def kv_variants(self, par: RoleParallelism) -> list[tuple[int, float]]:
        """The actor's (KV budget, generation transient bytes) for one layout: each budget
        (sequences per replica, >= 1) with the generation weights it adds and its cache."""
        key = (par.train, par.tg, par.pg, par.zero, par.offload_params)
        kv = self._kv.get(key)
        if kv is None:
            budgets, per_seq = _kv_budgets(self.wl, par, self.pool)
            extra = colocated_generation_bytes(self.wl, par)
            u = self.wl.gpu_memory_utilization
            kv = self._kv[key] = [(b, extra + b * per_seq / u) for b in budgets]
        return kv

    def rest_costs(self, par: RoleParallelism) -> dict[Phase, callcosts.CallCost]:
        """Every call but generation, in the dataflow's order."""
        return {c.phase: self._price(c, par) for c in self.rest}

    def generation_s(self, par: RoleParallelism, kv_seqs: int) -> float:
        """The actor's generation stage with `kv_seqs` of KV budget: its generation calls,
        then its reshard (summed in that order, as `_stage_times` sums a call dict)."""
        key = (par.train, par.tg, par.pg, par.zero, par.offload_params, kv_seqs)
        hit = self._generation.get(key)
        if hit is None:
            gen = par.gen_layout()
            hit = self._generate_s(par, gen, kv_seqs)
            hit += self._reshard(par, gen).time_s
            self._generation[key] = hit
        return hit

    def _generate_s(self, par: RoleParallelism, gen: GenLayout, kv_seqs: int) -> float:
        """The generation calls' seconds, summed from 0.0 in the dataflow's order; shared by
        the layouts with the same `call_key` (tg, pg, replicas) and KV budget."""
        key = (*call_key(self.generate[0], par), kv_seqs) if self.generate else ()
        hit = self._generate.get(key)
        if hit is None:
            hit = 0.0
            for c in self.generate:
                hit += call_cost(
                    self.wl,
                    c,
                    par,
                    self.cm,
                    first_device=0,
                    gpus_per_node=self.pool.gpus_per_node,
                    gen=gen,
                    kv_seqs=kv_seqs,
                ).time_s
            self._generate[key] = hit
        return hit

    def _reshard(self, par: RoleParallelism, gen: GenLayout) -> callcosts.CallCost:
        key = (par.train, par.tg, par.pg, par.zero)
        hit = self._reshards.get(key)
        if hit is None:
            scope, per_node = reshard_placement(0, self.pool.gpus_per_node, gen)
            hit = self._reshards[key] = rollout_sync_cost(
                self.cm,
                self.wl.models[Role.ACTOR],
                gen,
                scope,
                train_zero=par.zero,
                ranks_per_node=per_node,
            )
        return hit


def _kv_budgets(wl: Workload, par: RoleParallelism, pool: PoolSpec) -> tuple[list[int], float]:
    """The actor's KV budgets (sequences per replica, >= 1) for one layout, and the bytes
    one sequence's KV cache takes per GPU."""
    gen = par.gen_layout()
    per_seq = kv_bytes_per_seq(wl, gen)
    seqs_needed = math.ceil(wl.batch.num_samples / gen.num_replicas)
    cap = min(seqs_needed, wl.max_num_seqs)
    budgets = sorted(
        {min(cap, int(f * pool.gpu.usable_bytes // per_seq)) for f in KV_BUDGET_FRACTIONS}
    )
    return [b for b in budgets if b >= 1], per_seq


@dataclass(frozen=True, kw_only=True)
class _Found:
    """A role's options on one (pool, count): its front, the actor's trainer options
    (generation apart), and the smallest memory shortfall of the options that do not fit."""

    front: list[RoleOption]
    apart: list[RoleOption]
    shortfall: float
    where: str


def _where(n: int, pool: PoolSpec, par: RoleParallelism) -> str:
    return (
        f"{n} x {pool.name} with p={par.train.p} t={par.train.t} "
        f"d={par.train.d} e={par.train.e} zero={par.zero} "
        f"micro_batch={par.micro_batch}"
    )


def _front_of(
    rows: list[tuple[RoleParallelism, int, tuple[float, float, float], float, float]],
    role: Role,
    pool: str,
    n: int,
    gen_apart: bool = False,
) -> list[RoleOption]:
    """The rows (par, kv_seqs, stage times, resident, transient) no other dominates, as
    options, in their given order."""
    if not rows:
        return []
    crit = np.array([(*s, res, tr) for _, _, s, res, tr in rows], dtype=float)
    keep = pareto_mask(crit)
    return [
        RoleOption(
            role=role,
            pool=pool,
            num_gpus=n,
            par=par,
            kv_seqs=kv_seqs,
            stage_s=stages,
            resident_bytes=res,
            transient_bytes=tr,
            gen_apart=gen_apart,
        )
        for (par, kv_seqs, stages, res, tr), k in zip(rows, keep, strict=True)
        if k
    ]


def _options_for(wl: Workload, role: Role, pool: PoolSpec, n: int, cm: CostModel) -> _Found:
    """Pareto-optimal options of `role` on n GPUs of `pool`, and the smallest shortfall.

    For the actor, each layout is offered with each KV budget that fits (the KV
    cache is gpu_memory_utilization of the memory generation finds free, so it
    books kv/u: resident + extra + kv/u <= usable), and, with tg = 1, as a
    trainer whose generation runs apart (no generation, reshard or KV cache).
    """
    model = wl.models[role]
    capacity = pool.gpu.usable_bytes
    prices = _Prices(wl, role, pool, cm)
    found: list = []
    apart: list = []
    best_short, best_where = math.inf, ""
    seq_len = wl.batch.prompt_len + wl.batch.response_len
    for par in parallelism_options(model, role, n, pool, seq_len=seq_len):
        resident = prices.resident(par)
        rest = prices.rest_costs(par)
        rest_transient = max((c.transient_bytes for c in rest.values()), default=0.0)
        rest_stages = _stage_times(rest)
        if role is not Role.ACTOR:
            variants: list[tuple[int, float]] = [(0, 0.0)]
        else:
            if par.tg == 1 and resident + rest_transient <= capacity:
                apart.append((par, 0, rest_stages, resident, rest_transient))
            variants = prices.kv_variants(par)
        for kv_seqs, gen_bytes in variants:
            transient = max(gen_bytes, rest_transient)
            short = resident + transient - capacity
            if short > 0:
                if short < best_short:
                    best_short, best_where = short, _where(n, pool, par)
                continue
            stages = rest_stages
            if kv_seqs:  # the rest has no generation-stage call
                stages = (prices.generation_s(par, kv_seqs), rest_stages[1], rest_stages[2])
            found.append((par, kv_seqs, stages, resident, transient))
    return _Found(
        front=_front_of(found, role, pool.name, n),
        apart=_front_of(apart, role, pool.name, n, gen_apart=True),
        shortfall=best_short,
        where=best_where,
    )


def pareto_front(options: Sequence[RoleOption]) -> list[RoleOption]:
    """The options no other option dominates, in their given order (equal ones all kept)."""
    crit = np.array(
        [(*o.stage_s, o.resident_bytes, o.transient_bytes) for o in options], dtype=float
    ).reshape(len(options), NUM_STAGES + 2)
    return [o for o, k in zip(options, pareto_mask(crit), strict=True) if k]


def coarse_to_fine(counts: Sequence[int]) -> list[int]:
    """`counts` (sorted) reordered so that every prefix spans them: the smallest, the
    largest and the powers of two first, then the counts between by bisection."""
    n = len(counts)
    if n <= 2:
        return list(counts)
    first = sorted({0, n - 1, *(i for i, c in enumerate(counts) if c & (c - 1) == 0)})
    order, seen = list(first), set(first)
    gaps = list(itertools.pairwise(first))
    while gaps:
        nxt = []
        for lo, hi in gaps:
            if hi - lo > 1:
                mid = (lo + hi) // 2
                if mid not in seen:
                    seen.add(mid)
                    order.append(mid)
                nxt += [(lo, mid), (mid, hi)]
        gaps = nxt
    return [counts[i] for i in order]


def build_cost_table(
    wl: Workload,
    cluster: ClusterSpec,
    cms: dict[str, CostModel],
    *,
    deadline: float | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> CostTable:
    """Cost every role's options on every candidate count of every pool.

    `deadline` (a `time.process_time()` value: CPU time, so that the machine's load
    does not change the table) stops the build after the count it
    is on; the counts are costed coarse to fine, so the table spans every pool's
    sizes. `progress(done, total)` is called after each count.
    """
    with _gc_paused():
        return _build(wl, cluster, cms, deadline=deadline, progress=progress)


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """The cyclic garbage collector off for the block, back as it was after.

    The table allocates a few hundred thousand objects that live on (the priced
    calls, the options), and each allocation burst triggers the collector, whose
    full passes walk every object of the process (torch's included): PPO 4 x 13B
    @128's search took a median 1.90 CPU s with the pause against 2.27 without
    (README, planner speed; `benchmarks/planner_before_after.py`). The table
    makes few reference cycles (48 objects at PPO 4 x 13B @128); the collector frees
    them once it is back on.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _build(
    wl: Workload,
    cluster: ClusterSpec,
    cms: dict[str, CostModel],
    *,
    deadline: float | None,
    progress: Callable[[int, int], None] | None,
) -> CostTable:
    options: dict[TableKey, list[RoleOption]] = {}
    shortfall: dict[Role, tuple[float, str]] = {}
    apart: dict[TableKey, list[RoleOption]] = {}
    # Interleaved across pools, so that a deadline leaves every pool some counts.
    ranked = [
        (rank, i, pool, n)
        for i, pool in enumerate(cluster.pools)
        for rank, n in enumerate(coarse_to_fine(candidate_counts(pool)))
    ]
    work = [(pool, n) for _, _, pool, n in sorted(ranked, key=lambda r: r[:2])]
    for done, (pool, n) in enumerate(work):
        if deadline is not None and done and time.process_time() > deadline:
            return CostTable(
                options=options, shortfall=shortfall, complete=False, trainer_options=apart
            )
        for role in wl.roles:
            found = _options_for(wl, role, pool, n, cms[pool.profile])
            if found.front:
                options[(role, pool.name, n)] = found.front
            elif found.shortfall < shortfall.get(role, (math.inf, ""))[0]:
                shortfall[role] = (found.shortfall, found.where)
            if found.apart:
                apart[(role, pool.name, n)] = found.apart
        if progress:
            progress(done + 1, len(work))
    return CostTable(options=options, shortfall=shortfall, trainer_options=apart)
