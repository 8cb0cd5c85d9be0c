"""Naive baselines of the reshard and the weight sync, and spawned gloo worlds that run them.

Not part of the executor: what `benchmarks/reshard_bench.py` measures the
executor's transfers against, and what the tests run them in
(tests/test_reshard.py, test_weight_sync.py, test_moe_exec.py; pytest puts this
folder on `sys.path`).

Baselines:
- `reshard_naive`: colocated, every weight all-gathered whole over the world
  (every rank sends its shard, or zeros if its stage lacks the weight),
  rebuilt, then sliced;
- `sync_naive`: disjoint sets, verl's way: every full tensor is assembled on
  trainer rank 0 and sent whole to every generator rank, which slices its
  shard out.

Both count the bytes a rank moves and the peak of the extra bytes it holds at
once (`MemoryMeter`), as the executor's `reshard_colocated` and `sync_disjoint`
do. `run_world` / `run_sync` spawn one process per rank (gloo over 127.0.0.1,
"spawn" start method) through `placeflow.procs`: a rank that raises, dies or
hangs ends the world with a `ReshardError` naming it. Each case runs each
method `warmup` times untimed, then `repeats` times; a repeat lasts as long as
its slowest rank. Callers that spawn guard their entry point with
`if __name__ == "__main__":`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from functools import partial
from typing import Any

import torch
import torch.distributed as dist

from placeflow.executor.errors import ExecutorError
from placeflow.executor.reshard import (
    MemoryMeter,
    Params,
    all_gather,
    full_params,
    place,
    reshard_colocated,
    take,
    train_params,
)
from placeflow.executor.weight_sync import generator_shard_ranges, shard_rows, sync_disjoint
from placeflow.layout import GenLayout, TrainLayout
from placeflow.procs import join_gloo_world, report_rank, run_ranks
from placeflow.reshard_plan import (
    GeneratorLayout,
    ParamSpec,
    Range,
    TinyLlama,
    expert_groups,
    gen_shard,
    plan_disjoint,
    plan_reshard,
    train_shard,
)


class ReshardError(ExecutorError):
    """A rank of a spawned world failed, died or hung; the message carries its traceback."""


class Method(StrEnum):
    PLANNED = "planned"  # the executor's: micro-DP all-gather (HybridFlow) / planned buckets
    NAIVE = "naive"  # the baseline: full tensors to every rank, then sliced


class WorldLink:
    """The default torch.distributed world as the weight sync's `Link` (every rank of the
    sync is a world rank)."""

    def send(self, tensor: torch.Tensor, dst: int) -> None:
        dist.send(tensor, dst=dst)

    def post(self, tensor: torch.Tensor, dst: int) -> dist.Work:
        work = dist.isend(tensor, dst=dst)
        assert work is not None  # None only for ranks outside the group
        return work

    def recv(self, tensor: torch.Tensor, src: int) -> None:
        dist.recv(tensor, src=src)


# --- tensors ------------------------------------------------------------------


# The full weights and a rank's training shards cut from them: `executor.reshard`'s
# (`full_params`, `take`, `train_params`), which the profiler's reshard probe uses too.


def _owners(model: TinyLlama, param: ParamSpec, train: TrainLayout) -> list[int]:
    """The trainer ranks whose shards make up `param` (its stage, every TP rank, the first
    DP replica or, for a routed expert, the EP rank that holds it)."""
    stage = param.stage(train.stage_layers(model.num_layers))
    dp = model.expert_rank(param, train.e) if param.expert >= 0 else 0
    return [train.rank(pp=stage, tp=tp, dp=dp) for tp in range(train.t)]


# --- the baselines ------------------------------------------------------------------


def reshard_naive(
    model: TinyLlama, gen: GenLayout, rank: int, shards: Params, meter: MemoryMeter
) -> tuple[Params, int]:
    """All-gather each whole weight to all ranks, rebuild, slice; (weights, bytes in)."""
    train, world = gen.train, gen.train.world_size
    out: Params = {}
    received = 0
    for p in model.params():
        owners = _owners(model, p, train)
        n = p.numel_of(train_shard(model, p, train, owners[0]) or ())
        own = shards.get(p.name)
        send = own.reshape(-1) if own is not None else meter.hold(torch.zeros(n))
        buf = meter.hold(torch.empty(world * n))
        all_gather(buf, send)
        full = meter.hold(torch.empty(p.shape))
        whole = (Range(start=0, length=p.shape[p.dim]),)
        for src_rank in owners:  # a replicated weight is rebuilt t times: same values
            src = train_shard(model, p, train, src_rank) or ()
            piece = buf[src_rank * n : (src_rank + 1) * n].view(p.shard_shape(src))
            place(full, p, piece, src, whole)
        received += (world - 1) * n * buf.element_size()
        ranges = gen_shard(model, p, gen, rank)
        if ranges is not None:
            out[p.name] = meter.hold(take(full, p, ranges))
        for t in (buf, full) if own is not None else (buf, full, send):
            meter.drop(t)
    return out, received


def sync_naive(
    model: TinyLlama,
    train: TrainLayout,
    gen: GeneratorLayout,
    rank: int,
    shards: Params | None,
    meter: MemoryMeter,
) -> tuple[Params, int]:
    """Each full tensor assembled on trainer rank 0, sent whole to every generator rank;
    (a generator's weights, bytes it received; a trainer's {} and bytes it sent)."""
    num_train = train.world_size
    out: Params = {}
    moved = 0
    for p in model.params():
        owners = _owners(model, p, train)
        if rank == 0:
            full = meter.hold(torch.empty(p.shape))
            for src in owners:
                ranges = train_shard(model, p, train, src)
                assert ranges is not None
                if src == 0:
                    assert shards is not None
                    piece = shards[p.name]
                else:
                    piece = meter.hold(torch.empty(p.shard_shape(ranges)))
                    dist.recv(piece, src=src)
                    moved += piece.numel() * piece.element_size()
                offset = 0
                for r in ranges:
                    shard_rows(full, p, r.start, r.length).copy_(
                        shard_rows(piece, p, offset, r.length)
                    )
                    offset += r.length
                if src != 0:
                    meter.drop(piece)
            for dst in range(gen.world_size):
                dist.send(full, dst=num_train + dst)
                moved += full.numel() * full.element_size()
            meter.drop(full)
        elif rank in owners:
            assert shards is not None
            dist.send(shards[p.name].contiguous(), dst=0)
            moved += shards[p.name].numel() * shards[p.name].element_size()
        elif rank >= num_train:
            full = meter.hold(torch.empty(p.shape))
            dist.recv(full, src=0)
            moved += full.numel() * full.element_size()
            ranges = generator_shard_ranges(model, p, gen, rank - num_train)
            if ranges is not None:
                out[p.name] = meter.hold(take(full, p, ranges))
            meter.drop(full)
    return out, moved


# --- one process per rank ---------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class RankResult:
    """One rank's outcome for one case and method; `gen_params` only when the job asks."""

    case: int
    rank: int
    method: Method
    moved_bytes: int  # received by a reshard or generator rank, sent by a trainer rank
    peak_extra_bytes: int
    wall_s: float  # the slowest rank's time of one run (median over repeats)
    gen_params: dict[str, Any] | None  # name -> numpy array


def _timed(
    run: Callable[[MemoryMeter], tuple[Params, int]],
    job: ReshardJob | SyncJob,
    *,
    case: int,
    rank: int,
    method: Method,
) -> RankResult:
    """`run` warmup + repeats times between barriers (every rank of the world calls this)."""
    times: list[float] = []
    params: Params = {}
    moved, meter = 0, MemoryMeter()
    for i in range(job.warmup + job.repeats):
        meter = MemoryMeter()
        dist.barrier()
        start = time.perf_counter()
        params, moved = run(meter)
        if i >= job.warmup:
            times.append(time.perf_counter() - start)
    # A run is done when its slowest rank is.
    slowest = torch.tensor(times, dtype=torch.float64)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    return RankResult(
        case=case,
        rank=rank,
        method=method,
        moved_bytes=moved,
        peak_extra_bytes=meter.peak_bytes,
        wall_s=float(slowest.median()),
        gen_params={k: v.numpy() for k, v in params.items()} if job.return_params else None,
    )


def _idle(meter: MemoryMeter) -> tuple[Params, int]:
    """A rank outside this case's world: it only joins the barriers."""
    return {}, 0


def _spawn(
    worker: Callable[[int, Any, Any], None],
    job: Any,
    world_size: int,
    label: str,
    stall_timeout_s: float,
) -> list[Any]:
    out: list[Any] = []
    run_ranks(
        worker,
        job,
        world_size,
        label=label,
        error=ReshardError,
        on_message=lambda msg: out.append(msg[1]),
        stall_timeout_s=stall_timeout_s,
    )
    return out


@dataclass(frozen=True, kw_only=True)
class ReshardJob:
    """What one world of `world_size` ranks runs: every case with every method, in order."""

    model: TinyLlama
    cases: tuple[GenLayout, ...]
    methods: tuple[Method, ...]
    world_size: int
    port: int
    seed: int = 0
    repeats: int = 1
    warmup: int = 0  # untimed runs first: gloo connects a new group's peers on first use
    return_params: bool = False
    init_timeout_s: float = 60.0

    def __post_init__(self) -> None:
        for gen in self.cases:
            if gen.train.world_size != self.world_size:
                raise ValueError(
                    f"case {gen} has {gen.train.world_size} ranks; this job runs {self.world_size}"
                )


def _my_group(gen: GenLayout, rank: int, groups: list[list[int]] | None = None) -> Any:
    """Create every micro-DP group, or every group of `groups` (all ranks, same order, as
    new_group needs); return ours."""
    mine = None
    for ranks in gen.micro_dp_groups() if groups is None else groups:
        if len(ranks) > 1:
            group = dist.new_group(ranks)
            if rank in ranks:
                mine = group
    return mine


def reshard_worker(rank: int, job: ReshardJob, results: Any) -> None:
    """Entry point of one rank: every case, every method; each result goes to the parent."""

    def body() -> None:
        join_gloo_world(rank, job.world_size, job.port, timeout_s=job.init_timeout_s)
        full = full_params(job.model, job.seed)
        for case, gen in enumerate(job.cases):
            group = _my_group(gen, rank)
            experts = _my_group(gen, rank, expert_groups(gen)) if job.model.num_experts else None
            shards = train_params(job.model, gen.train, rank, full)
            plan = plan_reshard(job.model, gen)
            for method in job.methods:
                if method is Method.PLANNED:
                    run = partial(
                        reshard_colocated, plan, rank, shards, group, expert_group=experts
                    )
                else:
                    run = partial(reshard_naive, job.model, gen, rank, shards)
                result = _timed(run, job, case=case, rank=rank, method=method)
                results.put(("result", result))
        dist.destroy_process_group()

    report_rank(rank, results, body)


def run_world(
    job: ReshardJob,
    *,
    stall_timeout_s: float = 120.0,
    worker: Callable[[int, ReshardJob, Any], None] = reshard_worker,
) -> list[RankResult]:
    """Spawn the job's ranks; every rank's results. Raises ReshardError if a rank fails."""
    return _spawn(worker, job, job.world_size, "reshard", stall_timeout_s)


@dataclass(frozen=True, kw_only=True)
class SyncJob:
    """A trainer layout and generator layouts to sync into, each with every method."""

    model: TinyLlama
    train: TrainLayout
    gens: tuple[GeneratorLayout, ...]
    methods: tuple[Method, ...]
    bucket_bytes: int
    port: int
    seed: int = 0
    repeats: int = 1
    warmup: int = 0
    return_params: bool = False

    @property
    def world_size(self) -> int:
        return self.train.world_size + max(g.world_size for g in self.gens)


def sync_worker(rank: int, job: SyncJob, results: Any) -> None:
    """Entry point of one rank: every generator layout, every method; the active ranks'
    results go to the parent (a generator layout smaller than the world leaves ranks idle)."""

    def body() -> None:
        join_gloo_world(rank, job.world_size, job.port, timeout_s=60.0)
        full = full_params(job.model, job.seed)
        num_train = job.train.world_size
        shards = train_params(job.model, job.train, rank, full) if rank < num_train else None
        link = WorldLink()
        for case, gen in enumerate(job.gens):
            plan = plan_disjoint(job.model, job.train, gen, job.bucket_bytes)
            active = rank < num_train + gen.world_size
            for method in job.methods:
                if not active:
                    run = _idle
                elif method is Method.PLANNED:
                    run = partial(sync_disjoint, plan, rank, shards, link=link)
                else:
                    run = partial(sync_naive, job.model, job.train, gen, rank, shards)
                result = _timed(run, job, case=case, rank=rank, method=method)
                if active:
                    results.put(("result", result))
        dist.destroy_process_group()

    report_rank(rank, results, body)


def run_sync(
    job: SyncJob,
    *,
    stall_timeout_s: float = 120.0,
    worker: Callable[[int, SyncJob, Any], None] = sync_worker,
) -> list[RankResult]:
    """Spawn the job's ranks; every active rank's results. Raises ReshardError on failure."""
    return _spawn(worker, job, job.world_size, "weight sync", stall_timeout_s)
