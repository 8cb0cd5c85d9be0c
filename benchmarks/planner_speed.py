"""Benchmark: planner search time for PPO with four 7B..70B roles on 16..1024 GPUs.

For each model size (all four roles the same model) and each cluster size
(A100-80GB nodes of 8, the HybridFlow testbed), runs the whole search
(`plan_search`: cost table, per-placement CP-SAT solves, the global solve,
validation and re-scoring) with the default 60 s time limit and records the
wall time, the status and the best plan. Writes
benchmarks/results/planner_speed.json.

    python benchmarks/planner_speed.py [--sizes 16,64,128,512,1024] [--models llama-2-7b,...]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import sys
import time
from pathlib import Path

from placeflow.catalogue import CATALOGUE
from placeflow.cluster import ClusterSpec, load_cluster
from placeflow.planner import Infeasible, plan_search
from placeflow.profiles.registry import fitted_cost_model
from placeflow.workload import Workload, load_workload

ROOT = Path(__file__).resolve().parents[1]


def ppo_problem(num_gpus: int, model: str) -> tuple[ClusterSpec, Workload]:
    """A100-80GB nodes of 8 for `num_gpus`, and ppo-llama2-7b's batch with four `model` roles."""
    base = load_cluster(ROOT / "examples/clusters/a100x128.toml")
    cluster = dataclasses.replace(
        base,
        name=f"a100x{num_gpus}",
        pools=(dataclasses.replace(base.pools[0], num_nodes=num_gpus // 8),),
    )
    wl = load_workload(ROOT / "examples/workloads/ppo-llama2-7b.toml")
    wl = dataclasses.replace(
        wl, name=f"ppo-{model}", models={r: CATALOGUE[model] for r in wl.roles}
    )
    return cluster, wl


def run_one(num_gpus: int, model: str, time_limit_s: float) -> dict[str, object]:
    cluster, wl = ppo_problem(num_gpus, model)
    costs = {p.profile: fitted_cost_model(p.profile) for p in cluster.pools}
    t0 = time.perf_counter()
    try:
        result = plan_search(cluster, wl, costs, time_limit_s=time_limit_s)
    except Infeasible as exc:
        wall_s = time.perf_counter() - t0
        return {
            "num_gpus": num_gpus,
            "model": model,
            "wall_s": round(wall_s, 2),
            "status": "infeasible",
            "reason": str(exc),
        }
    wall_s = time.perf_counter() - t0
    best = result.best
    return {
        "num_gpus": num_gpus,
        "model": model,
        "wall_s": round(wall_s, 2),
        "status": result.status.value,
        "best_kind": best.kind.value,
        "best_gpus_per_set": [s.num_devices for s in best.plan.sets],
        "best_tokens_per_s": round(best.estimate.tokens_per_s),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="16,64,128,512,1024")
    parser.add_argument("--models", default="llama-2-7b,llama-2-13b,codellama-34b,llama-2-70b")
    parser.add_argument("--time-limit", type=float, default=60.0)
    parser.add_argument("--append", action="store_true", help="keep rows already in the file")
    args = parser.parse_args()
    fitted_cost_model("a100-80gb")  # fit once, outside the timings
    out = ROOT / "benchmarks/results/planner_speed.json"
    previous = json.loads(out.read_text())["rows"] if args.append and out.exists() else []
    rows = list(previous)
    for model in args.models.split(","):
        for n in (int(x) for x in args.sizes.split(",")):
            row = run_one(n, model, args.time_limit)
            print(json.dumps(row), flush=True)
            rows.append(row)
    out.write_text(
        json.dumps(
            {
                "command": "python " + " ".join(["benchmarks/planner_speed.py", *sys.argv[1:]]),
                "profile": "a100-80gb",
                "workload": "examples/workloads/ppo-llama2-7b.toml with the model swapped",
                "time_limit_s": args.time_limit,
                "python": sys.version.split()[0],
                "machine": platform.machine(),
                "date": time.strftime("%Y-%m-%d"),
                "rows": rows,
            },
            indent=1,
        )
        + "\n"
    )


if __name__ == "__main__":
    main()
