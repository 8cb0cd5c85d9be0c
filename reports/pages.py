"""The three reports: one simulated step, one planner run, one scaling sweep.

Each reads results computed elsewhere (simulator, planner) and writes one HTML
page; none of them simulates or solves anything.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from placeflow.planner.search import PlannerResult
from placeflow.reports.colours import GIB
from placeflow.reports.html import Page, Table, estimate_header, write_page
from placeflow.reports.memory import memory_figure
from placeflow.reports.plans import comparison_figure, peak_memory_figure, unplanned
from placeflow.reports.scaling import ScalingPoint, as_points, scaling_figure
from placeflow.reports.timeline import set_rows, timeline_figure
from placeflow.simulator.estimate import StepEstimate


def sets_table(estimate: StepEstimate) -> Table:
    return Table(
        title="Device sets",
        columns=("set", "pool", "GPUs", "resident GiB", "peak GiB", "capacity GiB", "busy s")
        + ("utilisation", "bubble"),
        rows=tuple(
            (
                s.label,
                s.pool,
                str(s.num_devices),
                f"{s.resident_bytes / GIB:.2f}",
                f"{s.peak_memory_bytes / GIB:.2f}",
                f"{s.capacity_bytes / GIB:.0f}",
                f"{s.busy_s:.3f}",
                f"{s.utilisation:.0%}",
                f"{s.bubble_fraction:.0%}",
            )
            for s in estimate.sets
        ),
    )


def phases_table(estimate: StepEstimate) -> Table:
    rows = set_rows(estimate)
    return Table(
        title="Phases",
        columns=("phase", "roles", "device set", "step", "start s", "end s", "duration s"),
        rows=tuple(
            (
                p.name.value,
                "+".join(r.value for r in p.roles) or "controller",
                rows[p.device_set],
                str(p.step),
                f"{p.start_s:.3f}",
                f"{p.end_s:.3f}",
                f"{p.duration_s:.3f}",
            )
            for p in estimate.phases
        ),
    )


def _warning(estimate: StepEstimate) -> str | None:
    return None if estimate.feasible else f"Infeasible: {estimate.infeasible_reason}"


def simulate_report(estimate: StepEstimate, path: str | Path) -> Path:
    """Timeline and memory of one simulated step, written to `path`."""
    page = Page(
        title=f"placeflow simulate: {estimate.plan_name}",
        header=estimate_header(estimate),
        figures=(timeline_figure(estimate), memory_figure(estimate)),
        tables=(sets_table(estimate), phases_table(estimate)),
        warning=_warning(estimate),
    )
    return write_page(page, path)


def _placements_table(result: PlannerResult) -> Table:
    rows = []
    for r in result.per_placement:
        if r.best is None:
            rows.append(
                (r.placement.label(), r.placement.kind.value, "-", "-", "-", r.reason or "")
            )
            continue
        e = r.best.estimate
        status = "feasible" if e.feasible else f"infeasible: {e.infeasible_reason}"
        rows.append(
            (
                r.placement.label(),
                r.placement.kind.value,
                str(r.best.plan.num_gpus),
                f"{e.iteration_s:.3f}",
                f"{e.tokens_per_s:,.0f}",
                status,
            )
        )
    return Table(
        title="Placements (the best plan of each, or the solver's reason for none)",
        columns=("placement", "kind", "GPUs", "s/step", "tokens/s", "status"),
        rows=tuple(rows),
    )


def _ranked_table(result: PlannerResult) -> Table:
    return Table(
        title="Ranked plans",
        columns=("rank", "plan", "hash", "kind", "GPUs", "s/step", "tokens/s", "$/Mtoken"),
        rows=tuple(
            (
                str(i + 1),
                r.plan.name,
                r.estimate.plan_hash,
                r.kind.value,
                str(r.plan.num_gpus),
                f"{r.estimate.iteration_s:.3f}",
                f"{r.estimate.tokens_per_s:,.0f}",
                "-" if r.price_per_mtoken is None else f"{r.price_per_mtoken:.3f}",
            )
            for i, r in enumerate(result.ranked)
        ),
    )


def plan_report(result: PlannerResult, path: str | Path) -> Path:
    """Placement comparison plus the best plan's timeline and memory, written to `path`."""
    best = result.best.estimate
    header = {
        "planner status": f"{result.status.value}, {result.objective.value} objective, "
        f"{result.solve_s:.1f} s",
        "placements": f"{len(result.per_placement)} tried, {len(unplanned(result))} without a plan",
        **{f"best {k}": v for k, v in estimate_header(best).items()},
    }
    page = Page(
        title=f"placeflow plan: {best.plan_name}",
        header=header,
        figures=(
            comparison_figure(result),
            peak_memory_figure(result),
            timeline_figure(best),
            memory_figure(best),
        ),
        tables=(_ranked_table(result), _placements_table(result), sets_table(best)),
        warning=_warning(best),
    )
    return write_page(page, path)


def scaling_report(
    points: Iterable[ScalingPoint | tuple[int, float, str]], path: str | Path
) -> Path:
    """Throughput against GPU count from (num_gpus, tokens_per_s, label) points."""
    pts = as_points(points)
    table = Table(
        title="Points",
        columns=("label", "GPUs", "tokens/s", "tokens/s per GPU"),
        rows=tuple(
            (
                p.label,
                str(p.num_gpus),
                f"{p.tokens_per_s:,.0f}",
                f"{p.tokens_per_s / p.num_gpus:,.0f}",
            )
            for p in sorted(pts, key=lambda p: (p.label, p.num_gpus))
        ),
    )
    page = Page(
        title="placeflow scaling",
        header={"points": str(len(pts)), "series": ", ".join(sorted({p.label for p in pts}))},
        figures=(scaling_figure(pts),),
        tables=(table,),
    )
    return write_page(page, path)
