"""Plan: a placement of a workload's roles on a cluster, with each role's parallelism.

A plan is a frozen value: which roles share which devices (device sets), the
training layout p-t-d of every role (forward-only roles use it for inference
too), the actor's generation layout tg-pg, micro-batch sizes, ZeRO stage and
recomputation. It is read from and written to TOML and has a content hash.

```toml
name = "ppo-7b-colocate"
workload = "../workloads/ppo-llama2-7b.toml"   # a path (relative to this file) or a table
cluster = "../clusters/h100x16.toml"           # likewise

[[sets]]
roles = ["actor", "critic", "ref", "reward"]
pool = "h100"
first_device = 0      # index in the pool: node = device // gpus_per_node
num_devices = 16

[parallelism.actor]
p = 1
t = 4
d = 4
e = 1                 # expert parallel (MoE models; divides d and the expert count)
# cp = 2                # context parallel: each sequence split over cp ranks (world = p*t*cp*d)
# cp_kind = "ring"      # "ring" (Megatron CP, K/V ring) or "ulysses" (all-to-all of heads)
# sequence_parallel = true  # Megatron SP over t (needs t >= 2)
# first_stage_layers = 3  # uneven pipeline stages (Megatron's knobs; p >= 2): layers of
# last_stage_layers = 2   # the first / last stage, the others split the rest evenly
tg = 2                # generation tensor parallelism (actor only)
pg = 1
micro_batch = 8       # samples per micro-batch (forward and training)
# forward_micro_batch = 16  # samples per micro-batch of forward-only calls (0: micro_batch)
# micro_batch_tokens = 16384  # instead: micro-batches of at most this many tokens, samples
#                             # packed without padding (verl's use_dynamic_bsz)
# forward_micro_batch_tokens = 32768  # ... of forward-only calls (0: micro_batch_tokens)
zero = 1              # ZeRO stage 0-3 over d
recompute = true      # full activation recomputation in training
offload_optimizer = false  # keep Adam state in host memory outside the update (trained roles)
# offload_params = true     # keep weights (and gradients) in host memory outside the role's
#                           # calls, reloaded for each (verl's param_offload)
optimizer_step = "device"  # with offload: "device" reloads the state for the update,
                           # "host" updates on the CPU (DeepSpeed --adam_offload)
```

A set may also be `generator = true` with `roles = ["actor"]`: the actor's
generation then runs on that set's devices (trainer and generator apart) and
its weights are synchronised over the link between the sets.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from functools import cached_property
from pathlib import Path
from typing import Any, Protocol

import tomli_w

from placeflow.cluster import (
    ClusterSpec,
    PoolSpec,
    cluster_from_dict,
    cluster_to_dict,
    load_cluster,
)
from placeflow.errors import SpecError
from placeflow.frozen import frozen
from placeflow.layout import CPKind, GenLayout, TrainLayout, generator_stage_layers
from placeflow.modcall import answer_calls
from placeflow.models import ModelSpec
from placeflow.tomlio import Table, load_spec, parse_enum
from placeflow.workload import (
    Role,
    Workload,
    load_workload,
    parse_role,
    workload_from_dict,
    workload_to_dict,
)


@dataclass(frozen=True, kw_only=True)
class DeviceSet:
    """Consecutive devices [first_device, first_device + num_devices) of one pool."""

    roles: tuple[Role, ...]
    pool: str
    first_device: int
    num_devices: int
    generator: bool = False

    def devices(self) -> range:
        return range(self.first_device, self.first_device + self.num_devices)

    def label(self) -> str:
        kind = "gen:" if self.generator else ""
        return f"{kind}{'+'.join(r.value for r in self.roles)}"


class OptimizerStep(StrEnum):
    """Where an offloaded optimizer's update runs.

    DEVICE: the Adam state (fp32 master, two moments) is reloaded to the device for
    the update and written back after (verl's optimizer offload). HOST: the update
    runs on the CPU over the host copy; the device sends its gradients down and
    receives the updated bf16 weights back, and never holds the Adam state or the
    fp32 master (DeepSpeed ZeRO-Offload, OpenRLHF's --adam_offload).
    """

    DEVICE = "device"
    HOST = "host"


@dataclass(frozen=True)
class MicroBatching:
    """How one kind of call (training, or forward-only) cuts a rank's samples.

    By samples (`tokens` = 0): micro-batches of `samples` samples. By tokens:
    samples are packed, without padding, into as few micro-batches of at most
    `tokens` real tokens as a balanced partition finds (verl's use_dynamic_bsz with
    ppo_max_token_len_per_gpu; the executor's `balance.token_micro_batches`).
    """

    samples: int
    tokens: int = 0

    def split(self, per_rank: int, seq: int) -> tuple[int, int, int]:
        """(samples per micro-batch, micro-batches, tokens of the largest) for `per_rank`
        samples of `seq` tokens on average, as the cost model prices them: by tokens,
        ceil(per_rank * seq / tokens) micro-batches, and activations sized for a full
        micro-batch of `tokens` (a packed one may reach it whatever the mean length)."""
        per_rank = max(1, per_rank)
        if not self.tokens:
            mb = min(self.samples, per_rank)
            return mb, math.ceil(per_rank / mb), mb * seq
        num = max(1, math.ceil(per_rank * seq / self.tokens))
        return math.ceil(per_rank / num), num, min(self.tokens, per_rank * seq)


class MicroBatchKeys(Protocol):
    """The four plan keys that say how a role cuts its samples into micro-batches."""

    @property
    def micro_batch(self) -> int: ...
    @property
    def forward_micro_batch(self) -> int: ...
    @property
    def micro_batch_tokens(self) -> int: ...
    @property
    def forward_micro_batch_tokens(self) -> int: ...


def micro_batching(keys: MicroBatchKeys, *, forward: bool) -> MicroBatching:
    """The micro-batching of a role's training (`forward` False) or forward-only calls
    from its four plan keys (`RoleParallelism`; the executor's `EngineSetup` carries
    the same keys): a forward-only size of its own, in tokens or samples, when given;
    else the training one's."""
    if not forward:
        return MicroBatching(keys.micro_batch, keys.micro_batch_tokens)
    if keys.forward_micro_batch_tokens:
        return MicroBatching(
            keys.forward_micro_batch or keys.micro_batch, keys.forward_micro_batch_tokens
        )
    if keys.forward_micro_batch:
        return MicroBatching(keys.forward_micro_batch)
    return MicroBatching(keys.micro_batch, keys.micro_batch_tokens)


@dataclass(frozen=True, kw_only=True)
class RoleParallelism:
    """Parallelism of one role. Generation fields are used for the actor only.

    `zero` shards a trained role's optimizer state (>= 1), gradients (>= 2) and
    weights (3) over d; a forward-only role (ref, reward, cost) shards its weights
    over d with zero = 3 and gathers them layer by layer in its forward.
    """

    train: TrainLayout
    tg: int = 1
    pg: int = 1
    micro_batch: int = 1
    # Samples per micro-batch of a forward-only call (log-probs, values, scores); 0: the
    # training micro_batch. Without activations kept for a backward it can be larger
    # (verl's log_prob_micro_batch_size_per_gpu).
    forward_micro_batch: int = 0
    # Micro-batches counted in tokens instead (`MicroBatching`); 0: counted in samples.
    micro_batch_tokens: int = 0
    forward_micro_batch_tokens: int = 0  # forward-only calls; 0: micro_batch_tokens
    zero: int = 1
    recompute: bool = True
    offload_optimizer: bool = False
    optimizer_step: OptimizerStep = OptimizerStep.DEVICE
    # Weights (and, trained, gradients) in host memory outside the role's own calls and
    # copied to the device for each (verl's `param_offload`): the memory of a colocated
    # set is then the active role's, at the price of the copies over the host link.
    offload_params: bool = False

    def __post_init__(self) -> None:
        if self.micro_batch <= 0:
            raise SpecError(f"micro_batch must be a positive integer, got {self.micro_batch}")
        if self.forward_micro_batch < 0:
            raise SpecError(
                "forward_micro_batch must be a positive integer (or 0: the training "
                f"micro_batch), got {self.forward_micro_batch}"
            )
        for name in ("micro_batch_tokens", "forward_micro_batch_tokens"):
            if getattr(self, name) < 0:
                raise SpecError(
                    f"{name} must be a positive number of tokens (or 0: micro-batches "
                    f"counted in samples), got {getattr(self, name)}"
                )
        if self.forward_micro_batch and self.forward_micro_batch_tokens:
            raise SpecError(
                f"forward_micro_batch ({self.forward_micro_batch} samples) and "
                f"forward_micro_batch_tokens ({self.forward_micro_batch_tokens}) both set: "
                "forward-only micro-batches are counted in samples or in tokens, give one"
            )
        if self.zero not in (0, 1, 2, 3):
            raise SpecError(f"zero must be a ZeRO stage 0, 1, 2 or 3, got {self.zero}")
        if self.optimizer_step is OptimizerStep.HOST and not self.offload_optimizer:
            raise SpecError(
                'optimizer_step = "host" updates the Adam state where it is kept, in host '
                'memory: set offload_optimizer = true as well (or optimizer_step = "device")'
            )

    @property
    def forward_mb(self) -> int:
        """Samples per micro-batch of this role's forward-only calls."""
        return self.forward_micro_batch or self.micro_batch

    @property
    def train_micro(self) -> MicroBatching:
        """How the update cuts a rank's samples of one mini-batch."""
        return micro_batching(self, forward=False)

    @property
    def forward_micro(self) -> MicroBatching:
        """How forward-only calls cut a rank's samples."""
        return micro_batching(self, forward=True)

    @property
    def token_budgets(self) -> tuple[int, ...]:
        """The token sizes this role's micro-batches use (none when counted in samples)."""
        return tuple(b for b in (self.train_micro.tokens, self.forward_micro.tokens) if b)

    @property
    def host_optimizer_step(self) -> bool:
        """Whether the optimizer update runs on the host CPU (offloaded state, host step)."""
        return self.offload_optimizer and self.optimizer_step is OptimizerStep.HOST

    def gen_layout(self, generator_devices: int | None = None) -> GenLayout:
        """The generation layout; on a separate generator set, one replica layout per tg·pg."""
        if generator_devices is None:
            return GenLayout(train=self.train, tg=self.tg, pg=self.pg)
        replicas = generator_devices // (self.tg * self.pg)
        return GenLayout(
            train=TrainLayout(p=self.pg, t=self.tg, d=replicas), tg=self.tg, pg=self.pg
        )


@dataclass(frozen=True, kw_only=True)
class Plan:
    name: str
    workload: Workload
    cluster: ClusterSpec
    sets: tuple[DeviceSet, ...]
    parallelism: Mapping[Role, RoleParallelism] = field(hash=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "parallelism", frozen(self.parallelism))
        _validate(self)

    # --- lookups ------------------------------------------------------------
    def set_of(self, role: Role) -> int:
        """Index of the set that trains / runs `role` (not the generator set)."""
        for i, s in enumerate(self.sets):
            if role in s.roles and not s.generator:
                return i
        raise AssertionError(f"role {role} has no set")  # _validate guarantees one

    def generator_set(self) -> int | None:
        for i, s in enumerate(self.sets):
            if s.generator:
                return i
        return None

    def pool_of(self, set_index: int) -> PoolSpec:
        return self.cluster.pool(self.sets[set_index].pool)

    @property
    def placement(self) -> tuple[tuple[Role, ...], ...]:
        """The partition of roles into colocated sets (generator set excluded)."""
        return tuple(s.roles for s in self.sets if not s.generator)

    @property
    def num_gpus(self) -> int:
        return sum(s.num_devices for s in self.sets)

    def content_hash(self) -> str:
        """sha256 over the plan's canonical content (names excluded), first 16 hex digits."""
        return self._content_hash

    @cached_property
    def _content_hash(self) -> str:
        data = plan_to_dict(self)
        data.pop("name")
        blob = json.dumps(data, sort_keys=True, separators=(",", ":")).encode()
        return hashlib.sha256(blob).hexdigest()[:16]


def _validate(plan: Plan) -> None:
    roles = plan.workload.roles
    seen: dict[Role, int] = {}
    for i, s in enumerate(plan.sets):
        where = f"plan {plan.name!r} set #{i + 1} ({s.label()})"
        if not s.roles:
            raise SpecError(f"{where}: a set needs at least one role")
        pool = plan.cluster.pool(s.pool)
        if (
            s.num_devices <= 0
            or s.first_device < 0
            or s.first_device + s.num_devices > pool.num_gpus
        ):
            raise SpecError(
                f"{where}: devices [{s.first_device}, {s.first_device + s.num_devices}) do not fit "
                f"in pool {pool.name!r} of {pool.num_gpus} devices"
            )
        if s.generator:
            if s.roles != (Role.ACTOR,):
                raise SpecError(f"{where}: a generator set holds the actor alone")
            continue
        for r in s.roles:
            if r not in roles:
                raise SpecError(f"{where}: role {r} is not in workload {plan.workload.name!r}")
            if r in seen:
                raise SpecError(f"{where}: role {r} is already placed in set #{seen[r] + 1}")
            seen[r] = i
    missing = [r.value for r in roles if r not in seen]
    if missing:
        raise SpecError(f"plan {plan.name!r}: role(s) {', '.join(missing)} are in no set")
    _validate_devices_disjoint(plan)
    for role in roles:
        _validate_role(plan, role)


def _validate_devices_disjoint(plan: Plan) -> None:
    used: dict[tuple[str, int], int] = {}
    for i, s in enumerate(plan.sets):
        for dev in s.devices():
            if (s.pool, dev) in used:
                raise SpecError(
                    f"plan {plan.name!r}: device {dev} of pool {s.pool!r} is in set "
                    f"#{used[(s.pool, dev)] + 1} and set #{i + 1}; sets must not overlap"
                )
            used[(s.pool, dev)] = i


def _check_tp(where: str, tp: int, model: ModelSpec, pool: PoolSpec) -> None:
    if model.num_heads % tp:
        raise SpecError(f"{where}: tensor parallel {tp} must divide the {model.num_heads} heads")
    if not model.supports_tp(tp):
        raise SpecError(
            f"{where}: tensor parallel {tp} and the {model.num_kv_heads} KV heads must divide "
            "one another"
        )
    if tp > pool.gpus_per_node:
        raise SpecError(
            f"{where}: tensor parallel {tp} exceeds the {pool.gpus_per_node} devices of a node "
            "(TP stays inside a node)"
        )


def _check_tp_groups_in_nodes(
    where: str, s: DeviceSet, pool: PoolSpec, groups: list[list[int]]
) -> None:
    """Rank r of a set runs on the set's r-th device; a TP group must share one node."""
    for group in groups:
        nodes = {(s.first_device + r) // pool.gpus_per_node for r in group}
        if len(nodes) > 1:
            raise SpecError(
                f"{where}: tensor-parallel ranks {group} would span nodes {sorted(nodes)}; "
                "start the set on a node boundary or use a smaller t"
            )


def _check_cp(where: str, lay: TrainLayout, model: ModelSpec, seq: int) -> None:
    """Context parallelism must split every sample and, for Ulysses, the heads.

    Ring (Megatron CP) cuts a sequence into 2·cp chunks, rank i holding chunks i and
    2·cp − 1 − i so that causal attention is balanced; Ulysses cuts it into cp.
    Ulysses then gives each rank heads/(t·cp) query heads; verl asserts that the
    KV heads divide by its degree or the degree by them (KV heads are repeated).
    """
    chunks = 2 * lay.cp if lay.cp_kind is CPKind.RING else lay.cp
    if seq % chunks:
        raise SpecError(
            f"{where}: {lay.cp_kind} context parallel cp={lay.cp} cuts each sample into "
            f"{chunks} equal chunks; prompt_len + response_len = {seq} tokens does not "
            f"divide by {chunks} (choose lengths that do, or another cp)"
        )
    if lay.cp_kind is CPKind.ULYSSES:
        heads, kv_heads = model.num_heads // lay.t, model.kv_heads_per_rank(lay.t)
        if heads % lay.cp or (kv_heads % lay.cp and lay.cp % kv_heads):
            raise SpecError(
                f"{where}: ulysses cp={lay.cp} must divide the {heads} attention heads per "
                f"tensor-parallel rank, and divide or be a multiple of its {kv_heads} KV heads "
                f"({model.name!r}: {model.num_heads} heads, {model.num_kv_heads} KV heads, "
                f"t={lay.t}); choose such a cp"
            )


def _validate_role(plan: Plan, role: Role) -> None:
    where = f"plan {plan.name!r} role {role}"
    if role not in plan.parallelism:
        raise SpecError(f"{where}: missing [parallelism.{role}]")
    par = plan.parallelism[role]
    model = plan.workload.models[role]
    s = plan.sets[plan.set_of(role)]
    pool = plan.cluster.pool(s.pool)
    if par.train.world_size != s.num_devices:
        lay = par.train
        raise SpecError(
            f"{where}: p*t*cp*d = {lay.p}*{lay.t}*{lay.cp}*{lay.d} = {lay.world_size} "
            f"must equal the {s.num_devices} devices of its set"
        )
    if par.offload_optimizer and not role.trained:
        raise SpecError(
            f"{where}: offload_optimizer needs a trained role (actor, critic); {role} has no "
            "optimizer"
        )
    longest = plan.workload.batch.prompt_len + plan.workload.batch.response_len
    for budget in par.token_budgets:
        if budget < longest:
            # A sample is never split across micro-batches (verl asserts the same).
            raise SpecError(
                f"{where}: a micro-batch of {budget} tokens cannot hold the longest sample, "
                f"prompt_len + response_len = {longest} tokens; set micro_batch_tokens "
                f"(and forward_micro_batch_tokens) to at least {longest}"
            )
    _check_tp(where, par.train.t, model, pool)
    _check_tp_groups_in_nodes(where, s, pool, par.train.tp_groups())
    if par.train.cp > 1:
        _check_cp(where, par.train, model, longest)
    if par.train.e > 1:
        if model.moe is None:
            raise SpecError(
                f"{where}: expert parallel e={par.train.e} needs a mixture-of-experts model; "
                f"{model.name!r} is dense (use e = 1)"
            )
        if model.moe.num_experts % par.train.e:
            raise SpecError(
                f"{where}: expert parallel e={par.train.e} must divide the "
                f"{model.moe.num_experts} experts of {model.name!r}"
            )
    try:
        par.train.stage_layers(model.num_layers)
    except SpecError as exc:
        raise SpecError(f"{where}: {exc}") from None
    if role is Role.ACTOR:
        gen_set = plan.generator_set()
        gen_devices = plan.sets[gen_set].num_devices if gen_set is not None else None
        if gen_devices is not None and gen_devices % (par.tg * par.pg):
            raise SpecError(
                f"{where}: tg*pg = {par.tg * par.pg} must divide the "
                f"{gen_devices} generator devices"
            )
        par.gen_layout(gen_devices)  # validates tg | t and pg | p for colocated generation
        _check_tp(f"{where} generation", par.tg, model, pool)
        # Colocated generation stages gather whole training stages (pg | p, checked by
        # gen_layout); a generator set splits the layers as vLLM does, pg <= L.
        if gen_set is not None:
            try:
                generator_stage_layers(model.num_layers, par.pg)
            except SpecError as exc:
                raise SpecError(f"{where}: {exc}") from None


# --- TOML --------------------------------------------------------------------

_PAR_KEYS = (
    "p",
    "t",
    "d",
    "e",
    "cp",
    "cp_kind",
    "sequence_parallel",
    "first_stage_layers",
    "last_stage_layers",
    "tg",
    "pg",
    "micro_batch",
    "forward_micro_batch",
    "micro_batch_tokens",
    "forward_micro_batch_tokens",
    "zero",
    "recompute",
    "offload_optimizer",
    "optimizer_step",
    "offload_params",
)


def _optimizer_step(name: str, where: str) -> OptimizerStep:
    return parse_enum(OptimizerStep, name, where, "optimizer_step")


def _parallelism_from_table(t: Table) -> RoleParallelism:
    t.reject_unknown(_PAR_KEYS)
    return RoleParallelism(
        train=TrainLayout(
            p=t.get_int("p", 1),
            t=t.get_int("t", 1),
            d=t.get_int("d", 1),
            e=t.get_int("e", 1),
            cp=t.get_int("cp", 1),
            cp_kind=parse_enum(CPKind, t.get_str("cp_kind", "ring"), t.where, "cp_kind"),
            sequence_parallel=t.get_bool("sequence_parallel", False),
            first_stage_layers=t.get_int("first_stage_layers", 0),
            last_stage_layers=t.get_int("last_stage_layers", 0),
        ),
        tg=t.get_int("tg", 1),
        pg=t.get_int("pg", 1),
        micro_batch=t.get_int("micro_batch", 1),
        forward_micro_batch=t.get_int("forward_micro_batch", 0),
        micro_batch_tokens=t.get_int("micro_batch_tokens", 0),
        forward_micro_batch_tokens=t.get_int("forward_micro_batch_tokens", 0),
        zero=t.get_int("zero", 1),
        recompute=t.get_bool("recompute", True),
        offload_optimizer=t.get_bool("offload_optimizer", False),
        optimizer_step=_optimizer_step(t.get_str("optimizer_step", "device"), t.where),
        offload_params=t.get_bool("offload_params", False),
    )


def plan_from_dict(data: dict[str, Any], where: str, base_dir: Path) -> Plan:
    t = Table(data, where)
    t.reject_unknown(("name", "workload", "cluster", "sets", "parallelism"))
    wl = data.get("workload")
    workload = (
        load_workload(base_dir / wl)
        if isinstance(wl, str)
        else workload_from_dict(t.table("workload").data, f"{where} [workload]", base_dir)
    )
    cl = data.get("cluster")
    cluster = (
        load_cluster(base_dir / cl)
        if isinstance(cl, str)
        else cluster_from_dict(t.table("cluster").data, f"{where} [cluster]")
    )
    sets = []
    for st in t.tables("sets"):
        st.reject_unknown(("roles", "pool", "first_device", "num_devices", "generator"))
        raw_roles = st.data.get("roles")
        if not isinstance(raw_roles, list) or not all(isinstance(r, str) for r in raw_roles):
            raise SpecError(f"{st.where}: roles must be a list of role names, got {raw_roles!r}")
        sets.append(
            DeviceSet(
                roles=tuple(
                    sorted((parse_role(r, st.where) for r in raw_roles), key=list(Role).index)
                ),
                pool=st.get_str("pool", cluster.pools[0].name),
                first_device=st.get_int("first_device", 0),
                num_devices=st.get_int("num_devices"),
                generator=st.get_bool("generator", False),
            )
        )
    pt = t.table("parallelism")
    parallelism = {parse_role(k, pt.where): _parallelism_from_table(pt.table(k)) for k in pt.data}
    return Plan(
        name=t.get_str("name", "plan"),
        workload=workload,
        cluster=cluster,
        sets=tuple(sets),
        parallelism=parallelism,
    )


def load_plan(path: str | Path) -> Plan:
    p = Path(path)
    return load_spec(p, lambda data, where: plan_from_dict(data, where, p.parent))


def plan_to_dict(plan: Plan) -> dict[str, Any]:
    """The plan with its workload and cluster inline, so the file stands alone."""
    sets = []
    for s in plan.sets:
        entry: dict[str, Any] = {
            "roles": [r.value for r in s.roles],
            "pool": s.pool,
            "first_device": s.first_device,
            "num_devices": s.num_devices,
        }
        if s.generator:
            entry["generator"] = True
        sets.append(entry)
    parallelism = {}
    for role in plan.workload.roles:
        par = plan.parallelism[role]
        row: dict[str, Any] = {"p": par.train.p, "t": par.train.t, "d": par.train.d}
        if par.train.e > 1:
            row["e"] = par.train.e
        # Set only when used, so that plans without them keep their content hash.
        if par.train.cp > 1:
            row["cp"] = par.train.cp
        if par.train.cp_kind is not CPKind.RING:
            row["cp_kind"] = par.train.cp_kind.value
        if par.train.sequence_parallel:
            row["sequence_parallel"] = True
        # Set only when uneven, so that even plans keep their content hash.
        if par.train.first_stage_layers:
            row["first_stage_layers"] = par.train.first_stage_layers
        if par.train.last_stage_layers:
            row["last_stage_layers"] = par.train.last_stage_layers
        if role is Role.ACTOR:
            row.update(tg=par.tg, pg=par.pg)
        row.update(micro_batch=par.micro_batch, zero=par.zero, recompute=par.recompute)
        if par.forward_micro_batch:  # set only when given, so that older plans keep their hash
            row["forward_micro_batch"] = par.forward_micro_batch
        for key in ("micro_batch_tokens", "forward_micro_batch_tokens"):
            if getattr(par, key):  # likewise
                row[key] = getattr(par, key)
        if par.offload_optimizer:
            row["offload_optimizer"] = True
        if par.optimizer_step is not OptimizerStep.DEVICE:  # the default is left out: same hash
            row["optimizer_step"] = par.optimizer_step.value
        if par.offload_params:  # likewise
            row["offload_params"] = True
        parallelism[role.value] = row
    return {
        "name": plan.name,
        "workload": workload_to_dict(plan.workload),
        "cluster": cluster_to_dict(plan.cluster),
        "sets": sets,
        "parallelism": parallelism,
    }


def save_plan(plan: Plan, path: str | Path) -> Path:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    header = f"# placeflow plan {plan.name!r}, content hash {plan.content_hash()}\n"
    p.write_text(header + tomli_w.dumps(plan_to_dict(plan)), encoding="utf-8")
    return p


answer_calls(__name__, "plan")  # `placeflow.plan(cluster, workload)` is the API's planner
