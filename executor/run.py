"""A training run: the RL loop on a plan, with a run directory, checkpoints and resume.

Run directory:
  manifest.json        plan name and content hash, profile name and file hash, workload,
                       seed, steps, package versions, start time, the command line
  plan.toml            the plan as run (loadable by `placeflow simulate`)
  workers.json         where each device of each set ran: Ray node id and IP, pid, device
  metrics.jsonl        one line per step: metrics, measured phase seconds, the step's
                       timeline (executor/timeline.py), a few samples
  validation.jsonl     with a validation split: one line per evaluation (greedy
                       responses, scored; `step` = updates done before it)
  tensorboard/         TensorBoard event files of the same records (executor/loggers.py);
                       wandb/ and mlruns/ when those loggers are asked for
  checkpoints/step-N/  one file per trained role and rank, then state.json (written last:
                       a directory without it is incomplete and ignored)
  error.txt            what stopped a failed run, and which checkpoint is kept

`--resume` loads the last complete checkpoint and continues at the next step.
Prompts and sampling seeds derive from (seed, step), and the checkpoint holds
each rank's exact weights and optimizer state, so on CPU a resumed run writes
the same metrics as one that never stopped.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import platform
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import ray
from tqdm import tqdm

from placeflow.errors import SpecError
from placeflow.executor.checkpoints import RunLock, Skipped, newest_verified, read_json, seal
from placeflow.executor.controller import Controller
from placeflow.executor.data import chat_renderer, data_of, load_examples, num_steps
from placeflow.executor.engines.tp import TPImpl
from placeflow.executor.errors import ExecutorError
from placeflow.executor.loggers import LoggerKind, Loggers, check_loggers, named_metrics
from placeflow.executor.loop import RLLoop, StepRecord, check_executable, tokenizer_for
from placeflow.executor.rewards import load_reward_function
from placeflow.fsio import atomic_write_text
from placeflow.hardware import DeviceKind
from placeflow.metrics import Metric, RecordKey
from placeflow.plan import Plan, save_plan
from placeflow.profiles.registry import available_profiles
from placeflow.workload import Role

log = logging.getLogger(__name__)
_PACKAGES = ("placeflow", "torch", "ray", "transformers", "ortools", "numpy")


class RunError(ExecutorError):
    """A run stopped; the message says where, why, and what was kept."""


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    steps: int
    seed: int = 0
    checkpoint_every: int = 0  # 0: only at the end
    resume: bool = False
    timeout_s: float = 300.0  # per remote call
    num_threads: int = 1  # torch threads per worker
    progress: bool = True
    profile: str | None = None  # for the manifest; default: the plan's device profile
    tp_impl: TPImpl = TPImpl.NATIVE  # tensor parallelism: placeflow's or megatron-core's layers
    rehearsal_of: str | None = None  # "name (hash)" of the plan this run rehearses on CPU
    overlap: bool = True  # calls on disjoint device sets run at once (False: one at a time)
    loggers: tuple[LoggerKind, ...] = (LoggerKind.TENSORBOARD,)


@dataclass(frozen=True)
class RunResult:
    run_dir: Path
    records: list[StepRecord]  # the steps this invocation ran
    first_step: int
    skipped: list[Skipped] = field(default_factory=list)  # checkpoints resume did not take


def versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for name in _PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "not installed"
    return out


def _profile_entry(name: str) -> dict[str, Any]:
    """A profile by name (the shipped registry) or file path, with its file's hash."""
    ref = available_profiles().get(name)
    path = ref.path if ref is not None else Path(name)
    if not path.is_file():
        return {"name": name, "sha256": None}
    return {"name": name, "sha256": hashlib.sha256(path.read_bytes()).hexdigest()[:16]}


def _profiles_used(plan: Plan, override: str | None) -> dict[str, dict[str, Any]]:
    """The profile each pool the plan's sets use is priced with (the override for all)."""
    used = {plan.sets[i].pool: plan.pool_of(i).profile for i in range(len(plan.sets))}
    return {pool: _profile_entry(override or name) for pool, name in used.items()}


def write_manifest(run_dir: Path, plan: Plan, cfg: RunConfig) -> None:
    from placeflow.workload import workload_to_dict

    profiles = _profiles_used(plan, cfg.profile)
    manifest = {
        "plan": {"name": plan.name, "content_hash": plan.content_hash()},
        # The actor's pool's profile, and every used pool's (heterogeneous clusters).
        "profile": profiles[plan.sets[plan.set_of(Role.ACTOR)].pool],
        "profiles": profiles,
        "workload": workload_to_dict(plan.workload),
        # The compute dtype of each role's engines (Arch.compute_dtype, from the model's dtype).
        "dtype": {role.value: spec.dtype.value for role, spec in plan.workload.models.items()},
        "rehearsal_of": cfg.rehearsal_of,
        "seed": cfg.seed,
        "steps": cfg.steps,
        "tp_impl": cfg.tp_impl.value,
        "checkpoint_every": cfg.checkpoint_every,
        "versions": versions(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command": sys.argv,
    }
    atomic_write_text(run_dir / "manifest.json", json.dumps(manifest, indent=2) + "\n")


def write_workers(run_dir: Path, controller: Controller) -> None:
    """workers.json: where each device of each set runs (Ray node, process, device)."""
    rows = [
        {
            "set": ident.set_index,
            "set_label": controller.plan.sets[ident.set_index].label(),
            "rank": ident.device_index,
            "node_id": ident.node_id,
            "node_ip": ident.node_ip,
            "pid": ident.pid,
            "device": ident.device,
            "niceness": ident.niceness,
        }
        for idents in controller.identities
        for ident in idents
    ]
    (run_dir / "workers.json").write_text(json.dumps(rows, indent=2) + "\n")


def last_checkpoint(run_dir: Path) -> tuple[int, Path] | None:
    """(step, directory) of the newest checkpoint that verifies, if any."""
    return newest_verified(run_dir)[0]


def read_metrics(run_dir: str | Path, name: str = "metrics.jsonl") -> list[dict[str, Any]]:
    """The metrics lines of a run (or its `validation.jsonl`); a torn last line (a crash
    mid-write) is left out.

    Any other malformed line is a SpecError naming the file and the line.
    """
    path = Path(run_dir) / name
    if not path.is_file():
        return []
    text = path.read_bytes().decode("utf-8", errors="replace")
    lines = text.splitlines()
    out = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            if i == len(lines) - 1 and not text.endswith("\n"):
                break  # torn final write: that step is redone on resume
            raise SpecError(f"{path}: line {i + 1} is not valid JSON") from None
    return out


def _record_json(rec: StepRecord) -> dict[str, Any]:
    return {
        RecordKey.STEP: rec.step,
        **rec.metrics,
        RecordKey.PHASES: rec.phases,
        RecordKey.TIMELINE: rec.timeline,
        RecordKey.SAMPLES: rec.samples,
    }


AfterStep = Callable[[RLLoop, StepRecord], None]


def check_devices(plan: Plan) -> None:
    """A GPU plan on a machine without enough GPUs: a SpecError saying so, before anything."""
    import torch

    needed: dict[str, int] = {}
    for i, s in enumerate(plan.sets):
        gpu = plan.pool_of(i).gpu
        if gpu.kind is DeviceKind.CUDA:
            needed[gpu.name] = needed.get(gpu.name, 0) + s.num_devices
    if not needed:
        return
    have = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if have < sum(needed.values()):
        what = " and ".join(f"{n} {name}" for name, n in needed.items())
        has = f"has {have}" if have else "has none"
        raise SpecError(
            f"this plan needs {what} devices; this machine {has}; "
            "use --rehearse to run its layout on CPU workers"
        )


def preflight(plan: Plan, steps: int | None = None) -> Any:
    """Every check that needs no worker: devices, executability, reward function, data
    files (every row), tokenizer, and that the data's epochs hold `steps` steps.

    Returns the tokenizer. Runs before Ray starts, so a plan that cannot run fails at once.
    """
    check_devices(plan)
    check_executable(plan)
    w = plan.workload
    if w.reward_function is not None:
        load_reward_function(w.reward_function)
    tokenizer = tokenizer_for(plan)
    data = data_of(w)  # [data], or a built-in checker's shipped dataset
    train = load_examples(data.train, data)
    if data.validation is not None:
        load_examples(data.validation, data)
    if data.chat_template:
        chat_renderer(tokenizer)
    n = w.batch.prompts_per_step
    if data.epochs is not None and steps is not None:
        available = num_steps(len(train), n, data.epochs)
        if steps > available:
            raise SpecError(
                f"{data.train}: {len(train)} rows give {available} steps of {n} prompts "
                f"in {data.epochs} epoch(s), fewer than the {steps} asked; lower --steps "
                "or raise [data] epochs"
            )
    return tokenizer


def run_plan(
    plan: Plan, run_dir: str | Path, cfg: RunConfig, *, after_step: AfterStep | None = None
) -> RunResult:
    """Train `plan` for `cfg.steps` steps (in all, counting resumed ones). Ray must be up.

    The run holds `run_dir`'s lock throughout: a second run into it fails at once.
    `after_step` runs on the controller after each step is recorded and checkpointed
    (evaluation, custom logging; the tests inject failures with it).
    """
    tokenizer = preflight(plan, cfg.steps)
    check_loggers(cfg.loggers)
    run_dir = Path(run_dir)
    if not ray.is_initialized():
        raise SpecError("Ray is not running; call ray.init() first (the CLI does)")
    if cfg.resume:
        _read_run_manifest(run_dir, plan, cfg)
    else:
        _make_run_dir(run_dir)
    with RunLock(run_dir):
        resume_from: tuple[int, Path] | None = None
        skipped: list[Skipped] = []
        if cfg.resume:
            resume_from, skipped = newest_verified(run_dir)
            for s in skipped:
                log.warning("skipped checkpoint %s: %s", s.directory.name, s.reason)
        else:
            if (run_dir / "manifest.json").exists():
                raise SpecError(
                    f"{run_dir} already holds a run; pass --resume to continue it "
                    "or choose a new directory"
                )
            write_manifest(run_dir, plan, cfg)
            save_plan(plan, run_dir / "plan.toml")
        (run_dir / "error.txt").unlink(missing_ok=True)
        result = _train(plan, run_dir, cfg, tokenizer, resume_from, after_step)
        return dataclasses.replace(result, skipped=skipped)


def _make_run_dir(run_dir: Path) -> None:
    if run_dir.exists() and not run_dir.is_dir():
        raise SpecError(f"run directory {run_dir} is a file; give a directory path")
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SpecError(f"cannot make run directory {run_dir}: {exc.strerror}") from None


def _read_run_manifest(run_dir: Path, plan: Plan, cfg: RunConfig) -> None:
    """Check that `run_dir` holds a run of this plan and seed (read only)."""
    path = run_dir / "manifest.json"
    if not path.is_file():
        raise SpecError(f"{run_dir}: nothing to resume (no manifest.json); run without --resume")
    manifest = read_json(path)
    try:
        name, content_hash = manifest["plan"]["name"], manifest["plan"]["content_hash"]
        seed = manifest["seed"]
    except (KeyError, TypeError):
        raise SpecError(f"{path}: no plan name, plan hash or seed; not a placeflow run") from None
    if content_hash != plan.content_hash():
        raise SpecError(
            f"{run_dir} was run with plan {name!r} (hash {content_hash}); this plan differs "
            f"(hash {plan.content_hash()}). Resume with the same plan or use a new run dir"
        )
    if seed != cfg.seed:
        raise SpecError(f"{run_dir} was run with seed {seed}; pass --seed {seed}")


def _drop_metrics_from(run_dir: Path, start: int) -> None:
    """Steps from `start` on are redone: drop their metrics and evaluations (atomically)."""
    for name, first_dropped in (("metrics.jsonl", start), ("validation.jsonl", start + 1)):
        lines = read_metrics(run_dir, name)
        kept = [m for m in lines if m[RecordKey.STEP] < first_dropped]
        if len(kept) != len(lines) or (run_dir / name).is_file():
            atomic_write_text(run_dir / name, "".join(json.dumps(m) + "\n" for m in kept))
        if len(kept) < len(lines):
            log.info(
                "redoing steps from %d: dropped %d %s lines", start, len(lines) - len(kept), name
            )


def _train(
    plan: Plan,
    run_dir: Path,
    cfg: RunConfig,
    tokenizer: Any,
    resume_from: tuple[int, Path] | None,
    after_step: AfterStep | None,
) -> RunResult:
    records: list[StepRecord] = []
    start = resume_from[0] + 1 if resume_from is not None else 0
    with Controller(plan, timeout_s=cfg.timeout_s, num_threads=cfg.num_threads) as controller:
        write_workers(run_dir, controller)
        loop = RLLoop(
            controller,
            seed=cfg.seed,
            tokenizer=tokenizer,
            tp_impl=cfg.tp_impl,
            overlap=cfg.overlap,
        )
        loop.build()
        loop.steps = cfg.steps  # k-step-off launches no rollout past the last step
        if resume_from is not None:
            loop.load(str(resume_from[1]))
        _drop_metrics_from(run_dir, start)  # only now: the checkpoint verified and loaded
        last_saved = start - 1 if resume_from is not None else None
        # Piped output gets one plain line per step instead of carriage-return updates.
        plain = cfg.progress and not sys.stderr.isatty()
        bar = tqdm(
            range(start, cfg.steps), disable=plain or not cfg.progress, desc=plan.name, unit="step"
        )
        step = start
        loggers = Loggers(cfg.loggers, run_dir, plan.name, num_gpus=plan.num_gpus)
        every_val = plan.workload.data.validate_every if plan.workload.data else None
        try:
            if loop.validation and start == 0:
                _evaluate(loop, run_dir, loggers, 0)
            for step in bar:
                rec = loop.step(step)
                records.append(rec)
                record = _record_json(rec)
                record |= named_metrics(record, plan.num_gpus)  # verl's and NeMo-RL's names
                with (run_dir / "metrics.jsonl").open("a") as f:
                    f.write(json.dumps(record) + "\n")
                loggers.log(record, step)
                postfix = {
                    "reward": f"{rec.metrics[Metric.REWARD_MEAN]:.3f}",
                    "kl": f"{rec.metrics.get(Metric.KL_REF, 0.0):.4f}",
                    "tok_s": f"{rec.metrics[Metric.TOKENS_PER_S]:.0f}",
                }
                bar.set_postfix(postfix)
                if plain:
                    line = " ".join(f"{k}={v}" for k, v in postfix.items())
                    print(f"{plan.name}: step {step + 1}/{cfg.steps} {line}", file=sys.stderr)
                every = cfg.checkpoint_every
                if (every and (step + 1) % every == 0) or step + 1 == cfg.steps:
                    save_checkpoint(loop, run_dir, step)
                    last_saved = step
                done = step + 1
                if loop.validation and (done == cfg.steps or (every_val and done % every_val == 0)):
                    _evaluate(loop, run_dir, loggers, done)
                if after_step is not None:
                    after_step(loop, rec)
            loop.drain()
        except ExecutorError as exc:
            keep_note = (
                f"the checkpoint of step {last_saved} is kept; rerun with --resume to continue"
                if last_saved is not None
                else "no checkpoint was written yet; rerun from the start"
            )
            message = f"run failed at step {step}: {exc}\n{keep_note}"
            atomic_write_text(run_dir / "error.txt", message + "\n")
            raise RunError(message) from exc
        finally:
            bar.close()
            loggers.close()
    return RunResult(run_dir=run_dir, records=records, first_step=start)


def _evaluate(loop: RLLoop, run_dir: Path, loggers: Loggers, done: int) -> None:
    """One evaluation of the validation split after `done` updates: validation.jsonl,
    the loggers, and a line on stderr."""
    result = loop.evaluate(done)
    with (run_dir / "validation.jsonl").open("a") as f:
        f.write(json.dumps(result) + "\n")
    loggers.log(result, done)
    log.info(
        "validation after %d steps: exact %.3f, reward %.3f (%d prompts)",
        done,
        result[Metric.VAL_EXACT_MATCH],
        result[Metric.VAL_REWARD_MEAN],
        result[Metric.VAL_NUM_PROMPTS],
    )


def save_checkpoint(loop: RLLoop, run_dir: Path, step: int) -> Path:
    """Workers write their rank files; then state.json and the hash manifest, last."""
    directory = run_dir / "checkpoints" / f"step-{step:06d}"
    if directory.exists():
        shutil.rmtree(directory)
    directory.mkdir(parents=True)
    loop.save(str(directory))
    seal(directory, step)
    return directory
