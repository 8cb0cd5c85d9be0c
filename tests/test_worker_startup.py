"""How placeflow's Ray workers start: at the driver's priority and with the allocator settings.

Oracles: the process's own nice value and environment, read inside the worker;
a class declared with Ray's defaults is the counter-example (Ray's nice 15).
"""

from __future__ import annotations

import os
import sys

import ray
from ray import cloudpickle

from placeflow.executor.worker import WORKER_ENV, Worker, WorkerActor, WorkerSpec
from placeflow.hardware import DeviceKind
from placeflow.workload import Role

SPEC = WorkerSpec(
    set_index=0, device_index=0, num_devices=1, roles=(Role.ACTOR,), device_kind=DeviceKind.CPU
)


def _env(keys: list[str]) -> dict[str, str | None]:
    return {k: os.environ.get(k) for k in keys}


def test_workers_run_at_nice_0_with_the_allocator_settings(ray_cluster: None) -> None:
    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # `_env` runs in the worker
    worker = WorkerActor.options(num_cpus=1).remote(SPEC)
    default = ray.remote(Worker).options(num_cpus=1).remote(SPEC)
    try:
        assert ray.get(worker.identity.remote()).niceness == 0
        # `__ray_call__` runs a function inside the actor's own process.
        env = ray.get(worker.__ray_call__.remote(lambda _self: _env(list(WORKER_ENV))))
        assert env == WORKER_ENV
        # The counter-example: the same class at Ray's defaults runs at nice 15.
        assert ray.get(default.identity.remote()).niceness == 15
    finally:
        for actor in (worker, default):
            ray.kill(actor)
        cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
