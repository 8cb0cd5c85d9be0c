"""The report of a run directory: training curves, measured phase times, a measured step's
timeline, and fidelity.

Reads what the executor and `placeflow validate` wrote (manifest.json,
metrics.jsonl, plan.toml, and validation.jsonl, fidelity.json and
estimate.json when present);
computes nothing beyond selecting and drawing. Metrics lines are read by their
declared names (`placeflow.metrics`); the keys of fidelity.json, estimate.json
and the timeline and sample records are those files' own field names, read as
strings, so that runs written by older versions still read. `placeflow report RUN_DIR` calls
`run_report`.

The measured timeline is one representative step: of the steps after the
first (which pays one-time costs), the one of median wall time. After
`placeflow validate` the simulated step is drawn under it, on the same rows
(the plan's set labels) and in the same phase colours. Runs whose metrics
lines have no `timeline` (before the executor recorded one) get no timeline
figure, and the header says so.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from placeflow.errors import SpecError
from placeflow.metrics import Metric, RecordKey
from placeflow.plan import load_plan
from placeflow.reports.colours import phase_colour
from placeflow.reports.html import Page, Table, write_page
from placeflow.reports.timeline import CONTROLLER_ROW, Bar, ColourBy, gantt_figure
from placeflow.simulator.fidelity import STEP_ROW, call_overlap, overlap_text, timeline_wall_s

_CURVES = (
    (Metric.REWARD_MEAN, "mean reward"),
    (Metric.EXACT_MATCH, "exact answers"),
    (Metric.KL_REF, "KL to reference"),
    (Metric.ENTROPY, "entropy"),
    (Metric.PG_LOSS, "policy loss"),
    (Metric.VALUE_LOSS, "value loss"),
)


@dataclass(frozen=True, kw_only=True)
class RunFiles:
    """What a run directory holds, as read from its files."""

    manifest: dict[str, Any]
    lines: list[dict[str, Any]]  # metrics.jsonl, one per step
    validation: list[dict[str, Any]]  # validation.jsonl, one per evaluation (may be empty)
    set_labels: tuple[str, ...]  # plan.toml's device sets, in plan order (`DeviceSet.label`)
    fidelity: dict[str, Any] | None  # fidelity.json, written by `placeflow validate`
    estimate: dict[str, Any] | None  # estimate.json (`StepEstimate.to_json`), likewise


def _json_or_none(path: Path) -> Any:
    return json.loads(path.read_text()) if path.is_file() else None


def load_run(run_dir: str | Path) -> RunFiles:
    """The files of a run directory; SpecError if it is not one."""
    d = Path(run_dir)
    manifest_path, metrics_path = d / "manifest.json", d / "metrics.jsonl"
    if not manifest_path.is_file() or not metrics_path.is_file():
        raise SpecError(
            f"{d}: not a run directory (needs manifest.json and metrics.jsonl, "
            "as `placeflow run` and `placeflow validate` write)"
        )
    try:
        manifest = json.loads(manifest_path.read_text())
        lines = [json.loads(x) for x in metrics_path.read_text().splitlines() if x.strip()]
        val_path = d / "validation.jsonl"
        validation = (
            [json.loads(x) for x in val_path.read_text().splitlines() if x.strip()]
            if val_path.is_file()
            else []
        )
        fidelity = _json_or_none(d / "fidelity.json")
        estimate = _json_or_none(d / "estimate.json")
    except json.JSONDecodeError as exc:
        raise SpecError(f"{d}: malformed run file: {exc}") from None
    if not lines:
        raise SpecError(f"{d}: metrics.jsonl has no steps yet")
    plan_path = d / "plan.toml"
    labels = tuple(s.label() for s in load_plan(plan_path).sets) if plan_path.is_file() else ()
    return RunFiles(
        manifest=manifest,
        lines=lines,
        validation=validation,
        set_labels=labels,
        fidelity=fidelity,
        estimate=estimate,
    )


def validation_figure(validation: list[dict[str, Any]]) -> go.Figure:
    """The held-out split's scores (greedy responses) against the updates done."""
    steps = [v[RecordKey.STEP] for v in validation]
    fig = go.Figure(
        [
            go.Scatter(x=steps, y=[v[k] for v in validation], name=label, mode="lines+markers")
            for k, label in (
                (Metric.VAL_EXACT_MATCH, "exact answers"),
                (Metric.VAL_REWARD_MEAN, "reward"),
            )
        ]
    )
    fig.update_layout(
        title=f"Validation ({validation[0][Metric.VAL_NUM_PROMPTS]} held-out prompts, greedy)",
        xaxis_title="updates done",
        yaxis_range=[0, 1.05],
    )
    return fig


def curves_figure(lines: list[dict[str, Any]]) -> go.Figure:
    present = [(k, label) for k, label in _CURVES if any(k in m for m in lines)]
    fig = make_subplots(
        rows=len(present), cols=1, shared_xaxes=True, subplot_titles=[label for _, label in present]
    )
    for i, (key, label) in enumerate(present, start=1):
        steps = [m[RecordKey.STEP] for m in lines if key in m]
        fig.add_trace(
            go.Scatter(
                x=steps, y=[m[key] for m in lines if key in m], name=label, mode="lines+markers"
            ),
            row=i,
            col=1,
        )
    fig.update_layout(
        height=180 * len(present) + 80, showlegend=False, title="Training metrics per step"
    )
    fig.update_xaxes(title_text="step", row=len(present), col=1)
    return fig


def phases_figure(lines: list[dict[str, Any]]) -> go.Figure:
    names: list[str] = []
    for m in lines:
        names += [n for n in m[RecordKey.PHASES] if n not in names]
    fig = go.Figure()
    steps = [m[RecordKey.STEP] for m in lines]
    for name in names:
        fig.add_trace(
            go.Bar(
                x=steps,
                y=[m[RecordKey.PHASES].get(name, 0.0) for m in lines],
                name=name,
                marker_color=phase_colour(name),
            )
        )
    fig.update_layout(
        barmode="stack",
        title="Measured phase time per step",
        xaxis_title="step",
        yaxis_title="seconds",
    )
    return fig


def fidelity_figure(fidelity: dict[str, Any]) -> go.Figure:
    rows = fidelity["phases"] + [{"phase": STEP_ROW, **fidelity["step"]}]
    names = [r["phase"] for r in rows]
    fig = go.Figure(
        [
            go.Bar(name="measured", x=names, y=[r["measured_s"] for r in rows]),
            go.Bar(
                name=f"simulated ({fidelity['profile']})",
                x=names,
                y=[r["predicted_s"] for r in rows],
                text=[f"{r['rel_error']:+.0%}" for r in rows],
                textposition="outside",
            ),
        ]
    )
    fig.update_layout(
        barmode="group",
        yaxis_title="seconds",
        title=f"Measured vs simulated (median of {fidelity['steps']} steps)",
    )
    return fig


def fidelity_table(fidelity: dict[str, Any]) -> Table:
    rows = fidelity["phases"] + [{"phase": STEP_ROW, **fidelity["step"]}]
    return Table(
        title="Fidelity: measured vs simulated",
        columns=("phase", "measured s", "simulated s", "error"),
        rows=tuple(
            (
                r["phase"],
                f"{r['measured_s']:.4f}",
                f"{r['predicted_s']:.4f}",
                f"{r['rel_error']:+.1%}",
            )
            for r in rows
        ),
    )


def representative_step(lines: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The metrics line whose timeline is drawn; None if no line has a timeline.

    Of the steps after the first that have a timeline, the one of median wall
    time (the lower median, so a step that ran); the first step if only it has one.
    """
    timed = [m for m in lines[1:] if m.get(RecordKey.TIMELINE)]
    timed = timed or [m for m in lines[:1] if m.get(RecordKey.TIMELINE)]
    if not timed:
        return None
    ranked = sorted(
        timed, key=lambda m: (timeline_wall_s(m[RecordKey.TIMELINE]), m[RecordKey.STEP])
    )
    return ranked[(len(ranked) - 1) // 2]


def _row(device_set: int | None, labels: Sequence[str]) -> str:
    """Row of a call: its set's label; controller work has set None (measured) or -1 (simulated)."""
    if device_set is None or device_set < 0:
        return CONTROLLER_ROW
    return labels[device_set] if device_set < len(labels) else f"set {device_set}"


def measured_bars(line: dict[str, Any], labels: Sequence[str]) -> list[Bar]:
    """The calls of one metrics line's `timeline`, as Gantt bars."""
    return [
        Bar(
            row=_row(c["device_set"], labels),
            phase=c["name"],
            roles=(c["role"],) if c["role"] else (),
            start_s=float(c["start_s"]),
            end_s=float(c["end_s"]),
            step=int(line[RecordKey.STEP]),
        )
        for c in line[RecordKey.TIMELINE]
    ]


def simulated_bars(estimate: dict[str, Any], labels: Sequence[str]) -> list[Bar]:
    """The phases of estimate.json (`StepEstimate.to_json`), as Gantt bars."""
    return [
        Bar(
            row=_row(p["device_set"], labels),
            phase=p["name"],
            roles=tuple(p["roles"]),
            start_s=p["start_s"],
            end_s=p["end_s"],
            step=p["step"],
        )
        for p in estimate["phases"]
    ]


def step_timeline_figure(files: RunFiles, line: dict[str, Any]) -> go.Figure:
    """Gantt of a measured step coloured by phase, above the simulated step when there is one."""
    timeline = line[RecordKey.TIMELINE]
    wall_s, overlap = timeline_wall_s(timeline), call_overlap(timeline)
    title = (
        f"Measured timeline of step {line[RecordKey.STEP]} ({wall_s:.3g} s, overlap {overlap:.2f})"
    )
    panels = {"measured": measured_bars(line, files.set_labels)}
    if files.estimate is not None:
        simulated = f"simulated ({files.estimate['iteration_s']:.3g} s"
        if files.fidelity is not None and "simulated_overlap" in files.fidelity:
            simulated += f", overlap {files.fidelity['simulated_overlap']:.2f}"
        panels[simulated + ")"] = simulated_bars(files.estimate, files.set_labels)
        title += " and the simulated step"
    rows = [*files.set_labels, CONTROLLER_ROW]
    return gantt_figure(panels, rows, colour_by=ColourBy.PHASE, title=title)


def _header(files: RunFiles) -> dict[str, str]:
    manifest, last = files.manifest, files.lines[-1]
    header = {
        "plan": f"{manifest['plan']['name']} ({manifest['plan']['content_hash']})",
        "profile": str(manifest["profile"]["name"]),
        "seed": str(manifest["seed"]),
        "steps": f"{len(files.lines)} (last {last[RecordKey.STEP]})",
        "last reward": f"{last[Metric.REWARD_MEAN]:.3f}",
        "tokens/s (last step)": f"{last[Metric.TOKENS_PER_S]:,.0f}",
        "versions": ", ".join(f"{k} {v}" for k, v in manifest["versions"].items()),
    }
    if manifest.get("rehearsal_of"):
        header["rehearsal"] = (
            f"of {manifest['rehearsal_of']} on CPU workers with tiny models: checks the "
            "layout's wiring; its times are not the GPU run's"
        )
    fidelity = files.fidelity
    if fidelity is not None:
        header["fidelity"] = (
            f"median |error| {fidelity['median_abs_error']:.0%}, worst "
            f"{fidelity['worst_phase']} {fidelity['worst_abs_error']:.0%}"
        )
        if "simulated_overlap" in fidelity:  # fidelity.json of older runs has none
            header["fidelity"] += "; " + overlap_text(
                fidelity["measured_overlap"], fidelity["simulated_overlap"]
            )
    return header


def sample_prompt(prompt: str | list[dict[str, str]]) -> str:
    """A sample's prompt as text: chat messages (a dataset's chat prompts) as `role: content`."""
    if isinstance(prompt, str):
        return prompt
    return "\n".join(f"{m['role']}: {m['content']}" for m in prompt)


def run_report(run_dir: str | Path, path: str | Path | None = None) -> Path:
    """Write the run's report (default RUN_DIR/report.html) and return its path."""
    files = load_run(run_dir)
    header = _header(files)
    figures = [curves_figure(files.lines), phases_figure(files.lines)]
    if files.validation:
        first, last_val = files.validation[0], files.validation[-1]
        header["validation exact"] = (
            f"{first[Metric.VAL_EXACT_MATCH]:.3f} after {first[RecordKey.STEP]} steps -> "
            f"{last_val[Metric.VAL_EXACT_MATCH]:.3f} after {last_val[RecordKey.STEP]}"
        )
        figures.insert(0, validation_figure(files.validation))
    step = representative_step(files.lines)
    if step is None:
        header["timeline"] = (
            "none: the metrics lines have no `timeline` (recorded by executors since the "
            "concurrent controller)"
        )
    else:
        figures.append(step_timeline_figure(files, step))
    tables = []
    if files.fidelity is not None:
        figures.append(fidelity_figure(files.fidelity))
        tables.append(fidelity_table(files.fidelity))
    last = files.lines[-1]
    samples = last.get(RecordKey.SAMPLES, [])
    if samples:
        tables.append(
            Table(
                title=f"Samples of step {last[RecordKey.STEP]}",
                columns=("prompt", "response", "reward"),
                rows=tuple(
                    (sample_prompt(s["prompt"]), repr(s["response"]), f"{s['reward']:.3f}")
                    for s in samples
                ),
            )
        )
    page = Page(title=f"Run {Path(run_dir).name}", header=header, figures=figures, tables=tables)
    return write_page(page, path if path is not None else Path(run_dir) / "report.html")
