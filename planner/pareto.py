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
# Blocks of the sweep: small first (most fronts are a few rows), then larger.
_FIRST_BLOCK = 4
_MAX_BLOCK = 128
_UPPER = np.triu(np.ones((_MAX_BLOCK, _MAX_BLOCK), dtype=bool), 1)  # [i, j]: i < j


def pareto_indices(points: np.ndarray) -> np.ndarray:
    """Indices of the rows no other row dominates (<= everywhere, < somewhere); of equal
    rows the first is kept. In index order for up to `_CHUNK` rows, else in
    lexicographic order of the rows.

    Sweep over the rows in an order where a row comes after every row that dominates
    or equals it, a block at a time: a row of the block that no earlier row of the
    block is <= is on the front (the rows before the block that could dominate it
    are on the front or dominated by a row that is, which would have removed it).
    The block's front then removes every later row it dominates or equals, in one
    vectorised comparison, before the next block. The order is by the sum of the
    columns scaled to [0, 1] (a dominating row's sum is no greater: rounding is
    monotone), then lexicographic, then by index: rows good in every column come
    first and remove the most (sort-filter-skyline). The fronts the planner builds
    are small next to their rows, so most rows go in the first rounds.
    """
    n = len(points)
    if n == 0:
        return np.zeros(0, dtype=np.intp)
    # A column equal in every row decides nothing, and leaving it out keeps the
    # lexicographic order: fronts of set options often have two or three such.
    varying = points.max(axis=0) != points.min(axis=0)
    if not varying.all():
        points = points[:, varying]
    if points.shape[1] <= 2:
        out = _front_2d(points)
        return np.sort(out) if n <= _CHUNK else out
    low = points.min(axis=0)
    score = ((points - low) / (points.max(axis=0) - low)).sum(axis=1)
    order = np.lexsort((np.arange(n), *points.T[::-1], score))
    # Column-major: the comparisons go column by column on contiguous rows of numbers
    # (a reduction over a short last axis is what numpy does slowest).
    cols, index = np.ascontiguousarray(points[order].T), order
    kept, size = [], _FIRST_BLOCK
    while len(index):
        b = min(size, len(index))
        block, cols = cols[:, :b], cols[:, b:]
        size = min(2 * size, _MAX_BLOCK)
        before = _no_greater(block, block)  # [i, j]: i <= j
        front = ~(before & _UPPER[:b, :b]).any(axis=0)
        kept.append(index[:b][front])
        index = index[b:]
        if len(index):
            keep = ~_no_greater(block[:, front], cols).any(axis=0)
            cols, index = cols[:, keep], index[keep]
    out = np.concatenate(kept)
    if n <= _CHUNK:
        return np.sort(out)
    return out[np.lexsort((out, *points[out].T[::-1]))]


def _no_greater(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """[i, j]: row i of `a` is <= row j of `b` in every column (both given column-major)."""
    out = a[0][:, None] <= b[0][None, :]
    for c in range(1, len(a)):
        out &= a[c][:, None] <= b[c][None, :]
    return out


def _front_2d(points: np.ndarray) -> np.ndarray:
    """`pareto_indices` for at most two columns, in lexicographic order of the rows: in
    that order (ties by index) a row is on the front iff its second column is below
    every earlier row's (an earlier row is no greater in the first)."""
    n = len(points)
    cols = [np.zeros(n, dtype=points.dtype)] * (2 - points.shape[1]) + list(points.T)
    order = np.lexsort((np.arange(n), cols[1], cols[0]))
    second = cols[1][order]
    earlier = np.minimum.accumulate(second)
    front = np.ones(n, dtype=bool)
    front[1:] = second[1:] < earlier[:-1]
    return order[front]


def pareto_mask(points: np.ndarray) -> np.ndarray:
    """Whether each row is on the front: no other row dominates it (equal rows all kept)."""
    n = len(points)
    if n == 0:
        return np.zeros(0, dtype=bool)
    # The distinct rows, by one lexicographic sort (np.unique along an axis is slower).
    order = np.lexsort(points.T[::-1])
    ordered = points[order]
    first = np.ones(n, dtype=bool)
    first[1:] = (ordered[1:] != ordered[:-1]).any(axis=1)
    on_front = np.zeros(int(first.sum()), dtype=bool)
    on_front[pareto_indices(ordered[first])] = True
    mask = np.empty(n, dtype=bool)
    mask[order] = on_front[np.cumsum(first) - 1]
    return mask
