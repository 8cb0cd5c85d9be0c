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
option of the same role, pool and count are dropped (Pareto pruning, by sort and
sweep: in lexicographic order a dominating option comes first, so each option is
checked once against the front kept so far, in one vectorised comparison).

On a large cluster the table is the search's biggest cost (one entry per
whole-node count). `build_cost_table` takes a deadline: it costs the GPU counts
coarse to fine (powers of two of nodes, then the counts between them by
bisection) and stops at the deadline, so the table always spans the cluster's
sizes; `CostTable.complete` says whether every count was costed.

`planner.generators` adds the actor's options for a generator set apart
(`RoleOption.gen_apart`, `CostTable.generators`).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING

import numpy as np

from placeflow.cluster import ClusterSpec, PoolSpec
from placeflow.phases import Phase
from placeflow.plan import RoleParallelism
from placeflow.planner.space import candidate_counts, parallelism_options
from placeflow.profiles.costmodel import CostModel
from placeflow.simulator import callcosts, memory
from placeflow.simulator.rolecosts import (
    kv_bytes_per_seq,
    needs_reshard,
    reshard_scope,
    resident_bytes,
    role_call_costs,
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


def _actor_options(
    wl: Workload, par: RoleParallelism, pool: PoolSpec, cm: CostModel, memo: dict
) -> list[tuple[int, dict[Phase, callcosts.CallCost], float]]:
    """(kv_seqs, costs incl. reshard, transient bytes) per KV budget for one actor layout.

    Generation and reshard depend only on the training layout, tg and the KV budget,
    the other calls not on tg or the budget: each part is costed once per key in
    `memo` (one count of one pool) rather than once per combination.
    """
    gen = par.gen_layout()
    per_seq = kv_bytes_per_seq(wl, gen)
    seqs_needed = math.ceil(wl.batch.num_samples / gen.num_replicas)
    cap = min(seqs_needed, wl.max_num_seqs)
    budgets = sorted(
        {min(cap, int(f * pool.gpu.usable_bytes // per_seq)) for f in KV_BUDGET_FRACTIONS}
    )
    out = []
    extra = memory.colocated_gen_extra_bytes(wl.models[Role.ACTOR], gen, par.zero)
    rest_key = ("rest", dataclasses.replace(par, tg=1))
    if rest_key not in memo:
        memo[rest_key] = role_call_costs(
            wl, Role.ACTOR, par, cm, first_device=0, gpus_per_node=pool.gpus_per_node
        )
    for kv_seqs in budgets:
        if kv_seqs < 1:
            continue
        gen_key = ("gen", par.train, par.tg, par.zero, kv_seqs)
        if gen_key not in memo:
            generation = role_call_costs(
                wl,
                Role.ACTOR,
                par,
                cm,
                first_device=0,
                gpus_per_node=pool.gpus_per_node,
                gen=gen,
                kv_seqs=kv_seqs,
            )
            memo[gen_key] = {p: c for p, c in generation.items() if p in GENERATION_STAGE}
            if needs_reshard(gen, par.zero):
                scope = reshard_scope(0, pool.gpus_per_node, gen)
                memo[gen_key][Phase.RESHARD] = callcosts.reshard_cost(
                    cm, wl.models[Role.ACTOR], gen, scope, train_zero=par.zero
                )
        costs = {**memo[rest_key], **memo[gen_key]}
        # The KV cache is gpu_memory_utilization of the memory generation finds free, so it
        # books kv/u: resident + extra + kv/u <= usable  <=>  kv <= u·(usable − resident − extra).
        out.append((kv_seqs, costs, extra + kv_seqs * per_seq / wl.gpu_memory_utilization))
    return out


def _options_for(
    wl: Workload, role: Role, pool: PoolSpec, n: int, cm: CostModel
) -> tuple[list[RoleOption], float, str]:
    """Pareto-optimal options of `role` on n GPUs of `pool`, and the smallest shortfall."""
    model = wl.models[role]
    capacity = pool.gpu.usable_bytes
    found: list[RoleOption] = []
    best_short, best_reason = math.inf, ""
    memo: dict = {}
    for par in parallelism_options(model, role, n, pool):
        resident = resident_bytes(model, role, par)
        if role is Role.ACTOR:
            variants = _actor_options(wl, par, pool, cm, memo)
        else:
            costs = role_call_costs(
                wl, role, par, cm, first_device=0, gpus_per_node=pool.gpus_per_node
            )
            variants = [(0, costs, 0.0)]
        for kv_seqs, costs, gen_bytes in variants:
            transient = max(
                [
                    gen_bytes,
                    *(c.transient_bytes for p, c in costs.items() if p not in GENERATION_STAGE),
                ]
            )
            short = resident + transient - capacity
            if short > 0:
                if short < best_short:
                    best_short = short
                    best_reason = (
                        f"{n} x {pool.name} with p={par.train.p} t={par.train.t} "
                        f"d={par.train.d} e={par.train.e} zero={par.zero} "
                        f"micro_batch={par.micro_batch}"
                    )
                continue
            found.append(
                RoleOption(
                    role=role,
                    pool=pool.name,
                    num_gpus=n,
                    par=par,
                    kv_seqs=kv_seqs,
                    stage_s=_stage_times(costs),
                    resident_bytes=resident,
                    transient_bytes=transient,
                )
            )
    kept = pareto_front(found)
    return kept, best_short, best_reason


def _criteria(o: RoleOption) -> tuple[float, ...]:
    return (*o.stage_s, o.resident_bytes, o.transient_bytes)


def pareto_front(options: Sequence[RoleOption]) -> list[RoleOption]:
    """The options no other option dominates, in their given order, by sort and sweep.

    Sorted lexicographically by their criteria, an option can only be dominated
    by one before it, so one pass checks each against the front kept so far.
    Options with equal criteria are all kept (they differ in layout).
    """
    order = sorted(range(len(options)), key=lambda i: _criteria(options[i]))
    front = np.empty((len(options), 5))
    num_kept = 0
    kept = set()
    for i in order:
        c = np.asarray(_criteria(options[i]))
        f = front[:num_kept]
        if num_kept and np.any(np.all(f <= c, axis=1) & np.any(f < c, axis=1)):
            continue
        front[num_kept] = c
        num_kept += 1
        kept.add(i)
    return [o for i, o in enumerate(options) if i in kept]


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
    options: dict[TableKey, list[RoleOption]] = {}
    shortfall: dict[Role, tuple[float, str]] = {}
    # Interleaved across pools, so that a deadline leaves every pool some counts.
    ranked = [
        (rank, i, pool, n)
        for i, pool in enumerate(cluster.pools)
        for rank, n in enumerate(coarse_to_fine(candidate_counts(pool)))
    ]
    work = [(pool, n) for _, _, pool, n in sorted(ranked, key=lambda r: r[:2])]
    for done, (pool, n) in enumerate(work):
        if deadline is not None and done and time.process_time() > deadline:
            return CostTable(options=options, shortfall=shortfall, complete=False)
        for role in wl.roles:
            opts, short, reason = _options_for(wl, role, pool, n, cms[pool.profile])
            if opts:
                options[(role, pool.name, n)] = opts
            elif short < shortfall.get(role, (math.inf, ""))[0]:
                shortfall[role] = (short, reason)
        if progress:
            progress(done + 1, len(work))
    return CostTable(options=options, shortfall=shortfall)
