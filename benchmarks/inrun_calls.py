"""Benchmark: what a worker's call costs inside a run against the same engine call alone.

The CPU fidelity benchmark finds the simulator too fast on nearly every phase.
This script separates where a call's time goes for one plan of
`benchmarks/fidelity_cpu.py` (default colocate-tiny-llama-8p): it runs the
plan with the executor, every worker process timing each of its `Worker`
methods (installed by a Ray `worker_process_setup_hook`, so the executor's
code is unchanged: thread CPU time, wall clock, and the voluntary and
involuntary context switches of the thread from `getrusage(RUSAGE_THREAD)`),
and times the same engine calls of one rank alone in this process
(`fidelity_breakdown.engine_pieces`: one torch thread, no Ray, thread CPU time).
Per call kind it writes the median over the scored steps of every rank:

- `alone_cpu_s`: the engine call alone, repeated (hot);
- `run_cpu_s`: the same call's thread CPU time inside the run's worker;
- `run_wall_s`: its wall clock there (its CPU time plus the time others held
  the core);
- `run_switches`: its context switches (voluntary, involuntary);
- `run_queue_s`: its time runnable but waiting for a core (the thread's run-queue
  delay, /proc/thread-self/schedstat), so that the wall time splits into CPU, the
  wait for a core and `run_blocked_s`, the rest: blocked in a collective or on I/O;
- `driver_phase_s`: the phase as the driver's clock measured it (metrics.jsonl).

With `--serial` the executor runs the plan's calls one at a time (no two sets at once),
so that each call is timed without another set's ranks on the host; its row is kept
as "PLAN (serial)".

`run_cpu_s / alone_cpu_s` is the call's CPU inflation inside the run, which no
profile entry holds yet (README, "Simulator fidelity on this CPU").

    python benchmarks/inrun_calls.py [--plan colocate-tiny-llama-8p] [--steps 24] [--warmup 8]
        [--serial]

Writes the plan's row of benchmarks/results/inrun_calls.json (with the command, the
load and the date; the other plans' rows kept).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ray

from placeflow.executor.run import RunConfig, read_metrics, run_plan

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fidelity_breakdown import engine_pieces
from fidelity_cpu import plans

ROOT = Path(__file__).resolve().parents[1]
METHODS = ("generate", "logprobs", "values", "scores", "update", "sync_rollout")
# The engine piece of `fidelity_breakdown.engine_pieces` for a worker call (method:role).
ALONE = {
    "generate": "generate",
    "logprobs:ref": "ref_logprob",
    "logprobs:actor": "old_logprob",
    "update:actor": "actor_update",
}
# The driver's phase of a worker call.
PHASE = {
    "generate": "generate",
    "logprobs:ref": "ref_logprob",
    "logprobs:actor": "old_logprob",
    "update:actor": "actor_update",
    "update:critic": "critic_update",
    # Safe-RLHF's cost values are a second call of the critic's `values` (its other head):
    # the kind's medians are over both calls.
    "values:critic": "values",
    "scores:reward": "reward",
    "scores:cost": "cost",
    "sync_rollout": "reshard",
}


def timing_hook(out_dir: str) -> Callable[[], None]:
    """A `worker_process_setup_hook` that wraps `METHODS` of the executor's `Worker` so
    that each call appends one JSON line to `out_dir`/calls-<pid>.jsonl."""

    def hook() -> None:
        import functools
        import resource

        from placeflow.executor.worker import Worker

        path = os.path.join(out_dir, f"calls-{os.getpid()}.jsonl")
        for name in METHODS:
            method = getattr(Worker, name)

            def queued_s() -> float:
                # schedstat: ns on a CPU, ns runnable waiting for one, slices (Linux).
                try:
                    with open("/proc/thread-self/schedstat") as f:
                        return int(f.read().split()[1]) / 1e9
                except OSError:
                    return 0.0

            def timed(self: Any, *args: Any, _m: Any = method, _n: str = name, **kw: Any) -> Any:
                u0 = resource.getrusage(resource.RUSAGE_THREAD)
                q0 = queued_s()
                c0, w0 = time.thread_time(), time.perf_counter()
                result = _m(self, *args, **kw)
                wall, cpu = time.perf_counter() - w0, time.thread_time() - c0
                queue = queued_s() - q0
                u1 = resource.getrusage(resource.RUSAGE_THREAD)
                role = getattr(args[0], "value", "") if args else ""
                record = {
                    "call": f"{_n}:{role}" if role else _n,
                    "cpu_s": cpu,
                    "wall_s": wall,
                    "queue_s": queue,
                    # perf_counter is the host's monotonic clock: comparable with the
                    # driver's readings on the same host.
                    "start": w0,
                    "end": w0 + wall,
                    "voluntary": u1.ru_nvcsw - u0.ru_nvcsw,
                    "involuntary": u1.ru_nivcsw - u0.ru_nivcsw,
                    # Kernel time and page faults: the part of the CPU time an
                    # engine call alone may not pay (allocations, wake-ups).
                    "sys_s": u1.ru_stime - u0.ru_stime,
                    "minor_faults": u1.ru_minflt - u0.ru_minflt,
                }
                with open(path, "a") as f:
                    f.write(json.dumps(record) + "\n")
                return result

            setattr(Worker, name, functools.wraps(method)(timed))

    return hook


def _driver_calls() -> tuple[list[dict[str, Any]], Callable[[], None]]:
    """Wrap the driver's `StepClock._record` (this process) so that every call it records
    is also kept with its absolute times: the phase, its launch (once its `.remote()`
    calls returned) and its end (its last result taken). Returns the list and the undo."""
    from placeflow.executor import timeline

    calls: list[dict[str, Any]] = []
    original = timeline.StepClock._record

    def record(self: Any, call: Any, end_at: float) -> None:
        calls.append({"phase": call.phase.value, "launched": call.launched_at, "end": end_at})
        original(self, call, end_at)

    timeline.StepClock._record = record  # type: ignore[method-assign]

    def undo() -> None:
        timeline.StepClock._record = original  # type: ignore[method-assign]

    return calls, undo


def _around(driver: list[dict[str, Any]], ranks: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Per phase, where the driver's interval of a call goes around its ranks' work
    (medians over the calls): from the launch to the first rank's start, the spread of
    the ranks' starts, and from the last rank's end to the driver's end."""
    by_phase: dict[str, dict[str, list[float]]] = {}
    for call in driver:
        kinds = [k for k, phase in PHASE.items() if phase == call["phase"]]
        mine = [
            r
            for k in kinds
            for r in ranks.get(k, [])
            # Ranks queued behind another call start up to its length after the launch.
            if call["launched"] - 0.05 <= r["start"] and r["end"] <= call["end"]
        ]
        if not mine:
            continue
        first, last = min(r["start"] for r in mine), max(r["start"] for r in mine)
        out = by_phase.setdefault(call["phase"], {"to_first": [], "spread": [], "after": []})
        out["to_first"].append(first - call["launched"])
        out["spread"].append(last - first)
        out["after"].append(call["end"] - max(r["end"] for r in mine))
    return {
        phase: {f"{k}_s": statistics.median(v) for k, v in parts.items()}
        | {"calls": len(parts["after"])}
        for phase, parts in sorted(by_phase.items())
    }


def timed_run(
    plan: Any, steps: int, *, overlap: bool = True
) -> tuple[list[dict[str, Any]], dict[str, list[dict[str, Any]]], list[dict[str, Any]]]:
    """A run of `plan` for `steps` steps with every worker method timed (`timing_hook`)
    and the driver's calls kept (`_driver_calls`): the driver's calls, each worker
    process's records in call order (by its file's stem, calls-<pid>), and the run's
    metrics.jsonl records. `overlap` False: the executor's calls one at a time."""
    driver, undo = _driver_calls()
    with tempfile.TemporaryDirectory() as tmp:
        ray.init(
            num_cpus=4,
            include_dashboard=False,
            log_to_driver=False,
            runtime_env={"worker_process_setup_hook": timing_hook(tmp)},
        )
        try:
            cfg = RunConfig(steps=steps, progress=False, overlap=overlap)
            run_plan(plan, Path(tmp) / "run", cfg)
            metrics = read_metrics(Path(tmp) / "run")
        finally:
            ray.shutdown()
            undo()
        files = sorted(Path(tmp).glob("calls-*.jsonl"))
        if not files:
            raise SystemExit("no worker timed a call: the setup hook did not run")
        processes = {
            path.stem: [json.loads(line) for line in path.read_text().splitlines()]
            for path in files
        }
    return driver, processes, metrics


def run_calls(
    plan: Any, steps: int, warmup: int, *, overlap: bool = True
) -> tuple[dict[str, Any], dict[str, float], dict[str, Any]]:
    """Per call kind the medians of the scored steps' calls (every rank's), the
    driver's phases (medians of the scored steps), and where the driver's interval of
    each phase goes around its ranks' work (`_around`). `overlap` False: the executor's
    calls one at a time (`RunConfig.overlap`), so that each is timed with no other set's
    ranks on the host."""
    driver, processes, metrics = timed_run(plan, steps, overlap=overlap)
    per_call: dict[str, list[dict[str, Any]]] = {}
    for records in processes.values():
        by_kind: dict[str, list[dict[str, Any]]] = {}
        for rec in records:
            by_kind.setdefault(rec["call"], []).append(rec)
        for kind, recs in by_kind.items():
            # One call a step per rank: the steps after the warm-up.
            per_call.setdefault(kind, []).extend(recs[len(recs) * warmup // steps :])
    calls = {
        kind: {
            "run_cpu_s": statistics.median(r["cpu_s"] for r in recs),
            "run_wall_s": statistics.median(r["wall_s"] for r in recs),
            "run_queue_s": statistics.median(r["queue_s"] for r in recs),
            "run_blocked_s": statistics.median(
                max(0.0, r["wall_s"] - r["cpu_s"] - r["queue_s"]) for r in recs
            ),
            "run_sys_s": statistics.median(r.get("sys_s", 0.0) for r in recs),
            "run_minor_faults": statistics.median(r.get("minor_faults", 0) for r in recs),
            "run_switches": [
                statistics.median(r["voluntary"] for r in recs),
                statistics.median(r["involuntary"] for r in recs),
            ],
            "calls": len(recs),
        }
        for kind, recs in sorted(per_call.items())
    }
    phases: dict[str, list[float]] = {}
    for rec in metrics[warmup:]:
        for name, sec in rec["phases"].items():
            phases.setdefault(name, []).append(sec)
    # The scored steps' driver calls: those that end after the first scored rank call.
    first = min(r["start"] for recs in per_call.values() for r in recs)
    around = _around([c for c in driver if c["end"] >= first], per_call)
    return calls, {k: statistics.median(v) for k, v in phases.items()}, around


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--plan", default="colocate-tiny-llama-8p")
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--warmup", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument(
        "--serial",
        action="store_true",
        help="run the plan's calls one at a time (no overlap between sets); the row is "
        "kept as 'PLAN (serial)'",
    )
    args = parser.parse_args()
    by_name = {p.name: p for _, p in plans()}
    if args.plan not in by_name:
        raise SystemExit(f"unknown plan {args.plan!r}; one of {', '.join(sorted(by_name))}")
    plan = by_name[args.plan]
    command = "python benchmarks/inrun_calls.py " + " ".join(sys.argv[1:])
    date = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    load_before = os.getloadavg()[0]
    alone = engine_pieces(plan, args.repeats)
    calls, phases, around = run_calls(plan, args.steps, args.warmup, overlap=not args.serial)
    for kind, row in calls.items():
        piece = ALONE.get(kind)
        if piece is not None:
            row["alone_cpu_s"] = alone[piece]
            row["cpu_inflation"] = row["run_cpu_s"] / alone[piece] - 1
        if kind in PHASE and PHASE[kind] in phases:
            row["driver_phase_s"] = phases[PHASE[kind]]
    row = {
        "command": command.strip(),
        "date": date,
        "steps": args.steps,
        "warmup": args.warmup,
        "cpu_count": os.cpu_count(),
        "load_1min_before": load_before,
        "load_1min_after": os.getloadavg()[0],
        "calls": calls,
        "around": around,
    }
    # One file for every plan measured: this plan's row replaced, the others kept.
    path = ROOT / "benchmarks" / "results" / "inrun_calls.json"
    out = json.loads(path.read_text()) if path.exists() else {"plans": {}}
    out["plans"][args.plan + (" (serial)" if args.serial else "")] = row
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(
        f"{'call':16s} {'alone CPU':>10s} {'run CPU':>10s} {'run queue':>10s} "
        f"{'run blocked':>11s} {'run wall':>10s} {'phase':>10s}  (ms)"
    )
    for kind, row in calls.items():

        def ms(key: str, row: dict[str, Any] = row) -> str:
            return f"{row[key] * 1e3:10.2f}" if key in row else f"{'-':>10s}"

        print(
            f"{kind:16s} {ms('alone_cpu_s')} {ms('run_cpu_s')} {ms('run_queue_s')} "
            f" {ms('run_blocked_s')} {ms('run_wall_s')} {ms('driver_phase_s')}"
        )
    print(f"{'phase':16s} {'to first':>10s} {'spread':>10s} {'after':>10s}  (ms)")
    for phase, parts in around.items():
        print(
            f"{phase:16s} {parts['to_first_s'] * 1e3:10.2f} {parts['spread_s'] * 1e3:10.2f} "
            f"{parts['after_s'] * 1e3:10.2f}"
        )
    print(f"wrote {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
