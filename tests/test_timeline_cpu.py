"""`benchmarks/timeline_cpu.py`'s two sides keyed alike, on hand-made timelines.

Oracle: the medians of hand-written starts and ends; the simulated side keeps the
steady step's calls only and names the controller's as the run's metrics do.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))


def _line(*calls: tuple[str, int | None, float, float]) -> dict[str, object]:
    return {
        "timeline": [
            {"name": n, "device_set": s, "role": None, "start_s": a, "end_s": b}
            for n, s, a, b in calls
        ]
    }


def test_the_run_s_calls_are_medians_per_phase_and_set_by_hand() -> None:
    from timeline_cpu import measured_calls

    records = [
        _line(("generate", 0, 0.01, 0.05), ("reward", None, 0.05, 0.06)),
        _line(("generate", 0, 0.02, 0.09), ("reward", None, 0.05, 0.07)),
        _line(("generate", 0, 0.03, 0.06), ("values", 1, 0.01, 0.02)),
    ]
    got = measured_calls(records)
    assert set(got) == {"generate@0", "reward@driver", "values@1"}
    # starts 0.01/0.02/0.03, ends 0.05/0.09/0.06, lengths 0.04/0.07/0.03
    assert got["generate@0"] == pytest.approx({"start_s": 0.02, "end_s": 0.06, "length_s": 0.04})
    assert got["reward@driver"] == pytest.approx(
        {"start_s": 0.05, "end_s": 0.065, "length_s": 0.015}
    )


def test_the_simulated_calls_are_the_steady_step_s_keyed_as_the_run_s() -> None:
    from timeline_cpu import simulated_calls

    from placeflow.phases import Phase
    from placeflow.simulator.estimate import PhaseInterval

    def call(name: Phase, s: int, a: float, b: float, step: int) -> PhaseInterval:
        return PhaseInterval(
            name=name, roles=(), device_set=s, set_label="x", start_s=a, end_s=b, step=step
        )

    class Estimate:  # the two attributes `simulated_calls` reads of a StepEstimate
        steady_step = 1
        phases = (
            call(Phase.GENERATE, 0, 0.0, 0.5, 0),  # an earlier unrolled step: left out
            call(Phase.GENERATE, 0, 0.1, 0.4, 1),
            call(Phase.ADVANTAGE, -1, 0.4, 0.45, 1),
        )

    got = simulated_calls(Estimate())
    assert got == {
        "generate@0": pytest.approx({"start_s": 0.1, "end_s": 0.4, "length_s": 0.3}),
        "advantage@driver": pytest.approx({"start_s": 0.4, "end_s": 0.45, "length_s": 0.05}),
    }
