"""Dispatch demo: build an example plan's worker groups here and balance skewed samples.

    python examples/dispatch_demo.py                      # colocate and split cpu4 plans
    python examples/dispatch_demo.py --plan examples/plans/grpo-tiny-cpu4-split.toml

For each plan: starts the worker groups on a local Ray (one logical CPU worker
per device), makes a GRPO-shaped batch (prompts x samples) with log-normal
sequence lengths, and for every group splits it across the data-parallel
replicas twice: by position, and token-aware (Karmarkar-Karp on a·s + s², each
prompt's samples kept together, equal counts per rank). Each replica computes
its shard's work remotely (`DemoWorker.work`, a method this demo adds to the
production Worker); the table shows the work per DP rank as the result-holding
workers report it, and the imbalance (max / mean) of each split.
"""

from __future__ import annotations

import argparse
from enum import StrEnum
from pathlib import Path
from typing import Any

import numpy as np
import ray
import torch

from placeflow.executor.balance import (
    Partition,
    WorkModel,
    balanced_partition,
    positional_partition,
)
from placeflow.executor.batch import Batch
from placeflow.executor.controller import Controller
from placeflow.executor.dispatch import results_of_holders, split_by_dp
from placeflow.executor.groups import WorkerGroup
from placeflow.executor.pools import required_resources
from placeflow.executor.worker import Worker, worker_actor
from placeflow.plan import Plan, load_plan
from placeflow.workload import Role

PLANS = Path(__file__).resolve().parent / "plans"
DEFAULT_PLANS = [PLANS / "grpo-tiny-cpu4-colocate.toml", PLANS / "grpo-tiny-cpu4-split.toml"]


class DemoField(StrEnum):
    WORK = "work"  # `DemoWorker.work`'s answer: per sample, a·s + s²


class DemoWorker(Worker):
    def work(self, role: Role, batch: Batch, model: WorkModel) -> Batch:
        """Per-sample work a·s + s² of the shard this rank of `role` received."""
        work = torch.tensor(model.works(batch.seq_lens()), dtype=torch.float64)
        return Batch(tensors={DemoField.WORK: work}, meta=batch.meta)


class DemoController(Controller):
    actor_class: Any = worker_actor(DemoWorker)  # run as a script: Ray ships it by value


def skewed_batch(num_prompts: int, samples_per_prompt: int, seed: int) -> Batch:
    """Token ids of log-normal lengths (median 256, clipped to [16, 4096]), one group per prompt."""
    rng = np.random.default_rng(seed)
    n = num_prompts * samples_per_prompt
    lengths = np.clip(rng.lognormal(np.log(256), 1.0, n), 16, 4096).astype(int)
    return Batch.from_sequences(
        {"input_ids": [torch.randint(1, 256, (int(s),)) for s in lengths]},
        meta={"prompt_id": [i // samples_per_prompt for i in range(n)]},
    )


def dp_work(c: Controller, group: WorkerGroup, batch: Batch, p: Partition, w: WorkModel) -> list:
    """Each DP replica's total work, computed by its workers from the shard they received."""
    shards = split_by_dp(batch, group.dispatch, p)
    refs = [
        worker.work.remote(group.role, shard, w)
        for worker, shard in zip(group.workers, shards, strict=True)
    ]
    results = c.gather(group, refs, DemoWorker.work)
    return [
        float(r.tensors[DemoField.WORK].sum()) for r in results_of_holders(group.dispatch, results)
    ]


def report_group(c: Controller, group: WorkerGroup, batch: Batch, work: WorkModel) -> None:
    train = group.spec.layout.train
    works = work.works(batch.seq_lens())
    num_dp = group.dispatch.num_dp
    print(
        f"\n  group {group.label}: p{train.p} t{train.t} d{train.d} on set "
        f"#{group.spec.set_index + 1}, {num_dp} DP ranks, results from ranks "
        f"{list(group.dispatch.result_ranks)}; work a*s + s^2 with a = {work.linear_coeff:.0f}"
    )
    print("    split        " + "".join(f"{f'dp{r}: Mwork, n':>18}" for r in range(num_dp)))
    splits = {
        "positional": positional_partition(works, num_dp),
        "token-aware": balanced_partition(
            works, num_dp, equal_counts=True, groups=list(batch.meta["prompt_id"])
        ),
    }
    for name, p in splits.items():
        remote = dp_work(c, group, batch, p, work)
        assert np.allclose(remote, p.work)  # the workers saw the shards the partition planned
        cells = "".join(
            f"{f'{w / 1e6:.2f}, {n}':>18}" for w, n in zip(remote, p.counts, strict=True)
        )
        print(f"    {name:<13}{cells}   imbalance {p.imbalance:.3f}")


def run(plan: Plan, batch: Batch) -> None:
    with DemoController(plan, timeout_s=60.0) as c:
        sets = ", ".join(f"{s.label()} x{s.num_devices}" for s in plan.sets)
        print(f"\nplan {plan.name}: {sets}")
        for i, per_set in enumerate(c.identities):
            pids = [ident.pid for ident in per_set]
            print(f"  set #{i + 1}: one worker per device, pids {pids}")
        for group in c.groups:
            report_group(c, group, batch, WorkModel.for_model(plan.workload.models[group.role]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plan", type=Path, action="append", help="plan TOML (repeatable)")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--samples-per-prompt", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    plans = [load_plan(p) for p in args.plan or DEFAULT_PLANS]
    batch = skewed_batch(args.prompts, args.samples_per_prompt, args.seed)
    lens = sorted(batch.seq_lens())
    print(
        f"batch: {len(batch)} samples ({args.prompts} prompts x {args.samples_per_prompt}), "
        f"lengths min {lens[0]} median {lens[len(lens) // 2]} max {lens[-1]}"
    )
    num_cpus = max(int(required_resources(p).get("CPU", 0)) for p in plans)
    ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=False)
    try:
        for plan in plans:
            run(plan, batch)
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
