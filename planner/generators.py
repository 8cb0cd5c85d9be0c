"""The actor's generator-set options: generation on a set of its own, apart from training.

A plan may give the actor a generator set (`DeviceSet.generator`): the actor
trains on its set and generates on m devices of its own, and each step
begins with a bucketed weight sync from trainer to generator
(`simulator.calls.weight_sync_cost`, the DisjointPlan of
`placeflow.reshard_plan`). Two kinds of option describe such plans:

- Trainer options (`RoleOption` with gen_apart): the actor's layouts on n
  devices of pool q costed without generation, reshard or KV cache — its
  stage times are the forward and update calls only, its transient memory the
  largest of those calls'. The cost table builds them with the colocated
  options, from the same priced calls (`CostTable.trainer_options`).
- Generator options (`GeneratorOption`): m devices of pool q', a generation
  tensor size tg, and the weight sync from a trainer on pool q. With pg = 1
  (see planner.space) the generator runs dg = m/tg replicas of tg ranks; each
  rank holds the generation shard W_g = M/tg (no gradients, no optimizer) and
  the KV cache of
      c = min(⌈B/dg⌉, ⌊(C_q' − W_g)/kv⌋)
  sequences, kv the KV bytes of one sequence per rank (prompt + maximum
  response), B the samples to generate. Its times: gen_s, the generation calls
  (`generate`, and ReMax's greedy `generate_baseline`) with that KV capacity,
  and sync_s, the weight sync of W_g in buckets. Counts m follow the same rule
  as other sets (`space.candidate_counts`); tg is a power of two within a node
  that divides m and agrees with the heads and KV heads.

The weight sync is costed across nodes unless the pool has a single node (then
trainer and generator share it); the simulator, which re-scores plans, sees
where the devices actually are.

Pruning: a generator option only interacts with the rest of the model through
its device count m (the pool budget and the GPU objectives) and its stage
loads, sync_s on the trainer's set and sync_s + gen_s on its own (it holds no
other role, so its memory is checked here). Options dominated in
(m, sync_s + gen_s, sync_s) by another with the same pools are dropped.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass
from typing import TypeVar

from placeflow.cluster import ClusterSpec, PoolSpec
from placeflow.layout import TrainLayout
from placeflow.plan import RoleParallelism
from placeflow.planner.costtable import CostTable, RoleOption, stage_of
from placeflow.planner.space import _powers_of_two, candidate_counts
from placeflow.planner.variables import MIB
from placeflow.profiles.costmodel import CostModel
from placeflow.profiles.schema import Scope
from placeflow.simulator import callcosts
from placeflow.simulator.memory import (
    generation_weight_bytes,
    kv_capacity_seqs,
    weight_bytes_per_gpu,
)
from placeflow.simulator.rolecosts import kv_bytes_per_seq, role_call_costs
from placeflow.workload import Role, Workload


@dataclass(frozen=True, kw_only=True)
class GeneratorOption:
    """The actor generating on `num_gpus` devices of `pool`, trained on `trainer_pool`."""

    trainer_pool: str
    pool: str
    num_gpus: int
    tg: int
    kv_seqs: int  # sequences whose KV cache each generation replica holds
    gen_s: float  # generation calls on the generator set
    sync_s: float  # trainer -> generator weight sync (both sets busy)
    resident_bytes: float  # generation shard M/tg per device
    transient_bytes: float  # KV cache of the largest generation call per device

    @property
    def load_s(self) -> float:
        """The generator set's load in the generation stage: sync, then generation."""
        return self.sync_s + self.gen_s

    def dominates(self, other: GeneratorOption) -> bool:
        mine = (self.num_gpus, self.load_s, self.sync_s)
        theirs = (other.num_gpus, other.load_s, other.sync_s)
        return all(a <= b for a, b in zip(mine, theirs, strict=True)) and mine != theirs


_Option = TypeVar("_Option", RoleOption, GeneratorOption)


def _pareto(options: list[_Option]) -> list[_Option]:
    """Options no other option dominates (the first of equal ones kept)."""
    kept: list[_Option] = []
    for opt in options:
        if any(k.dominates(opt) or k == opt for k in kept):
            continue
        kept = [k for k in kept if not opt.dominates(k)] + [opt]
    return kept


def _generation_tgs(wl: Workload, pool: PoolSpec, m: int) -> list[int]:
    actor = wl.models[Role.ACTOR]
    return [
        tg
        for tg in _powers_of_two(min(m, pool.gpus_per_node))
        if m % tg == 0 and actor.supports_tp(tg)
    ]


def generator_option(
    wl: Workload,
    trainer: tuple[PoolSpec, CostModel],
    pool: PoolSpec,
    cm: CostModel,
    m: int,
    tg: int,
) -> GeneratorOption | None:
    """The generator on m devices of `pool` with tensor size tg; None if no KV cache fits."""
    trainer_pool, trainer_cm = trainer
    actor = wl.models[Role.ACTOR]
    par = RoleParallelism(train=TrainLayout(p=1, t=tg, d=m // tg), tg=tg, pg=1)
    gen = par.gen_layout(m)
    shard = weight_bytes_per_gpu(actor, tg, 1, value_head=False)
    # An FP8 generator holds 1 byte per parameter (memory.generation_weight_bytes).
    shard *= generation_weight_bytes(actor, wl.generation_precision) / actor.num_bytes()
    lora = wl.lora_of(Role.ACTOR)
    if lora is not None:  # the generator keeps the base and loads the adapters (lora.py)
        shard += lora.params(actor) * actor.dtype.num_bytes / tg
    # Whole MiB, as the memory constraints count them (planner.variables).
    free = (pool.gpu.usable_bytes // MIB - math.ceil(shard / MIB)) * MIB
    needed = math.ceil(wl.batch.num_samples / gen.num_replicas)
    kv_seqs = min(
        needed,
        kv_capacity_seqs(
            free, kv_bytes_per_seq(wl, gen), wl.gpu_memory_utilization, wl.max_num_seqs
        ),
    )
    if kv_seqs < 1:
        return None
    costs = role_call_costs(
        wl,
        Role.ACTOR,
        par,
        cm,
        first_device=0,
        gpus_per_node=pool.gpus_per_node,
        gen=gen,
        kv_seqs=kv_seqs,
    )
    generation = [c for phase, c in costs.items() if stage_of(phase) == 0]
    one_node = trainer_pool.name == pool.name and pool.num_nodes == 1
    sync = callcosts.weight_sync_cost(
        trainer_cm,
        actor,
        tg,
        1,
        Scope.INTRA if one_node else Scope.INTER,
        lora=lora,
    )
    return GeneratorOption(
        trainer_pool=trainer_pool.name,
        pool=pool.name,
        num_gpus=m,
        tg=tg,
        kv_seqs=kv_seqs,
        gen_s=sum(c.time_s for c in generation),
        sync_s=sync.time_s,
        resident_bytes=shard,
        transient_bytes=max(c.transient_bytes for c in generation),
    )


def with_generators(
    table: CostTable,
    wl: Workload,
    cluster: ClusterSpec,
    cms: dict[str, CostModel],
    *,
    deadline: float | None = None,
) -> CostTable:
    """`table` plus the actor's trainer options and the Pareto-optimal generator options.

    Only the GPU counts the table costed are considered (a table cut short by its
    deadline limits these too), and none after `deadline` (time.process_time()).
    """
    options = {key: list(opts) for key, opts in table.options.items()}
    costed = {(pool_name, n) for (_, pool_name, n) in table.options}

    def counts(pool: PoolSpec) -> list[int]:
        if deadline is not None and time.process_time() > deadline:
            return []
        return [n for n in candidate_counts(pool) if (pool.name, n) in costed]

    trainer_pools = []
    for pool in cluster.pools:
        for n in counts(pool):
            apart = table.trainer_options.get((Role.ACTOR, pool.name, n), [])
            if apart:
                options.setdefault((Role.ACTOR, pool.name, n), []).extend(apart)
                if pool not in trainer_pools:
                    trainer_pools.append(pool)
    generators: list[GeneratorOption] = []
    for trainer in trainer_pools:
        for pool in cluster.pools:
            found = [
                g
                for m in counts(pool)
                for tg in _generation_tgs(wl, pool, m)
                if (
                    g := generator_option(
                        wl, (trainer, cms[trainer.profile]), pool, cms[pool.profile], m, tg
                    )
                )
                is not None
            ]
            generators.extend(_pareto(found))
    if not generators:
        return table
    return dataclasses.replace(table, options=options, generators=tuple(generators))
