"""Benchmark: CPU seconds of each phase of one planner search (PPO, one model size, A100 nodes).

The phases of `plan_search`, run one by one: the cost table, the generator
options, the set fronts of every placement's sets, and the per-placement
solves with validation and re-scoring, each timed with `time.process_time`
(CPU time of this process: on a shared machine the load inflates wall time
far more). Writes benchmarks/results/planner_phases.json (or --out), with the load
average before the run and the share of the cores other processes used during it.

    python benchmarks/planner_phases.py [--gpus 128] [--model llama-2-13b] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from cpu_monitor import CpuMonitor  # benchmarks/, next to this file
from planner_speed import ROOT, ppo_problem

from placeflow.planner import Objective
from placeflow.planner.costtable import build_cost_table
from placeflow.planner.generators import with_generators
from placeflow.planner.search import _solve_row
from placeflow.planner.setfront import SetFronts
from placeflow.planner.space import enumerate_placements
from placeflow.profiles.registry import fitted_cost_model


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gpus", type=int, default=128)
    parser.add_argument("--model", default="llama-2-13b")
    # Interleaved runs of two checkouts keep the default file (and its command) intact.
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/planner_phases.json")
    args = parser.parse_args()
    cluster, wl = ppo_problem(args.gpus, args.model)
    costs = {p.profile: fitted_cost_model(p.profile) for p in cluster.pools}
    load, start = os.getloadavg()[0], time.time()
    # Other processes' share of the cores while the phases run (psutil, the bench extra).
    monitor = CpuMonitor().__enter__()
    phases: dict[str, float] = {}
    t = time.process_time()
    table = build_cost_table(wl, cluster, costs)
    phases["cost_table_s"], t = time.process_time() - t, time.process_time()
    table = with_generators(table, wl, cluster, costs)
    phases["generator_options_s"], t = time.process_time() - t, time.process_time()
    fronts = SetFronts(table, cluster)
    placements = enumerate_placements(wl.roles)
    for placement in placements:
        for roles in placement.sets:
            for pool in cluster.pools:
                fronts.across_counts(roles, pool.name)
    phases["set_fronts_s"], t = time.process_time() - t, time.process_time()
    for placement in placements:
        _solve_row(
            placement,
            table,
            fronts,
            cluster,
            wl,
            costs,
            objective=Objective.THROUGHPUT,
            target_tokens_per_s=None,
            time_limit_s=10.0,
        )
    phases["solves_and_rescoring_s"] = time.process_time() - t
    others = monitor.other_frac(start, time.time())
    monitor.__exit__(None, None, None)
    result = {
        "command": "python " + " ".join(["benchmarks/planner_phases.py", *sys.argv[1:]]),
        "num_gpus": args.gpus,
        "model": args.model,
        "load_avg_1m": round(load, 2),
        "others_cpu_frac": round(others, 2),
        "date": time.strftime("%Y-%m-%d"),
        **{k: round(v, 2) for k, v in phases.items()},
    }
    print(json.dumps(result))
    out = args.out
    out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
