"""Which pools and worker groups a plan makes, and the resource check, without Ray."""

from __future__ import annotations

from pathlib import Path

import pytest

from placeflow.errors import SpecError
from placeflow.executor.errors import InsufficientResourcesError
from placeflow.executor.groups import group_specs
from placeflow.executor.pools import bundle, check_resources, required_resources, strategy
from placeflow.hardware import DeviceKind
from placeflow.layout import TrainLayout
from placeflow.plan import load_plan
from placeflow.workload import Role

PLANS = Path(__file__).resolve().parents[1] / "examples" / "plans"


def test_colocated_roles_share_the_set_and_the_actor_generates_there(cpu4_plans):
    specs = group_specs(cpu4_plans["colocate"])
    assert [(s.role, s.set_index, s.generator) for s in specs] == [
        (Role.ACTOR, 0, False),
        (Role.REF, 0, False),
    ]
    actor, ref = specs
    assert actor.layout.train == TrainLayout(t=2, d=2)
    assert actor.layout.gen is not None and actor.gen_dispatch.num_dp == 4  # tg=1: dg=2
    assert actor.dispatch.result_ranks == (0, 2)
    assert ref.dispatch.result_ranks == (0, 1, 2, 3)
    with pytest.raises(ValueError, match="does not generate"):
        _ = ref.gen_dispatch


@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        ("split", [(Role.ACTOR, 0, 2), (Role.REF, 1, 2)]),
        ("standalone", [(Role.ACTOR, 0, 2), (Role.REF, 1, 1), (Role.REWARD, 2, 1)]),
    ],
)
def test_separate_sets_get_their_own_groups(cpu4_plans, kind, expected):
    specs = group_specs(cpu4_plans[kind])
    assert [(s.role, s.set_index, s.num_ranks) for s in specs] == expected


def test_a_generator_set_gets_its_own_actor_group(cpu4_plans):
    specs = group_specs(cpu4_plans["generator"])
    assert [(s.label, s.set_index) for s in specs] == [
        ("actor", 0),
        ("ref", 0),
        ("actor (generator)", 1),
    ]
    trainer, _, generator = specs
    assert trainer.layout.gen is None  # it does not generate on its own devices
    assert generator.layout.train == TrainLayout(t=2, d=1)
    assert generator.gen_dispatch.result_ranks == (0,)


def test_bundles_and_strategies():
    assert bundle(DeviceKind.CPU) == {"CPU": 1.0}
    assert bundle(DeviceKind.CUDA, cpus_per_gpu=4) == {"GPU": 1.0, "CPU": 4.0}
    split = load_plan(PLANS / "ppo-7b-split-h100x16.toml")
    colocate = load_plan(PLANS / "ppo-7b-colocate-h100x16.toml")
    assert [strategy(split, i) for i in range(len(split.sets))] == ["STRICT_PACK", "STRICT_PACK"]
    assert strategy(colocate, 0) == "PACK"  # 16 GPUs on two nodes
    assert required_resources(colocate, cpus_per_gpu=2) == {"GPU": 16.0, "CPU": 32.0}


def test_a_plan_larger_than_the_cluster_is_refused_with_needs_and_supply(cpu4_plans):
    check_resources(cpu4_plans["colocate"], {"CPU": 4.0})
    with pytest.raises(InsufficientResourcesError) as info:
        check_resources(cpu4_plans["colocate"], {"CPU": 2.0, "memory": 1e9})
    message = str(info.value)
    assert "needs 4 CPU (Ray reports 2)" in message and "actor+ref: 4" in message
    assert isinstance(info.value, SpecError)
    h100 = load_plan(PLANS / "ppo-7b-split-h100x16.toml")
    with pytest.raises(InsufficientResourcesError, match=r"16 GPU \(Ray reports 0\)"):
        check_resources(h100, {"CPU": 64.0})
