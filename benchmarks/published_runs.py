"""Benchmark: the simulator against published step times of real RL runs (NeMo RL).

NVIDIA NeMo RL publishes a performance summary per release (GRPO on DGX-H100,
Megatron-core training, vLLM generation, BF16): model, GPUs, rollout and
training batch, sequence lengths, generation and training parallelism, step
time and tokens/s/GPU. This script expresses each dense-model row that
placeflow can express as a plan (`examples/published/`, written by this
script from the row), simulates it with the shipped `h100-sxm` profile and
compares the step time. Nothing here is fitted to the published times: the
plan is the recipe's configuration, the profile is the measured H100 kernels.

Configuration taken from the recipes (`grpo-llama3.1-8b-instruct-2n8g.yaml`
and its async variant): 64 prompts x 32 generations (G-GBS 2048), training
global batch 512 (4 optimizer steps per step), train micro-batch 1 with
activation checkpointing, logprob micro-batch 2, a reference model (KL
penalty), vLLM TP 1 generation colocated (on-policy) or on its own node
(1-step off, 8 + 8 GPUs), maximum 4,096 tokens.

What placeflow cannot express, and how it is approximated (listed per row in
the results): the prompt length distribution (a fixed 128-token prompt is
assumed; OpenMathInstruct-2 problems are short); the response length
distribution (lognormal, sigma 0.6, with the median chosen so that prompt +
mean response equals the row's published average sequence length);
sequence packing and dynamic batching; Megatron's precision-aware optimizer
and fp32-logit deferral; vLLM's prefix caching and chunked prefill; the
published tokens/s/GPU averages 5 steps (the page says it does not exactly
match its own formula), so the step time is the figure compared. MoE rows
(DeepSeek V3, Qwen3-235B, Qwen3-30B-A3B) need expert parallelism, which
placeflow does not model, and are left out; GB200 rows have no profile.

    python benchmarks/published_runs.py
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from placeflow.plan import load_plan, plan_from_dict, save_plan
from placeflow.simulator import simulate
from placeflow.simulator.lengths import LengthModel
from placeflow.simulator.simulate import cost_models_for
from placeflow.workload import BatchSpec

ROOT = Path(__file__).resolve().parents[1]
OUT_DIR = ROOT / "examples" / "published"
RESULTS = ROOT / "benchmarks" / "results" / "published_runs.json"
SUMMARY_V04 = (
    "https://github.com/NVIDIA-NeMo/RL/blob/r0.4.0/docs/about/performance-summary.md "
    "(Nemo RL v0.4, GRPO, DGX-H100, BF16)"
)
SUMMARY_V05 = (
    "https://docs.nvidia.com/nemo/rl/0.5.0/about/performance-summary.html "
    "(Nemo RL v0.5, H100 BF16 Benchmarks)"
)
RECIPE = (
    "https://github.com/NVIDIA-NeMo/RL/blob/main/examples/configs/recipes/llm/performance/"
    "grpo-llama3.1-8b-instruct-2n8g.yaml (+ async-grpo-llama3.1-8b-instruct-2n8g.yaml)"
)
PROMPT_LEN = 128
MAX_SEQ = 4096
SIGMA = 0.6


@dataclass(frozen=True, kw_only=True)
class PublishedRun:
    """One row of a published table (figures as printed) and its source."""

    name: str
    source: str
    model: str
    off_policy: bool
    num_gpus: int
    avg_seq_len: int  # G-Average Seq len: prompt + response, mean over the rollouts
    train_pp: int
    tokens_per_s_per_gpu: float
    step_s: float


RUNS = (
    PublishedRun(name="nemo-rl-v0.4-llama3.1-8b-on", source=SUMMARY_V04, model="llama-3.1-8b",
                 off_policy=False, num_gpus=16, avg_seq_len=1060, train_pp=2,
                 tokens_per_s_per_gpu=1562, step_s=97.7),
    PublishedRun(name="nemo-rl-v0.4-llama3.1-8b-1off", source=SUMMARY_V04, model="llama-3.1-8b",
                 off_policy=True, num_gpus=16, avg_seq_len=1129, train_pp=2,
                 tokens_per_s_per_gpu=2161, step_s=74.6),
    PublishedRun(name="nemo-rl-v0.5-llama3.1-8b-on", source=SUMMARY_V05, model="llama-3.1-8b",
                 off_policy=False, num_gpus=16, avg_seq_len=1019, train_pp=2,
                 tokens_per_s_per_gpu=1581, step_s=92.8),
    PublishedRun(name="nemo-rl-v0.5-llama3.1-8b-1off", source=SUMMARY_V05, model="llama-3.1-8b",
                 off_policy=True, num_gpus=16, avg_seq_len=1123, train_pp=1,
                 tokens_per_s_per_gpu=2478, step_s=64.8),
)  # fmt: skip


def response_median(avg_seq_len: int) -> int:
    """The lognormal median whose truncated mean response gives `avg_seq_len` in all."""
    target = avg_seq_len - PROMPT_LEN
    response_len = MAX_SEQ - PROMPT_LEN

    def mean(median: int) -> float:
        return LengthModel.of(
            BatchSpec(prompts_per_step=1, prompt_len=PROMPT_LEN, response_len=response_len,
                      response_len_dist="lognormal", response_len_median=median,
                      response_len_sigma=SIGMA)
        ).mean  # fmt: skip

    lo, hi = 1, response_len
    while lo < hi:  # mean grows with the median
        mid = (lo + hi) // 2
        lo, hi = (mid + 1, hi) if mean(mid) < target else (lo, mid)
    return lo


def plan_dict(run: PublishedRun) -> dict[str, Any]:
    workload = {
        "name": run.name,
        "algorithm": "grpo",
        "rollout_engine": "vllm",
        "reward_function": "arith",  # rule-based: the math verifier costs no GPU time
        "async_one_step_off": run.off_policy,
        "models": {"actor": run.model, "ref": run.model},
        "batch": {
            "prompts_per_step": 64,
            "samples_per_prompt": 32,
            "prompt_len": PROMPT_LEN,
            "response_len": MAX_SEQ - PROMPT_LEN,
            "mini_batches": 2048 // 512,
            "response_len_dist": "lognormal",
            "response_len_median": response_median(run.avg_seq_len),
            "response_len_sigma": SIGMA,
        },
    }
    train_gpus = run.num_gpus // 2 if run.off_policy else run.num_gpus
    actor = {"p": run.train_pp, "d": train_gpus // run.train_pp, "micro_batch": 1, "zero": 1,
             "recompute": True, "tg": 1}  # fmt: skip
    ref = {"p": run.train_pp, "d": train_gpus // run.train_pp, "micro_batch": 2}
    sets: list[dict[str, Any]] = [
        {"roles": ["actor", "ref"], "pool": "h100", "first_device": 0, "num_devices": train_gpus}
    ]
    if run.off_policy:
        sets.append(
            {"roles": ["actor"], "pool": "h100", "first_device": train_gpus,
             "num_devices": run.num_gpus - train_gpus, "generator": True}
        )  # fmt: skip
    return {
        "name": run.name,
        "workload": workload,
        "cluster": "../clusters/h100x16.toml",
        "sets": sets,
        "parallelism": {"actor": actor, "ref": ref},
    }


def main() -> None:
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    rows = []
    for run in RUNS:
        path = OUT_DIR / f"{run.name}.toml"
        save_plan(plan_from_dict(plan_dict(run), run.name, OUT_DIR), path)
        plan = load_plan(path)
        est = simulate(plan, cost_models_for(plan, "h100-sxm"))
        tokens = 2048 * run.avg_seq_len
        phases = est.phase_totals_s()
        rows.append(
            {
                "name": run.name,
                "source": run.source,
                "plan": str(path.relative_to(ROOT)),
                "published_step_s": run.step_s,
                "simulated_step_s": est.iteration_s,
                "step_rel_error": (est.iteration_s - run.step_s) / run.step_s,
                "published_tokens_per_s_per_gpu": run.tokens_per_s_per_gpu,
                "simulated_tokens_per_s_per_gpu": tokens / est.iteration_s / run.num_gpus,
                "simulated_phases_s": phases,
                "feasible": est.feasible,
                "infeasible_reason": est.infeasible_reason,
            }
        )
        print(f"{run.name}: published {run.step_s} s, simulated {est.iteration_s:.1f} s",
              file=sys.stderr)  # fmt: skip
    errors = sorted(abs(r["step_rel_error"]) for r in rows)
    report = {
        "command": "python benchmarks/published_runs.py",
        "date": time.strftime("%Y-%m-%d"),
        "profile": "h100-sxm",
        "recipe": RECIPE,
        "assumptions": __doc__.split("What placeflow cannot express")[1].split("    python")[0],
        "median_abs_step_error": errors[len(errors) // 2],
        "rows": rows,
    }
    RESULTS.write_text(json.dumps(report, indent=1, default=str) + "\n")
    print("| run | published step s | simulated step s | error | published tok/s/GPU "
          "| simulated tok/s/GPU | generate s | actor_update s |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        ph = r["simulated_phases_s"]
        print(
            f"| {r['name']} | {r['published_step_s']} | {r['simulated_step_s']:.1f} | "
            f"{r['step_rel_error']:+.0%} | {r['published_tokens_per_s_per_gpu']:,} | "
            f"{r['simulated_tokens_per_s_per_gpu']:,.0f} | {ph.get('generate', 0):.1f} | "
            f"{ph.get('actor_update', 0):.1f} |"
        )


if __name__ == "__main__":
    main()
