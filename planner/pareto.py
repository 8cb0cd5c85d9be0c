"""Pareto fronts of rows of numbers (minimisation in every column), on numpy arrays.

A row dominates another when it is no greater in every column and less in one.
`pareto_indices` keeps one of equal rows (the set fronts, where equal rows are
interchangeable); `pareto_mask` keeps them all (the cost table, where equal
criteria may belong to different layouts).
"""

from __future__ import annotations

import numpy as np

# Up to this many rows the front is returned in index order, beyond in lexicographic
# order of the rows: the order of the earlier chunked implementation, which the solver's
# variable order (and so its choice among equal optima) follows.
_CHUNK = 256


def pareto_indices(points: np.ndarray) -> np.ndarray:
    """Indices of the rows no other row dominates (<= everywhere, < somewhere); of equal
    rows the first is kept. In index order for up to `_CHUNK` rows, else in
    lexicographic order of the rows.

    Sweep over the rows in lexicographic order (ties by index): the first row left
    is on the front (only a lexicographically smaller row can dominate it, and each
    of those is on the front or dominated by a row that is, which would have removed
    it), so keep it and remove every row it dominates or equals. Each round is one
    vectorised comparison; there are as many rounds as rows on the front, which is
    small next to the rows in the planner's fronts.
    """
    n = len(points)
    order = np.lexsort((np.arange(n), *points.T[::-1]))
    rows, index = points[order], order
    kept = []
    while len(index):
        kept.append(index[0])
        left = ~(rows >= rows[0]).all(axis=1)
        rows, index = rows[left], index[left]
    out = np.array(kept, dtype=np.intp)
    return np.sort(out) if n <= _CHUNK else out


def pareto_mask(points: np.ndarray) -> np.ndarray:
    """Whether each row is on the front: no other row dominates it (equal rows all kept)."""
    if len(points) == 0:
        return np.zeros(0, dtype=bool)
    unique, inverse = np.unique(points, axis=0, return_inverse=True)
    on_front = np.zeros(len(unique), dtype=bool)
    on_front[pareto_indices(unique)] = True
    return on_front[inverse.reshape(-1)]
