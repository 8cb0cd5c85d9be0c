"""Benchmark: planner search time for PPO with four 7B..70B roles on 16..1024 GPUs.

For each model size (all four roles the same model) and each cluster size
(A100-80GB nodes of 8, the HybridFlow testbed), runs the whole search
(`plan_search`: cost table, set options, one CP-SAT solve per placement,
validation and re-scoring) with the default 60 s time limit, each in a fresh
process (so that no cache of an earlier row helps a later one), and records the
wall time, the process CPU time, the machine's load average before the row, the
status, how many placement rows are proven (optimal or infeasible) and the best
plan. Writes benchmarks/results/planner_speed.json.

The machine is shared: the wall time depends on its load, the CPU time much
less (CP-SAT runs one worker per placement solve by default; see
`planner.solve`), so both are recorded, with the share of all cores that other
processes used while the row ran (`cpu_monitor.CpuMonitor`, psutil from the
`bench` extra; omitted without it).

    python benchmarks/planner_speed.py [--sizes 16,64,128,256,512,1024] [--models llama-2-7b,...]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

from cpu_monitor import CpuMonitor  # benchmarks/, next to this file

from placeflow.catalogue import CATALOGUE
from placeflow.cluster import ClusterSpec, load_cluster
from placeflow.planner import Infeasible, Status, plan_search
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
    row: dict[str, object] = {
        "num_gpus": num_gpus,
        "model": model,
        "load_avg_1m": round(os.getloadavg()[0], 2),
    }
    t0, c0 = time.perf_counter(), time.process_time()
    try:
        result = plan_search(cluster, wl, costs, time_limit_s=time_limit_s)
    except Infeasible as exc:
        row.update(wall_s=round(time.perf_counter() - t0, 2), status="infeasible", reason=str(exc))
        return row
    row.update(
        wall_s=round(time.perf_counter() - t0, 2),
        cpu_s=round(time.process_time() - c0, 2),
        status=result.status.value,
        rows=len(result.per_placement),
        rows_proven=sum(r.status is not Status.FEASIBLE for r in result.per_placement),
        rows_with_plan=sum(r.best is not None for r in result.per_placement),
    )
    best = result.best
    row.update(
        best_kind=best.kind.value,
        best_gpus_per_set=[s.num_devices for s in best.plan.sets],
        best_savers={
            role.value: {
                "recompute": par.recompute,
                "offload_optimizer": par.offload_optimizer,
                "offload_params": par.offload_params,
            }
            for role, par in best.plan.parallelism.items()
        },
        best_tokens_per_s=round(best.estimate.tokens_per_s),
    )
    return row


def one_row(
    num_gpus: int,
    model: str,
    time_limit_s: float,
    monitor: CpuMonitor | None,
    *,
    script: Path = Path(__file__),
    env: dict[str, str] | None = None,
) -> dict[str, object]:
    """`run_one` in a fresh process (of `script`, with `env`), with the share of all cores
    other processes used meanwhile."""
    one = [sys.executable, str(script), "--one", f"{num_gpus},{model}"]
    one += ["--time-limit", str(time_limit_s)]
    start = time.time()
    done = subprocess.run(one, check=True, capture_output=True, text=True, env=env)
    row: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    if monitor is not None:
        row["others_cpu_frac"] = round(monitor.other_frac(start, time.time()), 2)
    return row


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="16,64,128,256,512,1024")
    parser.add_argument("--models", default="llama-2-7b,llama-2-13b,codellama-34b,llama-2-70b")
    parser.add_argument("--time-limit", type=float, default=60.0)
    parser.add_argument("--append", action="store_true", help="keep rows already in the file")
    # A few rows re-measured into a file of their own keep the full table's file (and its
    # command) intact.
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/planner_speed.json")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # "N,model": one row, as JSON
    args = parser.parse_args()
    fitted_cost_model("a100-80gb")  # fit once, outside the timings
    if args.one:
        n, model = args.one.split(",")
        print(json.dumps(run_one(int(n), model, args.time_limit)))
        return
    out = args.out
    previous = json.loads(out.read_text())["rows"] if args.append and out.exists() else []
    rows = list(previous)
    with contextlib.ExitStack() as stack:
        try:
            monitor: CpuMonitor | None = stack.enter_context(CpuMonitor())
        except ImportError:  # psutil (the bench extra) missing: no record of the others' CPU
            monitor = None
        for model in args.models.split(","):
            for n in (int(x) for x in args.sizes.split(",")):
                row = one_row(n, model, args.time_limit, monitor)
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
                "machine": f"{platform.machine()}, {os.cpu_count()} CPUs (shared)",
                "date": time.strftime("%Y-%m-%d"),
                "rows": rows,
            },
            indent=1,
        )
        + "\n"
    )


if __name__ == "__main__":
    main()
