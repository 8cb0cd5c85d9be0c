"""A Worker with probes only tests call: its ranks, sums over its process groups, tags,
injected failures.

`ProbeWorker` adds to the production `Worker` what a test needs to look inside a
worker group and what it needs to break one; `ProbeController` starts it as a
Ray actor with the production actor options (`worker_actor`: the runtime
environment `WORKER_ENV`), so the workers under test start as a run's do.

Ray ships classes by reference, and Ray's worker processes cannot import this
module (tests/ is on no path of theirs), so it is registered to travel by value.
"""

from __future__ import annotations

import os
import sys
import time
from enum import StrEnum
from typing import Any

import torch
import torch.distributed as dist
from ray import cloudpickle

from placeflow.executor.batch import Batch
from placeflow.executor.controller import Controller
from placeflow.executor.worker import Axis, RankInfo, Worker, worker_actor
from placeflow.workload import Role

cloudpickle.register_pickle_by_value(sys.modules[__name__])


class Failure(StrEnum):
    """Failures a test can inject with `ProbeWorker.fail`."""

    RAISE = "raise"  # raise an exception from the method
    EXIT = "exit"  # end the process at once, as a crash would
    HANG = "hang"  # never answer


class Tag(StrEnum):
    """The tensors of `ProbeWorker.tag`'s answer."""

    LENGTH = "length"  # the sample's sequence length, as the worker received it
    RANK = "rank"  # the rank that answered
    DP_RANK = "dp_rank"  # its data-parallel replica


class ProbeWorker(Worker):
    def rank_info(self, role: Role) -> RankInfo:
        return self.roles[role].info

    def all_reduce(self, role: Role, axis: Axis, value: float) -> float:
        """Sum `value` over this rank's `axis` group of `role` (a check that the groups work)."""
        t = torch.tensor([value], dtype=torch.float64, device=self.device)  # NCCL needs CUDA
        dist.all_reduce(t, group=self.roles[role].groups[axis])
        return float(t.item())

    def tag(self, role: Role, batch: Batch) -> Batch:
        """Each sample of this rank's shard, by length, tagged with who received it."""
        info = self.roles[role].info
        n = len(batch)
        return Batch(
            tensors={
                Tag.LENGTH: torch.tensor(batch.seq_lens(), dtype=torch.long),
                Tag.RANK: torch.full((n,), info.rank, dtype=torch.long),
                Tag.DP_RANK: torch.full((n,), info.dp, dtype=torch.long),
            },
            meta=batch.meta,
        )

    def fail(self, failure: Failure) -> None:
        if failure is Failure.RAISE:
            raise RuntimeError(f"injected failure on device {self.spec.device_index}")
        if failure is Failure.EXIT:
            os._exit(1)  # no cleanup, no exception: what a segfault or OOM kill looks like
        time.sleep(1e6)


class ProbeController(Controller):
    """A Controller whose workers are ProbeWorkers."""

    actor_class: Any = worker_actor(ProbeWorker)
