"""StepEstimate: what the simulator predicts for one RL step of a plan.

Times in seconds, memory in bytes per GPU, throughput in tokens per second
counting prompt plus response tokens (as the HybridFlow paper does).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from placeflow.phases import Phase
from placeflow.workload import Role


@dataclass(frozen=True, kw_only=True)
class PhaseInterval:
    """One call in the timeline. `device_set` indexes Plan.sets (-1: the controller)."""

    name: Phase
    roles: tuple[Role, ...]
    device_set: int
    set_label: str
    start_s: float
    end_s: float
    step: int = 0
    detail: Mapping[str, Any] = field(default_factory=dict, hash=False, compare=False)

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s


@dataclass(frozen=True, kw_only=True)
class SetEstimate:
    """One device set: memory per phase, peak, and how busy it is in a step."""

    index: int
    label: str
    pool: str
    num_devices: int
    capacity_bytes: int
    resident_bytes: float
    memory_by_phase: Mapping[str, float] = field(hash=False)
    peak_memory_bytes: float
    busy_s: float
    utilisation: float
    bubble_fraction: float


@dataclass(frozen=True, kw_only=True)
class StepEstimate:
    plan_name: str
    plan_hash: str
    profile_name: str
    feasible: bool
    iteration_s: float
    tokens_per_s: float
    samples_per_s: float
    phases: tuple[PhaseInterval, ...]
    sets: tuple[SetEstimate, ...]
    notes: tuple[str, ...] = ()
    infeasible_reasons: tuple[str, ...] = ()  # every problem: each over-capacity set, ...
    # The last `window` unrolled steps are the steady state `iteration_s` averages over
    # (1 but for asynchronous estimates whose generation varies from step to step).
    window: int = 1

    @property
    def infeasible_reason(self) -> str | None:
        """Every one of `infeasible_reasons`, joined by '; ' (None when there is none)."""
        return "; ".join(self.infeasible_reasons) or None

    @property
    def peak_memory_bytes(self) -> float:
        return max(s.peak_memory_bytes for s in self.sets)

    @property
    def steady_step(self) -> int:
        """The step whose calls stand for one step: the last one shown.

        A synchronous estimate shows one step (0). An asynchronous one unrolls
        several; the last is in the steady state that `iteration_s` measures.
        """
        return max((p.step for p in self.phases), default=0)

    def in_window(self, step: int) -> bool:
        """Whether unrolled step `step` is one of the `window` steady-state steps."""
        return self.steady_step - self.window < step <= self.steady_step

    def phase_totals_s(self) -> dict[str, float]:
        """Duration per phase name over one step (the steady state), summed over sets.

        One step's worth, as a run records per step: the mean over the window's
        steps (summing every unrolled step would count each call several times).
        """
        totals: dict[str, float] = {}
        for p in self.phases:
            if self.in_window(p.step):
                totals[p.name.value] = totals.get(p.name.value, 0.0) + p.duration_s / self.window
        return totals

    def to_json(self) -> dict[str, Any]:
        def num(x: float) -> float | None:
            return x if math.isfinite(x) else None

        return {
            "plan": self.plan_name,
            "plan_hash": self.plan_hash,
            "profile": self.profile_name,
            "feasible": self.feasible,
            "infeasible_reason": self.infeasible_reason,
            "infeasible_reasons": list(self.infeasible_reasons),
            # A plan that cannot run has no iteration time: null, not a number to misread.
            "iteration_s": num(self.iteration_s) if self.feasible else None,
            "tokens_per_s": num(self.tokens_per_s) if self.feasible else None,
            "samples_per_s": num(self.samples_per_s) if self.feasible else None,
            "peak_memory_bytes": self.peak_memory_bytes,
            "phases": [
                {
                    "name": p.name.value,
                    "roles": [r.value for r in p.roles],
                    "device_set": p.device_set,
                    "set_label": p.set_label,
                    "step": p.step,
                    "start_s": p.start_s,
                    "end_s": p.end_s,
                    "detail": dict(p.detail),
                }
                for p in self.phases
            ],
            "sets": [
                {
                    "index": s.index,
                    "label": s.label,
                    "pool": s.pool,
                    "num_devices": s.num_devices,
                    "capacity_bytes": s.capacity_bytes,
                    "resident_bytes": s.resident_bytes,
                    "memory_by_phase": dict(s.memory_by_phase),
                    "peak_memory_bytes": s.peak_memory_bytes,
                    "busy_s": s.busy_s,
                    "utilisation": s.utilisation,
                    "bubble_fraction": s.bubble_fraction,
                }
                for s in self.sets
            ],
            "notes": list(self.notes),
            "window": self.window,
        }
