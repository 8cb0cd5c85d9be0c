"""placeflow.executor: the Ray single-controller executor (issues 5-7; not built yet)."""
