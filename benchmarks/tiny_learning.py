"""The tiny GRPO plans learn on this CPU: the README's "End-to-end RL on this CPU" table.

Runs `placeflow run PLAN --steps N` for each plan in a fresh process (4 logical CPU
workers, random-init tiny-llama, the `arith` checker on its shipped dataset
executor/datasets/arith.jsonl), then reads metrics.jsonl: mean reward of the first and
last five steps, the exact-answer rate of the last five, the steps' seconds (and
the whole process's), median tokens/s and the largest |rollout - trainer logprob|.
The machine's load and the busiest other processes go into
benchmarks/results/tiny_learning.json with the command.

    python benchmarks/tiny_learning.py --steps 30
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from placeflow.metrics import Metric

ROOT = Path(__file__).resolve().parents[1]
RESULT = ROOT / "benchmarks/results/tiny_learning.json"
PLANS = ("grpo-tiny-cpu4-colocate", "grpo-tiny-cpu4-split")


def summary(lines: list[dict], wall_s: float) -> dict[str, float]:
    rewards = [m[Metric.REWARD_MEAN] for m in lines]
    return {  # this benchmark's own result keys
        "reward_mean_first5": round(statistics.mean(rewards[:5]), 3),
        "reward_mean_last5": round(statistics.mean(rewards[-5:]), 3),
        "exact_match_last5": round(statistics.mean(m[Metric.EXACT_MATCH] for m in lines[-5:]), 3),
        "steps_s": round(sum(m[Metric.STEP_TIME_S] for m in lines), 1),  # the steps alone
        "process_wall_s": round(wall_s, 1),  # with Ray's start and the workers' build
        "tokens_per_s_median": round(statistics.median(m[Metric.TOKENS_PER_S] for m in lines)),
        "logprob_diff_max": max(m.get(Metric.LOGPROB_DIFF_MAX, 0.0) for m in lines),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from smollm2_learns import load  # type: ignore[import-not-found]

    results: dict[str, object] = {}
    before = load()
    for name in PLANS:
        with tempfile.TemporaryDirectory() as tmp:
            run_dir = Path(tmp) / "run"
            command = [
                sys.executable, "-m", "placeflow.cli", "run",
                str(ROOT / "examples/plans" / f"{name}.toml"),
                "--steps", str(args.steps), "--run-dir", str(run_dir), "--no-progress",
            ]  # fmt: skip
            start = time.monotonic()
            subprocess.run(command, check=True)
            wall_s = time.monotonic() - start
            lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
            results[name] = summary(lines, wall_s) | {
                "reward_mean_per_step": [round(m[Metric.REWARD_MEAN], 3) for m in lines]
            }
    record = {
        "command": shlex.join([sys.executable, *sys.argv]),
        "steps": args.steps,
        "plans": results,
        "load_before": before,
        "load_after": load(),
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    RESULT.write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps({k: {x: y for x, y in v.items() if x != "reward_mean_per_step"}
                      for k, v in results.items()}))  # fmt: skip
    print(f"wrote {RESULT}")


if __name__ == "__main__":
    main()
