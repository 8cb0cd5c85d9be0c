"""What a collective costs ranks that share their host's cores with other busy ranks.

A CPU pool whose workers outnumber its cores (`PoolSpec.cores_per_node`) runs them
in time slices. Compute then stretches by workers / cores, which the simulator
prices as a rate (`PoolSpec.contention`, `simulator.schedule`). A collective
stretches far more: it cannot finish until every rank of its group has reached
it, and a rank that arrives first waits, idle, until the kernel next schedules
its partner, which may be running another worker's slice. On this 2-core
machine that is milliseconds per collective against tens of microseconds for
the same all-reduce between two ranks on cores of their own: the tensor-parallel
calls of a colocated CPU plan, a few dozen all-reduces a micro-batch, were
priced 2-2.5x too fast before this was measured.

Compute stretches more than workers / cores, too: a rank that gets its core
back in time slices finds its caches refilled by the other rank's slice and
pays the switches; where the busy ranks do not divide evenly among the cores
(three on two) the slowest rank of a call shares its core more than the
average; and ranks on cores of their own still share the memory and the last
cache. `measure_shared_compute` times the engine's forward of the framework
profiler's reference model (`placeflow.profiles.framework`: its
`REFERENCE_MODEL` at the `SHARED_COMPUTE_SHAPE` micro-batch) on every rank of
W = 1, 2, ..., 2·c ranks of this host's c cores, the slowest rank's wall time
per forward: `framework` entries of kind `shared_compute` whose num_units is W,
the busy ranks on the host (its cores: the profile's provenance). Each over the
first (one rank alone) is the stretch at W / c busy ranks per core
(`CostModel.slicing`), which the simulator applies to every call on a host whose
cores it shares (`simulator.schedule`). The stretch is a ratio, and this VM's speed
moves by tens of per cent within seconds: measured W after W, each world in a block of
its own, three measurements of the curve a minute apart on the Intel VM of 2026-12-02
read 1.57, 1.03 and 1.53 at W = 2 and 2.89, 2.37 and 3.04 at W = 4, the one rank
alone 3.9-6.1 ms. So one world of 2·c ranks runs every W in turn within each round
(the first W ranks compute while the others wait in a barrier, asleep; the order of
the W reversed every other round, so that a drift of the host falls on both sides),
and each W's sample is its round's ratio to that round's one-rank time, scaled by
the median one-rank time: the entries' medians over the first one's are the median
of the paired ratios.

The stretch depends on the work. `measure_shared_compute` also times, in the same
way, a decode of SHARED_DECODE_SHAPE by the engine's sampler (`shared_decode`) and a
training step of the reference model (`shared_train`: the forward and its backward),
because a call's ranks pay the slices by their own work's pattern: a decode's many
small steps refill their caches and wait to be scheduled far more often for each
millisecond of work than a forward's larger kernels do. Measured back to back on the
Intel VM of 2026-12-03 (06:18-06:25 UTC, two measurements), the decode read 1.32 and
1.42 at W = 2, 2.76 and 3.19 at W = 4, the forward 1.04 and 1.05, 2.32 and 2.31, the
training step 1.07 and 1.26, 2.41 and 2.56. The simulator stretches a generation by the
decode's curve and an update by the training step's (`simulator.simulate.stretch_probe`).

`measure_shared_collective` measures the collective's wait as the executor meets it: 2·c ranks on
the c cores of this host (one torch thread each, gloo), in pairs, each rank
running the same fixed compute chunk (small matmuls, about a millisecond of one
core) and then, in the second loop, an all-reduce of `SHARED_PROBE_BYTES` within its
pair after every chunk. The entry (op `framework`, kind `shared_collective`,
source measured) is the wall time per iteration of the second loop less the
first's, the slowest rank's: what one collective adds to each rank's time when
the host runs two busy ranks per core. `CostModel.shared_cores` prices a
collective of such ranks with it.

`measure_coupled_collective` runs the same probe with every rank in two pairs of
different ranks (ranks 0-1 and 2-3, then 0-2 and 1-3: a tensor-parallel pair whose
ranks each sit in a data-parallel pair with a rank of the other, as ZeRO-3 over d = 2
with TP 2 places them), its all-reduces alternating between them (`pairings`): each
rank's collective waits on a partner that waited on another pair's rank before, so
every rank runs in step with every other. The entry (kind `coupled_collective`) is
measured by the same command as the fixed pairs' `shared_collective`, and what it adds
beyond that entry is the coupling's own wait (`CostModel.coupled_wait_s`). On the
2-core VM the coupled probe added 2.77 and 2.87 ms a collective where the fixed pairs
added 1.64 and 1.51 ms (2026-12-01, the fidelity profile's and the shipped `cpu`
profile's); ad hoc, at compute chunks of 0.3, 1.1 and 4.4 ms, 2.6-2.9 ms against
1.5-2.6 ms, and a layer's pattern (a gather over the data-parallel pair, then two
all-reduces over the tensor-parallel pair) cost as much as strict alternation. The
simulator charges it to the forwards and updates of a role whose layers interleave
the two groupings (`callcosts.interleaves_groups`).

A call to a set of such ranks costs more than its ranks' work and an idle round
trip, too: the driver launches its ranks one after another while the first already
run, each rank wakes on a cold cache after sleeping through the others' calls, and
the replies wait for a core. `measure_shared_call` times it as the executor meets
it: W = 1 ... 2·c Ray actors started as the executor's workers are
(`executor.worker.WORKER_RUNTIME_ENV`, one torch thread, a gloo world), the driver
calling all W and waiting for their results, with one reference forward per rank and
with `CALL_FORWARDS`, alternated; one call's time is a + b·n in its n forwards,
so a = T(1) − (T(n) − T(1)) / (n − 1) is the call's fixed time at W busy ranks on the
host: `framework` entries of kind `shared_call`, num_units W (the median over the
pairs; a pair that gives a ≤ 0, its long call slowed by something else, is left
out, and a measurement with most pairs so is refused). The simulator adds what its
composition of the idle round trip, the driver's launches and gets and the stretch
leaves out of it (`rolecosts.crowded_call_s`).

A call that runs no forward costs less than that fixed time: the probe's fixed time
holds its first forward's cold start after the ranks slept between calls (what a
forward pays beyond the next), which a weight transition (the colocated actor's
reshard and rollout load, a generator's weight sync) does not pay, its work a walk
over tensors in order. `measure_empty_call` times such a call as the executor meets
it: W = 1 ... 2·c Ray actors started as the executor's workers are, the driver
launching a method that does nothing on all W and waiting for their results, the
ranks idle `EMPTY_CALL_PAUSE_S` before each call (a transition's ranks sleep through
the driver's collection of the phase before it and its own launches); its time from
the last launch to the last result, since a phase's clock starts once its launches
have returned (`executor.timeline.StepClock`): `framework` entries of kind
`empty_call`, num_units W (the median over `EMPTY_CALL_SAMPLES` calls). On this
2-core VM it took 2.0, 2.8, 3.3 and 3.2 ms after launches of 0.6-1.5 ms, where the
probe's fixed time after its launches was 3.5, 3.8, 9.5 and 6.7 ms (ad hoc,
2026-11-28). The simulator prices a transition's fixed time with it
(`rolecosts.crowded_call_s`).

The same empty call costs more after its ranks idled longer than the probe's pause:
a transition's ranks sleep through the phases of other sets and the driver's work
before it, and the call that wakes them (the raylet's and the workers' threads, the
cores out of their idle states) takes longer to come back. `measure_empty_wake` times
it as `measure_empty_call` does, at one rank per core, after each of
`EMPTY_WAKE_IDLE_MS` idle against right after `EMPTY_CALL_PAUSE_S` idle, alternated,
in `EMPTY_WAKE_PAIRS` pairs each, and takes their difference: `framework` entries of
kind `empty_wake`, num_units the idle ms (an idle with no measurable cost has no
entry). On an AMD EPYC VM of 2 cores the call to 1-4 ranks took 0.3-0.9 ms more after
100 ms idle than after 3 ms (1.1-2.1 ms; ad hoc, 25 calls each, 2026-12-03). The
simulator charges a transition that curve by its sets' idle time before it
(`CostModel.empty_wake_curve`, `simulator.schedule`), where a model call pays its own
kind's refill (`wake_calls`).

A rank that slept before a call pays once more: the ranks of a CPU run wait
between their calls (the other phases, the driver's work) while their core idles
or runs other ranks, and the call that wakes them finds its caches, TLB and branch
predictors cold, where every kernel and framework entry of the profile was timed
back to back, hot. `measure_wake_call` times the reference forward in this process
(one torch thread) right after another forward and right after this thread slept
each of `WAKE_IDLE_MS` milliseconds, alternated, in `WAKE_PAIRS` pairs each, and
takes their difference in thread CPU time: `framework` entries of kind
`wake_call`, num_units the sleep in ms. On this 2-core VM a forward of 7.6 ms hot
cost 1.7-2.4 ms more after 10 ms asleep or longer, 0.5-1.0 ms more after 2 ms (ad
hoc, two runs, 2026-11-27), and forwards of 2 to 150 ms of two models 1.1-2.8 ms
more after 30 ms: a refill, not a rate. The simulator charges it to each call by
the time its set was idle before it (`CostModel.wake_curve`,
`simulator.schedule`).

Weights past a core's own cache cost a rank too: every GEMM entry of the profile was
timed back to back, its weights hot in the core's private (level-2) cache, but a
forward or a decode step multiplies by each weight once and moves on, so a model
whose weights outgrow that cache reads each from the shared last-level cache
every pass. `measure_cold_weights` times one pass of GEMMs of `COLD_ROWS` rows
over `COLD_MODEL`'s weights in turn against the same GEMMs each repeated back to
back, in paired samples of thread CPU time: `framework` entries of kind
`cold_weights`, num_units the rows; the host's level-2 cache goes into the
profile's provenance (`l2_bytes`). On this 2-core VM a pass over tiny-llama-m's
12 MB took 0.5-0.8 ms more at 1 row and 1.5-1.8 ms more at 8 to 128 rows than the
hot GEMMs' 0.4-10 ms (ad hoc, 2026-11-27). The simulator charges it to each
decode step and prefill of a generation whose shard outgrows the level-2 cache,
by its bytes past that cache (`CostModel.cold_weights_s`, `simulator.callcosts`).

A collective costs ranks on cores of their own more than its back-to-back entry too,
where they compute between collectives, as a tensor-parallel layer's ranks do: the
rank that arrives first blocks, and waking it when its partner's data arrives costs a
latency that collectives timed back to back, their ranks never idle for long, pay less
of. `measure_paired_collective` runs the probe above on one rank per core (pairs of
the host's cores) at compute chunks of `PAIRED_CHUNKS` matmuls: `framework` entries of
kind `paired_collective`, num_units the chunk's own time per iteration in µs (the loop
without the all-reduce), each the wall time the all-reduce adds per iteration, its own
time included. On this 2-core VM a 4 KiB all-reduce added 2.17, 2.27, 1.92 and 3.14 ms
after 0.14, 0.56, 2.2 and 9.1 ms of compute (2026-11-28, the shipped `cpu` profile's),
where the profile's back-to-back all-reduce of 128-256 KB took 0.65-0.8 ms; the
engine's tensor-parallel forward of tiny-llama-m (8 x 22 tokens, two ranks on the two
cores) spent 2.9 ms a collective in them (ad hoc, 2026-11-28). The cost model prices a
collective within a host after a known compute at least at this curve
(`CostModel.collective_s`, `after_s`), the simulator a tensor-parallel layer's with
the layer's work between them (`simulator.compute`).

A run's host does more than its ranks' and its driver's work: Ray's daemons (the GCS,
the raylet, the dashboard's agents), the Ray threads of every worker and of the driver,
and the kernel's own threads take their share of the cores while the ranks compute,
where every kernel and engine entry, and `shared_compute` (plain processes, no Ray), was
timed without them. `measure_ray_background` runs W = 1 ... 2·c Ray actor ranks started
as the executor's workers are, each `BACKGROUND_FORWARDS` reference forwards in one call
while the driver waits, and takes the host's busy CPU over the call (/proc/stat) less
the ranks' main threads' and the driver's (their schedstat and thread CPU time), per
second of the call: `framework` entries of kind `ray_background`, num_units W, their
"times" in cores (CPU seconds per second), not seconds, brought to a host's speed as
the other entries are (`hostcheck.at_host_speed`: the same background work takes a
slower host longer). On the 2-core VM it read
0.08-0.10 cores at W = 1-4 (ad hoc, 2026-12-01, eight calls each). The simulator counts
it among the busy workers of every host it shares for the model calls, whose times come
from those entries (`CostModel.ray_background`, `simulator.schedule`).

    python -m placeflow.profiles.shared_cores --add-to profiles/data/cpu.json [--kinds ...]

measures all nine (or the `--kinds` named) and replaces the file's entries of
those kinds (its other framework entries are kept).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import functools
import os
import statistics
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from placeflow.cliargs import add_kinds_option
from placeflow.errors import MeasurementError
from placeflow.procs import free_port, join_gloo_world, report_rank, run_ranks
from placeflow.profiles.grid import (
    COLD_MODEL,
    EMPTY_CALL_PAUSE_S,
    SHARED_PROBE_BYTES,
    SHARED_RANKS_PER_CORE,
)
from placeflow.profiles.schema import (
    Entry,
    FrameworkKind,
    Op,
    Profile,
    Source,
    load_profile_file,
    op_note,
    op_note_text,
    save_profile,
    with_op_entries,
    with_some_kinds,
)

# The probes' compute chunk: CHUNK_MATMULS matmuls of PROBE_MATMUL x PROBE_MATMUL fp32
# (about 1 ms of one core at two ranks per core here).
CHUNK_MATMULS = 40
PROBE_MATMUL = 64
# `measure_paired_collective`'s chunks (matmuls; about 0.14 to 9 ms of one core here),
# and the matmuls each chunk's sample runs (about 110 ms here), so that every chunk's
# sample lasts about as long.
PAIRED_CHUNKS = (10, 40, 160, 640)
PAIRED_WORK = 4000
SHARED_COMPUTE_SHAPE = (8, 32)  # (sequences, tokens) of the timed forward: a CPU micro-batch
# The timed decode of `shared_decode`: (sequences, prompt tokens, generated tokens), a CPU
# rollout rank's batch; the training step of `shared_train` runs at SHARED_COMPUTE_SHAPE.
SHARED_DECODE_SHAPE = (8, 6, 16)
# The stretch probes: the forward, the decode and the training step, and how many of each
# a rank runs per sample (each sample about 0.2 s of one core alone here).
STRETCH_KINDS = (
    FrameworkKind.SHARED_COMPUTE,
    FrameworkKind.SHARED_DECODE,
    FrameworkKind.SHARED_TRAIN,
)
STRETCH_ITERATIONS = {
    FrameworkKind.SHARED_COMPUTE: 40,
    FrameworkKind.SHARED_DECODE: 8,
    FrameworkKind.SHARED_TRAIN: 14,
}
# `measure_shared_compute`'s rounds, every busy-rank count in each (about 30 s here).
SHARED_COMPUTE_ROUNDS = 15
CALL_FORWARDS = 8  # forwards per rank of the long call of `measure_shared_call`'s pairs
# `measure_empty_call`: the calls timed at each rank count (the driver's pause before
# each, its ranks idle, is `grid.EMPTY_CALL_PAUSE_S`).
EMPTY_CALL_SAMPLES = 60
# `measure_empty_wake`: the ranks' idle times before a call (num_units, ms; from a
# phase's gap to a step's) and the pairs timed at each.
EMPTY_WAKE_IDLE_MS = (10, 30, 100, 300)
EMPTY_WAKE_PAIRS = 25
SHARED_KINDS = (
    FrameworkKind.SHARED_COLLECTIVE,
    FrameworkKind.COUPLED_COLLECTIVE,
    *STRETCH_KINDS,
    FrameworkKind.SHARED_CALL,
    FrameworkKind.EMPTY_CALL,
    FrameworkKind.EMPTY_WAKE,
    FrameworkKind.WAKE_CALL,
    FrameworkKind.COLD_WEIGHTS,
    FrameworkKind.PAIRED_COLLECTIVE,
    FrameworkKind.RAY_BACKGROUND,
)
# `measure_ray_background`: forwards per rank of a sample's call (about half a second on
# the 2-core VM: /proc/stat counts the host's time in 10 ms ticks) and samples per W.
BACKGROUND_FORWARDS = 60
BACKGROUND_SAMPLES = 10
# A sample's background below this (cores) counts as this: an entry's times are positive.
BACKGROUND_FLOOR = 1e-6
# `measure_cold_weights`: the GEMMs' rows (num_units: a decode step's sequences up to a
# forward's tokens), the pairs timed at each and the passes of a sample (the model:
# `grid.COLD_MODEL`).
COLD_ROWS = (1, 8, 32, 128, 512)
COLD_PAIRS = 15
COLD_PASSES = 10
# `measure_wake_call`: the sleeps (ms, the entries' num_units) before its cold forwards,
# from a scheduler tick to several phases of a CPU run, and the pairs timed at each.
WAKE_IDLE_MS = (1, 3, 10, 30, 100)
WAKE_PAIRS = 30
# The floor of a wake_call entry's p10 (entries' times are positive): the pairs are
# differences of two noisy times, and where the penalty is small some are below zero.
WAKE_FLOOR_S = 1e-9


class SharedCoresError(MeasurementError):
    """A rank of the measurement failed, died or hung; the message carries its traceback."""


@dataclass(frozen=True, kw_only=True)
class SharedJob:
    world_size: int
    port: int
    iterations: int
    repeats: int
    init_timeout_s: float = 60.0
    # The chunks (matmuls) timed in turn; with more than one, each chunk's loops run
    # PAIRED_WORK matmuls (at least `iterations` // 10 iterations) a sample.
    chunks: tuple[int, ...] = (CHUNK_MATMULS,)
    # Each rank's all-reduces alternate between its pair and a second pair of other ranks
    # (`measure_coupled_collective`); fixed pairs otherwise.
    coupled: bool = False
    # `measure_shared_compute`'s work: one of STRETCH_KINDS.
    work: FrameworkKind = FrameworkKind.SHARED_COMPUTE

    def iterations_at(self, matmuls: int) -> int:
        if len(self.chunks) == 1:
            return self.iterations
        return max(self.iterations // 10, PAIRED_WORK // matmuls)


def _chunk(a: torch.Tensor, matmuls: int) -> None:
    for _ in range(matmuls):
        torch.mm(a, a)


def _loop_s(
    iterations: int,
    a: torch.Tensor,
    pairs: Sequence[Any],
    buf: torch.Tensor | None,
    matmuls: int = CHUNK_MATMULS,
) -> float:
    """Seconds per iteration of `iterations` chunks of `matmuls` matmuls (each followed by
    an all-reduce when `buf` is given, within `pairs` in turn), the slowest rank's."""
    dist.barrier()
    t0 = time.perf_counter()
    for i in range(iterations):
        _chunk(a, matmuls)
        if buf is not None:
            dist.all_reduce(buf, group=pairs[i % len(pairs)])
    per = torch.tensor([(time.perf_counter() - t0) / iterations], dtype=torch.float64)
    dist.all_reduce(per, op=dist.ReduceOp.MAX)
    return float(per.item())


def _init_rank(rank: int, job: SharedJob) -> None:
    """One torch thread, and this rank in the job's gloo world."""
    join_gloo_world(rank, job.world_size, job.port, timeout_s=job.init_timeout_s)


def pairings(world_size: int, coupled: bool) -> list[list[list[int]]]:
    """The probe's groupings of `world_size` ranks (even): the pairs (r, r + 1), and with
    `coupled` also the pairs (r, r + world_size / 2) of the first half's ranks with the
    second's, as a tensor-parallel pair's ranks each sit in a data-parallel pair with a
    rank of the other tensor-parallel pair (ranks 0-1 and 2-3, then 0-2 and 1-3). Every
    rank meets every other through them; a world of 2 has one grouping only."""
    half = world_size // 2
    out = [[[r, r + 1] for r in range(0, world_size, 2)]]
    if coupled and half > 1:
        out.append([[r, r + half] for r in range(half)])
    return out


def _rank_pairs(rank: int, world_size: int, coupled: bool) -> list[Any]:
    """This rank's groups of `pairings`, one per grouping, in the order its all-reduces
    take them (every rank creates every group, in the same order: torch.distributed)."""
    mine: list[Any] = []
    for grouping in pairings(world_size, coupled):
        groups = [(members, dist.new_group(members)) for members in grouping]
        mine.extend(g for members, g in groups if rank in members)
    return mine


def _rank(rank: int, job: SharedJob, results: Any) -> None:
    def body() -> None:
        _init_rank(rank, job)
        mine = _rank_pairs(rank, job.world_size, job.coupled)
        a = torch.randn(PROBE_MATMUL, PROBE_MATMUL)
        buf = torch.zeros(SHARED_PROBE_BYTES // 4)
        _loop_s(2, a, mine, buf)  # warm-up: both paths, the groups' first use
        _loop_s(2, a, mine, None)
        for matmuls in job.chunks:
            n = job.iterations_at(matmuls)
            for _ in range(job.repeats):
                alone = _loop_s(n, a, mine, None, matmuls)
                paired = _loop_s(n, a, mine, buf, matmuls)
                if rank == 0:
                    results.put(("sample", matmuls, alone, paired))
        dist.destroy_process_group()

    report_rank(rank, results, body)


def measure_shared_collective(
    *,
    cores: int | None = None,
    iterations: int = 100,
    repeats: int = 7,
    stall_timeout_s: float = 180.0,
) -> Entry:
    """The `shared_collective` entry, measured with SHARED_RANKS_PER_CORE ranks per core of this
    host (`cores`: os.cpu_count()); see the module docstring."""
    return _crowded_collective(
        FrameworkKind.SHARED_COLLECTIVE, False, cores, iterations, repeats, stall_timeout_s
    )


def measure_coupled_collective(
    *,
    cores: int | None = None,
    iterations: int = 100,
    repeats: int = 7,
    stall_timeout_s: float = 180.0,
) -> Entry:
    """The `coupled_collective` entry: `measure_shared_collective`'s probe with each rank's
    all-reduces alternating between its pair and a second pair of other ranks
    (`pairings`), SHARED_RANKS_PER_CORE ranks per core of this host (`cores`:
    os.cpu_count(); see the module docstring)."""
    return _crowded_collective(
        FrameworkKind.COUPLED_COLLECTIVE, True, cores, iterations, repeats, stall_timeout_s
    )


def _crowded_collective(
    kind: FrameworkKind,
    coupled: bool,
    cores: int | None,
    iterations: int,
    repeats: int,
    stall_timeout_s: float,
) -> Entry:
    """The probe's entry of `kind` at SHARED_RANKS_PER_CORE ranks per core of this host,
    its pairs fixed or `coupled` (`pairings`), at the one chunk of CHUNK_MATMULS."""
    cores = cores or os.cpu_count() or 1
    job = SharedJob(
        world_size=SHARED_RANKS_PER_CORE * cores,
        port=free_port(),
        iterations=iterations,
        repeats=repeats,
        coupled=coupled,
    )
    extra = _paired_loops(job, stall_timeout_s)[0][CHUNK_MATMULS]
    return framework_entry(kind, 1, extra)


def measure_paired_collective(
    *,
    cores: int | None = None,
    chunks: tuple[int, ...] = PAIRED_CHUNKS,
    repeats: int = 7,
    stall_timeout_s: float = 300.0,
) -> list[Entry]:
    """The `paired_collective` entries, one per chunk of `chunks` matmuls: the probe's pairs
    on one rank per core of this host (`cores`: os.cpu_count(); an odd core count leaves
    one core idle), the wall time the all-reduce adds per iteration, num_units the chunk's
    own time per iteration in µs; none on a host of one core, where a pair cannot have a
    core per rank (see the module docstring)."""
    cores = cores or os.cpu_count() or 1
    if cores < 2:
        return []
    job = SharedJob(
        world_size=cores - cores % 2,
        port=free_port(),
        iterations=100,
        repeats=repeats,
        chunks=tuple(chunks),
    )
    extra, alone = _paired_loops(job, stall_timeout_s)
    # Each chunk's entry at its compute as measured (µs, at least 1 apart from the
    # previous: num_units identify the entries), which is what the cost model compares
    # with a call's priced work between collectives.
    entries, units = [], 0
    for m in job.chunks:
        units = max(round(statistics.median(alone[m]) * 1e6), units + 1)
        entries.append(framework_entry(FrameworkKind.PAIRED_COLLECTIVE, units, extra[m]))
    return entries


def _paired_loops(
    job: SharedJob, stall_timeout_s: float
) -> tuple[dict[int, list[float]], dict[int, list[float]]]:
    """What the all-reduce added per iteration in each sample, and the chunks' own time
    per iteration (the loop without it), by chunk (matmuls), on the job's ranks; refused
    where a chunk's median is not above 0 (no collective's time measured at all: the run
    was too noisy)."""
    extra: dict[int, list[float]] = {m: [] for m in job.chunks}
    alone: dict[int, list[float]] = {m: [] for m in job.chunks}

    def on_message(msg: tuple[Any, ...]) -> None:
        _, matmuls, chunk_s, paired = msg
        extra[matmuls].append(paired - chunk_s)
        alone[matmuls].append(chunk_s)

    run_ranks(
        _rank,
        job,
        job.world_size,
        label="shared-cores rank",
        error=SharedCoresError,
        on_message=on_message,
        stall_timeout_s=stall_timeout_s,
    )
    for matmuls, samples in extra.items():
        median = statistics.median(samples)
        if median <= 0:
            raise SharedCoresError(
                f"a collective after {matmuls} matmuls added {median:.2e} s per iteration (no "
                "wait measured): the host has more cores than it reports, or the run was too "
                "noisy; measure again"
            )
    return extra, alone


def reference_model(rank: int) -> tuple[torch.nn.Module, Callable[[], torch.Tensor]]:
    """The framework profiler's reference model (random weights seeded by `rank`) and
    one forward of it at SHARED_COMPUTE_SHAPE as a call (the caller chooses whether
    gradients are on)."""
    from placeflow.catalogue import get_model
    from placeflow.executor.engines.transformer import random_model
    from placeflow.profiles.grid import REFERENCE_MODEL

    spec = get_model(REFERENCE_MODEL)
    model = random_model(spec, seed=rank)
    ids = torch.randint(0, spec.vocab_size, SHARED_COMPUTE_SHAPE)
    mask = torch.ones_like(ids, dtype=torch.bool)

    return model, lambda: model(ids, mask)


def _reference_forward(rank: int) -> Callable[[], object]:
    """One forward of `reference_model(rank)`, as a call (the caller turns gradients off)."""
    return reference_model(rank)[1]


def stretch_work(rank: int, kind: FrameworkKind) -> Callable[[], object]:
    """One piece of the reference model's work of stretch probe `kind` (STRETCH_KINDS) as
    a call, under the caller's `torch.no_grad`: its forward at SHARED_COMPUTE_SHAPE, a
    decode of SHARED_DECODE_SHAPE by the engine's sampler, or a training step (the
    forward and its backward, gradients on inside)."""
    if kind is FrameworkKind.SHARED_COMPUTE:
        return _reference_forward(rank)
    model, forward = reference_model(rank)
    if kind is FrameworkKind.SHARED_TRAIN:

        def train() -> None:
            with torch.enable_grad():
                model.zero_grad(set_to_none=True)
                model_out = forward()
                model_out.float().logsumexp(-1).mean().backward()

        return train
    if kind is not FrameworkKind.SHARED_DECODE:
        raise ValueError(f"not a stretch probe: {kind.value} (one of {STRETCH_KINDS})")
    from placeflow.executor.engines.sampler import Sampler, SamplingParams
    from placeflow.executor.engines.transformer import Transformer

    assert isinstance(model, Transformer)  # (`random_model` builds the engine's own)
    sampler = Sampler(model, pad_id=0)
    seqs, prompt, tokens = SHARED_DECODE_SHAPE
    prompts = [[1] * prompt] * seqs
    params = SamplingParams(max_tokens=tokens, ignore_stop=True)
    return lambda: sampler.generate(prompts, params, rank)


def _compute_rank(rank: int, job: SharedJob, results: Any) -> None:
    """A rank of `measure_shared_compute`: in each of `job.repeats` rounds, for every W in
    turn (reversed every other round), `job.iterations` forwards on the first W ranks
    while the others wait in the world's barrier; rank 0 reports (round, W, the slowest
    busy rank's seconds per forward)."""

    def body() -> None:
        _init_rank(rank, job)
        forward = stretch_work(rank, job.work)
        world = job.world_size
        # Every rank creates every group, in the same order (torch.distributed).
        busy_groups = {w: dist.new_group(list(range(w))) for w in range(1, world + 1)}
        with torch.no_grad():
            for _ in range(3):  # warm-up
                forward()
            for round_ in range(job.repeats):
                counts = range(1, world + 1) if round_ % 2 == 0 else range(world, 0, -1)
                for busy in counts:
                    dist.barrier()  # the others idle, asleep, from here
                    if rank >= busy:
                        continue
                    group = busy_groups[busy]
                    forward()  # refills what the wait let go cold
                    dist.barrier(group=group)  # every busy rank from the same moment
                    t0 = time.perf_counter()
                    for _ in range(job.iterations):
                        forward()
                    per = torch.tensor([(time.perf_counter() - t0) / job.iterations])
                    dist.all_reduce(per, op=dist.ReduceOp.MAX, group=group)
                    if rank == 0:
                        results.put(("sample", round_, busy, float(per.item())))
            dist.barrier()
        dist.destroy_process_group()

    report_rank(rank, results, body)


def measure_shared_compute(
    *,
    cores: int | None = None,
    forwards: int | None = None,
    repeats: int = SHARED_COMPUTE_ROUNDS,
    stall_timeout_s: float = 180.0,
    kind: FrameworkKind = FrameworkKind.SHARED_COMPUTE,
) -> list[Entry]:
    """The entries of stretch probe `kind` (STRETCH_KINDS; module docstring): the slowest
    rank's seconds per piece of its work (`stretch_work`; `forwards` pieces a sample,
    STRETCH_ITERATIONS' by default) with W = 1 ... SHARED_RANKS_PER_CORE · cores busy
    ranks on this host (`cores`: os.cpu_count()), every W in each of `repeats` rounds of
    one world, each W's samples its rounds' ratios to the one rank alone
    (`paired_stretch_samples`)."""
    if kind not in STRETCH_KINDS:
        raise ValueError(f"not a stretch probe: {kind.value} (one of {STRETCH_KINDS})")
    cores = cores or os.cpu_count() or 1
    world = SHARED_RANKS_PER_CORE * cores
    job = SharedJob(
        world_size=world,
        port=free_port(),
        iterations=forwards or STRETCH_ITERATIONS[kind],
        repeats=repeats,
        work=kind,
    )
    rounds: dict[int, dict[int, float]] = {}

    def on_message(msg: tuple[Any, ...]) -> None:
        _, round_, busy, per = msg
        rounds.setdefault(round_, {})[busy] = per

    run_ranks(
        _compute_rank,
        job,
        world,
        label="shared-compute rank",
        error=SharedCoresError,
        on_message=on_message,
        stall_timeout_s=stall_timeout_s,
    )
    samples = paired_stretch_samples([rounds[r] for r in sorted(rounds)])
    return [framework_entry(kind, w, samples[w]) for w in sorted(samples)]


def paired_stretch_samples(rounds: Sequence[Mapping[int, float]]) -> dict[int, list[float]]:
    """Per busy-rank count W, its samples from `rounds` (each: W -> seconds per forward,
    measured in the same round, W = 1 among them): W = 1's times as they are, every
    other W's its round's time over that round's one-rank time, times the median
    one-rank time, so that a W's median over the one rank's median is the median of
    its paired ratios."""
    if not rounds or any(1 not in r or r[1] <= 0 for r in rounds):
        raise SharedCoresError("shared_compute: every round needs its one-rank-alone time")
    alone = statistics.median(r[1] for r in rounds)
    out: dict[int, list[float]] = {}
    for r in rounds:
        for busy, per in r.items():
            out.setdefault(busy, []).append(per if busy == 1 else per / r[1] * alone)
    return out


class CallRank:
    """A rank of `measure_shared_call`: the reference model in a Ray actor, in a gloo
    world with the other ranks of the call, as an executor worker holds its engine."""

    def __init__(self, rank: int, world_size: int, port: int) -> None:
        _init_rank(rank, SharedJob(world_size=world_size, port=port, iterations=0, repeats=0))
        self.forward = _reference_forward(rank)

    def forwards(self, count: int) -> int:
        with torch.no_grad():
            for _ in range(count):
                self.forward()
        return count


def _call_worlds(actor: Any, cores: int) -> Iterator[tuple[int, list[Any]]]:
    """(W, W ranks of `actor` in one gloo world) for W = 1 ... SHARED_RANKS_PER_CORE ·
    `cores`, each world killed once the caller moves on to the next."""
    import ray

    for ranks in range(1, SHARED_RANKS_PER_CORE * cores + 1):
        port = free_port()
        # Any: Ray's handle types do not know the remote methods of a class made here.
        world: list[Any] = [actor.remote(r, ranks, port) for r in range(ranks)]
        yield ranks, world
        for w in world:
            ray.kill(w)


def measure_shared_call(
    *, cores: int | None = None, pairs: int = 30, warmup: int = 3
) -> list[Entry]:
    """The `shared_call` entries (module docstring): the fixed seconds of a call to W =
    1 ... SHARED_RANKS_PER_CORE · cores Ray actor ranks on this host (`cores`: os.cpu_count()).
    Starts a local Ray instance unless Ray is up (then uses it and leaves it running)."""
    cores = cores or os.cpu_count() or 1
    with _ray_actors(CallRank) as (ray, actor):
        entries = []
        for ranks, world in _call_worlds(actor, cores):

            def call(count: int, world: list[Any] = world) -> float:
                t0 = time.perf_counter()
                ray.get([w.forwards.remote(count) for w in world])
                return time.perf_counter() - t0

            for _ in range(warmup):
                call(1)
                call(CALL_FORWARDS)
            samples = []
            for _ in range(pairs):
                one, many = call(1), call(CALL_FORWARDS)
                samples.append(one - (many - one) / (CALL_FORWARDS - 1))
            # A pair whose long call ran slow for other reasons gives a time below 0: noise,
            # left out; a host too noisy for most pairs is refused.
            kept = [t for t in samples if t > 0]
            if len(kept) * 2 < len(samples):
                raise SharedCoresError(
                    f"a call to {ranks} ranks: {len(samples) - len(kept)} of {len(samples)} "
                    "pairs gave no fixed time (the host was too busy); measure again"
                )
            entries.append(framework_entry(FrameworkKind.SHARED_CALL, ranks, kept))
        return entries


class EmptyRank:
    """A rank of `measure_empty_call`: a Ray actor whose call does nothing."""

    def call(self) -> int:
        return 0


def empty_call_s(ray: Any, world: Sequence[Any]) -> float:
    """Seconds from the driver's last launch of `EmptyRank.call` on every rank of `world`
    to its last result (a phase's clock starts once its launches have returned)."""
    refs = [w.call.remote() for w in world]
    launched = time.perf_counter()
    ray.get(refs)
    return time.perf_counter() - launched


def measure_empty_call(
    *,
    cores: int | None = None,
    samples: int = EMPTY_CALL_SAMPLES,
    warmup: int = 3,
    pause_s: float = EMPTY_CALL_PAUSE_S,
) -> list[Entry]:
    """The `empty_call` entries (module docstring): the seconds from the driver's last
    launch to its last result of a call that does nothing on W = 1 ...
    SHARED_RANKS_PER_CORE · cores Ray actor ranks of this host (`cores`: os.cpu_count()),
    the ranks idle `pause_s` before each. Starts a local Ray instance unless Ray is up
    (then uses it and leaves it running)."""
    cores = cores or os.cpu_count() or 1
    with _ray_actors(EmptyRank) as (ray, actor):
        entries = []
        for ranks in range(1, SHARED_RANKS_PER_CORE * cores + 1):
            # Any: Ray's handle types do not know the remote methods of a class made here.
            world: list[Any] = [actor.remote() for _ in range(ranks)]
            times = []
            for i in range(warmup + samples):
                time.sleep(pause_s)
                took = empty_call_s(ray, world)
                if i >= warmup:
                    times.append(took)
            for w in world:
                ray.kill(w)
            entries.append(framework_entry(FrameworkKind.EMPTY_CALL, ranks, times))
        return entries


def empty_wake_samples(
    call: Callable[[], float],
    idle_ms: Sequence[int],
    *,
    pairs: int,
    base_s: float = EMPTY_CALL_PAUSE_S,
    sleep: Callable[[float], None] = time.sleep,
) -> dict[int, list[float]]:
    """Per idle time in `idle_ms`: `pairs` paired differences, the seconds `call` reports
    (its own time) right after `sleep` of that many ms less right after `base_s`. The
    idle times take turns within each round, so that a slow stretch of the host falls
    on all of them."""
    out: dict[int, list[float]] = {ms: [] for ms in idle_ms}
    for _ in range(pairs):
        for ms in idle_ms:
            sleep(base_s)
            base = call()
            sleep(ms / 1000)
            out[ms].append(call() - base)
    return out


def measure_empty_wake(
    *, cores: int | None = None, pairs: int = EMPTY_WAKE_PAIRS, warmup: int = 3
) -> list[Entry]:
    """The `empty_wake` entries (module docstring): the empty call of
    `measure_empty_call` to one Ray actor rank per core of this host (`cores`:
    os.cpu_count()) after each of `EMPTY_WAKE_IDLE_MS` idle less right after
    `EMPTY_CALL_PAUSE_S`. Starts a local Ray instance unless Ray is up (then uses it and
    leaves it running)."""
    cores = cores or os.cpu_count() or 1
    with _ray_actors(EmptyRank) as (ray, actor):
        world: list[Any] = [actor.remote() for _ in range(cores)]
        call = functools.partial(empty_call_s, ray, world)
        for _ in range(warmup):
            call()
        samples = empty_wake_samples(call, EMPTY_WAKE_IDLE_MS, pairs=pairs)
        for w in world:
            ray.kill(w)
    return extra_entries(FrameworkKind.EMPTY_WAKE, samples)


class BackgroundRank(CallRank):
    """A rank of `measure_ray_background`: `CallRank` that names its process."""

    def pid(self) -> int:
        return os.getpid()


def host_busy_s() -> float:
    """The host's busy CPU seconds since boot, summed over its CPUs (/proc/stat: user,
    nice, system, irq, softirq)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:8]]
    busy = fields[0] + fields[1] + fields[2] + fields[5] + fields[6]
    return busy / os.sysconf("SC_CLK_TCK")


def main_thread_s(pid: int) -> float:
    """CPU seconds process `pid`'s main thread has run (/proc/PID/task/PID/schedstat)."""
    return int(Path(f"/proc/{pid}/task/{pid}/schedstat").read_text().split()[0]) / 1e9


def background_cores(busy_s: float, ranks_s: float, driver_s: float, wall_s: float) -> float:
    """The cores kept busy by everything else over `wall_s`: the host's busy CPU
    seconds less the ranks' main threads' and the driver's, per second; at least
    `BACKGROUND_FLOOR` (the host's ticks make a short window's difference noisy)."""
    if wall_s <= 0:
        raise ValueError(f"a background sample needs a positive wall time, got {wall_s}")
    return max(BACKGROUND_FLOOR, (busy_s - ranks_s - driver_s) / wall_s)


def measure_ray_background(
    *,
    cores: int | None = None,
    samples: int = BACKGROUND_SAMPLES,
    forwards: int = BACKGROUND_FORWARDS,
) -> list[Entry]:
    """The `ray_background` entries (module docstring): the host's cores busy with
    everything but the ranks' and the driver's own threads while W = 1 ...
    SHARED_RANKS_PER_CORE · cores Ray actor ranks (`cores`: os.cpu_count()) run
    `forwards` reference forwards each in one call and the driver waits for them. Linux
    only (/proc). Starts a local Ray instance unless Ray is up (then uses it and leaves
    it running)."""
    if not Path("/proc/stat").is_file():
        raise SharedCoresError("ray_background reads /proc/stat: a Linux host only")
    cores = cores or os.cpu_count() or 1
    with _ray_actors(BackgroundRank) as (ray, actor):
        entries = []
        for ranks, world in _call_worlds(actor, cores):
            pids = ray.get([w.pid.remote() for w in world])
            ray.get([w.forwards.remote(3) for w in world])  # warm-up
            values = []
            for _ in range(samples):
                busy0 = host_busy_s()
                ranks0 = sum(main_thread_s(p) for p in pids)
                driver0, wall0 = time.thread_time(), time.perf_counter()
                ray.get([w.forwards.remote(forwards) for w in world])
                wall = time.perf_counter() - wall0
                driver = time.thread_time() - driver0
                busy1 = host_busy_s()
                ranks_s = sum(main_thread_s(p) for p in pids) - ranks0
                values.append(background_cores(busy1 - busy0, ranks_s, driver, wall))
            entries.append(framework_entry(FrameworkKind.RAY_BACKGROUND, ranks, values))
        return entries


@contextlib.contextmanager
def _ray_actors(cls: type) -> Iterator[tuple[Any, Any]]:
    """(ray, `cls` as a Ray actor class started as the executor's workers are), on a local
    Ray instance started for the measurement unless Ray is up (then left running)."""
    import ray

    from placeflow.executor.worker import WORKER_RUNTIME_ENV

    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        yield ray, ray.remote(num_cpus=0, runtime_env=WORKER_RUNTIME_ENV)(cls)
    finally:
        if started:
            ray.shutdown()


def framework_entry(
    kind: FrameworkKind, num_units: int, samples: Sequence[float], *, p10_floor_s: float = 0.0
) -> Entry:
    """The entry of `samples`: their median, p10 (at least `p10_floor_s`) and p90."""
    qs = statistics.quantiles(samples, n=10, method="inclusive") if len(samples) > 1 else samples
    median = statistics.median(samples)
    return Entry(
        op=Op.FRAMEWORK,
        params={"kind": kind.value, "num_units": num_units},
        median_s=median,
        p10_s=min(max(qs[0], p10_floor_s), median),
        p90_s=max(qs[-1], median),
        repeats=len(samples),
        source=Source.MEASURED,
    )


SENTENCE = " Kind shared_collective"  # where its part of the framework note starts


def shared_collective_note(profile: Profile) -> str:
    """The framework note's sentence about the entries of `SHARED_KINDS` ("" if none):
    from SENTENCE, which starts both its old form (shared_collective alone) and its
    form since shared_compute was added, to the note's end."""
    text = op_note_text(profile.provenance.notes, Op.FRAMEWORK) or ""
    at = text.find(SENTENCE)
    return text[at:] if at >= 0 else ""


def is_shared_entry(entry: Entry) -> bool:
    """Whether `entry` is one of this module's (a framework entry of `SHARED_KINDS`)."""
    return entry.op is Op.FRAMEWORK and entry.params["kind"] in {k.value for k in SHARED_KINDS}


def wake_samples(
    call: Callable[[], object],
    idle_ms: Sequence[int],
    *,
    pairs: int,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.thread_time,
) -> dict[int, list[float]]:
    """Per sleep in `idle_ms`: `pairs` paired differences, the seconds of `call` right
    after this thread slept that long less its seconds right after another `call` (hot).
    The sleeps take turns within each round, so that a slow stretch of the host falls on
    all of them. `clock` is this thread's CPU time: the call's own work, not the time
    others held its core."""
    out: dict[int, list[float]] = {ms: [] for ms in idle_ms}
    for _ in range(pairs):
        for ms in idle_ms:
            call()  # the hot call follows a call, as its caches want
            t0 = clock()
            call()
            hot = clock() - t0
            sleep(ms / 1000)
            t0 = clock()
            call()
            out[ms].append(clock() - t0 - hot)
    return out


def wake_entries(samples: Mapping[int, Sequence[float]]) -> list[Entry]:
    """The `wake_call` entries of `wake_samples`' differences (num_units: the sleep in
    ms): their median, p10 (at least `WAKE_FLOOR_S`) and p90. A sleep whose median is
    not above 0 cost nothing measurable: no entry (the cost model reads 0 there)."""
    return extra_entries(FrameworkKind.WAKE_CALL, samples)


def extra_entries(kind: FrameworkKind, samples: Mapping[int, Sequence[float]]) -> list[Entry]:
    """Entries of `kind` from paired differences by num_units (what a piece costs more
    than the same piece hot): their median, p10 (at least `WAKE_FLOOR_S`, entries' times
    being positive) and p90; none where the median is not above 0."""
    return [
        framework_entry(kind, units, extra, p10_floor_s=WAKE_FLOOR_S)
        for units, extra in sorted(samples.items())
        if extra and statistics.median(extra) > 0
    ]


def measure_wake_call(*, pairs: int = WAKE_PAIRS) -> list[Entry]:
    """The `wake_call` entries (module docstring): the reference forward in this
    process on one torch thread, after each of `WAKE_IDLE_MS` asleep against back to
    back."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        forward = _reference_forward(0)
        with torch.no_grad():
            for _ in range(3):  # warm-up
                forward()
            samples = wake_samples(forward, WAKE_IDLE_MS, pairs=pairs)
    finally:
        torch.set_num_threads(threads)
    return wake_entries(samples)


def gemm_weights(model_name: str) -> list[torch.Tensor]:
    """The matrices a forward of `model_name` multiplies by (random weights; every 2-D
    parameter but the embedding table, which is gathered, not multiplied)."""
    from placeflow.catalogue import get_model
    from placeflow.executor.engines.transformer import random_model

    model = random_model(get_model(model_name))
    return [p.detach() for n, p in model.named_parameters() if p.dim() == 2 and "embed" not in n]


def cold_samples(
    weights: Sequence[torch.Tensor],
    rows: int,
    *,
    pairs: int,
    passes: int = COLD_PASSES,
    clock: Callable[[], float] = time.thread_time,
) -> list[float]:
    """`pairs` paired differences: the seconds of one pass of GEMMs of `rows` rows over
    `weights` in turn (each weight's GEMM once, then the next's, so that each finds its
    weights where the others left the cache) less the same GEMMs each repeated back to
    back (`passes` times, the mean; its weights hot, as the profile's GEMM entries time
    them). `clock` is this thread's CPU time."""
    xs = {w.shape[1]: torch.randn(rows, w.shape[1]) for w in weights}
    with torch.no_grad():
        for w in weights:  # warm-up: every shape once
            xs[w.shape[1]] @ w.t()
        out = []
        for _ in range(pairs):
            hot = 0.0
            for w in weights:
                x = xs[w.shape[1]]
                x @ w.t()
                t0 = clock()
                for _ in range(passes):
                    x @ w.t()
                hot += (clock() - t0) / passes
            t0 = clock()
            for _ in range(passes):
                for w in weights:
                    xs[w.shape[1]] @ w.t()
            out.append((clock() - t0) / passes - hot)
    return out


def measure_cold_weights(*, pairs: int = COLD_PAIRS) -> list[Entry]:
    """The `cold_weights` entries (module docstring): per row count of `COLD_ROWS`, a
    pass over `COLD_MODEL`'s GEMM weights in turn against each GEMM hot, one torch
    thread. A row count whose median is not above 0 has no entry."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        weights = gemm_weights(COLD_MODEL)
        samples = {rows: cold_samples(weights, rows, pairs=pairs) for rows in COLD_ROWS}
    finally:
        torch.set_num_threads(threads)
    return extra_entries(FrameworkKind.COLD_WEIGHTS, samples)


def with_shared_entries(profile: Profile, entries: Sequence[Entry], note: str) -> Profile:
    """`profile` with `entries` as its only entries of the shared-cores kinds
    (`SHARED_KINDS`); the other framework entries and their note kept, `note` (a
    SENTENCE) in place of the old one."""
    kept = [e for e in profile.entries if e.op is Op.FRAMEWORK and not is_shared_entry(e)]
    text = op_note_text(profile.provenance.notes, Op.FRAMEWORK)
    if text is None:
        body = op_note(Op.FRAMEWORK, "):")
    else:
        body = op_note(Op.FRAMEWORK, text.replace(shared_collective_note(profile), ""))
    return with_op_entries(profile, Op.FRAMEWORK, [*kept, *entries], f"{body}{note}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--add-to", type=Path, required=True, help="a CPU profile JSON file")
    parser.add_argument(
        "--repeats",
        type=int,
        default=None,
        help="samples of the collective probes and rounds of shared_compute (default: "
        f"each probe's own, {SHARED_COMPUTE_ROUNDS} rounds for shared_compute)",
    )
    add_kinds_option(parser, [k.value for k in SHARED_KINDS])
    args = parser.parse_args(argv)
    kinds = [FrameworkKind(k) for k in args.kinds]
    profile = load_profile_file(args.add_to)
    recorded = profile.provenance.host.get("cpu_count")
    if recorded is not None and int(recorded) != (os.cpu_count() or 1):
        # The shared_compute entries count busy ranks on the host; the cost model reads
        # them per core with the cores the profile records.
        parser.error(
            f"{args.add_to} was profiled on a host of {recorded} cores and this one has "
            f"{os.cpu_count()}: measure its shared-cores entries on a host like the "
            "profile's, or profile this host first (`python -m placeflow.profiles.profiler`)"
        )
    from placeflow.profiles.profiler import cpu_busy_fraction, level2_cache_bytes

    busy = cpu_busy_fraction()
    l2 = level2_cache_bytes()
    # (no --repeats: each probe's own default)
    given = {} if args.repeats is None else {"repeats": args.repeats}
    measure: dict[FrameworkKind, Callable[[], list[Entry]]] = {
        FrameworkKind.SHARED_COLLECTIVE: lambda: [measure_shared_collective(**given)],
        FrameworkKind.COUPLED_COLLECTIVE: lambda: [measure_coupled_collective(**given)],
        **{k: functools.partial(measure_shared_compute, kind=k, **given) for k in STRETCH_KINDS},
        FrameworkKind.SHARED_CALL: measure_shared_call,
        FrameworkKind.EMPTY_CALL: measure_empty_call,
        FrameworkKind.EMPTY_WAKE: measure_empty_wake,
        FrameworkKind.WAKE_CALL: measure_wake_call,
        FrameworkKind.COLD_WEIGHTS: measure_cold_weights,
        FrameworkKind.PAIRED_COLLECTIVE: lambda: measure_paired_collective(**given),
        FrameworkKind.RAY_BACKGROUND: measure_ray_background,
    }
    entries = [e for kind in kinds for e in measure[kind]()]
    date = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    cores = os.cpu_count() or 1
    batch, tokens = SHARED_COMPUTE_SHAPE
    how = {
        FrameworkKind.SHARED_COLLECTIVE: (
            f"shared_collective: {SHARED_RANKS_PER_CORE * cores} gloo ranks on {cores} cores in "
            f"pairs, a {SHARED_PROBE_BYTES}-byte all-reduce after each compute chunk, less the "
            "chunks alone"
        ),
        FrameworkKind.COUPLED_COLLECTIVE: (
            f"coupled_collective: the same {SHARED_RANKS_PER_CORE * cores} ranks, each "
            "rank's all-reduces alternating between its pair (r, r+1) and a pair (r, "
            f"r+{SHARED_RANKS_PER_CORE * cores // 2}), less the chunks alone"
        ),
        FrameworkKind.SHARED_COMPUTE: (
            f"shared_compute: the engine's forward of the reference model at {batch}x"
            f"{tokens} tokens on 1 to {SHARED_RANKS_PER_CORE * cores} ranks (num_units) of the "
            f"{cores} cores, the slowest rank's wall time per forward, every count in turn "
            "in each round of one world, each count's samples its rounds' ratios to the "
            "one rank alone times that one's median time"
        ),
        FrameworkKind.SHARED_DECODE: (
            f"shared_decode: the same with the engine's sampler generating "
            f"{SHARED_DECODE_SHAPE[2]} tokens for {SHARED_DECODE_SHAPE[0]} sequences of "
            f"{SHARED_DECODE_SHAPE[1]} prompt tokens in place of the forward"
        ),
        FrameworkKind.SHARED_TRAIN: (
            f"shared_train: the same with a training step (the forward at {batch}x{tokens} "
            "tokens and its backward) in place of the forward"
        ),
        FrameworkKind.SHARED_CALL: (
            f"shared_call: a call to 1 to {SHARED_RANKS_PER_CORE * cores} Ray actor ranks "
            f"(num_units) of one and of {CALL_FORWARDS} such forwards each, alternated, "
            "its time at no forward"
        ),
        FrameworkKind.EMPTY_CALL: (
            f"empty_call: a call that does nothing to 1 to {SHARED_RANKS_PER_CORE * cores} Ray "
            f"actor ranks (num_units), idle {EMPTY_CALL_PAUSE_S * 1e3:g} ms before it, from "
            f"its last launch to its last result, {EMPTY_CALL_SAMPLES} calls each"
        ),
        FrameworkKind.EMPTY_WAKE: (
            f"empty_wake: the same call to {cores} ranks after "
            f"{', '.join(map(str, EMPTY_WAKE_IDLE_MS))} ms idle (num_units; an idle with no "
            f"measurable cost has no entry) less after {EMPTY_CALL_PAUSE_S * 1e3:g} ms, "
            f"{EMPTY_WAKE_PAIRS} pairs each, p10 floored at 1 ns"
        ),
        FrameworkKind.WAKE_CALL: (
            f"wake_call: the engine's forward of the reference model at {batch}x{tokens} "
            "tokens on one torch thread after the thread slept "
            f"{', '.join(map(str, WAKE_IDLE_MS))} ms (num_units; a sleep with no "
            f"measurable cost has no entry) less one right after another, {WAKE_PAIRS} "
            "pairs each, thread CPU time, p10 floored at 1 ns"
        ),
        FrameworkKind.COLD_WEIGHTS: (
            f"cold_weights: one pass of GEMMs of {', '.join(map(str, COLD_ROWS))} rows "
            f"(num_units) over {COLD_MODEL}'s weights in turn less the same GEMMs each "
            f"repeated back to back, one torch thread, {COLD_PAIRS} pairs of "
            f"{COLD_PASSES} passes each, thread CPU time, p10 floored at 1 ns; the host's "
            f"level-2 cache, {l2} bytes as the OS reports it, recorded "
            "in the provenance's host as l2_bytes"
        ),
        FrameworkKind.PAIRED_COLLECTIVE: (
            f"paired_collective: {cores - cores % 2} gloo ranks on {cores} cores in pairs, a "
            f"{SHARED_PROBE_BYTES}-byte all-reduce after each chunk of "
            f"{', '.join(map(str, PAIRED_CHUNKS))} {PROBE_MATMUL} x {PROBE_MATMUL} matmuls "
            "(num_units: the chunk's own "
            "time per iteration, µs), less the chunks alone"
        ),
        FrameworkKind.RAY_BACKGROUND: (
            f"ray_background: 1 to {SHARED_RANKS_PER_CORE * cores} Ray actor ranks "
            f"(num_units) running {BACKGROUND_FORWARDS} forwards of the reference model each "
            "in a call, the host's busy CPU (/proc/stat) less the ranks' main threads' and "
            f"the driver's, per second of the call, {BACKGROUND_SAMPLES} calls each (cores, "
            "not seconds)"
        ),
    }
    command = f"`python -m placeflow.profiles.shared_cores --add-to {args.add_to}"
    said = (
        f"{'; '.join(how[k] for k in kinds)}; CPU busy with other work before: "
        f"{'?' if busy is None else f'{busy:.0%}'})."
    )
    if FrameworkKind.COLD_WEIGHTS in kinds:
        # The simulator prices a pass by the bytes past a core's own cache
        # (`CostModel.cold_weights_s`): its size goes with the entries.
        host = {**profile.provenance.host, "l2_bytes": l2}
        profile = dataclasses.replace(
            profile, provenance=dataclasses.replace(profile.provenance, host=host)
        )
    if set(kinds) == set(SHARED_KINDS):
        note = (
            f"{SENTENCE}, coupled_collective, shared_compute, shared_decode, shared_train, "
            "shared_call, empty_call, empty_wake, "
            "wake_call, cold_weights, paired_collective and ray_background: measured "
            f"{date} by "
            f"{command}` ({said}"
        )
        save_profile(with_shared_entries(profile, entries, note), args.add_to)
    else:
        names = [k.value for k in kinds]
        text = f"measured {date} by {command} --kinds {' '.join(names)}` ({said}"
        save_profile(with_some_kinds(profile, Op.FRAMEWORK, entries, names, text), args.add_to)
    for e in entries:
        print(_describe(e, cores))
    return 0


def _describe(e: Entry, cores: int) -> str:
    """One line of what `main` measured."""
    kind, units = FrameworkKind(str(e.params["kind"])), e.params["num_units"]
    spread = f"(p10 {e.p10_s * 1e3:.3f}, p90 {e.p90_s * 1e3:.3f})"
    if kind is FrameworkKind.SHARED_COLLECTIVE:
        return f"shared_collective: {e.median_s * 1e3:.3f} ms per collective {spread}"
    if kind is FrameworkKind.COUPLED_COLLECTIVE:
        return (
            f"coupled_collective: {e.median_s * 1e3:.3f} ms per collective, two pairings "
            f"in turn {spread}"
        )
    if kind is FrameworkKind.PAIRED_COLLECTIVE:
        return (
            f"paired_collective after {units} µs of compute, one rank per core: "
            f"{e.median_s * 1e3:.3f} ms per collective {spread}"
        )
    if kind in STRETCH_KINDS:
        piece = {
            FrameworkKind.SHARED_COMPUTE: "forward",
            FrameworkKind.SHARED_DECODE: "decode",
            FrameworkKind.SHARED_TRAIN: "training step",
        }[kind]
        return (
            f"{kind.value} with {units} busy ranks on {cores} cores: "
            f"{e.median_s * 1e3:.3f} ms per {piece} {spread}"
        )
    if kind is FrameworkKind.SHARED_CALL:
        return (
            f"shared_call with {units} ranks on {cores} cores: {e.median_s * 1e3:.3f} ms "
            f"per call beyond its forwards {spread}"
        )
    if kind is FrameworkKind.EMPTY_CALL:
        return (
            f"empty_call with {units} ranks on {cores} cores: {e.median_s * 1e3:.3f} ms "
            f"from its last launch {spread}"
        )
    if kind is FrameworkKind.EMPTY_WAKE:
        return (
            f"empty_wake after {units} ms idle, {cores} ranks on {cores} cores: "
            f"{e.median_s * 1e3:.3f} ms more per empty call {spread}"
        )
    if kind is FrameworkKind.COLD_WEIGHTS:
        return (
            f"cold_weights at {units} rows: {e.median_s * 1e3:.3f} ms more per pass over "
            f"{COLD_MODEL}'s weights {spread}"
        )
    if kind is FrameworkKind.RAY_BACKGROUND:
        return (
            f"ray_background with {units} ranks computing on {cores} cores: "
            f"{e.median_s:.3f} cores busy with other work (p10 {e.p10_s:.3f}, p90 {e.p90_s:.3f})"
        )
    return f"wake_call after {units} ms asleep: {e.median_s * 1e3:.3f} ms more {spread}"


if __name__ == "__main__":
    raise SystemExit(main())
