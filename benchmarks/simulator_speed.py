"""Benchmark: full-step simulations per second for a 4-role PPO plan on one core.

Simulates the shipped PPO Llama-2-7B colocated plan on 16 H100 under many
parallelism variants (t, d, tg, micro-batch sizes), as the planner's re-scoring
does. Reports two rates: `cold` (the first simulation of each variant, each
with a new kernel-cost memo) and `warm` (the same variants again, the memo
filled). Writes the figures and the command to benchmarks/results/simulator_speed.json.

    python benchmarks/simulator_speed.py
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import sys
import time
from pathlib import Path

from placeflow.layout import TrainLayout
from placeflow.plan import RoleParallelism, load_plan
from placeflow.profiles.costmodel import CostModel
from placeflow.profiles.registry import load_profile
from placeflow.simulator import simulate
from placeflow.workload import Role

ROOT = Path(__file__).resolve().parents[1]


def variants(plan):
    out = []
    for t in (1, 2, 4, 8):
        for tg in (1, 2, 4, 8):
            if tg > t:
                continue
            for mb in (4, 8, 16):
                actor = RoleParallelism(train=TrainLayout(t=t, d=16 // t), tg=tg, micro_batch=mb)
                critic = RoleParallelism(train=TrainLayout(t=t, d=16 // t), micro_batch=mb)
                other = RoleParallelism(
                    train=TrainLayout(t=max(1, t // 2), d=16 // max(1, t // 2)), micro_batch=2 * mb
                )
                par = {Role.ACTOR: actor, Role.CRITIC: critic, Role.REF: other, Role.REWARD: other}
                out.append(dataclasses.replace(plan, parallelism=par))
    return out


def main() -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    plan = load_plan(ROOT / "examples/plans/ppo-7b-colocate-h100x16.toml")
    profile = load_profile("h100-sxm")
    plans = variants(plan)
    base = CostModel.fit(profile)
    t0 = time.perf_counter()
    for p in plans:
        simulate(p, dataclasses.replace(base, memo={}))
    cold_s = (time.perf_counter() - t0) / len(plans)
    rounds = 20
    t0 = time.perf_counter()
    for _ in range(rounds):
        for p in plans:
            simulate(p, base)
    warm_s = (time.perf_counter() - t0) / (rounds * len(plans))
    result = {
        "command": "python benchmarks/simulator_speed.py",
        "plan": plan.name,
        "num_variants": len(plans),
        "cold_sims_per_s": 1 / cold_s,
        "warm_sims_per_s": 1 / warm_s,
        "target_sims_per_s": 2000,
        "python": sys.version.split()[0],
        "machine": platform.processor() or platform.machine(),
        "date": time.strftime("%Y-%m-%d"),
    }
    out = ROOT / "benchmarks/results/simulator_speed.json"
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
