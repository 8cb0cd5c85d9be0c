"""Colocated resharding: the plan against hand-sliced oracles, the gloo execution bit for bit."""

from __future__ import annotations

import itertools

import pytest
import torch
from reshard_worlds import Method, ReshardError, ReshardJob, full_params, run_world, take

from placeflow.errors import SpecError
from placeflow.layout import GenLayout, TrainLayout, colocated_transfer_bytes_per_rank
from placeflow.procs import free_port
from placeflow.reshard_plan import (
    Sharding,
    TinyLlama,
    gen_shard,
    plan_reshard,
    split_ranges,
    train_shard,
)

MODEL = TinyLlama(num_layers=4, hidden=64, num_heads=8, num_kv_heads=4, ffn=128, vocab=96)
SEED = 7

CASES = [
    GenLayout(train=TrainLayout(p=p, t=t, d=d), tg=tg, pg=pg)
    for p, t, d in itertools.product((1, 2), (1, 2, 4), (1, 2))
    if p * t * d <= 8
    for pg in (1, 2)
    for tg in (1, 2, 4)
    if p % pg == 0 and t % tg == 0
]


def case_id(gen: GenLayout) -> str:
    tr = gen.train
    return f"p{tr.p}t{tr.t}d{tr.d}-pg{gen.pg}tg{gen.tg}"


def oracle(model: TinyLlama, full: dict[str, torch.Tensor], gen: GenLayout, rank: int):
    """Generation weights of `rank`, sliced by hand (no plan ranges): the test's oracle.

    Every weight is cut by tg alone, so a mixture of experts' generation shard holds
    every expert (`tests/test_moe_exec.py` uses it for expert reshards too)."""
    _, gpp, gtp = gen.coords(rank)
    per_stage = model.num_layers // gen.pg
    q = model.num_heads * model.head_dim
    kv = model.num_kv_heads * model.head_dim
    out = {}
    for name, w in full.items():
        layer = int(name.split(".")[1]) if name.startswith("layers.") else None
        first, last = gpp == 0, gpp == gen.pg - 1
        if layer is not None and layer // per_stage != gpp:
            continue
        if (name == "embed" and not first) or (name in ("norm", "lm_head") and not last):
            continue
        if name.endswith("qkv"):
            out[name] = torch.cat([x.chunk(gen.tg)[gtp] for x in w.split([q, kv, kv])])
        elif name.endswith("gate_up"):
            out[name] = torch.cat([x.chunk(gen.tg)[gtp] for x in w.chunk(2)])
        elif name.endswith(("o_proj", "down_proj", "_down", ".down")):  # dense, shared, expert
            out[name] = w.chunk(gen.tg, dim=1)[gtp]
        elif name in ("embed", "lm_head"):
            out[name] = w.chunk(gen.tg)[gtp]
        else:
            out[name] = w
    return out


# --- the plan, without processes -------------------------------------------------


def _indices(shape: tuple[int, ...]) -> torch.Tensor:
    n = 1
    for s in shape:
        n *= s
    return torch.arange(n).view(shape)


@pytest.mark.parametrize("gen", CASES, ids=case_id)
def test_training_shards_partition_each_weight(gen):
    train = gen.train
    for param in MODEL.params():
        idx = _indices(param.shape)
        stage = param.stage(train.stage_layers(MODEL.num_layers))
        held = [
            take(idx, param, ranges).flatten()
            for tp in range(train.t)
            if (ranges := train_shard(MODEL, param, train, train.rank(pp=stage, tp=tp, dp=0)))
        ]
        if param.sharding is Sharding.REPLICATED:
            assert all(torch.equal(h, idx.flatten()) for h in held)
        else:
            assert torch.equal(torch.cat(held).sort().values, idx.flatten())


@pytest.mark.parametrize("gen", CASES, ids=case_id)
def test_generation_shard_is_the_union_of_its_micro_dp_group(gen):
    full = full_params(MODEL, SEED)
    for group in gen.micro_dp_groups():
        for rank in group:
            expected = oracle(MODEL, full, gen, rank)
            for param in MODEL.params():
                ranges = gen_shard(MODEL, param, gen, rank)
                assert (ranges is None) == (param.name not in expected)
                if ranges is None:
                    continue
                assert torch.equal(take(full[param.name], param, ranges), expected[param.name])
                idx = _indices(param.shape)
                held = [
                    take(idx, param, own).flatten()
                    for r in group
                    if (own := train_shard(MODEL, param, gen.train, r))
                ]
                union = torch.unique(torch.cat(held))  # sorted
                assert torch.equal(union, take(idx, param, ranges).flatten().sort().values)


@pytest.mark.parametrize("gen", CASES, ids=case_id)
def test_planned_bytes_follow_hybridflow(gen):
    plan = plan_reshard(MODEL, gen)
    sharded = colocated_transfer_bytes_per_rank(MODEL.total_bytes(sharded_only=True), gen)
    for r in plan.ranks:
        assert r.received_sharded_bytes == sharded
        # Norms move only when stages merge (pg < p), and are the only padding.
        assert (r.received_replicated_bytes == 0) == (gen.pg == gen.train.p)
        assert r.wire_bytes >= r.received_sharded_bytes + r.received_replicated_bytes


def test_fused_weights_are_split_part_by_part():
    full = full_params(MODEL, SEED)
    qkv = next(p for p in MODEL.params() if p.name == "layers.0.qkv")
    shard = take(full[qkv.name], qkv, split_ranges(qkv, 2, 0))
    assert shard.shape == full[qkv.name].chunk(2)[0].shape
    assert not torch.equal(shard, full[qkv.name].chunk(2)[0])


def test_layout_that_splits_a_kv_head_is_refused():
    with pytest.raises(SpecError, match="multiple of t=8"):
        plan_reshard(MODEL, GenLayout(train=TrainLayout(t=8), tg=2))


# --- gloo, one process per rank -----------------------------------------------------


@pytest.fixture(scope="module", params=[2, 4, 8], ids=lambda w: f"world{w}")
def world(request):
    """All cases of one world size in one spawned world (spawning costs seconds)."""
    cases = tuple(g for g in CASES if g.train.world_size == request.param)
    job = ReshardJob(
        model=MODEL,
        cases=cases,
        methods=(Method.PLANNED, Method.NAIVE),
        world_size=request.param,
        port=free_port(),
        seed=SEED,
        return_params=True,
    )
    return job, run_world(job)


def test_reshard_is_bit_exact_and_within_budget(world):
    job, results = world
    full = full_params(MODEL, SEED)
    assert len(results) == len(job.cases) * len(job.methods) * job.world_size
    for res in results:
        gen = job.cases[res.case]
        plan = plan_reshard(MODEL, gen).ranks[res.rank]
        expected = oracle(MODEL, full, gen, res.rank)
        got = {k: torch.from_numpy(v) for k, v in res.gen_params.items()}
        assert got.keys() == expected.keys(), case_id(gen)
        for name, w in expected.items():
            assert torch.equal(got[name], w), (case_id(gen), res.method, res.rank, name)
        if res.method is Method.PLANNED:
            assert res.moved_bytes == plan.wire_bytes
            assert res.peak_extra_bytes <= plan.gen_shard_bytes + plan.bucket_bytes


def test_planned_moves_less_than_naive(world):
    job, results = world
    by_key = {(r.case, r.rank, r.method): r for r in results}
    for case, rank in itertools.product(range(len(job.cases)), range(job.world_size)):
        planned = by_key[case, rank, Method.PLANNED]
        naive = by_key[case, rank, Method.NAIVE]
        assert planned.moved_bytes < naive.moved_bytes
        assert planned.peak_extra_bytes <= naive.peak_extra_bytes


def _failing_worker(rank, job, results):
    results.put(("error", rank, "boom"))
    raise SystemExit(1)


def test_a_failing_rank_is_reported():
    gen = GenLayout(train=TrainLayout(t=2), tg=1)
    job = ReshardJob(
        model=MODEL, cases=(gen,), methods=(Method.PLANNED,), world_size=2, port=free_port()
    )
    with pytest.raises(ReshardError, match="boom"):
        run_world(job, worker=_failing_worker)
