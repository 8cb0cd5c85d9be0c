"""Dispatch bookkeeping without Ray: who gets which shard, who holds results, order restored."""

from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from placeflow.executor.balance import Partition, balanced_partition, positional_partition
from placeflow.executor.batch import Batch
from placeflow.executor.dispatch import (
    DispatchLayout,
    broadcast,
    collect,
    results_of_holders,
    split_by_dp,
)
from placeflow.layout import GenLayout, TrainLayout

LAYOUTS = [
    TrainLayout(p=p, t=t, d=d)
    for p, t, d in itertools.product((1, 2), (1, 2, 4), (1, 2, 3))
    if p * t * d <= 12
]


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda x: f"p{x.p}t{x.t}d{x.d}")
def test_train_dispatch_one_holder_per_model_parallel_group(layout):
    d = DispatchLayout.of_train(layout)
    assert d.num_ranks == layout.world_size and d.num_dp == layout.d
    for dp, holder in enumerate(d.result_ranks):
        pp, tp, rank_dp = layout.coords(holder)
        assert (pp, tp, rank_dp) == (layout.p - 1, 0, dp)  # tp 0 of the last stage
    for rank in range(layout.world_size):
        assert d.dp_rank[rank] == layout.coords(rank)[2]


def test_gen_dispatch_of_hybridflow_grouping():
    # t=4, d=2 trained; tg=2 generation: each training replica makes dg=2 generation
    # replicas whose TP groups are strided ({0, 2} and {1, 3} inside a replica).
    gen = GenLayout(train=TrainLayout(t=4, d=2), tg=2)
    d = DispatchLayout.of_gen(gen)
    assert d.num_dp == 4
    assert d.dp_rank == (0, 1, 0, 1, 2, 3, 2, 3)
    assert d.result_ranks == (0, 1, 4, 5)
    for replica, holder in enumerate(d.result_ranks):
        assert gen.coords(holder) == (replica, gen.pg - 1, 0)


def batch_of(n: int) -> Batch:
    return Batch(
        tensors={"x": torch.arange(n, dtype=torch.float32) * 10, "y": torch.arange(n)[:, None]},
        meta={"sample_id": tuple(range(n))},
    )


def fake_worker(rank: int, shard: Batch) -> Batch:
    """Stands in for a remote call: a per-sample result computed from the shard, tagged."""
    return Batch(
        tensors={"x2": shard.tensors["x"] * 2, "rank": torch.full((len(shard),), rank)},
        meta=shard.meta,
    )


def test_split_gives_each_replica_its_shard_and_broadcast_everyone():
    layout = DispatchLayout.of_train(TrainLayout(t=2, d=2))
    partition = Partition(indices=((1, 3), (0, 2, 4)), work=(0.0, 0.0))
    shards = split_by_dp(batch_of(5), layout, partition)
    assert [list(s.meta["sample_id"]) for s in shards] == [[1, 3], [1, 3], [0, 2, 4], [0, 2, 4]]
    assert shards[0] is shards[1]  # TP ranks of a replica share one selected shard
    assert broadcast(layout, "w") == ["w"] * 4
    with pytest.raises(ValueError, match="data-parallel"):
        split_by_dp(batch_of(5), layout, positional_partition([1.0] * 5, 3))
    with pytest.raises(ValueError, match="covers"):
        split_by_dp(batch_of(6), layout, partition)


@settings(max_examples=60, deadline=None)
@given(
    layout=st.sampled_from(LAYOUTS),
    n=st.integers(0, 40),
    seed=st.integers(0, 1000),
    balanced=st.booleans(),
)
def test_split_then_collect_restores_order_and_content(layout, n, seed, balanced):
    dispatch = DispatchLayout.of_train(layout)
    works = [float((seed * 7919 + i * 104729) % 97) for i in range(n)]
    partition = (
        balanced_partition(works, dispatch.num_dp)
        if balanced
        else positional_partition(works, dispatch.num_dp)
    )
    batch = batch_of(n)
    shards = split_by_dp(batch, dispatch, partition)
    results = [fake_worker(rank, shard) for rank, shard in enumerate(shards)]
    out = collect(dispatch, results, partition)
    assert out.meta["sample_id"] == tuple(range(n))
    assert torch.equal(out.tensors["x2"], batch.tensors["x"] * 2)
    # Every sample's result came from the holder of the replica it was sent to.
    for dp, ix in enumerate(partition.indices):
        for i in ix:
            assert out.tensors["rank"][i].item() == dispatch.result_ranks[dp]


def test_collect_reads_holders_only_and_checks_their_sizes():
    dispatch = DispatchLayout.of_train(TrainLayout(t=2, d=2))
    partition = positional_partition([1.0] * 4, 2)
    shards = split_by_dp(batch_of(4), dispatch, partition)
    results = [fake_worker(r, s) for r, s in enumerate(shards)]
    assert results_of_holders(dispatch, ["a", "b", "c", "d"]) == ["a", "c"]
    results[1] = fake_worker(1, batch_of(0))  # a non-holder's result is not read
    assert len(collect(dispatch, results, partition)) == 4
    results[2] = fake_worker(2, batch_of(1))
    with pytest.raises(ValueError, match=r"rank 2 \(dp 1\) returned 1 samples"):
        collect(dispatch, results, partition)
    with pytest.raises(ValueError, match="results for 4 ranks"):
        collect(dispatch, results[:3], partition)
