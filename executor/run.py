"""A training run: the RL loop on a plan, with a run directory, checkpoints and resume.

Run directory:
  manifest.json        plan name and content hash, profile name and file hash, workload,
                       seed, steps, package versions, start time, the command line
  plan.toml            the plan as run (loadable by `placeflow simulate`)
  workers.json         where each device of each set ran: Ray node id and IP, pid, device
  metrics.jsonl        one line per step: metrics, measured phase seconds, a few samples
  checkpoints/step-N/  one file per trained role and rank, then state.json (written last:
                       a directory without it is incomplete and ignored)
  error.txt            what stopped a failed run, and which checkpoint is kept

`--resume` loads the last complete checkpoint and continues at the next step.
Prompts and sampling seeds derive from (seed, step), and the checkpoint holds
each rank's exact weights and optimizer state, so on CPU a resumed run writes
the same metrics as one that never stopped.
"""

from __future__ import annotations

import hashlib
import json
import platform
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import ray
from tqdm import tqdm

from placeflow.errors import SpecError
from placeflow.executor.controller import Controller
from placeflow.executor.engines.tp import TPImpl
from placeflow.executor.errors import ExecutorError
from placeflow.executor.loop import RLLoop, StepRecord, check_executable, tokenizer_for
from placeflow.plan import Plan, save_plan
from placeflow.profiles.registry import available_profiles

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


@dataclass(frozen=True)
class RunResult:
    run_dir: Path
    records: list[StepRecord]  # the steps this invocation ran
    first_step: int


def versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for name in _PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "not installed"
    return out


def _profile_entry(plan: Plan, name: str | None) -> dict[str, Any]:
    name = name or plan.cluster.pools[0].gpu.name
    ref = available_profiles().get(name)
    if ref is None:
        return {"name": name, "sha256": None}
    return {"name": name, "sha256": hashlib.sha256(ref.path.read_bytes()).hexdigest()[:16]}


def write_manifest(run_dir: Path, plan: Plan, cfg: RunConfig) -> None:
    from placeflow.workload import workload_to_dict

    manifest = {
        "plan": {"name": plan.name, "content_hash": plan.content_hash()},
        "profile": _profile_entry(plan, cfg.profile),
        "workload": workload_to_dict(plan.workload),
        "rehearsal_of": cfg.rehearsal_of,
        "seed": cfg.seed,
        "steps": cfg.steps,
        "tp_impl": cfg.tp_impl.value,
        "checkpoint_every": cfg.checkpoint_every,
        "versions": versions(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command": sys.argv,
    }
    (run_dir / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")


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
        }
        for idents in controller.identities
        for ident in idents
    ]
    (run_dir / "workers.json").write_text(json.dumps(rows, indent=2) + "\n")


def last_checkpoint(run_dir: Path) -> tuple[int, Path] | None:
    """(step, directory) of the newest complete checkpoint, if any."""
    best = None
    for d in (run_dir / "checkpoints").glob("step-*"):
        state = d / "state.json"
        if state.is_file():
            step = int(json.loads(state.read_text())["step"])
            if best is None or step > best[0]:
                best = (step, d)
    return best


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _record_json(rec: StepRecord) -> dict[str, Any]:
    return {"step": rec.step, **rec.metrics, "phases": rec.phases, "samples": rec.samples}


AfterStep = Callable[[RLLoop, StepRecord], None]


def run_plan(
    plan: Plan, run_dir: str | Path, cfg: RunConfig, *, after_step: AfterStep | None = None
) -> RunResult:
    """Train `plan` for `cfg.steps` steps (in all, counting resumed ones). Ray must be up.

    `after_step` runs on the controller after each step is recorded and checkpointed
    (evaluation, custom logging; the tests inject failures with it).
    """
    check_executable(plan)
    tokenizer = tokenizer_for(plan)
    run_dir = Path(run_dir)
    start = 0
    resume_from: Path | None = None
    if cfg.resume:
        found = last_checkpoint(run_dir)
        if not (run_dir / "manifest.json").is_file():
            raise SpecError(
                f"{run_dir}: nothing to resume (no manifest.json); run without --resume"
            )
        manifest = json.loads((run_dir / "manifest.json").read_text())
        if manifest["plan"]["content_hash"] != plan.content_hash():
            raise SpecError(
                f"{run_dir} was run with plan {manifest['plan']['name']!r} "
                f"(hash {manifest['plan']['content_hash']}); this plan differs "
                f"(hash {plan.content_hash()}). Resume with the same plan or use a new run dir"
            )
        if manifest["seed"] != cfg.seed:
            raise SpecError(
                f"{run_dir} was run with seed {manifest['seed']}; pass --seed {manifest['seed']}"
            )
        if found is not None:
            start, resume_from = found[0] + 1, found[1]
        # Steps after the checkpoint are redone: drop their metrics.
        kept = [m for m in read_metrics(run_dir) if m["step"] < start]
        (run_dir / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in kept))
    else:
        if (run_dir / "manifest.json").exists():
            raise SpecError(
                f"{run_dir} already holds a run; pass --resume to continue it "
                "or choose a new directory"
            )
        run_dir.mkdir(parents=True, exist_ok=True)
        write_manifest(run_dir, plan, cfg)
        save_plan(plan, run_dir / "plan.toml")
    (run_dir / "error.txt").unlink(missing_ok=True)

    if not ray.is_initialized():
        raise SpecError("Ray is not running; call ray.init() first (the CLI does)")
    records: list[StepRecord] = []
    with Controller(plan, timeout_s=cfg.timeout_s, num_threads=cfg.num_threads) as controller:
        write_workers(run_dir, controller)
        loop = RLLoop(controller, seed=cfg.seed, tokenizer=tokenizer, tp_impl=cfg.tp_impl)
        loop.build()
        if resume_from is not None:
            loop.load(str(resume_from))
        last_saved = start - 1 if resume_from is not None else None
        bar = tqdm(range(start, cfg.steps), disable=not cfg.progress, desc=plan.name, unit="step")
        step = start
        try:
            for step in bar:
                rec = loop.step(step)
                records.append(rec)
                with (run_dir / "metrics.jsonl").open("a") as f:
                    f.write(json.dumps(_record_json(rec)) + "\n")
                bar.set_postfix(
                    reward=f"{rec.metrics['reward_mean']:.3f}",
                    kl=f"{rec.metrics.get('kl_ref', 0.0):.4f}",
                    tok_s=f"{rec.metrics['tokens_per_s']:.0f}",
                )
                every = cfg.checkpoint_every
                if (every and (step + 1) % every == 0) or step + 1 == cfg.steps:
                    save_checkpoint(loop, run_dir, step)
                    last_saved = step
                if after_step is not None:
                    after_step(loop, rec)
        except ExecutorError as exc:
            keep_note = (
                f"the checkpoint of step {last_saved} is kept; rerun with --resume to continue"
                if last_saved is not None
                else "no checkpoint was written yet; rerun from the start"
            )
            message = f"run failed at step {step}: {exc}\n{keep_note}"
            (run_dir / "error.txt").write_text(message + "\n")
            raise RunError(message) from exc
        finally:
            bar.close()
    return RunResult(run_dir=run_dir, records=records, first_step=start)


def save_checkpoint(loop: RLLoop, run_dir: Path, step: int) -> Path:
    directory = run_dir / "checkpoints" / f"step-{step:06d}"
    if directory.exists():
        shutil.rmtree(directory)
    directory.mkdir(parents=True)
    loop.save(str(directory))
    (directory / "state.json").write_text(json.dumps({"step": step}) + "\n")
    return directory
