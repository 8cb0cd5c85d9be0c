"""Gantt chart of one RL step: a row per device set, a bar per phase.

x is seconds from the start of the step (numbers, not dates: px.timeline would
force a date axis), drawn as horizontal bars with `base=` the start time.
Bars are coloured by the phase's first role; the hover lists all of them.
Phases of zero duration (the controller's advantage step) would be invisible
bars, so they are drawn as markers instead.
"""

from __future__ import annotations

from collections.abc import Sequence

import plotly.graph_objects as go

from placeflow.reports.colours import CONTROLLER_COLOUR, ROLE_COLOURS
from placeflow.simulator.estimate import PhaseInterval, StepEstimate

CONTROLLER_ROW = "controller"
_HOVER = (
    "<b>%{customdata[0]}</b><br>roles: %{customdata[1]}<br>set: %{y}<br>"
    "start %{customdata[2]:.3f} s, end %{customdata[3]:.3f} s<br>"
    "duration %{customdata[4]:.3f} s (step %{customdata[5]})<extra></extra>"
)


def set_rows(estimate: StepEstimate) -> dict[int, str]:
    """Row label per device-set index, with -1 for the controller."""
    rows = {s.index: f"{s.label} ({s.num_devices}x {s.pool})" for s in estimate.sets}
    rows[-1] = CONTROLLER_ROW
    return rows


def _group_key(p: PhaseInterval) -> str:
    return p.roles[0].value if p.roles else CONTROLLER_ROW


def _colour(key: str) -> str:
    by_name = {r.value: c for r, c in ROLE_COLOURS.items()}
    return by_name.get(key, CONTROLLER_COLOUR)


def _customdata(phases: Sequence[PhaseInterval]) -> list[list[object]]:
    return [
        [
            p.name.value,
            "+".join(r.value for r in p.roles) or "controller",
            p.start_s,
            p.end_s,
            p.duration_s,
            p.step,
        ]
        for p in phases
    ]


def _traces(key: str, phases: list[PhaseInterval], rows: dict[int, str]) -> list[go.BaseTraceType]:
    colour = _colour(key)
    bars = [p for p in phases if p.duration_s > 0]
    points = [p for p in phases if p.duration_s <= 0]
    traces: list[go.BaseTraceType] = []
    if bars:
        traces.append(
            go.Bar(
                orientation="h",
                name=key,
                legendgroup=key,
                y=[rows[p.device_set] for p in bars],
                x=[p.duration_s for p in bars],
                base=[p.start_s for p in bars],
                text=[p.name.value for p in bars],
                textposition="inside",
                textangle=0,  # shrink to fit rather than turn sideways
                insidetextanchor="middle",
                marker={"color": colour, "line": {"color": "white", "width": 1}},
                customdata=_customdata(bars),
                hovertemplate=_HOVER,
            )
        )
    if points:
        traces.append(
            go.Scatter(
                mode="markers+text",
                name=key,
                legendgroup=key,
                showlegend=not bars,
                y=[rows[p.device_set] for p in points],
                x=[p.start_s for p in points],
                text=[p.name.value for p in points],
                textposition="top center",
                marker={"color": colour, "symbol": "diamond", "size": 11},
                customdata=_customdata(points),
                hovertemplate=_HOVER,
            )
        )
    return traces


def timeline_figure(estimate: StepEstimate) -> go.Figure:
    """Gantt of `estimate.phases`: y = device set, x = seconds, colour = role."""
    rows = set_rows(estimate)
    groups: dict[str, list[PhaseInterval]] = {}
    for p in estimate.phases:
        groups.setdefault(_group_key(p), []).append(p)
    # Legend in role order (actor first), the controller last.
    order = [r.value for r in ROLE_COLOURS] + [CONTROLLER_ROW]
    fig = go.Figure()
    for key in sorted(groups, key=order.index):
        fig.add_traces(_traces(key, groups[key], rows))
    used = [rows[i] for i in sorted(rows, key=lambda i: (i < 0, i))]
    used = [r for r in used if any(rows[p.device_set] == r for p in estimate.phases)]
    fig.update_layout(
        title=f"Timeline of one step: {estimate.plan_name} ({estimate.iteration_s:.3g} s)",
        barmode="overlay",
        xaxis={"title": "time in the step (s)", "rangemode": "tozero"},
        yaxis={"categoryorder": "array", "categoryarray": used, "autorange": "reversed"},
        legend={"title": "role"},
        height=160 + 70 * len(used),
        margin={"l": 10, "r": 10, "t": 60, "b": 40},
    )
    return fig
