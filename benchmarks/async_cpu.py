"""Synchronous vs asynchronous RL (one-step-off, k-step-off) on one two-set plan, on this CPU.

The plan (`examples/plans/grpo-tiny-cpu2-async.toml`) trains a tiny-llama GRPO
actor on one CPU worker and generates on another (a generator set), so that the
two phases have a core each on this 2-core machine. Each side is the same plan
at one `max_staleness` (`--staleness`, default 0,1,2): 0 generates, then
trains, then syncs; 1 generates step k+1 while step k trains, with the
importance ratio taken against the rollout's policy (one update behind) and a
blocking weight sync after each update; k >= 2 keeps k rollouts in flight and
the trainer posts its weights without waiting for the generator.

Each run is a fresh `placeflow run` process (its own Ray), the sides
interleaved and rotating which goes first, `--repeats` times. Throughput of a
run is its tokens over its wall seconds for the steps after `--warmup`; the
reported figure per side is the median over repeats, and `speedup` is each
side's median over the synchronous one. Beside it, the simulator's tokens/s
for the same plan on the `cpu` profile. Other processes' CPU use during each
run is recorded (benchmarks/cpu_monitor.py, with the `bench` extra).

    python benchmarks/async_cpu.py [--steps 16] [--warmup 2] [--repeats 3] [--staleness 0,1,2]

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


def side_name(staleness: int) -> str:
    return "sync" if staleness == 0 else f"{staleness}-off"


def write_side(staleness: int, directory: Path) -> tuple[Path, float]:
    """The benchmark plan at `staleness`, as a TOML file in `directory`, and the
    simulator's tokens/s for it."""
    from placeflow.plan import load_plan, save_plan
    from placeflow.simulator import simulate
    from placeflow.simulator.simulate import cost_models_for

    plan = load_plan(PLAN)
    workload = dataclasses.replace(plan.workload, max_staleness=staleness)
    side = side_name(staleness)
    path = directory / f"{side}.toml"
    plan = dataclasses.replace(plan, name=f"{plan.name}-{side}", workload=workload)
    save_plan(plan, path)
    return path, simulate(plan, cost_models_for(plan, "cpu")).tokens_per_s


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
    parser.add_argument("--staleness", default="0,1,2", help="sides: max_staleness values")
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).parent))
    sides = [side_name(int(k)) for k in args.staleness.split(",")]
    if "sync" not in sides:
        parser.error("--staleness must include 0 (the synchronous side the speedups are over)")
    runs: dict[str, list[dict[str, Any]]] = {side: [] for side in sides}
    simulated: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        plans = {}
        for k in args.staleness.split(","):
            plans[side_name(int(k))], simulated[side_name(int(k))] = write_side(int(k), Path(tmp))
        for repeat in range(args.repeats):
            shift = repeat % len(sides)
            order = sides[shift:] + sides[:shift]
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
        "speedup": {side: medians[side] / medians["sync"] for side in sides},
        "simulated_tokens_per_s": simulated,
        "simulated_speedup": {side: simulated[side] / simulated["sync"] for side in sides},
        "runs": runs,
    }
    RESULTS.write_text(json.dumps(out, indent=2) + "\n")
    for side in sides:
        print(
            f"{side}: {medians[side]:,.0f} tokens/s measured ({out['speedup'][side]:.2f}x), "
            f"{simulated[side]:,.0f} simulated ({out['simulated_speedup'][side]:.2f}x)"
        )


def _cores() -> int:
    import os

    return os.cpu_count() or 1


if __name__ == "__main__":
    main()
