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

from pathlib import Path as _Path

__version__ = "0.1.0"

# Installed, the top-level folders of the repository (profiles/, simulator/, ...)
# become subpackages of placeflow (pyproject's package-dir). Imported straight
# from a source checkout instead, which happens whenever the repository root is
# on sys.path (Ray puts the driver's working directory on its workers' paths),
# the same folders are found by searching the repository root as well.
_root = _Path(__file__).resolve().parent.parent
if (_root / "pyproject.toml").is_file() and (_root / "profiles" / "costmodel.py").is_file():
    __path__.append(str(_root))

from placeflow import export, plan  # noqa: E402  (modules callable as the API's verbs)
from placeflow.api import Validation, rehearse, run, simulate, validate  # noqa: E402

__all__ = ["Validation", "export", "plan", "rehearse", "run", "simulate", "validate"]
