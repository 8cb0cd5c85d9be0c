"""Fidelity: a simulated step against the phase times an executor run measured.

Pure: it reads a `StepEstimate` and the per-step records of a run directory's
metrics.jsonl (phase name -> seconds, the one vocabulary of
`placeflow.phases`), and builds the table `placeflow validate` writes and the
README publishes. Measured times are medians over the steps after
`warmup` (the first step pays one-time costs: gloo connects new groups, caches
fill). Relative error = (predicted - measured) / measured; the summary is the
median and the worst absolute error over the phases both sides have.
`compare_runs` takes several runs of one plan: the median of their medians.

Phases only one side has are listed, not scored. The controller's own work (the
rule-based reward's scoring and the advantages, on the driver: the simulator's
phases of no role) is listed apart (`controller`) where both sides have it, not
scored either: a millisecond or two
of driver work, which matters to the model for what waits behind it (the forwards'
collects, the updates' launches), and whose own time is the host's noise.

Overlap says how much of a step ran concurrently: the calls' durations summed,
over the step's wall time (see `call_overlap` and `simulated_overlap`). 1 means
the calls ran one after another without gaps; above 1, calls on disjoint
device sets overlapped; below 1, the step had idle gaps between calls.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from placeflow.metrics import Metric, RecordKey
from placeflow.phases import Phase
from placeflow.simulator.estimate import StepEstimate

# Controller-side phases: the driver's own work where the simulator has it, and never
# scored where only the run has it (a profile without the driver's entries).
CONTROLLER_PHASES = (Phase.REWARD, Phase.ADVANTAGE)
# The name of the table's row for the whole step (iteration time against measured step
# time), shown after the phases' rows.
STEP_ROW = "step"


@dataclass(frozen=True, kw_only=True)
class PhaseError:
    phase: str
    measured_s: float
    predicted_s: float

    @property
    def rel_error(self) -> float:
        return (self.predicted_s - self.measured_s) / self.measured_s


@dataclass(frozen=True, kw_only=True)
class FidelityTable:
    plan: str
    profile: str
    steps: int  # measured steps used (after warm-up)
    phases: tuple[PhaseError, ...]
    step: PhaseError  # the whole step: iteration time against measured step time
    unscored: tuple[str, ...]  # phases on one side only
    measured_overlap: float | None  # median over the steps used; None: no step has a timeline
    simulated_overlap: float
    controller: tuple[PhaseError, ...] = ()  # the driver's own work, listed, not scored

    @property
    def median_abs_error(self) -> float:
        return statistics.median(abs(p.rel_error) for p in self.phases) if self.phases else 0.0

    @property
    def worst(self) -> PhaseError | None:
        return max(self.phases, key=lambda p: abs(p.rel_error), default=None)

    def to_json(self) -> dict[str, Any]:
        worst = self.worst
        return {
            "plan": self.plan,
            "profile": self.profile,
            "steps": self.steps,
            "phases": [
                {
                    "phase": p.phase,
                    "measured_s": p.measured_s,
                    "predicted_s": p.predicted_s,
                    "rel_error": p.rel_error,
                }
                for p in self.phases
            ],
            "step": {
                "measured_s": self.step.measured_s,
                "predicted_s": self.step.predicted_s,
                "rel_error": self.step.rel_error,
            },
            "median_abs_error": self.median_abs_error,
            "worst_phase": worst.phase if worst else None,
            "worst_abs_error": abs(worst.rel_error) if worst else 0.0,
            "unscored": list(self.unscored),
            "measured_overlap": self.measured_overlap,
            "simulated_overlap": self.simulated_overlap,
            "controller": [
                {"phase": p.phase, "measured_s": p.measured_s, "predicted_s": p.predicted_s}
                for p in self.controller
            ],
        }

    def to_markdown(self) -> str:
        lines = [
            f"plan {self.plan}, profile {self.profile}, {self.steps} measured steps",
            "",
            "| phase | measured s | predicted s | error |",
            "|---|---:|---:|---:|",
        ]
        for p in (*self.phases, self.step):
            lines.append(
                f"| {p.phase} | {p.measured_s:.4f} | {p.predicted_s:.4f} | {p.rel_error:+.0%} |"
            )
        worst = self.worst
        lines += [
            "",
            f"median |error| over phases {self.median_abs_error:.0%}; worst "
            + (f"{worst.phase} {abs(worst.rel_error):.0%}" if worst else "-"),
            "",
            overlap_text(self.measured_overlap, self.simulated_overlap),
        ]
        return "\n".join(lines) + "\n"


def compare(
    estimate: StepEstimate, records: Sequence[Mapping[str, Any]], *, warmup: int = 1
) -> FidelityTable:
    """The table for `estimate` against run `records` (metrics.jsonl lines)."""
    used = list(records[warmup:]) or list(records)
    if not used:
        raise ValueError("no measured steps to compare")
    predicted = estimate.phase_totals_s()
    measured_names = {name for r in used for name in r[RecordKey.PHASES]}
    # The driver's own work: the phases the simulator gives no role (a reward model's
    # call is the model's, scored with the others).
    on_driver = {p.name for p in estimate.phases if not p.roles}
    rows: list[PhaseError] = []
    controller: list[PhaseError] = []
    for name in sorted(measured_names & set(predicted)):
        times = [float(r[RecordKey.PHASES].get(name, 0.0)) for r in used]
        row = PhaseError(
            phase=name, measured_s=statistics.median(times), predicted_s=predicted[name]
        )
        (controller if name in on_driver else rows).append(row)
    unscored = tuple(sorted((measured_names ^ set(predicted)) - set(CONTROLLER_PHASES)))
    step = PhaseError(
        phase=STEP_ROW,
        measured_s=statistics.median(float(r[Metric.STEP_TIME_S]) for r in used),
        predicted_s=estimate.iteration_s,
    )
    return FidelityTable(
        plan=estimate.plan_name,
        profile=estimate.profile_name,
        steps=len(used),
        phases=tuple(rows),
        step=step,
        unscored=unscored,
        measured_overlap=measured_overlap(used),
        simulated_overlap=simulated_overlap(estimate),
        controller=tuple(controller),
    )


def compare_runs(
    estimate: StepEstimate,
    runs: Sequence[Sequence[Mapping[str, Any]]],
    *,
    warmup: int = 1,
) -> FidelityTable:
    """The table for `estimate` against several runs of its plan (each a list of records):
    `median_table` of each run's own `compare`."""
    if not runs:
        raise ValueError("no runs to compare")
    return median_table(estimate, [compare(estimate, records, warmup=warmup) for records in runs])


def median_table(estimate: StepEstimate, tables: Sequence[FidelityTable]) -> FidelityTable:
    """One table from the tables of several runs of `estimate`'s plan.

    Each phase's and the step's measured time is the median over the runs of each
    run's own median, the measured overlap the median of the runs' own: on a host
    whose speed drifts for minutes at a time, one slow run moves the median of
    three runs less than it moves the median of their steps pooled. A phase some
    run lacks is taken over the runs that have it. One table is returned as it is.
    """
    if not tables:
        raise ValueError("no runs to compare")
    if len(tables) == 1:
        return tables[0]
    predicted = estimate.phase_totals_s()
    measured: dict[str, list[float]] = {}
    driver: dict[str, list[float]] = {}
    for table in tables:
        for p in table.phases:
            measured.setdefault(p.phase, []).append(p.measured_s)
        for p in table.controller:
            driver.setdefault(p.phase, []).append(p.measured_s)
    overlaps = [t.measured_overlap for t in tables if t.measured_overlap is not None]
    return FidelityTable(
        plan=tables[0].plan,
        profile=tables[0].profile,
        steps=sum(t.steps for t in tables),
        phases=tuple(
            PhaseError(phase=name, measured_s=statistics.median(times), predicted_s=predicted[name])
            for name, times in sorted(measured.items())
        ),
        step=PhaseError(
            phase=STEP_ROW,
            measured_s=statistics.median(t.step.measured_s for t in tables),
            predicted_s=estimate.iteration_s,
        ),
        unscored=tuple(sorted({n for t in tables for n in t.unscored} - set(measured))),
        measured_overlap=statistics.median(overlaps) if overlaps else None,
        simulated_overlap=tables[0].simulated_overlap,
        controller=tuple(
            PhaseError(phase=name, measured_s=statistics.median(times), predicted_s=predicted[name])
            for name, times in sorted(driver.items())
        ),
    )


def timeline_wall_s(timeline: Sequence[Mapping[str, Any]]) -> float:
    """Wall time of a measured step: max_i end_i − min_i start_i over its calls (seconds)."""
    if not timeline:
        raise ValueError("a timeline with no calls has no wall time")
    return max(float(c["end_s"]) for c in timeline) - min(float(c["start_s"]) for c in timeline)


def call_overlap(timeline: Sequence[Mapping[str, Any]]) -> float:
    """Measured overlap of one step, from its metrics line's `timeline` records.

        overlap = Σ_i (end_i − start_i) / (max_i end_i − min_i start_i)

    over the step's calls i, controller-side ones included. The wall time is
    the span of the calls, as the simulator's iteration time is the span of
    its step, so that the two ratios compare.
    """
    wall_s = timeline_wall_s(timeline)
    if wall_s <= 0:
        raise ValueError(f"a step whose calls span {wall_s} s has no overlap ratio")
    return sum(float(c["end_s"]) - float(c["start_s"]) for c in timeline) / wall_s


def measured_overlap(records: Sequence[Mapping[str, Any]]) -> float | None:
    """Median of `call_overlap` over the records that have a timeline; None if none has."""
    ratios = [call_overlap(r[RecordKey.TIMELINE]) for r in records if r.get(RecordKey.TIMELINE)]
    return statistics.median(ratios) if ratios else None


def simulated_overlap(estimate: StepEstimate) -> float:
    """The same ratio for a simulated step: Σ_p (end_p − start_p) / iteration_s.

    The sum runs over the phases p of one step: the step when synchronous
    (iteration_s is then the span of its calls, as measured), the mean step of
    an unrolled asynchronous schedule's steady-state window (iteration_s is then
    the mean distance between step ends).
    """
    busy_s = sum(estimate.phase_totals_s().values())
    return busy_s / estimate.iteration_s


def overlap_text(measured: float | None, simulated: float) -> str:
    """`overlap: measured 1.42, simulated 1.55` (measured "-" when no step has a timeline)."""
    shown = "-" if measured is None else f"{measured:.2f}"
    return f"overlap: measured {shown}, simulated {simulated:.2f}"
