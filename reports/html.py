"""One self-contained HTML page: a title, a short header, tables and figures.

plotly.js is inlined once, in the first figure's <div>; the others reuse it.
The page therefore works offline and from a file:// URL, at the cost of
~4.8 MB per page (the size of plotly.min.js). Figure <div> ids are fixed so
that regenerating a report gives the same file.
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import plotly.graph_objects as go

from placeflow.simulator.estimate import StepEstimate

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5em; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: left; }
th { background: #f3f3f3; }
.bad { color: #b00020; font-weight: bold; }
"""


@dataclass(frozen=True, kw_only=True)
class Table:
    """A plain HTML table; cells are escaped when written."""

    title: str
    columns: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]


@dataclass(frozen=True, kw_only=True)
class Page:
    title: str
    header: Mapping[str, str] = field(hash=False)  # label -> value, shown as a list
    figures: Sequence[go.Figure] = field(hash=False)
    tables: Sequence[Table] = ()
    warning: str | None = None  # shown in red under the header (e.g. infeasible)


def estimate_header(estimate: StepEstimate) -> dict[str, str]:
    """The header lines of a page about one simulated step."""
    throughput = f"{estimate.tokens_per_s:,.0f} tokens/s ({estimate.samples_per_s:.2f} samples/s)"
    return {
        "plan": estimate.plan_name,
        "plan hash": estimate.plan_hash,
        "profile": estimate.profile_name,
        "iteration time": f"{estimate.iteration_s:.3f} s",
        "throughput": throughput,
        "feasible": "yes" if estimate.feasible else f"no: {estimate.infeasible_reason}",
    }


def _table_html(table: Table) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in table.columns)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in table.rows
    )
    return f"<h2>{html.escape(table.title)}</h2>\n<table><tr>{head}</tr>{body}</table>"


def _figure_html(fig: go.Figure, index: int) -> str:
    return fig.to_html(
        full_html=False,
        include_plotlyjs=index == 0,  # True inlines the library; later figures reuse it
        div_id=f"figure-{index}",
        config={"displaylogo": False, "responsive": True},
    )


def render(page: Page) -> str:
    """The page as an HTML string."""
    items = "".join(
        f"<li><b>{html.escape(k)}</b>: {html.escape(v)}</li>" for k, v in page.header.items()
    )
    warning = f'<p class="bad">{html.escape(page.warning)}</p>' if page.warning else ""
    figures = "\n".join(_figure_html(f, i) for i, f in enumerate(page.figures))
    tables = "\n".join(_table_html(t) for t in page.tables)
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>{html.escape(page.title)}</title>\n<style>{_STYLE}</style>\n</head>\n<body>\n"
        f"<h1>{html.escape(page.title)}</h1>\n<ul>{items}</ul>\n{warning}\n"
        f"{figures}\n{tables}\n</body>\n</html>\n"
    )


def write_page(page: Page, path: str | Path) -> Path:
    """Write `page` to `path` (parent folders created) and return the path."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render(page), encoding="utf-8")
    return out
