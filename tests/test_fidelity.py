"""Fidelity tables and run reports: `placeflow validate`, `placeflow report`, `placeflow run`.

The comparison is checked on records with known phase times (errors computed
by hand); the commands run a tiny plan for real on the session's Ray.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from placeflow.cli import main
from placeflow.errors import SpecError
from placeflow.plan import load_plan
from placeflow.reports.run import run_report
from placeflow.simulator import simulate
from placeflow.simulator.fidelity import compare
from placeflow.simulator.simulate import cost_models_for

PLANS = Path(__file__).resolve().parents[1] / "examples" / "plans"
SPLIT = PLANS / "grpo-tiny-cpu4-split.toml"


def _records(scale: float, predicted: dict[str, float], iteration: float) -> list[dict]:
    # A warm-up step (ignored) then three steps at `scale` times the prediction.
    warm = {"step": 0, "step_time_s": 99.0, "phases": {k: 99.0 for k in predicted}}
    steps = [
        {
            "step": i,
            "step_time_s": iteration * scale,
            "phases": {**{k: v * scale for k, v in predicted.items()}, "reward": 0.001},
        }
        for i in range(1, 4)
    ]
    return [warm, *steps]


def test_compare_by_hand() -> None:
    plan = load_plan(SPLIT)
    est = simulate(plan, cost_models_for(plan, "cpu"))
    predicted = {k: v for k, v in est.phase_totals_s().items() if v > 0}
    table = compare(est, _records(2.0, predicted, est.iteration_s))
    assert table.steps == 3
    assert {p.phase for p in table.phases} == set(predicted) - {"advantage", "reward"}
    for p in table.phases:
        assert p.rel_error == pytest.approx(-0.5)  # predicted is half of measured
    assert table.step.rel_error == pytest.approx(-0.5)
    assert table.median_abs_error == pytest.approx(0.5)
    assert "reward" not in table.unscored  # controller-side phases are not listed as missing
    text = table.to_markdown()
    assert "| step |" in text and "-50%" in text
    assert json.loads(json.dumps(table.to_json()))["worst_abs_error"] == pytest.approx(0.5)


def test_report_needs_a_run_dir(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="not a run directory"):
        run_report(tmp_path)
    assert main(["report", str(tmp_path)]) == 2


def test_validate_and_report_commands(
    ray_cluster: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = tmp_path / "val"
    code = main(
        [
            "validate",
            str(SPLIT),
            "--profile",
            "cpu",
            "--steps",
            "3",
            "--run-dir",
            str(run_dir),
            "--no-progress",
        ]
    )
    assert code == 0
    out = capsys.readouterr().out
    assert "measured vs simulated" in out and "actor_update" in out
    fidelity = json.loads((run_dir / "fidelity.json").read_text())
    assert fidelity["steps"] == 2 and fidelity["profile"] == "cpu"
    assert {p["phase"] for p in fidelity["phases"]} >= {"generate", "actor_update"}
    html = (run_dir / "report.html").read_text()
    assert "Measured vs simulated" in html and "plotly" in html
    assert main(["report", str(run_dir), "--out", str(tmp_path / "r.html")]) == 0
    assert (tmp_path / "r.html").is_file()
    # `run` refuses to overwrite it and resumes it.
    assert main(["run", str(SPLIT), "--steps", "4", "--run-dir", str(run_dir)]) == 2
    assert "--resume" in capsys.readouterr().err
    assert (
        main(
            [
                "run",
                str(SPLIT),
                "--steps",
                "4",
                "--run-dir",
                str(run_dir),
                "--resume",
                "--no-progress",
            ]
        )
        == 0
    )
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in lines] == [0, 1, 2, 3]


def test_validate_refuses_unexecutable_plans(tmp_path: Path) -> None:
    code = main(
        [
            "validate",
            str(PLANS / "ppo-7b-colocate-h100x16.toml"),
            "--profile",
            "cpu",
            "--run-dir",
            str(tmp_path),
        ]
    )
    assert code == 2
