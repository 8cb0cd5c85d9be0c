"""The report of a run directory: training curves, measured phase times, and fidelity.

Reads what the executor and `placeflow validate` wrote (manifest.json,
metrics.jsonl, and fidelity.json when present); computes nothing beyond
selecting and drawing. `placeflow report RUN_DIR` calls `run_report`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from placeflow.errors import SpecError
from placeflow.reports.colours import phase_colour
from placeflow.reports.html import Page, Table, write_page

_CURVES = (
    ("reward_mean", "mean reward"),
    ("exact_match", "exact answers"),
    ("kl_ref", "KL to reference"),
    ("entropy", "entropy"),
    ("pg_loss", "policy loss"),
    ("value_loss", "value loss"),
)


def load_run(run_dir: str | Path) -> tuple[dict[str, Any], list[dict[str, Any]], dict | None]:
    """(manifest, metrics lines, fidelity or None) of a run directory."""
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
        fidelity_path = d / "fidelity.json"
        fidelity = json.loads(fidelity_path.read_text()) if fidelity_path.is_file() else None
    except json.JSONDecodeError as exc:
        raise SpecError(f"{d}: malformed run file: {exc}") from None
    if not lines:
        raise SpecError(f"{d}: metrics.jsonl has no steps yet")
    return manifest, lines, fidelity


def curves_figure(lines: list[dict[str, Any]]) -> go.Figure:
    present = [(k, label) for k, label in _CURVES if any(k in m for m in lines)]
    fig = make_subplots(
        rows=len(present), cols=1, shared_xaxes=True, subplot_titles=[label for _, label in present]
    )
    for i, (key, label) in enumerate(present, start=1):
        steps = [m["step"] for m in lines if key in m]
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
        names += [n for n in m["phases"] if n not in names]
    fig = go.Figure()
    steps = [m["step"] for m in lines]
    for name in names:
        fig.add_trace(
            go.Bar(
                x=steps,
                y=[m["phases"].get(name, 0.0) for m in lines],
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
    rows = fidelity["phases"] + [{"phase": "step", **fidelity["step"]}]
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
    rows = fidelity["phases"] + [{"phase": "step", **fidelity["step"]}]
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


def run_report(run_dir: str | Path, path: str | Path | None = None) -> Path:
    """Write the run's report (default RUN_DIR/report.html) and return its path."""
    manifest, lines, fidelity = load_run(run_dir)
    last = lines[-1]
    header = {
        "plan": f"{manifest['plan']['name']} ({manifest['plan']['content_hash']})",
        "profile": str(manifest["profile"]["name"]),
        "seed": str(manifest["seed"]),
        "steps": f"{len(lines)} (last {last['step']})",
        "last reward": f"{last['reward_mean']:.3f}",
        "tokens/s (last step)": f"{last['tokens_per_s']:,.0f}",
        "versions": ", ".join(f"{k} {v}" for k, v in manifest["versions"].items()),
    }
    if manifest.get("rehearsal_of"):
        header["rehearsal"] = (
            f"of {manifest['rehearsal_of']} on CPU workers with tiny models: checks the "
            "layout's wiring; its times are not the GPU run's"
        )
    figures = [curves_figure(lines), phases_figure(lines)]
    tables = []
    if fidelity is not None:
        header["fidelity"] = (
            f"median |error| {fidelity['median_abs_error']:.0%}, worst "
            f"{fidelity['worst_phase']} {fidelity['worst_abs_error']:.0%}"
        )
        figures.append(fidelity_figure(fidelity))
        tables.append(fidelity_table(fidelity))
    samples = [s for m in lines[-1:] for s in m.get("samples", [])]
    if samples:
        tables.append(
            Table(
                title=f"Samples of step {last['step']}",
                columns=("prompt", "response", "reward"),
                rows=tuple(
                    (s["prompt"], repr(s["response"]), f"{s['reward']:.3f}") for s in samples
                ),
            )
        )
    page = Page(title=f"Run {Path(run_dir).name}", header=header, figures=figures, tables=tables)
    return write_page(page, path if path is not None else Path(run_dir) / "report.html")
