"""Benchmark: the hand-over between two calls queued on the same Ray actor ranks.

The executor launches every forward call of a step at once (`RLLoop._forwards`), so
the second call on a device set waits in its ranks' Ray queues behind the first. A
per-rank timeline of the Safe-RLHF split plan (README, "Simulator fidelity on this
CPU", thirty-second round) shows each rank starting the queued call 6-11 ms after it
ended the first, where the simulator starts it as the first ends. This script
measures that hand-over as the executor meets it. It starts two pairs of Ray actor
ranks as the executor's workers are (`profiles.shared_cores.CallRank`: one torch
thread, a gloo world per pair, the reference model). The driver puts a Batch-sized
argument in the object store (five int64 tensors of 32 x 22, about what a forward call
of the Safe-RLHF plan carries) and launches two calls of `--forwards` reference forwards
on pair A back to back, then waits for both. Each rank stamps its calls' start and end
on the host's monotonic clock. The hand-over is the second call's start less the first
call's end on the same rank; the return is the moment the driver holds the first
call's results (its `ray.get` back) less that call's last rank's end. A round does
this with pair B idle and with pair B running a long call meanwhile (the other set's
forwards beside them), alternated.

    python benchmarks/queued_calls.py [--rounds 16] [--forwards 2 4]

Writes benchmarks/results/queued_calls.json (the command, the date, the load, and per
case and forwards the medians of the hand-over, of both calls' lengths and of the
return).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import ray
import torch

from placeflow.procs import free_port
from placeflow.profiles.shared_cores import CallRank, _ray_actors

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks/results/queued_calls.json"
PAYLOAD_SHAPE = (32, 22)
PAYLOAD_TENSORS = 5


class TimedRank(CallRank):
    """A `CallRank` whose call returns its own start and end (time.perf_counter)."""

    def timed(self, count: int, payload: Any = None) -> tuple[float, float]:
        t0 = time.perf_counter()
        self.forwards(count)
        return t0, time.perf_counter()


def _round(
    pair_a: list[Any], pair_b: list[Any], forwards: int, busy: bool, payload: Any
) -> list[tuple[float, float, float, float]]:
    """(hand-over, first call, second call, return) seconds on each rank of pair A; the
    return is the first call's results in the driver's hands (its `ray.get` back) less
    its last rank's end, the same for every rank of the round."""
    beside = [w.timed.remote(forwards * 6) for w in pair_b] if busy else []
    time.sleep(0.005)  # pair B computing before A's calls arrive
    ref = ray.put(payload)
    first = [w.timed.remote(forwards, ref) for w in pair_a]
    second = [w.timed.remote(forwards, ref) for w in pair_a]
    got_first = ray.get(first)
    seen = time.perf_counter()
    back = seen - max(e for _, e in got_first)
    out = []
    for (s1, e1), (s2, e2) in zip(got_first, ray.get(second), strict=True):
        out.append((s2 - e1, e1 - s1, e2 - s2, back))
    ray.get(beside)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=16)
    parser.add_argument("--forwards", type=int, nargs="+", default=[2, 4])
    args = parser.parse_args()
    if args.rounds < 1 or any(n < 1 for n in args.forwards):
        parser.error("--rounds and --forwards take counts of 1 or more")
    payload = {
        f"t{i}": torch.randint(0, 100, PAYLOAD_SHAPE, dtype=torch.int64)
        for i in range(PAYLOAD_TENSORS)
    }
    load_before = os.getloadavg()[0]
    samples: dict[tuple[str, int], list[tuple[float, float, float, float]]] = {}
    with _ray_actors(TimedRank) as (_, actor):
        port_a, port_b = free_port(), free_port()
        pair_a = [actor.remote(r, 2, port_a) for r in range(2)]
        pair_b = [actor.remote(r, 2, port_b) for r in range(2)]
        ray.get([w.timed.remote(2) for w in pair_a + pair_b])  # warm-up, worlds joined
        for _ in range(args.rounds):
            for n in args.forwards:
                for case in ("idle", "busy"):
                    got = _round(pair_a, pair_b, n, case == "busy", payload)
                    samples.setdefault((case, n), []).extend(got)
                    time.sleep(0.02)
    cases = {
        f"{case} {n} forwards": {
            "handover_s": statistics.median(s[0] for s in v),
            "first_call_s": statistics.median(s[1] for s in v),
            "second_call_s": statistics.median(s[2] for s in v),
            "return_s": statistics.median(s[3] for s in v),
            "samples": len(v),
        }
        for (case, n), v in sorted(samples.items())
    }
    report = {
        "command": "python " + " ".join(["benchmarks/queued_calls.py", *sys.argv[1:]]),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "cpu_count": os.cpu_count(),
        "load_1min_before": load_before,
        "load_1min_after": os.getloadavg()[0],
        "payload": {"tensors": PAYLOAD_TENSORS, "shape": list(PAYLOAD_SHAPE), "dtype": "int64"},
        "cases": cases,
    }
    OUT.write_text(json.dumps(report, indent=1) + "\n")
    print(f"{'case':24s} {'hand-over':>10s} {'first':>8s} {'second':>8s} {'return':>8s}  (ms)")
    for name, c in cases.items():
        print(
            f"{name:24s} {c['handover_s'] * 1e3:10.2f} {c['first_call_s'] * 1e3:8.1f} "
            f"{c['second_call_s'] * 1e3:8.1f} {c['return_s'] * 1e3:8.2f}"
        )
    print(f"wrote {OUT.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
