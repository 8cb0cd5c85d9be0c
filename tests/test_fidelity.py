"""Fidelity tables and run reports: `placeflow validate`, `placeflow report`, `placeflow run`.

The comparison is checked on records with known phase times (errors computed
by hand); the commands run a tiny plan for real on the session's Ray.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from test_simulator import without_host_waits

from placeflow.cli import main
from placeflow.errors import SpecError
from placeflow.executor.loop import as_run
from placeflow.phases import Phase
from placeflow.plan import load_plan
from placeflow.reports.run import run_report
from placeflow.simulator import StepEstimate, simulate
from placeflow.simulator.estimate import PhaseInterval
from placeflow.simulator.fidelity import (
    call_overlap,
    compare,
    compare_runs,
    simulated_overlap,
)
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
    # The driver's scoring and advantages (the simulator's phases of no role) are listed
    # apart with both sides' times: the records' 1 ms reward, the advantage at twice.
    assert {p.phase for p in table.controller} == {"advantage", "reward"}
    listed = {p.phase: p for p in table.controller}
    assert listed["reward"].measured_s == pytest.approx(0.001)
    assert listed["reward"].predicted_s == pytest.approx(predicted["reward"])
    assert listed["advantage"].measured_s == pytest.approx(2 * predicted["advantage"])
    assert table.to_json()["controller"][0]["phase"] == "advantage"
    text = table.to_markdown()
    assert "| step |" in text and "-50%" in text
    assert json.loads(json.dumps(table.to_json()))["worst_abs_error"] == pytest.approx(0.5)
    # No record has a timeline: the measured overlap is unknown, not 0 or 1.
    assert table.measured_overlap is None and table.to_json()["measured_overlap"] is None
    assert f"overlap: measured -, simulated {table.simulated_overlap:.2f}" in text


def test_compare_runs_takes_the_median_of_each_runs_median() -> None:
    plan = load_plan(SPLIT)
    est = simulate(plan, cost_models_for(plan, "cpu"))
    predicted = {k: v for k, v in est.phase_totals_s().items() if v > 0}
    # Three runs at 2x, 4x and 1.25x the prediction: the median run is 2x.
    runs = [_records(scale, predicted, est.iteration_s) for scale in (2.0, 4.0, 1.25)]
    table = compare_runs(est, runs)
    assert table.steps == 9
    for p in table.phases:
        assert p.measured_s == pytest.approx(2.0 * predicted[p.phase])
        assert p.rel_error == pytest.approx(-0.5)
    assert table.step.measured_s == pytest.approx(2.0 * est.iteration_s)
    # A phase the 2x run lacks is the median of the two runs that have it: (4 + 1.25) / 2.
    name = table.phases[0].phase
    for r in runs[0]:
        del r["phases"][name]
    lacking = compare_runs(est, runs)
    first = next(p for p in lacking.phases if p.phase == name)
    assert first.measured_s == pytest.approx(2.625 * predicted[name])
    # One run is `compare` itself; none is refused.
    assert compare_runs(est, runs[1:2]) == compare(est, runs[1])
    with pytest.raises(ValueError, match="no runs"):
        compare_runs(est, [])


def _call(name: str, device_set: int | None, start_s: float, end_s: float) -> dict:
    return {
        "name": name,
        "device_set": device_set,
        "role": None,
        "start_s": start_s,
        "end_s": end_s,
    }


def test_measured_overlap_by_hand() -> None:
    plan = load_plan(SPLIT)
    est = simulate(plan, cost_models_for(plan, "cpu"))
    records = _records(1.0, est.phase_totals_s(), est.iteration_s)
    timelines = [
        [_call("generate", 0, 0.0, 1.0), _call("ref_logprob", 1, 0.0, 1.0)],  # warm-up: 2.0
        # 0.4 + 0.3 + 0.5 call seconds over a 0.9 s span (from 0.1 to 1.0)
        [
            _call("generate", 0, 0.1, 0.5),
            _call("ref_logprob", 1, 0.5, 0.8),
            _call("actor_update", 0, 0.5, 1.0),
        ],
        [_call("generate", 0, 0.0, 0.5), _call("actor_update", 0, 0.5, 1.0)],  # serial: 1.0
        [_call("generate", 0, 0.0, 1.0), _call("advantage", None, 0.5, 1.0)],  # 1.5
    ]
    for r, timeline in zip(records, timelines, strict=True):
        r["timeline"] = timeline
    assert call_overlap(timelines[1]) == pytest.approx(1.2 / 0.9)
    table = compare(est, records)
    assert table.measured_overlap == pytest.approx(1.2 / 0.9)  # median of 4/3, 1.0 and 1.5
    # A step without a timeline (an older executor's line) is left out of the median.
    del records[3]["timeline"]
    assert compare(est, records).measured_overlap == pytest.approx((1.2 / 0.9 + 1.0) / 2)
    assert "overlap: measured 1.17," in compare(est, records).to_markdown()


def _interval(name: Phase, device_set: int, start_s: float, end_s: float, step: int = 0):
    return PhaseInterval(
        name=name,
        roles=(),
        device_set=device_set,
        set_label="",
        start_s=start_s,
        end_s=end_s,
        step=step,
    )


def _estimate(phases: tuple[PhaseInterval, ...], iteration_s: float) -> StepEstimate:
    return StepEstimate(
        plan_name="hand",
        plan_hash="0",
        profile_name="cpu",
        feasible=True,
        iteration_s=iteration_s,
        tokens_per_s=1.0,
        samples_per_s=1.0,
        phases=phases,
        sets=(),
    )


def test_simulated_overlap_by_hand() -> None:
    # generate 2 s on set 0; then ref_logprob (1 s, set 1) beside actor_update (2 s, set 0);
    # the controller's advantage takes no time. (2 + 1 + 2 + 0) / 4 s.
    synchronous = _estimate(
        (
            _interval(Phase.GENERATE, 0, 0.0, 2.0),
            _interval(Phase.REF_LOGPROB, 1, 2.0, 3.0),
            _interval(Phase.ACTOR_UPDATE, 0, 2.0, 4.0),
            _interval(Phase.ADVANTAGE, -1, 3.0, 3.0),
        ),
        iteration_s=4.0,
    )
    assert simulated_overlap(synchronous) == pytest.approx(1.25)
    # One step off: step 1's generation (set 1) runs beside step 0's update (set 0), a step
    # every 2 s in steady state; the last step's calls (2 + 2 s) over it.
    one_step_off = _estimate(
        (
            _interval(Phase.GENERATE, 1, 0.0, 2.0, step=0),
            _interval(Phase.ACTOR_UPDATE, 0, 2.0, 4.0, step=0),
            _interval(Phase.GENERATE, 1, 2.0, 4.0, step=1),
            _interval(Phase.ACTOR_UPDATE, 0, 4.0, 6.0, step=1),
        ),
        iteration_s=2.0,
    )
    assert simulated_overlap(one_step_off) == pytest.approx(2.0)


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
    assert "overlap: measured " in out
    assert "simulated with prompts of 6 tokens" in out
    # The CPU profile was re-timed on this host first (`profiles.hostcheck`).
    assert "profile 'cpu': this host runs its GEMMs at " in out
    fidelity = json.loads((run_dir / "fidelity.json").read_text())
    assert fidelity["simulated_overlap"] > 0
    assert fidelity["steps"] == 2 and fidelity["profile"] == "cpu"
    assert {p["phase"] for p in fidelity["phases"]} >= {"generate", "actor_update"}
    # Simulated as it runs: prompts of the data's longest (6 tokens), not the plan's 16.
    declared = load_plan(SPLIT)
    cms = cost_models_for(declared, "cpu")
    estimate = json.loads((run_dir / "estimate.json").read_text())
    assert estimate["iteration_s"] == pytest.approx(simulate(as_run(declared), cms).iteration_s)
    assert estimate["iteration_s"] < simulate(declared, cms).iteration_s
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


def test_compare_prices_one_step_of_a_one_step_off_plan() -> None:
    # The one-step-off estimate unrolls several steps; a run records one step per line.
    # Oracle: the same plan simulated synchronously costs every call the same, so its
    # per-phase times are one step's worth, and a run measuring exactly those scores 0 %.
    plan = load_plan(PLANS / "grpo-tiny-cpu2-async.toml")
    # (the one-step-off pipeline alone: the controller's launches and gets left out)
    cms = {"*": without_host_waits(cost_models_for(plan, "cpu")["*"])}
    est = simulate(plan, cms)
    # Three warm-up steps, then a window of two (fixed lengths: generation does not vary).
    assert est.steady_step == 4 and est.window == 2
    sync_plan = dataclasses.replace(
        plan, workload=dataclasses.replace(plan.workload, max_staleness=0)
    )
    sync = simulate(sync_plan, cms)
    assert sync.steady_step == 0
    one_step = {k: v for k, v in sync.phase_totals_s().items() if v > 0}
    assert est.phase_totals_s() == pytest.approx(sync.phase_totals_s())
    table = compare(est, _records(1.0, one_step, est.iteration_s))
    assert table.phases and all(p.rel_error == pytest.approx(0.0) for p in table.phases)
    # Summing the five unrolled steps (the old bug) would have been 5x the measured.
    every_step = sum(p.duration_s for p in est.phases if p.name is Phase.GENERATE)
    assert every_step == pytest.approx(5 * one_step["generate"])
