"""Worker: the process on one device, holding the ranks of every role placed there.

One Ray actor per device of a device set. Colocated roles (say actor and ref on
the same four devices) do not get a process each: the single `Worker` on a
device holds one `RoleRank` per role, explicitly, in a dict keyed by Role; the
engines of a later issue join them there. `WorkerActor` is `worker_actor(Worker)`,
made once at import time; the plain class stays usable in-process for tests, and
tests make their probing subclasses into actors with the same `worker_actor`
(tests/probe_worker.py), so that this class holds what a run calls and nothing else.

Distributed state. All workers of a set form one torch.distributed world
(gloo for a CPU pool, NCCL for CUDA), rank = the device's index in the set; the
plan guarantees every role of the set spans exactly those devices, so each
role's TP, PP and DP groups are subgroups of that world, built from
placeflow.layout and nothing else. Process groups are created in the order the
controller calls `setup_role`, which is the same on every worker.

Devices: batches cross the worker boundary on the host (CPU) and every call
moves its batch onto this worker's device on arrival and its results back to
the host before they leave, so engines only ever see tensors on their device.

Threads: a CPU "device" is one core's worth of work, so the worker sets torch's
intra-op threads itself (default 1) instead of inheriting the host's count.

Scheduling priority: Ray starts worker processes at nice 15 (its C++ option
`worker_niceness`), so that a driver on the same machine stays responsive.
Here the workers are where all the compute happens, and at nice 15 the
kernel's CFS gives them a weight of 36 against 1024 for every nice-0 process:
the driver's polling, Ray's raylet and GCS, anything else on the host. Each
slice they lose stalls the step (and an OpenMP barrier waits for its slowest
thread). Measured on a shared 2-core machine (benchmarks/trl_grpo.py,
`worker_update`): the update takes the same CPU seconds in a worker as in a
plain process, but a nice-15 worker got 36-73 % of a core while it ran, a
nice-0 one 68-91 % under the same load. The actor class is
therefore declared with `RAY_worker_niceness=0` in its runtime environment,
the per-process override Ray's own job supervisor uses for job drivers; every
worker reports its niceness in its identity (workers.json).

Memory allocator: an update allocates and frees the same large tensors (logits,
activations, gradients) every micro-batch. glibc serves blocks above its mmap
threshold (at most 32 MiB) with fresh mappings and returns them on free, so
each reuse faults every page in again: about 615,000 minor faults and 1.2 of
5.3 CPU seconds in the kernel per SmolLM2 update (measured, `worker_update`).
Workers start with glibc told never to mmap and never to trim (`WORKER_ENV`):
freed memory stays in the heap for the next micro-batch, at the price of a
resident size that stays at its peak, which a worker holding a model for the
whole run reaches anyway.
"""

from __future__ import annotations

import dataclasses
import os
import socket
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from enum import StrEnum
from typing import Any, TypeVar

import ray
import torch
import torch.distributed as dist

from placeflow.errors import SpecError
from placeflow.executor.batch import Batch
from placeflow.executor.dispatch import DispatchLayout
from placeflow.executor.engines.generator import GeneratorEngine
from placeflow.executor.engines.moe import EPGroup
from placeflow.executor.engines.offload import ParamOffload
from placeflow.executor.engines.pipeline import PPGroup
from placeflow.executor.engines.roles import (
    ActorEngine,
    CriticEngine,
    EngineSetup,
    RoleGroups,
    ScoringEngine,
    UpdateConfig,
)
from placeflow.executor.engines.sampler import SamplingParams
from placeflow.executor.engines.tp import TPGroup
from placeflow.executor.groups import RoleLayout
from placeflow.executor.reshard import MemoryMeter
from placeflow.executor.weight_sync import Link, Posted, open_sync_link, sync_disjoint
from placeflow.hardware import DeviceKind
from placeflow.layout import TrainLayout
from placeflow.reshard_plan import (
    WEIGHT_SYNC_BUCKET_BYTES,
    DisjointPlan,
    GeneratorLayout,
    expert_groups,
    plan_disjoint,
    plan_reshard,
)
from placeflow.workload import Role

E = TypeVar("E")
# A method of Worker (`Worker.update`): the controller names the remote call it waits for
# by it, so that an error names the method that was called, and a rename reaches both.
WorkerMethod = Callable[..., Any]
HOST = torch.device("cpu")  # where the controller's batches live: they cross to and from it


class Axis(StrEnum):
    TP = "tp"
    PP = "pp"
    DP = "dp"
    GEN_TP = "gen_tp"  # the actor's generation TP group (GenLayout.tp_groups)
    MICRO_DP = "micro_dp"  # the ranks that all-gather one generation shard
    EP = "ep"  # expert parallel: the routed experts' all-to-all (e > 1)
    EXPERT_DP = "expert_dp"  # ranks holding the same experts (their gradients' all-reduce)
    EXPERT_GATHER = "expert_gather"  # the reshard's expert all-gather (reshard_plan)


@dataclass(frozen=True, kw_only=True)
class WorkerSpec:
    set_index: int
    device_index: int  # index in the device set = rank in every role of the set
    num_devices: int  # of the set: the world size
    roles: tuple[Role, ...]
    device_kind: DeviceKind
    num_threads: int = 1
    generator: bool = False  # a generator set: the actor's rollout engine only


@dataclass(frozen=True, kw_only=True)
class WeightSync:
    """This worker's place in the weight sync between the actor's trainer and generator sets.

    Sync-world ranks: trainer ranks 0..T-1 (the trainer set's device order), then
    generator ranks T..T+G-1; `plan` is derived once from the actor's shapes.
    """

    rank: int
    train: TrainLayout
    gen: GeneratorLayout
    link: Link
    plan: DisjointPlan | None = None


@dataclass(frozen=True, kw_only=True)
class WorkerIdentity:
    set_index: int
    device_index: int
    roles: tuple[Role, ...]
    pid: int
    node_ip: str
    node_id: str  # the Ray node this worker runs on
    device: str
    num_threads: int
    niceness: int = 0  # the process's nice value (0: the same priority as the driver)


@dataclass(frozen=True, kw_only=True)
class RankInfo:
    """Where one role's rank sits in its layouts."""

    role: Role
    rank: int
    pp: int
    tp: int
    dp: int
    holds_result: bool  # returns its DP replica's results (see dispatch.py)
    gen_replica: int | None = None
    gen_pp: int | None = None
    gen_tp: int | None = None


@dataclass(kw_only=True)
class RoleRank:
    """A role's state in this process: its rank and its process groups."""

    info: RankInfo
    groups: dict[Axis, dist.ProcessGroup]
    layout: RoleLayout


class Worker:
    def __init__(self, spec: WorkerSpec) -> None:
        torch.set_num_threads(spec.num_threads)
        if spec.device_kind is DeviceKind.CUDA:
            # Ray exposes this actor's one GPU as device 0 (CUDA_VISIBLE_DEVICES).
            self.device = torch.device("cuda", 0)
            torch.cuda.set_device(self.device)
            # TF32 for what still runs in fp32 (the optimizer's and the norms' matmuls, an
            # fp32 model's whole forward): a start-up setting of the process, as trainers set it.
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True
        else:
            self.device = torch.device("cpu")
        self.spec = spec
        self.roles: dict[Role, RoleRank] = {}
        self.engines: dict[Role, ActorEngine | CriticEngine | ScoringEngine | GeneratorEngine] = {}
        self.weight_sync: WeightSync | None = None
        # k-step-off: snapshots of posted weights (packed messages and their sends),
        # oldest first, kept until the generator has received them.
        self.posted: deque[list[tuple[torch.Tensor, Posted]]] = deque()
        # offload_params: roles whose weights stay in host memory between their calls
        self.param_offloads: dict[Role, ParamOffload] = {}

    def identity(self) -> WorkerIdentity:
        return WorkerIdentity(
            set_index=self.spec.set_index,
            device_index=self.spec.device_index,
            roles=self.spec.roles,
            pid=os.getpid(),
            node_ip=ray.util.get_node_ip_address(),
            node_id=ray.get_runtime_context().get_node_id(),
            device=str(self.device),
            num_threads=torch.get_num_threads(),
            niceness=os.nice(0),
        )

    def rendezvous_address(self) -> tuple[str, int]:
        """This node's address and a port free on it now, for the set's TCP store."""
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("", 0))
            port = int(s.getsockname()[1])
        return ray.util.get_node_ip_address(), port

    def init_distributed(self, *, host: str, port: int, timeout_s: float) -> None:
        """Join the set's world; every worker of the set calls this at the same time."""
        backend = "nccl" if self.spec.device_kind is DeviceKind.CUDA else "gloo"
        dist.init_process_group(
            backend,
            init_method=f"tcp://{host}:{port}",
            rank=self.spec.device_index,
            world_size=self.spec.num_devices,
            timeout=timedelta(seconds=timeout_s),
        )

    def init_weight_sync(
        self,
        *,
        host: str,
        port: int,
        rank: int,
        train: TrainLayout,
        gen: GeneratorLayout,
        timeout_s: float,
    ) -> None:
        """Join the actor's trainer/generator sync world (all its workers call this at once)."""
        backend = "nccl" if self.spec.device_kind is DeviceKind.CUDA else "gloo"
        link = open_sync_link(
            host=host,
            port=port,
            rank=rank,
            world_size=train.world_size + gen.world_size,
            backend=backend,
            timeout_s=timeout_s,
        )
        self.weight_sync = WeightSync(rank=rank, train=train, gen=gen, link=link)

    def setup_role(self, role: Role, layout: RoleLayout) -> RankInfo:
        """Build the role's TP, PP and DP subgroups (collective over the set's world)."""
        assert role in self.spec.roles and layout.train.world_size == self.spec.num_devices
        rank = self.spec.device_index
        groups: dict[Axis, dist.ProcessGroup] = {}
        for axis, ranks in (
            (Axis.TP, layout.train.tp_groups()),
            (Axis.PP, layout.train.pp_groups()),
            (Axis.DP, layout.train.dp_groups()),
        ):
            mine, _ = dist.new_subgroups_by_enumeration(ranks)
            groups[axis] = mine
        if layout.gen is not None:
            for axis, ranks in (
                (Axis.GEN_TP, layout.gen.tp_groups()),
                (Axis.MICRO_DP, layout.gen.micro_dp_groups()),
            ):
                mine, _ = dist.new_subgroups_by_enumeration(ranks)
                groups[axis] = mine
        train = layout.train
        expert_axes = [(Axis.EP, train.ep_groups())] if train.e > 1 else []
        if train.e > 1 and train.expert_dp > 1:
            expert_axes.append((Axis.EXPERT_DP, train.expert_dp_groups()))
        if train.e > 1 and layout.gen is not None:
            expert_axes.append((Axis.EXPERT_GATHER, expert_groups(layout.gen)))
        for axis, ranks in expert_axes:
            mine, _ = dist.new_subgroups_by_enumeration(ranks)
            groups[axis] = mine
        pp, tp, dp = layout.train.coords(rank)
        gen = layout.gen.coords(rank) if layout.gen is not None else (None, None, None)
        info = RankInfo(
            role=role,
            rank=rank,
            pp=pp,
            tp=tp,
            dp=dp,
            holds_result=rank in DispatchLayout.of_train(layout.train).result_ranks,
            gen_replica=gen[0],
            gen_pp=gen[1],
            gen_tp=gen[2],
        )
        self.roles[role] = RoleRank(info=info, groups=groups, layout=layout)
        return info

    # --- engines: the RL loop's calls ---------------------------------------------
    def build_engine(self, role: Role, setup: EngineSetup) -> None:
        """Build `role`'s engine on this rank: its pipeline stage of its TP shard (collective:
        FSDP set-up over its DP group, a first collective over its PP group)."""
        rr = self.roles[role]
        train, gen = rr.layout.train, rr.layout.gen
        if self.spec.generator:
            assert role is Role.ACTOR and gen is not None
            tp = TPGroup(
                group=rr.groups[Axis.GEN_TP] if gen.tg > 1 else None,
                size=gen.tg,
                rank=rr.info.gen_tp or 0,
                impl=setup.tp_impl,
            )
            self.engines[role] = GeneratorEngine(setup, tp, self.device)
            return
        if gen is not None and gen.pg > 1:
            raise SpecError(
                f"{role}: generation pipeline pg > 1 is not executed: the planner emits pg = 1 "
                "(one decode pass over all layers per generation replica)"
            )
        info = rr.info

        def tp_group(axis: Axis, size: int, rank: int) -> TPGroup:
            group = rr.groups[axis] if size > 1 else None
            return TPGroup(group=group, size=size, rank=rank, impl=setup.tp_impl)

        groups = RoleGroups(
            tp=tp_group(Axis.TP, train.t, info.tp),
            pp=PPGroup(
                group=rr.groups[Axis.PP] if train.p > 1 else None,
                size=train.p,
                rank=info.pp,
                first_stage_layers=train.first_stage_layers,
                last_stage_layers=train.last_stage_layers,
            ),
            dp_group=rr.groups[Axis.DP],
            dp_size=train.d,
            gen_tp=tp_group(Axis.GEN_TP, gen.tg, info.gen_tp or 0) if gen is not None else None,
            micro_dp=rr.groups.get(Axis.MICRO_DP),
            ep=EPGroup(rank=train.ep_rank(info.rank), size=train.e, group=rr.groups.get(Axis.EP)),
            expert_dp=rr.groups.get(Axis.EXPERT_DP),
            expert_gather=rr.groups.get(Axis.EXPERT_GATHER),
        )
        engine: ActorEngine | CriticEngine | ScoringEngine
        if role is Role.ACTOR:
            plan = plan_reshard(setup.arch.weights, gen) if gen is not None else None
            engine = ActorEngine(
                setup, groups, self.device, gen=gen, rank=info.rank, reshard_plan=plan
            )
        elif setup.optim is not None:
            engine = CriticEngine(setup, groups, self.device)
        else:
            engine = ScoringEngine(setup, groups, self.device)
        self.engines[role] = engine
        if setup.offload_params:
            offload = self.param_offloads[role] = ParamOffload(engine.model, self.device)
            offload.offload()

    @contextmanager
    def _weights(self, role: Role, *, changes: bool = False) -> Iterator[None]:
        """`role`'s training weights on the device for one call (offload_params: reloaded
        before it and offloaded after, written back when the call `changes` them)."""
        offload = self.param_offloads.get(role)
        if offload is None:
            yield
            return
        with offload.loaded(changes=changes):
            yield

    def _arrive(self, batch: Batch) -> Batch:
        """A batch from the controller, on this worker's device (results go back to HOST)."""
        return batch.to(self.device)

    def _engine(self, role: Role, kind: type[E]) -> E:
        engine = self.engines.get(role)
        if not isinstance(engine, kind):
            raise SpecError(f"{role} on this worker has no {kind.__name__} (got {engine!r})")
        return engine

    def sync_rollout(self) -> tuple[int, int]:
        """The actor's reshard into its rollout engine: (bytes received, peak extra bytes)."""
        actor = self._engine(Role.ACTOR, ActorEngine)
        with self._weights(Role.ACTOR):
            received = actor.sync_rollout()
        return received, actor.last_reshard_peak

    def generate(self, prompts: list[list[int]], params: SamplingParams, seed: int) -> Batch:
        engine = self.engines.get(Role.ACTOR)
        if not isinstance(engine, ActorEngine | GeneratorEngine):
            raise SpecError(f"this worker has no rollout engine for the actor (got {engine!r})")
        return engine.generate(prompts, params, seed).to(HOST)

    def _sync_plan(self, engine: ActorEngine | GeneratorEngine) -> tuple[WeightSync, DisjointPlan]:
        sync = self.weight_sync
        if sync is None:
            raise SpecError(
                "this worker is in no weight-sync world (the plan has no generator set)"
            )
        if sync.plan is None:
            plan = plan_disjoint(
                engine.setup.arch.weights, sync.train, sync.gen, WEIGHT_SYNC_BUCKET_BYTES
            )
            sync = self.weight_sync = dataclasses.replace(sync, plan=plan)
        assert sync.plan is not None
        return sync, sync.plan

    def send_weights(self) -> tuple[int, int]:
        """Trainer side of the weight sync: (bytes sent, peak extra bytes)."""
        actor = self._engine(Role.ACTOR, ActorEngine)
        sync, plan = self._sync_plan(actor)
        meter = MemoryMeter()
        with self._weights(Role.ACTOR):
            _, sent = sync_disjoint(
                plan,
                sync.rank,
                actor.trainer.tp_shards(),
                meter,
                link=sync.link,
                device=self.device,
            )
        return sent, meter.peak_bytes

    def post_weights(self, max_posted: int) -> tuple[int, int]:
        """Trainer side of a k-step-off weight sync: pack this rank's messages and post
        them without waiting for the generator, which receives them between rollouts.

        At most `max_posted` snapshots stay in flight: first waits (oldest first) for
        the generator to take older ones. Returns (bytes sent, bytes of snapshots
        now held).
        """
        if max_posted < 1:
            raise SpecError(f"post_weights keeps at least one snapshot, got {max_posted}")
        actor = self._engine(Role.ACTOR, ActorEngine)
        sync, plan = self._sync_plan(actor)
        while len(self.posted) >= max_posted:
            self._complete_oldest_post()
        posted: list[tuple[torch.Tensor, Posted]] = []
        with self._weights(Role.ACTOR):  # the posted messages are packed copies
            _, sent = sync_disjoint(
                plan,
                sync.rank,
                actor.trainer.tp_shards(),
                MemoryMeter(),
                link=sync.link,
                device=self.device,
                posted=posted,
            )
        self.posted.append(posted)
        # (one copy may be posted to several generator replicas: count each once)
        held = sum(
            t.numel() * t.element_size()
            for snap in self.posted
            for t in {id(t): t for t, _ in snap}.values()
        )
        return sent, held

    def drain_posted_weights(self) -> int:
        """Wait until the generator has received every posted snapshot; how many were."""
        n = len(self.posted)
        while self.posted:
            self._complete_oldest_post()
        return n

    def _complete_oldest_post(self) -> None:
        for _, work in self.posted.popleft():
            work.wait()

    def receive_weights(self) -> tuple[int, int]:
        """Generator side of the weight sync: (bytes received, peak extra bytes)."""
        engine = self._engine(Role.ACTOR, GeneratorEngine)
        sync, plan = self._sync_plan(engine)
        meter = MemoryMeter()
        weights, received = sync_disjoint(
            plan, sync.rank, None, meter, link=sync.link, device=self.device
        )
        engine.load_rollout(weights)
        return received, meter.peak_bytes

    def logprobs(self, role: Role, batch: Batch, temperature: float) -> Batch:
        engine = self.engines[role]
        if isinstance(engine, CriticEngine | GeneratorEngine):
            raise SpecError(f"{role} on this worker has no logprobs (got {engine!r})")
        with self._weights(role):
            return engine.logprobs(self._arrive(batch), temperature).to(HOST)

    def values(self, role: Role, batch: Batch) -> Batch:
        engine = self._engine(role, CriticEngine)
        with self._weights(role):
            return engine.values(self._arrive(batch)).to(HOST)

    def scores(self, role: Role, batch: Batch) -> Batch:
        engine = self._engine(role, ScoringEngine)
        with self._weights(role):
            return engine.scores(self._arrive(batch)).to(HOST)

    def update(self, role: Role, batch: Batch, cfg: UpdateConfig) -> dict[str, float]:
        engine = self.engines[role]
        if not isinstance(engine, ActorEngine | CriticEngine):
            raise SpecError(f"{role} is frozen on this worker; it has no update")
        with self._weights(role, changes=True):
            return engine.update(self._arrive(batch), cfg)

    def save_state(self, role: Role, path: str) -> None:
        """This rank's trainable state of `role` to `path` (one file per rank and role)."""
        engine = self.engines[role]
        if isinstance(engine, ActorEngine | CriticEngine):
            with self._weights(role):
                torch.save(engine.state(), path)

    def load_state(self, role: Role, path: str) -> None:
        engine = self.engines[role]
        if isinstance(engine, ActorEngine | CriticEngine):
            with self._weights(role, changes=True):
                engine.load_state(torch.load(path, weights_only=True))


# The environment a worker process starts with (see the module docstring). Ray reads
# `RAY_<option>` from it when it starts the process: this worker's own `worker_niceness`,
# not the cluster's. glibc reads `MALLOC_*_` at start-up: never mmap a block, never trim
# the heap, so freed tensor memory is reused instead of handed back and faulted in again.
WORKER_ENV = {
    "RAY_worker_niceness": "0",
    "MALLOC_MMAP_MAX_": "0",
    "MALLOC_TRIM_THRESHOLD_": str(2**62),
}
WORKER_RUNTIME_ENV = {"env_vars": WORKER_ENV}


def worker_actor(cls: type[Worker]) -> Any:
    """`cls` (Worker or a subclass) as a Ray actor class that starts as a worker must."""
    return ray.remote(runtime_env=WORKER_RUNTIME_ENV)(cls)


WorkerActor = worker_actor(Worker)
