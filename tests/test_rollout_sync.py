"""The colocated rollout's sync: a reshard where the layouts call for one, and always the
load of the generation shard into the rollout engine (`rolecosts.rollout_sync_cost`)."""

from __future__ import annotations

import math

import pytest

from placeflow.catalogue import get_model
from placeflow.layout import GenLayout, TrainLayout
from placeflow.profiles.registry import fitted_cost_model
from placeflow.profiles.schema import ElementwiseKind, Scope
from placeflow.simulator import callcosts
from placeflow.simulator.rolecosts import needs_reshard, rollout_sync_cost


def test_load_is_a_host_copy_on_cpu_and_a_device_pass_on_gpu() -> None:
    cpu, gpu = fitted_cost_model("cpu"), fitted_cost_model("a100-80gb")
    # A host copy of 1 MiB: the CPU profile's own copy entry.
    assert callcosts.rollout_load_s(cpu, 2**20) == cpu.copy_s("h2d", 2**20)
    # On a GPU a copy of C bytes moves 2C: an add of 2C/3 input bytes (reads 2 inputs,
    # writes 1 output) moves the same.
    c = 3 * 2**30
    assert callcosts.rollout_load_s(gpu, c) == gpu.elementwise_s(ElementwiseKind.ADD, 2 * 2**30)
    assert callcosts.rollout_load_s(gpu, 0) == 0.0


def test_sync_without_a_reshard_is_the_load_of_the_generation_shard() -> None:
    cm = fitted_cost_model("a100-80gb")
    model = get_model("llama-2-7b")
    gen = GenLayout(train=TrainLayout(t=2, d=4), tg=2)  # tg = t: nothing moves
    assert not needs_reshard(gen, 1)
    cost = rollout_sync_cost(cm, model, gen, Scope.INTRA)
    shard = model.num_bytes() / 2  # M / (tg * pg)
    load = cm.elementwise_s(ElementwiseKind.ADD, math.ceil(2 * shard / 3))
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
    load = callcosts.rollout_load_s(cm, model.num_bytes() / 2)
    assert load > 0
    assert cost.time_s == pytest.approx(gather.time_s + load)
    assert cost.transient_bytes == gather.transient_bytes
    assert cost.detail["buckets"] == gather.detail["buckets"]
