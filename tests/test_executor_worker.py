"""The Worker class in this process, without Ray: threads, ranks, a one-rank gloo world."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from probe_worker import Failure, ProbeWorker, Tag

from placeflow.executor.batch import Batch
from placeflow.executor.groups import RoleLayout
from placeflow.executor.worker import Axis, WorkerSpec
from placeflow.hardware import DeviceKind
from placeflow.layout import GenLayout, TrainLayout
from placeflow.workload import Role


@pytest.fixture
def worker():
    threads = torch.get_num_threads()
    w = ProbeWorker(
        WorkerSpec(
            set_index=0,
            device_index=0,
            num_devices=1,
            roles=(Role.ACTOR, Role.REF),
            device_kind=DeviceKind.CPU,
            num_threads=1,
        )
    )
    host, port = w.rendezvous_address()
    w.init_distributed(host=host, port=port, timeout_s=30.0)
    try:
        yield w
    finally:
        dist.destroy_process_group()
        torch.set_num_threads(threads)


def test_one_worker_holds_the_ranks_of_both_colocated_roles(ray_cluster, worker):
    # identity() asks Ray for this process's node: Ray is up, started by the one fixture
    # (left to itself, Ray would start a second instance here and the next ray.init fail).
    assert worker.identity().num_threads == 1 and worker.identity().device == "cpu"
    train = TrainLayout()
    actor = worker.setup_role(Role.ACTOR, RoleLayout(train=train, gen=GenLayout(train=train)))
    ref = worker.setup_role(Role.REF, RoleLayout(train=train))
    assert set(worker.roles) == {Role.ACTOR, Role.REF}
    assert (actor.rank, actor.dp, actor.holds_result, actor.gen_replica) == (0, 0, True, 0)
    assert ref.gen_replica is None
    assert worker.all_reduce(Role.REF, Axis.DP, 2.5) == 2.5


def test_the_probe_tags_samples_with_the_rank(worker):
    worker.setup_role(Role.ACTOR, RoleLayout(train=TrainLayout()))
    batch = Batch.from_sequences(
        {"input_ids": [torch.ones(3), torch.ones(5)]}, meta={"sample_id": [7, 8]}
    )
    out = worker.tag(Role.ACTOR, batch)
    assert out.tensors[Tag.LENGTH].tolist() == [3, 5]
    assert out.tensors[Tag.DP_RANK].tolist() == [0, 0]
    assert out.meta == {"sample_id": (7, 8)}
    with pytest.raises(RuntimeError, match="injected failure on device 0"):
        worker.fail(Failure.RAISE)
