"""Gantt chart of one RL step: a row per device set, a bar per call.

One drawing function, `gantt_figure`, serves the simulated step (`placeflow
simulate --report`, the plan page) and the measured one (`placeflow report`,
`placeflow validate`): both are turned into `Bar`s first. With several panels
(measured above simulated) the panels share the rows and the colours, so the
two steps compare at a glance; each keeps its own time axis, so that the order
and overlap of calls compare even where the durations differ tenfold (as a CPU
rehearsal's do), and the panel titles give the step times.

x is seconds from the start of the step (numbers, not dates: px.timeline would
force a date axis), drawn as horizontal bars with `base=` the start time.
Bars are coloured by their first role (`ColourBy.ROLE`) or by phase
(`ColourBy.PHASE`); the hover lists all roles. Calls of zero duration (the
simulator's advantage step) would be invisible bars, so they are drawn as
markers instead.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from placeflow.phases import Phase
from placeflow.reports.colours import CONTROLLER_COLOUR, ROLE_COLOURS, phase_colour
from placeflow.simulator.estimate import StepEstimate
from placeflow.workload import Role

CONTROLLER_ROW = "controller"
_HOVER = (
    "<b>%{customdata[0]}</b><br>roles: %{customdata[1]}<br>set: %{y}<br>"
    "start %{customdata[2]:.3f} s, end %{customdata[3]:.3f} s<br>"
    "duration %{customdata[4]:.3f} s (step %{customdata[5]})<extra></extra>"
)


class ColourBy(StrEnum):
    ROLE = "role"  # which model is busy (simulate and plan pages)
    PHASE = "phase"  # which call it is (a run's measured step beside its estimate)


@dataclass(frozen=True, kw_only=True)
class Bar:
    """One call on the Gantt: its row (a device set's label), phase, roles and times."""

    row: str
    phase: str
    roles: tuple[str, ...]  # empty for controller-side work
    start_s: float
    end_s: float
    step: int

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s


def set_rows(estimate: StepEstimate) -> dict[int, str]:
    """Row label per device-set index, with -1 for the controller."""
    rows = {s.index: f"{s.label} ({s.num_devices}x {s.pool})" for s in estimate.sets}
    rows[-1] = CONTROLLER_ROW
    return rows


def estimate_bars(estimate: StepEstimate, rows: Mapping[int, str]) -> list[Bar]:
    """The simulated calls of `estimate` as bars; `rows` labels set indices (-1: controller)."""
    return [
        Bar(
            row=rows[p.device_set],
            phase=p.name.value,
            roles=tuple(r.value for r in p.roles),
            start_s=p.start_s,
            end_s=p.end_s,
            step=p.step,
        )
        for p in estimate.phases
    ]


def _key(bar: Bar, colour_by: ColourBy) -> str:
    if colour_by is ColourBy.PHASE:
        return bar.phase
    return bar.roles[0] if bar.roles else CONTROLLER_ROW


def _colour(key: str, colour_by: ColourBy) -> str:
    if colour_by is ColourBy.PHASE:
        return phase_colour(key)
    return {r.value: c for r, c in ROLE_COLOURS.items()}.get(key, CONTROLLER_COLOUR)


def _legend_rank(key: str, colour_by: ColourBy) -> int:
    """Legend in role order (actor first, controller last) or in the Phase enum's order."""
    order = [p.value for p in Phase] if colour_by is ColourBy.PHASE else [r.value for r in Role]
    return order.index(key) if key in order else len(order)


def _customdata(bars: Sequence[Bar]) -> list[list[object]]:
    return [
        [b.phase, "+".join(b.roles) or CONTROLLER_ROW, b.start_s, b.end_s, b.duration_s, b.step]
        for b in bars
    ]


def _traces(key: str, colour: str, group: list[Bar]) -> list[go.BaseTraceType]:
    long = [b for b in group if b.duration_s > 0]
    points = [b for b in group if b.duration_s <= 0]
    traces: list[go.BaseTraceType] = []
    if long:
        traces.append(
            go.Bar(
                orientation="h",
                name=key,
                legendgroup=key,
                y=[b.row for b in long],
                x=[b.duration_s for b in long],
                base=[b.start_s for b in long],
                text=[b.phase for b in long],
                textposition="inside",
                textangle=0,  # shrink to fit rather than turn sideways
                insidetextanchor="middle",
                marker={"color": colour, "line": {"color": "white", "width": 1}},
                customdata=_customdata(long),
                hovertemplate=_HOVER,
            )
        )
    if points:
        traces.append(
            go.Scatter(
                mode="markers+text",
                name=key,
                legendgroup=key,
                showlegend=not long,
                y=[b.row for b in points],
                x=[b.start_s for b in points],
                text=[b.phase for b in points],
                textposition="top center",
                marker={"color": colour, "symbol": "diamond", "size": 11},
                customdata=_customdata(points),
                hovertemplate=_HOVER,
            )
        )
    return traces


def gantt_figure(
    panels: Mapping[str, Sequence[Bar]], rows: Sequence[str], *, colour_by: ColourBy, title: str
) -> go.Figure:
    """One Gantt panel per entry of `panels` (panel title -> bars), stacked, each on its time axis.

    Every panel shows the same rows, in the order of `rows`, less those no panel uses.
    A key (role or phase) keeps one colour and one legend entry across the panels.
    """
    used = [r for r in rows if any(b.row == r for bars in panels.values() for b in bars)]
    titles = list(panels) if len(panels) > 1 else None
    fig = make_subplots(rows=len(panels), cols=1, subplot_titles=titles, vertical_spacing=0.12)
    in_legend: set[str] = set()
    for i, bars in enumerate(panels.values(), start=1):
        groups: dict[str, list[Bar]] = {}
        for b in bars:
            groups.setdefault(_key(b, colour_by), []).append(b)
        for key in sorted(groups, key=lambda k: _legend_rank(k, colour_by)):
            for trace in _traces(key, _colour(key, colour_by), groups[key]):
                if key in in_legend:
                    trace.showlegend = False
                fig.add_trace(trace, row=i, col=1)
            in_legend.add(key)
        fig.update_yaxes(
            categoryorder="array", categoryarray=used, autorange="reversed", row=i, col=1
        )
    fig.update_xaxes(rangemode="tozero", title_text="time in the step (s)")
    fig.update_layout(
        title=title,
        barmode="overlay",
        legend={"title": colour_by.value},
        height=160 + 70 * len(used) * len(panels),
        margin={"l": 10, "r": 10, "t": 60, "b": 40},
    )
    return fig


def timeline_figure(estimate: StepEstimate, colour_by: ColourBy = ColourBy.ROLE) -> go.Figure:
    """Gantt of `estimate.phases`: y = device set, x = seconds, colour = role (or phase)."""
    rows = set_rows(estimate)
    order = [rows[i] for i in sorted(rows, key=lambda i: (i < 0, i))]
    title = f"Timeline of one step: {estimate.plan_name} ({estimate.iteration_s:.3g} s)"
    bars = estimate_bars(estimate, rows)
    return gantt_figure({title: bars}, order, colour_by=colour_by, title=title)
