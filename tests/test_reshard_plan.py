"""The pure transfer plans on catalogue models, and the simulator costing from them."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from reshard_worlds import take

from placeflow.catalogue import CATALOGUE, get_model
from placeflow.errors import SpecError
from placeflow.layout import (
    GenLayout,
    TrainLayout,
    colocated_transfer_bytes_per_rank,
    disjoint_transfer_bytes_per_gen_rank,
)
from placeflow.profiles.registry import fitted_cost_model
from placeflow.profiles.schema import Scope
from placeflow.reshard_plan import (
    GeneratorLayout,
    Sharding,
    TinyLlama,
    gen_shard,
    placements,
    plan_disjoint,
    plan_reshard,
    train_shard,
)
from placeflow.simulator import callcosts

DENSE = sorted(n for n, m in CATALOGUE.items() if m.features <= TinyLlama.SUPPORTED)


@pytest.mark.parametrize("name", DENSE)
def test_model_spec_weights_match_its_parameter_count(name):
    spec = get_model(name)
    model = TinyLlama.from_model_spec(spec)
    assert model.total_bytes() == spec.num_bytes()
    names = {p.name for p in model.params()}
    assert ("lm_head" in names) == (not spec.tied_embeddings)
    assert ("layers.0.qkv_bias" in names) == spec.qkv_bias
    assert ("layers.0.q_norm" in names) == spec.qk_norm


def test_qwen3_layout_splits_its_wider_heads():
    # Qwen3-32B: 64 query heads of 128 on a hidden size of 5,120.
    model = TinyLlama.from_model_spec(get_model("qwen3-32b"))
    qkv = next(p for p in model.params() if p.name == "layers.0.qkv")
    assert qkv.shape == (64 * 128 + 2 * 8 * 128, 5120) and qkv.parts == (8192, 1024, 1024)
    model.check_layout(TrainLayout(p=2, t=8, d=1))


def test_latent_attention_is_refused_by_name():
    with pytest.raises(SpecError, match="does not support yet"):
        TinyLlama.from_model_spec(get_model("deepseek-v3"))


def test_experts_are_weights_of_their_own_counted_as_the_spec_counts():
    spec = get_model("qwen3-30b-a3b")
    model = TinyLlama.from_model_spec(spec)
    assert model.total_bytes() == spec.num_params() * spec.dtype.num_bytes
    assert sum(p.expert >= 0 for p in model.params()) == 2 * 128 * spec.num_moe_layers


def test_qwen2_bias_is_split_like_qkv():
    model = TinyLlama.from_model_spec(get_model("tiny-qwen2"))
    bias = next(p for p in model.params() if p.name == "layers.0.qkv_bias")
    qkv = next(p for p in model.params() if p.name == "layers.0.qkv")
    assert bias.sharding is Sharding.COLUMN and bias.parts == qkv.parts


@pytest.mark.parametrize(
    ("name", "p", "t", "tg", "pg"),
    [("llama-2-7b", 1, 8, 2, 1), ("qwen2.5-7b", 2, 4, 1, 1), ("llama-3.1-8b", 4, 2, 2, 2)],
)
def test_simulator_reshard_bytes_are_the_plans(name, p, t, tg, pg):
    spec = get_model(name)
    gen = GenLayout(train=TrainLayout(p=p, t=t, d=2), tg=tg, pg=pg)
    plan = plan_reshard(TinyLlama.from_model_spec(spec), gen)
    cost = callcosts.reshard_cost(fitted_cost_model("h100-sxm"), spec, gen, Scope.INTRA)
    received = max(r.received_sharded_bytes + r.received_replicated_bytes for r in plan.ranks)
    assert cost.detail["bytes_received_per_gpu"] == received
    assert cost.detail["buckets"] == max(len(g.slots) for g in plan.groups)
    # The sharded part is HybridFlow's formula on average (stages holding the
    # embedding or lm_head receive more when pg < p); norms are the only addition.
    sharded = colocated_transfer_bytes_per_rank(
        TinyLlama.from_model_spec(spec).total_bytes(sharded_only=True), gen
    )
    mean = sum(r.received_sharded_bytes for r in plan.ranks) / len(plan.ranks)
    assert mean == pytest.approx(sharded)
    assert cost.time_s > 0


def test_reshard_falls_back_when_tp_exceeds_kv_heads():
    spec = get_model("smollm2-135m")  # 3 KV heads
    gen = GenLayout(train=TrainLayout(t=6), tg=3)
    cost = callcosts.reshard_cost(fitted_cost_model("h100-sxm"), spec, gen, Scope.INTRA)
    assert cost.detail["bytes_received_per_gpu"] == pytest.approx(
        colocated_transfer_bytes_per_rank(spec.num_bytes(), gen)
    )


# --- disjoint device sets -----------------------------------------------------

SMALL = TinyLlama(num_layers=4, hidden=64, num_heads=8, num_kv_heads=4, ffn=128, vocab=96)

DISJOINT = [
    (TrainLayout(p=p, t=t, d=d), GeneratorLayout(tg=tg, pg=pg, replicas=r))
    for p, t, d in itertools.product((1, 2), (1, 2, 4), (1, 2))
    for tg, pg, r in itertools.product((1, 2, 4), (1, 2), (1, 3))
]


def _idx(shape: tuple[int, ...]) -> torch.Tensor:
    return torch.arange(math.prod(shape)).view(shape)


@pytest.mark.parametrize(("train", "gen"), DISJOINT, ids=str)
def test_disjoint_plan_delivers_each_generation_shard_from_its_holders(train, gen):
    plan = plan_disjoint(SMALL, train, gen, bucket_bytes=4096)
    layout = GenLayout(train=TrainLayout(p=gen.pg, t=gen.tg), tg=gen.tg, pg=gen.pg)
    for transfer in plan.ranks:
        _, gpp, gtp = gen.coords(transfer.rank)
        for param in SMALL.params():
            sends = [s for b in transfer.buckets for s in b.sends if s.param == param]
            want = gen_shard(SMALL, param, layout, layout.train.rank(pp=gpp, tp=gtp, dp=0))
            assert bool(sends) == (want is not None), param.name
            if want is None:
                continue
            idx = _idx(param.shape)
            got = torch.empty_like(take(idx, param, want))
            for s in sends:
                held = train_shard(SMALL, param, train, s.src)
                assert held is not None  # the sender holds the slice it sends
                assert placements((s.rows,), held)  # ... inside its training shard
                got.narrow(param.dim, s.dst_start, s.rows.length).copy_(take(idx, param, (s.rows,)))
            assert torch.equal(got, take(idx, param, want)), param.name


@pytest.mark.parametrize(("train", "gen"), DISJOINT, ids=str)
def test_disjoint_bytes_per_generator_rank(train, gen):
    plan = plan_disjoint(SMALL, train, gen, bucket_bytes=4096)
    sharded = disjoint_transfer_bytes_per_gen_rank(
        SMALL.total_bytes(sharded_only=True), gen.tg, gen.pg
    )
    per_rank = [t.received_sharded_bytes for t in plan.ranks]
    assert sum(per_rank) / len(per_rank) == pytest.approx(sharded)
    if gen.pg == 1:
        assert set(per_rank) == {sharded}
    for t in plan.ranks:
        assert sum(b.num_bytes for b in t.buckets) == (
            t.received_sharded_bytes + t.received_replicated_bytes
        )
        assert all(0 < b.num_bytes <= 4096 for b in t.buckets)


def test_tensors_larger_than_a_bucket_are_split_across_buckets():
    train, gen = TrainLayout(), GeneratorLayout()
    plan = plan_disjoint(SMALL, train, gen, bucket_bytes=1024)
    embed_rows = [s.rows for b in plan.ranks[0].buckets for s in b.sends if s.param.name == "embed"]
    assert len(embed_rows) == 96 * 64 * 4 // 1024  # 24 KiB over 1 KiB buckets
    assert sum(r.length for r in embed_rows) == 96
    with pytest.raises(SpecError, match="smaller than one row"):
        plan_disjoint(SMALL, train, gen, bucket_bytes=128)


def test_simulator_weight_sync_bytes_are_the_plans():
    spec = get_model("llama-2-7b")
    cost = callcosts.weight_sync_cost(fitted_cost_model("h100-sxm"), spec, 2, 1, Scope.INTER)
    plan = plan_disjoint(
        TinyLlama.from_model_spec(spec),
        TrainLayout(),
        GeneratorLayout(tg=2),
        callcosts.WEIGHT_SYNC_BUCKET_BYTES,
    )
    top = max(plan.ranks, key=lambda t: sum(b.num_bytes for b in t.buckets))
    assert cost.detail["bytes_per_gen_rank"] == sum(b.num_bytes for b in top.buckets)
    assert cost.detail["buckets"] == len(top.buckets)
    assert cost.detail["bytes_per_gen_rank"] == pytest.approx(spec.num_bytes() / 2, rel=1e-3)
