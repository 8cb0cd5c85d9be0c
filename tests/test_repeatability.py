"""`benchmarks/repeatability.py`: two fidelity runs scored against each other, by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import repeatability  # benchmarks/ is on the test path


def _report(times: dict[str, dict[str, float]], speed: float | None, errors: float) -> dict:
    """A fidelity results file: plan -> phase -> measured seconds (the step is their sum);
    every prediction off by `errors`."""
    rows = []
    for plan, phases in times.items():
        rows.append(
            {
                "plan": plan,
                "host_speed": speed,
                "phases": [
                    {"phase": ph, "measured_s": t, "rel_error": errors} for ph, t in phases.items()
                ],
                "step": {"measured_s": sum(phases.values()), "rel_error": errors},
            }
        )
    return {"rows": rows}


FIRST = {"p": {"generate": 0.040, "reshard": 0.002}, "q": {"generate": 0.030}}
SECOND = {"p": {"generate": 0.050, "reshard": 0.001}, "q": {"generate": 0.030}}


def test_runs_are_scored_against_each_other_as_the_model_is() -> None:
    report = repeatability.compare(
        _report(FIRST, 1.0, 0.1), _report(SECOND, 1.25, -0.2), long_s=0.010
    )
    raw = report["run vs run"]["all"]
    # generate of p: 40/50 - 1 = -20 %; reshard: 2/1 - 1 = +100 %; q: 0.
    assert raw["phases"] == 3
    assert raw["median_abs_phases"] == pytest.approx(0.2)
    assert raw["worst_abs_phases"] == pytest.approx(1.0)
    assert raw["worst_phase"] == ["p", "reshard"]
    # steps: p 42/51 - 1, q 0.
    assert raw["steps"] == 2
    assert raw["worst_abs_steps"] == pytest.approx(1 - 42 / 51)
    assert raw["median_abs_steps"] == pytest.approx((1 - 42 / 51) / 2)
    # The 1-2 ms reshard is left out of the long phases.
    long = report["run vs run"]["phases >= 10 ms"]
    assert long["phases"] == 2 and long["worst_abs_phases"] == pytest.approx(0.2)
    # At the same speed the second run's times are over 1.25: generate of p 40 / 40 - 1 = 0,
    # reshard 2 / 0.8 - 1 = +150 %, q 30 / 24 - 1 = +25 %.
    same = report["run vs run, same speed"]["all"]
    assert same["median_abs_phases"] == pytest.approx(0.25)
    assert same["worst_abs_phases"] == pytest.approx(1.5)
    assert report["model vs first run"]["all"]["worst_abs_phases"] == pytest.approx(0.1)
    assert report["model vs second run"]["all"]["median_abs_steps"] == pytest.approx(0.2)


def test_without_speeds_there_is_no_same_speed_comparison() -> None:
    report = repeatability.compare(
        _report(FIRST, None, 0.0), _report(SECOND, None, 0.0), long_s=0.010
    )
    assert "run vs run, same speed" not in report


def test_command_line_writes_its_results(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(_report(FIRST, None, 0.0)))
    b.write_text(json.dumps(_report(SECOND, None, 0.0)))
    monkeypatch.setattr(repeatability, "RESULTS", tmp_path)
    assert repeatability.main([str(a), str(b)]) == 0
    out = json.loads((tmp_path / "repeatability_cpu.json").read_text())
    assert out["command"] == f"python benchmarks/repeatability.py {a} {b}"
    assert [r["file"] for r in out["runs"]] == ["a.json", "b.json"]
    assert out["report"]["run vs run"]["all"]["worst_phase"] == ["p", "reshard"]


def test_a_file_that_is_not_a_results_file_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    with pytest.raises(SystemExit, match="not a results file"):
        repeatability.main([str(bad), str(bad)])
