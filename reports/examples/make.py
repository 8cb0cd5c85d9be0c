"""Regenerate the example reports in this folder.

    python reports/examples/make.py

from the repository root (seconds: one simulation, one planner search).
Writes ppo-7b-colocate.html (`placeflow simulate` of the shipped colocated
PPO plan) and ppo-7b-plan-h100x16.html (`placeflow plan` of PPO Llama-2-7B on
16 H100s), each self-contained with plotly.js inlined.

grpo-tiny-split-validate.html is a run's report (it trains, so it is not made
here): from the repository root,

    placeflow validate examples/plans/grpo-tiny-cpu4-split.toml --profile cpu --steps 8 \
        --run-dir runs/validate-split --report reports/examples/grpo-tiny-split-validate.html
"""

from __future__ import annotations

from pathlib import Path

from placeflow.cluster import load_cluster
from placeflow.plan import load_plan
from placeflow.planner import plan_search
from placeflow.profiles.registry import fitted_cost_model
from placeflow.reports import plan_report, simulate_report
from placeflow.simulator import simulate
from placeflow.simulator.simulate import cost_models_for
from placeflow.workload import load_workload

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent


def main() -> None:
    plan = load_plan(ROOT / "examples/plans/ppo-7b-colocate-h100x16.toml")
    estimate = simulate(plan, cost_models_for(plan))
    print(simulate_report(estimate, HERE / "ppo-7b-colocate.html"))

    result = plan_search(
        load_cluster(ROOT / "examples/clusters/h100x16.toml"),
        load_workload(ROOT / "examples/workloads/ppo-llama2-7b.toml"),
        {"h100-sxm": fitted_cost_model("h100-sxm")},
    )
    print(plan_report(result, HERE / "ppo-7b-plan-h100x16.html"))


if __name__ == "__main__":
    main()
