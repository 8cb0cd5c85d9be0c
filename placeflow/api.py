"""The library API: plan, simulate, run, validate and export from Python, as the CLI does.

Each function takes specs or paths to their TOML files and returns the typed
result the CLI prints or serialises with `--json`:

    import placeflow

    result = placeflow.plan("examples/clusters/h100x16.toml",
                            "examples/workloads/ppo-llama2-7b.toml")
    estimate = placeflow.simulate(result.best.plan)
    run = placeflow.run("examples/plans/grpo-tiny-cpu4-colocate.toml", steps=2)

`placeflow.cli` is a shell over these functions: it parses flags, calls them
and prints. Errors a user can fix are `SpecError`s with a one-line message; a
run that fails on its workers raises the executor's `ExecutorError` (the CLI
prints it and exits 1). Heavy modules (OR-Tools, torch, Ray) load on first use.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from placeflow.cluster import ClusterSpec, load_cluster
from placeflow.errors import SpecError
from placeflow.plan import Plan, load_plan
from placeflow.tomlio import parse_enum
from placeflow.workload import Workload, load_workload

if TYPE_CHECKING:
    from placeflow.executor.run import RunConfig, RunResult
    from placeflow.export import Export
    from placeflow.planner.search import PlannerResult
    from placeflow.profiles.hostcheck import HostCheck
    from placeflow.simulator.estimate import StepEstimate
    from placeflow.simulator.fidelity import FidelityTable

PathLike = str | Path


def _cluster(cluster: ClusterSpec | PathLike) -> ClusterSpec:
    return cluster if isinstance(cluster, ClusterSpec) else load_cluster(cluster)


def _workload(workload: Workload | PathLike) -> Workload:
    return workload if isinstance(workload, Workload) else load_workload(workload)


def _plan(plan: Plan | PathLike) -> Plan:
    return plan if isinstance(plan, Plan) else load_plan(plan)


def plan(
    cluster: ClusterSpec | PathLike,
    workload: Workload | PathLike,
    *,
    objective: str = "throughput",
    target_tokens_per_s: float | None = None,
    time_limit_s: float = 60.0,
    top_k: int = 5,
    progress: Callable[[int, int], None] | None = None,
    table_progress: Callable[[int, int], None] | None = None,
) -> PlannerResult:
    """The best plans for `workload` on `cluster` (CP-SAT over placements and parallelism).

    `objective` is `throughput`, `cost` or `gpus`. The result holds the best plan,
    a ranked list and the best plan of every placement (or why it has none).
    """
    from placeflow.planner import Objective, plan_search
    from placeflow.profiles.registry import fitted_cost_model

    c, w = _cluster(cluster), _workload(workload)
    obj = parse_enum(Objective, objective, None, "objective")
    costs = {p.profile: fitted_cost_model(p.profile) for p in c.pools}
    return plan_search(
        c,
        w,
        costs,
        objective=obj,
        target_tokens_per_s=target_tokens_per_s,
        time_limit_s=time_limit_s,
        top_k=top_k,
        progress=progress,
        table_progress=table_progress,
    )


def simulate(plan: Plan | PathLike, *, profile: str | None = None) -> StepEstimate:
    """One RL step of `plan`, phase by phase, with each pool's profile (or `profile` for all)."""
    from placeflow.simulator import simulate as simulate_plan
    from placeflow.simulator.simulate import cost_models_for

    p = _plan(plan)
    return simulate_plan(p, cost_models_for(p, profile))


def start_ray(plan: Plan, *, num_cpus: int | None = None, address: str | None = None) -> bool:
    """Ray for `plan`: attach to the cluster at `address` (`auto`: the one this machine
    belongs to), or start a local Ray with room for the plan (CPU workers are logical,
    so enough CPU slots).

    True when this call connected (the caller then shuts Ray down); a Ray already
    running in this process (a notebook's, a test session's) is used as it is.
    """
    import ray

    from placeflow.executor.pools import required_resources

    if ray.is_initialized():
        return False
    if address is not None:
        try:
            ray.init(address=address, logging_level=logging.ERROR)
        except (ConnectionError, ValueError, RuntimeError) as exc:
            raise SpecError(
                f"--address {address}: cannot attach to a Ray cluster there ({exc}); start one "
                "with `ray start --head` or give its GCS address HOST:PORT"
            ) from None
        return True
    needed = int(required_resources(plan).get("CPU", 0))
    cpus = num_cpus or max(os.cpu_count() or 1, needed)
    ray.init(num_cpus=cpus, include_dashboard=False, logging_level=logging.ERROR)
    return True


def rehearse(plan: Plan | PathLike) -> Plan:
    """`plan`'s exact layout on CPU workers with tiny models (what `run --rehearse` runs)."""
    from placeflow.executor.rehearsal import rehearsal_plan

    return rehearsal_plan(_plan(plan))


def run(
    plan: Plan | PathLike,
    run_dir: PathLike | None = None,
    *,
    config: RunConfig | None = None,
    steps: int = 10,
    rehearse: bool = False,
    num_cpus: int | None = None,
    address: str | None = None,
) -> RunResult:
    """Train `plan` with RL on Ray workers; the run directory holds metrics and checkpoints.

    `config` sets everything `placeflow run` can (seed, checkpoints, resume,
    threads, ...); without it, `steps` steps with the defaults. `rehearse` runs
    the plan's layout on CPU workers with tiny models. Ray is started (and shut
    down) here unless it already runs in this process.
    """
    import ray

    from placeflow.executor.rehearsal import check_host_memory, rehearsal_plan
    from placeflow.executor.run import RunConfig, preflight, run_plan
    from placeflow.fsio import check_output_dir, safe_name

    p = _plan(plan)
    cfg = config or RunConfig(steps=steps)
    if rehearse:
        cfg = replace(cfg, rehearsal_of=f"{p.name} ({p.content_hash()})")
        p = rehearsal_plan(p)
    directory = check_output_dir(
        Path(run_dir) if run_dir is not None else Path("runs") / safe_name(p.name), "run_dir"
    )
    # Absolute: Ray's workers write checkpoints there, and their working directory
    # is the one Ray started in, not necessarily the caller's (a notebook's chdir).
    directory = directory.resolve()
    preflight(p, cfg.steps)  # before Ray starts: a plan it cannot run fails in a second
    if address is None:  # on a cluster the workers' memory is the nodes', not this machine's
        check_host_memory(p)
    started = start_ray(p, num_cpus=num_cpus, address=address)
    try:
        return run_plan(p, directory, cfg)
    finally:
        if started:
            ray.shutdown()


@dataclass(frozen=True)
class Validation:
    """A plan run beside its simulation: the measured-vs-simulated table and where it went."""

    estimate: StepEstimate
    fidelity: FidelityTable
    run: RunResult
    report: Path
    # The prompt length simulated: what the run pads to (`executor.loop.as_run`).
    prompt_len: int
    # The CPU profiles used, re-timed on this host before the run (`profiles.hostcheck`):
    # one whose kernels run R times slower here predicts every phase about R times too fast.
    host_checks: tuple[HostCheck, ...] = ()


def validate(
    plan: Plan | PathLike,
    run_dir: PathLike | None = None,
    *,
    config: RunConfig | None = None,
    steps: int = 6,
    profile: str | None = None,
    report: PathLike | None = None,
    num_cpus: int | None = None,
    address: str | None = None,
) -> Validation:
    """Simulate `plan`, run it, and compare them phase by phase (`placeflow validate`).

    Writes RUN_DIR/fidelity.json, fidelity.md, estimate.json and the run report.
    The first measured step is a warm-up and is not compared. The simulated workload
    has the prompt length the run pads to, the data's longest prompt up to the
    workload's `prompt_len` (`executor.loop.padded_prompt_len`).
    """
    import json

    from placeflow.executor.loop import as_run
    from placeflow.executor.run import RunConfig, read_metrics
    from placeflow.fsio import check_output_dir, check_output_path, safe_name
    from placeflow.reports.run import run_report
    from placeflow.simulator.fidelity import compare

    p = _plan(plan)
    directory = check_output_dir(
        Path(run_dir) if run_dir is not None else Path("runs") / f"validate-{safe_name(p.name)}",
        "run_dir",
    )
    if report is not None:
        check_output_path(report, "report")
    # Simulate first: a profile or plan problem shows before any worker starts. The run
    # pads each step's prompts to its longest, so the simulator prices the data's
    # prompt length, not the workload's maximum (`as_run`).
    simulated = as_run(p)
    estimate = simulate(simulated, profile=profile)
    if not estimate.feasible:
        raise SpecError(f"the plan does not fit: {estimate.infeasible_reason}")
    checks = _host_checks(p, profile) if address is None else ()
    cfg = replace(config or RunConfig(steps=steps), profile=profile)
    result = run(p, directory, config=cfg, num_cpus=num_cpus, address=address)
    table = compare(estimate, read_metrics(directory), warmup=1)
    (directory / "fidelity.json").write_text(json.dumps(table.to_json(), indent=2) + "\n")
    (directory / "fidelity.md").write_text(table.to_markdown())
    (directory / "estimate.json").write_text(json.dumps(estimate.to_json(), indent=2) + "\n")
    written = run_report(directory, report)
    return Validation(
        estimate=estimate,
        fidelity=table,
        run=result,
        report=written,
        prompt_len=simulated.workload.batch.prompt_len,
        host_checks=checks,
    )


def _host_checks(plan: Plan, profile: str | None) -> tuple[HostCheck, ...]:
    """The CPU profiles `plan` is simulated with, each checked against this host: a run
    on this machine's cores is compared with kernels measured on another otherwise."""
    from placeflow.profiles.hostcheck import check_host
    from placeflow.profiles.registry import load_profile

    names = {profile} if profile is not None else {pool.profile for pool in plan.cluster.pools}
    profiles = [load_profile(name) for name in sorted(names)]
    return tuple(check_host(prof) for prof in profiles if prof.device_kind == "cpu")


def export(plan: Plan | PathLike, to: str = "verl") -> Export:
    """`plan` as another framework's launch (`verl` hydra overrides or OpenRLHF's
    `train_ppo_ray` flags), with what that framework cannot express of it."""
    from placeflow.export import Target, export_plan

    return export_plan(_plan(plan), parse_enum(Target, to, None, "export target"))


__all__ = [
    "Validation",
    "export",
    "plan",
    "rehearse",
    "run",
    "simulate",
    "start_ray",
    "validate",
]
