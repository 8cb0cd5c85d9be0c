"""placeflow.reports: pages built from real simulator and planner results.

The estimate is the shipped tiny GRPO plan simulated with its own cost model;
the planner result is a real search on the 4-worker CPU cluster (about a
second). The Chromium test renders a page headless with networking off, which
is what proves the page works offline; it skips where Chromium is absent.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import plotly.graph_objects as go
import pytest
from plotly.offline import get_plotlyjs

from placeflow.cluster import load_cluster
from placeflow.plan import load_plan, save_plan
from placeflow.planner import plan_search
from placeflow.planner.search import PlannerResult
from placeflow.profiles.registry import fitted_cost_model
from placeflow.reports import ScalingPoint, plan_report, scaling_report, simulate_report
from placeflow.reports.colours import CONTROLLER_COLOUR, GIB, ROLE_COLOURS, phase_colour
from placeflow.reports.memory import memory_figure
from placeflow.reports.run import load_run, representative_step, run_report, step_timeline_figure
from placeflow.reports.timeline import timeline_figure
from placeflow.simulator import StepEstimate, simulate
from placeflow.simulator.simulate import cost_models_for
from placeflow.workload import Role, load_workload

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
# HTML elements with no end tag; every other start tag must be closed.
VOID = {"meta", "br", "hr", "img", "input", "link", "area", "base", "col", "source", "wbr"}


@pytest.fixture(scope="module")
def estimate() -> StepEstimate:
    plan = load_plan(EXAMPLES / "plans" / "grpo-tiny-cpu4-colocate.toml")
    return simulate(plan, cost_models_for(plan))


@pytest.fixture(scope="module")
def estimate_split() -> StepEstimate:
    plan = load_plan(EXAMPLES / "plans" / "grpo-tiny-cpu4-split.toml")
    return simulate(plan, cost_models_for(plan))


@pytest.fixture(scope="module")
def planner_result() -> PlannerResult:
    cluster = load_cluster(EXAMPLES / "clusters" / "cpu4.toml")
    workload = load_workload(EXAMPLES / "workloads" / "grpo-tiny-cpu.toml")
    costs = {p.profile: fitted_cost_model(p.profile) for p in cluster.pools}
    return plan_search(cluster, workload, costs, time_limit_s=10)


class _TagChecker(HTMLParser):
    """Parses a page and records unbalanced tags (script bodies are CDATA to HTMLParser)."""

    def __init__(self) -> None:
        super().__init__()
        self.stack: list[str] = []
        self.errors: list[str] = []
        self.seen: set[str] = set()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.seen.add(tag)
        if tag not in VOID:
            self.stack.append(tag)

    def handle_endtag(self, tag: str) -> None:
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes {self.stack[-1:] or 'nothing'}")
            return
        self.stack.pop()


def assert_offline_html(text: str) -> None:
    checker = _TagChecker()
    checker.feed(text)
    checker.close()
    assert not checker.errors and not checker.stack, (checker.errors, checker.stack)
    assert {"html", "head", "title", "body", "script"} <= checker.seen
    # The library itself is inlined, and nothing is fetched from elsewhere.
    assert get_plotlyjs()[-2000:] in text
    assert "<script src=" not in text
    assert text.count(get_plotlyjs()[-2000:]) == 1, "plotly.js must be inlined once per page"


def test_simulate_report_is_self_contained(estimate: StepEstimate, tmp_path: Path) -> None:
    path = simulate_report(estimate, tmp_path / "sub" / "sim.html")
    assert path.exists()
    text = path.read_text(encoding="utf-8")
    assert_offline_html(text)
    assert estimate.plan_name in text
    assert estimate.plan_hash in text
    for p in estimate.phases:
        assert p.name.value in text


def test_infeasible_estimate_is_flagged(estimate: StepEstimate, tmp_path: Path) -> None:
    bad = dataclasses.replace(
        estimate, feasible=False, infeasible_reasons=("actor OOM in generate",)
    )
    text = simulate_report(bad, tmp_path / "bad.html").read_text(encoding="utf-8")
    assert 'class="bad">Infeasible: actor OOM in generate' in text


def test_timeline_bars_match_phases(estimate: StepEstimate) -> None:
    fig = timeline_figure(estimate)
    bars = [t for t in fig.data if t.type == "bar"]
    drawn = sorted((n, b) for t in bars for n, b in zip(t.text, t.base, strict=True))
    expected = sorted((p.name.value, p.start_s) for p in estimate.phases if p.duration_s > 0)
    assert drawn == expected
    # Zero-length controller phases are markers, so they stay visible and hoverable.
    markers = [n for t in fig.data if t.type == "scatter" for n in t.text]
    assert markers == [p.name.value for p in estimate.phases if p.duration_s <= 0]


def test_timeline_colours_by_role(estimate: StepEstimate) -> None:
    colours = {t.name: t.marker.color for t in timeline_figure(estimate).data}
    assert colours[Role.ACTOR.value] == ROLE_COLOURS[Role.ACTOR]
    assert colours[Role.REF.value] == ROLE_COLOURS[Role.REF]
    assert colours["controller"] == CONTROLLER_COLOUR


def test_memory_capacity_line_per_set(estimate: StepEstimate) -> None:
    fig = memory_figure(estimate)
    lines = [s for s in fig.layout.shapes if s.type == "line"]
    assert [s.y0 for s in lines] == [s.capacity_bytes / GIB for s in estimate.sets]
    heights = {t.name: t.y[0] for t in fig.data}
    for name, size_bytes in estimate.sets[0].memory_by_phase.items():
        assert heights[name] == pytest.approx(size_bytes / GIB)


def test_plan_report(planner_result: PlannerResult, tmp_path: Path) -> None:
    text = plan_report(planner_result, tmp_path / "plan.html").read_text(encoding="utf-8")
    assert_offline_html(text)
    assert planner_result.best.plan.name in text
    for r in planner_result.per_placement:
        assert r.placement.label() in text
    for p in planner_result.best.estimate.phases:
        assert p.name.value in text


def test_scaling_report_accepts_tuples(tmp_path: Path) -> None:
    points = [(8, 10_000.0, "colocate"), (16, 18_000.0, "colocate"), (16, 15_000.0, "split")]
    text = scaling_report(points, tmp_path / "scale.html").read_text(encoding="utf-8")
    assert_offline_html(text)
    assert "colocate" in text and "split" in text
    with pytest.raises(ValueError, match="num_gpus"):
        ScalingPoint(num_gpus=0, tokens_per_s=1.0, label="x")


def _chromium() -> str | None:
    if Path("/usr/bin/chromium").exists():
        return "/usr/bin/chromium"
    return shutil.which("chromium")


def test_page_renders_in_headless_chromium(estimate: StepEstimate, tmp_path: Path) -> None:
    browser = _chromium()
    if browser is None:
        pytest.skip("Chromium is not installed")
    page = simulate_report(estimate, tmp_path / "sim.html")
    # Every figure <div> (the timeline and the memory chart) holds a rendered plotly SVG.
    figures = _rendered_figures(browser, page, tmp_path)
    assert len(figures) == 2
    assert all('class="main-svg"' in f for f in figures)


def _rendered_figures(browser: str, page: Path, tmp_path: Path) -> list[str]:
    """The DOM of each figure <div> after headless Chromium ran the page without errors."""
    # Networking features are off so a page that needs the network fails here.
    cmd = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic"]
    cmd += ["--no-first-run", "--disable-background-networking", "--disable-component-update"]
    cmd += ["--disable-sync", f"--user-data-dir={tmp_path / 'profile'}", "--enable-logging=stderr"]
    cmd += ["--v=0", "--virtual-time-budget=5000", "--dump-dom", page.as_uri()]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Uncaught" not in done.stderr and "ERROR:CONSOLE" not in done.stderr, done.stderr
    return done.stdout.split('id="figure-')[1:]


def _fake_run_dir(path: Path) -> Path:
    """A run directory as `placeflow validate` writes it, with made-up numbers."""
    path.mkdir(parents=True)
    manifest = {
        "plan": {"name": "p", "content_hash": "abc"},
        "profile": {"name": "cpu", "sha256": "x"},
        "seed": 0,
        "versions": {"torch": "2.13.0"},
    }
    (path / "manifest.json").write_text(json.dumps(manifest))
    lines = [
        {
            "step": i,
            "reward_mean": 0.1 * i,
            "exact_match": 0.0,
            "entropy": 5.0 - i,
            "pg_loss": 0.01,
            "tokens_per_s": 1000.0,
            "phases": {"generate": 0.02, "actor_update": 0.05},
            "samples": [{"prompt": "1+2=", "response": "3\n", "reward": 1.0}],
        }
        for i in range(3)
    ]
    (path / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    fidelity = {
        "profile": "cpu",
        "steps": 2,
        "phases": [
            {"phase": "generate", "measured_s": 0.02, "predicted_s": 0.01, "rel_error": -0.5}
        ],
        "step": {"measured_s": 0.07, "predicted_s": 0.05, "rel_error": -0.29},
        "median_abs_error": 0.5,
        "worst_phase": "generate",
        "worst_abs_error": 0.5,
    }
    (path / "fidelity.json").write_text(json.dumps(fidelity))
    return path


def test_run_report_renders_in_headless_chromium(tmp_path: Path) -> None:
    page = run_report(_fake_run_dir(tmp_path / "run"))
    text = page.read_text()
    assert "Measured vs simulated" in text and "Fidelity: measured vs simulated" in text
    browser = _chromium()
    if browser is None:
        pytest.skip("Chromium is not installed")
    figures = _rendered_figures(browser, page, tmp_path)
    assert len(figures) == 3 and all('class="main-svg"' in f for f in figures)


# One GRPO step on the split plan (set 0: actor, set 1: ref), by hand: the reference's
# forward and the controller's advantage overlap the actor's update.
#   (phase, device set, role, start s, end s)
HAND_TIMELINE = (
    ("generate", 0, "actor", 0.0, 0.4),
    ("reward", None, None, 0.4, 0.5),
    ("ref_logprob", 1, "ref", 0.5, 0.8),
    ("advantage", None, None, 0.5, 0.55),
    ("actor_update", 0, "actor", 0.55, 1.0),
)
HAND_OVERLAP = (0.4 + 0.1 + 0.3 + 0.05 + 0.45) / 1.0  # call seconds over the 1.0 s span
HAND_ROWS = {0: "actor", 1: "ref", None: "controller"}  # the split plan's set labels


def _timeline(scale: float) -> list[dict]:
    return [
        {"name": n, "device_set": s, "role": r, "start_s": a * scale, "end_s": b * scale}
        for n, s, r, a, b in HAND_TIMELINE
    ]


def _timed_run_dir(path: Path, scales: tuple[float, ...]) -> Path:
    """`_fake_run_dir` with the split plan's plan.toml, as the executor saves it, and
    a hand timeline per step scaled by `scales[step]`."""
    run_dir = _fake_run_dir(path)
    save_plan(load_plan(EXAMPLES / "plans" / "grpo-tiny-cpu4-split.toml"), run_dir / "plan.toml")
    line = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[0])
    lines = [{**line, "step": i, "timeline": _timeline(s)} for i, s in enumerate(scales)]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return run_dir


def _panel(fig: go.Figure, yaxis: str) -> list[tuple[str, str, float, float]]:
    """(phase, row, start s, duration s) of every bar drawn against `yaxis` ("y": panel 1)."""
    return sorted(
        (n, y, b, x)
        for t in fig.data
        if t.type == "bar" and t.yaxis == yaxis
        for n, y, b, x in zip(t.text, t.y, t.base, t.x, strict=True)
    )


def test_measured_timeline_of_the_median_step(tmp_path: Path) -> None:
    # Steps 1-3 span 1.0, 2.0 and 1.5 s: the median after the warm-up step is step 3.
    run_dir = _timed_run_dir(tmp_path / "run", scales=(3.0, 1.0, 2.0, 1.5))
    files = load_run(run_dir)
    assert files.set_labels == ("actor", "ref")
    step = representative_step(files.lines)
    assert step is not None and step["step"] == 3
    fig = step_timeline_figure(files, step)
    expected = sorted(
        (n, HAND_ROWS[s], a * 1.5, b * 1.5 - a * 1.5) for n, s, _, a, b in HAND_TIMELINE
    )
    assert _panel(fig, "y") == expected
    assert list(fig.layout.yaxis.categoryarray) == ["actor", "ref", "controller"]
    for t in fig.data:
        assert t.marker.color == phase_colour(t.name)  # coloured by phase
    assert f"overlap {HAND_OVERLAP:.2f}" in fig.layout.title.text
    text = run_report(run_dir).read_text()
    assert "Measured timeline of step 3" in text and text.count('id="figure-') == 4


def test_simulated_timeline_beside_the_measured(
    estimate_split: StepEstimate, tmp_path: Path
) -> None:
    run_dir = _timed_run_dir(tmp_path / "run", scales=(1.0, 1.0))
    (run_dir / "estimate.json").write_text(json.dumps(estimate_split.to_json()))
    files = load_run(run_dir)
    fig = step_timeline_figure(files, files.lines[-1])
    rows = {i: label for i, label in enumerate(files.set_labels)} | {-1: "controller"}
    expected = sorted(
        (p.name.value, rows[p.device_set], p.start_s, p.duration_s)
        for p in estimate_split.phases
        if p.duration_s > 0
    )
    assert _panel(fig, "y2") == expected
    assert list(fig.layout.yaxis2.categoryarray) == list(fig.layout.yaxis.categoryarray)
    # One colour per phase on both panels, and one legend entry for it.
    colours: dict[str, set[str]] = {}
    for t in fig.data:
        colours.setdefault(t.name, set()).add(t.marker.color)
    assert all(len(c) == 1 for c in colours.values())
    in_legend = [t.name for t in fig.data if t.showlegend is not False]
    assert sorted(in_legend) == sorted(set(in_legend))
    assert len([t for t in fig.data if t.yaxis == "y2"]) > 0


def test_run_without_timeline_says_so(tmp_path: Path) -> None:
    run_dir = _fake_run_dir(tmp_path / "run")
    assert representative_step(load_run(run_dir).lines) is None
    text = run_report(run_dir).read_text()
    assert "the metrics lines have no `timeline`" in text
    assert text.count('id="figure-') == 3  # curves, phases, fidelity: no Gantt
