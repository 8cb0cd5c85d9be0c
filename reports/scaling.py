"""Throughput against GPU count: how a workload scales with the cluster.

A pure figure builder over points the caller computed (typically one planner
run per cluster size); one line per label. The dashed line is linear scaling
from the smallest measured size, which the real lines fall below as
communication and bubbles grow.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import plotly.graph_objects as go


@dataclass(frozen=True, kw_only=True)
class ScalingPoint:
    """Throughput of one configuration at one cluster size."""

    num_gpus: int
    tokens_per_s: float
    label: str  # the series: a placement, a plan family or a cluster kind

    def __post_init__(self) -> None:
        if self.num_gpus < 1:
            raise ValueError(f"num_gpus must be >= 1, got {self.num_gpus}")


def as_points(points: Iterable[ScalingPoint | tuple[int, float, str]]) -> list[ScalingPoint]:
    """Accept (num_gpus, tokens_per_s, label) tuples as well as ScalingPoint."""
    return [
        p
        if isinstance(p, ScalingPoint)
        else ScalingPoint(num_gpus=p[0], tokens_per_s=p[1], label=p[2])
        for p in points
    ]


def scaling_figure(points: Iterable[ScalingPoint | tuple[int, float, str]]) -> go.Figure:
    """Tokens/s against number of GPUs, one line per label, with a linear reference."""
    pts = as_points(points)
    if not pts:
        raise ValueError("scaling_figure needs at least one (num_gpus, tokens_per_s, label) point")
    fig = go.Figure()
    series: dict[str, list[ScalingPoint]] = {}
    for p in pts:
        series.setdefault(p.label, []).append(p)
    for label, members in series.items():
        members.sort(key=lambda p: p.num_gpus)
        fig.add_trace(
            go.Scatter(
                mode="lines+markers",
                name=label,
                x=[p.num_gpus for p in members],
                y=[p.tokens_per_s for p in members],
                customdata=[[p.tokens_per_s / p.num_gpus] for p in members],
                hovertemplate=f"<b>{label}</b><br>%{{x}} GPUs: %{{y:,.0f}} tokens/s"
                "<br>%{customdata[0]:,.0f} tokens/s per GPU<extra></extra>",
            )
        )
    smallest = min(p.num_gpus for p in pts)
    base = max(p.tokens_per_s for p in pts if p.num_gpus == smallest)
    largest = max(p.num_gpus for p in pts)
    fig.add_trace(
        go.Scatter(
            mode="lines",
            name=f"linear from {smallest} GPUs",
            x=[smallest, largest],
            y=[base, base * largest / smallest],
            line={"dash": "dash", "color": "grey"},
            hoverinfo="skip",
        )
    )
    fig.update_layout(
        title="Throughput against GPU count",
        xaxis={"title": "GPUs", "type": "log", "dtick": 0.30102999566},  # a tick per doubling
        yaxis={"title": "tokens/s", "rangemode": "tozero"},
        height=480,
        margin={"l": 10, "r": 10, "t": 60, "b": 40},
    )
    return fig
