"""placeflow: plan, simulate and execute placements of RL post-training for LLMs.

The root package holds the shared vocabulary: specs of models, hardware,
clusters and workloads (frozen, validated dataclasses loadable from TOML) and
the command-line interface. Everything else builds on these specs:
`placeflow.profiles` (kernel profiler and cost model), `placeflow.simulator`,
`placeflow.planner`, `placeflow.executor` and `placeflow.reports`.
"""

__version__ = "0.1.0"
