"""The colocated reshard's host work beyond its all-gathers: per piece and per slot.

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

    python -m placeflow.profiles.reshard_host --add-to PROFILE

adds them to a CPU profile; `placeflow profile --device cpu` measures them too.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
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
RESHARD_KINDS = (FrameworkKind.RESHARD_PIECE, FrameworkKind.RESHARD_SLOT)


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
        dist.destroy_process_group()

    report_rank(rank, results, body)


def solve(rows: Sequence[tuple[int, int, float]]) -> tuple[float, float]:
    """(a, b) of time = pieces · a + slots · b by least squares over `rows` of
    (pieces, slots, seconds)."""
    x = np.array([[p, s] for p, s, _ in rows], dtype=float)
    y = np.array([t for _, _, t in rows], dtype=float)
    (a, b), *_ = np.linalg.lstsq(x, y, rcond=None)
    return float(a), float(b)


def entries_of(samples: dict[int, dict[tuple[int, int], float]]) -> list[Entry]:
    """The two entries from every sample's calls (sample -> (layout, rank) -> seconds).
    Raises MeasurementError where the median of either is not above 0 (a busy host)."""
    works = [
        [rank_work(plan_reshard(PROBE_MODEL, g), r) for r in range(WORLD_SIZE)]
        for g in PROBE_LAYOUTS
    ]
    solved = []
    for calls in samples.values():
        rows = [(works[i][r].pieces, works[i][r].slots, t) for (i, r), t in calls.items()]
        solved.append(solve(rows))
    entries = []
    for kind, values in zip(RESHARD_KINDS, zip(*solved, strict=True), strict=True):
        median = statistics.median(values)
        if median <= 0:
            raise MeasurementError(
                f"reshard host work: {kind.value} solved to {median * 1e6:.1f} us (not above "
                "0): the host was too busy to tell pieces from slots; measure again on a quiet "
                "host (`python -m placeflow.profiles.reshard_host --add-to PROFILE`)"
            )
        entries.append(framework_entry(kind, 1, values, p10_floor_s=1e-9))
    return entries


def measure_reshard_host(
    *, samples: int = SAMPLES, calls: int = CALLS_PER_SAMPLE, stall_timeout_s: float = 120.0
) -> list[Entry]:
    """The `reshard_piece` and `reshard_slot` entries (module docstring)."""
    got: dict[int, dict[tuple[int, int], float]] = {}

    def on_message(msg: tuple[Any, ...]) -> None:
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
    return entries_of(complete)


def note_text(date: str, path: Path | str) -> str:
    return (
        f"measured {date} by `python -m placeflow.profiles.reshard_host --add-to {path}` "
        f"({WORLD_SIZE} gloo ranks, 1 torch thread each, `reshard_colocated` on a "
        f"{PROBE_MODEL.num_layers}-layer hidden-{PROBE_MODEL.hidden} model for TP 2 to 1 and "
        f"PP 2 to 1 in turn, thread CPU less the all-gathers' and less the walk where "
        f"nothing is gathered, {SAMPLES} samples of {CALLS_PER_SAMPLE} calls, per piece "
        "and per slot by least squares)."
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
