"""ZeRO-3's collectives as the executor's FSDP2 and its reshard run them, counted.

Oracle: tiny-llama's weights by hand (a layer's fused qkv 256x128, o 128x128, fused
gate_up 704x128, down 128x352 and two norms of 128; outside the layers the embedding
and the head, 256x128 each, and the final norm), fp32, and the collectives FSDP2
issues per unit (`fully_shard` on each layer and the root), counted on paper.
"""

from __future__ import annotations

from collections import Counter

from test_lora import FlopCostModel

from placeflow.catalogue import get_model
from placeflow.layout import GenLayout, TrainLayout
from placeflow.plan import RoleParallelism
from placeflow.profiles.schema import CollectiveKind, Scope
from placeflow.simulator import callcosts

MODEL = get_model("tiny-llama")  # 2 layers
LAYER = 4 * (256 * 128 + 128 * 128 + 704 * 128 + 128 * 352 + 2 * 128)
ROOT = 4 * (2 * 256 * 128 + 128)
AG, RS = CollectiveKind.ALL_GATHER, CollectiveKind.REDUCE_SCATTER


class Priced(FlopCostModel):
    """Each collective priced so that a total counts them: an all-gather 1 s, a
    reduce-scatter 1,000 s; of the root's bytes 100 times that; any other size 10^6 s."""

    def collective_s(self, kind, num_bytes, world_size, scope, *, ranks_per_node=1, after_s=None):  # type: ignore[no-untyped-def]
        if world_size <= 1 or num_bytes <= 0:
            return 0.0
        unit = {AG: 1.0, RS: 1000.0}.get(kind, 1e6)
        return unit * {LAYER: 1.0, ROOT: 100.0}.get(num_bytes, 1e6)


def _par(micro_batch: int, zero: int) -> RoleParallelism:
    return RoleParallelism(
        train=TrainLayout(d=2), micro_batch=micro_batch, zero=zero, recompute=False
    )


def test_the_hand_count_matches_the_model() -> None:
    assert MODEL.num_bytes() == 2 * LAYER + ROOT


def test_a_zero3_forward_gathers_each_layer_and_the_root_per_micro_batch() -> None:
    """16 samples over d = 2: 8 a rank, micro-batches of 4: 2 micro-batches, each
    gathering both layers (1 s each) and the root (100 s) over the 2 ranks."""

    def forward(zero: int) -> float:
        cost = callcosts.forward_cost(
            Priced(),  # type: ignore[arg-type]
            MODEL,
            _par(4, zero),
            16,
            32,
            value_head=False,
            trained=True,
        )
        return cost.time_s

    assert forward(3) - forward(1) == 2 * (2 * 1.0 + 100.0)


def test_a_zero3_update_gathers_twice_per_layer_and_reduces_once_per_step() -> None:
    """One optimizer step (one mini-batch) of 8 samples a rank in micro-batches of 4:
    each micro-batch gathers the 2 layers and the root for its forward and the 2 layers
    again for its backward; the gradients are reduce-scattered per unit once, on the
    last micro-batch; nothing is gathered after the optimizer step."""
    cost = callcosts.train_cost(
        Priced(),
        MODEL,
        _par(4, 3),
        16,
        32,
        1,
        1,
        Scope.INTRA,
        value_head=False,  # type: ignore[arg-type]
    )
    gathers = 2 * (2 * 2 * 1.0 + 100.0)
    reduces = 2 * 1000.0 + 100 * 1000.0
    assert cost.detail["dp_sync_s"] == gathers + reduces


def test_a_zero3_reshard_gathers_the_shard_one_tensor_at_a_time() -> None:
    """`tp_shards` under FSDP: `full_tensor` per weight, 15 all-gathers over d = 2 (6 per
    layer and 3 outside), each of that tensor's bytes; tg = t = 1, so nothing else."""
    cm = FlopCostModel()
    gen = GenLayout(train=TrainLayout(d=2), tg=1)
    callcosts.reshard_cost(cm, MODEL, gen, Scope.INTRA, train_zero=3)  # type: ignore[arg-type]
    per_layer = [256 * 128, 128 * 128, 704 * 128, 128 * 352, 128, 128]
    outside = [256 * 128, 256 * 128, 128]
    sizes = {(AG, 4 * n, 2) for n in 2 * per_layer + outside}
    assert set(cm.collectives) == sizes  # each size once: priced once, times its count
    tensors = callcosts.zero3_tensor_bytes(MODEL, gen.train)
    assert Counter(dict(tensors)) == Counter(4 * n for n in 2 * per_layer + outside)
