"""The planner's speed-ups give the answers of the plain definitions they replace.

`pareto_indices` (column-by-column block sweep) against the front by its
definition, on random rows with many ties and equal columns, in the sizes the
set fronts use (beyond one sweep block and beyond `_CHUNK`, where the order
changes from index to lexicographic), and that the cost table's pause of the
garbage collector leaves it as it was.
"""

from __future__ import annotations

import gc

import numpy as np
import pytest

from placeflow.planner.costtable import _gc_paused
from placeflow.planner.pareto import _CHUNK, pareto_indices, pareto_mask


def _brute_indices(points: np.ndarray) -> list[int]:
    """Rows no other dominates, the first of equal rows; index order up to _CHUNK rows,
    else lexicographic order of the rows (ties by index)."""
    n = len(points)
    kept = []
    for i in range(n):
        p = points[i]
        dominated = any(
            (points[j] <= p).all() and ((points[j] < p).any() or j < i) for j in range(n) if j != i
        )
        if not dominated:
            kept.append(i)
    if n <= _CHUNK:
        return kept
    return sorted(kept, key=lambda i: (*points[i].tolist(), i))


def _brute_mask(points: np.ndarray) -> list[bool]:
    return [not any((q <= p).all() and (q < p).any() for q in points) for p in points]


@pytest.mark.parametrize("n", [1, 3, 17, 200, 300, 700])
@pytest.mark.parametrize("cols", [1, 2, 3, 5, 6])
@pytest.mark.parametrize("seed", [0, 1])
def test_pareto_indices_is_the_front_by_definition(n: int, cols: int, seed: int) -> None:
    rng = np.random.default_rng(seed * 1000 + n * 10 + cols)
    points = rng.integers(0, 6, size=(n, cols)).astype(np.int64)
    if cols >= 3:
        points[:, 1] = 4  # a constant column: decides nothing
    assert pareto_indices(points).tolist() == _brute_indices(points)
    floats = points + rng.random((n, cols)) * (rng.random((n, cols)) < 0.5)
    assert pareto_indices(floats).tolist() == _brute_indices(floats)


@pytest.mark.parametrize("n", [5, 150, 400])
def test_pareto_mask_keeps_equal_rows_by_definition(n: int) -> None:
    rng = np.random.default_rng(n)
    points = rng.integers(0, 5, size=(n, 5)).astype(float)
    assert pareto_mask(points).tolist() == _brute_mask(points)


def test_gc_pause_restores_the_collector_as_it_was() -> None:
    was = gc.isenabled()
    try:
        for before in (True, False):
            (gc.enable if before else gc.disable)()
            with pytest.raises(ValueError), _gc_paused():
                assert not gc.isenabled()
                raise ValueError("the table's build failed")
            assert gc.isenabled() is before
            with _gc_paused():
                assert not gc.isenabled()
            assert gc.isenabled() is before
    finally:
        (gc.enable if was else gc.disable)()
