"""`benchmarks/repeatability.py`: two fidelity runs scored against each other, by hand."""

from __future__ import annotations

import json
import math
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


def test_out_names_where_the_report_goes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(_report(FIRST, None, 0.0)))
    b.write_text(json.dumps(_report(SECOND, None, 0.0)))
    monkeypatch.setattr(repeatability, "RESULTS", tmp_path)
    target = tmp_path / "elsewhere.json"
    assert repeatability.main([str(a), str(b), "--out", str(target)]) == 0
    assert json.loads(target.read_text())["runs"][0]["file"] == "a.json"
    assert not (tmp_path / "repeatability_cpu.json").exists()


def test_a_file_that_is_not_a_results_file_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    with pytest.raises(SystemExit, match="not a results file"):
        repeatability.main([str(bad), str(bad)])


def _rounds(runs: dict[str, list[dict[str, float]]], error: float = 0.0) -> dict:
    """A `fidelity_cpu.py --rounds N` results file: plan -> each run's phase seconds (its
    step their sum); the row scored at `error` on every phase and step."""
    rows = []
    for plan, times in runs.items():
        phases = sorted({ph for t in times for ph in t})
        rows.append(
            {
                "plan": plan,
                "phases": [{"phase": ph, "measured_s": 1.0, "rel_error": error} for ph in phases],
                "step": {"measured_s": 1.0, "rel_error": error},
                "runs": [{"phases": dict(t), "step_s": sum(t.values())} for t in times],
            }
        )
    return {"rows": rows, "date": "2026-11-28", "rounds": len(next(iter(runs.values())))}


def _times(runs: dict[str, list[dict[str, float]]]) -> dict:
    """`round_times` of the `_rounds` file of `runs`."""
    return repeatability.round_times(_rounds(runs))


def _normal_cdf(x: float) -> float:
    return 0.5 * (1 + math.erf(x / math.sqrt(2)))


def test_an_exact_model_scores_zero_where_the_runs_agree() -> None:
    same = {"generate": 0.040, "reshard": 0.002}
    floor = repeatability.noise_floor(_times({"p": [same] * 3}), draws=50, seed=0)
    for kind in ("phases", "steps"):
        assert floor[kind]["median_abs"] == 0.0 and floor[kind]["worst_abs"] == 0.0
        assert floor[kind]["share_both_within"] == 1.0


def test_the_floor_of_one_phase_follows_the_median_of_three_draws_by_hand() -> None:
    # Runs e^-a, 1, e^a: the logarithms' sample standard deviation is a. The median of
    # three draws of N(0, a^2) has CDF 3F^2 - 2F^3; an exact model's error is
    # e^-m - 1, within 25 % for -ln 1.25 <= m <= -ln 0.75.
    a = 0.2
    runs = [{"generate": math.exp(-a)}, {"generate": 1.0}, {"generate": math.exp(a)}]
    times = repeatability.round_times(_rounds({"p": runs}))
    assert repeatability.log_spread(times[("p", "generate")]) == pytest.approx(a)

    def median_cdf(m: float) -> float:
        f = _normal_cdf(m / a)
        return 3 * f**2 - 2 * f**3

    expected = median_cdf(-math.log(0.75)) - median_cdf(-math.log(1.25))
    floor = repeatability.noise_floor(_times({"p": runs}), draws=20000, seed=1)
    # One phase: its worst is itself; 20000 draws put the share within +-0.01 (3 sigma).
    assert floor["phases"]["share_worst_within"] == pytest.approx(expected, abs=0.01)
    assert floor["phases"]["noisiest"][:2] == ["p", "generate"]


def test_each_run_is_scored_against_the_median_of_the_others_by_hand() -> None:
    runs = [{"generate": 1.0}, {"generate": 2.0}, {"generate": 4.0}]
    scores = repeatability.run_vs_rest(_times({"p": runs}))
    # 1 / median(2, 4) - 1, 2 / median(1, 4) - 1, 4 / median(1, 2) - 1.
    expected = [abs(1 / 3 - 1), abs(2 / 2.5 - 1), abs(4 / 1.5 - 1)]
    assert [s["worst_abs_phases"] for s in scores] == pytest.approx(expected)
    assert [s["worst_abs_steps"] for s in scores] == pytest.approx(expected)


def test_a_phase_some_run_did_not_measure_is_left_out() -> None:
    runs = [{"generate": 1.0, "reshard": 0.1}, {"generate": 1.1}, {"generate": 1.2}]
    times = repeatability.round_times(_rounds({"p": runs}))
    assert set(times) == {("p", "generate"), ("p", "step")}


def test_rounds_command_line_writes_its_results(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = [{"generate": 1.0}, {"generate": 1.1}, {"generate": 0.9}]
    rounds, model = tmp_path / "rounds.json", tmp_path / "model.json"
    rounds.write_text(json.dumps(_rounds({"p": runs}, error=0.5)))
    model.write_text(json.dumps(_rounds({"p": runs}, error=-0.2)))
    monkeypatch.setattr(repeatability, "RESULTS", tmp_path)
    given = ["--rounds", str(rounds), "--model", str(model), "--draws", "10"]
    assert repeatability.main(given) == 0
    out = json.loads((tmp_path / "repeatability_rounds_cpu.json").read_text())
    assert out["command"] == "python benchmarks/repeatability.py " + " ".join(given)
    assert out["file"] == "rounds.json" and out["model_file"] == "model.json"
    # The model's score is the --model file's, not the rounds file's own.
    assert out["report"]["model_against_the_median"]["worst_abs_phases"] == pytest.approx(0.2)
    assert out["report"]["exact_model_against_the_median"]["draws"] == 10


def test_rounds_refuses_a_model_file_of_other_plans_and_a_file_without_runs(
    tmp_path: Path,
) -> None:
    runs = [{"generate": 1.0}, {"generate": 1.1}]
    rounds, other = tmp_path / "rounds.json", tmp_path / "other.json"
    rounds.write_text(json.dumps(_rounds({"p": runs})))
    other.write_text(json.dumps(_rounds({"q": runs})))
    with pytest.raises(SystemExit, match="does not score 2 phases"):
        repeatability.main(["--rounds", str(rounds), "--model", str(other)])
    single = tmp_path / "single.json"
    single.write_text(json.dumps(_report(FIRST, None, 0.0)))
    with pytest.raises(SystemExit, match="two or more runs"):
        repeatability.main(["--rounds", str(single)])
    with pytest.raises(SystemExit):
        repeatability.main(["--rounds", str(rounds), str(rounds)])


def test_the_floor_without_the_noisiest_phase_is_that_of_the_rest() -> None:
    # reshard varies 1-4x between the runs, generate not at all: without reshard, the
    # worst phase an exact model shows is generate's, 0.
    runs = [{"generate": 1.0, "reshard": 1.0}, {"generate": 1.0, "reshard": 4.0}]
    runs.append({"generate": 1.0, "reshard": 2.0})
    floor = repeatability.noise_floor(_times({"p": runs}), draws=200, seed=0)
    assert floor["phases"]["worst_abs"] > 0.25
    (without,) = floor["phases"]["without_widest"]
    assert without["left_out"] == [["p", "reshard"]]
    assert without["worst_abs"] == 0.0 and without["share_worst_within"] == 1.0


def _across(t: float, speed: float) -> dict:
    return _report({"p": {"generate": t}, "q": {"generate": 0.030}}, speed, 0.1)


def test_each_file_is_scored_against_the_median_of_the_others_by_hand() -> None:
    reports = [_across(0.040, 1.0), _across(0.050, 1.25), _across(0.060, 1.5)]
    first, second, _ = repeatability.across_report(reports)
    # The first file's p generate against the others' median, (50 + 60) / 2 ms: +37.5 %;
    # q the same everywhere: 0. Steps alike (each plan's step is its one phase).
    raw = first["others_median_vs_run"]
    assert raw["worst_abs_phases"] == pytest.approx(0.375)
    assert raw["worst_phase"] == ["p", "generate"]
    assert raw["median_abs_phases"] == pytest.approx(0.1875)
    assert raw["worst_abs_steps"] == pytest.approx(0.375)
    # At the first file's speed the others read 50 / 1.25 and 60 / 1.5 ms, i.e. 40: 0;
    # and q's 30 ms at speeds 1.25 and 1.5 read 24 and 20 ms: 22 / 30 - 1.
    same = first["others_median_vs_run_same_speed"]
    assert same["worst_abs_phases"] == pytest.approx(1 - 22 / 30)
    assert same["worst_phase"] == ["q", "generate"]
    # The middle file is the others' median itself.
    assert second["others_median_vs_run"]["worst_abs_phases"] == pytest.approx(0.0)
    assert first["model_vs_run"]["worst_abs_phases"] == pytest.approx(0.1)


def test_across_needs_three_files_and_writes_its_results(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ValueError, match="three or more"):
        repeatability.across_report([_across(0.04, 1.0), _across(0.05, 1.0)])
    paths = []
    for i, t in enumerate((0.040, 0.050, 0.060)):
        paths.append(tmp_path / f"r{i}.json")
        paths[-1].write_text(json.dumps(_across(t, 1.0)))
    monkeypatch.setattr(repeatability, "RESULTS", tmp_path)
    assert repeatability.main(["--across", *map(str, paths)]) == 0
    out = json.loads((tmp_path / "repeatability_across_cpu.json").read_text())
    assert [r["file"] for r in out["runs"]] == ["r0.json", "r1.json", "r2.json"]
    # The last file's 60 ms against the others' median, 45 ms: -25 %.
    assert out["report"][2]["others_median_vs_run"]["worst_abs_phases"] == pytest.approx(0.25)
