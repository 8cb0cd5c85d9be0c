"""placeflow.simulator: one RL step of a plan, phase by phase.

`simulate(plan, cost_model) -> StepEstimate`. Modules: `dataflow` (the
algorithms as graphs of model calls), `compute` (transformer pieces from
kernel costs), `memory` (per-GPU bytes), `lengths` (response-length
distributions), `calls` (time and memory of each call), `schedule`
(discrete-event timeline), `estimate` (the result types), `simulate`.
"""

from placeflow.simulator.estimate import PhaseInterval, SetEstimate, StepEstimate
from placeflow.simulator.simulate import simulate

__all__ = ["PhaseInterval", "SetEstimate", "StepEstimate", "simulate"]
