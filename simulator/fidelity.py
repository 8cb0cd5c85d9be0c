"""Fidelity: a simulated step against the phase times an executor run measured.

Pure: it reads a `StepEstimate` and the per-step records of a run directory's
metrics.jsonl (phase name -> seconds, the one vocabulary of
`placeflow.phases`), and builds the table `placeflow validate` writes and the
README publishes. Measured times are medians over the steps after
`warmup` (the first step pays one-time costs: gloo connects new groups, caches
fill). Relative error = (predicted - measured) / measured; the summary is the
median and the worst absolute error over the phases both sides have.

Phases only one side has are listed, not scored: the controller's rule-based
reward and advantage are measured but have no device cost in the simulator.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from placeflow.simulator.estimate import StepEstimate

# Controller-side phases: measured by the executor, not costed by the simulator.
CONTROLLER_PHASES = ("reward", "advantage")


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
    measured_names = {name for r in used for name in r["phases"]}
    rows = []
    for name in sorted((measured_names & set(predicted)) - set(CONTROLLER_PHASES)):
        times = [float(r["phases"].get(name, 0.0)) for r in used]
        rows.append(
            PhaseError(phase=name, measured_s=statistics.median(times), predicted_s=predicted[name])
        )
    unscored = tuple(sorted((measured_names ^ set(predicted)) - set(CONTROLLER_PHASES)))
    step = PhaseError(
        phase="step",
        measured_s=statistics.median(float(r["step_time_s"]) for r in used),
        predicted_s=estimate.iteration_s,
    )
    return FidelityTable(
        plan=estimate.plan_name,
        profile=estimate.profile_name,
        steps=len(used),
        phases=tuple(rows),
        step=step,
        unscored=unscored,
    )
