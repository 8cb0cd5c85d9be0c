"""The executor on a local Ray with 4 logical CPU workers: pools, groups, dispatch, failures.

Each test builds its own Controller inside `with`, so its workers and placement
groups are gone when it ends; the `ray_cluster` fixture checks that every CPU
came back.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
import ray
import torch
from probe_worker import Failure, ProbeController, ProbeWorker, Tag

from placeflow.executor.balance import WorkModel, balanced_partition, positional_partition
from placeflow.executor.batch import Batch
from placeflow.executor.controller import Controller
from placeflow.executor.dispatch import collect, split_by_dp
from placeflow.executor.errors import (
    FailureKind,
    InsufficientResourcesError,
    PlacementTimeoutError,
    WorkerError,
)
from placeflow.executor.groups import WorkerGroup
from placeflow.executor.worker import Axis, Worker
from placeflow.plan import plan_from_dict
from placeflow.workload import Role

pytestmark = pytest.mark.usefixtures("ray_cluster")

PLANS = Path(__file__).resolve().parents[1] / "examples" / "plans"
TIMEOUT_S = 30.0
WORK = WorkModel(linear_coeff=1442.0)


def skewed_batch(n: int, seed: int = 0) -> Batch:
    rng = np.random.default_rng(seed)
    lengths = np.clip(rng.lognormal(np.log(48), 0.9, n), 1, 512).astype(int).tolist()
    return Batch.from_sequences(
        {"input_ids": [torch.arange(s) % 251 + 1 for s in lengths]},
        meta={"sample_id": list(range(n)), "prompt_id": [i // 4 for i in range(n)]},
    )


@pytest.mark.parametrize("kind", ["colocate", "split", "standalone"])
def test_plan_runs_on_four_logical_workers(cpu4_plans, kind):
    """Pools, one process per device shared by colocated roles, rank layouts, dispatch."""
    plan = cpu4_plans[kind]
    with ProbeController(plan, timeout_s=TIMEOUT_S) as c:
        assert [p.placement_group.bundle_specs for p in c.pools] == [
            [{"CPU": 1.0}] * s.num_devices for s in plan.sets
        ]
        identities = [ident for per_set in c.identities for ident in per_set]
        assert len({ident.pid for ident in identities}) == 4  # one process per device
        for s, per_set in zip(plan.sets, c.identities, strict=True):
            assert [ident.device_index for ident in per_set] == list(range(s.num_devices))
            assert all(ident.roles == s.roles and ident.num_threads == 1 for ident in per_set)
        for group in c.groups:
            # Colocated roles' groups are views of the set's workers, not processes of their own.
            assert group.workers == c.workers[group.spec.set_index]
            check_ranks(c, group)
            check_round_trip(c, group)


def check_ranks(c: Controller, group: WorkerGroup) -> None:
    train = group.spec.layout.train
    infos = c.gather(
        group, [w.rank_info.remote(group.role) for w in group.workers], ProbeWorker.rank_info
    )
    assert [i.rank for i in infos] == list(range(train.world_size))
    assert [(i.pp, i.tp, i.dp) for i in infos] == [train.coords(r) for r in range(len(infos))]
    assert [r for r, i in enumerate(infos) if i.holds_result] == list(group.dispatch.result_ranks)
    # The process groups are real: each rank sums the ranks of its TP and DP groups.
    for axis, groups in ((Axis.TP, train.tp_groups()), (Axis.DP, train.dp_groups())):
        refs = [
            w.all_reduce.remote(group.role, axis, float(r)) for r, w in enumerate(group.workers)
        ]
        sums = c.gather(group, refs, ProbeWorker.all_reduce)
        for ranks in groups:
            assert all(sums[r] == sum(ranks) for r in ranks)


def check_round_trip(c: Controller, group: WorkerGroup) -> None:
    """Positional and token-aware splits come back in the original order, each sample's result
    from the result-holding rank of the replica it was sent to."""
    batch = skewed_batch(40)
    works = WORK.works(batch.seq_lens())
    num_dp = group.dispatch.num_dp
    for partition in (
        positional_partition(works, num_dp),
        balanced_partition(works, num_dp, groups=list(batch.meta["prompt_id"])),
    ):
        shards = split_by_dp(batch, group.dispatch, partition)
        refs = [
            w.tag.remote(group.role, shard) for w, shard in zip(group.workers, shards, strict=True)
        ]
        out = collect(group.dispatch, c.gather(group, refs, ProbeWorker.tag), partition)
        assert out.meta == batch.meta
        assert out.tensors[Tag.LENGTH].tolist() == batch.seq_lens()
        for dp, ix in enumerate(partition.indices):
            holder = group.dispatch.result_ranks[dp]
            assert set(out.tensors[Tag.DP_RANK][list(ix)].tolist()) <= {dp}
            assert set(out.tensors[Tag.RANK][list(ix)].tolist()) <= {holder}


def test_failing_workers_are_named_and_nothing_hangs(cpu4_plans):
    """One plan, four failures in turn (a Controller takes seconds to start on 2 cores)."""
    with ProbeController(cpu4_plans["colocate"], timeout_s=TIMEOUT_S) as c:
        actor, ref = c.group(Role.ACTOR), c.group(Role.REF)

        # 1. A raise names role, rank and cause, and leaves the worker alive.
        refs = [
            w.fail.remote(Failure.RAISE) if r == 1 else w.identity.remote()
            for r, w in enumerate(ref.workers)
        ]
        with pytest.raises(WorkerError) as info:
            c.gather(ref, refs, ProbeWorker.fail)
        assert (info.value.role, info.value.rank, info.value.kind) == ("ref", 1, FailureKind.RAISED)
        assert "RuntimeError: injected failure on device 1" in str(info.value)
        c.gather(ref, [w.identity.remote() for w in ref.workers], Worker.identity)

        # 2. A worker killed through the actor's group is reported through the ref's:
        #    one process holds both roles.
        ray.kill(actor.workers[3])
        start = time.monotonic()
        with pytest.raises(WorkerError) as info:
            # ray.kill is asynchronous: a call sent at once may still be served before the
            # process goes, so keep calling until the death is reported (or 10 s pass).
            while time.monotonic() - start < 10.0:
                c.gather(
                    ref, [w.identity.remote() for w in ref.workers], Worker.identity, timeout_s=10.0
                )
        assert time.monotonic() - start < 10.0
        assert (info.value.role, info.value.rank, info.value.kind) == ("ref", 3, FailureKind.DIED)

        # 3. A process that exits in the middle of a call.
        refs = [actor.workers[1].fail.remote(Failure.EXIT)]
        with pytest.raises(WorkerError) as info:
            c.gather(actor, refs, ProbeWorker.fail, ranks=[1], timeout_s=10.0)
        assert (info.value.role, info.value.rank, info.value.kind) == ("actor", 1, "died")

        # 4. A call that never answers meets its timeout.
        refs = [actor.workers[0].fail.remote(Failure.HANG), actor.workers[2].identity.remote()]
        start = time.monotonic()
        with pytest.raises(WorkerError) as info:
            c.gather(actor, refs, ProbeWorker.fail, ranks=[0, 2], timeout_s=1.0)
        assert time.monotonic() - start < 5.0
        assert (info.value.role, info.value.rank, info.value.kind) == ("actor", 0, "timeout")
    # Leaving the block killed the hung worker; ray_cluster checks every CPU came back.


def test_a_plan_larger_than_ray_fails_before_anything_starts():
    plan = plan_from_dict(
        {
            "name": "grpo-tiny-cpu8",
            "workload": "../workloads/grpo-tiny-cpu.toml",
            "cluster": {
                "name": "cpu32",
                "pools": [{"name": "cpu", "gpu": "cpu", "num_nodes": 1, "gpus_per_node": 32}],
            },
            "sets": [{"roles": ["actor", "ref"], "pool": "cpu", "num_devices": 32}],
            "parallelism": {"actor": {"d": 32}, "ref": {"d": 32}},
        },
        "cpu32",
        PLANS,
    )
    before = len(ray.util.placement_group_table())
    with pytest.raises(InsufficientResourcesError, match=r"needs 32 CPU \(Ray reports 16\)"):
        Controller(plan).start()
    assert len(ray.util.placement_group_table()) == before  # no placement group was made


def test_devices_held_elsewhere_give_a_placement_timeout(cpu4_plans):
    # Hold all but 2 CPU slots: the 4-worker plan cannot get its devices.
    free = int(ray.cluster_resources()["CPU"]) - 2
    holder = ray.util.placement_group([{"CPU": 1.0}] * free)
    ray.get(holder.ready(), timeout=TIMEOUT_S)
    try:
        with pytest.raises(PlacementTimeoutError, match="not ready within 1 s"):
            Controller(cpu4_plans["colocate"], timeout_s=1.0).start()
    finally:
        ray.util.remove_placement_group(holder)
