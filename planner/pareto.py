"""Pareto fronts of rows of numbers (minimisation in every column), on numpy arrays.

A row dominates another when it is no greater in every column and less in one.
`pareto_indices` keeps one of equal rows (the set fronts, where equal rows are
interchangeable); `pareto_mask` keeps them all (the cost table, where equal
criteria may belong to different layouts).
"""

from __future__ import annotations

import numpy as np

_CHUNK = 256
# Positive weights for the filter of `pareto_indices`: rounds of a few weight vectors
# each (fixed, so that results are repeatable).
_WEIGHTS = np.random.default_rng(0).uniform(0.05, 1.0, size=(4, 12, 8))


def _small_front(points: np.ndarray) -> np.ndarray:
    """`pareto_indices` of a few rows, all pairs at once (of equal rows the first is kept)."""
    no_worse = (points[:, None, :] <= points[None, :, :]).all(axis=2)  # [i, j]: i <= j
    equal = no_worse & no_worse.T
    dominated = (no_worse & ~equal).any(axis=0)
    repeated = np.triu(equal, 1).any(axis=0)
    return np.flatnonzero(~dominated & ~repeated)


def pareto_indices(points: np.ndarray) -> np.ndarray:
    """Indices of the rows no other row dominates (<= everywhere, < somewhere); of equal
    rows one is kept.

    First a cheap filter: a row minimising a weighted sum with positive weights is
    on the front, so a few such rows (`_WEIGHTS`, round by round among the rows
    left) remove most dominated rows at once. Then the survivors, lexicographically
    sorted (a row can only be dominated by an earlier one), are checked in chunks
    against the front so far and against their own chunk (dominance is transitive,
    so a row dominated by a dropped row is dominated by a kept one too).
    """
    if len(points) <= _CHUNK:
        return _small_front(points)
    low = points.min(axis=0)
    scaled = (points - low) / (points.max(axis=0) - low + 1)
    survivors = np.arange(len(points))
    for weights in _WEIGHTS:
        if len(survivors) <= _CHUNK:
            break
        rows = points[survivors]
        sums = scaled[survivors] @ weights[:, : points.shape[1]].T
        dominated = np.zeros(len(rows), dtype=bool)
        for anchor in rows[np.unique(np.argmin(sums, axis=0))]:
            dominated |= (rows >= anchor).all(axis=1) & (rows != anchor).any(axis=1)
        survivors = survivors[~dominated]
    unique, first = np.unique(points[survivors], axis=0, return_index=True)
    first = survivors[first]
    front = np.empty((0, points.shape[1]), dtype=points.dtype)
    kept: list[np.ndarray] = []
    for start in range(0, len(unique), _CHUNK):
        chunk = unique[start : start + _CHUNK]
        by_front = (front[:, None, :] <= chunk[None, :, :]).all(axis=2).any(axis=0)
        within = np.all(chunk[:, None, :] <= chunk[None, :, :], axis=2)
        np.fill_diagonal(within, False)  # rows are distinct: <= everywhere is dominance
        keep = ~(by_front | within.any(axis=0))
        front = np.concatenate([front, chunk[keep]])
        kept.append(first[start : start + _CHUNK][keep])
    return np.concatenate(kept)


def pareto_mask(points: np.ndarray) -> np.ndarray:
    """Whether each row is on the front: no other row dominates it (equal rows all kept)."""
    if len(points) == 0:
        return np.zeros(0, dtype=bool)
    unique, inverse = np.unique(points, axis=0, return_inverse=True)
    on_front = np.zeros(len(unique), dtype=bool)
    on_front[pareto_indices(unique)] = True
    return on_front[inverse.reshape(-1)]
