"""The GPU benchmarks' CPU-side behaviour: a clear exit without CUDA, and re-simulating a
recorded run with the model as it is now (`gpu_step.py --resimulate`)."""

from __future__ import annotations

import json
from pathlib import Path

import gpu_step
import pytest
import torch
from benchrun import run_benchmark

from placeflow.plan import load_plan
from placeflow.simulator import simulate
from placeflow.simulator.simulate import cost_models_for
from placeflow.workload import Role

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(torch.cuda.is_available(), reason="the scripts measure when CUDA is there")
@pytest.mark.parametrize("script", ["gpu_step.py", "gpu_decode.py"])
def test_without_cuda_the_benchmarks_say_so_and_exit_2(script: str) -> None:
    done = run_benchmark(script, timeout=120)
    assert done.returncode == 2
    assert "sees no CUDA device" in done.stderr


def test_resimulate_keeps_the_measurement_and_prices_the_recorded_micro_batch(
    tmp_path: Path,
) -> None:
    recorded = {
        "plan": "examples/plans/grpo-llama-0.9b-h100x1.toml",
        "actor_micro_batch": 128,
        "step_s": 2.0,
        "simulated_step_s": 99.0,
        "phases": {
            "actor_update": {"measured_s": 0.5, "simulated_s": 99.0},
            "reward": {"measured_s": 0.01, "simulated_s": None},
        },
    }
    path = tmp_path / "run.json"
    path.write_text(json.dumps(recorded))
    gpu_step.resimulate(path)
    out = json.loads((tmp_path / "run_resimulated.json").read_text())

    plan = gpu_step.with_micro_batch(load_plan(ROOT / recorded["plan"]), 128)
    assert plan.parallelism[Role.ACTOR].micro_batch == 128
    estimate = simulate(plan, cost_models_for(plan))
    assert out["step_s"] == 2.0 and out["phases"]["actor_update"]["measured_s"] == 0.5
    assert out["simulated_step_s"] == round(estimate.iteration_s, 4)
    assert out["step_error"] == round(estimate.iteration_s / 2.0 - 1, 4)
    update = estimate.phase_totals_s()["actor_update"]
    assert out["phases"]["actor_update"]["simulated_s"] == round(update, 4)
    assert out["phases"]["reward"]["simulated_s"] is None  # a phase the simulator has not
    # The micro-batch is the recorded one: the plan's own (32) prices another update.
    own = simulate(load_plan(ROOT / recorded["plan"]), cost_models_for(plan))
    assert own.phase_totals_s()["actor_update"] != pytest.approx(update)
