"""The kernel profiler: times real torch kernels on this machine and returns a Profile.

`profile_device(device, grid=..., name=...)` times every point of a
`ProfilerGrid` (see `placeflow.profiles.grid`) with `placeflow.profiles.timing`
and the collectives with `placeflow.profiles.collectives`. How each op is run:

- gemm: `torch.matmul(A, B, out=C)` on preallocated contiguous tensors.
- attn_prefill_fwd: `scaled_dot_product_attention(q, k, v, is_causal=True,
  enable_gqa=True)` with q [b, heads, s, d] and k, v [b, kv_heads, s, d]. On a
  torch without `enable_gqa` the KV heads are expanded with `repeat_interleave`
  inside the timed call, as eager Llama code does (`repeat_kv`).
- attn_prefill_bwd: the forward runs once, untimed; then only
  `torch.autograd.grad(out, (q, k, v), grad_out, retain_graph=True)` is timed
  (retain_graph keeps the saved activations, so the same graph is differentiated
  at every call). It includes the GQA reduction of dK and dV.
- attn_decode: SDPA with one query token per sequence against a KV cache of
  kv_len tokens, no mask.
- elementwise (num_bytes is the input tensor, rows of 4096 elements where the
  size allows): rmsnorm `F.rms_norm` (x·rsqrt(mean(x²)+eps)·w where torch lacks
  it); silu_mul `silu(a)·b` with a, b the two halves of one input (the gate_up
  output); softmax over the last dim; add `x + y`. Outputs are allocated per
  call, as model code does.
- optimizer: `torch.optim.AdamW` (torch's default foreach choice) over
  num_params fp32 parameters split into tensors of at most 2**22 elements (a
  layer's weight matrices), `.grad` set; one `step()` is timed, its state
  already allocated by the warm-up.
- copy: `copy_(non_blocking=True)` between pinned host memory and the device,
  timed by CUDA events; on CPU between two host buffers (an offload on a CPU
  worker, whose device is the host: the executor's offloads copy so). Added to
  an existing CPU profile by `python -m placeflow.profiles.profiler
  --copies-to FILE`. `--kernels-to FILE` re-times a CPU profile's kernel entries
  (every op above but copies, at the points it holds) on this machine.
- dispatch: a Ray actor call's round trip with a payload of num_bytes (`ray_call`), and the
  driver's own share of one rank's call: its launch (`ray_launch`) and its result's get
  (`ray_get`)
  (`placeflow.profiles.ray_roundtrip`), driver wall clock.
- framework (CPU only): the engine's own host time per layer forward,
  backward and decode step, per call, per optimizer step, per rollout load and
  per weight sync, timed through its Transformer, Sampler, TrainEngine, load and
  `sync_disjoint` on a tiny model (`placeflow.profiles.framework`), thread CPU
  time; and what a collective adds when two busy ranks share each core, and the
  engine's forward with one and with two busy ranks per core, a call to
  such ranks, an empty call to them after they idled, a forward after its thread
  slept, and a pass over weights past a core's
  own cache (`placeflow.profiles.shared_cores`); the colocated reshard's host work
  beyond its all-gathers, per piece and per slot, and a ZeRO-3 rank's gather of each
  of its FSDP2 parameters beyond the plain all-gather (`placeflow.profiles.reshard_host`);
  what the engine's generation, forward and update each cost more after the rank's
  other calls and a pause (`placeflow.profiles.wake_calls`);
  and the controller's own work between the calls, the rule-based reward's scoring
  and each algorithm's advantages (`placeflow.profiles.controller_work`).

Inputs of GEMMs, decode and elementwise ops are views into one scratch buffer
filled once with uniform(-1, 1) values (no denormals, no per-point allocation
of multi-GB operands); GEMM outputs go to a separate buffer so no input is
ever overwritten. A point that is inconsistent with its own series (slower
than a larger size, or growing faster than its work) is re-timed, keeping the
lowest median: on a shared machine a burst of other work can inflate every
sample of a fast point. A CUDA point that runs out of GPU memory is skipped and
listed in the provenance notes, so one oversized point cannot end a long run.
On CPU the profiler times kernels with one torch thread by default, because a
CPU device is one core: the executor runs one worker per device with one
thread, and a profile taken with every core would price each worker's kernels
at the speed of all of them together. `threads` overrides it (restored
afterwards); the provenance records it.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import itertools
import logging
import os
import platform
import socket
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from placeflow.errors import MeasurementError, SpecError
from placeflow.profiles import ops
from placeflow.profiles.collectives import TORCH_DTYPES, measure_collectives
from placeflow.profiles.controller_work import measure_advantages, measure_rule_reward
from placeflow.profiles.framework import measure_framework
from placeflow.profiles.grid import CPU_COPY_BYTES, DTYPE_BYTES, GridPoint, ProfilerGrid
from placeflow.profiles.hostcheck import cpuinfo_fields, host_identity
from placeflow.profiles.ray_roundtrip import dispatch_points, measure_dispatch
from placeflow.profiles.reshard_host import measure_reshard_host
from placeflow.profiles.schema import (
    CopyDirection,
    DispatchKind,
    ElementwiseKind,
    Entry,
    FrameworkKind,
    Op,
    Profile,
    Provenance,
    Source,
    op_note,
    with_op_entries,
)
from placeflow.profiles.shared_cores import (
    measure_cold_weights,
    measure_coupled_collective,
    measure_empty_call,
    measure_empty_wake,
    measure_paired_collective,
    measure_ray_background,
    measure_shared_call,
    measure_shared_collective,
    measure_shared_compute,
    measure_wake_call,
)
from placeflow.profiles.timing import Clock, Timing, make_clock, time_fn
from placeflow.profiles.wake_calls import measure_wake_calls

log = logging.getLogger(__name__)

Bench = Callable[[], object]
ROW_ELEMENTS = 4096  # elementwise rows: a typical hidden size
OPTIMIZER_CHUNK = 1 << 22  # largest parameter tensor of an optimizer point
RMS_EPS = 1e-6
_ALIGN = 256  # elements; keeps every scratch view 512-byte aligned or better
RETRY_RATIO = 1.25  # see suspect_points
MAX_RETRIES = 2


@dataclass(frozen=True, kw_only=True)
class _Ctx:
    """What a bench builder needs: where, in which dtype, and the scratch buffers."""

    device: torch.device
    dtype: torch.dtype
    inputs: torch.Tensor  # flat, uniform(-1, 1), never written
    outputs: torch.Tensor  # flat, written by GEMMs
    enable_gqa: bool


def _views(flat: torch.Tensor, *shapes: tuple[int, ...]) -> list[torch.Tensor]:
    """Consecutive aligned views of `flat` with the given shapes."""
    out, offset = [], 0
    for shape in shapes:
        numel = 1
        for dim in shape:
            numel *= dim
        out.append(flat[offset : offset + numel].view(shape))
        offset += -(-numel // _ALIGN) * _ALIGN
    return out


def _scratch_numel(point: GridPoint) -> tuple[int, int]:
    """Elements of (inputs, outputs) scratch a point needs, alignment padding included."""
    p = point.params
    pad = 3 * _ALIGN
    if point.op is Op.GEMM:
        m, n, k = int(p["m"]), int(p["n"]), int(p["k"])
        return m * k + k * n + pad, m * n + pad
    if point.op is Op.ATTN_DECODE:
        b, d = int(p["batch"]), int(p["head_dim"])
        q = b * int(p["num_heads"]) * d
        return q + 2 * b * int(p["kv_len"]) * int(p["num_kv_heads"]) * d + pad, 0
    return 0, 0  # elementwise is sized by the caller (it knows the dtype)


# --- bench builders, one per op ---------------------------------------------


def _gemm(p: Mapping[str, int | str], ctx: _Ctx) -> Bench:
    m, n, k = int(p["m"]), int(p["n"]), int(p["k"])
    a, b = _views(ctx.inputs, (m, k), (k, n))
    (c,) = _views(ctx.outputs, (m, n))
    return lambda: torch.matmul(a, b, out=c)


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, gqa: bool) -> Bench:
    if gqa:
        return lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
    group = q.shape[1] // k.shape[1]

    def expanded() -> torch.Tensor:
        kk, vv = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        return F.scaled_dot_product_attention(q, kk, vv, is_causal=causal)

    return expanded


def _qkv(p: Mapping[str, int | str], ctx: _Ctx, grad: bool) -> list[torch.Tensor]:
    b, s, d = int(p["batch"]), int(p["seq"]), int(p["head_dim"])
    shapes = ((b, int(p["num_heads"]), s, d), *[(b, int(p["num_kv_heads"]), s, d)] * 2)
    return [
        (torch.rand(shape, device=ctx.device, dtype=ctx.dtype) * 2 - 1).requires_grad_(grad)
        for shape in shapes
    ]


def _attn_fwd(p: Mapping[str, int | str], ctx: _Ctx) -> Bench:
    q, k, v = _qkv(p, ctx, grad=False)
    return _sdpa(q, k, v, causal=True, gqa=ctx.enable_gqa)


def _attn_bwd(p: Mapping[str, int | str], ctx: _Ctx) -> Bench:
    q, k, v = _qkv(p, ctx, grad=True)
    with torch.enable_grad():  # the graph must exist even if the caller disabled grad
        out = _sdpa(q, k, v, causal=True, gqa=ctx.enable_gqa)()
    assert isinstance(out, torch.Tensor)
    grad_out = torch.rand_like(out) * 2 - 1
    return lambda: torch.autograd.grad(out, (q, k, v), grad_out, retain_graph=True)


def _attn_decode(p: Mapping[str, int | str], ctx: _Ctx) -> Bench:
    b, n, d = int(p["batch"]), int(p["kv_len"]), int(p["head_dim"])
    kv_shape = (b, int(p["num_kv_heads"]), n, d)
    q, k, v = _views(ctx.inputs, (b, int(p["num_heads"]), 1, d), kv_shape, kv_shape)
    return _sdpa(q, k, v, causal=False, gqa=ctx.enable_gqa)


def _rms_norm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    if hasattr(F, "rms_norm"):
        return F.rms_norm(x, (x.shape[-1],), w, RMS_EPS)
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + RMS_EPS) * w


def _elementwise(p: Mapping[str, int | str], ctx: _Ctx) -> Bench:
    numel = int(p["num_bytes"]) // ctx.inputs.element_size()
    width = ROW_ELEMENTS if numel % ROW_ELEMENTS == 0 else numel
    x, y, w = _views(ctx.inputs, (numel // width, width), (numel // width, width), (width,))
    kind = ElementwiseKind(str(p["kind"]))
    benches: dict[ElementwiseKind, Bench] = {
        ElementwiseKind.RMSNORM: lambda: _rms_norm(x, w),
        ElementwiseKind.SILU_MUL: lambda: _silu_mul(x),
        ElementwiseKind.SOFTMAX: lambda: torch.softmax(x, dim=-1),
        ElementwiseKind.ADD: lambda: x + y,
    }
    return benches[kind]


def _silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def _optimizer(p: Mapping[str, int | str], ctx: _Ctx) -> Bench:
    remaining, params = int(p["num_params"]), []
    while remaining > 0:
        size = min(remaining, OPTIMIZER_CHUNK)
        param = torch.nn.Parameter(torch.rand(size, device=ctx.device, dtype=torch.float32))
        param.grad = torch.rand_like(param) * 2 - 1
        params.append(param)
        remaining -= size
    opt = torch.optim.AdamW(params, lr=1e-4)
    return opt.step


def _copy(p: Mapping[str, int | str], ctx: _Ctx) -> Bench:
    numel = int(p["num_bytes"])
    host = torch.empty(numel, dtype=torch.uint8, pin_memory=ctx.device.type == "cuda")
    dev = torch.empty(numel, dtype=torch.uint8, device=ctx.device)
    if CopyDirection(str(p["direction"])) is CopyDirection.H2D:
        return lambda: dev.copy_(host, non_blocking=True)
    return lambda: host.copy_(dev, non_blocking=True)


_BENCHES: dict[Op, Callable[[Mapping[str, int | str], _Ctx], Bench]] = {
    Op.GEMM: _gemm,
    Op.ATTN_PREFILL_FWD: _attn_fwd,
    Op.ATTN_PREFILL_BWD: _attn_bwd,
    Op.ATTN_DECODE: _attn_decode,
    Op.ELEMENTWISE: _elementwise,
    Op.OPTIMIZER: _optimizer,
    Op.COPY: _copy,
}


# --- device set-up and provenance -------------------------------------------


def _check_device(device: str, grid: ProfilerGrid) -> None:
    if device not in ("cpu", "cuda"):
        raise SpecError(f"profile_device: device must be 'cpu' or 'cuda', got {device!r}")
    if grid.device != device:
        raise SpecError(
            f"profile_device: the grid was built for {grid.device!r} but device is {device!r}; "
            f"build it with ProfilerGrid.quick({device!r}) or ProfilerGrid.full({device!r})"
        )
    if device == "cuda" and not torch.cuda.is_available():
        raise SpecError(
            f"profile_device: device 'cuda' requested but torch {torch.__version__} sees no "
            "CUDA device; profile 'cpu' instead, or run on a machine with a GPU"
        )
    if device == "cuda" and max(grid.collective_world_sizes, default=0) > _num_gpus():
        raise SpecError(
            f"profile_device: collective world sizes {list(grid.collective_world_sizes)} need "
            f"up to {max(grid.collective_world_sizes)} GPUs; this machine has {_num_gpus()}"
        )


def _num_gpus() -> int:
    return torch.cuda.device_count()


def _supports_enable_gqa() -> bool:
    """Whether this torch's SDPA takes `enable_gqa` (added in torch 2.5)."""
    q, kv = torch.zeros(1, 2, 1, 8), torch.zeros(1, 1, 1, 8)
    try:
        F.scaled_dot_product_attention(q, kv, kv, enable_gqa=True)
    except TypeError:
        return False
    return True


def _cpu_model() -> str:
    name = cpuinfo_fields().get("model name")
    return name or platform.processor() or platform.machine() or "unknown CPU"


def last_level_cache_bytes(root: Path = Path("/sys/devices/system/cpu/cpu0/cache")) -> int | None:
    """The size of this host's last-level CPU cache as the OS reports it (the highest
    `level` under `root`, Linux's sysfs); None where it does not."""
    sizes = _cache_sizes(root)
    return sizes[max(sizes)] if sizes else None


def level2_cache_bytes(root: Path = Path("/sys/devices/system/cpu/cpu0/cache")) -> int | None:
    """The size of cpu0's level-2 cache as the OS reports it (a core's own on the hosts
    placeflow runs on); None where it does not."""
    return _cache_sizes(root).get(2)


def _cache_sizes(root: Path) -> dict[int, int]:
    """Cache level -> size in bytes under `root` (Linux's sysfs): the size listed last
    for each level (level 1's data and instruction caches share a level; from level 2 up
    the hosts placeflow runs on list one unified cache per level)."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    sizes: dict[int, int] = {}
    for index in sorted(root.glob("index*")):
        try:
            level = int((index / "level").read_text().strip())
            size = (index / "size").read_text().strip()
            num = int(size[:-1]) * units[size[-1]] if size[-1:] in units else int(size)
        except (OSError, ValueError):
            continue  # an entry the OS does not fill in, or a size it writes otherwise
        sizes[level] = num
    return sizes


def _host(device: str) -> dict[str, object]:
    host: dict[str, object] = {
        "hostname": socket.gethostname(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "os": platform.platform(),
        "python": platform.python_version(),
        "cpu_model": _cpu_model(),
        "llc_bytes": last_level_cache_bytes(),
        # A core's own cache: the `cold_weights` entries this command measures on CPU are
        # priced by the bytes past it (`CostModel.cold_weights_s`), 0 without it (the
        # profile of 2026-12-03 measured them and lacked it).
        "l2_bytes": level2_cache_bytes(),
    }
    # Which CPU this is beyond its name (family, model number, the ISA torch uses), so
    # that a later host can be told apart (`hostcheck`).
    host = {**host_identity(), **host}
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        host |= {
            "cuda_version": torch.version.cuda,
            "num_gpus": _num_gpus(),
            "gpu_memory_bytes": int(props.total_memory),
        }
    return host


_NOTES = (
    "median/p10/p90 over samples after warm-up; a sample averages a batch of calls for "
    "fast ops (timing.py); clock: {clock}; attention backward timed alone via "
    "torch.autograd.grad(retain_graph=True); SDPA GQA via {gqa}; collectives over "
    "{backend}, max over ranks per sample; {threads} torch threads; points inconsistent with "
    "their series re-timed up to {retries} times, keeping the lowest median"
)


def cpu_busy_fraction(window_s: float = 0.5) -> float | None:
    """Fraction of all cores' time spent busy over a short window (Linux /proc/stat), or None.

    Taken while the profiler itself is idle, it measures other work on the machine,
    which inflates CPU timings (a 2-thread op waits for a core another process holds).
    """

    def snapshot() -> tuple[int, int]:
        with open("/proc/stat", encoding="utf-8") as stat:
            ticks = [int(x) for x in stat.readline().split()[1:]]
        return ticks[3] + ticks[4], sum(ticks)  # idle + iowait, total

    try:
        idle0, total0 = snapshot()
        time.sleep(window_s)
        idle1, total1 = snapshot()
    except (OSError, ValueError, IndexError):
        return None
    total = total1 - total0
    return 1.0 - (idle1 - idle0) / total if total > 0 else 0.0


@dataclass(frozen=True, kw_only=True)
class _Load:
    """How busy the machine was around the run, and how long the run took."""

    busy_before: float | None  # cpu_busy_fraction() before the first point
    started_s: float  # time.monotonic() at the start


def _load_notes(load: _Load) -> str:
    text = f"; profiled in {time.monotonic() - load.started_s:.0f} s"
    before, after = load.busy_before, cpu_busy_fraction()
    if before is None or after is None:
        return text
    text += f"; CPU busy with other work before/after: {before:.0%}/{after:.0%}"
    if max(before, after) > 0.2:
        text += " (CPU timings may be inflated)"
    return text


def _provenance(device: str, grid: ProfilerGrid, measured: _Measured, load: _Load) -> Provenance:
    is_cuda = device == "cuda"
    notes = _NOTES.format(
        clock="CUDA events" if is_cuda else "time.perf_counter",
        gqa="enable_gqa=True" if measured.enable_gqa else "repeat_interleave of KV heads",
        backend="NCCL" if is_cuda else "gloo (1 thread per rank)",
        threads=torch.get_num_threads(),
        retries=MAX_RETRIES,
    )
    notes += _load_notes(load)
    if measured.skipped:
        shown = "; ".join(measured.skipped[:20])
        notes += f"; {len(measured.skipped)} points skipped, out of GPU memory: {shown}"
    return Provenance(
        source=Source.MEASURED,
        device_name=torch.cuda.get_device_name(0) if is_cuda else _cpu_model(),
        torch_version=str(torch.__version__),
        dtype=grid.dtype,
        date=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        host=_host(device),
        notes=notes,
    )


# --- the run ------------------------------------------------------------------


Report = Callable[[str, int], None]  # report(description, points_done)


@contextlib.contextmanager
def _progress(total: int, enabled: bool) -> Iterator[Report]:
    """Yields report(description, points_done) for the progress bar (a no-op if disabled)."""
    if not enabled:
        yield lambda _description, _done: None
        return
    columns = (
        TextColumn("{task.description:<40}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=Console(stderr=True)) as bar:
        task = bar.add_task("profiling", total=total)
        yield lambda description, done: bar.update(task, advance=done, description=description)


def _make_ctx(device: str, grid: ProfilerGrid, points: tuple[GridPoint, ...]) -> _Ctx:
    dtype = TORCH_DTYPES[grid.dtype]
    needs = [_scratch_numel(p) for p in points]
    # add reads two inputs and rmsnorm a weight row: 2x the size plus slack.
    elementwise = max(grid.elementwise_bytes, default=0) * 2 // DTYPE_BYTES[grid.dtype]
    num_inputs = max([n for n, _ in needs] + [elementwise + 4 * _ALIGN + ROW_ELEMENTS])
    num_outputs = max([n for _, n in needs] + [1])
    torch_device = torch.device(device)
    inputs = torch.empty(num_inputs, dtype=dtype, device=torch_device).uniform_(-1, 1)
    outputs = torch.empty(num_outputs, dtype=dtype, device=torch_device)
    gqa = _supports_enable_gqa()
    return _Ctx(device=torch_device, dtype=dtype, inputs=inputs, outputs=outputs, enable_gqa=gqa)


def _entry(op: Op, params: Mapping[str, int | str], t: Timing) -> Entry:
    return Entry(
        op=op,
        params=params,
        median_s=t.median_s,
        p10_s=t.p10_s,
        p90_s=t.p90_s,
        repeats=t.repeats,
        source=Source.MEASURED,
    )


def _label(point: GridPoint) -> str:
    return f"{point.op.value} " + " ".join(str(v) for v in point.params.values())


def suspect_points(points: Sequence[GridPoint], timings: Sequence[Timing | None]) -> list[int]:
    """Indices of points whose time looks inflated by interference, most inflated first.

    Along a series (`ops.series_key`) sorted by size, a point is suspect if it is
    slower than the next larger point by RETRY_RATIO, or if it grew from the
    next smaller point by more than RETRY_RATIO times its work ratio (size
    ratio, squared for prefill attention). Both happen genuinely too (kernel
    changes, cache edges); re-timing such a point merely confirms it. Points
    without a timing (skipped) are ignored.
    """
    series: dict[tuple[Op, ops.SeriesKey], list[int]] = defaultdict(list)
    for i, point in enumerate(points):
        if timings[i] is not None:
            series[(point.op, ops.series_key(point.op, point.params))].append(i)
    excess: dict[int, float] = {}  # suspect -> how far past the allowed ratio it is
    for (op, _), idx in series.items():
        idx.sort(key=lambda i: ops.size(op, points[i].params))
        exponent = 2 if op in (Op.ATTN_PREFILL_FWD, Op.ATTN_PREFILL_BWD) else 1
        for a, b in itertools.pairwise(idx):
            t_a, t_b = _median(timings[a]), _median(timings[b])
            work = (ops.size(op, points[b].params) / ops.size(op, points[a].params)) ** exponent
            for i, ratio in ((a, t_a / (RETRY_RATIO * t_b)), (b, t_b / (RETRY_RATIO * work * t_a))):
                if ratio > 1:
                    excess[i] = max(excess.get(i, 0.0), ratio)
    return sorted(excess, key=lambda i: -excess[i])


def _median(timing: Timing | None) -> float:
    assert timing is not None
    return timing.median_s


def _time_point(point: GridPoint, ctx: _Ctx, clock: Clock, grid: ProfilerGrid) -> Timing | None:
    """The point's timing, or None if it does not fit in GPU memory."""
    try:
        bench = _BENCHES[point.op](point.params, ctx)
        return time_fn(
            bench, clock, warmup=grid.warmup, repeats=grid.repeats, budget_s=grid.point_budget_s
        )
    except torch.OutOfMemoryError:
        # One oversized point (e.g. attention falling back to the math kernel) must not
        # end a long run; it is listed in the provenance notes instead.
        return None


@dataclass(frozen=True, kw_only=True)
class _Measured:
    entries: list[Entry]
    enable_gqa: bool
    skipped: list[str]  # labels of points that ran out of GPU memory


def _measure_points(
    device: str, grid: ProfilerGrid, report: Report, points: tuple[GridPoint, ...] | None = None
) -> _Measured:
    """Time every non-collective point of `grid` (or `points`, timed with its settings).

    Suspect points (see `suspect_points`) are re-timed up to MAX_RETRIES times,
    keeping the lowest median: interference only ever adds time.
    """
    points = grid.points() if points is None else points
    ctx = _make_ctx(device, grid, points)
    clock = make_clock(device)
    timings = []
    for point in points:
        report(_label(point), 1)
        timings.append(_time_point(point, ctx, clock, grid))
    # On a machine busy for minutes most points look suspect and re-timing cannot help:
    # re-time only the worst tenth per round.
    max_per_round = max(10, len(points) // 10)
    for _ in range(MAX_RETRIES):
        for i in suspect_points(points, timings)[:max_per_round]:
            report(f"re-timing {_label(points[i])}", 0)
            again = _time_point(points[i], ctx, clock, grid)
            timings[i] = min(timings[i], again or timings[i], key=_median)
    pairs = list(zip(points, timings, strict=True))
    return _Measured(
        entries=[_entry(p.op, p.params, t) for p, t in pairs if t is not None],
        enable_gqa=ctx.enable_gqa,
        skipped=[_label(p) for p, t in pairs if t is None],
    )


def _host_overhead() -> list[Entry]:
    """The CPU profile's framework and shared-core entries. A part this host cannot
    measure (too noisy, a rank that hung) is left out with a warning that names the
    command adding it later: the kernels timed before it are kept."""
    parts: tuple[tuple[str, Callable[[], list[Entry]], str], ...] = (
        ("framework overhead", measure_framework, "placeflow.profiles.framework"),
        (
            "shared collective",
            lambda: [measure_shared_collective()],
            "placeflow.profiles.shared_cores",
        ),
        (
            "coupled collective",
            lambda: [measure_coupled_collective()],
            "placeflow.profiles.shared_cores --kinds coupled_collective",
        ),
        ("shared compute", measure_shared_compute, "placeflow.profiles.shared_cores"),
        (
            "shared decode",
            lambda: measure_shared_compute(kind=FrameworkKind.SHARED_DECODE),
            "placeflow.profiles.shared_cores --kinds shared_decode",
        ),
        (
            "shared training step",
            lambda: measure_shared_compute(kind=FrameworkKind.SHARED_TRAIN),
            "placeflow.profiles.shared_cores --kinds shared_train",
        ),
        ("shared call", measure_shared_call, "placeflow.profiles.shared_cores"),
        ("empty call", measure_empty_call, "placeflow.profiles.shared_cores --kinds empty_call"),
        (
            "empty call's wake-up",
            measure_empty_wake,
            "placeflow.profiles.shared_cores --kinds empty_wake",
        ),
        ("wake call", measure_wake_call, "placeflow.profiles.shared_cores --kinds wake_call"),
        (
            "cold weights",
            measure_cold_weights,
            "placeflow.profiles.shared_cores --kinds cold_weights",
        ),
        (
            "paired collective",
            measure_paired_collective,
            "placeflow.profiles.shared_cores --kinds paired_collective",
        ),
        (
            "Ray background",
            measure_ray_background,
            "placeflow.profiles.shared_cores --kinds ray_background",
        ),
        ("reshard host work", measure_reshard_host, "placeflow.profiles.reshard_host"),
        ("calls' wake-up", measure_wake_calls, "placeflow.profiles.wake_calls"),
        (
            "controller work",
            lambda: [*measure_rule_reward(), *measure_advantages()],
            "placeflow.profiles.controller_work",
        ),
    )
    entries: list[Entry] = []
    for what, measure, module in parts:
        try:
            entries.extend(measure())
        except MeasurementError as exc:
            log.warning(
                "profile: %s not measured (%s); the profile is written without it: add it "
                "later with `python -m %s --add-to PROFILE`",
                what,
                exc,
                module,
            )
    return entries


def profile_device(
    device: str,
    *,
    grid: ProfilerGrid,
    name: str,
    progress: bool = True,
    threads: int | None = None,
    framework: bool = True,
) -> Profile:
    """Time every point of `grid` on this machine's `device` ("cpu" or "cuda"), and on
    CPU (with `framework`) the engine's framework overhead.

    Raises SpecError if `device` is unknown, does not match the grid, or is
    "cuda" on a machine without a CUDA device.
    """
    _check_device(device, grid)
    previous_threads = torch.get_num_threads()
    if device == "cpu":
        # One core per CPU device, as the executor runs its workers (module docstring).
        torch.set_num_threads(threads or 1)
    load = _Load(busy_before=cpu_busy_fraction(), started_s=time.monotonic())
    try:
        kinds = tuple(DispatchKind)
        total = (
            len(grid.points())
            + grid.num_collective_points()
            + len(dispatch_points(grid.dispatch_bytes, kinds))
        )
        with _progress(total, progress) as report:
            measured = _measure_points(device, grid, report)
            collectives = measure_collectives(grid, on_point=lambda: report("collectives", 1))
            dispatch = measure_dispatch(
                grid.dispatch_bytes,
                warmup=grid.warmup,
                repeats=grid.repeats,
                on_point=lambda: report("ray calls", 1),
                kinds=kinds,
            )
            # The engine's host overhead is measured where the engine runs: on CPU here,
            # and, on shared cores, the wait of collectives, the cost of time slices and
            # a call's fixed time.
            overhead = _host_overhead() if framework and device == "cpu" else []
        provenance = _provenance(device, grid, measured, load)
    finally:
        torch.set_num_threads(previous_threads)
    return Profile(
        name=name,
        device_kind=device,
        provenance=provenance,
        entries=(*measured.entries, *collectives, *dispatch, *overhead),
        grid=grid.to_json(),
    )


def _cpu_profile(path: Path, what: str) -> Profile:
    """The CPU profile at `path`, which `what` (e.g. "CPU copies") is added to."""
    from placeflow.profiles.schema import load_profile_file

    profile = load_profile_file(path)
    if profile.device_kind != "cpu":
        raise SpecError(f"{path}: {what} go into a CPU profile; this one is {profile.device_kind}")
    return profile


def time_on_one_thread(
    grid: ProfilerGrid, points: tuple[GridPoint, ...], progress: bool
) -> tuple[list[Entry], float | None]:
    """`points` timed on the CPU with one torch thread (restored afterwards) and `grid`'s
    settings, and how busy the CPU was with other work before."""
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(1)
    busy = cpu_busy_fraction()
    try:
        with _progress(len(points), progress) as report:
            entries = _measure_points("cpu", grid, report, points).entries
    finally:
        torch.set_num_threads(previous_threads)
    return entries, busy


def add_cpu_copies(
    path: Path, *, sizes: Sequence[int] = CPU_COPY_BYTES, progress: bool = True
) -> list[Entry]:
    """Time host copies of `sizes` bytes (both directions, one torch thread) and put them
    into the CPU profile at `path` as its `copy` entries, with a provenance note."""
    from placeflow.profiles.schema import save_profile

    profile = _cpu_profile(path, "CPU copies")
    grid = ProfilerGrid(device="cpu", dtype="fp32", copy_bytes=tuple(sizes), repeats=10)
    entries, busy = time_on_one_thread(grid, grid.points(), progress)
    date = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    llc = last_level_cache_bytes()
    note = op_note(
        Op.COPY,
        f"): measured {date} by `python -m placeflow.profiles.profiler --copies-to {path}` "
        "(a copy between two host buffers, the offloads of a CPU worker; 1 torch thread, "
        f"time.perf_counter; CPU busy with other work before: "
        f"{'?' if busy is None else f'{busy:.0%}'}; the host's last-level cache, "
        f"{llc if llc is not None else 'not reported'} bytes as the OS reports it, "
        "recorded in the provenance's host as llc_bytes).",
    )
    # The copies' bandwidth falls where two buffers outgrow the last-level cache; the
    # simulator reads its size from here (`CostModel.host_cache_bytes`).
    host = {**profile.provenance.host, "llc_bytes": llc}
    profile = dataclasses.replace(
        profile, provenance=dataclasses.replace(profile.provenance, host=host)
    )
    save_profile(with_op_entries(profile, Op.COPY, entries, note), path)
    return entries


# The kernels `add_cpu_kernels` re-times: every op of a profile's grid but its copies.
KERNEL_OPS = (
    Op.GEMM,
    Op.ATTN_PREFILL_FWD,
    Op.ATTN_PREFILL_BWD,
    Op.ATTN_DECODE,
    Op.ELEMENTWISE,
    Op.OPTIMIZER,
)


def timing_grid(profile: Profile) -> ProfilerGrid:
    """A CPU grid with the timing settings `profile` was measured with (its stored
    grid's, where it recorded them, else the defaults): to time its points again."""
    settings = ("warmup", "repeats", "point_budget_s")
    stored = {k: v for k, v in (profile.grid or {}).items() if k in settings}
    return ProfilerGrid(device="cpu", dtype=profile.provenance.dtype, **stored)


def add_cpu_kernels(path: Path, *, progress: bool = True) -> list[Entry]:
    """Re-time, on this machine, every kernel point the CPU profile at `path` holds
    (`KERNEL_OPS`, each at the parameters of its entries, with the profile's grid
    settings) and replace those entries, with a provenance note per op; the other
    entries (collectives, copies, dispatch, framework) and their notes are kept.

    A profile describes the machine the plans run on: a session on another machine of
    the same kind (the same CPU model name) may time its kernels differently, and the
    simulator's framework entries are priced against these kernels
    (`simulator.compute.framework_host_s`), so both should come from the same host."""
    from placeflow.profiles.schema import save_profile

    profile = _cpu_profile(path, "CPU kernels")
    grid = timing_grid(profile)
    points = tuple(
        GridPoint(op=e.op, params=e.params) for e in profile.entries if e.op in KERNEL_OPS
    )
    if not points:
        raise SpecError(f"{path}: no kernel entries to re-time ({', '.join(KERNEL_OPS)})")
    start = time.monotonic()
    entries, busy = time_on_one_thread(grid, points, progress)
    date = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    text = (
        f"): re-timed {date} by `python -m placeflow.profiles.profiler --kernels-to {path}` "
        f"at the points the profile held (1 torch thread, time.perf_counter; "
        f"{len(points)} points in {time.monotonic() - start:.0f} s; CPU busy with other work "
        f"before: {'?' if busy is None else f'{busy:.0%}'})."
    )
    for op in KERNEL_OPS:
        mine = [e for e in entries if e.op is op]
        if mine:
            profile = with_op_entries(profile, op, mine, op_note(op, text))
    save_profile(profile, path)
    return entries


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Add measured host copies to a CPU profile, or re-time its kernels here."
    )
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--copies-to", type=Path, help="a CPU profile JSON file")
    what.add_argument(
        "--kernels-to", type=Path, help="a CPU profile JSON file whose kernels to re-time here"
    )
    args = parser.parse_args(argv)
    if args.kernels_to is not None:
        entries = add_cpu_kernels(args.kernels_to)
        print(f"re-timed {len(entries)} kernel entries into {args.kernels_to}")
        return 0
    for e in add_cpu_copies(args.copies_to):
        size = int(e.params["num_bytes"])
        print(
            f"{e.params['direction']} {size:>11} B: {e.median_s * 1e6:10.1f} us "
            f"({size / e.median_s / 1e9:.1f} GB/s)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
