"""Benchmark: where a step's calls spend their time between the driver and each rank.

`benchmarks/timeline_cpu.py` draws a step's calls on the driver's clock and
`benchmarks/inrun_calls.py` times each worker method inside the ranks. This script
puts both on one clock (the host's monotonic clock, which every process of a CPU run
reads) for one plan of `benchmarks/fidelity_cpu.py`, and splits each call of the
scored steps into the parts a cost model has to price:

- `to_first_s`: from the driver's launch stamp (its `.remote()` calls returned,
  `executor.timeline.StepClock.launch`) to the first rank's start; below 0 where a
  rank starts before the driver has launched the others;
- `spread_s`: the ranks' starts apart (last less first);
- `after_s`: from the last rank's end to the driver holding every result (the
  call's end stamp);
- `handover_s`: for a call queued behind another on the same ranks (launched before
  that one ended), from the last rank's end of the first to the last rank's start of
  the second: what the queued call waits beyond its ranks' work;
- per worker method, the thread CPU time of each rank's call (p10, median, p90): the
  same work on the same ranks from step to step, so that their spread is the host's
  own steadiness (a VM whose neighbours load its physical cores runs the same call at
  different speeds without any steal time).

The run is `inrun_calls.timed_run`'s: the ranks timed by `inrun_calls.timing_hook` (a
Ray `worker_process_setup_hook`; the executor's code is unchanged) and the driver's
calls kept by wrapping `StepClock._record` (`inrun_calls._driver_calls`).

    python benchmarks/rank_timeline.py [--plan safe-rlhf-tiny-cpu4-split]
        [--steps 16] [--warmup 8]

Writes the plan's row of benchmarks/results/rank_timeline.json (the command, the
date, the load, the medians over the scored steps; the other plans' rows kept).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fidelity_cpu import plans
from inrun_calls import PHASE, timed_run

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results" / "rank_timeline.json"
# A rank's next call further than this after its previous one is not queued behind it.
QUEUED_GAP_S = 0.03


def _quantiles(values: Sequence[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "p10_s": ordered[len(ordered) // 10],
        "median_s": statistics.median(ordered),
        "p90_s": ordered[(9 * len(ordered)) // 10],
        "count": len(ordered),
    }


def method_kinds(phase: str) -> set[str]:
    """The worker methods (`inrun_calls.PHASE`'s "method:role") that run `phase`'s call:
    Safe-RLHF's cost values are the critic's second `values` call of the step."""
    if phase == "cost_values":
        return {"values:critic"}
    return {
        kind
        for kind, p in PHASE.items()
        if p == phase or (p, phase) == ("generate", "generate_baseline")
    }


def split_calls(
    driver: Sequence[dict[str, Any]], ranks: Sequence[dict[str, Any]]
) -> dict[str, dict[str, list[float]]]:
    """Per phase, the parts of each driver call (module docstring), one value per call.

    `driver`: the calls as `_driver_calls` keeps them (phase, launched, end); `ranks`:
    each rank's method calls (call, pid, start, end). A call's ranks are, on each pid,
    the first call of its method (`method_kinds`) not taken by an earlier driver call
    that starts after its launch less `QUEUED_GAP_S` (a rank may start before the
    driver's last launch returns) and ends by its end."""
    parts: dict[str, dict[str, list[float]]] = {}
    taken: set[int] = set()
    by_pid: dict[str, list[tuple[int, dict[str, Any]]]] = {}
    for i, r in enumerate(sorted(ranks, key=lambda r: r["start"])):
        by_pid.setdefault(r["pid"], []).append((i, r))
    previous: dict[str, dict[str, Any]] = {}  # pid -> the rank call before, for hand-overs
    for call in sorted(driver, key=lambda c: c["launched"]):
        kinds = method_kinds(call["phase"])
        mine = []
        for pid, calls in by_pid.items():
            for i, r in calls:
                if i in taken or r["call"] not in kinds or r["end"] > call["end"] + 1e-9:
                    continue
                if r["start"] >= call["launched"] - QUEUED_GAP_S:
                    mine.append((pid, i, r))
                    break
        if not mine:
            continue
        taken.update(i for _, i, _ in mine)
        starts = [r["start"] for _, _, r in mine]
        ends = [r["end"] for _, _, r in mine]
        out = parts.setdefault(
            call["phase"], {"to_first_s": [], "spread_s": [], "after_s": [], "handover_s": []}
        )
        out["to_first_s"].append(min(starts) - call["launched"])
        out["spread_s"].append(max(starts) - min(starts))
        out["after_s"].append(call["end"] - max(ends))
        before = [previous[pid] for pid, _, _ in mine if pid in previous]
        if len(before) == len(mine):
            last_end = max(b["end"] for b in before)
            # Queued: launched before the ranks' previous call ended, and started soon after.
            if call["launched"] < last_end and max(starts) - last_end < QUEUED_GAP_S:
                out["handover_s"].append(max(starts) - last_end)
        for pid, _, r in mine:
            previous[pid] = r
    return parts


def run_ranks(plan: Any, steps: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The driver's calls and every rank's method calls of a run of `plan`, each rank
    call with its process's `pid` (`inrun_calls.timed_run`)."""
    driver, processes, _ = timed_run(plan, steps)
    ranks = [{**rec, "pid": pid} for pid, records in processes.items() for rec in records]
    return driver, ranks


def scored(
    driver: list[dict[str, Any]], ranks: list[dict[str, Any]], steps: int, warmup: int
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The calls of the steps after `warmup`: from the first call of step `warmup` on
    (the driver's calls in launch order, `steps` steps of the same calls each)."""
    ordered = sorted(driver, key=lambda c: c["launched"])
    per_step = len(ordered) // steps
    if per_step == 0:
        raise SystemExit(f"{len(ordered)} driver calls for {steps} steps")
    t0 = ordered[warmup * per_step]["launched"] - QUEUED_GAP_S
    return [c for c in ordered if c["launched"] >= t0], [r for r in ranks if r["start"] >= t0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--plan", default="safe-rlhf-tiny-cpu4-split")
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--warmup", type=int, default=8)
    args = parser.parse_args()
    by_name = {p.name: p for _, p in plans()}
    if args.plan not in by_name:
        raise SystemExit(f"unknown plan {args.plan!r}; one of {', '.join(sorted(by_name))}")
    if not 0 <= args.warmup < args.steps:
        parser.error(f"--warmup must be below --steps ({args.steps}), got {args.warmup}")
    load_before = os.getloadavg()[0]
    date = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    driver, ranks = scored(*run_ranks(by_name[args.plan], args.steps), args.steps, args.warmup)
    parts = split_calls(driver, ranks)
    cpu: dict[str, list[float]] = {}
    for r in ranks:
        cpu.setdefault(r["call"], []).append(r["cpu_s"])
    row = {
        "command": ("python benchmarks/rank_timeline.py " + " ".join(sys.argv[1:])).strip(),
        "date": date,
        "steps": args.steps,
        "warmup": args.warmup,
        "cpu_count": os.cpu_count(),
        "load_1min_before": load_before,
        "load_1min_after": os.getloadavg()[0],
        "calls": {
            phase: {k: statistics.median(v) for k, v in p.items() if v}
            | {"calls": len(p["after_s"]), "queued": len(p["handover_s"])}
            for phase, p in sorted(parts.items())
        },
        "rank_cpu": {kind: _quantiles(v) for kind, v in sorted(cpu.items())},
    }
    out = json.loads(OUT.read_text()) if OUT.exists() else {"plans": {}}
    out["plans"][args.plan] = row
    OUT.write_text(json.dumps(out, indent=1) + "\n")
    print(f"{'phase':16s} {'to first':>9s} {'spread':>8s} {'after':>8s} {'hand-over':>10s}  (ms)")
    for phase, p in row["calls"].items():
        cells = [p.get(k) for k in ("to_first_s", "spread_s", "after_s", "handover_s")]
        print(
            f"{phase:16s} "
            + " ".join(
                f"{'-' if v is None else f'{v * 1e3:.1f}':>{w}s}"
                for v, w in zip(cells, (9, 8, 8, 10), strict=True)
            )
        )
    print(f"{'method':16s} {'CPU p10':>9s} {'median':>8s} {'p90':>8s}  (ms)")
    for kind, q in row["rank_cpu"].items():
        print(
            f"{kind:16s} {q['p10_s'] * 1e3:9.1f} {q['median_s'] * 1e3:8.1f} {q['p90_s'] * 1e3:8.1f}"
        )
    print(f"wrote {OUT.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
