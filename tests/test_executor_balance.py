"""Token-aware partitioning: valid, balanced, near the brute-force optimum, groups kept."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from placeflow.catalogue import get_model
from placeflow.executor.balance import (
    Partition,
    WorkModel,
    balanced_partition,
    positional_partition,
)

WORK = WorkModel(linear_coeff=1442.0)  # tiny-llama's a


def skewed_lengths(seed: int, n: int, *, median: int = 256, sigma: float = 1.0) -> list[int]:
    """Log-normal sequence lengths, clipped to [1, 4096]: a long tail of stragglers."""
    rng = np.random.default_rng(seed)
    return np.clip(rng.lognormal(np.log(median), sigma, n), 1, 4096).astype(int).tolist()


def assert_valid(p: Partition, works: Sequence[float], num_ranks: int) -> None:
    assert p.num_ranks == num_ranks
    assert sorted(i for ix in p.indices for i in ix) == list(range(len(works)))
    for ix, w in zip(p.indices, p.work, strict=True):
        assert list(ix) == sorted(ix)
        assert w == pytest.approx(sum(works[i] for i in ix))


def brute_force_max_work(
    works: Sequence[float],
    num_ranks: int,
    *,
    equal_counts: bool = False,
    groups: Sequence[int] | None = None,
) -> float:
    """The least possible heaviest-rank work, by trying every assignment (the oracle)."""
    if groups is not None:
        ids = sorted(set(groups))
        works = [sum(w for w, g in zip(works, groups, strict=True) if g == i) for i in ids]
    best = float("inf")
    # Item 0 on rank 0 loses nothing: ranks are interchangeable.
    for rest in itertools.product(range(num_ranks), repeat=len(works) - 1):
        assign = (0, *rest)
        counts = [assign.count(r) for r in range(num_ranks)]
        if equal_counts and max(counts) - min(counts) > 1:
            continue
        sums = [0.0] * num_ranks
        for rank, w in zip(assign, works, strict=True):
            sums[rank] += w
        best = min(best, max(sums))
    return best


def test_work_model_from_flop_counts():
    model = get_model("tiny-llama")
    work = WorkModel.for_model(model)
    # a = params per layer / (heads * head_dim); attention equals the linear part at s = a.
    assert work.linear_coeff == pytest.approx(model.num_params_per_layer / model.q_size)
    s = 100
    assert work.work(s) == pytest.approx(work.linear_coeff * s + s * s)
    with pytest.raises(ValueError, match="linear_coeff"):
        WorkModel(linear_coeff=-1)


def test_positional_partition_is_contiguous_like_array_split():
    p = positional_partition([1.0] * 10, 4)
    assert p.indices == ((0, 1, 2), (3, 4, 5), (6, 7), (8, 9))
    assert p.work == (3.0, 3.0, 2.0, 2.0)
    assert p.imbalance == pytest.approx(3.0 / 2.5)


def test_hand_computed_instance():
    # A total of 36 on 4 ranks balances perfectly: {8, 1}, {7, 2}, {6, 3}, {5, 4}.
    p = balanced_partition([8, 7, 6, 5, 4, 3, 2, 1], 4)
    assert sorted(p.work) == [9, 9, 9, 9]
    assert p.imbalance == 1.0
    assert positional_partition([8, 7, 6, 5, 4, 3, 2, 1], 4).imbalance == pytest.approx(15 / 9)


@pytest.mark.parametrize("equal_counts", [False, True])
def test_empty_and_tiny_inputs(equal_counts):
    assert balanced_partition([], 3, equal_counts=equal_counts).indices == ((), (), ())
    p = balanced_partition([5.0], 3, equal_counts=equal_counts)
    assert sorted(p.counts) == [0, 0, 1]
    assert p.imbalance == pytest.approx(3.0)


def test_invalid_arguments():
    with pytest.raises(ValueError, match="num_ranks"):
        balanced_partition([1.0], 0)
    with pytest.raises(ValueError, match=">= 0"):
        balanced_partition([1.0, -1.0], 2)
    with pytest.raises(ValueError, match="groups"):
        balanced_partition([1.0, 1.0], 2, groups=[0])


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    n=st.integers(16, 512),
    num_ranks=st.sampled_from([2, 4, 8]),
    equal_counts=st.booleans(),
)
@example(seed=23538, n=16, num_ranks=8, equal_counts=True)  # positional already optimal
# Past the branch and bound's reach the heuristics landed at 1.0003 against the chunks'
# 1.00002 (found by hypothesis in CI): the chunks are returned then.
@example(seed=768003, n=16, num_ranks=2, equal_counts=False)
def test_token_aware_split_beats_positional_on_skewed_lengths(seed, n, num_ranks, equal_counts):
    works = WORK.works(skewed_lengths(seed, n))
    balanced = balanced_partition(works, num_ranks, equal_counts=equal_counts)
    positional = positional_partition(works, num_ranks)
    assert_valid(balanced, works, num_ranks)
    if equal_counts:
        assert max(balanced.counts) - min(balanced.counts) <= 1
    # Never worse; strictly better whenever positional is not already within 1% of
    # the simple lower bound max(mean, heaviest sample). With equal counts every rank
    # holds at least n // k samples, so the heaviest one shares its rank with at least
    # the n // k - 1 lightest others.
    assert balanced.imbalance <= positional.imbalance * (1 + 1e-12)
    heaviest = max(works)
    if equal_counts:
        others = sorted(works)[: len(works) - 1]
        heaviest += sum(others[: len(works) // num_ranks - 1])
    lower = max(sum(works) / num_ranks, heaviest)
    if max(positional.work) > 1.01 * lower:
        assert balanced.imbalance < positional.imbalance


@settings(max_examples=80, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    shape=st.sampled_from([(n, 2) for n in range(2, 11)] + [(n, 3) for n in range(3, 9)]),
    equal_counts=st.booleans(),
)
def test_within_one_percent_of_brute_force(seed, shape, equal_counts):
    n, num_ranks = shape
    works = WORK.works(skewed_lengths(seed, n, median=200))
    p = balanced_partition(works, num_ranks, equal_counts=equal_counts)
    assert_valid(p, works, num_ranks)
    best = brute_force_max_work(works, num_ranks, equal_counts=equal_counts)
    assert max(p.work) <= best * 1.01


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    num_groups=st.integers(2, 8),
    group_size=st.integers(2, 4),
    equal_counts=st.booleans(),
)
def test_groups_stay_together(seed, num_groups, group_size, equal_counts):
    num_ranks = 2
    works = WORK.works(skewed_lengths(seed, num_groups * group_size))
    rng = np.random.default_rng(seed)
    groups = rng.permutation(np.repeat(np.arange(num_groups), group_size)).tolist()
    p = balanced_partition(works, num_ranks, equal_counts=equal_counts, groups=groups)
    assert_valid(p, works, num_ranks)
    for ix in p.indices:
        members = {groups[i] for i in ix}
        assert sum(1 for g in groups if g in members) == len(ix)  # whole groups only
    if equal_counts:
        assert max(p.counts) - min(p.counts) <= group_size
    best = brute_force_max_work(works, num_ranks, equal_counts=equal_counts, groups=groups)
    assert max(p.work) <= best * 1.01
