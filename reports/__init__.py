"""placeflow.reports: self-contained plotly HTML pages of simulator and planner results.

Reports read `StepEstimate` and `PlannerResult`; they never simulate or solve.
`simulate_report` draws one step (timeline, memory), `plan_report` a planner run
(placements compared, then the best plan), `scaling_report` throughput against
GPU count. Figure builders live one per module for use in notebooks.
"""

from placeflow.reports.pages import plan_report, scaling_report, simulate_report
from placeflow.reports.scaling import ScalingPoint

__all__ = ["ScalingPoint", "plan_report", "scaling_report", "simulate_report"]
