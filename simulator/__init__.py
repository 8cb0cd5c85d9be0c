"""placeflow.simulator: one RL step of a plan, phase by phase (issue 3; not built yet)."""
