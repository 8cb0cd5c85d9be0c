"""Workload: which RL algorithm, which models in which roles, and the batch shape.

```toml
name = "ppo-llama2-7b"
algorithm = "ppo"                 # ppo | grpo | remax | safe-rlhf
rollout_engine = "builtin"        # builtin | vllm (optional; how decode is priced)
gpu_memory_utilization = 0.9      # share of the memory left after resident state for KV
max_num_seqs = 256                # sequences a generation replica runs at once (vLLM's)
generation_precision = "bf16"     # bf16 | fp8 (vLLM's quantization="fp8"; FP8 GPUs only)
kv_cache_dtype = "auto"           # auto | fp8 (vLLM's kv_cache_dtype)
train_precision = "bf16"          # bf16 | fp8 (TransformerEngine FP8 GEMMs; FP8 GPUs only)
[models]                          # role -> catalogue name or HF config path
actor = "llama-2-7b"
critic = "llama-2-7b"
ref = "llama-2-7b"
reward = "llama-2-7b"
[batch]
prompts_per_step = 1024
samples_per_prompt = 1
prompt_len = 1024
response_len = 1024
ppo_epochs = 1
mini_batches = 4
```

Roles per algorithm (`ROLES`): PPO uses actor, critic, ref, reward (4 models);
GRPO and ReMax drop the critic, and may drop the reward model in favour of a
rule-based `reward_function`; Safe-RLHF adds a cost model (5 models).

Prompts come from `[data]` (JSONL or parquet files, `executor/data.py`); a
workload without it is run on the dataset shipped for its built-in checker
(`reward_function = "arith"` or `"reverse"`; `arith`'s with a reward model alone),
`examples/data/<name>.jsonl`, written by `examples/data/generate.py`. Every path a
workload names (a model's `config.json` or checkpoint directory, the data files,
a `file.py:function` reward) is relative to the workload file, as a plan's
`workload` and `cluster` are relative to the plan file; it is stored resolved
(absolute), so that a plan written with the workload inline still finds them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from placeflow.catalogue import CATALOGUE, get_model
from placeflow.errors import SpecError
from placeflow.frozen import frozen
from placeflow.lora import LoRATargets, adapter_params_per_layer, check_adaptable
from placeflow.models import ModelSpec
from placeflow.tomlio import Table, load_spec, parse_enum


class Algorithm(StrEnum):
    PPO = "ppo"
    GRPO = "grpo"
    REMAX = "remax"
    SAFE_RLHF = "safe-rlhf"


class Precision(StrEnum):
    """The number format of a phase's GEMMs.

    bf16: weights and GEMMs in bf16. fp8: FP8 (e4m3) GEMMs with per-tensor scales,
    on GPUs with FP8 tensor cores (Hopper, Blackwell). For generation that is vLLM's
    `quantization="fp8"`: the generation copy of the weights is 1 byte per parameter
    and the weights are quantised as they arrive. For training it is
    TransformerEngine's FP8 recipe (NeMo RL, Megatron's `fp8`): the GEMMs of the
    trained roles' forward and backward run in FP8 while the master weights,
    gradients and optimizer state keep their formats.
    """

    BF16 = "bf16"
    FP8 = "fp8"


class KVCacheDType(StrEnum):
    """vLLM's kv_cache_dtype: auto (the model's dtype) or fp8 (1 byte per element)."""

    AUTO = "auto"
    FP8 = "fp8"


class RolloutEngine(StrEnum):
    """The engine that generates rollouts (the simulator prices its decode step).

    builtin: placeflow's batched KV-cache sampler: eager decode on CPU and under
    tensor parallelism, CUDA-graph decode on a GPU with whole-model ranks
    (`decode_graphed`); vllm: vLLM, which replays CUDA graphs for decode on GPUs.
    """

    BUILTIN = "builtin"
    VLLM = "vllm"


# Eager runs of the built-in engine's decode step before it is captured as a CUDA graph
# (torch's capture recipe: warm up on a side stream, then capture), once per generation.
GRAPH_WARMUP_RUNS = 2


def decode_graphed(engine: RolloutEngine, device_kind: str, tg: int) -> bool:
    """Whether `engine` replays its decode steps as CUDA graphs on `tg`-way generation
    ranks of a `device_kind` device: never off CUDA (a graph saves launches, which a CPU
    does not have); vLLM always on CUDA; the built-in sampler with whole-model ranks only
    (tg = 1: no TP collective inside the step), where it runs fixed-shape steps over its
    preallocated cache (`executor.engines.sampler.DecodeMode.GRAPH`), attention over the
    whole capacity under a mask, captured once per generation."""
    if device_kind != "cuda":
        return False
    return engine is RolloutEngine.VLLM or tg == 1


class Role(StrEnum):
    ACTOR = "actor"
    CRITIC = "critic"
    REF = "ref"
    REWARD = "reward"
    COST = "cost"

    @property
    def has_value_head(self) -> bool:
        """Critic, reward and cost models output a scalar, not logits."""
        return self in (Role.CRITIC, Role.REWARD, Role.COST)

    @property
    def trained(self) -> bool:
        """The actor and the critic are trained (their engines `_Trainable`); the
        reference, reward and cost models are frozen (`ScoringEngine`)."""
        return self in (Role.ACTOR, Role.CRITIC)


# (required roles, optional roles) per algorithm.
ROLES: dict[Algorithm, tuple[frozenset[Role], frozenset[Role]]] = {
    Algorithm.PPO: (frozenset({Role.ACTOR, Role.CRITIC, Role.REWARD}), frozenset({Role.REF})),
    Algorithm.GRPO: (frozenset({Role.ACTOR}), frozenset({Role.REF, Role.REWARD})),
    Algorithm.REMAX: (frozenset({Role.ACTOR}), frozenset({Role.REF, Role.REWARD})),
    Algorithm.SAFE_RLHF: (frozenset(Role), frozenset()),
}


@dataclass(frozen=True, kw_only=True)
class BatchSpec:
    """Shape of one RL step. Lengths in tokens; `response_len` is the maximum.

    Response lengths are `fixed` (all `response_len`) or `lognormal`: median
    `response_len_median`, log-space spread `response_len_sigma`, clipped at
    `response_len`. A long tail makes stragglers that keep a generation running.
    """

    prompts_per_step: int
    samples_per_prompt: int = 1
    prompt_len: int
    response_len: int
    ppo_epochs: int = 1
    mini_batches: int = 1
    response_len_dist: str = "fixed"
    response_len_median: int = 0
    response_len_sigma: float = 0.6

    def __post_init__(self) -> None:
        for name in (
            "prompts_per_step",
            "samples_per_prompt",
            "prompt_len",
            "response_len",
            "ppo_epochs",
            "mini_batches",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise SpecError(f"[batch] {name} must be a positive integer, got {value!r}")
        if self.mini_batches > self.num_samples:
            raise SpecError(
                f"[batch] mini_batches={self.mini_batches} exceeds the {self.num_samples} samples "
                "per step (prompts_per_step x samples_per_prompt); use at most that many"
            )
        if self.response_len_dist not in ("fixed", "lognormal"):
            raise SpecError(
                f"[batch] response_len_dist must be 'fixed' or 'lognormal', "
                f"got {self.response_len_dist!r}"
            )
        if self.response_len_dist == "lognormal" and not (
            0 < self.response_len_median <= self.response_len and self.response_len_sigma > 0
        ):
            raise SpecError(
                "[batch] lognormal response lengths need 0 < response_len_median <= response_len "
                f"and response_len_sigma > 0, got median {self.response_len_median}, "
                f"sigma {self.response_len_sigma}"
            )
        if self.num_samples % self.mini_batches:
            raise SpecError(
                f"[batch] mini_batches={self.mini_batches} must divide the {self.num_samples} "
                "samples per step (prompts_per_step x samples_per_prompt)"
            )

    @property
    def num_samples(self) -> int:
        return self.prompts_per_step * self.samples_per_prompt

    @property
    def seq_len(self) -> int:
        return self.prompt_len + self.response_len

    @property
    def tokens_per_step(self) -> int:
        """Prompt plus response tokens of all samples (at maximum response length)."""
        return self.num_samples * self.seq_len


@dataclass(frozen=True, kw_only=True)
class RLConfig:
    """Optimisation and sampling settings of the RL loop (the executor's; the simulator
    ignores them). Defaults follow common GRPO/PPO recipes for small models."""

    lr: float = 1e-5
    critic_lr: float = 1e-5
    kl_coef: float = 0.0  # GRPO: k3 KL in the loss; PPO: k1 KL in the reward
    clip_ratio: float = 0.2
    value_clip: float = 0.2
    entropy_coef: float = 0.0
    gamma: float = 1.0
    lam: float = 0.95
    temperature: float = 1.0
    top_p: float = 1.0
    grad_clip: float = 1.0
    weight_decay: float = 0.0
    ignore_stop: bool = False  # fixed-length responses of response_len tokens (benchmarks)
    # Safe-RLHF: the cost limit d, and the Lagrange multiplier's start and step size.
    cost_limit: float = 0.0
    lambda_init: float = 1.0
    lambda_lr: float = 0.05

    def __post_init__(self) -> None:
        for name in ("lr", "critic_lr"):
            if not getattr(self, name) > 0:
                raise SpecError(f"[rl] {name} must be > 0, got {getattr(self, name)!r}")
        for name in ("kl_coef", "clip_ratio", "value_clip", "entropy_coef", "grad_clip",
                     "weight_decay", "temperature", "lambda_init", "lambda_lr"):  # fmt: skip
            if getattr(self, name) < 0:
                raise SpecError(f"[rl] {name} must be >= 0, got {getattr(self, name)!r}")
        for name in ("gamma", "lam", "top_p"):
            if not 0 < getattr(self, name) <= 1:
                raise SpecError(f"[rl] {name} must be in (0, 1], got {getattr(self, name)!r}")


_RL_KEYS = tuple(f.name for f in dataclasses.fields(RLConfig))


@dataclass(frozen=True, kw_only=True)
class DataSpec:
    """Where prompts and ground truths come from (`[data]`); paths already resolved.

    Each row of `train` (and `validation`) holds a prompt under `prompt_key` (a
    string, or a list of chat messages with `chat_template`) and the ground truth
    handed to the reward function under `answer_key`; `data_source` and
    `extra_info` columns, when present, are passed on as verl does. The rows are
    shuffled with the run seed once per epoch; `epochs` bounds the passes (None:
    as many as the steps need). The validation split is scored greedily every
    `validate_every` steps (None: before the first step and after the last only),
    on its first `validation_size` rows (None: all).
    """

    train: Path
    validation: Path | None = None
    prompt_key: str = "prompt"
    answer_key: str = "answer"
    chat_template: bool = False
    shuffle: bool = True
    epochs: int | None = None
    validate_every: int | None = None
    validation_size: int | None = None

    def __post_init__(self) -> None:
        for name in ("epochs", "validate_every", "validation_size"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise SpecError(f"[data] {name} must be a positive integer, got {value!r}")
        for name in ("train", "validation"):
            path = getattr(self, name)
            if path is not None and not path.is_file():
                raise SpecError(
                    f"[data] {name}: {path}: file not found; give a JSONL or parquet file"
                )
            if path is not None and path.suffix not in DATA_SUFFIXES:
                raise SpecError(
                    f"[data] {name}: {path}: unknown file type {path.suffix!r}; "
                    f"use {' or '.join(DATA_SUFFIXES)}"
                )
        if (self.validate_every or self.validation_size) and self.validation is None:
            raise SpecError("[data] validate_every and validation_size need a validation file")
        for name in ("prompt_key", "answer_key"):
            if not getattr(self, name):
                raise SpecError(f"[data] {name} must not be empty")


@dataclass(frozen=True, kw_only=True)
class LoRASpec:
    """`[lora]`: low-rank adapters of rank `rank` on `targets` of the trained roles in
    `roles`, their base weights frozen (`placeflow/lora.py`)."""

    rank: int
    alpha: float = 0.0  # the adapters' scale is alpha / rank; 0 means alpha = rank
    targets: LoRATargets = LoRATargets.ALL_LINEAR
    roles: tuple[Role, ...] = (Role.ACTOR,)

    def __post_init__(self) -> None:
        if isinstance(self.rank, bool) or not isinstance(self.rank, int) or self.rank <= 0:
            raise SpecError(f"[lora] rank must be a positive integer, got {self.rank!r}")
        if self.alpha < 0:
            raise SpecError(f"[lora] alpha must be >= 0 (0: alpha = rank), got {self.alpha}")
        if not self.roles:
            raise SpecError("[lora] roles must name at least one trained role: actor, critic")
        untrained = [r.value for r in self.roles if r not in (Role.ACTOR, Role.CRITIC)]
        if untrained:
            raise SpecError(
                f"[lora] roles: {', '.join(untrained)} are not trained; adapters train the "
                "actor or the critic"
            )

    def adapts(self, role: Role) -> bool:
        return role in self.roles

    def params(self, model: ModelSpec) -> int:
        """Trainable adapter parameters of `model` (every decoder layer)."""
        return model.num_layers * adapter_params_per_layer(model, self.rank, self.targets)


_LORA_KEYS = ("rank", "alpha", "targets", "roles")


DATA_SUFFIXES = (".jsonl", ".parquet")
_DATA_KEYS = tuple(f.name for f in dataclasses.fields(DataSpec))


DEFAULT_GPU_MEMORY_UTILIZATION = 0.9  # vLLM's default
DEFAULT_MAX_NUM_SEQS = 256  # vLLM's LLM class default (see Workload.max_num_seqs)
# More batches in flight than this buy nothing the simulator can show (each adds a
# weight snapshot on the trainer) and leave the policy far behind its data.
MAX_STALENESS = 8


@dataclass(frozen=True, kw_only=True)
class Workload:
    name: str
    algorithm: Algorithm
    models: Mapping[Role, ModelSpec] = field(hash=False)
    batch: BatchSpec
    reward_function: str | None = None
    # Ray tasks that score a step's responses with the reward function (0: on the driver).
    reward_workers: int = 0
    # Staleness bound of asynchronous RL: the rollout a step trains on may come from a
    # policy up to this many updates old, so the generator set runs that many batches
    # ahead of the trainer. 0: on-policy (synchronous); 1: one-step-off (TOML
    # `async_one_step_off = true`, its older spelling); k >= 2: k-step-off.
    max_staleness: int = 0
    rollout_engine: RolloutEngine = RolloutEngine.BUILTIN
    # vLLM's gpu_memory_utilization (default 0.9 as vLLM's), applied to what a device has
    # left after the reserve and the resident state: the KV cache gets that share, the
    # rest stays free for the sampler's activations and CUDA graphs.
    gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION
    # vLLM's max_num_seqs: sequences one generation replica schedules at once. 256 is
    # the default of vLLM's LLM class (vllm/engine/arg_utils.py); recent vLLM raises it
    # to 1024 on GPUs of >= 70 GiB other than A100.
    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS
    generation_precision: Precision = Precision.BF16
    kv_cache_dtype: KVCacheDType = KVCacheDType.AUTO
    train_precision: Precision = Precision.BF16
    rl: RLConfig = field(default_factory=RLConfig)
    data: DataSpec | None = None
    lora: LoRASpec | None = None  # None: full fine-tuning of every trained role

    def lora_of(self, role: Role) -> LoRASpec | None:
        """The adapters `role` trains, or None when it trains its full weights."""
        return self.lora if self.lora is not None and self.lora.adapts(role) else None

    @property
    def recomputes_old_logprobs(self) -> bool:
        """Whether a step re-scores the sampled tokens with the actor before updating.

        GRPO and ReMax with one optimizer step per batch (ppo_epochs = mini_batches
        = 1) are on-policy at that step: the old policy is the current one, so the
        ratio is exp(logp - logp.detach()) = 1 and the update's own forward gives
        it (as TRL does). PPO re-scores always: its KL-shaped reward needs them.
        """
        single_step = self.batch.ppo_epochs == 1 and self.batch.mini_batches == 1
        return not (self.algorithm in (Algorithm.GRPO, Algorithm.REMAX) and single_step)

    @property
    def kl_in_loss(self) -> bool:
        """Whether the actor's loss holds a KL term to the reference (GRPO's k3; ReMax
        and Safe-RLHF alike): a reference model and a KL coefficient, in any algorithm
        but PPO, which puts its KL into the reward instead."""
        return (
            Role.REF in self.models
            and self.algorithm is not Algorithm.PPO
            and bool(self.rl.kl_coef)
        )

    def __post_init__(self) -> None:
        object.__setattr__(self, "models", frozen(self.models))
        required, optional = ROLES[self.algorithm]
        roles = set(self.models)
        missing = required - roles
        if Role.REWARD in missing and self.reward_function:
            missing = missing - {Role.REWARD}
        if missing:
            raise SpecError(
                f"workload {self.name!r}: {self.algorithm} needs model(s) for "
                f"{', '.join(sorted(missing))} in [models]"
            )
        extra = roles - required - optional
        if extra:
            raise SpecError(
                f"workload {self.name!r}: {self.algorithm} has no role(s) "
                f"{', '.join(sorted(extra))}; "
                f"its roles: {', '.join(sorted(required | optional))}"
            )
        if Role.REWARD not in roles and not self.reward_function:
            raise SpecError(
                f"workload {self.name!r}: give a reward model ([models] reward = ...) "
                "or a rule-based reward_function"
            )
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise SpecError(
                f"workload {self.name!r}: gpu_memory_utilization is a fraction in (0, 1], "
                f"got {self.gpu_memory_utilization}"
            )
        if not 0 <= self.max_staleness <= MAX_STALENESS:
            raise SpecError(
                f"workload {self.name!r}: max_staleness is the number of updates a rollout "
                f"may lag the trainer, 0 (on-policy) to {MAX_STALENESS}; got {self.max_staleness}"
            )
        if self.max_num_seqs < 1:
            raise SpecError(
                f"workload {self.name!r}: max_num_seqs must be a positive integer, "
                f"got {self.max_num_seqs}"
            )
        if self.lora is not None:
            for role in self.lora.roles:
                if role not in self.models:
                    raise SpecError(
                        f"workload {self.name!r}: [lora] roles names {role}, which "
                        f"{self.algorithm} does not have here; its trained roles: "
                        f"{', '.join(r for r in (Role.ACTOR, Role.CRITIC) if r in self.models)}"
                    )
                check_adaptable(self.models[role], self.lora.rank, f"[lora] {role}")
        if self.reward_workers < 0:
            raise SpecError(
                f"workload {self.name!r}: reward_workers must be 0 (score on the driver) or "
                f"more, got {self.reward_workers}"
            )
        if self.algorithm is Algorithm.GRPO and self.batch.samples_per_prompt < 2:
            raise SpecError(
                f"workload {self.name!r}: GRPO normalises rewards within a group, so "
                f"samples_per_prompt must be at least 2, got {self.batch.samples_per_prompt}"
            )

    @property
    def asynchronous(self) -> bool:
        """Whether rollouts may come from an older policy than the one trained
        (max_staleness >= 1; only a plan with a generator set apart runs so)."""
        return self.max_staleness >= 1

    @property
    def roles(self) -> tuple[Role, ...]:
        """Roles in canonical order (the order of `Role`)."""
        return tuple(r for r in Role if r in self.models)


def parse_role(name: str, where: str) -> Role:
    """A role by name; an unknown name is a SpecError listing the roles."""
    return parse_enum(Role, name, where, "role")


_BATCH_KEYS = tuple(f.name for f in dataclasses.fields(BatchSpec))


def resolve_path(value: str, base_dir: Path | None) -> Path:
    """`value` relative to `base_dir` (the directory of the file that names it), absolute."""
    p = Path(value).expanduser()
    return (p if p.is_absolute() or base_dir is None else base_dir / p).resolve()


def resolve_model(value: str, base_dir: Path | None) -> ModelSpec:
    """A catalogue name, or a path (relative to `base_dir`) to a config.json or a checkpoint
    directory; a path model is named by its resolved path (the executor loads it from there)."""
    if value in CATALOGUE:
        return get_model(value)
    path = resolve_path(value, base_dir)
    if path.exists():
        return get_model(str(path))
    if "/" in value or value.endswith(".json"):
        raise SpecError(
            f"model {value!r}: {path} not found (a model path is relative to the workload "
            "file); give a config.json, a checkpoint directory or a catalogue name"
        )
    return get_model(value)


def resolve_reward_function(value: str, base_dir: Path | None) -> str:
    """`path/to/file.py:function` with the file resolved; other forms (a built-in name,
    `package.module:function`) as given."""
    file, sep, func = value.rpartition(":")
    if sep and file.endswith(".py"):
        return f"{resolve_path(file, base_dir)}:{func}"
    return value


def _data_spec(t: Table, base_dir: Path | None) -> DataSpec:
    t.reject_unknown(_DATA_KEYS)

    def optional_int(key: str) -> int | None:
        return t.get_int(key) if t.has(key) else None

    return DataSpec(
        train=resolve_path(t.get_str("train"), base_dir),
        validation=resolve_path(t.get_str("validation"), base_dir) if t.has("validation") else None,
        prompt_key=t.get_str("prompt_key", "prompt"),
        answer_key=t.get_str("answer_key", "answer"),
        chat_template=t.get_bool("chat_template", False),
        shuffle=t.get_bool("shuffle", True),
        epochs=optional_int("epochs"),
        validate_every=optional_int("validate_every"),
        validation_size=optional_int("validation_size"),
    )


_WORKLOAD_KEYS = (
    "name", "algorithm", "models", "batch", "reward_function", "reward_workers",
    "async_one_step_off", "max_staleness", "rl", "data", "rollout_engine", "gpu_memory_utilization",
    "max_num_seqs", "lora", "generation_precision", "kv_cache_dtype", "train_precision",
)  # fmt: skip


def _max_staleness(t: Table, where: str) -> int:
    """`max_staleness = k`, or the older `async_one_step_off = true` (k = 1); not both."""
    if t.has("max_staleness") and t.has("async_one_step_off"):
        raise SpecError(
            f"{where}: give max_staleness or async_one_step_off, not both "
            "(async_one_step_off = true is max_staleness = 1)"
        )
    if t.has("max_staleness"):
        return t.get_int("max_staleness")
    return 1 if t.get_bool("async_one_step_off", False) else 0


def workload_from_dict(
    data: dict, where: str = "workload", base_dir: Path | None = None
) -> Workload:
    """A workload from its TOML table; paths in it are relative to `base_dir` (the
    directory of the file it came from; None: the working directory)."""
    t = Table(data, where)
    t.reject_unknown(_WORKLOAD_KEYS)
    algorithm = parse_enum(Algorithm, t.get_str("algorithm"), where, "algorithm")
    models_t = t.table("models")
    models = {
        parse_role(role, models_t.where): resolve_model(models_t.get_str(role), base_dir)
        for role in models_t.data
    }
    bt = t.table("batch")
    bt.reject_unknown(_BATCH_KEYS)
    batch = BatchSpec(
        prompts_per_step=bt.get_int("prompts_per_step"),
        samples_per_prompt=bt.get_int("samples_per_prompt", 1),
        prompt_len=bt.get_int("prompt_len"),
        response_len=bt.get_int("response_len"),
        ppo_epochs=bt.get_int("ppo_epochs", 1),
        mini_batches=bt.get_int("mini_batches", 1),
        response_len_dist=bt.get_str("response_len_dist", "fixed"),
        response_len_median=bt.get_int("response_len_median", 0),
        response_len_sigma=bt.get_float("response_len_sigma", 0.6),
    )
    reward_function = (
        resolve_reward_function(t.get_str("reward_function"), base_dir)
        if t.has("reward_function")
        else None
    )
    rl = RLConfig()
    if t.has("rl"):
        rt = t.table("rl")
        rt.reject_unknown(_RL_KEYS)
        values: dict[str, Any] = {
            k: rt.get_bool(k) if k == "ignore_stop" else rt.get_float(k)
            for k in _RL_KEYS
            if rt.has(k)
        }
        rl = RLConfig(**values)
    return Workload(
        name=t.get_str("name", "workload"),
        algorithm=algorithm,
        models=models,
        batch=batch,
        reward_function=reward_function,
        reward_workers=t.get_int("reward_workers", 0),
        max_staleness=_max_staleness(t, where),
        rollout_engine=_rollout_engine(t.get_str("rollout_engine", "builtin"), where),
        gpu_memory_utilization=t.get_float(
            "gpu_memory_utilization", DEFAULT_GPU_MEMORY_UTILIZATION
        ),
        max_num_seqs=t.get_int("max_num_seqs", DEFAULT_MAX_NUM_SEQS),
        generation_precision=parse_enum(
            Precision, t.get_str("generation_precision", "bf16"), where, "generation_precision"
        ),
        kv_cache_dtype=parse_enum(
            KVCacheDType, t.get_str("kv_cache_dtype", "auto"), where, "kv_cache_dtype"
        ),
        train_precision=parse_enum(
            Precision, t.get_str("train_precision", "bf16"), where, "train_precision"
        ),
        rl=rl,
        data=_data_spec(t.table("data"), base_dir) if t.has("data") else None,
        lora=_lora_spec(t.table("lora")) if t.has("lora") else None,
    )


def _lora_spec(t: Table) -> LoRASpec:
    t.reject_unknown(_LORA_KEYS)
    raw_roles = t.data.get("roles", ["actor"])
    if not isinstance(raw_roles, list) or not all(isinstance(r, str) for r in raw_roles):
        raise SpecError(f"{t.where}: roles must be a list of role names, got {raw_roles!r}")
    return LoRASpec(
        rank=t.get_int("rank"),
        alpha=t.get_float("alpha", 0.0),
        targets=parse_enum(LoRATargets, t.get_str("targets", "all-linear"), t.where, "targets"),
        roles=tuple(parse_role(r, t.where) for r in raw_roles),
    )


def _rollout_engine(name: str, where: str) -> RolloutEngine:
    return parse_enum(RolloutEngine, name, where, "rollout_engine")


def load_workload(path: str | Path) -> Workload:
    base_dir = Path(path).resolve().parent
    return load_spec(path, lambda data, where: workload_from_dict(data, where, base_dir))


def workload_to_dict(w: Workload) -> dict[str, Any]:
    """The TOML table of a workload; `workload_from_dict` reads it back to an equal value."""
    b = w.batch
    batch: dict[str, Any] = {
        "prompts_per_step": b.prompts_per_step,
        "samples_per_prompt": b.samples_per_prompt,
        "prompt_len": b.prompt_len,
        "response_len": b.response_len,
        "ppo_epochs": b.ppo_epochs,
        "mini_batches": b.mini_batches,
        "response_len_dist": b.response_len_dist,
    }
    if b.response_len_dist == "lognormal":
        batch["response_len_median"] = b.response_len_median
        batch["response_len_sigma"] = b.response_len_sigma
    out: dict[str, Any] = {
        "name": w.name,
        "algorithm": w.algorithm.value,
        "models": {role.value: w.models[role].name for role in w.roles},
        "batch": batch,
    }
    # Staleness 0 and 1 keep their older spelling, so that those plans keep their hash.
    if w.max_staleness <= 1:
        out["async_one_step_off"] = w.max_staleness == 1
    else:
        out["max_staleness"] = w.max_staleness
    if w.reward_function:
        out["reward_function"] = w.reward_function
    if w.rollout_engine is not RolloutEngine.BUILTIN:  # the default is left out: same hash
        out["rollout_engine"] = w.rollout_engine.value
    if w.reward_workers:
        out["reward_workers"] = w.reward_workers
    # Left out at their defaults, so that older plans keep their content hash.
    if w.gpu_memory_utilization != DEFAULT_GPU_MEMORY_UTILIZATION:
        out["gpu_memory_utilization"] = w.gpu_memory_utilization
    if w.max_num_seqs != DEFAULT_MAX_NUM_SEQS:
        out["max_num_seqs"] = w.max_num_seqs
    if w.generation_precision is not Precision.BF16:
        out["generation_precision"] = w.generation_precision.value
    if w.kv_cache_dtype is not KVCacheDType.AUTO:
        out["kv_cache_dtype"] = w.kv_cache_dtype.value
    if w.train_precision is not Precision.BF16:
        out["train_precision"] = w.train_precision.value
    if w.data is not None:
        # Only what is set, with paths resolved, so that the table stands alone.
        out["data"] = {
            f.name: str(v) if isinstance(v, Path) else v
            for f in dataclasses.fields(DataSpec)
            if (v := getattr(w.data, f.name)) is not None
        }
    # Only settings that differ from the defaults, so older plans keep their content hash.
    rl = {k: getattr(w.rl, k) for k in _RL_KEYS if getattr(w.rl, k) != getattr(RLConfig(), k)}
    if rl:
        out["rl"] = rl
    if w.lora is not None:
        lora: dict[str, Any] = {"rank": w.lora.rank, "targets": w.lora.targets.value}
        if w.lora.alpha:
            lora["alpha"] = w.lora.alpha
        lora["roles"] = [r.value for r in w.lora.roles]
        out["lora"] = lora
    return out
