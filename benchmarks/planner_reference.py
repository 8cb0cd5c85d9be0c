"""Benchmark check: the planner's per-placement rows for a fixed set of cases, to compare
two versions of the search (e.g. before and after a speed-up) for identical results.

For each case (PPO with four roles of one model size, GRPO, a small mixture of
experts, the asynchronous PPO workload; A100-80GB nodes of 8) runs `plan_search`
with the default time limit and records the status, the best plan and every
placement's row: status, the solver's step time, the plan's GPUs, the
simulator's tokens/s and the plan's content hash (or the reason for no plan).
`--compare FILE` checks the rows against a file written earlier and exits
non-zero on any difference in status, step time, GPUs or tokens/s (plan hashes
may differ between equally good plans and are reported, not required equal).
Each row also records its plan in short (`plan_summary`: sets, and each role's
p-t-d-e, tg, micro-batch, ZeRO and memory savers), so that a difference can be
explained. `--ties FILE` (with `--compare`) writes every row whose plan changed
to FILE, old and new side by side, and says whether it is an exact tie in the
model: the same status, model step time and GPUs, so the same objective.

    python benchmarks/planner_reference.py --out benchmarks/results/planner_reference.json
    python benchmarks/planner_reference.py --compare benchmarks/results/planner_reference.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path

from planner_speed import ROOT, ppo_problem

import placeflow
from placeflow.catalogue import CATALOGUE
from placeflow.cluster import ClusterSpec
from placeflow.plan import Plan
from placeflow.planner import Infeasible, plan_search
from placeflow.profiles.registry import fitted_cost_model
from placeflow.workload import Workload, load_workload

CASES = (
    ("ppo", "llama-2-7b", 16),
    ("ppo", "llama-2-7b", 64),
    ("ppo", "llama-2-7b", 128),
    ("ppo", "llama-2-13b", 16),
    ("ppo", "llama-2-13b", 64),
    ("ppo", "llama-2-13b", 128),
    ("ppo-async", "llama-2-7b", 64),
    ("grpo", "qwen2.5-7b", 16),
    ("grpo", "qwen2.5-7b", 64),
    ("grpo", "llama-2-13b", 128),
    ("grpo", "qwen3-30b-a3b", 16),
    ("grpo", "qwen3-30b-a3b", 64),
)
WORKLOADS = {
    "ppo": "ppo-llama2-7b.toml",
    "ppo-async": "ppo-llama2-7b-async.toml",
    "grpo": "grpo-qwen2.5-7b.toml",
}


def problem(kind: str, model: str, num_gpus: int) -> tuple[ClusterSpec, Workload]:
    cluster, _ = ppo_problem(num_gpus, model)
    wl = load_workload(ROOT / "examples/workloads" / WORKLOADS[kind])
    wl = dataclasses.replace(
        wl, name=f"{kind}-{model}", models={r: CATALOGUE[model] for r in wl.roles}
    )
    return cluster, wl


def plan_summary(plan: Plan) -> str:
    """The plan in short: its sets, then each role's layout, tg, micro-batch and savers."""
    sets = " | ".join(
        "+".join(r.value for r in s.roles) + f"@{s.num_devices}" + (" gen" if s.generator else "")
        for s in plan.sets
    )
    roles = "; ".join(
        f"{role.value} p{par.train.p} t{par.train.t} d{par.train.d} e{par.train.e} "
        f"tg{par.tg} mb{par.micro_batch} z{par.zero}"
        + (" recompute" if par.recompute else "")
        + (f" offload({par.optimizer_step.value})" if par.offload_optimizer else "")
        + (" offload_params" if par.offload_params else "")
        for role, par in sorted(plan.parallelism.items(), key=lambda kv: kv[0].value)
    )
    return f"{sets}: {roles}"


def rows_of(kind: str, model: str, num_gpus: int) -> dict[str, object]:
    cluster, wl = problem(kind, model, num_gpus)
    costs = {p.profile: fitted_cost_model(p.profile) for p in cluster.pools}
    case: dict[str, object] = {"case": f"{kind} {model} @{num_gpus}"}
    c0 = time.process_time()
    try:
        result = plan_search(cluster, wl, costs)
    except Infeasible as exc:
        case.update(status="infeasible", reason=str(exc), cpu_s=round(time.process_time() - c0, 2))
        return case
    case["cpu_s"] = round(time.process_time() - c0, 2)
    case["status"] = result.status.value
    case["best"] = {
        "kind": result.best.kind.value,
        "gpus": result.best.plan.num_gpus,
        "model_step_s": result.best.model_step_s,
        "tokens_per_s": result.best.estimate.tokens_per_s,
        "hash": result.best.plan.content_hash(),
    }
    case["rows"] = [
        {
            "placement": r.placement.label(),
            "status": r.status.value,
            **(
                {
                    "model_step_s": r.best.model_step_s,
                    "gpus": r.best.plan.num_gpus,
                    "tokens_per_s": r.best.estimate.tokens_per_s,
                    "hash": r.best.plan.content_hash(),
                    "plan_summary": plan_summary(r.best.plan),
                }
                if r.best is not None
                else {"reason": r.reason}
            ),
        }
        for r in result.per_placement
    ]
    return case


def differences(old: dict, new: dict) -> list[str]:
    """What differs between two cases' records, other than plan hashes and CPU time."""
    out = []
    for key in ("status", "reason"):
        if old.get(key) != new.get(key):
            out.append(f"{key}: {old.get(key)!r} != {new.get(key)!r}")
    for r_old, r_new in zip(old.get("rows", []), new.get("rows", []), strict=True):
        for key in ("placement", "status", "model_step_s", "gpus", "tokens_per_s", "reason"):
            if r_old.get(key) != r_new.get(key):
                out.append(f"{r_old['placement']}: {key} {r_old.get(key)!r} != {r_new.get(key)!r}")
    return out


def changed_rows(old: dict, new: dict) -> list[dict[str, object]]:
    """The rows of one case whose plan changed, old and new, each marked whether it is an
    exact tie in the model (same status, model step time and GPUs)."""
    out: list[dict[str, object]] = []
    for r_old, r_new in zip(old.get("rows", []), new.get("rows", []), strict=True):
        if r_old.get("hash") == r_new.get("hash"):
            continue
        keys = ("status", "model_step_s", "gpus")
        out.append(
            {
                "case": new["case"],
                "placement": r_new["placement"],
                "exact_tie_in_model": all(r_old.get(k) == r_new.get(k) for k in keys),
                **{f"{k}": r_new.get(k) for k in keys},
                "tokens_per_s_old": r_old.get("tokens_per_s"),
                "tokens_per_s_new": r_new.get("tokens_per_s"),
                "plan_old": r_old.get("plan_summary"),
                "plan_new": r_new.get("plan_summary"),
            }
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path)
    parser.add_argument("--compare", type=Path)
    parser.add_argument("--ties", type=Path, help="with --compare: write the changed rows here")
    args = parser.parse_args()
    fitted_cost_model("a100-80gb")
    reference = json.loads(args.compare.read_text())["cases"] if args.compare else None
    cases, failed = [], 0
    changed: list[dict[str, object]] = []
    for i, (kind, model, n) in enumerate(CASES):
        case = rows_of(kind, model, n)
        cases.append(case)
        if reference is not None:
            changed += changed_rows(reference[i], case)
            diff = differences(reference[i], case)
            failed += bool(diff)
            hashes = sum(
                a.get("hash") != b.get("hash")
                for a, b in zip(reference[i].get("rows", []), case.get("rows", []), strict=True)
            )
            print(case["case"], case["cpu_s"], diff or "SAME", f"hash diffs {hashes}")
        else:
            print(case["case"], case["cpu_s"], case["status"], flush=True)
    if args.out:
        args.out.write_text(
            json.dumps(
                {
                    "command": "python "
                    + " ".join(["benchmarks/planner_reference.py", *sys.argv[1:]]),
                    "date": time.strftime("%Y-%m-%d"),
                    "load_avg_1m": round(os.getloadavg()[0], 2),
                    # Which checkout's package ran (a base tree comes through PYTHONPATH).
                    "placeflow": str(Path(placeflow.__file__).resolve().parent),
                    "cases": cases,
                },
                indent=1,
            )
            + "\n"
        )
    if args.ties and reference is not None:
        args.ties.write_text(
            json.dumps(
                {
                    "command": "python "
                    + " ".join(["benchmarks/planner_reference.py", *sys.argv[1:]]),
                    "date": time.strftime("%Y-%m-%d"),
                    "reference": str(args.compare),
                    "changed_rows": changed,
                },
                indent=1,
            )
            + "\n"
        )
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
