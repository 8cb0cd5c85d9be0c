"""Per-GPU memory of each device set, phase by phase, against its capacity.

Grouped bars: one group per device set, one bar per phase (plus "resident",
what stays on the GPU between phases), in GiB per GPU. The capacity of each
set is a horizontal line across its group, so a bar that crosses it is a phase
that does not fit.
"""

from __future__ import annotations

import plotly.graph_objects as go

from placeflow.phases import Phase
from placeflow.reports.colours import GIB, phase_colour
from placeflow.simulator.estimate import StepEstimate

_RESIDENT = "resident"


def _phase_order(estimate: StepEstimate) -> list[str]:
    """ "resident" first, then phases in enum (pipeline) order, unknown keys last."""
    names = {k for s in estimate.sets for k in s.memory_by_phase}
    known = [p.value for p in Phase if p.value in names]
    rest = sorted(names - set(known) - {_RESIDENT})
    return ([_RESIDENT] if _RESIDENT in names else []) + known + rest


def _capacity_shapes(fig: go.Figure, estimate: StepEstimate, labels: list[str]) -> None:
    # A category axis puts group i at x = i, so the line spans i - 0.45 .. i + 0.45.
    for i, s in enumerate(estimate.sets):
        cap_gib = s.capacity_bytes / GIB
        fig.add_shape(
            type="line",
            xref="x",
            yref="y",
            x0=i - 0.45,
            x1=i + 0.45,
            y0=cap_gib,
            y1=cap_gib,
            line={"color": "black", "width": 2, "dash": "dash"},
        )
        fig.add_annotation(
            x=labels[i],
            y=cap_gib,
            text=f"capacity {cap_gib:.0f} GiB",
            showarrow=False,
            yshift=10,
        )


def memory_figure(estimate: StepEstimate) -> go.Figure:
    """Grouped bars of per-GPU memory (GiB) by phase for every device set."""
    label_of = {s.index: f"{s.label} ({s.num_devices}x {s.pool})" for s in estimate.sets}
    labels = [label_of[s.index] for s in estimate.sets]
    fig = go.Figure()
    for name in _phase_order(estimate):
        sets = [s for s in estimate.sets if name in s.memory_by_phase]
        fig.add_trace(
            go.Bar(
                name=name,
                x=[label_of[s.index] for s in sets],
                y=[s.memory_by_phase[name] / GIB for s in sets],
                marker={"color": phase_colour(name)},
                customdata=[[s.capacity_bytes / GIB] for s in sets],
                hovertemplate=(
                    f"<b>{name}</b><br>%{{x}}<br>%{{y:.2f}} GiB per GPU"
                    " of %{customdata[0]:.0f} GiB<extra></extra>"
                ),
            )
        )
    _capacity_shapes(fig, estimate, labels)
    top = max(max(s.capacity_bytes, s.peak_memory_bytes) for s in estimate.sets) / GIB
    fig.update_layout(
        title=f"Memory per GPU by phase: {estimate.plan_name}",
        barmode="group",
        xaxis={"title": "device set", "categoryorder": "array", "categoryarray": labels},
        yaxis={"title": "GiB per GPU", "range": [0, top * 1.12]},
        legend={"title": "phase"},
        height=460,
        margin={"l": 10, "r": 10, "t": 60, "b": 40},
    )
    return fig
