"""Collective timings through torch.distributed, one spawned process per rank.

For each world size the parent spawns `world_size` processes
(`torch.multiprocessing`, "spawn" start method) that join a process group over
TCP on 127.0.0.1 (gloo on CPU, NCCL on CUDA with one GPU per rank), then time
every (kind, size) point: all_reduce, all_gather, reduce_scatter, broadcast,
all_to_all (the expert-parallel token exchange) and send_recv (rank 0 sends
to rank 1; the other ranks wait at the barriers). All
ranks are on one node, so every entry has scope "intra". Sizes follow the
nccl-tests convention: `num_bytes` is the full logical tensor — the all-reduce
buffer, the all-gather output, the reduce-scatter input — and each rank holds
`num_bytes / world_size` of it where the op shards.

Timing. The ranks must issue identical call sequences, so they cannot each pick
a batch size on their own: after the warm-up every rank times one call, the
ranks agree on the slowest (all-reduce MAX), and `timing.plan_samples` derives
the same plan everywhere. Each sample starts after a barrier; a collective is
done when its slowest rank is done, so each sample's time is the max over ranks
(another all-reduce MAX) and rank 0 reports the statistics of those maxima.

API choice on torch 2.13: `all_gather_single` / `reduce_scatter_single` (the
new names of `all_gather_into_tensor` / `reduce_scatter_tensor`, which now warn
that they are deprecated) work on both gloo and NCCL; older torch falls back to
the old names. On CPU each worker runs one torch thread, so that W ranks on a
small machine do not fight over cores for intra-op parallelism.

Failure handling: a worker that raises sends its traceback to the parent over
the result queue; a worker that dies without one is noticed by its exit code;
no message for `stall_timeout_s` counts as a hang. In every case the parent
kills the remaining ranks and raises `CollectiveError` — it never waits forever.
Workers start with the "spawn" method, which re-imports the caller's main
module: a script that profiles must guard its entry point with
`if __name__ == "__main__":`. The port is found by binding port 0 and
releasing it, so another process could take it before rank 0 listens; init
then fails (within `init_timeout_s`) and the error says so.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from placeflow.errors import MeasurementError
from placeflow.procs import free_port, report_rank, run_ranks
from placeflow.profiles.grid import DTYPE_BYTES, ProfilerGrid
from placeflow.profiles.schema import CollectiveKind, Entry, Op, Scope, Source
from placeflow.profiles.timing import Timing, make_clock, plan_samples, summarize

TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
BACKENDS = {"cpu": "gloo", "cuda": "nccl"}
# Collective samples batch calls up to 10 ms: a barrier starts each sample, and its skew
# between ranks (scheduler wake-ups; ms on an oversubscribed CPU) is amortised over the batch.
COLLECTIVE_MIN_SAMPLE_S = 1e-2


class CollectiveError(MeasurementError):
    """A collective worker failed, died or hung; the message carries its traceback."""


@dataclass(frozen=True, kw_only=True)
class CollectiveJob:
    """What one group of `world_size` ranks times (sent to every worker)."""

    device: str  # "cpu" (gloo) or "cuda" (NCCL, GPU i for rank i)
    dtype: str
    world_size: int
    port: int
    kinds: tuple[CollectiveKind, ...]
    sizes_bytes: tuple[int, ...]
    warmup: int
    repeats: int
    point_budget_s: float
    init_timeout_s: float
    min_sample_s: float = COLLECTIVE_MIN_SAMPLE_S


@dataclass(frozen=True, kw_only=True)
class CollectiveTiming:
    kind: CollectiveKind
    world_size: int
    num_bytes: int
    timing: Timing


# A worker is called as worker(rank, job, result_queue) in its own process.
Worker = Callable[[int, CollectiveJob, Any], None]


def init_group(rank: int, job: CollectiveJob) -> torch.device:
    """Join the job's process group; returns this rank's device."""
    if job.device == "cuda":
        device = torch.device("cuda", rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
        torch.set_num_threads(1)
    dist.init_process_group(
        BACKENDS[job.device],
        init_method=f"tcp://127.0.0.1:{job.port}",
        rank=rank,
        world_size=job.world_size,
        timeout=timedelta(seconds=job.init_timeout_s),
        device_id=device if job.device == "cuda" else None,
    )
    return device


# --- the timed calls ------------------------------------------------------

_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def collective_call(
    kind: CollectiveKind, num_bytes: int, rank: int, job: CollectiveJob, device: torch.device
) -> Callable[[], object]:
    """A zero-argument call of `kind` on preallocated zero buffers (zeros: sums stay finite)."""
    dtype = TORCH_DTYPES[job.dtype]
    numel = num_bytes // DTYPE_BYTES[job.dtype]
    shard = numel // job.world_size
    full = torch.zeros(numel, dtype=dtype, device=device)
    part = torch.zeros(shard, dtype=dtype, device=device)
    part_out = (
        torch.zeros(numel, dtype=dtype, device=device)
        if kind is CollectiveKind.ALL_TO_ALL
        else full
    )
    calls: dict[CollectiveKind, Callable[[], object]] = {
        CollectiveKind.ALL_REDUCE: lambda: dist.all_reduce(full),
        CollectiveKind.ALL_GATHER: lambda: _all_gather(full, part),
        CollectiveKind.REDUCE_SCATTER: lambda: _reduce_scatter(part, full),
        CollectiveKind.BROADCAST: lambda: dist.broadcast(full, src=0),
        CollectiveKind.SEND_RECV: _send_recv_call(rank, full),
        # `num_bytes` is each rank's whole send buffer, 1/n of it to every rank (nccl-tests).
        CollectiveKind.ALL_TO_ALL: lambda: dist.all_to_all_single(part_out, full),
    }
    return calls[kind]


def _send_recv_call(rank: int, buf: torch.Tensor) -> Callable[[], object]:
    if rank == 0:
        return lambda: dist.send(buf, dst=1)
    if rank == 1:
        return lambda: dist.recv(buf, src=0)
    return lambda: None  # ranks >= 2 take no part


def _max_over_ranks(values: list[float], device: torch.device) -> list[float]:
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return [float(v) for v in t.tolist()]


def time_collective(call: Callable[[], object], job: CollectiveJob, device: torch.device) -> Timing:
    """Warm up, agree on a plan, then time samples; each sample is the max over ranks."""
    clock = make_clock(job.device)
    for _ in range(max(1, job.warmup)):
        call()
    dist.barrier()
    (call_s,) = _max_over_ranks([clock.measure(call, 1)], device)
    plan = plan_samples(
        call_s, repeats=job.repeats, budget_s=job.point_budget_s, min_sample_s=job.min_sample_s
    )
    samples = []
    for _ in range(plan.num_samples):
        dist.barrier()
        samples.append(clock.measure(call, plan.calls_per_sample) / plan.calls_per_sample)
    return summarize(_max_over_ranks(samples, device), plan.calls_per_sample)


def collective_worker(rank: int, job: CollectiveJob, results: Any) -> None:
    """Entry point of one rank: time every point; rank 0 reports each one."""

    def body() -> None:
        device = init_group(rank, job)
        for kind in job.kinds:
            for num_bytes in job.sizes_bytes:
                timing = time_collective(
                    collective_call(kind, num_bytes, rank, job, device), job, device
                )
                if rank == 0:
                    results.put(("point", kind.value, num_bytes, timing))
        dist.destroy_process_group()

    report_rank(rank, results, body)


# --- the parent side --------------------------------------------------------


def run_world(
    job: CollectiveJob,
    *,
    on_point: Callable[[], None] | None = None,
    stall_timeout_s: float = 180.0,
    worker: Worker = collective_worker,
) -> list[CollectiveTiming]:
    """Spawn `job.world_size` ranks running `worker`, collect rank 0's timings.

    Raises `CollectiveError` if a rank raises, dies, or sends nothing for
    `stall_timeout_s` (which must cover spawning, importing torch and joining
    the group); the other ranks are killed first (`placeflow.procs`).
    """
    out: list[CollectiveTiming] = []

    def on_message(msg: tuple[Any, ...]) -> None:
        _, kind, num_bytes, timing = msg
        out.append(
            CollectiveTiming(
                kind=CollectiveKind(kind),
                world_size=job.world_size,
                num_bytes=num_bytes,
                timing=timing,
            )
        )
        if on_point is not None:
            on_point()

    run_ranks(
        worker,
        job,
        job.world_size,
        label="collective worker",
        error=CollectiveError,
        on_message=on_message,
        stall_timeout_s=stall_timeout_s,
    )
    return out


def measure_collectives(
    grid: ProfilerGrid,
    *,
    on_point: Callable[[], None] | None = None,
    init_timeout_s: float = 60.0,
    stall_timeout_s: float = 180.0,
) -> list[Entry]:
    """Time every collective of `grid`, one process group per world size."""
    entries: list[Entry] = []
    for world_size in grid.collective_world_sizes:
        job = CollectiveJob(
            device=grid.device,
            dtype=grid.dtype,
            world_size=world_size,
            port=free_port(),
            kinds=grid.collective_kinds,
            sizes_bytes=grid.collective_bytes,
            warmup=grid.warmup,
            repeats=grid.repeats,
            point_budget_s=grid.point_budget_s,
            init_timeout_s=init_timeout_s,
        )
        timings = run_world(job, on_point=on_point, stall_timeout_s=stall_timeout_s)
        entries += [_entry(t) for t in timings]
    return entries


def _entry(t: CollectiveTiming) -> Entry:
    return Entry(
        op=Op.COLLECTIVE,
        params={
            "kind": t.kind.value,
            "world_size": t.world_size,
            "scope": Scope.INTRA.value,
            "num_bytes": t.num_bytes,
        },
        median_s=t.timing.median_s,
        p10_s=t.timing.p10_s,
        p90_s=t.timing.p90_s,
        repeats=t.timing.repeats,
        source=Source.MEASURED,
    )
