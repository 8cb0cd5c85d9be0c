"""Benchmark: train -> generation resharding, planned vs naive, colocated and disjoint.

HybridFlow-style transitions scaled down to 8 CPU processes (gloo over
127.0.0.1) and a small Llama-shaped model (fp32, fused qkv and gate_up). For
each configuration both methods run once untimed, then `--repeats` times; a repeat's time is its
slowest rank's, and the row keeps the median. Bytes are what one rank receives
(the maximum over ranks), next to HybridFlow's formula on the TP/PP-sharded
weights; peak extra is the most transfer-side memory one rank held at once
(generation weights plus live buffers). On a 2-core machine 8 ranks share the
cores, so wall times show the ratio between methods, not link speed.

Disjoint sets (trainer ranks 0..3, generator ranks 4..7, `--bucket-mb`): the
planned sync sends each generator rank only its generation shard, in buckets;
the naive one (verl's) assembles every full tensor on trainer rank 0 and
sends it whole to every generator rank. Bytes are what one generator rank
receives; peak extra is its shard plus live buffers. Writes
benchmarks/results/reshard_bench.json.

    python benchmarks/reshard_bench.py [--repeats 5] [--bucket-mb 4]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import sys
import time
from pathlib import Path

import torch
from reshard_worlds import Method, ReshardJob, SyncJob, run_sync, run_world

from placeflow.layout import (
    GenLayout,
    TrainLayout,
    colocated_transfer_bytes_per_rank,
    disjoint_transfer_bytes_per_gen_rank,
)
from placeflow.procs import free_port
from placeflow.reshard_plan import GeneratorLayout, TinyLlama

ROOT = Path(__file__).resolve().parents[1]
MODEL = TinyLlama(num_layers=8, hidden=512, num_heads=16, num_kv_heads=8, ffn=1536, vocab=4096)
WORLD_SIZE = 8
CASES = (
    GenLayout(train=TrainLayout(p=1, t=8, d=1), tg=2, pg=1),
    GenLayout(train=TrainLayout(p=1, t=8, d=1), tg=4, pg=1),
    GenLayout(train=TrainLayout(p=2, t=4, d=1), tg=2, pg=1),
    GenLayout(train=TrainLayout(p=1, t=4, d=2), tg=2, pg=1),
)

DISJOINT_TRAIN = TrainLayout(p=1, t=4, d=1)
DISJOINT_GENS = (
    GeneratorLayout(tg=2, replicas=2),
    GeneratorLayout(tg=4),
    GeneratorLayout(tg=1, replicas=4),
)


def disjoint_rows(results: list, repeats: int) -> list[dict[str, object]]:
    out = []
    sharded_bytes = MODEL.total_bytes(sharded_only=True)
    num_train = DISJOINT_TRAIN.world_size
    for case, gen in enumerate(DISJOINT_GENS):
        for method in Method:
            mine = [
                r for r in results if r.case == case and r.method is method and r.rank >= num_train
            ]
            out.append(
                {
                    "train": "p1-t4-d1 (ranks 0-3)",
                    "gen": f"pg{gen.pg}-tg{gen.tg} x{gen.replicas} (ranks 4-{3 + gen.world_size})",
                    "method": method.value,
                    "received_bytes_per_gen_rank": max(r.moved_bytes for r in mine),
                    "formula_sharded_bytes_per_gen_rank": disjoint_transfer_bytes_per_gen_rank(
                        sharded_bytes, gen.tg, gen.pg
                    ),
                    "peak_extra_bytes_per_gen_rank": max(r.peak_extra_bytes for r in mine),
                    "wall_s": round(max(r.wall_s for r in mine), 4),
                    "repeats": repeats,
                }
            )
    return out


def rows(results: list, repeats: int) -> list[dict[str, object]]:
    """One row per (case, method): the worst rank's bytes and memory, the slowest repeat time."""
    out = []
    sharded_bytes = MODEL.total_bytes(sharded_only=True)
    for case, gen in enumerate(CASES):
        for method in Method:
            mine = [r for r in results if r.case == case and r.method is method]
            tr = gen.train
            out.append(
                {
                    "train": f"p{tr.p}-t{tr.t}-d{tr.d}",
                    "gen": f"pg{gen.pg}-tg{gen.tg}",
                    "method": method.value,
                    "received_bytes_per_rank": max(r.moved_bytes for r in mine),
                    "formula_bytes_per_rank": colocated_transfer_bytes_per_rank(sharded_bytes, gen),
                    "peak_extra_bytes_per_rank": max(r.peak_extra_bytes for r in mine),
                    "wall_s": round(max(r.wall_s for r in mine), 4),
                    "repeats": repeats,
                }
            )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--bucket-mb", type=float, default=4.0)
    args = parser.parse_args()
    job = ReshardJob(
        model=MODEL,
        cases=CASES,
        methods=tuple(Method),
        world_size=WORLD_SIZE,
        port=free_port(),
        repeats=args.repeats,
        warmup=1,
    )
    t0 = time.perf_counter()
    results = run_world(job, stall_timeout_s=300.0)
    bucket = int(args.bucket_mb * 2**20)
    sync = SyncJob(
        model=MODEL,
        train=DISJOINT_TRAIN,
        gens=DISJOINT_GENS,
        methods=tuple(Method),
        bucket_bytes=bucket,
        port=free_port(),
        repeats=args.repeats,
        warmup=1,
    )
    sync_results = run_sync(sync, stall_timeout_s=300.0)
    report = {
        "command": "python " + " ".join(["benchmarks/reshard_bench.py", *sys.argv[1:]]),
        "model": dataclasses.asdict(MODEL),
        "model_bytes": MODEL.total_bytes(),
        "sharded_model_bytes": MODEL.total_bytes(sharded_only=True),
        "world_size": WORLD_SIZE,
        "backend": "gloo (CPU, one torch thread per rank)",
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%d"),
        "total_s": round(time.perf_counter() - t0, 1),
        "rows": rows(results, args.repeats),
        "disjoint_bucket_bytes": bucket,
        "disjoint_rows": disjoint_rows(sync_results, args.repeats),
    }
    path = ROOT / "benchmarks/results/reshard_bench.json"
    path.write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
