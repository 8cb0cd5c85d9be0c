"""Benchmark: the booking table, the fewest GPUs each model needs for GRPO.

verl's docs ship a hand-collected table of the minimum resources per model size
with every memory saver on ("Hardware Resource Needed for RL",
docs/perf/device_tuning.rst in volcengine/verl, updated 06/25/2025: full-parameter
GRPO MIN rows Qwen2-7B 2 x H800, Qwen2-14B 4 x H800, Qwen2-32B 8 x H20,
Qwen2-70B 32 x H20 and 32 x H800; its other rows are LoRA, which placeflow
does not model). This benchmark produces such a table with the planner:
`plan_search(objective=gpus)` with a throughput target of 1 token/s (so that
only memory decides) for Qwen2.5 0.5B..72B on H100-80GB and A100-80GB nodes of
8, with verl's published batch settings for that table (its
examples/tuning/14b/qwen2_14b_grpo_4_h800_fsdp_vllm.sh: 1024 prompts x 5
samples, prompt and response 1024 tokens, PPO mini-batch 256 prompts, so 4
mini-batches, one epoch, KL loss against a reference model). For each it
records the GPUs, the placement, the memory savers the plan needed
(recomputation, optimizer offload and where its step runs, ZeRO stage, a
generator set) and the simulator's tokens/s. Plans are booked against each
GPU's usable memory (capacity less the reserve of `placeflow.hardware`) with
vLLM's default KV budget (gpu_memory_utilization 0.9, max_num_seqs 256).
Writes benchmarks/results/booking_table.json.

`--device-step-only` searches without the host optimizer step (CPU AdamW),
which verl does not offer (its optimizer offload reloads the state to the GPU
for the update): it narrows the planner's saver list here, in the benchmark,
and writes benchmarks/results/booking_table_device_step.json.

    python benchmarks/booking_table.py [--models qwen2.5-0.5b,...] [--nodes 8]
        [--device-step-only]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

from placeflow.catalogue import CATALOGUE
from placeflow.cluster import ClusterSpec, PoolSpec
from placeflow.hardware import HARDWARE
from placeflow.plan import OptimizerStep
from placeflow.planner import Infeasible, Objective, plan_search, space
from placeflow.profiles.registry import fitted_cost_model
from placeflow.workload import (
    DEFAULT_GPU_MEMORY_UTILIZATION,
    DEFAULT_MAX_NUM_SEQS,
    Algorithm,
    BatchSpec,
    Role,
    Workload,
)

ROOT = Path(__file__).resolve().parents[1]
PROFILES = {"h100": "h100-sxm", "a100": "a100-80gb"}
VERL_BATCH = BatchSpec(
    prompts_per_step=1024,
    samples_per_prompt=5,
    prompt_len=1024,
    response_len=1024,
    ppo_epochs=1,
    mini_batches=4,
)


def _without_host_step() -> None:
    """Narrow the planner's memory savers to verl's: offload with the device step only."""
    savers = space._memory_savers

    def device_step_only(role, pool):  # type: ignore[no-untyped-def]
        return [s for s in savers(role, pool) if s[2] is not OptimizerStep.HOST]

    space._memory_savers = device_step_only  # type: ignore[assignment]


def run_one(gpu: str, model: str, num_nodes: int, time_limit_s: float) -> dict[str, object]:
    cluster = ClusterSpec(
        name=f"{gpu}x{8 * num_nodes}",
        pools=(
            PoolSpec(name=gpu, gpu=HARDWARE[PROFILES[gpu]], num_nodes=num_nodes, gpus_per_node=8),
        ),
    )
    wl = Workload(
        name=f"grpo-{model}",
        algorithm=Algorithm.GRPO,
        models={Role.ACTOR: CATALOGUE[model], Role.REF: CATALOGUE[model]},
        batch=VERL_BATCH,
        reward_function="arith",
    )
    costs = {PROFILES[gpu]: fitted_cost_model(PROFILES[gpu])}
    row: dict[str, object] = {
        "gpu": gpu,
        "model": model,
        "load_avg_1m": round(os.getloadavg()[0], 2),
    }
    t0, c0 = time.perf_counter(), time.process_time()
    try:
        result = plan_search(
            cluster,
            wl,
            costs,
            objective=Objective.GPUS,
            target_tokens_per_s=1.0,
            time_limit_s=time_limit_s,
        )
    except Infeasible as exc:
        row.update(status="infeasible", reason=str(exc), wall_s=time.perf_counter() - t0)
        return row
    plan = result.best.plan
    row.update(
        wall_s=round(time.perf_counter() - t0, 2),
        cpu_s=round(time.process_time() - c0, 2),
        status=result.status.value,
        min_gpus=plan.num_gpus,
        placement=result.best.kind.value,
        gpus_per_set=[s.num_devices for s in plan.sets],
        generator_gpus=result.best.generator_gpus,
        savers={
            role.value: {
                "p": par.train.p,
                "t": par.train.t,
                "d": par.train.d,
                "tg": par.tg,
                "zero": par.zero,
                "recompute": par.recompute,
                "offload_optimizer": par.offload_optimizer,
                "optimizer_step": par.optimizer_step.value,
                "offload_params": par.offload_params,
                "micro_batch": par.micro_batch,
            }
            for role, par in plan.parallelism.items()
        },
        tokens_per_s=round(result.best.estimate.tokens_per_s),
    )
    return row


def _load() -> dict[str, object]:
    """uptime's load averages and the busiest processes, for the record of a shared machine."""
    import subprocess

    top = subprocess.run(
        ["ps", "-eo", "pcpu,comm", "--sort=-pcpu"], capture_output=True, text=True, check=False
    ).stdout.splitlines()[1:6]
    return {"load_avg": [round(x, 2) for x in os.getloadavg()], "top_processes": top}


LOAD_BEFORE: dict[str, object] = {}


def main() -> None:
    LOAD_BEFORE.update(_load())
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--models",
        default="qwen2.5-0.5b,qwen2.5-1.5b,qwen2.5-7b,qwen2.5-14b,qwen2.5-32b,qwen2.5-72b",
    )
    parser.add_argument("--gpus", default="h100,a100")
    parser.add_argument("--nodes", type=int, default=8, help="nodes of 8 GPUs searched")
    parser.add_argument("--time-limit", type=float, default=60.0)
    parser.add_argument("--device-step-only", action="store_true")
    args = parser.parse_args()
    if args.device_step_only:
        _without_host_step()
    rows = []
    for gpu in args.gpus.split(","):
        for model in args.models.split(","):
            row = run_one(gpu, model, args.nodes, args.time_limit)
            print(json.dumps(row), flush=True)
            rows.append(row)
    name = "booking_table_device_step" if args.device_step_only else "booking_table"
    out = ROOT / f"benchmarks/results/{name}.json"
    out.write_text(
        json.dumps(
            {
                "command": "python " + " ".join(["benchmarks/booking_table.py", *sys.argv[1:]]),
                "workload": "GRPO, actor + reference, verl's batch settings (see the module doc)",
                "objective": "gpus, target 1 token/s (memory decides)",
                "optimizer_steps_searched": "device" if args.device_step_only else "device, host",
                "load_before": LOAD_BEFORE,
                "load_after": _load(),
                "memory": {
                    gpu: {
                        "memory_gib": HARDWARE[PROFILES[gpu]].memory_bytes / 2**30,
                        "reserve_gib": HARDWARE[PROFILES[gpu]].reserve_bytes / 2**30,
                        "reserve_source": HARDWARE[PROFILES[gpu]].reserve_source,
                    }
                    for gpu in args.gpus.split(",")
                },
                "gpu_memory_utilization": DEFAULT_GPU_MEMORY_UTILIZATION,
                "max_num_seqs": DEFAULT_MAX_NUM_SEQS,
                "verl_reference": "https://github.com/volcengine/verl/blob/main/docs/perf/device_tuning.rst",
                "python": sys.version.split()[0],
                "machine": f"{platform.machine()}, {os.cpu_count()} CPUs (shared)",
                "date": time.strftime("%Y-%m-%d"),
                "rows": rows,
            },
            indent=1,
        )
        + "\n"
    )


if __name__ == "__main__":
    main()
