"""Pareto fronts on arrays (`planner.pareto`) against the pairwise definition.

Beyond the set of rows kept, the order matters: the set fronts become the
solver's variables in this order, and the solver's choice among equal optima
follows it, so it is part of the contract (index order up to `_CHUNK` rows,
lexicographic order of the rows beyond; of equal rows the first).
"""

import numpy as np
import pytest

from placeflow.planner.pareto import _CHUNK, pareto_indices, pareto_mask


def pairwise_kept(points: np.ndarray) -> list[int]:
    """Indices of rows no row dominates, and of equal rows the first: by definition."""
    n = len(points)
    kept = []
    for j in range(n):
        no_worse = (points <= points[j]).all(axis=1)
        dominated = (no_worse & (points < points[j]).any(axis=1)).any()
        repeated = any((points[i] == points[j]).all() for i in range(j))
        if not dominated and not repeated:
            kept.append(j)
    return kept


@pytest.mark.parametrize("seed", range(12))
def test_pareto_indices_keep_the_front_in_the_documented_order(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.choice([0, 1, 7, 64, 255, 256, 257, 600]))
    dims = int(rng.integers(1, 7))
    points = rng.integers(0, int(rng.integers(2, 40)), size=(n, dims))
    if seed % 3 == 0:
        points = points * 0.37  # floats, as the cost table's seconds and bytes
    want = pairwise_kept(points)
    if n > _CHUNK:
        want = sorted(want, key=lambda i: (tuple(points[i]), i))
    assert pareto_indices(points).tolist() == want


def test_pareto_mask_keeps_every_copy_of_a_front_row() -> None:
    points = np.array([[1.0, 2.0], [2.0, 1.0], [1.0, 2.0], [2.0, 2.0], [0.5, 3.0]])
    assert pareto_mask(points).tolist() == [True, True, True, False, True]
    assert pareto_mask(np.zeros((0, 3))).tolist() == []
