"""Benchmark: does a gloo send wait for its receiver? (a pipeline stage's send)

Two processes on this host, one gloo group. Each trial starts both ranks together
(a barrier); rank 1 then keeps its core busy for `late` ms before it posts its
receive, while rank 0 sends at once, as `executor/engines/pipeline.py` does
(`batch_isend_irecv`, then `wait` on every request). Rank 0 times its send from
the post to the end of its wait. A send that returned once its bytes left the
process would take about the back-to-back time whatever the lateness; one that
waits for the receive takes the lateness on top.

The simulator prices a pipeline's stage send after the stage's compute with the
`paired_collective` floor as it does a collective (`CostModel._paired_floor_s`)
because of what this shows: the sender blocks until its partner arrives.

    python benchmarks/p2p_rendezvous.py [--trials 20]

writes benchmarks/results/p2p_rendezvous.json (the command, the date, and per size
and lateness the median and p90 of the sender's time).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from placeflow.procs import free_port, join_gloo_world, report_rank, run_ranks

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results" / "p2p_rendezvous.json"
SIZES = (1024, 90_112, 1 << 20)  # bytes: a scalar-sized send, a tiny stage's, 1 MiB
LATE_MS = (0.0, 2.0, 5.0)  # how long the receiver computes before it posts its receive


def _busy(ms: float) -> None:
    end = time.perf_counter() + ms / 1e3
    while time.perf_counter() < end:
        pass


class ProbeError(RuntimeError):
    """A rank of the probe failed, died or hung (`placeflow.procs.run_ranks`)."""


def _rank(rank: int, job: tuple[int, int], results: Any) -> None:
    """One rank of the probe; rank 0 reports ("rows", rows) before it is done."""
    port, trials = job

    def body() -> None:
        join_gloo_world(rank, 2, port)
        rows = []
        for num_bytes in SIZES:
            buf = torch.ones(num_bytes // 4)
            for late in LATE_MS:
                times = []
                for _ in range(trials + 1):  # the first is a warm-up
                    dist.barrier()
                    if rank == 0:
                        t0 = time.perf_counter()
                        for req in dist.batch_isend_irecv([dist.P2POp(dist.isend, buf, 1)]):
                            req.wait()
                        times.append(time.perf_counter() - t0)
                    else:
                        _busy(late)
                        got = torch.empty_like(buf)
                        for req in dist.batch_isend_irecv([dist.P2POp(dist.irecv, got, 0)]):
                            req.wait()
                if rank == 0:
                    times = sorted(times[1:])
                    rows.append(
                        {
                            "num_bytes": num_bytes,
                            "receiver_late_ms": late,
                            "send_median_ms": statistics.median(times) * 1e3,
                            "send_p90_ms": times[int(0.9 * (len(times) - 1))] * 1e3,
                        }
                    )
        if rank == 0:
            results.put(("rows", rows))
        dist.barrier()
        dist.destroy_process_group()

    report_rank(rank, results, body)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=20)
    args = parser.parse_args(argv)
    got: list[list[dict[str, Any]]] = []
    try:
        run_ranks(
            _rank,
            (free_port(), args.trials),
            2,
            label="p2p rendezvous probe",
            error=ProbeError,
            on_message=lambda msg: got.append(msg[1]),
            stall_timeout_s=120.0,
        )
    except ProbeError as e:
        sys.exit(str(e))
    rows = got[0]
    result = {
        "command": "python benchmarks/p2p_rendezvous.py" + "".join(f" {a}" for a in (argv or [])),
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "trials": args.trials,
        "rows": rows,
    }
    OUT.write_text(json.dumps(result, indent=2) + "\n")
    print(f"{'bytes':>9s} {'late':>6s} {'send median':>12s} {'p90':>8s}  (ms)")
    for r in rows:
        print(
            f"{r['num_bytes']:9d} {r['receiver_late_ms']:6.1f} "
            f"{r['send_median_ms']:12.2f} {r['send_p90_ms']:8.2f}"
        )
    print(f"wrote {OUT.relative_to(ROOT)}")


if __name__ == "__main__":
    main(sys.argv[1:])
