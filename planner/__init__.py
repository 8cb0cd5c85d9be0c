"""placeflow.planner: placement enumeration and the CP-SAT model (issue 4; not built yet)."""
