"""placeflow.planner: placement enumeration, a cost table and the CP-SAT model.

`plan_search(cluster, workload, costs, objective=...) -> PlannerResult`.
Modules: `space` (placements, counts, parallelism, memory savers), `costtable`
(options costed with the simulator's phase model), `generators` (the actor's
generator set), `setfront` (each colocated set's Pareto front of role choices),
`variables`, `constraints/` (one module per constraint family, math in their
docstrings), `model` (objectives), `solve` (pure solver with explicit status),
`solution` (device assignment, Plan), `validate` (independent validator),
`search` (one solve per placement, re-scored ranking).
"""

from placeflow.planner.model import Objective
from placeflow.planner.search import PlannerResult, RankedPlan, plan_search
from placeflow.planner.solve import Infeasible, SolverTimeout, Status

__all__ = [
    "Infeasible",
    "Objective",
    "PlannerResult",
    "RankedPlan",
    "SolverTimeout",
    "Status",
    "plan_search",
]
