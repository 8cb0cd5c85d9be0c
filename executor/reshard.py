"""Colocated resharding from training to generation weights with torch.distributed.

Each rank holds its training shards (Megatron TP/PP, `reshard_plan`) and builds
its generation shard (GenLayout's tg, pg) in one of two ways:

- `reshard_colocated`: HybridFlow's micro-DP all-gather, executing a
  `ReshardPlan` slot by slot; each received piece is copied straight into the
  preallocated generation tensors, re-fusing qkv and gate_up part by part.
  A mixture of experts then gathers its routed experts the same way over the
  plan's expert groups (the EP group's micro-DP groups together), so that
  every generation rank holds every expert.
- `reshard_naive`: the baseline — every weight is all-gathered whole over the
  world (every rank sends its shard, or zeros if its stage lacks the weight),
  rebuilt, then sliced.

Both count the bytes a rank receives from the others and the peak of the extra
bytes it holds at once (generation tensors plus live transfer buffers; the
training shards are not counted). `run_world` spawns one process per rank
(gloo over 127.0.0.1, "spawn" start method) the way `profiles/collectives.py`
does: a rank that raises sends its traceback, a rank that dies or hangs is
noticed, and the parent kills the rest and raises `ReshardError`. Callers that
spawn must guard their entry point with `if __name__ == "__main__":`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from enum import StrEnum
from typing import Any

import torch
import torch.distributed as dist

from placeflow.executor.errors import ExecutorError
from placeflow.layout import GenLayout, TrainLayout
from placeflow.procs import report_rank, run_ranks
from placeflow.reshard_plan import (
    ParamSpec,
    Range,
    ReshardPlan,
    Slot,
    TinyLlama,
    expert_groups,
    gen_shard,
    placements,
    plan_reshard,
    train_shard,
    transfer_piece,
)

# torch 2.13 renamed all_gather_into_tensor (which now warns); older torch has only the old name.
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor

Params = dict[str, torch.Tensor]


class ReshardError(ExecutorError):
    """A reshard rank failed, died or hung; the message carries its traceback."""


class Method(StrEnum):
    PLANNED = "planned"  # micro-DP all-gather (HybridFlow)
    NAIVE = "naive"  # all-gather every full weight to every rank, then slice


@dataclass(frozen=True, kw_only=True)
class RankResult:
    """One rank's outcome for one case; `gen_params` only when the job asks for them."""

    case: int
    rank: int
    method: Method
    received_bytes: int
    peak_extra_bytes: int
    wall_s: float  # slowest rank's time of one reshard (median over repeats)
    gen_params: dict[str, Any] | None  # name -> numpy array


class MemoryMeter:
    """Bytes of transfer-side tensors alive at once, and their peak."""

    def __init__(self) -> None:
        self.live_bytes = 0
        self.peak_bytes = 0

    def hold(self, t: torch.Tensor) -> torch.Tensor:
        self.live_bytes += t.numel() * t.element_size()
        self.peak_bytes = max(self.peak_bytes, self.live_bytes)
        return t

    def drop(self, t: torch.Tensor) -> None:
        self.live_bytes -= t.numel() * t.element_size()


# --- tensors ------------------------------------------------------------------


def full_params(model: TinyLlama, seed: int) -> Params:
    """The whole model, filled in canonical order from one seeded generator."""
    gen = torch.Generator().manual_seed(seed)
    return {p.name: torch.randn(p.shape, generator=gen) for p in model.params()}


def take(full: torch.Tensor, param: ParamSpec, ranges: tuple[Range, ...]) -> torch.Tensor:
    """The shard of `full` made of `ranges` along the split dim, contiguous."""
    return torch.cat([full.narrow(param.dim, r.start, r.length) for r in ranges], param.dim)


def train_params(model: TinyLlama, train: TrainLayout, rank: int, full: Params) -> Params:
    """Training shards of `rank`, cut from the full weights."""
    out = {}
    for p in model.params():
        ranges = train_shard(model, p, train, rank)
        if ranges is not None:
            out[p.name] = take(full[p.name], p, ranges)
    return out


def _place(
    dst: torch.Tensor,
    param: ParamSpec,
    piece: torch.Tensor,
    src: tuple[Range, ...],
    rank_gen: tuple[Range, ...],
) -> None:
    for pl in placements(src, rank_gen):
        dst.narrow(param.dim, pl.dst_start, pl.length).copy_(
            piece.narrow(param.dim, pl.src_start, pl.length)
        )


# --- the two reshards -----------------------------------------------------------


def _piece(
    model: TinyLlama, param: ParamSpec, gen: GenLayout, rank: int, shards: Params
) -> tuple[torch.Tensor, tuple[Range, ...]]:
    """What `rank` sends of `param` (a view of its shard) and the ranges it covers."""
    ranges = transfer_piece(model, param, gen, rank)
    assert ranges is not None
    own = train_shard(model, param, gen.train, rank)
    if own == ranges:
        return shards[param.name], ranges
    # A norm chunk: the shard is the full (replicated) tensor, so ranges index it directly.
    (r,) = ranges
    return shards[param.name].narrow(param.dim, r.start, r.length), ranges


def reshard_colocated(
    plan: ReshardPlan,
    rank: int,
    shards: Params,
    group: Any,
    meter: MemoryMeter,
    expert_group: Any = None,
) -> tuple[Params, int]:
    """Build `rank`'s generation weights by the plan's micro-DP all-gathers, then its expert
    all-gathers over `expert_group` (the process group of `plan.expert_group_of(rank)`);
    (weights, bytes in)."""
    model, gen = plan.model, plan.gen
    out: Params = {}
    for p in model.params():
        ranges = gen_shard(model, p, gen, rank)
        if ranges is None:
            continue
        # HybridFlow's grouping makes every own training shard part of the generation shard.
        own = train_shard(model, p, gen.train, rank)
        if own == ranges:  # nothing to gather (tg = t): the training shard itself, no copy
            out[p.name] = shards[p.name]
            continue
        like = shards[p.name] if p.name in shards else next(iter(shards.values()))
        out[p.name] = meter.hold(like.new_empty(p.shard_shape(ranges)))
        if own is not None:
            _place(out[p.name], p, shards[p.name], own, ranges)
    transfer = plan.group_of(rank)
    received = 0
    for slot in transfer.slots:
        received += _gather_slot(plan, transfer.ranks, slot, rank, shards, out, group, meter)
    experts = plan.expert_group_of(rank)
    for slot in experts.slots if experts is not None else ():
        assert experts is not None
        received += _gather_slot(plan, experts.ranks, slot, rank, shards, out, expert_group, meter)
    return out, received


def _gather_slot(
    plan: ReshardPlan,
    ranks: tuple[int, ...],
    slot: Slot,
    rank: int,
    shards: Params,
    out: Params,
    group: Any,
    meter: MemoryMeter,
) -> int:
    model, gen, me, padded = plan.model, plan.gen, ranks.index(rank), slot.padded_numel
    piece = slot.pieces[me]
    own = None if piece is None else _piece(model, piece, gen, rank, shards)[0].reshape(-1)
    padded_copy = own is None or own.numel() < padded
    send = own
    if send is None or padded_copy:
        # all-gather needs equal sizes: pad (or send zeros) up to the slot's largest piece
        send = meter.hold(out[piece.name if piece else next(iter(out))].new_zeros(padded))
        if own is not None:
            send[: own.numel()] = own
    buf = meter.hold(send.new_empty(len(ranks) * padded))
    _all_gather(buf, send, group=group)
    for k, (p, numel) in enumerate(zip(slot.pieces, slot.numels, strict=True)):
        if k == me or p is None:
            continue
        src = transfer_piece(model, p, gen, ranks[k])
        assert src is not None
        chunk = buf[k * padded : k * padded + numel].view(p.shard_shape(src))
        _place(out[p.name], p, chunk, src, gen_shard(model, p, gen, rank) or ())
    meter.drop(buf)
    if padded_copy:
        meter.drop(send)
    return (len(ranks) - 1) * padded * buf.element_size()


def reshard_naive(
    model: TinyLlama, gen: GenLayout, rank: int, shards: Params, meter: MemoryMeter
) -> tuple[Params, int]:
    """Baseline: all-gather each whole weight to all ranks, rebuild, slice; (weights, bytes in)."""
    train, world = gen.train, gen.train.world_size
    out: Params = {}
    received = 0
    for p in model.params():
        stage = p.stage(model.num_layers, train.p)
        dp = model.expert_rank(p, train.e) if p.expert >= 0 else 0  # an expert's EP rank
        owners = [train.rank(pp=stage, tp=tp, dp=dp) for tp in range(train.t)]
        n = p.numel_of(train_shard(model, p, train, owners[0]) or ())
        own = shards.get(p.name)
        send = own.reshape(-1) if own is not None else meter.hold(torch.zeros(n))
        buf = meter.hold(torch.empty(world * n))
        _all_gather(buf, send)
        full = meter.hold(torch.empty(p.shape))
        whole = (Range(start=0, length=p.shape[p.dim]),)
        for src_rank in owners:  # a replicated weight is rebuilt t times: same values
            src = train_shard(model, p, train, src_rank) or ()
            piece = buf[src_rank * n : (src_rank + 1) * n].view(p.shard_shape(src))
            _place(full, p, piece, src, whole)
        received += (world - 1) * n * buf.element_size()
        ranges = gen_shard(model, p, gen, rank)
        if ranges is not None:
            out[p.name] = meter.hold(take(full, p, ranges))
        for t in (buf, full) if own is not None else (buf, full, send):
            meter.drop(t)
    return out, received


# --- one process per rank ---------------------------------------------------------


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


def _run_case(
    job: ReshardJob,
    case: int,
    method: Method,
    rank: int,
    shards: Params,
    group: Any,
    expert_group: Any = None,
) -> RankResult:
    gen = job.cases[case]
    plan = plan_reshard(job.model, gen)
    times = []
    for i in range(job.warmup + job.repeats):
        meter = MemoryMeter()
        dist.barrier()
        start = time.perf_counter()
        if method is Method.PLANNED:
            params, received = reshard_colocated(plan, rank, shards, group, meter, expert_group)
        else:
            params, received = reshard_naive(job.model, gen, rank, shards, meter)
        if i >= job.warmup:
            times.append(time.perf_counter() - start)
    # A reshard is done when its slowest rank is.
    slowest = torch.tensor(times, dtype=torch.float64)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    return RankResult(
        case=case,
        rank=rank,
        method=method,
        received_bytes=received,
        peak_extra_bytes=meter.peak_bytes,
        wall_s=float(slowest.median()),
        gen_params={k: v.numpy() for k, v in params.items()} if job.return_params else None,
    )


def reshard_worker(rank: int, job: ReshardJob, results: Any) -> None:
    """Entry point of one rank: every case, every method; each result goes to the parent."""

    def body() -> None:
        torch.set_num_threads(1)  # W ranks on a small machine: no intra-op oversubscription
        dist.init_process_group(
            "gloo",
            init_method=f"tcp://127.0.0.1:{job.port}",
            rank=rank,
            world_size=job.world_size,
            timeout=timedelta(seconds=job.init_timeout_s),
        )
        full = full_params(job.model, job.seed)
        for case, gen in enumerate(job.cases):
            group = _my_group(gen, rank)
            experts = _my_group(gen, rank, expert_groups(gen)) if job.model.num_experts else None
            shards = train_params(job.model, gen.train, rank, full)
            for method in job.methods:
                result = _run_case(job, case, method, rank, shards, group, experts)
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
    out: list[RankResult] = []
    run_ranks(
        worker,
        job,
        job.world_size,
        label="reshard",
        error=ReshardError,
        on_message=lambda msg: out.append(msg[1]),
        stall_timeout_s=stall_timeout_s,
    )
    return out
