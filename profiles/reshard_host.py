"""The colocated reshard's host work beyond its all-gathers: per piece, per slot, and per
tensor a ZeRO-3 rank gathers first.

A colocated actor whose generation layout gathers (dg > 1) runs
`executor.reshard.reshard_colocated`: it allocates its generation tensors, copies
its own training shard's part of each into place, and for each slot of the plan
allocates the slot's send and receive buffers, all-gathers, and copies every other
member's piece into place (`reshard_plan.rank_work` counts the pieces, the slots
and the bytes those copies move). The all-gathers are the collective entries'; the
rest is Python, allocation and small copies, which on the 2-core VMs took about as
long again as the gathers' own CPU (ad hoc, 2026-12-02: tiny-llama's TP 2 to 1
reshard in a run, 20 copies in 1.05 ms and 1.9 ms of other thread CPU beside the
gathers' 1.0 ms, against 0.45 ms of rollout load, the only host work priced).

This module times it the way the executor runs it: two gloo ranks spawned here
(one torch thread each) run `reshard_colocated` on `PROBE_MODEL` for each of
`PROBE_LAYOUTS` (TP 2 to 1: two pieces a slot; PP 2 to 1: one), in turn, each
sample `CALLS_PER_SAMPLE` calls. A call's time is the rank's thread CPU time less
the thread CPU its all-gathers took (the `gather` each call is given is timed) and
less the same rank's walk over the tensors where nothing is gathered
(`reshard_colocated` of the layout t = tg, which the `load_layer` and `load_call`
entries hold). Each sample's four calls (two ranks, two layouts) give four
equations, time = pieces · a + slots · b, solved by least squares for (a, b):
`framework` entries of kinds `reshard_piece` (a) and `reshard_slot` (b), num_units
1, the median and spread over `SAMPLES` samples. `PROBE_MODEL` is small (hidden 64,
a few KB a piece), so that the copies themselves are under a microsecond each: the
simulator prices the bytes the real copies move apart (`simulator.callcosts`).

A ZeRO-3 actor (FSDP2, `executor.engines.trainer.fsdp_shard`) first gathers each of its
parameters over its data-parallel group (`TrainEngine.tp_shards`: `DTensor.full_tensor`,
one tensor at a time), before a colocated reshard and before a weight sync to a
generator set. Each such gather costs more than the all-gather of the same shard that
the collective entries time: DTensor's dispatch and redistribution, the output's
allocation, the padding taken off. In a run of `ppo-tiny-cpu4-colocate` (ad hoc,
2026-12-02 23:00 UTC, four ranks on the 2-core VM) the actor's 15 gathers took 28-64 ms
of wall and 10-19 ms of thread CPU a rank, where its whole reshard was priced at 30 ms
and measured at 68-75 ms; on two ranks with a core each, `full_tensor` took 0.60 ms of
thread CPU a tensor of tiny-llama against 0.17 ms for the plain all-gather of its shard.
The same two ranks here wrap the framework profiler's reference model in FSDP2 over
their world and, in each sample, gather every parameter with `full_tensor` and then
all-gather each one's local shard into a buffer made beforehand (the collective
entries' call); a sample is the mean over `CALLS_PER_SAMPLE` such passes of their
difference in thread CPU per tensor, the slower rank's: `framework` entries of kind
`zero3_gather`, num_units 1, the median and spread over the samples. The simulator adds
it to each tensor a ZeRO-3 rank gathers (`callcosts.zero3_gather_s`).

    python -m placeflow.profiles.reshard_host --add-to PROFILE

adds them to a CPU profile; `placeflow profile --device cpu` measures them too.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from placeflow.errors import MeasurementError
from placeflow.executor.reshard import (
    MemoryMeter,
    all_gather,
    full_params,
    reshard_colocated,
    train_params,
)
from placeflow.layout import GenLayout, TrainLayout
from placeflow.procs import free_port, join_gloo_world, report_rank, run_ranks
from placeflow.profiles.schema import (
    Entry,
    FrameworkKind,
    add_kinds_command,
)
from placeflow.profiles.shared_cores import framework_entry
from placeflow.reshard_plan import TinyLlama, plan_reshard, rank_work

PROBE_MODEL = TinyLlama(num_layers=2, hidden=64, num_heads=4, num_kv_heads=2, ffn=128, vocab=64)
PROBE_LAYOUTS = (
    GenLayout(train=TrainLayout(t=2), tg=1),
    GenLayout(train=TrainLayout(p=2), pg=1),
)
WORLD_SIZE = 2
SAMPLES = 15
CALLS_PER_SAMPLE = 10
WARMUP_CALLS = 3
# The two kinds solved from the reshard's calls, and with them the ZeRO-3 gather's.
SOLVED_KINDS = (FrameworkKind.RESHARD_PIECE, FrameworkKind.RESHARD_SLOT)
RESHARD_KINDS = (*SOLVED_KINDS, FrameworkKind.ZERO3_GATHER)


class ReshardHostError(MeasurementError):
    """A rank of the measurement failed, died or hung; the message says which and why."""


@dataclass(frozen=True, kw_only=True)
class _Job:
    port: int
    samples: int
    calls: int
    init_timeout_s: float = 60.0


def _rank(rank: int, job: _Job, results: Any) -> None:
    def body() -> None:
        join_gloo_world(rank, WORLD_SIZE, job.port, timeout_s=job.init_timeout_s)
        full = full_params(PROBE_MODEL, seed=0)
        plans = [plan_reshard(PROBE_MODEL, gen) for gen in PROBE_LAYOUTS]
        shards = [train_params(PROBE_MODEL, gen.train, rank, full) for gen in PROBE_LAYOUTS]
        walk_plan = plan_reshard(PROBE_MODEL, GenLayout(train=TrainLayout()))
        walk_shards = train_params(PROBE_MODEL, walk_plan.gen.train, 0, full)
        inside = [0.0]

        def timed_gather(output: torch.Tensor, tensor: torch.Tensor, group: Any = None) -> Any:
            c0 = time.thread_time()
            out = all_gather(output, tensor, group=group)
            inside[0] += time.thread_time() - c0
            return out

        def reshard_s(i: int) -> float:
            inside[0] = 0.0
            c0 = time.thread_time()
            reshard_colocated(plans[i], rank, shards[i], None, MemoryMeter(), gather=timed_gather)
            return time.thread_time() - c0 - inside[0]

        def walk_s() -> float:
            c0 = time.thread_time()
            reshard_colocated(walk_plan, 0, walk_shards, None, MemoryMeter())
            return time.thread_time() - c0

        for i in range(len(plans)):
            for _ in range(WARMUP_CALLS):
                reshard_s(i)
        for sample in range(job.samples):
            for i in range(len(plans)):
                dist.barrier()
                got = [reshard_s(i) - walk_s() for _ in range(job.calls)]
                results.put(("sample", sample, i, rank, statistics.fmean(got)))
        gather_s = _zero3_probe()
        for _ in range(WARMUP_CALLS):
            gather_s()
        for sample in range(job.samples):
            dist.barrier()
            got = [gather_s() for _ in range(job.calls)]
            results.put(("zero3", sample, rank, statistics.fmean(got)))
        dist.destroy_process_group()

    report_rank(rank, results, body)


def _zero3_probe() -> Callable[[], float]:
    """A pass of the `zero3_gather` probe on this rank (module docstring), as a call
    returning its thread CPU per tensor beyond the plain all-gathers: the reference
    model wrapped in FSDP2 over the world, each parameter gathered by `full_tensor`,
    then each one's shard all-gathered into a buffer made beforehand."""
    from torch.distributed.tensor import DTensor

    from placeflow.catalogue import get_model
    from placeflow.executor.engines.trainer import fsdp_shard
    from placeflow.executor.engines.transformer import random_model
    from placeflow.profiles.grid import REFERENCE_MODEL

    model = random_model(get_model(REFERENCE_MODEL), seed=0)
    fsdp_shard(model, dist.group.WORLD)
    params = [p for p in model.parameters() if isinstance(p, DTensor)]
    if not params:
        raise ReshardHostError("zero3_gather: FSDP2 left no parameter sharded")
    parts = []
    for p in params:
        # (FSDP2 pads dim 0 to a multiple of the world: the gather moves equal parts)
        rows = -(-p.shape[0] // WORLD_SIZE)
        part = torch.zeros((rows, *p.shape[1:]), dtype=p.dtype)
        parts.append((part, part.new_empty((rows * WORLD_SIZE, *p.shape[1:]))))

    def pass_s() -> float:
        c0 = time.thread_time()
        for p in params:
            p.full_tensor()
        c1 = time.thread_time()
        for part, full in parts:
            all_gather(full, part)
        return (2 * c1 - c0 - time.thread_time()) / len(params)

    return pass_s


def solve(rows: Sequence[tuple[int, int, float]]) -> tuple[float, float]:
    """(a, b) of time = pieces · a + slots · b by least squares over `rows` of
    (pieces, slots, seconds)."""
    x = np.array([[p, s] for p, s, _ in rows], dtype=float)
    y = np.array([t for _, _, t in rows], dtype=float)
    (a, b), *_ = np.linalg.lstsq(x, y, rcond=None)
    return float(a), float(b)


def entries_of(
    samples: dict[int, dict[tuple[int, int], float]], gathers: dict[int, dict[int, float]]
) -> list[Entry]:
    """The three entries: `reshard_piece` and `reshard_slot` from every sample's calls
    (sample -> (layout, rank) -> seconds), `zero3_gather` from every sample's gathers
    (sample -> rank -> seconds per tensor), the slower rank's. Raises MeasurementError
    where the median of any is not above 0 (a busy host)."""
    works = [
        [rank_work(plan_reshard(PROBE_MODEL, g), r) for r in range(WORLD_SIZE)]
        for g in PROBE_LAYOUTS
    ]
    solved = []
    for calls in samples.values():
        rows = [(works[i][r].pieces, works[i][r].slots, t) for (i, r), t in calls.items()]
        solved.append(solve(rows))
    entries = []
    for kind, values in zip(SOLVED_KINDS, zip(*solved, strict=True), strict=True):
        median = statistics.median(values)
        if median <= 0:
            raise MeasurementError(
                f"reshard host work: {kind.value} solved to {median * 1e6:.1f} us (not above "
                "0): the host was too busy to tell pieces from slots; measure again on a quiet "
                "host (`python -m placeflow.profiles.reshard_host --add-to PROFILE`)"
            )
        entries.append(framework_entry(kind, 1, values, p10_floor_s=1e-9))
    slowest = [max(g.values()) for g in gathers.values()]
    if not slowest or statistics.median(slowest) <= 0:
        raise MeasurementError(
            "reshard host work: zero3_gather is not above the plain all-gather's thread CPU "
            "(or was not measured): the host was too busy to tell them apart; measure again "
            "on a quiet host (`python -m placeflow.profiles.reshard_host --add-to PROFILE`)"
        )
    entries.append(framework_entry(FrameworkKind.ZERO3_GATHER, 1, slowest, p10_floor_s=1e-9))
    return entries


def measure_reshard_host(
    *, samples: int = SAMPLES, calls: int = CALLS_PER_SAMPLE, stall_timeout_s: float = 120.0
) -> list[Entry]:
    """The `reshard_piece`, `reshard_slot` and `zero3_gather` entries (module docstring)."""
    got: dict[int, dict[tuple[int, int], float]] = {}
    gathers: dict[int, dict[int, float]] = {}

    def on_message(msg: tuple[Any, ...]) -> None:
        if msg[0] == "zero3":
            _, sample, rank, seconds = msg
            gathers.setdefault(sample, {})[rank] = seconds
            return
        _, sample, layout, rank, seconds = msg
        got.setdefault(sample, {})[layout, rank] = seconds

    job = _Job(port=free_port(), samples=samples, calls=calls)
    run_ranks(
        _rank,
        job,
        WORLD_SIZE,
        label="reshard host work",
        error=ReshardHostError,
        on_message=on_message,
        stall_timeout_s=stall_timeout_s,
    )
    complete = {s: c for s, c in got.items() if len(c) == WORLD_SIZE * len(PROBE_LAYOUTS)}
    both = {s: g for s, g in gathers.items() if len(g) == WORLD_SIZE}
    return entries_of(complete, both)


def note_text(date: str, path: Path | str) -> str:
    return (
        f"measured {date} by `python -m placeflow.profiles.reshard_host --add-to {path}` "
        f"({WORLD_SIZE} gloo ranks, 1 torch thread each, `reshard_colocated` on a "
        f"{PROBE_MODEL.num_layers}-layer hidden-{PROBE_MODEL.hidden} model for TP 2 to 1 and "
        f"PP 2 to 1 in turn, thread CPU less the all-gathers' and less the walk where "
        f"nothing is gathered, {SAMPLES} samples of {CALLS_PER_SAMPLE} calls, per piece "
        "and per slot by least squares; FSDP2's `full_tensor` of each parameter of the "
        "framework profiler's reference model less the plain all-gather of its shard, thread "
        "CPU per tensor, the slower rank's)."
    )


def main(argv: Sequence[str] | None = None) -> int:
    # (a lambda: the module's `measure_*` looked up when the command runs)
    entries = add_kinds_command(
        argv, __doc__.split("\n")[0], RESHARD_KINDS, lambda: measure_reshard_host(), note_text
    )
    for e in entries:
        print(
            f"{e.params['kind']:>14}: {e.median_s * 1e6:8.1f} us (p10 {e.p10_s * 1e6:.1f}, "
            f"p90 {e.p90_s * 1e6:.1f})"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
