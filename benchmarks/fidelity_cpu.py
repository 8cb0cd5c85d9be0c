"""Benchmark: the simulator's error against real executor runs on this CPU machine.

For each plan of a matrix — GRPO placements colocate, colocate with TP 2,
colocate with PP 2, split and standalone; two model sizes (tiny-llama,
tiny-llama-m); two batch sizes — plus the example plans of the other
algorithms (PPO colocate and split, ReMax, Safe-RLHF) and a generator set
(synchronous and one-step-off), runs it with the executor on logical CPU
workers (as `placeflow validate` does), simulates the same plan with the
shipped `cpu` profile, and compares per phase and per step (median over the
steps after the first `--warmup`: the executor's steps on this CPU take several
steps to settle, 200 ms falling to 135 ms over the first seven steps of the
split plan, so the default measures 16 steps and scores the last 8). Every plan
generates exactly response_len tokens (`fixed_lengths`), and its prompt_len is the
length the run pads its prompts to (`executor.loop.as_run`: the shipped arithmetic
prompts are 4-6 tokens, so 6, where the plans say 16; the simulator prices every
prompt at prompt_len tokens, so results files before 2026-11-26 17:00 UTC compared a
simulated 32-token sequence with a measured 22-token one). Writes
benchmarks/results/fidelity_cpu.json with every row, the machine's load
average around each run, and the summary (median and worst absolute error over
all phases, and over steps), and prints a markdown table.

    python benchmarks/fidelity_cpu.py [--steps 16] [--warmup 8] [--profile cpu] [--only NAME ...]
        [--rounds 1]

With `--rounds N` it runs every plan N times, a round of all the plans after
another (every other round in reverse order), and scores each plan against the
median of its runs (`simulator.fidelity.median_table`): on this VM two runs of the
same code land 9-18 % apart at the median step (benchmarks/repeatability.py), and a
slow minute of the VM falls on one run of a plan rather than its whole measurement.
Each row then lists its runs' own times (`runs`), and the report how far the runs
land from their plan's median (`run_vs_median_of_runs`), how far the rounds land from
one another pair by pair (`round_vs_round`, as benchmarks/repeatability.py scores two
results files) and what the model scores against each round alone
(`model_vs_each_round`).

Before it runs anything it re-times a few of the profile's GEMMs on this host
(`profiles.hostcheck`) and refuses a host that runs them more than 50 % off the
profile's times (another machine than the one profiled: `--any-host` runs anyway);
the check goes into the results file. With `--host-speed` it simulates each plan
with the profile brought to the speed of the host around its run
(`hostcheck.at_host_speed`: every entry's times times the geometric mean of the
host checks right before and right after the run, the first plan's before being
the median of `SPEED_CHECKS` checks; a VM's speed moves from one minute to the
next), whatever the ratio, unless the GEMMs' speed and the engine pieces' (below)
stand more than 2x apart, the sign of a profile made on another kind of host
(`hostcheck.speeds_apart`; `--any-host` runs anyway); each row records its
`host_speed` and `host_checks`, the
report the starting median as `host_speed`. The engine's own pieces (its Python
beyond the kernels, the profile's engine framework entries) are brought to a speed
of their own, read the same way from those pieces re-timed
(`hostcheck.check_framework`, about 2 s a check; `host_work_speed`,
`host_work_checks`): the kernels' speed does not tell it.

With `--resimulate RESULTS` it runs nothing: it simulates the same plans with
the current model and profile and compares them with the measured figures of
an earlier results file (each phase's and each step's median as that run
recorded it), writing benchmarks/results/fidelity_cpu_resimulated.json (with
`--host-speed`: the profile at the speed that run recorded, each plan's own where
it has one). This
separates a change of the model from the load of the day. With `--gemm-speed-only`
as well, only the GEMMs' speed is brought over and the engine's pieces keep the
profile's times: where the pieces' checks move between minutes more than the run
does, this tells which of the two the score hangs on.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import ray
import torch
from repeatability import Key, per_phase

from placeflow.executor.loop import as_run
from placeflow.executor.run import RunConfig, read_metrics, run_plan
from placeflow.plan import Plan, load_plan, plan_from_dict
from placeflow.profiles.costmodel import CostModel
from placeflow.profiles.hostcheck import (
    HostCheck,
    at_host_speed,
    check_framework,
    check_host,
    speeds_apart,
)
from placeflow.profiles.registry import load_profile
from placeflow.profiles.schema import Profile
from placeflow.simulator import simulate
from placeflow.simulator.fidelity import compare, median_table
from placeflow.simulator.simulate import cost_models_for
from placeflow.workload import Role

# Host checks before a run; with --host-speed their median ratio is the host's speed.
SPEED_CHECKS = 3
SETTLE_S = 1.0  # between a plan's run and the host check after it
ROOT = Path(__file__).resolve().parents[1]
PLANS = ROOT / "examples" / "plans"

PLACEMENTS: dict[str, tuple[list[dict[str, Any]], dict[str, Any]]] = {
    "colocate": (
        [{"roles": ["actor", "ref"], "pool": "cpu", "first_device": 0, "num_devices": 4}],
        {"actor": {"d": 4, "micro_batch": 8}, "ref": {"d": 4, "micro_batch": 16}},
    ),
    "colocate-tp2": (
        [{"roles": ["actor", "ref"], "pool": "cpu", "first_device": 0, "num_devices": 4}],
        {"actor": {"t": 2, "d": 2, "tg": 1, "micro_batch": 8}, "ref": {"d": 4, "micro_batch": 16}},
    ),
    "colocate-pp2": (
        [{"roles": ["actor", "ref"], "pool": "cpu", "first_device": 0, "num_devices": 4}],
        {"actor": {"p": 2, "d": 2, "micro_batch": 8}, "ref": {"d": 4, "micro_batch": 16}},
    ),
    "split": (
        [
            {"roles": ["actor"], "pool": "cpu", "first_device": 0, "num_devices": 2},
            {"roles": ["ref"], "pool": "cpu", "first_device": 2, "num_devices": 2},
        ],
        {"actor": {"d": 2, "micro_batch": 8}, "ref": {"d": 2, "micro_batch": 16}},
    ),
    "standalone": (
        [
            {"roles": ["actor"], "pool": "cpu", "first_device": 0, "num_devices": 2},
            {"roles": ["ref"], "pool": "cpu", "first_device": 2, "num_devices": 1},
            {"roles": ["reward"], "pool": "cpu", "first_device": 3, "num_devices": 1},
        ],
        {
            "actor": {"d": 2, "micro_batch": 8},
            "ref": {"micro_batch": 16},
            "reward": {"micro_batch": 16},
        },
    ),
}


def make_plan(placement: str, model: str, prompts: int) -> Plan:
    sets, par = PLACEMENTS[placement]
    models = {"actor": model, "ref": model}
    workload: dict[str, Any] = {
        "name": f"grpo-{model}-{prompts}",
        "algorithm": "grpo",
        "models": models,
        "batch": {
            "prompts_per_step": prompts,
            "samples_per_prompt": 4,
            "prompt_len": 16,
            "response_len": 16,
            "mini_batches": 2,
        },
        "rl": {"lr": 2e-3},
    }
    if placement == "standalone":
        models["reward"] = model
    else:
        workload["reward_function"] = "arith"
    for p in par.values():
        p["recompute"] = False
    name = f"{placement}-{model}-{prompts}p"
    data: dict[str, Any] = {
        "name": name,
        "workload": workload,
        "cluster": "../clusters/cpu4.toml",
        "sets": sets,
        "parallelism": par,
    }
    return plan_from_dict(data, name, PLANS)


# Example plans of the other algorithms and of a generator set (file, placement label).
EXAMPLES = (
    ("ppo-tiny-cpu4-colocate.toml", "colocate"),
    ("ppo-tiny-cpu4-split.toml", "split"),
    ("remax-tiny-cpu4-split.toml", "split"),
    ("safe-rlhf-tiny-cpu4-split.toml", "split"),
    ("grpo-tiny-cpu2-async.toml", "generator-async"),
)


def generator_sync(plan: Plan) -> Plan:
    """The one-step-off generator-set plan run synchronously (weight sync, then generate)."""
    workload = dataclasses.replace(plan.workload, max_staleness=0)
    return dataclasses.replace(plan, name="grpo-tiny-cpu2-generator", workload=workload)


def fixed_lengths(plan: Plan) -> Plan:
    """`plan` with responses of exactly response_len tokens (`ignore_stop`): the length
    the simulator assumes for a fixed length distribution. A policy that learns to
    answer early (the arithmetic reward teaches it within a few steps at these learning
    rates) would otherwise generate less each step than the step that is simulated."""
    wl = plan.workload
    if wl.batch.response_len_dist != "fixed":
        return plan
    rl = dataclasses.replace(wl.rl, ignore_stop=True)
    return dataclasses.replace(plan, workload=dataclasses.replace(wl, rl=rl))


def plans() -> list[tuple[str, Plan]]:
    out = [
        (placement, make_plan(placement, model, prompts))
        for model in ("tiny-llama", "tiny-llama-m")
        for prompts in (8, 16)
        for placement in PLACEMENTS
    ]
    for file, label in EXAMPLES:
        out.append((label, load_plan(PLANS / file)))
    out.append(("generator", generator_sync(load_plan(PLANS / "grpo-tiny-cpu2-async.toml"))))
    return [(label, as_run(fixed_lengths(plan))) for label, plan in out]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument(
        "--warmup", type=int, default=8, help="steps left out before the median is taken"
    )
    parser.add_argument("--profile", default="cpu")
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="runs of every plan, interleaved (every other round in reverse); each plan "
        "is scored against the median of its runs",
    )
    parser.add_argument("--only", nargs="*", default=None, help="plan names to run")
    parser.add_argument(
        "--resimulate", type=Path, default=None, help="an earlier results file to compare with"
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="where to write the results (default benchmarks/results/fidelity_cpu.json, "
        "with --resimulate fidelity_cpu_resimulated.json)",
    )
    parser.add_argument(
        "--any-host",
        action="store_true",
        help="run even where the profile's GEMMs re-time more than 50%% off on this host",
    )
    parser.add_argument(
        "--host-speed",
        action="store_true",
        help="simulate with the profile's times scaled by the host check's ratio",
    )
    parser.add_argument(
        "--gemm-speed-only",
        action="store_true",
        help="with --resimulate and --host-speed: bring the GEMMs' recorded speed only, "
        "the engine's pieces at the profile's times",
    )
    args = parser.parse_args()
    if args.gemm_speed_only and (args.resimulate is None or not args.host_speed):
        parser.error("--gemm-speed-only goes with --resimulate and --host-speed")
    if args.rounds < 1:
        parser.error(f"--rounds is how many runs of each plan: 1 or more, got {args.rounds}")
    if args.resimulate is not None:
        resimulate(
            args.resimulate,
            args.profile,
            args.host_speed,
            args.out,
            work_speed=not args.gemm_speed_only,
        )
        return
    # The profile must time this host's kernels as they run here, or every prediction
    # is off by the ratio and the comparison says nothing of the model (hostcheck).
    # One check of a dozen GEMMs moves by ±20 % from one minute to the next here: the
    # speed is the median of several.
    profile = load_profile(args.profile)
    checked = host_speeds(profile, engine=args.host_speed)
    host = checked.checks[0]
    for check in checked.checks:
        print(check.summary(), file=sys.stderr)
    speed = checked.speed if args.host_speed else None
    # The engine's own pieces (its Python beyond the kernels) keep a speed of their own
    # (checked only with --host-speed and a GEMM speed).
    work_speed = checked.work_speed
    if work_speed is not None:
        print(
            f"the engine's pieces run at {work_speed:.2f}x the profile's times here "
            f"(median of {sum(r is not None for r in checked.work_checks)} checks)",
            file=sys.stderr,
        )
    # A profile brought to this host's speed is compared whatever the ratio was, unless
    # its two speeds stand so far apart that it describes another kind of host.
    apart = speeds_apart(speed, work_speed)
    if apart is not None and not args.any_host:
        raise SystemExit(f"fidelity_cpu: {apart} (or --any-host to compare anyway)")
    if not host.ok and not args.any_host and speed is None:
        raise SystemExit(
            "fidelity_cpu: the profile does not describe this host; measure one here, "
            "pass --host-speed to bring it to this host's speed or --any-host to compare "
            "anyway"
        )
    matrix = [(label, plan) for label, plan in plans() if not args.only or plan.name in args.only]
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    runs: dict[str, list[dict[str, Any]]] = {plan.name: [] for _, plan in matrix}
    t0 = time.perf_counter()
    # With --host-speed each run is simulated at the speed of its own minutes: the
    # geometric mean of the checks right before and right after it (the first
    # run's before: the median above).
    before, work_before = speed, work_speed
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for round_ in range(args.rounds):
                # Every other round in reverse, so that no plan always runs at the same
                # point of the VM's slower and quieter minutes.
                for _, plan in matrix if round_ % 2 == 0 else matrix[::-1]:
                    run_dir = Path(tmp) / f"{plan.name}-{round_}"
                    load_before = os.getloadavg()[0]
                    run_plan(plan, run_dir, RunConfig(steps=args.steps, progress=False))
                    load_after = os.getloadavg()[0]
                    speeds: dict[str, Any] = {}
                    if before is not None:
                        # (the check times GEMMs by the wall clock: the run's workers
                        # first finish exiting)
                        time.sleep(SETTLE_S)
                        speeds["host_speed"], speeds["host_checks"], before = _bracket(
                            before, check_host(profile).ratio
                        )
                    if work_before is not None:
                        speeds["host_work_speed"], speeds["host_work_checks"], work_before = (
                            _bracket(work_before, check_framework(profile))
                        )
                    records = read_metrics(run_dir)
                    runs[plan.name].append(
                        {
                            "records": records,
                            "load_1min_before": load_before,
                            "load_1min_after": load_after,
                            **speeds,
                        }
                    )
                    plan_speed = speeds.get("host_speed")
                    print(
                        f"{plan.name} (round {round_ + 1} of {args.rounds}): step "
                        f"{_median_step_s(records, args.warmup) * 1e3:.0f} ms, "
                        f"load {load_before:.1f}"
                        + (f", host speed {plan_speed:.2f}x" if plan_speed else "")
                        + (
                            f", the engine's pieces {speeds['host_work_speed']:.2f}x"
                            if "host_work_speed" in speeds
                            else ""
                        ),
                        file=sys.stderr,
                    )
    finally:
        ray.shutdown()
    rows = []
    for placement, plan in matrix:
        row = _score(placement, plan, runs[plan.name], profile, args.profile, args.warmup)
        rows.append(row)
        print(
            f"{plan.name}: median {row['median_abs_error']:.0%}, "
            f"step {row['step']['rel_error']:+.0%}",
            file=sys.stderr,
        )
    errors = [abs(p["rel_error"]) for r in rows for p in r["phases"]]
    step_errors = [abs(r["step"]["rel_error"]) for r in rows]
    loads = [
        run[key]
        for plan_runs in runs.values()
        for run in plan_runs
        for key in ("load_1min_before", "load_1min_after")
    ]
    report = {
        "command": "python " + " ".join(["benchmarks/fidelity_cpu.py", *sys.argv[1:]]),
        "date": time.strftime("%Y-%m-%d"),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "profile": args.profile,
        "host_check": host.to_json(),
        "host_checks": [c.ratio for c in checked.checks],
        "host_speed": speed,
        "host_work_checks": list(checked.work_checks),
        "host_work_speed": work_speed,
        "steps": args.steps,
        "warmup": args.warmup,
        "rounds": args.rounds,
        "total_s": round(time.perf_counter() - t0, 1),
        "num_plans": len(rows),
        "load_1min_median": statistics.median(loads),
        "load_1min_max": max(loads),
        "median_abs_error_all_phases": statistics.median(errors),
        "worst_abs_error_all_phases": max(errors),
        "median_abs_error_steps": statistics.median(step_errors),
        "worst_abs_error_steps": max(step_errors),
        **(_round_summary(rows) if args.rounds > 1 else {}),
        "rows": rows,
    }
    out = args.out or ROOT / "benchmarks/results/fidelity_cpu.json"
    out.write_text(json.dumps(report, indent=1) + "\n")
    print("| plan | " + " | ".join(("phase", "measured s", "simulated s", "error")) + " |")
    print("|---|---|---:|---:|---:|")
    for r in rows:
        for p in [*r["phases"], {"phase": "step", **r["step"]}]:
            print(
                f"| {r['plan']} | {p['phase']} | {p['measured_s']:.4f} | "
                f"{p['predicted_s']:.4f} | {p['rel_error']:+.0%} |"
            )
    print(
        f"{len(rows)} plans; median |error| over all phases "
        f"{report['median_abs_error_all_phases']:.0%}, worst "
        f"{report['worst_abs_error_all_phases']:.0%}; over steps median "
        f"{report['median_abs_error_steps']:.0%}, worst {report['worst_abs_error_steps']:.0%}; "
        f"load average {report['load_1min_median']:.1f} (max {report['load_1min_max']:.1f}) "
        f"on {os.cpu_count()} CPUs"
    )
    for pair, apart in report.get("round_vs_round", {}).items():
        print(
            f"rounds {pair}: {apart['phases']['median']:.0%} / {apart['phases']['worst']:.0%} "
            f"apart over phases, {apart['steps']['median']:.0%} / "
            f"{apart['steps']['worst']:.0%} over steps"
        )


def _median_step_s(records: list[dict[str, Any]], warmup: int) -> float:
    """A run's median step time over the steps after `warmup` (all if fewer)."""
    used = records[warmup:] or records
    return statistics.median(float(r["step_time_s"]) for r in used)


def _score(
    placement: str,
    plan: Plan,
    plan_runs: list[dict[str, Any]],
    profile: Profile,
    profile_name: str,
    warmup: int,
) -> dict[str, Any]:
    """One plan's row: the simulation (at the median of its runs' host speeds, where
    they were checked) against the median of its runs (`median_table`); with several
    runs, each run's own measured times in `runs`."""
    speeds = [r["host_speed"] for r in plan_runs if r.get("host_speed") is not None]
    plan_speed = statistics.median(speeds) if speeds else None
    works = [r["host_work_speed"] for r in plan_runs if r.get("host_work_speed") is not None]
    work_speed = statistics.median(works) if works else None
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    cms = cost_models_at(profile, plan_speed, stamp, work_speed)
    estimate = simulate(plan, cms or cost_models_for(plan, profile_name))
    own = [compare(estimate, r["records"], warmup=warmup) for r in plan_runs]
    table = median_table(estimate, own)
    row: dict[str, Any] = {
        "placement": placement,
        "algorithm": plan.workload.algorithm.value,
        "async": plan.workload.asynchronous,
        "model": plan.workload.models[Role.ACTOR].name,
        "prompts": plan.workload.batch.prompts_per_step,
        "load_1min_before": statistics.median(r["load_1min_before"] for r in plan_runs),
        "load_1min_after": statistics.median(r["load_1min_after"] for r in plan_runs),
    }
    if plan_speed is not None:
        row["host_speed"] = plan_speed
        row["host_checks"] = [c for r in plan_runs for c in r.get("host_checks", [])]
    if work_speed is not None:
        row["host_work_speed"] = work_speed
    row.update(table.to_json())
    if len(plan_runs) > 1:
        row["runs"] = [
            {
                **{k: v for k, v in run.items() if k != "records"},
                "phases": {p.phase: p.measured_s for p in run_table.phases},
                "step_s": run_table.step.measured_s,
            }
            for run, run_table in zip(plan_runs, own, strict=True)
        ]
    return row


def _round_summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """How far each run lands from its plan's median of runs, how far two rounds land
    from each other (as `benchmarks/repeatability.py` scores two results files), and
    the model's error against each round alone (what one round would have scored);
    each over phases and over steps, median and worst of |a / b - 1|."""
    report = {"rows": rows}
    median_of_runs = per_phase(report, "measured_s")
    simulated = per_phase(report, "predicted_s")
    rounds = min(len(r["runs"]) for r in rows)
    each = [_round_times(rows, i) for i in range(rounds)]
    return {
        "run_vs_median_of_runs": [_off(run, median_of_runs) for run in each],
        "round_vs_round": {
            f"{i + 1} vs {j + 1}": _off(each[i], each[j])
            for i in range(rounds)
            for j in range(i + 1, rounds)
        },
        "model_vs_each_round": [_off(simulated, run) for run in each],
    }


def _round_times(rows: list[dict[str, Any]], i: int) -> dict[Key, float]:
    """Round i's own measured times, keyed as `repeatability.per_phase` keys a file."""
    out: dict[Key, float] = {}
    for r in rows:
        own = r["runs"][i]
        out.update({(r["plan"], name): t for name, t in own["phases"].items()})
        out[(r["plan"], "step")] = own["step_s"]
    return out


def _off(first: dict[Key, float], second: dict[Key, float]) -> dict[str, dict[str, float]]:
    """|first / second - 1| over the keys both have: median and worst over the phases
    and over the steps."""
    out = {}
    for label, steps in (("phases", False), ("steps", True)):
        errors = [
            abs(a / second[key] - 1)
            for key, a in first.items()
            if key in second and (key[1] == "step") == steps
        ]
        out[label] = {"median": statistics.median(errors), "worst": max(errors)}
    return out


def _bracket(before: float, after: float | None) -> tuple[float, list[float | None], float]:
    """A run's speed from the checks right before and right after it (their geometric
    mean; the one before where the one after failed), the checks, and the next run's
    before."""
    if after is None:
        return before, [before, after], before
    return math.sqrt(before * after), [before, after], after


def cost_models_at(
    profile: Profile, speed: float | None, checked: str, work_speed: float | None = None
) -> dict[str, CostModel] | None:
    """The cost model of `profile` at the host speed `speed` (`hostcheck.at_host_speed`,
    measured at `checked`; its host work at `work_speed` where the engine's pieces were
    checked too); None without a speed (the plans' own, `cost_models_for`)."""
    if speed is None:
        return None
    at = at_host_speed(profile, speed, checked=checked, host_work_ratio=work_speed)
    return {"*": CostModel.fit(at)}


@dataclasses.dataclass(frozen=True)
class HostSpeeds:
    """This host's speeds against a CPU profile, checked now: `speed` is the median
    ratio of `SPEED_CHECKS` GEMM checks (`checks`, None where none re-timed a GEMM),
    `work_speed` the median of as many checks of the engine's pieces (`work_checks`,
    None each that found none of them; the speed None where none did or they were not
    taken)."""

    checks: tuple[HostCheck, ...]
    speed: float | None
    work_checks: tuple[float | None, ...]
    work_speed: float | None


def host_speeds(profile: Profile, *, engine: bool = True) -> HostSpeeds:
    """`SPEED_CHECKS` checks of the GEMMs (`hostcheck.check_host`) and, with `engine`
    and a GEMM speed, as many of the engine's pieces (`hostcheck.check_framework`):
    one check of a dozen GEMMs moves by ±20 % from one minute to the next on the 2-core
    VM, so each speed is the median of several."""
    checks = tuple(check_host(profile) for _ in range(SPEED_CHECKS))
    ratios = [c.ratio for c in checks if c.ratio is not None]
    speed = statistics.median(ratios) if ratios else None
    works = tuple(check_framework(profile) for _ in range(SPEED_CHECKS)) if engine and speed else ()
    work_ratios = [r for r in works if r is not None]
    work_speed = statistics.median(work_ratios) if work_ratios else None
    return HostSpeeds(checks=checks, speed=speed, work_checks=works, work_speed=work_speed)


def resimulate(
    results: Path,
    profile: str,
    host_speed: bool = False,
    out: Path | None = None,
    *,
    work_speed: bool = True,
) -> None:
    """The current model against an earlier run's measured figures (module docstring);
    `work_speed` False leaves the engine's pieces at the profile's times."""
    earlier = json.loads(results.read_text())
    speed = None
    if host_speed:
        speed = earlier.get("host_speed") or (earlier.get("host_check") or {}).get("ratio")
        if speed is None:
            raise SystemExit(f"fidelity_cpu: {results} records no host check to take a speed from")
    loaded = load_profile(profile) if host_speed else None
    run_cms = (
        None
        if loaded is None
        else cost_models_at(
            loaded,
            speed,
            f"the run of {results.name}",
            earlier.get("host_work_speed") if work_speed else None,
        )
    )
    measured = {r["plan"]: r for r in earlier["rows"]}
    rows: list[dict[str, Any]] = []
    for _, plan in plans():
        if plan.name not in measured:
            continue
        old = measured[plan.name]
        # (a run made with --host-speed recorded each plan's own speed)
        row_speed = old.get("host_speed") if host_speed else None
        cms = run_cms
        if loaded is not None and row_speed is not None:
            cms = cost_models_at(
                loaded,
                row_speed,
                f"{plan.name}'s run in {results.name}",
                # (recorded by runs since 2026-11-29 05:30 UTC)
                old.get("host_work_speed") if work_speed else None,
            )
        estimate = simulate(plan, cms or cost_models_for(plan, profile))
        predicted = estimate.phase_totals_s()
        phases = [
            {**p, "predicted_s": predicted[p["phase"]]}
            for p in old["phases"]
            if p["phase"] in predicted
        ]
        for p in phases:
            p["rel_error"] = p["predicted_s"] / p["measured_s"] - 1
        step = {**old["step"], "predicted_s": estimate.iteration_s}
        step["rel_error"] = step["predicted_s"] / step["measured_s"] - 1
        # The driver's own work, listed (not scored) where the earlier run listed it.
        controller = [
            {**p, "predicted_s": predicted[p["phase"]]}
            for p in old.get("controller", [])
            if p["phase"] in predicted
        ]
        rows.append({"plan": plan.name, "phases": phases, "step": step, "controller": controller})
        print(
            f"| {plan.name} | "
            + ", ".join(f"{p['phase']} {p['rel_error']:+.0%}" for p in phases)
            + f" | {step['measured_s'] * 1e3:.0f} / {step['predicted_s'] * 1e3:.0f} "
            f"({step['rel_error']:+.0%}) |"
        )
    errors = [abs(p["rel_error"]) for r in rows for p in r["phases"]]
    step_errors = [abs(r["step"]["rel_error"]) for r in rows]
    report = {
        "command": "python " + " ".join(["benchmarks/fidelity_cpu.py", *sys.argv[1:]]),
        "date": time.strftime("%Y-%m-%d"),
        "measured_in": str(results),
        "measured_on": earlier["date"],
        "measured_load_1min_median": earlier["load_1min_median"],
        "profile": profile,
        "host_speed": speed,
        "num_plans": len(rows),
        "median_abs_error_all_phases": statistics.median(errors),
        "worst_abs_error_all_phases": max(errors),
        "median_abs_error_steps": statistics.median(step_errors),
        "worst_abs_error_steps": max(step_errors),
        "rows": rows,
    }
    out = out or ROOT / "benchmarks/results/fidelity_cpu_resimulated.json"
    out.write_text(json.dumps(report, indent=1) + "\n")
    print(
        f"{len(rows)} plans re-simulated against {results.name}: median |error| over all "
        f"phases {report['median_abs_error_all_phases']:.0%}, worst "
        f"{report['worst_abs_error_all_phases']:.0%}; over steps median "
        f"{report['median_abs_error_steps']:.0%}, worst {report['worst_abs_error_steps']:.0%}"
    )


if __name__ == "__main__":
    main()
