"""Benchmark: one fidelity plan's step as a timeline, the run's calls beside the simulator's.

`benchmarks/fidelity_cpu.py` scores each phase's total; where a phase is off because
of *when* it runs (a call queued behind another on its set, or overlapping another
set's calls on the shared cores, or not), the totals do not show it. This script
runs one plan of that benchmark with the executor and prints, per call (phase and
device set), the median over the scored steps of its start and end on the driver's
clock (`metrics.jsonl`'s `timeline`, `executor.timeline.StepClock`) next to the
simulated call's (`StepEstimate.phases`, drawn the same way:
`simulate._call_intervals`), the simulation at this host's speeds checked just
before the run (`hostcheck.check_host` for the kernels, `hostcheck.check_framework`
for the engine's Python, the median of three each, as `fidelity_cpu.py
--host-speed` does).

    python benchmarks/timeline_cpu.py [--plan safe-rlhf-tiny-cpu4-split]
        [--steps 16] [--warmup 8]
        [--profile benchmarks/results/cpu_host_2026-11-27_1515_cold_paired_1128_fsdp.json]

Writes the plan's row of benchmarks/results/timeline_cpu.json (with the command,
the date, the load and the speeds; the other plans' rows kept).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import ray

from placeflow.executor.run import RunConfig, read_metrics, run_plan
from placeflow.profiles.registry import load_profile
from placeflow.simulator import simulate

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fidelity_cpu import cost_models_at, host_speeds, plans

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks/results/timeline_cpu.json"
DEFAULT_PROFILE = "benchmarks/results/cpu_host_2026-11-27_1515_cold_paired_1128_fsdp.json"


def measured_calls(records: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per call ("phase@set", the controller's work "phase@driver") the medians of its
    start, end and length over `records` (metrics lines), in seconds from the step's
    start."""
    spans: dict[str, list[tuple[float, float]]] = {}
    for rec in records:
        for t in rec["timeline"]:
            where = "driver" if t["device_set"] is None else t["device_set"]
            spans.setdefault(f"{t['name']}@{where}", []).append((t["start_s"], t["end_s"]))
    return {
        key: {
            "start_s": statistics.median(s for s, _ in v),
            "end_s": statistics.median(e for _, e in v),
            "length_s": statistics.median(e - s for s, e in v),
        }
        for key, v in spans.items()
    }


def simulated_calls(estimate: Any) -> dict[str, dict[str, float]]:
    """The steady step's calls of `estimate` keyed as `measured_calls` keys them."""
    out: dict[str, dict[str, float]] = {}
    for p in estimate.phases:
        if p.step != estimate.steady_step:
            continue
        where = "driver" if p.device_set < 0 else p.device_set
        out[f"{p.name.value}@{where}"] = {
            "start_s": p.start_s,
            "end_s": p.end_s,
            "length_s": p.duration_s,
        }
    return out


def _cells(call: dict[str, float] | None) -> str:
    if call is None:
        return f"{'-':>10s} {'-':>8s} {'-':>8s}"
    return " ".join(
        f"{call[k] * 1e3:{w}.1f}" for k, w in (("start_s", 10), ("end_s", 8), ("length_s", 8))
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--plan", default="safe-rlhf-tiny-cpu4-split")
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--warmup", type=int, default=8)
    parser.add_argument("--profile", default=DEFAULT_PROFILE)
    args = parser.parse_args()
    if not 0 <= args.warmup < args.steps:
        raise SystemExit(f"--warmup must be at least 0 and below --steps ({args.steps})")
    by_name = {p.name: p for _, p in plans()}
    if args.plan not in by_name:
        raise SystemExit(f"unknown plan {args.plan!r}; one of {', '.join(sorted(by_name))}")
    plan = by_name[args.plan]
    profile = load_profile(args.profile)
    checked = host_speeds(profile)
    speed, work = checked.speed, checked.work_speed
    if speed is None:
        raise SystemExit(
            f"timeline_cpu: none of {args.profile}'s GEMMs could be re-timed on this host "
            f"({checked.checks[0].summary()}); give a CPU profile with GEMM entries "
            "(`placeflow profile` measures one here)"
        )
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    cms = cost_models_at(profile, speed, stamp, work)
    assert cms is not None  # a speed was checked
    estimate = simulate(plan, cms)
    load_before = os.getloadavg()[0]
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            run_plan(plan, Path(tmp) / "run", RunConfig(steps=args.steps, progress=False))
            records = read_metrics(Path(tmp) / "run")[args.warmup :]
    finally:
        ray.shutdown()
    measured, simulated = measured_calls(records), simulated_calls(estimate)
    step_s = statistics.median(r["step_time_s"] for r in records)
    engine = "not checked (at the GEMMs')" if work is None else f"{work:.2f}x"
    print(f"{plan.name}: GEMMs {speed:.2f}x, the engine's pieces {engine} the profile's")
    print(f"{'call':24s} {'run: start':>10s} {'end':>8s} {'length':>8s}   "
          f"{'sim: start':>10s} {'end':>8s} {'length':>8s}  (ms)")  # fmt: skip
    both = measured | simulated  # a call's start where the run has it, else the model's
    for key in sorted(both, key=lambda k: both[k]["start_s"]):
        print(f"{key:24s} {_cells(measured.get(key))}   {_cells(simulated.get(key))}")
    print(f"{'step':24s} {step_s * 1e3:28.1f}   {estimate.iteration_s * 1e3:28.1f}")
    results = json.loads(OUT.read_text()) if OUT.exists() else {"plans": {}}
    results["plans"][plan.name] = {
        "command": "python benchmarks/timeline_cpu.py " + " ".join(sys.argv[1:]),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "profile": args.profile,
        "host_speed": speed,
        "host_work_speed": work,
        "load_1min_before": load_before,
        "load_1min_after": os.getloadavg()[0],
        "scored_steps": len(records),
        "step_s": {"measured": step_s, "simulated": estimate.iteration_s},
        "measured": measured,
        "simulated": simulated,
    }
    OUT.write_text(json.dumps(results, indent=1) + "\n")
    print(f"wrote {OUT.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
