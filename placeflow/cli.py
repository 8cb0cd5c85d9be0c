"""The `placeflow` command line.

Each subcommand is a small function from parsed arguments to an exit code.
Errors a user can fix (`SpecError`) print one line on stderr and exit 2; no
traceback reaches the user for them.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

from rich.console import Console
from rich.table import Table

from placeflow import __version__
from placeflow.cliargs import (
    bounded_int,
    non_negative_int,
    nonempty,
    positive_float,
    seconds,
    seed,
)
from placeflow.clio import table_progress, write_or_fallback
from placeflow.errors import MeasurementError, SpecError
from placeflow.fsio import check_output_dir, check_output_path, safe_name
from placeflow.metrics import Metric

Handler = Callable[[argparse.Namespace, Console], int]
MAX_STEPS = 10_000_000
STEPS = bounded_int(1, MAX_STEPS, "RL steps in all")
THREADS = bounded_int(1, 1024, "torch threads per worker")
CPUS = bounded_int(1, 1_000_000, "CPU slots")


def _cmd_models(args: argparse.Namespace, console: Console) -> int:
    from placeflow.catalogue import CATALOGUE

    rows = [
        {
            "name": m.name,
            "params": m.num_params(),
            "layers": m.num_layers,
            "hidden": m.hidden_size,
            "heads": m.num_heads,
            "kv_heads": m.num_kv_heads,
            "ffn": m.ffn_hidden_size,
            "vocab": m.vocab_size,
            "dtype": m.dtype.value,
        }
        for m in CATALOGUE.values()
    ]
    if args.json:
        console.print_json(json.dumps(rows))
        return 0
    table = Table(title="model catalogue")
    for col in ("name", "params", "layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "dtype"):
        table.add_column(
            col, justify="left" if col in ("name", "dtype") else "right", no_wrap=col == "name"
        )
    for m, r in zip(CATALOGUE.values(), rows, strict=True):
        params = m.num_params()
        shown = f"{params / 1e9:.2f}B" if params >= 1e9 else f"{params / 1e6:.2f}M"
        table.add_row(*(shown if k == "params" else str(v) for k, v in r.items()))
    console.print(table)
    return 0


def _cmd_profile(args: argparse.Namespace, console: Console) -> int:
    from placeflow.profiles.grid import ProfilerGrid
    from placeflow.profiles.profiler import profile_device
    from placeflow.profiles.registry import user_profile_dir
    from placeflow.profiles.schema import save_profile

    name = args.name or (Path(args.out).stem if args.out else f"{args.device}-local")
    out = Path(args.out) if args.out else user_profile_dir() / f"{safe_name(name)}.json"
    check_output_path(out, "--out")  # before the minutes of profiling, not after
    grid = ProfilerGrid.quick(args.device) if args.quick else ProfilerGrid.full(args.device)
    profile = profile_device(
        args.device, grid=grid, name=name, progress=not args.no_progress, threads=args.threads
    )
    out = write_or_fallback(lambda path: save_profile(profile, path), out)
    coverage = ", ".join(f"{op} {n}" for op, n in profile.coverage().items())
    console.print(f"wrote profile {name!r} ({len(profile.entries)} entries: {coverage}) to {out}")
    return 0


def _cmd_profiles_list(args: argparse.Namespace, console: Console) -> int:
    from placeflow.profiles.registry import available_profiles
    from placeflow.profiles.schema import load_profile_file

    rows: list[dict[str, object]] = []
    for ref in available_profiles().values():
        try:
            p = load_profile_file(ref.path)
        except SpecError as exc:
            rows.append({"name": ref.name, "path": str(ref.path), "error": str(exc)})
            continue
        rows.append(
            {
                "name": p.name,
                "device": p.provenance.device_name,
                "device_kind": p.device_kind,
                "source": p.provenance.source.value,
                "dtype": p.provenance.dtype,
                "date": p.provenance.date,
                "shipped": ref.shipped,
                "path": str(ref.path),
                "coverage": p.coverage(),
                "entry_sources": p.sources(),
            }
        )
    if args.json:
        console.print_json(json.dumps(rows))
        return 0
    table = Table(title="profiles")
    for col in ("name", "device", "source", "dtype", "shipped", "coverage (entries per op)"):
        table.add_column(col)
    for r in rows:
        if "error" in r:
            table.add_row(str(r["name"]), "[red]unreadable[/red]", str(r["error"]), "", "", "")
            continue
        coverage = r["coverage"]
        assert isinstance(coverage, dict)
        cov = ", ".join(f"{k} {v}" for k, v in coverage.items())
        table.add_row(
            str(r["name"]),
            str(r["device"]),
            str(r["source"]),
            str(r["dtype"]),
            "yes" if r["shipped"] else "no",
            cov,
        )
    console.print(table)
    return 0


def _cmd_profiles_check(args: argparse.Namespace, console: Console) -> int:
    from placeflow.profiles.costmodel import leave_one_out
    from placeflow.profiles.registry import load_profile

    report = leave_one_out(load_profile(args.name))
    if args.json:
        console.print_json(
            json.dumps(
                {
                    "profile": report.profile_name,
                    "num_points": report.num_points,
                    "median_rel_err": report.median_rel_err,
                    "p90_rel_err": report.p90_rel_err,
                    "per_op": {
                        op: {"n": n, "median_rel_err": med, "p90_rel_err": p90}
                        for op, (n, med, p90) in report.per_op.items()
                    },
                }
            )
        )
        return 0
    table = Table(title=f"leave-one-out error of the cost model on {report.profile_name!r}")
    for col in ("op", "points", "median |err|", "p90 |err|"):
        table.add_column(col, justify="left" if col == "op" else "right")
    for op, (n, med, p90) in report.per_op.items():
        table.add_row(op, str(n), f"{med:.1%}", f"{p90:.1%}")
    table.add_row(
        "[b]all[/b]",
        str(report.num_points),
        f"[b]{report.median_rel_err:.1%}[/b]",
        f"[b]{report.p90_rel_err:.1%}[/b]",
    )
    console.print(table)
    return 0


def _cmd_profiles_host(args: argparse.Namespace, console: Console) -> int:
    from placeflow.profiles.hostcheck import check_host
    from placeflow.profiles.registry import load_profile

    check = check_host(load_profile(args.name))  # a GPU profile: SpecError
    if args.json:
        console.print_json(json.dumps(check.to_json()))
    else:
        console.print(check.summary())
    return 0 if check.ok else 1


def _cmd_profiles_import_vidur(args: argparse.Namespace, console: Console) -> int:
    from placeflow.profiles.build_gpu_profiles import build_gpu_profiles
    from placeflow.profiles.registry import user_profile_dir
    from placeflow.profiles.schema import save_profile

    vidur_dir = Path(args.dir)
    if not vidur_dir.is_dir():
        raise SpecError(
            f"{vidur_dir}: not a directory; give the folder holding Vidur's compute/ and network/"
        )
    out_dir = check_output_dir(args.out_dir or user_profile_dir(), "--out-dir")
    for name, profile in build_gpu_profiles(vidur_dir).items():
        path = save_profile(profile, out_dir / f"{name}.json")
        console.print(
            f"wrote {name!r} ({len(profile.entries)} entries, "
            f"sources {profile.sources()}) to {path}"
        )
    return 0


def _gib(num_bytes: float) -> str:
    return f"{num_bytes / 2**30:.1f} GiB"


def _cmd_simulate(args: argparse.Namespace, console: Console) -> int:
    from placeflow.api import simulate
    from placeflow.plan import load_plan

    if args.report:
        check_output_path(args.report, "--report")
    plan = load_plan(args.plan)
    estimate = simulate(plan, profile=args.profile)
    if args.report:
        from placeflow.reports import simulate_report

        written = write_or_fallback(lambda p: simulate_report(estimate, p), Path(args.report))
        print(f"wrote report {written}", file=sys.stderr)
    if args.json:
        console.print_json(json.dumps(estimate.to_json()))
        return 0 if estimate.feasible else 1
    table = Table(
        title=f"plan {plan.name!r} ({plan.content_hash()}), profile {estimate.profile_name}"
    )
    for col in ("phase", "set", "start s", "end s", "duration s"):
        # Labels are the row's identity: never cut them, let the numbers wrap instead.
        table.add_column(
            col, justify="left" if col in ("phase", "set") else "right", overflow="fold"
        )
    for p in estimate.phases:
        table.add_row(
            p.name.value, p.set_label, f"{p.start_s:.3f}", f"{p.end_s:.3f}", f"{p.duration_s:.3f}"
        )
    console.print(table)
    sets = Table(title="device sets")
    for col in ("set", "devices", "resident", "peak", "capacity", "utilisation"):
        sets.add_column(
            col, justify="left" if col == "set" else "right", min_width=len(col), overflow="fold"
        )
    for s in estimate.sets:
        sets.add_row(
            s.label,
            f"{s.num_devices} x {s.pool}",
            _gib(s.resident_bytes),
            _gib(s.peak_memory_bytes),
            _gib(s.capacity_bytes),
            f"{s.utilisation:.0%}",
        )
    console.print(sets)
    for note in estimate.notes:
        console.print(f"note: {note}")
    if not estimate.feasible:
        console.print(f"[red]infeasible[/red]: {estimate.infeasible_reason}")
        return 1
    console.print(
        f"iteration {estimate.iteration_s:.3f} s, {estimate.tokens_per_s:,.0f} tokens/s, "
        f"{estimate.samples_per_s:,.2f} samples/s, peak {_gib(estimate.peak_memory_bytes)} per GPU"
    )
    return 0


def _placement_json(result: object) -> dict[str, object]:
    from placeflow.planner.search import RankedPlan
    from placeflow.workload import Role

    assert isinstance(result, RankedPlan)
    plan, est = result.plan, result.estimate
    return {
        "name": plan.name,
        "plan_hash": plan.content_hash(),
        "placement_kind": result.kind.value,
        "placement": [[r.value for r in s.roles] for s in plan.sets if not s.generator],
        "gpus_per_set": [s.num_devices for s in plan.sets if not s.generator],
        "generator_gpus": result.generator_gpus,  # 0: the actor generates on its own set
        "pools": [s.pool for s in plan.sets],
        "parallelism": {
            role.value: {
                "p": par.train.p,
                "t": par.train.t,
                "d": par.train.d,
                **({"e": par.train.e} if par.train.e > 1 else {}),  # MoE expert parallel
                **({"tg": par.tg, "pg": par.pg} if role is Role.ACTOR else {}),
                "micro_batch": par.micro_batch,
                "zero": par.zero,
                "recompute": par.recompute,
                "offload_optimizer": par.offload_optimizer,
                **({"optimizer_step": "host"} if par.host_optimizer_step else {}),
                "offload_params": par.offload_params,
            }
            for role, par in plan.parallelism.items()
        },
        "iteration_s": est.iteration_s,
        "tokens_per_s": est.tokens_per_s,
        "model_step_s": result.model_step_s,
        "peak_memory_bytes": est.peak_memory_bytes,
        "price_per_mtoken_usd": result.price_per_mtoken,
        "executor_problems": list(result.executor_problems),  # empty: `placeflow run` runs it
    }


_PER_PLACEMENT_KEYS = ("gpus_per_set", "generator_gpus", "iteration_s", "tokens_per_s", "plan_hash")


def _gpus_label(plan: Any) -> str:
    """GPUs per colocated set, and the generator set's apart: `[8, 4] + gen 4`."""
    sets = str([s.num_devices for s in plan.sets if not s.generator])
    gen = [s.num_devices for s in plan.sets if s.generator]
    return f"{sets} + gen {gen[0]}" if gen else sets


def _cmd_plan(args: argparse.Namespace, console: Console) -> int:
    from rich.progress import Progress

    from placeflow.api import plan
    from placeflow.cluster import load_cluster
    from placeflow.plan import save_plan
    from placeflow.workload import load_workload

    for flag, path in (("--out", args.out), ("--report", args.report)):
        if path:
            check_output_path(path, flag)
    cluster, workload = load_cluster(args.cluster), load_workload(args.workload)
    with (
        Progress(
            console=Console(stderr=True),
            transient=True,
            disable=args.json or not console.is_terminal,
        ) as bar,
        table_progress("costing options", quiet=args.json) as costing,
    ):
        task = bar.add_task("solving per placement", total=None)
        result = plan(
            cluster,
            workload,
            objective=args.objective,
            target_tokens_per_s=args.target_tokens_per_s,
            time_limit_s=args.time_limit,
            top_k=args.top,
            progress=lambda i, n: bar.update(task, completed=i, total=n),
            table_progress=costing,
        )
    out_path = None
    if args.out:
        out_path = write_or_fallback(lambda p: save_plan(result.best.plan, p), Path(args.out))
    if args.out_dir:
        count = _write_per_placement(result.per_placement, Path(args.out_dir))
        print(f"wrote {count} plans (best of each placement) to {args.out_dir}", file=sys.stderr)
    if args.report:
        from placeflow.reports import plan_report

        written = write_or_fallback(lambda p: plan_report(result, p), Path(args.report))
        print(f"wrote report {written}", file=sys.stderr)
    per_placement = []
    for pr in result.per_placement:
        entry: dict[str, object] = {
            "placement_kind": pr.placement.kind.value,
            "placement": [[r.value for r in s] for s in pr.placement.sets],
            "status": pr.status.value,
        }
        if pr.best is None:
            entry["infeasible_reason"] = pr.reason
        else:
            entry.update(
                {k: v for k, v in _placement_json(pr.best).items() if k in _PER_PLACEMENT_KEYS}
            )
        per_placement.append(entry)
    out = {
        "status": result.status.value,
        "objective": result.objective.value,
        "solve_s": result.solve_s,
        "best": _placement_json(result.best),
        "ranked": [_placement_json(r) for r in result.ranked],
        "per_placement": per_placement,
    }
    if args.json:
        console.print_json(json.dumps(out))
        return 0
    table = Table(
        title=f"{workload.name} on {cluster.name}: best plan per placement "
        f"({result.status.value}, {result.solve_s:.1f} s)"
    )
    for col in ("placement", "kind", "GPUs per set", "iteration s", "tokens/s"):
        table.add_column(col, justify="left" if col in ("placement", "kind") else "right")
    by_speed = sorted(
        result.per_placement, key=lambda r: -(r.best.estimate.tokens_per_s if r.best else 0.0)
    )
    for pr in by_speed:
        label = pr.placement.label()
        if pr.best is None:
            table.add_row(label, pr.placement.kind.value, "-", "-", "infeasible")
        else:
            est = pr.best.estimate
            table.add_row(
                label,
                pr.placement.kind.value,
                _gpus_label(pr.best.plan),
                f"{est.iteration_s:.2f}",
                f"{est.tokens_per_s:,.0f}",
            )
    console.print(table)
    best = result.best
    console.print(
        f"best: {best.plan.name} ({best.kind}): {[s.label() for s in best.plan.sets]}"
        f" on {_gpus_label(best.plan)} GPUs, "
        f"{best.estimate.tokens_per_s:,.0f} tokens/s, iteration {best.estimate.iteration_s:.2f} s"
    )
    if workload.asynchronous:
        from placeflow.planner.search import STALENESS_TOLERANCE

        bound = workload.max_staleness
        console.print(
            f"staleness {best.plan.workload.max_staleness} of at most {bound} (the least within "
            f"{STALENESS_TOLERANCE:.0%} of the best tokens/s)"
            if best.plan.generator_set() is not None
            else f"staleness: synchronous (max_staleness {bound} needs a generator set apart)"
        )
    if best.executor_problems:
        console.print(
            "placeflow run would refuse it here: " + "; ".join(best.executor_problems),
            markup=False,
        )
    if out_path:
        console.print(f"wrote {out_path}")
    return 0


def _write_per_placement(per_placement: Sequence[Any], out_dir: Path) -> int:
    """The best plan of every feasible placement as DIR/<kind>-<sets>.toml; how many."""
    from placeflow.plan import save_plan

    out_dir.mkdir(parents=True, exist_ok=True)
    written = 0
    for pr in per_placement:
        if pr.best is None:
            continue
        sets = "_".join("+".join(r.value for r in s) for s in pr.placement.sets)
        save_plan(pr.best.plan, out_dir / f"{pr.placement.kind.value}-{sets}.toml")
        written += 1
    return written


def _print_run(console: Console, records: Sequence[object], run_dir: Path) -> None:
    table = Table(title=f"run {run_dir}")
    cols = ("step", "reward", "exact", "pg loss", "kl ref", "entropy", "resp len", "tokens/s", "s")
    for col in cols:
        table.add_column(col, justify="right")
    for rec in records:
        m = rec.metrics  # type: ignore[attr-defined]
        table.add_row(
            str(rec.step),  # type: ignore[attr-defined]
            f"{m[Metric.REWARD_MEAN]:.3f}",
            f"{m.get(Metric.EXACT_MATCH, float('nan')):.2f}",
            f"{m[Metric.PG_LOSS]:+.4f}",
            f"{m.get(Metric.KL_REF, 0.0):.4f}",
            f"{m[Metric.ENTROPY]:.2f}",
            f"{m[Metric.RESPONSE_LEN_MEAN]:.1f}",
            f"{m[Metric.TOKENS_PER_S]:,.0f}",
            f"{m[Metric.STEP_TIME_S]:.2f}",
        )
    console.print(table)


def _execute(plan: Any, run_dir: Path, cfg: Any, args: argparse.Namespace) -> Any:
    """`placeflow.api.run`; its RunResult, or None after printing why the run failed on
    its workers. Plan problems raise SpecError before Ray starts."""
    from placeflow.api import run
    from placeflow.executor.errors import ExecutorError

    try:
        return run(plan, run_dir, config=cfg, num_cpus=args.num_cpus, address=args.address)
    except ExecutorError as exc:
        print(f"placeflow: run failed: {exc}", file=sys.stderr)
        return None


def _cmd_run(args: argparse.Namespace, console: Console) -> int:
    from placeflow.executor.engines.tp import TPImpl
    from placeflow.executor.loggers import check_loggers, parse_loggers
    from placeflow.executor.run import RunConfig
    from placeflow.plan import load_plan

    loggers = parse_loggers(args.logger)
    check_loggers(loggers)
    plan = load_plan(args.plan)
    rehearsal_of = None
    if args.rehearse:
        from placeflow.executor.rehearsal import rehearsal_plan

        rehearsal_of = f"{plan.name} ({plan.content_hash()})"
        plan = rehearsal_plan(plan)
        print(
            f"rehearsing {rehearsal_of} on {plan.num_gpus} CPU workers with tiny models "
            f"({', '.join(sorted({m.name for m in plan.workload.models.values()}))}); "
            "its figures are not the GPU run's",
            file=sys.stderr,
        )
    if plan.workload.asynchronous and plan.generator_set() is None:
        print(
            f"note: asynchrony (max_staleness {plan.workload.max_staleness}) needs a generator "
            "set apart; this plan generates on the actor's own devices, so its steps run "
            "synchronously",
            file=sys.stderr,
        )
    run_dir = check_output_dir(args.run_dir or Path("runs") / safe_name(plan.name), "--run-dir")
    cfg = RunConfig(
        rehearsal_of=rehearsal_of,
        steps=args.steps,
        seed=args.seed,
        checkpoint_every=args.checkpoint_every,
        resume=args.resume,
        timeout_s=args.timeout,
        num_threads=args.threads,
        progress=not args.no_progress,
        tp_impl=TPImpl(args.tp_backend),
        loggers=loggers,
    )
    result = _execute(plan, run_dir, cfg, args)
    if result is None:
        return 1
    _print_run(console, result.records, run_dir)
    console.print(
        f"run directory: {run_dir} (metrics.jsonl, manifest.json, checkpoints/, tensorboard/)"
    )
    return 0


def _cmd_validate(args: argparse.Namespace, console: Console) -> int:
    from placeflow.api import validate
    from placeflow.executor.errors import ExecutorError
    from placeflow.executor.run import RunConfig
    from placeflow.plan import load_plan
    from placeflow.simulator.fidelity import overlap_text

    plan = load_plan(args.plan)
    run_dir = check_output_dir(
        args.run_dir or Path("runs") / f"validate-{safe_name(plan.name)}", "--run-dir"
    )
    if args.report:
        check_output_path(args.report, "--report")
    cfg = RunConfig(
        steps=args.steps, seed=args.seed, num_threads=args.threads, progress=not args.no_progress
    )
    try:
        checked = validate(
            plan,
            run_dir,
            config=cfg,
            profile=args.profile,
            report=args.report,
            num_cpus=args.num_cpus,
            address=args.address,
        )
    except ExecutorError as exc:
        print(f"placeflow: run failed: {exc}", file=sys.stderr)
        return 1
    table, report = checked.fidelity, checked.report
    if args.json:
        checks = [c.to_json() for c in checked.host_checks]
        console.print_json(json.dumps({**table.to_json(), "host_checks": checks}))
        return 0
    out = Table(title=f"{plan.name}: measured vs simulated ({args.profile}), {table.steps} steps")
    for col in ("phase", "measured s", "simulated s", "error"):
        out.add_column(col, justify="left" if col == "phase" else "right")
    for p in (*table.phases, table.step):
        out.add_row(p.phase, f"{p.measured_s:.4f}", f"{p.predicted_s:.4f}", f"{p.rel_error:+.1%}")
    console.print(out)
    worst = table.worst
    console.print(
        f"median |error| {table.median_abs_error:.1%}, worst "
        + (f"{worst.phase} {abs(worst.rel_error):.1%}" if worst else "-")
    )
    console.print(overlap_text(table.measured_overlap, table.simulated_overlap))
    for check in checked.host_checks:  # a profile of another host explains a level error
        console.print(check.summary())
    padded = checked.prompt_len
    if padded != plan.workload.batch.prompt_len:
        console.print(
            f"simulated with prompts of {padded} tokens, the longest of the data the run "
            f"pads to (the workload's prompt_len {plan.workload.batch.prompt_len} is a maximum)"
        )
    console.print(f"wrote {run_dir}/fidelity.json, fidelity.md and {report}")
    return 0


def _cmd_report(args: argparse.Namespace, console: Console) -> int:
    from placeflow.reports.run import run_report

    run_dir = Path(args.run_dir)
    if not run_dir.is_dir():
        raise SpecError(f"{run_dir}: not a directory; give a run directory of `placeflow run`")
    out = Path(args.out) if args.out else run_dir / "report.html"
    check_output_path(out, "--out")
    console.print(f"wrote {write_or_fallback(lambda p: run_report(run_dir, p), out)}")
    return 0


def _cmd_export(args: argparse.Namespace, console: Console) -> int:
    from placeflow.api import export

    result = export(args.plan, args.to)
    if args.out is None:
        sys.stdout.write(result.text())
        return 0
    out = Path(args.out)
    check_output_path(out, "--out")
    written = write_or_fallback(lambda p: p.write_text(result.text(), encoding="utf-8"), out)
    what = f"{len(result.unexpressed)} note(s) on what {args.to} cannot express"
    print(f"wrote {written} ({what})", file=sys.stderr)
    return 0


class _Parser(argparse.ArgumentParser):
    """argparse with the CLI's one-line errors: `placeflow: error: ...`, exit code 2."""

    def error(self, message: str) -> NoReturn:
        command = self.prog.removeprefix("placeflow").strip()
        where = f"{command}: " if command else ""
        hint = f"placeflow {command} --help" if command else "placeflow --help"
        self.exit(2, f"placeflow: error: {where}{one_line(message)} (see {hint})\n")


def _add_ray_args(p: argparse.ArgumentParser) -> None:
    """Where `run` and `validate` run: workers' threads, a local Ray's size, or a cluster."""
    p.add_argument("--threads", type=THREADS, default=1, help="torch threads per worker")
    p.add_argument("--num-cpus", type=CPUS, help="CPU slots for the local Ray instance")
    p.add_argument(
        "--address",
        type=nonempty,
        help="attach to an existing Ray cluster (auto, or its HOST:PORT) instead of a local Ray",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="placeflow",
        description="Plan, simulate and execute placements of RL post-training for LLMs.",
    )
    parser.add_argument("--version", action="version", version=f"placeflow {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("models", help="list the model catalogue")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=_cmd_models)

    p = sub.add_parser("profile", help="time real torch kernels on this device and write a profile")
    p.add_argument("--device", choices=("cpu", "cuda"), required=True)
    p.add_argument("--quick", action="store_true", help="a small grid (a few minutes on CPU)")
    p.add_argument("--out", type=nonempty, help="profile file to write (default: user profile dir)")
    p.add_argument(
        "--name",
        type=nonempty,
        help="profile name (default: --out file stem or <device>-local)",
    )
    p.add_argument(
        "--threads",
        type=THREADS,
        help="CPU: torch threads per device (default 1: a device is a core)",
    )
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(handler=_cmd_profile)

    p = sub.add_parser("plan", help="choose placement and parallelism with CP-SAT")
    p.add_argument("--cluster", required=True, help="cluster TOML")
    p.add_argument("--workload", required=True, help="workload TOML")
    p.add_argument("--objective", choices=("throughput", "cost", "gpus"), default="throughput")
    p.add_argument("--target-tokens-per-s", type=positive_float, help="with --objective gpus")
    p.add_argument("--time-limit", type=seconds, default=60.0, help="search seconds in all")
    p.add_argument(
        "--top", type=bounded_int(1, 1000, "ranked plans"), default=5, help="ranked plans to show"
    )
    p.add_argument("--json", action="store_true")
    p.add_argument(
        "--out", type=nonempty, help="write the best plan as TOML (for simulate and run)"
    )
    p.add_argument(
        "--out-dir", type=nonempty, help="write the best plan of every placement, one TOML each"
    )
    p.add_argument("--report", type=nonempty, help="write an HTML report (plotly, works offline)")
    p.set_defaults(handler=_cmd_plan)

    p = sub.add_parser("simulate", help="predict one RL step of a plan, phase by phase")
    p.add_argument("plan", type=nonempty, help="plan TOML file")
    p.add_argument("--profile", help="profile for every pool (default: each pool's own)")
    p.add_argument("--report", type=nonempty, help="write an HTML report (plotly, works offline)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=_cmd_simulate)

    p = sub.add_parser("run", help="train a plan with RL on this machine's devices (Ray)")
    p.add_argument("plan", type=nonempty, help="plan TOML file")
    p.add_argument("--steps", type=STEPS, default=20, help="RL steps in all (resumed ones count)")
    p.add_argument("--run-dir", type=nonempty, help="run directory (default: runs/<plan name>)")
    p.add_argument("--seed", type=seed, default=0)
    p.add_argument(
        "--checkpoint-every", type=non_negative_int, default=0, help="steps; 0: at the end only"
    )
    p.add_argument("--resume", action="store_true", help="continue from the last checkpoint")
    p.add_argument(
        "--rehearse",
        action="store_true",
        help="run the plan's layout on logical CPU workers with tiny models (a GPU plan here)",
    )
    _add_ray_args(p)
    p.add_argument("--timeout", type=seconds, default=300.0, help="seconds per remote call")
    p.add_argument(
        "--tp-backend",
        choices=("native", "megatron"),
        default="native",
        help="tensor-parallel layers: placeflow's own or megatron-core's",
    )
    p.add_argument(
        "--logger",
        default="tensorboard",
        help="metric loggers, comma-separated: tensorboard (always on), wandb, mlflow "
        "(offline, under the run directory; the `loggers` extra installs them)",
    )
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(handler=_cmd_run)

    p = sub.add_parser(
        "validate", help="run a plan here and compare its measured phases with the simulator"
    )
    p.add_argument("plan", type=nonempty, help="plan TOML file")
    p.add_argument("--profile", required=True, help="profile of this hardware (e.g. cpu)")
    p.add_argument(
        "--steps",
        type=bounded_int(2, MAX_STEPS, "the first step is a warm-up"),
        default=6,
        help="RL steps; the first is a warm-up",
    )
    p.add_argument(
        "--run-dir", type=nonempty, help="run directory (default: runs/validate-<plan name>)"
    )
    p.add_argument("--report", type=nonempty, help="HTML path (default: RUN_DIR/report.html)")
    p.add_argument("--seed", type=seed, default=0)
    _add_ray_args(p)
    p.add_argument("--json", action="store_true")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(handler=_cmd_validate)

    p = sub.add_parser("report", help="HTML report of a run directory (curves, phases, fidelity)")
    p.add_argument("run_dir", help="a directory written by `placeflow run` or `validate`")
    p.add_argument("--out", type=nonempty, help="HTML path (default: RUN_DIR/report.html)")
    p.set_defaults(handler=_cmd_report)

    p = sub.add_parser(
        "export", help="the trainer configuration that realises a plan in verl or OpenRLHF"
    )
    p.add_argument("plan", type=nonempty, help="plan TOML file")
    p.add_argument("--to", choices=("verl", "openrlhf"), required=True, help="target framework")
    p.add_argument("--out", type=nonempty, help="file to write (default: standard output)")
    p.set_defaults(handler=_cmd_export)

    prof = sub.add_parser("profiles", help="list, check and import profiles")
    psub = prof.add_subparsers(dest="profiles_command", required=True)
    p = psub.add_parser("list", help="shipped and user profiles with source and coverage")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=_cmd_profiles_list)
    p = psub.add_parser("check", help="leave-one-out error of the cost model on a profile")
    p.add_argument("name", help="profile name or path to a profile .json")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=_cmd_profiles_check)
    p = psub.add_parser(
        "host", help="whether a CPU profile times this host's kernels (re-times a dozen GEMMs)"
    )
    p.add_argument("name", help="profile name or path to a profile .json")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=_cmd_profiles_host)
    p = psub.add_parser(
        "import-vidur", help="build h100-sxm and a100-80gb profiles from Vidur CSVs"
    )
    p.add_argument("dir", help="Vidur profile folder (with compute/ and network/)")
    p.add_argument("--out-dir", type=nonempty, help="where to write (default: user profile dir)")
    p.set_defaults(handler=_cmd_profiles_import_vidur)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    console = _console()
    _log_to_stderr()
    handler: Handler = args.handler
    try:
        return handler(args, console)
    except SpecError as exc:
        print(f"placeflow: error: {one_line(str(exc))}", file=sys.stderr)
        return 2
    except MeasurementError as exc:  # a profiler's measurement this host could not make
        print(f"placeflow: error: {one_line(str(exc))}", file=sys.stderr)
        return 1
    except OSError as exc:  # a path the user gave that the checks could not foresee
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"placeflow: error: {where}{exc.strerror or exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("placeflow: interrupted", file=sys.stderr)
        return 130


class _FoldingConsole(Console):
    """A console whose tables wrap a cell that does not fit its column onto more lines,
    instead of cutting it with an ellipsis (rich's default)."""

    def print(self, *objects: Any, **kwargs: Any) -> None:
        for obj in objects:
            if isinstance(obj, Table):
                for column in obj.columns:
                    column.overflow = "fold"
        super().print(*objects, **kwargs)


def _console() -> Console:
    """The terminal's width; piped or redirected, $COLUMNS when set, else wide enough that
    no table is cut (rich would cut them at 80 columns). Cells too wide wrap."""
    if sys.stdout.isatty():
        return _FoldingConsole()
    columns = os.environ.get("COLUMNS", "")
    width = int(columns) if columns.isdigit() and int(columns) >= 20 else 1000
    return _FoldingConsole(width=width)


def one_line(message: str) -> str:
    return " ".join(message.split())


def _log_to_stderr() -> None:
    """placeflow's log records (skipped checkpoints, ...) as plain `placeflow:` lines."""
    log = logging.getLogger("placeflow")
    if not log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("placeflow: %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)


if __name__ == "__main__":
    sys.exit(main())
