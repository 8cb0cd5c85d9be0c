"""Benchmark: how much a crowded CPU host slows the driver's own work (its launches of
a call's Ray actor calls), against what the simulator's schedule charges it.

On a CPU pool the controller's driver shares the head node's cores with the ranks it
calls (`simulator.schedule`: processor sharing). A model call's ranks are slowed by a
crowd as the profile's measured slicing curve says (`CostModel.slicing`: the slowest of
W ranks running the reference forward, cache refills and all). The driver is one
thread pickling small objects; this script measures what a crowd does to it: the
driver launches a call to `--ranks` idle Ray actors (`.remote()` with a payload of
five small tensors, as a forward call's shard carries, timed until the launches
return) while W = 0 ... 2 x cores other actors run GEMMs, and records the launches'
median wall time and the driver process's CPU time over them. Beside each W it puts
the stretch over W = 0 that the plain share of a core gives, max(1, (W + 1) / c), and
the one the ranks' curve gives, S((W + 1) / c) / S(1 / c), with the shipped `cpu`
profile's curve.

    python benchmarks/driver_share.py [--ranks 4] [--samples 60]

Writes benchmarks/results/driver_share.json (with the command, date and host).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import ray
import torch

from placeflow.executor.worker import WORKER_RUNTIME_ENV
from placeflow.profiles.costmodel import CostModel, sliced
from placeflow.profiles.registry import load_profile

RESULTS = Path(__file__).parent / "results" / "driver_share.json"
PAYLOAD_TENSORS = 5
PAYLOAD_ELEMENTS = 64  # int64: 512 bytes a tensor, a tiny forward shard's size


class _Rank:
    """A called rank (does nothing) or a crowding one (runs GEMMs for a while)."""

    def take(self, payload: Any) -> int:
        return 0

    def spin(self, seconds: float) -> int:
        a = torch.randn(256, 256)
        end = time.perf_counter() + seconds
        n = 0
        while time.perf_counter() < end:
            a @ a
            n += 1
        return n


def _launches(called: list[Any], samples: int) -> tuple[float, float]:
    """Median wall and CPU seconds of the driver's launches of one call to `called`."""
    payload = {
        f"t{i}": torch.zeros(PAYLOAD_ELEMENTS, dtype=torch.int64) for i in range(PAYLOAD_TENSORS)
    }
    wall, cpu = [], []
    for _ in range(samples):
        time.sleep(0.005)  # as between a step's calls: the driver wakes to launch
        c0, t0 = time.process_time(), time.perf_counter()
        refs = [w.take.remote(payload) for w in called]
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
        ray.get(refs)
    return statistics.median(wall), statistics.median(cpu)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", type=int, default=4, help="ranks one call is sent to")
    parser.add_argument("--samples", type=int, default=60, help="launches timed per crowd")
    args = parser.parse_args(argv)
    cores = os.cpu_count() or 1
    curve = CostModel.fit(load_profile("cpu")).slicing()
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        actor = ray.remote(num_cpus=0, runtime_env=WORKER_RUNTIME_ENV)(_Rank)
        called = [actor.remote() for _ in range(args.ranks)]
        crowd = [actor.remote() for _ in range(2 * cores)]
        ray.get([w.take.remote(None) for w in called + crowd])
        _launches(called, 10)  # warm-up
        rows: list[dict[str, float]] = []
        for busy in range(2 * cores + 1):
            # Long enough for the samples; the crowd is stopped by its end, then waited for.
            spinning = [w.spin.remote(args.samples * 0.05) for w in crowd[:busy]]
            time.sleep(0.3)  # every crowding rank running
            wall, cpu = _launches(called, args.samples)
            ray.get(spinning)
            rows.append({"busy_ranks": busy, "wall_s": wall, "cpu_s": cpu})
        alone = rows[0]["wall_s"]
        for row in rows:
            x = (row["busy_ranks"] + 1) / cores
            row["measured_stretch"] = row["wall_s"] / alone
            row["share_stretch"] = max(1.0, x) / max(1.0, 1 / cores)
            row["curve_stretch"] = sliced(x, curve) / sliced(1 / cores, curve)
            print(
                f"{row['busy_ranks']} busy ranks: launch {row['wall_s'] * 1e3:.2f} ms "
                f"(cpu {row['cpu_s'] * 1e3:.2f} ms), x{row['measured_stretch']:.2f}; "
                f"share x{row['share_stretch']:.2f}, curve x{row['curve_stretch']:.2f}"
            )
    finally:
        ray.shutdown()
    out = {
        "command": "python benchmarks/driver_share.py " + " ".join(argv or sys.argv[1:]),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "host": {"cpu_count": cores, "platform": platform.platform()},
        "torch": torch.__version__,
        "ranks": args.ranks,
        "samples": args.samples,
        "slicing_curve": [list(p) for p in curve],
        "rows": rows,
    }
    RESULTS.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {RESULTS}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
