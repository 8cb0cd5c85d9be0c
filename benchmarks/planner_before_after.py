"""Benchmark: one planner search, two checkouts (before and after a change), interleaved.

Runs `planner_speed.run_one` for one (GPU count, model) in a fresh process of
each checkout in turn (base, new, base, new, ...), so that the machine's load
falls on both alike, and records each run's CPU and wall seconds, the load
average before it, the share of all cores other processes used meanwhile, the
status and the best plan's tokens/s. The base checkout is a directory holding
another commit's tree (e.g. `git archive <commit> | tar -x -C DIR`); its
`placeflow` is imported through PYTHONPATH ahead of the installed one.

    python benchmarks/planner_before_after.py --base DIR --base-commit SHA [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from cpu_monitor import CpuMonitor  # benchmarks/, next to this file
from planner_speed import ROOT, one_row


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--base", type=Path, required=True)
    parser.add_argument("--base-commit", required=True)
    parser.add_argument("--gpus", type=int, default=128)
    parser.add_argument("--model", default="llama-2-13b")
    parser.add_argument("--rounds", type=int, default=3)
    out = ROOT / "benchmarks/results/planner_speed_ab.json"
    parser.add_argument("--out", type=Path, default=out)
    args = parser.parse_args()
    new_commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    checkouts = {
        "base": (args.base / "benchmarks/planner_speed.py", str(args.base.resolve())),
        "new": (ROOT / "benchmarks/planner_speed.py", None),
    }
    rows = []
    with CpuMonitor() as monitor:
        for i in range(args.rounds):
            for which, (script, path) in checkouts.items():
                env = dict(os.environ)
                if path is not None:
                    env["PYTHONPATH"] = path
                row = one_row(args.gpus, args.model, 60.0, monitor, script=script, env=env)
                row = {"which": which, "round": i, **row}
                print(json.dumps(row), flush=True)
                rows.append(row)
    args.out.write_text(
        json.dumps(
            {
                "command": " ".join(["python benchmarks/planner_before_after.py", *sys.argv[1:]]),
                "base": f"commit {args.base_commit}, its tree in {args.base}",
                "new": f"commit {new_commit} (the benchmark's own checkout)",
                "workload": f"PPO, four {args.model} roles, {args.gpus} x A100-80GB, 60 s limit",
                "date": time.strftime("%Y-%m-%d"),
                "machine": f"{os.cpu_count()} CPUs (shared)",
                "rows": rows,
            },
            indent=1,
        )
        + "\n"
    )


if __name__ == "__main__":
    main()
