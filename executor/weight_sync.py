"""Weight sync between disjoint device sets: trainer ranks send, generator ranks receive.

Executes a `placeflow.reshard_plan.DisjointPlan` with torch.distributed
point-to-point messages (gloo on CPU, NCCL on GPU) in one world whose ranks
0..T-1 are the trainer's (its p-t-d layout) and T..T+G-1 the generator's.
For each generator rank and each of its buckets, every trainer rank with
slices in the bucket packs them into one flat message; the generator receives
it into a bucket-sized buffer and copies the rows straight into its
preallocated generation shard. So a generator rank holds at most its
generation shard plus one bucket, whatever the model size.

Deadlock freedom: every rank walks the same global order of messages
(generator rank, bucket, trainer rank) and handles the ones it is part of, so
blocking sends and receives always have a partner that is at the same message.

Messages go over a `Link`: the default torch.distributed world in spawned
process worlds (tests, benchmark), or, in `placeflow run`, a process group of
its own between the trainer's and the generator's Ray workers
(`open_sync_link`): each device set keeps its own world for its roles'
collectives, and only the sync crosses sets.

`to_full_hf` is the generator side for engines that load weights by name
(vLLM's `load_weights`): a generator with tg = pg = 1 receives whole tensors,
renamed to Hugging Face names. `sync_naive` is the baseline verl streams:
every full tensor is gathered on trainer rank 0 and sent whole to every
generator rank, which slices its shard out.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Protocol

import torch
import torch.distributed as dist

from placeflow.executor.engines.hf import to_hf
from placeflow.executor.reshard import (
    MemoryMeter,
    Method,
    Params,
    ReshardError,
    full_params,
    take,
    train_params,
)
from placeflow.layout import TrainLayout
from placeflow.procs import report_rank, run_ranks
from placeflow.reshard_plan import (
    DisjointPlan,
    GeneratorLayout,
    ParamSpec,
    Range,
    Sharding,
    TinyLlama,
    plan_disjoint,
    split_ranges,
    train_shard,
)


class Link(Protocol):
    """Blocking point-to-point messages between the ranks of one sync world."""

    def send(self, tensor: torch.Tensor, dst: int) -> None: ...

    def recv(self, tensor: torch.Tensor, src: int) -> None: ...


class WorldLink:
    """The default torch.distributed world (every rank of the sync is a world rank)."""

    def send(self, tensor: torch.Tensor, dst: int) -> None:
        dist.send(tensor, dst=dst)

    def recv(self, tensor: torch.Tensor, src: int) -> None:
        dist.recv(tensor, src=src)


class GroupLink:
    """A process group outside the default world (one per trainer/generator pair of sets)."""

    def __init__(self, group: Any) -> None:
        self.group = group  # a c10d backend (ProcessGroupGloo / ProcessGroupNCCL)

    def send(self, tensor: torch.Tensor, dst: int) -> None:
        self.group.send([tensor], dst, 0).wait()

    def recv(self, tensor: torch.Tensor, src: int) -> None:
        self.group.recv([tensor], src, 0).wait()


def open_sync_link(
    *, host: str, port: int, rank: int, world_size: int, backend: str, timeout_s: float
) -> GroupLink:
    """Join the sync world of trainer ranks 0..T-1 and generator ranks T..T+G-1.

    Rank 0 hosts the TCP store at (host, port); every rank calls this at the same
    time. The group stands beside each worker's own default world, which it leaves
    untouched (torch.distributed allows one default group per process).
    """
    timeout = timedelta(seconds=timeout_s)
    store = dist.TCPStore(host, port, world_size, rank == 0, timeout=timeout)
    prefixed = dist.PrefixStore("placeflow-weight-sync", store)
    if backend == "nccl":
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout
        return GroupLink(dist.ProcessGroupNCCL(prefixed, rank, world_size, options))
    return GroupLink(dist.ProcessGroupGloo(prefixed, rank, world_size, timeout))


def generator_shard_ranges(
    model: TinyLlama, param: ParamSpec, gen: GeneratorLayout, rank: int
) -> tuple[Range, ...] | None:
    """Ranges of `param` in generator `rank`'s shard; None if its stage holds none."""
    _, gpp, gtp = gen.coords(rank)
    if param.stage(model.num_layers, gen.pg) != gpp:
        return None
    if param.sharding is Sharding.REPLICATED:
        return (Range(start=0, length=param.shape[param.dim]),)
    return split_ranges(param, gen.tg, gtp)


def _rows(t: torch.Tensor, param: ParamSpec, start: int, length: int) -> torch.Tensor:
    return t.narrow(param.dim, start, length)


def _local_rows(
    model: TinyLlama, train: TrainLayout, src: int, param: ParamSpec, rows: Range
) -> int:
    """Offset along the split dim of full-tensor row `rows.start` inside trainer `src`'s shard."""
    ranges = train_shard(model, param, train, src)
    assert ranges is not None
    offset = 0
    for r in ranges:
        if r.start <= rows.start < r.start + r.length:
            return offset + rows.start - r.start
        offset += r.length
    raise AssertionError(f"rows {rows} of {param.name} are not on trainer rank {src}")


def sync_disjoint(
    plan: DisjointPlan,
    rank: int,
    shards: Params | None,
    meter: MemoryMeter,
    *,
    link: Link | None = None,
    device: torch.device | None = None,
) -> tuple[Params, int]:
    """Run `plan` as sync-world rank `rank`; a generator returns (its shard, bytes received).

    Trainer ranks pass their training `shards` and get ({}, bytes sent). Generator
    shards and receive buffers are made on `device` (default CPU); messages go over
    `link` (default: the torch.distributed world).
    """
    link = link or WorldLink()
    model, train, gen = plan.model, plan.train, plan.gen
    num_train = train.world_size
    is_gen = rank >= num_train
    me = rank - num_train
    out: Params = {}
    if is_gen:
        for p in model.params():
            ranges = generator_shard_ranges(model, p, gen, me)
            if ranges is not None:
                out[p.name] = meter.hold(torch.empty(p.shard_shape(ranges), device=device))
    moved = 0
    for dst, transfer in enumerate(plan.ranks):
        for bucket in transfer.buckets:
            for src in sorted({s.src for s in bucket.sends}):
                sends = [s for s in bucket.sends if s.src == src]
                numel = sum(s.numel for s in sends)
                if rank == src:
                    assert shards is not None
                    pieces = [
                        _rows(
                            shards[s.param.name],
                            s.param,
                            _local_rows(model, train, src, s.param, s.rows),
                            s.rows.length,
                        ).reshape(-1)
                        for s in sends
                    ]
                    packed = meter.hold(torch.cat(pieces))
                    link.send(packed, num_train + dst)
                    meter.drop(packed)
                    moved += numel * packed.element_size()
                elif is_gen and me == dst:
                    buf = meter.hold(torch.empty(numel, device=device))
                    link.recv(buf, src)
                    offset = 0
                    for s in sends:
                        shape = list(s.param.shape)
                        shape[s.param.dim] = s.rows.length
                        piece = buf[offset : offset + s.numel].view(shape)
                        _rows(out[s.param.name], s.param, s.dst_start, s.rows.length).copy_(piece)
                        offset += s.numel
                    meter.drop(buf)
                    moved += numel * buf.element_size()
    return out, moved


def sync_naive(
    model: TinyLlama,
    train: TrainLayout,
    gen: GeneratorLayout,
    rank: int,
    shards: Params | None,
    meter: MemoryMeter,
) -> tuple[Params, int]:
    """Baseline: each full tensor assembled on trainer rank 0, sent whole to every generator."""
    num_train = train.world_size
    out: Params = {}
    moved = 0
    for p in model.params():
        stage = p.stage(model.num_layers, train.p)
        dp = model.expert_rank(p, train.e) if p.expert >= 0 else 0  # an expert's EP rank
        owners = [train.rank(pp=stage, tp=tp, dp=dp) for tp in range(train.t)]
        full = None
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
                    _rows(full, p, r.start, r.length).copy_(_rows(piece, p, offset, r.length))
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


def to_full_hf(plan: DisjointPlan, weights: Params) -> Params:
    """Whole tensors of a tg = pg = 1 generator, renamed for engines that load by HF name."""
    if plan.gen.tg != 1 or plan.gen.pg != 1:
        raise ValueError("full tensors need a generator layout with tg = pg = 1")
    return to_hf(weights, plan.model)


# --- one process per rank ---------------------------------------------------------


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


@dataclass(frozen=True, kw_only=True)
class SyncResult:
    case: int
    rank: int
    method: Method
    moved_bytes: int  # received by a generator rank, sent by a trainer rank
    peak_extra_bytes: int
    wall_s: float
    gen_params: dict[str, Any] | None


def sync_worker(rank: int, job: SyncJob, results: Any) -> None:
    def body() -> None:
        torch.set_num_threads(1)
        dist.init_process_group(
            "gloo",
            init_method=f"tcp://127.0.0.1:{job.port}",
            rank=rank,
            world_size=job.world_size,
            timeout=timedelta(seconds=60),
        )
        full = full_params(job.model, job.seed)
        num_train = job.train.world_size
        shards = train_params(job.model, job.train, rank, full) if rank < num_train else None
        for case, gen in enumerate(job.gens):
            plan = plan_disjoint(job.model, job.train, gen, job.bucket_bytes)
            active = rank < num_train + gen.world_size
            for method in job.methods:
                times: list[float] = []
                out: Params = {}
                moved, meter = 0, MemoryMeter()
                for i in range(job.warmup + job.repeats):
                    meter = MemoryMeter()
                    dist.barrier()
                    start = time.perf_counter()
                    if active and method is Method.PLANNED:
                        out, moved = sync_disjoint(plan, rank, shards, meter)
                    elif active:
                        out, moved = sync_naive(job.model, job.train, gen, rank, shards, meter)
                    if i >= job.warmup:
                        times.append(time.perf_counter() - start)
                slowest = torch.tensor(times, dtype=torch.float64)
                dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
                if active:
                    results.put(
                        (
                            "result",
                            SyncResult(
                                case=case,
                                rank=rank,
                                method=method,
                                moved_bytes=moved,
                                peak_extra_bytes=meter.peak_bytes,
                                wall_s=float(slowest.median()),
                                gen_params=(
                                    {k: v.numpy() for k, v in out.items()}
                                    if job.return_params
                                    else None
                                ),
                            ),
                        )
                    )
        dist.destroy_process_group()

    report_rank(rank, results, body)


def run_sync(
    job: SyncJob,
    *,
    stall_timeout_s: float = 120.0,
    worker: Callable[[int, SyncJob, Any], None] = sync_worker,
) -> list[SyncResult]:
    """Spawn the job's ranks; every active rank's results. Raises ReshardError on failure."""
    out: list[SyncResult] = []
    run_ranks(
        worker,
        job,
        job.world_size,
        label="weight sync",
        error=ReshardError,
        on_message=lambda msg: out.append(msg[1]),
        stall_timeout_s=stall_timeout_s,
    )
    return out
