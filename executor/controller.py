"""Controller: turns a plan into running workers on Ray, and owns them until shutdown.

The single controller of DESIGN.md: the driver process builds the pools and
worker groups here, then the algorithm's loop (a later issue) calls workers
directly, `group.workers[r].method.remote(...)`, and waits with `gather`.

Start-up, in this order; each step waits for every worker, within `timeout_s`:

1. check the plan against the resources Ray reports; one placement group per
   device set, all ready (pools.py);
2. one `Worker` actor per device, on its bundle; each reports its identity;
3. per set: rank 0 picks a rendezvous address; all workers of the set join
   one torch.distributed world;
4. per group, in `group_specs` order: all workers of the set build the role's
   TP, PP and DP subgroups (the same order on every worker, as collectives need);
5. with a generator set: the actor's trainer workers and the generator workers
   join one more group for the weight sync (trainer ranks first).

`shutdown` kills every worker, then removes the placement groups. It runs when
a `with Controller(plan) as c:` block ends, on any start-up failure, and is
safe to call again. After a WorkerError the workers' state is unknown: shut down.
"""

from __future__ import annotations

import types
from collections.abc import Sequence
from typing import Any

import ray
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from placeflow.executor.gather import RaySource, gather
from placeflow.executor.groups import WorkerGroup, group_specs
from placeflow.executor.pools import ResourcePool, bundle, create_pools, remove_pools
from placeflow.executor.worker import (
    Worker,
    WorkerActor,
    WorkerIdentity,
    WorkerMethod,
    WorkerSpec,
)
from placeflow.plan import Plan
from placeflow.reshard_plan import GeneratorLayout
from placeflow.workload import Role


class Controller:
    """One plan's pools, workers and groups. Ray must already be initialised (ray.init).

    `timeout_s` bounds every start-up step and, unless a call gives its own, every `gather`.
    """

    # The Ray actor class of every worker: `worker_actor(Worker)`. Tests set a subclass's
    # (tests/probe_worker.py) to reach the workers with probes a run never calls.
    actor_class: Any = WorkerActor

    def __init__(
        self,
        plan: Plan,
        *,
        timeout_s: float = 60.0,
        num_threads: int = 1,
        cpus_per_gpu: int = 1,
    ) -> None:
        self.plan = plan
        self.timeout_s = timeout_s
        self.num_threads = num_threads
        self.cpus_per_gpu = cpus_per_gpu
        self.pools: list[ResourcePool] = []
        self.workers: list[tuple[Any, ...]] = []  # per set, workers[set][rank]
        self.identities: list[list[WorkerIdentity]] = []
        self.groups: list[WorkerGroup] = []

    def __enter__(self) -> Controller:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: types.TracebackType | None,
    ) -> None:
        self.shutdown()

    # --- start-up --------------------------------------------------------------
    def start(self) -> None:
        try:
            self.pools = create_pools(
                self.plan, timeout_s=self.timeout_s, cpus_per_gpu=self.cpus_per_gpu
            )
            self.workers = [self._start_workers(pool) for pool in self.pools]
            self.identities = [
                self._gather_set(i, [w.identity.remote() for w in ws], Worker.identity)
                for i, ws in enumerate(self.workers)
            ]
            for i in range(len(self.workers)):
                self._init_distributed(i)
            self.groups = [
                WorkerGroup(spec=spec, workers=self.workers[spec.set_index])
                for spec in group_specs(self.plan)
            ]
            for group in self.groups:
                refs = [w.setup_role.remote(group.role, group.spec.layout) for w in group.workers]
                self.gather(group, refs, Worker.setup_role)
            if self.plan.generator_set() is not None:
                self._init_weight_sync()
        except BaseException:
            self.shutdown()
            raise

    def _start_workers(self, pool: ResourcePool) -> tuple[Any, ...]:
        resources = bundle(pool.kind, cpus_per_gpu=self.cpus_per_gpu)
        s = pool.device_set
        return tuple(
            self.actor_class.options(
                num_cpus=resources["CPU"],
                num_gpus=resources.get("GPU", 0.0),
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    placement_group=pool.placement_group, placement_group_bundle_index=rank
                ),
            ).remote(
                WorkerSpec(
                    set_index=pool.set_index,
                    device_index=rank,
                    num_devices=s.num_devices,
                    roles=s.roles,
                    device_kind=pool.kind,
                    num_threads=self.num_threads,
                    generator=s.generator,
                )
            )
            for rank in range(s.num_devices)
        )

    def _init_distributed(self, set_index: int) -> None:
        workers = self.workers[set_index]
        [(host, port)] = self._gather_set(
            set_index, [workers[0].rendezvous_address.remote()], Worker.rendezvous_address
        )
        refs = [
            w.init_distributed.remote(host=host, port=port, timeout_s=self.timeout_s)
            for w in workers
        ]
        self._gather_set(set_index, refs, Worker.init_distributed)

    def _init_weight_sync(self) -> None:
        trainer = self.group(Role.ACTOR)
        generator = self.group(Role.ACTOR, generator=True)
        par = self.plan.parallelism[Role.ACTOR]
        gen_layout = generator.spec.layout.gen
        assert gen_layout is not None
        gen = GeneratorLayout(tg=par.tg, pg=par.pg, replicas=gen_layout.num_replicas)
        [(host, port)] = self.gather(
            trainer, [trainer.workers[0].rendezvous_address.remote()], Worker.rendezvous_address
        )
        num_train = len(trainer.workers)
        refs = [
            w.init_weight_sync.remote(
                host=host, port=port, rank=rank, train=par.train, gen=gen, timeout_s=self.timeout_s
            )
            for rank, w in enumerate(trainer.workers + generator.workers)
        ]
        self.gather(trainer, refs[:num_train], Worker.init_weight_sync)
        self.gather(generator, refs[num_train:], Worker.init_weight_sync)

    # --- calls -----------------------------------------------------------------
    def group(self, role: Role, *, generator: bool = False) -> WorkerGroup:
        """The group of `role`; with `generator`, the actor's group on a generator set."""
        for g in self.groups:
            if g.role is role and g.spec.generator == generator:
                return g
        raise KeyError(f"plan {self.plan.name!r} has no group for {role} (generator={generator})")

    def gather(
        self,
        group: WorkerGroup,
        refs: Sequence[Any],
        call: WorkerMethod,
        *,
        ranks: Sequence[int] | None = None,
        timeout_s: float | None = None,
    ) -> list[Any]:
        """Results of calls to `group`'s workers: refs[i] went to rank ranks[i] (default i),
        calls of the Worker method `call` (`Worker.update`).

        Raises WorkerError naming the group's role, the rank, the method and the cause of a
        failure.
        """
        return gather(
            RaySource(),
            refs,
            role=group.label,
            call=call.__name__,
            ranks=ranks,
            timeout_s=self.timeout_s if timeout_s is None else timeout_s,
        )

    def _gather_set(self, set_index: int, refs: Sequence[Any], call: WorkerMethod) -> list[Any]:
        label = f"set #{set_index + 1} ({self.plan.sets[set_index].label()})"
        return gather(RaySource(), refs, role=label, call=call.__name__, timeout_s=self.timeout_s)

    # --- shutdown --------------------------------------------------------------
    def shutdown(self) -> None:
        for workers in self.workers:
            for w in workers:
                ray.kill(w, no_restart=True)
        remove_pools(self.pools)
        self.workers, self.identities, self.groups, self.pools = [], [], [], []
