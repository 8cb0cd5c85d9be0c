"""Collectives across nodes priced by where a group's ranks sit (issue 17).

Oracles: ranks per node counted by hand for a few layouts, and the gradient
reduction of a training call equal to the cost model's spanning all-reduce of the
gradient bytes, which the cost model's own test checks against a hand-computed
roofline (tests/test_costmodel.py)."""

import pytest

from placeflow.catalogue import get_model
from placeflow.layout import GenLayout, TrainLayout
from placeflow.plan import RoleParallelism
from placeflow.profiles.registry import fitted_cost_model
from placeflow.profiles.schema import CollectiveKind, Scope
from placeflow.simulator import callcosts
from placeflow.simulator.rolecosts import (
    dp_ranks_per_node,
    dp_scope,
    fewest_ranks_per_node,
    reshard_placement,
    rollout_sync_cost,
)


@pytest.mark.parametrize(
    ("layout", "first_device", "want"),
    [
        (TrainLayout(t=2, d=16), 0, 4),  # stride 2: 4 of each DP group per node of 8
        (TrainLayout(t=8, d=4), 0, 1),  # one rank of each DP group per node
        (TrainLayout(d=8), 4, 4),  # devices 4..11: 4 on each of two nodes
        (TrainLayout(d=8), 2, 2),  # devices 2..9: 6 and 2, the NICs of the 2 bound
        (TrainLayout(d=4), 0, 4),  # within one node: the whole group
    ],
)
def test_ranks_per_node_counted_by_hand(layout, first_device, want):
    assert dp_ranks_per_node(first_device, 8, layout) == want
    assert fewest_ranks_per_node(first_device, 8, layout.dp_groups()) == want


def test_gradient_reduction_uses_every_nic_of_the_group():
    cm = fitted_cost_model("a100-80gb")
    model = get_model("llama-2-7b")
    par = RoleParallelism(train=TrainLayout(t=2, d=16), micro_batch=1, zero=0, recompute=False)
    scope = dp_scope(0, 8, par.train)
    assert scope is Scope.INTER
    rpn = dp_ranks_per_node(0, 8, par.train)

    def sync_s(ranks_per_node: int) -> float:
        cost = callcosts.train_cost(
            cm, model, par, 64, 512, 1, 1, scope, value_head=False,
            dp_ranks_per_node=ranks_per_node,
        )  # fmt: skip
        return float(cost.detail["dp_sync_s"])

    grad_bytes = (model.num_params() // 2) * model.dtype.num_bytes  # a t = 2 shard
    spanning = cm.collective_s(CollectiveKind.ALL_REDUCE, grad_bytes, 16, scope, ranks_per_node=4)
    flat = cm.collective_s(CollectiveKind.ALL_REDUCE, grad_bytes, 16, scope)
    assert sync_s(rpn) == pytest.approx(spanning, rel=1e-9)
    assert sync_s(1) == pytest.approx(flat, rel=1e-9)
    # Four NICs per node carry the 6.7 GB of gradients: far less than one NIC alone.
    assert sync_s(rpn) < flat / 3


@pytest.mark.parametrize(
    ("gen", "first_device", "want"),
    [
        # tg = 1 gathers a replica's 8 TP shards: ranks 0..7 on devices 4..11, 4 per node.
        (GenLayout(train=TrainLayout(t=8, d=2)), 4, (Scope.INTER, 4)),
        # the same from device 0: each group within one node.
        (GenLayout(train=TrainLayout(t=8, d=2)), 0, (Scope.INTRA, 8)),
        # t = 8, p = 2 into one generation shard: 16 ranks, 8 on each of two nodes.
        (GenLayout(train=TrainLayout(t=8, p=2)), 0, (Scope.INTER, 8)),
        # tg = 4: groups of t/tg = 2 neighbours, (0, 1) on devices 7 and 8: one per node.
        (GenLayout(train=TrainLayout(t=8, d=1), tg=4), 7, (Scope.INTER, 1)),
    ],
)
def test_reshard_groups_counted_by_hand(gen, first_device, want):
    assert reshard_placement(first_device, 8, gen) == want


def test_reshard_across_nodes_uses_the_nics_of_its_groups():
    """A reshard whose micro-DP groups span two nodes with 4 ranks on each: each slot's
    all-gather is the cost model's spanning all-gather with 4 ranks per node (which
    tests/test_costmodel.py checks by hand), cheaper than one rank per node."""
    cm = fitted_cost_model("a100-80gb")
    model = get_model("llama-2-7b")
    gen = GenLayout(train=TrainLayout(t=8, d=2))
    scope, per_node = reshard_placement(4, 8, gen)
    spread = rollout_sync_cost(cm, model, gen, scope, ranks_per_node=per_node)
    single = rollout_sync_cost(cm, model, gen, scope)
    transfer = callcosts.colocated_transfer(model, 1, 8, 1, 1)
    assert transfer is not None

    def gathers(ranks_per_node: int) -> float:
        return sum(
            n * cm.collective_s(
                CollectiveKind.ALL_GATHER, size, transfer.group_size, Scope.INTER,
                ranks_per_node=ranks_per_node,
            )
            for size, n in transfer.slots
        )  # fmt: skip

    load = spread.detail["load_s"]
    assert spread.time_s == pytest.approx(gathers(4) + load, rel=1e-9)
    assert single.time_s == pytest.approx(gathers(1) + load, rel=1e-9)
    assert spread.time_s < single.time_s
