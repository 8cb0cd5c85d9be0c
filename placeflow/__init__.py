"""placeflow: plan, simulate and execute placements of RL post-training for LLMs.

The root package holds the shared vocabulary: specs of models, hardware,
clusters and workloads (frozen, validated dataclasses loadable from TOML) and
the command-line interface. Everything else builds on these specs:
`placeflow.profiles` (kernel profiler and cost model), `placeflow.simulator`,
`placeflow.planner`, `placeflow.executor` and `placeflow.reports`.

The library API (`placeflow.api`) is here too: `placeflow.plan(cluster,
workload)`, `placeflow.simulate(plan)`, `placeflow.run(plan)`,
`placeflow.validate(plan)`, `placeflow.export(plan, "verl")`. `placeflow.plan`
and `placeflow.export` are also modules (the plan spec, the exporters) that
answer a call with the API's verb (`placeflow.modcall`).
"""

__version__ = "0.1.0"

from placeflow import export, plan  # modules callable as the API's verbs
from placeflow.api import Validation, rehearse, run, simulate, validate

__all__ = ["Validation", "export", "plan", "rehearse", "run", "simulate", "validate"]
