"""Benchmark: the simulator's error against real executor runs on this CPU machine.

For each plan of a matrix — placements colocate, split and standalone; two
model sizes (tiny-llama, tiny-llama-m); two batch sizes — runs GRPO with the
executor on 4 logical CPU workers (as `placeflow validate` does), simulates
the same plan with the shipped `cpu` profile, and compares per phase (median
over the steps after the first). Writes benchmarks/results/fidelity_cpu.json
with every row and the summary (median and worst absolute error per plan and
over all phases), and prints a markdown table.

    python benchmarks/fidelity_cpu.py [--steps 4] [--profile cpu]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import ray
import torch

from placeflow.executor.run import RunConfig, read_metrics, run_plan
from placeflow.plan import Plan, plan_from_dict
from placeflow.simulator import simulate
from placeflow.simulator.fidelity import compare
from placeflow.simulator.simulate import cost_models_for

ROOT = Path(__file__).resolve().parents[1]
PLANS = ROOT / "examples" / "plans"

PLACEMENTS: dict[str, tuple[list[dict[str, Any]], dict[str, Any]]] = {
    "colocate": (
        [{"roles": ["actor", "ref"], "pool": "cpu", "first_device": 0, "num_devices": 4}],
        {"actor": {"d": 4, "micro_batch": 8}, "ref": {"d": 4, "micro_batch": 16}},
    ),
    "colocate-tp2": (
        [{"roles": ["actor", "ref"], "pool": "cpu", "first_device": 0, "num_devices": 4}],
        {"actor": {"t": 2, "d": 2, "tg": 1, "micro_batch": 8}, "ref": {"d": 4, "micro_batch": 16}},
    ),
    "split": (
        [
            {"roles": ["actor"], "pool": "cpu", "first_device": 0, "num_devices": 2},
            {"roles": ["ref"], "pool": "cpu", "first_device": 2, "num_devices": 2},
        ],
        {"actor": {"d": 2, "micro_batch": 8}, "ref": {"d": 2, "micro_batch": 16}},
    ),
    "standalone": (
        [
            {"roles": ["actor"], "pool": "cpu", "first_device": 0, "num_devices": 2},
            {"roles": ["ref"], "pool": "cpu", "first_device": 2, "num_devices": 1},
            {"roles": ["reward"], "pool": "cpu", "first_device": 3, "num_devices": 1},
        ],
        {
            "actor": {"d": 2, "micro_batch": 8},
            "ref": {"micro_batch": 16},
            "reward": {"micro_batch": 16},
        },
    ),
}


def make_plan(placement: str, model: str, prompts: int) -> Plan:
    sets, par = PLACEMENTS[placement]
    models = {"actor": model, "ref": model}
    workload: dict[str, Any] = {
        "name": f"grpo-{model}-{prompts}",
        "algorithm": "grpo",
        "models": models,
        "batch": {
            "prompts_per_step": prompts,
            "samples_per_prompt": 4,
            "prompt_len": 16,
            "response_len": 16,
            "mini_batches": 2,
        },
        "rl": {"lr": 2e-3},
    }
    if placement == "standalone":
        models["reward"] = model
    else:
        workload["reward_function"] = "arith"
    for p in par.values():
        p["recompute"] = False
    data = {
        "name": f"{placement}-{model}-{prompts}p",
        "workload": workload,
        "cluster": "../clusters/cpu4.toml",
        "sets": sets,
        "parallelism": par,
    }
    return plan_from_dict(data, data["name"], PLANS)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--profile", default="cpu")
    args = parser.parse_args()
    matrix = [
        (placement, model, prompts)
        for model in ("tiny-llama", "tiny-llama-m")
        for prompts in (8, 16)
        for placement in PLACEMENTS
    ]
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    rows, t0 = [], time.perf_counter()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for placement, model, prompts in matrix:
                plan = make_plan(placement, model, prompts)
                estimate = simulate(plan, cost_models_for(plan, args.profile))
                run_dir = Path(tmp) / plan.name
                run_plan(plan, run_dir, RunConfig(steps=args.steps, progress=False))
                table = compare(estimate, read_metrics(run_dir), warmup=1)
                rows.append(
                    {"placement": placement, "model": model, "prompts": prompts, **table.to_json()}
                )
                print(f"{plan.name}: median {table.median_abs_error:.0%}", file=sys.stderr)
    finally:
        ray.shutdown()
    errors = [abs(p["rel_error"]) for r in rows for p in r["phases"]]
    report = {
        "command": "python " + " ".join(["benchmarks/fidelity_cpu.py", *sys.argv[1:]]),
        "date": time.strftime("%Y-%m-%d"),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "profile": args.profile,
        "steps": args.steps,
        "total_s": round(time.perf_counter() - t0, 1),
        "median_abs_error_all_phases": statistics.median(errors),
        "worst_abs_error_all_phases": max(errors),
        "rows": rows,
    }
    out = ROOT / "benchmarks/results/fidelity_cpu.json"
    out.write_text(json.dumps(report, indent=1) + "\n")
    print("| plan | " + " | ".join(("phase", "measured s", "simulated s", "error")) + " |")
    print("|---|---|---:|---:|---:|")
    for r in rows:
        for p in [*r["phases"], {"phase": "step", **r["step"]}]:
            print(
                f"| {r['plan']} | {p['phase']} | {p['measured_s']:.4f} | "
                f"{p['predicted_s']:.4f} | {p['rel_error']:+.0%} |"
            )
    print(
        f"median |error| over all phases {report['median_abs_error_all_phases']:.0%}, "
        f"worst {report['worst_abs_error_all_phases']:.0%}"
    )


if __name__ == "__main__":
    main()
