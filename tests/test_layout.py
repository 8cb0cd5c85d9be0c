"""Layout math: HybridFlow's grouping and transition volumes, checked by enumeration."""

import itertools

import pytest

from placeflow.errors import SpecError
from placeflow.layout import (
    GenLayout,
    TrainLayout,
    colocated_transfer_bytes_per_rank,
    generation_shard_bytes,
    generator_stage_layers,
    stage_of_layer,
)

LAYOUTS = [
    (p, t, d, pg, tg)
    for p, t, d in itertools.product((1, 2, 4), (1, 2, 4, 8), (1, 2))
    if p * t * d <= 16
    for pg in (1, 2, 4)
    for tg in (1, 2, 4, 8)
    if p % pg == 0 and t % tg == 0
]


def test_hybridflow_7b_transition_volume():
    # HybridFlow: 7B trained with t=8, p=1, generating with tg=2 moves 0.375 M per GPU.
    gen = GenLayout(train=TrainLayout(p=1, t=8, d=1), tg=2, pg=1)
    assert colocated_transfer_bytes_per_rank(1_000_000, gen) == pytest.approx(375_000)
    assert generation_shard_bytes(1_000_000, gen) == pytest.approx(500_000)


@pytest.mark.parametrize(("p", "t", "d", "pg", "tg"), LAYOUTS)
def test_grouping_properties(p, t, d, pg, tg):
    train = TrainLayout(p=p, t=t, d=d)
    gen = GenLayout(train=train, tg=tg, pg=pg)
    world = set(range(train.world_size))
    micro = gen.micro_dp_groups()
    tp_groups = gen.tp_groups()
    # Both families partition the ranks.
    assert sorted(r for g in micro for r in g) == sorted(world)
    assert sorted(r for g in tp_groups for r in g) == sorted(world)
    assert all(len(g) == gen.dg for g in micro)
    assert len(tp_groups) == gen.num_replicas * pg and all(len(g) == tg for g in tp_groups)
    for group in micro:
        # Every rank of a micro-DP group needs the same generation shard, and the
        # group's training shards are exactly that shard's pieces.
        needs = {tuple(gen.train_shards_of(r)) for r in group}
        assert len(needs) == 1
        held = sorted((train.coords(r)[0], train.coords(r)[1]) for r in group)
        assert held == sorted(next(iter(needs)))
    # Bytes received per rank by the all-gather = (dg - 1) shards of M/(t p).
    model_bytes = 2**20 * 3 * 5 * 7
    expected = (gen.dg - 1) * model_bytes / (t * p)
    assert colocated_transfer_bytes_per_rank(model_bytes, gen) == pytest.approx(expected)


def test_rank_order_keeps_replicas_contiguous():
    train = TrainLayout(p=2, t=4, d=2)
    assert train.tp_groups()[0] == [0, 1, 2, 3]
    assert train.pp_groups()[0] == [0, 4]
    assert train.dp_groups()[0] == [0, 8]


def test_invalid_generation_layout():
    with pytest.raises(SpecError, match="tg=3 must divide training t=4"):
        GenLayout(train=TrainLayout(t=4), tg=3)


# --- expert parallelism ---------------------------------------------------------


def test_expert_groups_partition_ranks_and_cross_at_one_position() -> None:
    layout = TrainLayout(p=2, t=2, d=4, e=2)
    ep, edp = layout.ep_groups(), layout.expert_dp_groups()
    for groups, size in ((ep, 2), (edp, 2)):
        assert sorted(r for g in groups for r in g) == list(range(layout.world_size))
        assert all(len(g) == size for g in groups)
    # An EP group and an expert-DP group share exactly one rank.
    assert all(len(set(a) & set(b)) <= 1 for a in ep for b in edp)
    for group in ep:
        coords = [layout.coords(r) for r in group]
        assert len({(pp, tp) for pp, tp, _ in coords}) == 1  # same model shard position
        assert sorted(layout.ep_rank(r) for r in group) == [0, 1]
    for group in edp:
        assert len({layout.ep_rank(r) for r in group}) == 1  # same experts


def test_expert_parallel_must_divide_data_parallel() -> None:
    with pytest.raises(SpecError, match="e=3 must divide data parallel d=4"):
        TrainLayout(d=4, e=3)
    assert TrainLayout(d=4, e=4).expert_dp == 1


def test_uneven_stages_follow_megatrons_first_and_last_counts() -> None:
    """NeMo RL's DeepSeek-V3 split: 61 layers, p = 16, 3 on the first stage and 2 on
    the last, 4 on each of the 14 others."""
    deepseek = TrainLayout(p=16, first_stage_layers=3, last_stage_layers=2)
    assert deepseek.stage_layers(61) == (3,) + (4,) * 14 + (2,)
    assert deepseek.heaviest_stage_layers(61) == 4
    assert TrainLayout(p=4).stage_layers(8) == (2, 2, 2, 2)
    assert TrainLayout(p=3, first_stage_layers=1).stage_layers(7) == (1, 3, 3)
    assert TrainLayout(p=2, last_stage_layers=5).stage_layers(6) == (1, 5)
    # Every layer on exactly one stage, in order; the embedding first, the head last.
    stages = deepseek.stage_layers(61)
    owners = [stage_of_layer(layer, stages) for layer in range(61)]
    assert owners == sorted(owners) and [owners.count(s) for s in range(16)] == list(stages)
    assert stage_of_layer(-1, stages) == 0 and stage_of_layer(61, stages) == 15


@pytest.mark.parametrize(
    ("layout", "layers", "match"),
    [
        (TrainLayout(p=16), 61, "do not divide into 16 equal stages"),
        (TrainLayout(p=16, first_stage_layers=2, last_stage_layers=2), 61, "14 equal stages"),
        (TrainLayout(p=2, first_stage_layers=3), 3, "do not divide into 1 equal"),
    ],
)
def test_layers_that_do_not_split_are_refused(layout: TrainLayout, layers: int, match: str) -> None:
    with pytest.raises(SpecError, match=match):
        layout.stage_layers(layers)


def test_uneven_stage_knobs_are_validated() -> None:
    with pytest.raises(SpecError, match="need pipeline stages"):
        TrainLayout(p=1, first_stage_layers=2)
    with pytest.raises(SpecError, match="not both"):
        TrainLayout(p=2, first_stage_layers=2, last_stage_layers=2)
    with pytest.raises(SpecError, match="non-negative"):
        TrainLayout(p=2, last_stage_layers=-1)


def test_generation_stages_gather_consecutive_training_stages() -> None:
    deepseek = TrainLayout(p=16, t=8, d=2, first_stage_layers=3, last_stage_layers=2)
    assert GenLayout(train=deepseek, tg=8, pg=4).stage_layers(61) == (15, 16, 16, 14)
    assert GenLayout(train=deepseek, tg=8, pg=1).stage_layers(61) == (61,)
    assert GenLayout(train=TrainLayout(p=4), pg=2).stage_layers(8) == (4, 4)


def test_generator_stages_split_as_vllm_does() -> None:
    """vLLM's get_pp_indices: L // pg each, the remainder on the stages before the last."""
    assert generator_stage_layers(61, 4) == (15, 15, 16, 15)
    assert generator_stage_layers(10, 4) == (2, 3, 3, 2)
    assert generator_stage_layers(8, 4) == (2, 2, 2, 2)
    assert generator_stage_layers(5, 1) == (5,)
    with pytest.raises(SpecError, match="between 1 and the 3 layers"):
        generator_stage_layers(3, 4)
