"""placeflow.simulator: one RL step of a plan, phase by phase.

`simulate(plan, cost_model) -> StepEstimate`. Modules: `compute`
(transformer pieces from kernel costs), `memory` (per-GPU bytes), `lengths`
(response-length distributions), `callcosts` (time and memory of each kind
of call), `rolecosts` (a role's calls in the workload's dataflow, priced on
its device set), `schedule` (discrete-event timeline), `estimate` (the result
types), `simulate`. The dataflow itself is `placeflow.dataflow`, shared with
the executor.
"""

from placeflow.simulator.estimate import PhaseInterval, SetEstimate, StepEstimate
from placeflow.simulator.simulate import simulate

__all__ = ["PhaseInterval", "SetEstimate", "StepEstimate", "simulate"]
