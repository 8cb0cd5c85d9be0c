"""Synchronous vs one-step-off asynchronous RL on the same two-set plan, on this CPU.

The plan (`examples/plans/grpo-tiny-cpu2-async.toml`) trains a tiny-llama GRPO
actor on one CPU worker and generates on another (a generator set), so that the
two phases have a core each on this 2-core machine. The synchronous side is the
same plan with `async_one_step_off = false`: it generates, then trains, then
syncs. The asynchronous side generates step k+1 while step k trains, with the
importance ratio taken against the rollout's policy (one update behind).

Each run is a fresh `placeflow run` process (its own Ray), the two sides
interleaved and alternating which goes first, `--repeats` times. Throughput of a
run is its tokens over its wall seconds for the steps after `--warmup`; the
reported figure per side is the median over repeats, and `speedup` is the
asynchronous median over the synchronous one. Other processes' CPU use during
each run is recorded (benchmarks/cpu_monitor.py, with the `bench` extra).

    python benchmarks/async_cpu.py [--steps 16] [--warmup 2] [--repeats 3]

Results: benchmarks/results/async_cpu.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

from placeflow.metrics import Metric, RecordKey

ROOT = Path(__file__).resolve().parents[1]
PLAN = ROOT / "examples" / "plans" / "grpo-tiny-cpu2-async.toml"
RESULTS = ROOT / "benchmarks" / "results" / "async_cpu.json"
CLI = "import sys; from placeflow.cli import main; sys.exit(main(sys.argv[1:]))"


def write_side(one_step_off: bool, directory: Path) -> Path:
    """The benchmark plan with asynchrony on or off, as a TOML file in `directory`."""
    from placeflow.plan import load_plan, save_plan

    plan = load_plan(PLAN)
    workload = dataclasses.replace(plan.workload, max_staleness=int(one_step_off))
    side = "async" if one_step_off else "sync"
    path = directory / f"{side}.toml"
    save_plan(dataclasses.replace(plan, name=f"{plan.name}-{side}", workload=workload), path)
    return path


def run_side(plan: Path, steps: int, warmup: int, run_dir: Path) -> dict[str, Any]:
    """One fresh `placeflow run`; its throughput after the warm-up steps and its curve."""
    args = ["run", str(plan), "--steps", str(steps), "--run-dir", str(run_dir), "--no-progress"]
    monitor = _monitor()
    start = time.time()
    with monitor or nullcontext():
        proc = subprocess.run(
            [sys.executable, "-c", CLI, *args], capture_output=True, text=True, timeout=900
        )
    if proc.returncode != 0:
        raise RuntimeError(f"placeflow run failed:\n{proc.stderr[-3000:]}")
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    measured = lines[warmup:]
    tokens = sum(m[Metric.TOKENS_PER_S] * m[Metric.STEP_TIME_S] for m in measured)
    wall = sum(m[Metric.STEP_TIME_S] for m in measured)
    return {  # this benchmark's own result keys
        "tokens_per_s": tokens / wall,
        "step_s_median": statistics.median(m[Metric.STEP_TIME_S] for m in measured),
        "phase_sum_over_step": statistics.median(
            sum(m[RecordKey.PHASES].values()) / m[Metric.STEP_TIME_S] for m in measured
        ),
        "reward": [m[Metric.REWARD_MEAN] for m in lines],
        "staleness": [m[Metric.STALENESS] for m in lines],
        "other_cpu_share": monitor.other_frac(start, time.time()) if monitor else None,
    }


def _monitor() -> Any:
    try:
        from cpu_monitor import CpuMonitor  # type: ignore[import-not-found]
    except ImportError:  # psutil comes with the bench extra
        return None
    return CpuMonitor()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).parent))
    runs: dict[str, list[dict[str, Any]]] = {"sync": [], "async": []}
    with tempfile.TemporaryDirectory() as tmp:
        plans = {"sync": write_side(False, Path(tmp)), "async": write_side(True, Path(tmp))}
        for repeat in range(args.repeats):
            order = ("sync", "async") if repeat % 2 == 0 else ("async", "sync")
            for side in order:
                run_dir = Path(tmp) / f"{side}-{repeat}"
                result = run_side(plans[side], args.steps, args.warmup, run_dir)
                runs[side].append(result)
                print(f"repeat {repeat} {side}: {result['tokens_per_s']:,.0f} tokens/s", flush=True)
    medians = {side: statistics.median(r["tokens_per_s"] for r in rs) for side, rs in runs.items()}
    out = {
        "command": "python benchmarks/async_cpu.py " + " ".join(sys.argv[1:]),
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.processor() or platform.machine()}, {_cores()} cores",
        "plan": str(PLAN.relative_to(ROOT)),
        "steps": args.steps,
        "warmup": args.warmup,
        "repeats": args.repeats,
        "tokens_per_s_median": medians,
        "speedup": medians["async"] / medians["sync"],
        "runs": runs,
    }
    RESULTS.write_text(json.dumps(out, indent=2) + "\n")
    sync, fast = medians["sync"], medians["async"]
    print(f"sync {sync:,.0f}, async {fast:,.0f} tokens/s: speedup {out['speedup']:.2f}x")


def _cores() -> int:
    import os

    return os.cpu_count() or 1


if __name__ == "__main__":
    main()
