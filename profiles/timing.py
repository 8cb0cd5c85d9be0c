"""Kernel timer: warm-up, then timed samples; median, p10 and p90 in seconds.

One *sample* is the mean time of `calls_per_sample` back-to-back calls. Slow ops
take one call per sample; fast ops (a few µs) are batched until a sample lasts
at least `min_sample_s`, so that neither the clock's resolution nor its own
overhead dominates — the same idea as `timeit.Timer.autorange`. The statistics
are over samples, and `Timing.repeats` counts samples, not calls.

Clocks: `time.perf_counter` on CPU (ops there are synchronous), CUDA events on
GPU (the events bracket the queued kernels on the current stream; the end event
is synchronised before reading). Each measured point has a time budget: the
number of samples is cut (down to `MIN_REPEATS`) so that one huge op cannot
stall a profiling run. The Python garbage collector is paused while sampling,
as `timeit` does, so that a collection does not land inside a sample.

Where this departs from a textbook benchmark: caches are not flushed between
calls (a transformer layer re-reads its weights every micro-batch, so warm
caches are the common case), and samples are not interleaved across ops.
"""

from __future__ import annotations

import gc
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

# Fewest samples a point gets, whatever its budget: three give a median and a spread.
MIN_REPEATS = 3

# Shortest sample: perf_counter and CUDA events resolve ~0.1-0.5 µs and cost about
# as much to read, so 1 ms samples keep that error under 0.1 %.
DEFAULT_MIN_SAMPLE_S = 1e-3

# The autorange's last batch is timed again only while it lasts under this many
# minimum samples, so that a slow op (one call of seconds) is not run twice for it.
RETIME_BELOW_SAMPLES = 4


@dataclass(frozen=True, kw_only=True)
class Timing:
    """Statistics of one measured point, in seconds per call."""

    median_s: float
    p10_s: float
    p90_s: float
    repeats: int  # samples the statistics are over
    calls_per_sample: int  # calls averaged within each sample (> 1 for fast ops)


@dataclass(frozen=True, kw_only=True)
class SamplePlan:
    """How a point is sampled: `num_samples` samples of `calls_per_sample` calls."""

    calls_per_sample: int
    num_samples: int


class Clock(Protocol):
    """Measures the wall time of `calls` back-to-back calls of `fn`, in seconds."""

    def measure(self, fn: Callable[[], object], calls: int) -> float: ...


class CpuClock:
    """perf_counter around the calls; CPU torch ops return when they are done."""

    def measure(self, fn: Callable[[], object], calls: int) -> float:
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        return time.perf_counter() - start


class CudaClock:
    """CUDA events on the current stream around the calls, synchronised on the end event."""

    def measure(self, fn: Callable[[], object], calls: int) -> float:
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        return float(start.elapsed_time(end)) / 1e3  # elapsed_time is in ms


def make_clock(device: str) -> Clock:
    """The clock for a device kind ("cpu" or "cuda")."""
    clocks: dict[str, Callable[[], Clock]] = {"cpu": CpuClock, "cuda": CudaClock}
    if device not in clocks:
        raise ValueError(f"no clock for device {device!r}; known: {', '.join(clocks)}")
    return clocks[device]()


def plan_samples(
    call_s: float, *, repeats: int, budget_s: float, min_sample_s: float = DEFAULT_MIN_SAMPLE_S
) -> SamplePlan:
    """Batch size and sample count for an op whose one call takes about `call_s`.

    Deterministic in its inputs, so that the ranks of a collective that agree on
    `call_s` agree on the plan.
    """
    calls = max(1, math.ceil(min_sample_s / max(call_s, 1e-9)))
    sample_s = calls * max(call_s, 1e-9)
    affordable = int(budget_s // sample_s)
    floor = min(repeats, MIN_REPEATS)
    return SamplePlan(calls_per_sample=calls, num_samples=max(floor, min(repeats, affordable)))


def summarize(samples_s: Sequence[float], calls_per_sample: int) -> Timing:
    """Median, p10, p90 of per-call sample times (linear percentiles: p10 <= median <= p90)."""
    assert samples_s, "at least one sample"
    p10, median, p90 = np.percentile(np.asarray(samples_s, dtype=np.float64), [10, 50, 90])
    return Timing(
        median_s=float(median),
        p10_s=float(p10),
        p90_s=float(p90),
        repeats=len(samples_s),
        calls_per_sample=calls_per_sample,
    )


def estimate_call_s(
    fn: Callable[[], object], clock: Clock, *, min_sample_s: float = DEFAULT_MIN_SAMPLE_S
) -> float:
    """Time per call, doubling the batch until it lasts `min_sample_s` (timeit's autorange).

    The batch that crosses `min_sample_s` is timed twice and the faster kept where
    that costs a few samples' time: a preemption inside it only adds time, and an
    estimate it inflated would batch the sampling too little (a 90 ns call estimated
    at 16 µs got 62 calls a sample instead of ~11,000 on a busy 2-core host).
    """
    calls = 1
    while True:
        elapsed = clock.measure(fn, calls)
        if elapsed >= min_sample_s or calls >= 1 << 20:
            if elapsed < RETIME_BELOW_SAMPLES * min_sample_s:
                elapsed = min(elapsed, clock.measure(fn, calls))
            return elapsed / calls
        calls *= 2


def time_fn(
    fn: Callable[[], object],
    clock: Clock,
    *,
    warmup: int,
    repeats: int,
    budget_s: float,
    min_sample_s: float = DEFAULT_MIN_SAMPLE_S,
) -> Timing:
    """Warm `fn` up, then sample it within `budget_s` (at least `MIN_REPEATS` samples).

    The warm-up stops early once it has used half the budget: the first call of a
    huge op already pays for allocation and kernel selection.
    """
    started = time.perf_counter()
    for _ in range(max(1, warmup)):
        clock.measure(fn, 1)
        if time.perf_counter() - started > budget_s / 2:
            break
    call_s = estimate_call_s(fn, clock, min_sample_s=min_sample_s)
    plan = plan_samples(call_s, repeats=repeats, budget_s=budget_s, min_sample_s=min_sample_s)
    samples: list[float] = []
    sampling_started = time.perf_counter()
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        for _ in range(plan.num_samples):
            samples.append(clock.measure(fn, plan.calls_per_sample) / plan.calls_per_sample)
            out_of_budget = time.perf_counter() - sampling_started > budget_s
            if out_of_budget and len(samples) >= min(repeats, MIN_REPEATS):
                break
    finally:
        if gc_was_enabled:
            gc.enable()
    return summarize(samples, plan.calls_per_sample)
