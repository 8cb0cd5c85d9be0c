"""One module per constraint family of the placement model (see planner.variables)."""
