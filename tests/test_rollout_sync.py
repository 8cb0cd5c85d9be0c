"""The rollout's sync: a colocated reshard where the layouts call for one, and always the
load of the generation shard into the rollout engine (`rolecosts.rollout_sync_cost`); a
generator set's weight sync with its copies, its host work per tensor and the same load
(`weight_sync_cost`)."""

from __future__ import annotations

import math

import pytest

from placeflow.catalogue import get_model
from placeflow.layout import GenLayout, TrainLayout
from placeflow.profiles.registry import fitted_cost_model
from placeflow.profiles.schema import CollectiveKind, ElementwiseKind, FrameworkKind, Scope
from placeflow.simulator import callcosts
from placeflow.simulator.rolecosts import needs_reshard, rollout_sync_cost

# tiny-llama by hand: a layer's q and o 128x128, k and v 128x64, gate, up and down
# 128x352, two norms of 128; outside the layers the embedding and the head (256x128
# each) and the final norm. fp32.
TINY_LAYER_BYTES = 4 * (2 * 128 * 128 + 2 * 128 * 64 + 3 * 128 * 352 + 2 * 128)
TINY_OUTSIDE_BYTES = 4 * (2 * 256 * 128 + 128)


def test_load_is_a_streamed_copy_and_the_engines_work_per_tensor_on_cpu() -> None:
    cpu = fitted_cost_model("cpu")
    model = get_model("tiny-llama-m")  # 4 layers: 2 per generation stage with pg = 2
    layer_entry = cpu.framework_s(FrameworkKind.LOAD_LAYER)
    call_entry = cpu.framework_s(FrameworkKind.LOAD_CALL)
    assert layer_entry is not None and call_entry is not None
    tiny = get_model("tiny-llama")
    assert tiny.num_bytes() == 2 * TINY_LAYER_BYTES + TINY_OUTSIDE_BYTES
    # The entries were timed on tiny-llama, its copies inside: those come off.
    per_layer = layer_entry - cpu.copy_s("h2d", TINY_LAYER_BYTES)
    per_call = call_entry - cpu.copy_s("h2d", TINY_OUTSIDE_BYTES)
    assert per_layer > 0 and per_call > 0
    shard = model.num_bytes() / 2
    expected = cpu.stream_copy_s("h2d", int(shard)) + 2 * per_layer + per_call
    assert callcosts.rollout_load_s(cpu, model, 1, 2) == pytest.approx(expected)


def test_load_is_a_device_pass_on_gpu() -> None:
    gpu = fitted_cost_model("a100-80gb")  # no framework entries: the pass alone
    model = get_model("llama-2-7b")
    # A copy of C bytes moves 2C: an add of 2C/3 input bytes (reads 2 inputs, writes 1
    # output) moves the same.
    c = model.num_bytes() / 2
    add = gpu.elementwise_s(ElementwiseKind.ADD, math.ceil(2 * c / 3))
    assert callcosts.rollout_load_s(gpu, model, 2, 1) == pytest.approx(add)
    assert callcosts.device_copy_s(gpu, 0) == 0.0


def test_a_generators_weight_sync_packs_sends_unpacks_and_loads() -> None:
    """One generator rank (tg = pg = 1) of tiny-llama: its 1.7 MB in one bucket, one
    message; packed by the trainer and copied into the shard by the generator (two
    streamed copies of the bytes), then loaded into the rollout engine."""
    cpu = fitted_cost_model("cpu")
    model = get_model("tiny-llama")
    cost = callcosts.weight_sync_cost(cpu, model, 1, 1, Scope.INTRA)
    size = model.num_bytes()
    message = cpu.collective_s(CollectiveKind.BROADCAST, size, 2, Scope.INTRA)
    copies = 2 * cpu.stream_copy_s("h2d", size)
    load = callcosts.rollout_load_s(cpu, model, 1, 1)
    host = callcosts.sync_host_s(cpu, model, 1)
    assert cost.detail["buckets"] == 1
    assert cost.time_s == pytest.approx(message + copies + host + load)
    assert cost.detail["copies_s"] == pytest.approx(copies)
    assert cost.detail["host_s"] == pytest.approx(host)
    assert cost.detail["load_s"] == pytest.approx(load)


def test_the_weight_syncs_host_work_is_per_layer_of_the_stage_and_per_call() -> None:
    """The entries were timed through `sync_disjoint` on tiny-llama with its three copies
    of the bytes (pack, loopback message, unpack) inside: those come off; then each layer
    of the generator rank's stage (tiny-llama-m: 4 layers, 2 per stage with pg = 2) and
    the call once. A GPU profile has no such entries: no host work."""
    cpu = fitted_cost_model("cpu")
    layer_entry = cpu.framework_s(FrameworkKind.SYNC_LAYER)
    call_entry = cpu.framework_s(FrameworkKind.SYNC_CALL)
    assert layer_entry is not None and call_entry is not None
    per_layer = layer_entry - 3 * cpu.copy_s("h2d", TINY_LAYER_BYTES)
    per_call = call_entry - 3 * cpu.copy_s("h2d", TINY_OUTSIDE_BYTES)
    assert per_layer > 0 and per_call > 0
    model = get_model("tiny-llama-m")
    assert callcosts.sync_host_s(cpu, model, 2) == pytest.approx(2 * per_layer + per_call)
    assert callcosts.sync_host_s(cpu, model, 1) == pytest.approx(4 * per_layer + per_call)
    assert callcosts.sync_host_s(fitted_cost_model("a100-80gb"), model, 1) == 0.0


def test_sync_without_a_reshard_is_the_load_of_the_generation_shard() -> None:
    cm = fitted_cost_model("a100-80gb")
    model = get_model("llama-2-7b")
    gen = GenLayout(train=TrainLayout(t=2, d=4), tg=2)  # tg = t: nothing moves
    assert not needs_reshard(gen, 1)
    cost = rollout_sync_cost(cm, model, gen, Scope.INTRA)
    shard = model.num_bytes() / 2  # M / (tg * pg)
    load = cm.elementwise_s(ElementwiseKind.ADD, math.ceil(2 * shard / 3))
    assert load == pytest.approx(callcosts.rollout_load_s(cm, model, 2, 1))
    assert cost.time_s == pytest.approx(load)
    assert cost.busy_s == cost.time_s and cost.detail["load_s"] == pytest.approx(load)
    assert cost.transient_bytes == 0.0


def test_sync_with_a_reshard_adds_the_load_to_the_gather() -> None:
    cm = fitted_cost_model("a100-80gb")
    model = get_model("llama-2-7b")
    gen = GenLayout(train=TrainLayout(t=4, d=2), tg=2)  # dg = 2: gather pairs of shards
    assert needs_reshard(gen, 1)
    gather = callcosts.reshard_cost(cm, model, gen, Scope.INTRA)
    cost = rollout_sync_cost(cm, model, gen, Scope.INTRA)
    load = callcosts.rollout_load_s(cm, model, 2, 1)
    assert load > 0
    assert cost.time_s == pytest.approx(gather.time_s + load)
    assert cost.transient_bytes == gather.transient_bytes
    assert cost.detail["buckets"] == gather.detail["buckets"]


def test_the_weight_syncs_host_work_grows_with_the_slices_from_several_trainer_ranks() -> None:
    """With a TP-2 trainer each sharded tensor reaches the generator rank in two slices,
    one from each trainer rank: the host work (timed from one trainer rank) grows by the
    plan's slices over those of one trainer rank, counted here from the plans; the
    message bytes do not change."""
    from placeflow.reshard_plan import (
        WEIGHT_SYNC_BUCKET_BYTES,
        GeneratorLayout,
        TinyLlama,
        plan_disjoint,
    )

    cpu = fitted_cost_model("cpu")
    model = get_model("tiny-llama")

    def slices(train: TrainLayout) -> int:
        plan = plan_disjoint(
            TinyLlama.from_model_spec(model), train, GeneratorLayout(), WEIGHT_SYNC_BUCKET_BYTES
        )
        return sum(len(b.sends) for b in plan.ranks[0].buckets)

    one, two = slices(TrainLayout()), slices(TrainLayout(t=2))
    assert two > one
    base = callcosts.weight_sync_cost(cpu, model, 1, 1, Scope.INTRA)
    tp2 = callcosts.weight_sync_cost(cpu, model, 1, 1, Scope.INTRA, train=TrainLayout(t=2))
    assert tp2.detail["host_s"] == pytest.approx(base.detail["host_s"] * two / one)
    assert tp2.detail["bytes_per_gen_rank"] == base.detail["bytes_per_gen_rank"]
    assert tp2.time_s - tp2.detail["host_s"] == pytest.approx(base.time_s - base.detail["host_s"])
