"""Benchmark: strong scaling of PPO with four 13B, 34B or 70B roles on 16..1024 A100-80GB.

For each model (all four roles the same model: actor, critic, reference,
reward) and each cluster size (A100-80GB SXM nodes of 8, HybridFlow's
testbed), runs the planner as a library (`plan_search`) and keeps, per
placement kind (colocate, split, standalone, hybrid), the best plan the
search found: its tokens/s per GPU and iteration time, and its simulated
phase times. For the winner it states why it wins: the phase whose time
differs most from the best plan of the runner-up kind, and that phase's
terms (for generation: prefill, decode; for updates: pipeline, DP sync,
optimizer). The workload is ppo-llama2-7b's batch (1,024 prompts of 1,024
tokens, 1,024 response tokens, 4 mini-batches) with vLLM-style CUDA-graph
decode (`rollout_engine = "vllm"`), as HybridFlow's testbed ran it.

Writes benchmarks/results/scaling.json and reports/examples/scaling-ppo-a100.html
(tokens/s against GPUs, one line per model and kind, tokens/s per GPU on hover;
`--figure-only` redraws it from the results file).

    python benchmarks/scaling.py [--sizes 16,32,64,128,256,512,1024]
        [--models llama-2-13b,codellama-34b,llama-2-70b] [--time-limit 60]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from placeflow.planner import Infeasible, SolverTimeout, plan_search
from placeflow.planner.search import RankedPlan
from placeflow.profiles.registry import fitted_cost_model
from placeflow.reports.html import Page, write_page
from placeflow.reports.scaling import ScalingPoint, scaling_figure
from placeflow.workload import RolloutEngine

sys.path.insert(0, str(Path(__file__).resolve().parent))
from planner_speed import ppo_problem  # one problem definition for both benchmarks

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "scaling.json"
FIGURE = ROOT / "reports" / "examples" / "scaling-ppo-a100.html"


def _kind_row(ranked: RankedPlan, num_gpus: int) -> dict[str, Any]:
    est = ranked.estimate
    return {
        "kind": ranked.kind.value,
        "plan": ranked.plan.name,
        "sets": [
            {"roles": [r.value for r in s.roles], "gpus": s.num_devices, "generator": s.generator}
            for s in ranked.plan.sets
        ],
        "parallelism": {
            r.value: {
                "p": p.train.p,
                "t": p.train.t,
                "d": p.train.d,
                "tg": p.tg,
                "zero": p.zero,
                "offload_optimizer": p.offload_optimizer,
                "offload_params": p.offload_params,
            }
            for r, p in ranked.plan.parallelism.items()
        },
        "iteration_s": est.iteration_s,
        "tokens_per_s_per_gpu": est.tokens_per_s / num_gpus,
        "phases_s": est.phase_totals_s(),
        "details": {p.name.value: dict(p.detail) for p in est.phases},
    }


def why(winner: dict[str, Any], runner_up: dict[str, Any] | None) -> str:
    """The phase that separates the winner from the best plan of the next kind, and its terms."""
    if runner_up is None:
        return f"{winner['kind']} is the only kind with a feasible plan"
    phases = set(winner["phases_s"]) | set(runner_up["phases_s"])
    diffs = {
        ph: runner_up["phases_s"].get(ph, 0.0) - winner["phases_s"].get(ph, 0.0) for ph in phases
    }
    phase = max(diffs, key=lambda ph: abs(diffs[ph]))
    terms = {
        k: round(v, 2)
        for k, v in winner["details"].get(phase, {}).items()
        if k.endswith("_s") and isinstance(v, float)
    }
    other = {
        k: round(v, 2)
        for k, v in runner_up["details"].get(phase, {}).items()
        if k.endswith("_s") and isinstance(v, float)
    }
    mine, theirs = winner["phases_s"].get(phase, 0.0), runner_up["phases_s"].get(phase, 0.0)
    return (
        f"{winner['kind']} {winner['iteration_s']:.1f} s vs {runner_up['kind']} "
        f"{runner_up['iteration_s']:.1f} s; largest phase difference: {phase} "
        f"({mine:.1f} s vs {theirs:.1f} s; terms {terms} vs {other})"
    )


def run_one(num_gpus: int, model: str, time_limit_s: float) -> dict[str, Any]:
    cluster, wl = ppo_problem(num_gpus, model)
    wl = dataclasses.replace(wl, rollout_engine=RolloutEngine.VLLM)
    costs = {p.profile: fitted_cost_model(p.profile) for p in cluster.pools}
    t0 = time.perf_counter()
    load_before = os.getloadavg()[0]
    try:
        result = plan_search(cluster, wl, costs, time_limit_s=time_limit_s)
    except (Infeasible, SolverTimeout) as exc:
        status = "infeasible" if isinstance(exc, Infeasible) else "timeout"
        return {"num_gpus": num_gpus, "model": model, "status": status, "reason": str(exc),
                "load_1min_before": load_before}  # fmt: skip
    best_by_kind: dict[str, dict[str, Any]] = {}
    for pr in result.per_placement:
        if pr.best is None or not pr.best.estimate.feasible:
            continue
        row = _kind_row(pr.best, num_gpus)
        kept = best_by_kind.get(row["kind"])
        if kept is None or row["iteration_s"] < kept["iteration_s"]:
            best_by_kind[row["kind"]] = row
    ordered = sorted(best_by_kind.values(), key=lambda r: r["iteration_s"])
    winner = ordered[0] if ordered else None
    return {
        "num_gpus": num_gpus,
        "model": model,
        "status": result.status.value,
        "search_s": round(time.perf_counter() - t0, 1),
        "load_1min_before": load_before,
        "kinds": ordered,
        "winner": winner["kind"] if winner else None,
        "why": why(winner, ordered[1] if len(ordered) > 1 else None) if winner else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="16,32,64,128,256,512,1024")
    parser.add_argument("--models", default="llama-2-13b,codellama-34b,llama-2-70b")
    parser.add_argument("--time-limit", type=float, default=60.0)
    parser.add_argument(
        "--figure-only", action="store_true", help="redraw the page from the results file"
    )
    args = parser.parse_args()
    if args.figure_only:
        write_figure(json.loads(RESULTS.read_text()))
        return
    fitted_cost_model("a100-80gb")
    rows = []
    for model in args.models.split(","):
        for n in (int(s) for s in args.sizes.split(",")):
            row = run_one(n, model, args.time_limit)
            rows.append(row)
            print(f"{model} @ {n}: {row.get('winner')} ({row.get('why')})", file=sys.stderr)
    report = {
        "command": "python " + " ".join(["benchmarks/scaling.py", *sys.argv[1:]]),
        "date": time.strftime("%Y-%m-%d"),
        "profile": "a100-80gb",
        "cpu_count": os.cpu_count(),
        "rows": rows,
    }
    RESULTS.write_text(json.dumps(report, indent=1) + "\n")
    write_figure(report)
    print("| model | GPUs | kind | tokens/s/GPU | iteration s | winner |")
    print("|---|---:|---|---:|---:|---|")
    for r in rows:
        for k in r.get("kinds", []):
            mark = "**winner**" if k["kind"] == r["winner"] else ""
            print(
                f"| {r['model']} | {r['num_gpus']} | {k['kind']} | "
                f"{k['tokens_per_s_per_gpu']:,.0f} | {k['iteration_s']:.1f} | {mark} |"
            )


def write_figure(report: dict[str, Any]) -> None:
    """The self-contained HTML page of the scaling figure, from a results report."""
    rows = report["rows"]
    points = [
        ScalingPoint(
            num_gpus=r["num_gpus"],
            tokens_per_s=k["tokens_per_s_per_gpu"] * r["num_gpus"],
            label=f"{r['model']} {k['kind']}",
        )
        for r in rows
        for k in r.get("kinds", [])
    ]
    if not points:
        return
    fig = scaling_figure(points)
    fig.update_layout(title="PPO, four roles of one model, A100-80GB: best plan per kind")
    header = {
        "command": report["command"],
        "date": report["date"],
        "profile": report["profile"],
        "winners": "; ".join(f"{r['model']} @ {r['num_gpus']}: {r.get('winner')}" for r in rows),
    }
    page = Page(title="Strong scaling: PPO on A100-80GB", header=header, figures=[fig])
    write_page(page, FIGURE)


if __name__ == "__main__":
    main()
