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

    Sweep over the rows in lexicographic order (ties by index), a block at a time:
    only a row before it can dominate or equal a row, so a row of the block that no
    earlier row of the block is <= is on the front (the rows before the block that
    could dominate it are on the front or dominated by a row that is, which would
    have removed it). The block's front then removes every later row it dominates
    or equals, in one vectorised comparison, before the next block. The fronts the
    planner builds are small next to their rows, so most rows go in the first rounds.
    """
    n = len(points)
    order = np.lexsort((np.arange(n), *points.T[::-1]))
    rows, index = points[order], order
    kept, size = [], _FIRST_BLOCK
    while len(index):
        block, rows = rows[:size], rows[size:]
        size = min(2 * size, _MAX_BLOCK)
        before = (block[:, None, :] <= block[None, :, :]).all(axis=2)  # [i, j]: i <= j
        front = ~(before & _UPPER[: len(block), : len(block)]).any(axis=0)
        kept.append(index[: len(block)][front])
        index = index[len(block) :]
        if len(index):
            removed = (block[front][:, None, :] <= rows[None, :, :]).all(axis=2).any(axis=0)
            rows, index = rows[~removed], index[~removed]
    out = np.concatenate(kept) if kept else np.zeros(0, dtype=np.intp)
    return np.sort(out) if n <= _CHUNK else out


def pareto_mask(points: np.ndarray) -> np.ndarray:
    """Whether each row is on the front: no other row dominates it (equal rows all kept)."""
    if len(points) == 0:
        return np.zeros(0, dtype=bool)
    unique, inverse = np.unique(points, axis=0, return_inverse=True)
    on_front = np.zeros(len(unique), dtype=bool)
    on_front[pareto_indices(unique)] = True
    return on_front[inverse.reshape(-1)]
