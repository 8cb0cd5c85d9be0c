"""Named dispatch: what each rank of a worker group receives, and how results come back.

Pure bookkeeping, no Ray. The caller makes the remote calls itself, so every
`.remote(...)` stays visible where it happens (STYLE.md rule 10):

    shards = split_by_dp(batch, group.dispatch, partition)
    refs = [w.values.remote(group.role, s) for w, s in zip(group.workers, shards)]
    out = collect(group.dispatch, controller.gather(group, refs, Worker.values), partition)

A data-parallel (DP) replica is the set of ranks that work on one shard of the
samples together: its tensor- and pipeline-parallel ranks. Every rank of a
replica receives the replica's shard; one rank per replica holds the result
(tp rank 0 of the last pipeline stage, where the output appears), and
`collect` reads the results of those ranks only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

from placeflow.executor.balance import Partition
from placeflow.executor.batch import Batch
from placeflow.layout import GenLayout, TrainLayout

T = TypeVar("T")


@dataclass(frozen=True, kw_only=True)
class DispatchLayout:
    """The DP replica of every rank (`dp_rank[rank]`) and the rank that holds each replica's
    result (`result_ranks[dp]`)."""

    dp_rank: tuple[int, ...]
    result_ranks: tuple[int, ...]

    def __post_init__(self) -> None:
        assert sorted(set(self.dp_rank)) == list(range(len(self.result_ranks)))
        assert all(self.dp_rank[r] == dp for dp, r in enumerate(self.result_ranks))

    @property
    def num_ranks(self) -> int:
        return len(self.dp_rank)

    @property
    def num_dp(self) -> int:
        return len(self.result_ranks)

    @staticmethod
    def of_train(layout: TrainLayout) -> DispatchLayout:
        """Training p-t-d: replicas are the d data-parallel indices."""
        return DispatchLayout(
            dp_rank=tuple(layout.coords(r)[2] for r in range(layout.world_size)),
            result_ranks=tuple(layout.rank(pp=layout.p - 1, tp=0, dp=d) for d in range(layout.d)),
        )

    @staticmethod
    def of_gen(layout: GenLayout) -> DispatchLayout:
        """Generation pg-tg-dg-d: replicas are the d·dg generation replicas."""
        coords = [layout.coords(r) for r in range(layout.train.world_size)]
        holders = {
            replica: rank
            for rank, (replica, gpp, gtp) in enumerate(coords)
            if gpp == layout.pg - 1 and gtp == 0
        }
        return DispatchLayout(
            dp_rank=tuple(replica for replica, _, _ in coords),
            result_ranks=tuple(holders[i] for i in range(layout.num_replicas)),
        )


def broadcast(layout: DispatchLayout, value: T) -> list[T]:
    """The same value for every rank."""
    return [value] * layout.num_ranks


def split_by_dp(batch: Batch, layout: DispatchLayout, partition: Partition) -> list[Batch]:
    """One shard per rank: the samples `partition` gives the rank's DP replica.

    Ranks of one replica get the same Batch object (selected once).
    """
    if partition.num_ranks != layout.num_dp:
        raise ValueError(
            f"partition has {partition.num_ranks} shards for {layout.num_dp} data-parallel replicas"
        )
    if partition.num_samples != len(batch):
        raise ValueError(f"partition covers {partition.num_samples} samples of {len(batch)}")
    shards = [batch.select(ix) for ix in partition.indices]
    return [shards[dp] for dp in layout.dp_rank]


def results_of_holders(layout: DispatchLayout, results: Sequence[T]) -> list[T]:
    """The per-rank results of the ranks holding results, in DP order."""
    if len(results) != layout.num_ranks:
        raise ValueError(f"got {len(results)} results for {layout.num_ranks} ranks")
    return [results[r] for r in layout.result_ranks]


def collect(layout: DispatchLayout, results: Sequence[Batch], partition: Partition) -> Batch:
    """One Batch from the result-holding ranks, in the samples' original order."""
    shards = results_of_holders(layout, results)
    for dp, (shard, ix) in enumerate(zip(shards, partition.indices, strict=True)):
        if len(shard) != len(ix):
            raise ValueError(
                f"rank {layout.result_ranks[dp]} (dp {dp}) returned {len(shard)} samples "
                f"for a shard of {len(ix)}"
            )
    gathered = Batch.concat(shards)
    # Position p of `gathered` holds original sample `placed[p]`; invert that permutation.
    placed = [i for ix in partition.indices for i in ix]
    original = [0] * len(placed)
    for position, sample in enumerate(placed):
        original[sample] = position
    return gathered.reorder(original)
