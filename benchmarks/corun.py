"""Benchmark: how much slower an op runs on one core while every other core runs it too.

A CPU plan's ranks share more than cores: ranks on cores of their own still share
the last-level cache and the memory bus (and, on a VM, whatever the hypervisor
shares). The profile times every kernel with the rest of the host idle, and its
`shared_compute` curve (`placeflow.profiles.shared_cores`) measures what busy
ranks cost one another with one workload, the engine's forward of the reference
model at a CPU micro-batch. The fidelity benchmark finds calls of two ranks on
two cores 20-30 % slower in a run than the simulator says where that curve is
flat. This script asks whether the cost depends on the op: per op below, one
process per core (one torch thread each, spawned once and kept, as a run's
workers are) runs the op in a loop for `--window` seconds, first process 0
alone, then all of them at once, then process 0 alone again; a round's ratio is
the two alone windows' mean rate over the slowest process's rate in the shared
window. Rounds alternate so that the host's own drift (this VM's speed moves by
10-30 % over minutes) falls on both sides of each ratio.

Ops: `gemm256` (a 256x256x256 matmul, compute-bound, operands in L2);
`gemm64` (64x64x64: the dispatcher's overhead more than the flops); `add_l2`
(a 64 KiB add, in L2); `add_l3` (4 MiB fp32 inputs into a preallocated output:
12 MiB, within the last-level cache); `add_dram` (32 MiB inputs, out of every
cache); `add_alloc` (the 4 MiB add with its output allocated per call, as model
code does and as the profile's elementwise entries are timed); `ref_forward` and
`ref_train` (the reference model's forward at `SHARED_COMPUTE_SHAPE`, the
`shared_compute` probe's workload, and a training step of it: forward, backward
and an AdamW step).

    python benchmarks/corun.py [--rounds 10] [--window 1.0] [--ops ...]

Writes benchmarks/results/corun_cpu.json (the command, the date, the host and the
load, per op the median ratio, its quartiles and every round's).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path

OPS = (
    "gemm256",
    "gemm64",
    "add_l2",
    "add_l3",
    "add_dram",
    "add_alloc",
    "ref_forward",
    "ref_train",
)
ROOT = Path(__file__).resolve().parents[1]


def make_op(name: str) -> Callable[[], object]:
    """The op `name` (module docstring) ready to call, on one torch thread."""
    import torch

    torch.set_num_threads(1)
    if name.startswith("gemm"):
        n = int(name[4:])
        a, b, c = torch.randn(n, n), torch.randn(n, n), torch.empty(n, n)
        return lambda: torch.matmul(a, b, out=c)
    if name.startswith("add"):
        numel = {"add_l2": 1 << 14, "add_l3": 1 << 20, "add_dram": 1 << 23, "add_alloc": 1 << 20}
        x, y = torch.randn(numel[name]), torch.randn(numel[name])
        if name == "add_alloc":
            return lambda: x + y
        out = torch.empty_like(x)
        return lambda: torch.add(x, y, out=out)
    from placeflow.profiles.shared_cores import reference_model

    model, forward = reference_model(0)
    if name == "ref_forward":

        def forward_no_grad() -> None:
            with torch.no_grad():
                forward()

        return forward_no_grad
    if name != "ref_train":
        raise SystemExit(f"corun: unknown op {name!r}; known: {', '.join(OPS)}")
    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:
        p.grad = torch.zeros_like(p)
    optimizer = torch.optim.AdamW(params, lr=1e-4)

    def step() -> None:
        forward().float().sum().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=False)

    return step


def worker(conn: Connection) -> None:
    """A process of the benchmark: builds the op it is sent, then runs it for the
    windows it is sent, answering each with its rate (calls per second)."""
    op: Callable[[], object] | None = None
    while True:
        msg = conn.recv()
        if msg[0] == "op":
            op = make_op(msg[1])
            for _ in range(5):  # warm-up
                op()
            conn.send("ready")
        elif msg[0] == "run":
            assert op is not None
            calls, start = 0, time.perf_counter()
            while (now := time.perf_counter()) - start < msg[1]:
                op()
                calls += 1
            conn.send(calls / (now - start))
        else:
            return


def window(conns: list[Connection], seconds: float) -> list[float]:
    for c in conns:
        c.send(("run", seconds))
    return [c.recv() for c in conns]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--window", type=float, default=1.0, help="seconds per window")
    parser.add_argument("--ops", nargs="+", choices=OPS, default=list(OPS))
    args = parser.parse_args()
    cores = os.cpu_count() or 1
    if cores < 2:
        raise SystemExit("corun: this host has one core; there is nothing to share")
    ctx = mp.get_context("spawn")
    pipes = [ctx.Pipe() for _ in range(cores)]
    procs = [ctx.Process(target=worker, args=(child,), daemon=True) for _, child in pipes]
    for p in procs:
        p.start()
    conns = [parent for parent, _ in pipes]
    load_before = os.getloadavg()[0]
    rows = {}
    try:
        for name in args.ops:
            for c in conns:
                c.send(("op", name))
            for c in conns:
                c.recv()
            ratios = []
            for _ in range(args.rounds):
                before = window(conns[:1], args.window)[0]
                shared = min(window(conns, args.window))
                after = window(conns[:1], args.window)[0]
                ratios.append((before + after) / 2 / shared)
            q1, med, q3 = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else ratios * 3
            rows[name] = {
                "median_ratio": med,
                "quartiles": [q1, q3],
                "rounds": ratios,
            }
            print(
                f"{name:12s} slowest of {cores} over alone: x{med:.2f} "
                f"(quartiles {q1:.2f}-{q3:.2f}, {args.rounds} rounds)",
                flush=True,
            )
    finally:
        for c in conns:
            c.send(("stop",))
        for p in procs:
            p.join(timeout=10)
    import torch

    report = {
        "command": "python " + " ".join(["benchmarks/corun.py", *sys.argv[1:]]),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "cpu_count": cores,
        "torch": torch.__version__,
        "load_1min_before": load_before,
        "load_1min_after": os.getloadavg()[0],
        "window_s": args.window,
        "ops": rows,
    }
    out = ROOT / "benchmarks/results/corun_cpu.json"
    out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
