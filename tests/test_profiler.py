"""The kernel profiler on a handful of real CPU points, its grids, timer and collectives.

One small grid (every op kind, a 2-rank gloo collective) is profiled once per
module; the tests check the returned Profile against the schema's invariants,
a physical oracle (a GEMM of twice the FLOPs takes longer), and that a failing
collective worker surfaces as an exception instead of a hang.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
import os
import time

import pytest
import torch
import torch.distributed as dist

from placeflow.catalogue import CATALOGUE
from placeflow.errors import SpecError
from placeflow.procs import free_port
from placeflow.profiles import ops
from placeflow.profiles.collectives import (
    CollectiveError,
    CollectiveJob,
    init_group,
    run_world,
)
from placeflow.profiles.grid import (
    MIN_SERIES_POINTS,
    AttnShape,
    DecodeShape,
    GemmShape,
    GridPoint,
    ProfilerGrid,
    layer_gemms,
)
from placeflow.profiles.profiler import profile_device, suspect_points
from placeflow.profiles.schema import (
    CollectiveKind,
    ElementwiseKind,
    Op,
    Profile,
    Source,
    load_profile_file,
    save_profile,
)
from placeflow.profiles.timing import (
    MIN_REPEATS,
    CpuClock,
    Timing,
    estimate_call_s,
    plan_samples,
    summarize,
    time_fn,
)

# The oracle pair: the same (n, k), m doubled. ~1 and ~2 GFLOP: milliseconds on any CPU,
# far above timer noise.
GEMM_SMALL = GemmShape(m=512, n=1024, k=1024)
GEMM_LARGE = GemmShape(m=1024, n=1024, k=1024)

SMALL_GRID = ProfilerGrid(
    device="cpu",
    dtype="fp32",
    gemm_shapes=(GemmShape(m=8, n=256, k=128), GEMM_SMALL, GEMM_LARGE),
    attn_prefill_shapes=(AttnShape(batch=1, seq=128, num_heads=4, num_kv_heads=2, head_dim=32),),
    attn_decode_shapes=(
        DecodeShape(batch=2, kv_len=256, num_heads=4, num_kv_heads=2, head_dim=32),
    ),
    elementwise_kinds=tuple(ElementwiseKind),
    elementwise_bytes=(64 * 1024,),
    optimizer_num_params=(100_000,),
    collective_kinds=(CollectiveKind.ALL_REDUCE, CollectiveKind.SEND_RECV),
    collective_world_sizes=(2,),
    collective_bytes=(64 * 1024,),
    copy_bytes=(64 * 1024, 1 << 20),
    warmup=1,
    repeats=5,
    point_budget_s=0.2,
)


@pytest.fixture(scope="module")
def profile() -> Profile:
    # The engine's framework overhead has its own tests (test_framework_overhead.py).
    return profile_device("cpu", grid=SMALL_GRID, name="test-cpu", progress=False, framework=False)


# --- the profile ----------------------------------------------------------------


def test_profile_has_every_op_of_its_grid(profile: Profile) -> None:
    expected = {p.op.value for p in SMALL_GRID.points()} | {Op.COLLECTIVE.value}
    assert set(profile.coverage()) == expected
    assert len(profile.entries) == len(SMALL_GRID.points()) + SMALL_GRID.num_collective_points()
    assert profile.device_kind == "cpu"
    assert profile.grid == SMALL_GRID.to_json()


def test_times_are_positive_and_ordered(profile: Profile) -> None:
    for e in profile.entries:
        assert e.source is Source.MEASURED
        assert 0 < e.p10_s <= e.median_s <= e.p90_s, e
        assert e.repeats >= 1
        assert e.median_s < 10.0, e  # seconds: nothing in this grid is that slow


def test_collective_entries_are_intra_node(profile: Profile) -> None:
    collectives = profile.entries_for(Op.COLLECTIVE)
    assert {e.params["kind"] for e in collectives} == {"all_reduce", "send_recv"}
    assert all(e.params["scope"] == "intra" and e.params["world_size"] == 2 for e in collectives)


def test_provenance_is_filled(profile: Profile) -> None:
    p = profile.provenance
    assert p.source is Source.MEASURED
    assert p.device_name
    assert p.torch_version == torch.__version__
    assert p.dtype == "fp32"
    assert datetime.datetime.fromisoformat(p.date).tzinfo is not None
    assert {"hostname", "cpu_count", "torch_threads", "os", "python"} <= set(p.host)
    assert p.host["torch_threads"] == 1  # a CPU device is one core (profiler.py)
    assert "profiled in" in p.notes


def test_json_round_trip(profile: Profile, tmp_path) -> None:
    path = save_profile(profile, tmp_path / "cpu.json")
    loaded = load_profile_file(path)
    assert loaded == profile
    assert loaded.to_json() == profile.to_json()


def test_twice_the_flops_takes_longer(profile: Profile) -> None:
    times = {
        (e.params["m"], e.params["n"], e.params["k"]): e.median_s
        for e in profile.entries_for(Op.GEMM)
    }
    small = times[(GEMM_SMALL.m, GEMM_SMALL.n, GEMM_SMALL.k)]
    large = times[(GEMM_LARGE.m, GEMM_LARGE.n, GEMM_LARGE.k)]
    assert large > small


def test_cuda_request_without_cuda_is_a_spec_error() -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(SpecError, match="no CUDA device"):
        profile_device("cuda", grid=ProfilerGrid(device="cuda", dtype="bf16"), name="x")


def test_grid_device_must_match() -> None:
    with pytest.raises(SpecError, match="built for 'cuda'"):
        profile_device("cpu", grid=ProfilerGrid(device="cuda", dtype="bf16"), name="x")


@pytest.mark.gpu
def test_cuda_profile_with_copies() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    grid = ProfilerGrid(
        device="cuda",
        dtype="bf16",
        gemm_shapes=(GemmShape(m=256, n=1024, k=1024),),
        attn_prefill_shapes=(
            AttnShape(batch=1, seq=256, num_heads=8, num_kv_heads=2, head_dim=64),
        ),
        elementwise_kinds=(ElementwiseKind.ADD,),
        elementwise_bytes=(1 << 20,),
        optimizer_num_params=(1 << 16,),
        copy_bytes=(1 << 20,),
    )
    profile = profile_device("cuda", grid=grid, name="test-cuda", progress=False)
    assert {"gemm", "attn_prefill_fwd", "attn_prefill_bwd", "copy"} <= set(profile.coverage())
    assert all(0 < e.p10_s <= e.median_s <= e.p90_s for e in profile.entries)


# --- collectives: failures surface, never hang -------------------------------------


def _failing_worker(rank: int, job: CollectiveJob, results) -> None:
    """Rank 1 raises after joining the group; rank 0 blocks in a collective meanwhile."""
    try:
        init_group(rank, job)
        if rank == 1:
            raise RuntimeError("forced failure in rank 1")
        dist.all_reduce(torch.zeros(4))
        results.put(("done", rank))
    except BaseException:
        import traceback

        results.put(("error", rank, traceback.format_exc()))
        raise SystemExit(1) from None


def _crashing_worker(rank: int, job: CollectiveJob, results) -> None:
    """Rank 1 dies without a word (as a segfault would); rank 0 waits for it forever."""
    if rank == 1:
        os._exit(3)
    time.sleep(600)


def _job(world_size: int = 2) -> CollectiveJob:
    return CollectiveJob(
        device="cpu",
        dtype="fp32",
        world_size=world_size,
        port=free_port(),
        kinds=(CollectiveKind.ALL_REDUCE,),
        sizes_bytes=(1024,),
        warmup=1,
        repeats=3,
        point_budget_s=0.1,
        init_timeout_s=30.0,
    )


def test_worker_error_surfaces_as_exception() -> None:
    started = time.monotonic()
    with pytest.raises(CollectiveError, match="forced failure in rank 1"):
        run_world(_job(), worker=_failing_worker, stall_timeout_s=60.0)
    assert time.monotonic() - started < 60.0


def test_worker_crash_surfaces_as_exception() -> None:
    started = time.monotonic()
    with pytest.raises(CollectiveError, match="exited with code 3"):
        run_world(_job(), worker=_crashing_worker, stall_timeout_s=60.0)
    assert time.monotonic() - started < 60.0


def test_silent_workers_time_out() -> None:
    with pytest.raises(CollectiveError, match="no progress"):
        run_world(_job(), worker=_sleeping_worker, stall_timeout_s=2.0)


def _sleeping_worker(rank: int, job: CollectiveJob, results) -> None:
    time.sleep(600)


# --- grids -----------------------------------------------------------------------


def _series_sizes(grid: ProfilerGrid) -> dict[tuple, list[float]]:
    series: dict[tuple, list[float]] = {}
    for p in grid.points():
        series.setdefault((p.op, ops.series_key(p.op, p.params)), []).append(
            ops.size(p.op, p.params)
        )
    return series


def test_quick_cpu_grid_covers_every_op_with_enough_points() -> None:
    grid = ProfilerGrid.quick("cpu")
    # Collectives and Ray calls are measured in their own processes, not as points; the
    # engine's framework overhead through the engine (profiles/framework.py).
    ops_in_grid = {p.op for p in grid.points()} | {Op.COLLECTIVE, Op.DISPATCH, Op.FRAMEWORK}
    assert ops_in_grid == set(Op)
    assert len(grid.dispatch_bytes) >= MIN_SERIES_POINTS
    # copies between two host buffers: a CPU worker's offloads
    assert grid.dtype == "fp32" and len(grid.copy_bytes) >= MIN_SERIES_POINTS
    assert set(grid.collective_world_sizes) == {2, 4}
    assert set(grid.collective_kinds) == set(CollectiveKind)
    for (op, key), sizes in _series_sizes(grid).items():
        # A dW shape (k, n, tokens) starts no token series: token series start at m = 1.
        if op is not Op.GEMM or 1 in sizes:
            assert len(sizes) >= MIN_SERIES_POINTS, (op, key, sizes)
    max_flops = grid.origin["max_gemm_flops"]
    assert all(2 * s.m * s.n * s.k <= max_flops for s in grid.gemm_shapes)
    json.dumps(grid.to_json())


def test_quick_grid_has_forward_and_backward_gemms_per_tp() -> None:
    # tiny-llama at TP 2, by hand: hidden 128, q 128, kv 64, ffn 352.
    assert layer_gemms(CATALOGUE["tiny-llama"], 2) == {
        "qkv": (128, 128),
        "o_proj": (128, 64),
        "gate_up": (352, 128),
        "down": (128, 176),
        "lm_head": (128, 128),
    }
    shapes = set(ProfilerGrid.quick("cpu").gemm_shapes)
    assert GemmShape(m=16, n=352, k=128) in shapes  # gate_up forward
    assert GemmShape(m=16, n=128, k=352) in shapes  # gate_up dX
    assert GemmShape(m=128, n=352, k=16) in shapes  # gate_up dW
    # smollm2-135m has 9 heads: no TP 2, so its TP-2 QKV (n=480, k=576) is absent.
    assert not any(s.n == 480 and s.k == 576 for s in shapes)


def test_cuda_grids_have_copies_and_world_sizes_up_to_the_gpus() -> None:
    quick = ProfilerGrid.quick("cuda", num_devices=4)
    assert quick.dtype == "bf16" and quick.copy_bytes
    assert quick.collective_world_sizes == (2, 4)
    assert {p.op for p in quick.points()} >= {Op.COPY, Op.GEMM}
    full = ProfilerGrid.full("cuda", num_devices=1)
    assert not full.collective_world_sizes and not full.collective_kinds
    assert set(full.origin["models"]) == set(CATALOGUE)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"copy_bytes": (1024, 1024)}, "twice"),
        ({"collective_kinds": ("all_reduce",)}, "together"),
        (
            {
                "collective_kinds": ("all_reduce",),
                "collective_world_sizes": (4,),
                "collective_bytes": (24,),
            },
            "multiples of 16",
        ),
        ({"elementwise_bytes": (6,)}, "multiples of 8"),
        ({"dtype": "int8"}, "unknown"),
        ({"gemm_shapes": (GemmShape(m=1, n=2, k=3),) * 2}, "twice"),
    ],
)
def test_grid_validation(changes: dict, message: str) -> None:
    with pytest.raises(SpecError, match=message):
        ProfilerGrid(**{"device": "cpu", "dtype": "fp32", **changes})


# --- timer and retry rule ------------------------------------------------------------


def test_plan_batches_fast_ops_and_caps_slow_ones() -> None:
    fast = plan_samples(1e-6, repeats=10, budget_s=1.0, min_sample_s=1e-3)
    assert 1000 <= fast.calls_per_sample <= 1001 and fast.num_samples == 10
    slow = plan_samples(2.0, repeats=10, budget_s=1.0)
    assert slow.calls_per_sample == 1 and slow.num_samples == MIN_REPEATS


def test_summarize_percentiles() -> None:
    t = summarize([5.0, 1.0, 3.0, 2.0, 4.0], calls_per_sample=1)
    assert (t.p10_s, t.median_s, t.p90_s, t.repeats) == pytest.approx((1.4, 3.0, 4.6, 5))


def test_time_fn_respects_its_budget() -> None:
    started = time.perf_counter()
    t = time_fn(lambda: time.sleep(0.02), CpuClock(), warmup=1, repeats=100, budget_s=0.1)
    assert time.perf_counter() - started < 1.0
    assert t.repeats >= MIN_REPEATS and t.repeats < 10
    # a sleep never returns early
    assert 0.02 <= t.median_s == pytest.approx(0.02, rel=0.5)


class _FakeClock:
    """`calls` calls of `per_call_s` each; the listed measurements (by index) stall."""

    def __init__(self, per_call_s: float, stalls: dict[int, float] | None = None) -> None:
        self.per_call_s = per_call_s
        self.stalls = stalls or {}
        self.calls: list[int] = []

    def measure(self, fn, calls: int) -> float:
        stall = self.stalls.get(len(self.calls), 0.0)
        self.calls.append(calls)
        return calls * self.per_call_s + stall


def test_time_fn_batches_fast_calls() -> None:
    clock = _FakeClock(1e-7)
    t = time_fn(lambda: None, clock, warmup=1, repeats=5, budget_s=0.5)
    # ceil(1 ms / 0.1 µs) calls a sample, the warm-up's one call first
    assert t.calls_per_sample == 10_000 and t.repeats == 5
    assert t.median_s == pytest.approx(1e-7)
    assert clock.calls[0] == 1


def test_a_stall_in_the_autorange_does_not_shrink_the_batches() -> None:
    # the autorange doubles 1, 2, ..., 16384 calls (measurements 1..15 after the
    # warm-up's); a 1 ms stall in the 64-call batch ends it there at ~15.6 µs a
    # call, which the re-timed batch corrects
    clock = _FakeClock(1e-7, stalls={7: 1e-3})
    assert clock.per_call_s * 64 < 1e-3
    t = time_fn(lambda: None, clock, warmup=1, repeats=5, budget_s=0.5)
    assert clock.calls[7:9] == [64, 64]
    assert t.calls_per_sample == 10_000
    # a stall in both the batch and its re-timing is kept: the estimate is only
    # as good as the faster of two: ceil(1 ms / ((64 x 0.1 µs + 1 ms) / 64)) = 64
    clock = _FakeClock(1e-7, stalls={7: 1e-3, 8: 1e-3})
    assert time_fn(lambda: None, clock, warmup=1, repeats=5, budget_s=0.5).calls_per_sample == 64


def test_the_autorange_times_a_slow_call_once() -> None:
    clock = _FakeClock(0.01)
    assert estimate_call_s(lambda: None, clock) == pytest.approx(0.01)
    assert clock.calls == [1]


def test_time_fn_batches_real_fast_calls() -> None:
    # On the real clock a stall now has to hit both timings of the autorange's last
    # batch to shrink the batches (the fake-clock tests above).
    t = time_fn(lambda: None, CpuClock(), warmup=1, repeats=5, budget_s=0.5)
    assert t.calls_per_sample > 100
    assert 0 < t.median_s < 1e-5


def test_suspect_points_flags_inflated_points() -> None:
    points = [GridPoint(op=Op.GEMM, params={"m": m, "n": 64, "k": 64}) for m in (1, 2, 4, 8, 16)]

    def timing(seconds: float) -> Timing:
        return Timing(median_s=seconds, p10_s=seconds, p90_s=seconds, repeats=3, calls_per_sample=1)

    clean = [timing(1e-6 * math.sqrt(int(p.params["m"]))) for p in points]
    assert suspect_points(points, clean) == []
    inflated = list(clean)
    inflated[2] = timing(1e-3)  # slower than m=8 and grew far faster than its work
    inflated[4] = timing(1e-2)  # the largest: grew 3500x for 2x the work
    assert suspect_points(points, inflated) == [4, 2]  # most inflated first


def test_cpu_copies_are_added_to_a_profile_with_their_note(profile: Profile, tmp_path) -> None:
    from placeflow.profiles.profiler import add_cpu_copies
    from placeflow.profiles.schema import load_profile_file, save_profile

    path = save_profile(profile, tmp_path / "p.json")
    small = (4096, 65536)
    entries = add_cpu_copies(path, sizes=small, progress=False)
    back = load_profile_file(path)
    copies = [e for e in back.entries if e.op is Op.COPY]
    assert {(e.params["direction"], e.params["num_bytes"]) for e in copies} == {
        (d, b) for d in ("h2d", "d2h") for b in small
    }
    assert len(entries) == len(copies) and all(e.median_s > 0 for e in copies)
    assert "--copies-to" in back.provenance.notes
    # the other ops are kept
    assert len(back.entries) == len(profile.entries) - sum(
        e.op is Op.COPY for e in profile.entries
    ) + len(copies)


def test_cpu_kernels_are_re_timed_in_place_with_their_note(profile: Profile, tmp_path) -> None:
    """`--kernels-to`: every kernel entry re-timed at its own parameters, each kernel op's
    note says so, and the other entries (collectives, copies, dispatch) are kept as
    they were."""
    from placeflow.profiles.profiler import KERNEL_OPS, add_cpu_kernels
    from placeflow.profiles.schema import load_profile_file, save_profile

    path = save_profile(profile, tmp_path / "p.json")
    entries = add_cpu_kernels(path, progress=False)
    back = load_profile_file(path)

    def key(e: object) -> tuple[str, tuple[tuple[str, object], ...]]:
        return e.op.value, tuple(sorted(e.params.items()))  # type: ignore[attr-defined]

    kernels = [e for e in profile.entries if e.op in KERNEL_OPS]
    assert sorted(map(key, entries)) == sorted(map(key, kernels))
    assert sorted(map(key, (e for e in back.entries if e.op in KERNEL_OPS))) == sorted(
        map(key, kernels)
    )
    assert all(e.median_s > 0 and e.source is Source.MEASURED for e in entries)
    others = [e for e in profile.entries if e.op not in KERNEL_OPS]
    assert [e for e in back.entries if e.op not in KERNEL_OPS] == others
    ops = {e.op for e in kernels}
    assert back.provenance.notes.count("--kernels-to") == len(ops)
    with pytest.raises(SpecError, match="no kernel entries"):
        bare = dataclasses.replace(profile, entries=tuple(others))
        add_cpu_kernels(save_profile(bare, tmp_path / "bare.json"), progress=False)
