"""placeflow.reports: plotly HTML reports (issue 8; not built yet)."""
