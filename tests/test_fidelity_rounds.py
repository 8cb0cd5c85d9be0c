"""`benchmarks/fidelity_cpu.py --rounds`: a plan scored against the median of its runs.

Records with known phase times (multiples of the simulated ones) stand in for the
runs, so every figure of the row and of the round summary is computed by hand.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fidelity_cpu import _round_summary, _score, make_plan  # benchmarks/ is on the test path

from placeflow.executor.loop import as_run
from placeflow.profiles.registry import load_profile
from placeflow.simulator import simulate
from placeflow.simulator.simulate import cost_models_for


def _run(scale: float, predicted: dict[str, float], iteration: float, speed: float) -> dict:
    """One run's entry as the benchmark keeps it: a warm-up step, then three steps at
    `scale` times the prediction; checked at host speed `speed`."""
    steps = [
        {
            "step": i,
            "step_time_s": iteration * scale,
            "phases": {k: v * scale for k, v in predicted.items()},
        }
        for i in range(1, 4)
    ]
    warm = {"step": 0, "step_time_s": 9.0, "phases": {k: 9.0 for k in predicted}}
    return {
        "records": [warm, *steps],
        "load_1min_before": 2.0 * scale,
        "load_1min_after": 3.0,
        "host_speed": speed,
        "host_checks": [speed, speed],
    }


def test_a_plan_is_scored_against_the_median_of_its_runs() -> None:
    plan = as_run(make_plan("split", "tiny-llama", 8))
    profile = load_profile("cpu")
    est = simulate(plan, cost_models_for(plan, "cpu"))
    predicted = {k: v for k, v in est.phase_totals_s().items() if v > 0}
    # Host speed 1.0 in every run: the row is simulated with the profile as it is.
    runs = [_run(scale, predicted, est.iteration_s, 1.0) for scale in (2.0, 4.0, 3.0)]
    row = _score("split", plan, runs, profile, "cpu", warmup=1)
    assert row["host_speed"] == 1.0 and len(row["host_checks"]) == 6
    assert row["load_1min_before"] == pytest.approx(6.0)  # median of 4, 8, 6
    # The median run is 3x the simulation (the simulation at speed 1 is `est`'s within
    # the cost model's rounding).
    for p in row["phases"]:
        assert p["rel_error"] == pytest.approx(-2 / 3, rel=1e-6)
    assert row["step"]["rel_error"] == pytest.approx(-2 / 3, rel=1e-6)
    assert [r["step_s"] / est.iteration_s for r in row["runs"]] == pytest.approx([2, 4, 3])
    assert "records" not in row["runs"][0]

    summary = _round_summary([row])
    # Runs at 2x, 4x and 3x against their median 3x: 1/3, 1/3 and 0 off.
    spread = [r["steps"]["median"] for r in summary["run_vs_median_of_runs"]]
    assert spread == pytest.approx([1 / 3, 1 / 3, 0])
    assert summary["run_vs_median_of_runs"][1]["phases"] == pytest.approx(
        {"median": 1 / 3, "worst": 1 / 3}
    )
    # Rounds against each other: 2/4, 2/3 and 4/3.
    apart = {k: v["steps"]["median"] for k, v in summary["round_vs_round"].items()}
    assert apart == pytest.approx({"1 vs 2": 0.5, "1 vs 3": 1 / 3, "2 vs 3": 1 / 3})
    # The model against each round alone: 1/2 - 1, 1/4 - 1 and 1/3 - 1.
    each = [r["steps"]["median"] for r in summary["model_vs_each_round"]]
    assert each == pytest.approx([0.5, 0.75, 2 / 3], rel=1e-6)
    assert summary["model_vs_each_round"][0]["phases"]["worst"] == pytest.approx(0.5, rel=1e-6)


def test_one_run_keeps_the_rows_shape() -> None:
    plan = as_run(make_plan("split", "tiny-llama", 8))
    est = simulate(plan, cost_models_for(plan, "cpu"))
    predicted = {k: v for k, v in est.phase_totals_s().items() if v > 0}
    run = _run(2.0, predicted, est.iteration_s, 1.0)
    row = _score("split", plan, [run], load_profile("cpu"), "cpu", warmup=1)
    assert "runs" not in row
    assert row["step"]["rel_error"] == pytest.approx(-0.5, rel=1e-6)


def test_the_engine_s_pieces_are_simulated_at_their_own_checked_speed() -> None:
    # Runs checked at GEMM speed 1.0 and the engine's pieces at 0.5, 0.25 and 1.0: the
    # row is simulated at the median 0.5 for the engine's pieces, the profile's speed for
    # the rest, so it predicts less than with the GEMMs' speed alone and more than with
    # every entry at 0.5.
    from fidelity_cpu import cost_models_at

    from placeflow.profiles.costmodel import CostModel
    from placeflow.profiles.hostcheck import at_host_speed

    plan = as_run(make_plan("split", "tiny-llama", 8))
    profile = load_profile("cpu")
    est = simulate(plan, cost_models_for(plan, "cpu"))
    predicted = {k: v for k, v in est.phase_totals_s().items() if v > 0}
    runs = []
    for work in (0.5, 0.25, 1.0):
        run = _run(1.0, predicted, est.iteration_s, 1.0)
        run["host_work_speed"], run["host_work_checks"] = work, [work, work]
        runs.append(run)
    row = _score("split", plan, runs, profile, "cpu", warmup=1)
    assert row["host_work_speed"] == 0.5
    at_work = simulate(plan, cost_models_at(profile, 1.0, "now", 0.5)).iteration_s
    all_half = simulate(plan, {"*": CostModel.fit(at_host_speed(profile, 0.5, checked="now"))})
    assert all_half.iteration_s < at_work < est.iteration_s * (1 - 1e-3)
    assert row["step"]["predicted_s"] == pytest.approx(at_work)


def test_host_speeds_are_medians_of_the_checks_that_read(monkeypatch: pytest.MonkeyPatch) -> None:
    # GEMM checks read 0.9, none (no GEMM re-timed) and 1.2: the speed is their median
    # 1.05; the engine's checks 0.7, None, 0.5: 0.6. With no GEMM speed the engine's
    # pieces are not checked at all (the benchmarks then simulate at the profile's speed).
    import fidelity_cpu

    class Check:
        def __init__(self, ratio: float | None) -> None:
            self.ratio = ratio

    gemms = iter([0.9, None, 1.2])
    engine = iter([0.7, None, 0.5])
    monkeypatch.setattr(fidelity_cpu, "check_host", lambda profile: Check(next(gemms)))
    monkeypatch.setattr(fidelity_cpu, "check_framework", lambda profile: next(engine))
    got = fidelity_cpu.host_speeds(load_profile("cpu"))
    assert got.speed == pytest.approx(1.05)
    assert got.work_checks == (0.7, None, 0.5)
    assert got.work_speed == pytest.approx(0.6)

    monkeypatch.setattr(fidelity_cpu, "check_host", lambda profile: Check(None))
    none = fidelity_cpu.host_speeds(load_profile("cpu"))
    assert (none.speed, none.work_checks, none.work_speed) == (None, (), None)


def test_a_resimulation_at_the_gemm_speed_only_leaves_the_engine_s_pieces_alone(
    tmp_path: Path,
) -> None:
    # An earlier run of one plan that recorded GEMM speed 1.0 and the engine's pieces at
    # 0.5: re-simulated with its speeds it predicts the step at (1.0, 0.5), and with
    # work_speed False at the GEMMs' 1.0 alone, the profile's own times here, which is
    # more (the pieces at half their time make the step shorter).
    import fidelity_cpu
    from fidelity_cpu import cost_models_at

    plan = as_run(make_plan("split", "tiny-llama", 8))
    profile = load_profile("cpu")
    est = simulate(plan, cost_models_for(plan, "cpu"))
    phases = [
        {"phase": k, "measured_s": v, "predicted_s": v, "rel_error": 0.0}
        for k, v in est.phase_totals_s().items()
        if v > 0
    ]
    row = {
        "plan": plan.name,
        "host_speed": 1.0,
        "host_work_speed": 0.5,
        "phases": phases,
        "step": {"measured_s": est.iteration_s, "predicted_s": est.iteration_s},
    }
    earlier = tmp_path / "earlier.json"
    earlier.write_text(
        json.dumps({"date": "now", "load_1min_median": 0.0, "host_speed": 1.0, "rows": [row]})
    )
    with_work, without = tmp_path / "with.json", tmp_path / "without.json"
    fidelity_cpu.resimulate(earlier, "cpu", True, with_work)
    fidelity_cpu.resimulate(earlier, "cpu", True, without, work_speed=False)
    step = {
        p: json.loads(p.read_text())["rows"][0]["step"]["predicted_s"] for p in (with_work, without)
    }
    at_work = simulate(plan, cost_models_at(profile, 1.0, "now", 0.5)).iteration_s
    at_gemms = simulate(plan, cost_models_at(profile, 1.0, "now", None)).iteration_s
    assert step[with_work] == pytest.approx(at_work)
    assert step[without] == pytest.approx(at_gemms)
    assert step[with_work] < step[without] * (1 - 1e-3)
