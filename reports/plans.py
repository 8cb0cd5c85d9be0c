"""Placements compared: the best plan of each placement the planner tried.

Reads `PlannerResult.per_placement`; nothing is re-simulated. Placements with
no plan (the solver proved them infeasible or ran out of time) have no numbers
to plot, so they are listed in a table with the solver's reason. A plan whose
simulation is infeasible is still plotted, hatched, with its reason in the hover.
"""

from __future__ import annotations

import math

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from placeflow.planner.search import PlacementResult, PlannerResult, RankedPlan
from placeflow.reports.colours import GIB, KIND_COLOURS


def _planned(result: PlannerResult) -> list[tuple[str, RankedPlan]]:
    """(placement label, best plan) sorted by tokens/s, fastest first."""
    rows = [(r.placement.label(), r.best) for r in result.per_placement if r.best is not None]
    return sorted(rows, key=lambda row: -_finite(row[1].estimate.tokens_per_s))


def _finite(x: float) -> float:
    return x if math.isfinite(x) else 0.0


def _hover(label: str, best: RankedPlan) -> str:
    e = best.estimate
    status = "feasible" if e.feasible else f"INFEASIBLE: {e.infeasible_reason}"
    price = "" if best.price_per_mtoken is None else f"<br>${best.price_per_mtoken:.3f}/Mtoken"
    return (
        f"<b>{label}</b> ({best.kind.value})<br>{best.plan.num_gpus} GPUs, plan {e.plan_hash}"
        f"<br>{e.iteration_s:.2f} s/step, {e.tokens_per_s:,.0f} tokens/s{price}<br>{status}"
    )


def comparison_figure(result: PlannerResult) -> go.Figure:
    """Tokens/s and iteration time of each placement's best plan, coloured by kind."""
    rows = _planned(result)
    fig = make_subplots(
        rows=1, cols=2, shared_yaxes=True, subplot_titles=("tokens/s", "iteration time (s)")
    )
    seen: set[str] = set()
    for label, best in rows:
        kind = best.kind.value
        common = {
            "orientation": "h",
            "y": [label],
            "name": kind,
            "legendgroup": kind,
            "hovertext": [_hover(label, best)],
            "hoverinfo": "text",
            "marker": {
                "color": KIND_COLOURS[best.kind],
                "pattern": {"shape": "" if best.estimate.feasible else "/"},
            },
        }
        fig.add_trace(
            go.Bar(x=[_finite(best.estimate.tokens_per_s)], showlegend=kind not in seen, **common),
            row=1,
            col=1,
        )
        fig.add_trace(
            go.Bar(x=[_finite(best.estimate.iteration_s)], showlegend=False, **common), row=1, col=2
        )
        seen.add(kind)
    labels = [label for label, _ in rows]
    fig.update_yaxes(categoryorder="array", categoryarray=labels, autorange="reversed")
    fig.update_layout(
        title=f"Best plan of each placement ({result.objective.value} objective)",
        barmode="overlay",
        legend={"title": "placement kind"},
        height=160 + 32 * max(1, len(rows)),
        margin={"l": 10, "r": 10, "t": 80, "b": 40},
    )
    return fig


def peak_memory_figure(result: PlannerResult) -> go.Figure:
    """Peak per-GPU memory of each placement's best plan, against its tightest set's capacity."""
    rows = _planned(result)
    fig = go.Figure()
    labels, peaks, caps, colours = [], [], [], []
    for label, best in rows:
        # The set nearest its limit says most about headroom; sets may differ in capacity.
        tight = max(best.estimate.sets, key=lambda s: s.peak_memory_bytes / s.capacity_bytes)
        labels.append(label)
        peaks.append(tight.peak_memory_bytes / GIB)
        caps.append(tight.capacity_bytes / GIB)
        colours.append(KIND_COLOURS[best.kind])
    fig.add_trace(
        go.Bar(
            orientation="h",
            name="peak",
            showlegend=False,  # coloured by placement kind, as in the comparison above
            y=labels,
            x=peaks,
            marker={"color": colours},
            customdata=list(zip(caps, strict=True)),
            hovertemplate="<b>%{y}</b><br>peak %{x:.2f} GiB of %{customdata[0]:.0f} GiB"
            "<extra></extra>",
        )
    )
    fig.add_trace(
        go.Scatter(
            mode="markers",
            name="capacity",
            y=labels,
            x=caps,
            marker={"symbol": "line-ns-open", "size": 22, "color": "black", "line": {"width": 3}},
            hovertemplate="<b>%{y}</b><br>capacity %{x:.0f} GiB<extra></extra>",
        )
    )
    fig.update_layout(
        title="Peak memory per GPU of each placement's best plan (tightest device set)",
        xaxis={"title": "GiB per GPU", "rangemode": "tozero"},
        yaxis={"categoryorder": "array", "categoryarray": labels, "autorange": "reversed"},
        height=160 + 32 * max(1, len(rows)),
        margin={"l": 10, "r": 10, "t": 60, "b": 40},
    )
    return fig


def unplanned(result: PlannerResult) -> list[PlacementResult]:
    """Placements for which the solver returned no plan (each with its reason)."""
    return [r for r in result.per_placement if r.best is None]
