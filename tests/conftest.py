"""Shared fixtures. Ray is started once per session, here and nowhere else (STYLE.md rule 12)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from placeflow.plan import Plan, load_plan, plan_from_dict

# Logical CPU slots: one per CPU worker of the largest plan a test runs (the 16-GPU
# quickstart plan rehearsed on CPU workers); cpu4 and cpu8 plans fit too.
RAY_NUM_CPUS = 16
PLANS = Path(__file__).resolve().parents[1] / "examples" / "plans"


@pytest.fixture(scope="session")
def ray_session() -> Iterator[None]:
    """A local Ray instance with a fixed number of CPUs, shut down after the last test."""
    ray = pytest.importorskip("ray")
    ray.init(
        num_cpus=RAY_NUM_CPUS,
        num_gpus=0,
        include_dashboard=False,
        log_to_driver=False,
        configure_logging=False,
    )
    try:
        yield
    finally:
        ray.shutdown()


@pytest.fixture
def ray_cluster(ray_session: None) -> Iterator[None]:
    """Ray for one test, which must give back every CPU it took: checked after the test.

    Placement-group removal is asynchronous, so the check waits a little for it.
    """
    import ray

    yield
    deadline = time.monotonic() + 10.0
    while ray.available_resources().get("CPU", 0.0) < RAY_NUM_CPUS:
        if time.monotonic() > deadline:
            pytest.fail(f"test leaked Ray resources: {ray.available_resources()}")
        time.sleep(0.05)


@pytest.fixture(scope="session")
def cpu4_plans() -> dict[str, Plan]:
    """Plans of each placement kind on the 4 logical CPU workers of examples/clusters/cpu4.toml."""
    rm_workload = {
        "name": "grpo-tiny-rm",
        "algorithm": "grpo",
        "models": {"actor": "tiny-llama", "ref": "tiny-llama", "reward": "tiny-llama"},
        "batch": {
            "prompts_per_step": 8,
            "samples_per_prompt": 4,
            "prompt_len": 16,
            "response_len": 16,
        },
    }
    standalone = {
        "name": "grpo-tiny-cpu4-standalone",
        "workload": rm_workload,
        "cluster": "../clusters/cpu4.toml",
        "sets": [
            {"roles": ["actor"], "pool": "cpu", "first_device": 0, "num_devices": 2},
            {"roles": ["ref"], "pool": "cpu", "first_device": 2, "num_devices": 1},
            {"roles": ["reward"], "pool": "cpu", "first_device": 3, "num_devices": 1},
        ],
        "parallelism": {"actor": {"t": 2}, "ref": {}, "reward": {}},
    }
    generator = {
        "name": "grpo-tiny-cpu4-generator",
        "workload": "../workloads/grpo-tiny-cpu.toml",
        "cluster": "../clusters/cpu4.toml",
        "sets": [
            {"roles": ["actor", "ref"], "pool": "cpu", "first_device": 0, "num_devices": 2},
            {
                "roles": ["actor"],
                "pool": "cpu",
                "first_device": 2,
                "num_devices": 2,
                "generator": True,
            },
        ],
        "parallelism": {"actor": {"t": 2, "tg": 2}, "ref": {"d": 2}},
    }
    return {
        "colocate": load_plan(PLANS / "grpo-tiny-cpu4-colocate.toml"),
        "split": load_plan(PLANS / "grpo-tiny-cpu4-split.toml"),
        "standalone": plan_from_dict(standalone, "standalone", PLANS),
        "generator": plan_from_dict(generator, "generator", PLANS),
    }
