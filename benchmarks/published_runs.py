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
match its own formula), so the step time is the figure compared; GB200 rows
have no measured profile and are left out.

MoE rows (v0.6, H100 BF16; recipes `grpo-qwen3-30ba3b-4n8g.yaml`,
`grpo-qwen3-235b-16n8g.yaml`, their `-async-1off` variants and
`grpo-deepseek-v3-32n8g.yaml`, read at tag v0.6.0): Qwen3-30B-A3B 64 x 32
rollouts, 4 optimizer steps of 512; Qwen3-235B 16 x 32 and DeepSeek-V3
32 x 16 rollouts, one optimizer step of 512; micro-batch 1 with recomputation;
a reference model with the actor's layout; 1-step-off rows put the generator
on its own half of the GPUs (`colocated.resources` in the recipes). Layout
approximations, per row in `RUNS` and the results: context parallelism is
ring cp (the Qwen3-235B on-policy row's CP 2); placeflow's expert TP equals t
and e is carved out of d·cp, so the published EP with expert TP 1 becomes the e that
gives each GPU the same expert bytes (E/(e·t) = E/EP_published); pipeline
stages split the layers evenly unless the first / last stage is given its own
count, as Megatron-core allows (Qwen3-235B has 94: PP 8 becomes 2 with t = 8;
DeepSeek-V3's 61 use NeMo RL's stages of 3, 14 x 4 and 2); generation TP stays
inside a node and must divide t, so vLLM TP 16 becomes tg 8 x pg 2 and
DeepSeek-V3's TP 32 becomes tg 8 x pg 4 (a generator set splits its 61 layers
as vLLM does, 15, 15, 16, 15; colocated generation stages gather whole
training stages); the colocated rows offload the actor's optimizer state during
generation (NeMo RL's `offload_before_refit` in
`nemo_rl/models/policy/workers/megatron_policy_worker.py` moves the
optimizer and gradient buffers to the host).

    python benchmarks/published_runs.py
"""

from __future__ import annotations

import json
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from placeflow.phases import Phase
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
SUMMARY_V06 = (
    "https://github.com/NVIDIA-NeMo/RL/blob/v0.6.0/docs/about/performance-summary.md "
    "(NeMo RL v0.6, H100 BF16 Benchmarks)"
)
SUMMARY_V05 = (
    "https://docs.nvidia.com/nemo/rl/0.5.0/about/performance-summary.html "
    "(Nemo RL v0.5, H100 BF16 Benchmarks)"
)
RECIPE = (
    "https://github.com/NVIDIA-NeMo/RL/blob/main/examples/configs/recipes/llm/performance/"
    "grpo-llama3.1-8b-instruct-2n8g.yaml (+ async-grpo-llama3.1-8b-instruct-2n8g.yaml)"
)
MOE_RECIPES = (
    "https://github.com/NVIDIA-NeMo/RL/tree/v0.6.0/examples/configs/recipes/llm/performance/ "
    "grpo-qwen3-30ba3b-4n8g.yaml, grpo-qwen3-30ba3b-4n8g-async-1off.yaml, "
    "grpo-qwen3-235b-16n8g.yaml, grpo-qwen3-235b-32n8g-async-1off.yaml, "
    "grpo-deepseek-v3-32n8g.yaml, grpo-deepseek-v3-64n8g-async-1off.yaml"
)
PROMPT_LEN = 128
MAX_SEQ = 4096
SIGMA = 0.6


@dataclass(frozen=True, kw_only=True)
class PublishedRun:
    """One row of a published table (figures as printed), its source, and the plan's layout.

    `actor` is the actor's parallelism in the plan (the reference model copies
    its training layout); `layout_note` says where it departs from the row.
    """

    name: str
    source: str
    model: str
    off_policy: bool
    num_gpus: int
    avg_seq_len: int  # G-Average Seq len: prompt + response, mean over the rollouts
    tokens_per_s_per_gpu: float
    step_s: float
    actor: dict[str, Any]
    published_layout: str = ""
    layout_note: str = ""
    prompts: int = 64
    samples: int = 32
    train_batch: int = 512
    max_seq: int = MAX_SEQ


def _dense(p: int, d: int) -> dict[str, Any]:
    return {"p": p, "d": d, "zero": 1, "tg": 1}


RUNS = (
    PublishedRun(name="nemo-rl-v0.4-llama3.1-8b-on", source=SUMMARY_V04, model="llama-3.1-8b",
                 off_policy=False, num_gpus=16, avg_seq_len=1060, actor=_dense(2, 8),
                 tokens_per_s_per_gpu=1562, step_s=97.7),
    PublishedRun(name="nemo-rl-v0.4-llama3.1-8b-1off", source=SUMMARY_V04, model="llama-3.1-8b",
                 off_policy=True, num_gpus=16, avg_seq_len=1129, actor=_dense(2, 4),
                 tokens_per_s_per_gpu=2161, step_s=74.6),
    PublishedRun(name="nemo-rl-v0.5-llama3.1-8b-on", source=SUMMARY_V05, model="llama-3.1-8b",
                 off_policy=False, num_gpus=16, avg_seq_len=1019, actor=_dense(2, 8),
                 tokens_per_s_per_gpu=1581, step_s=92.8),
    PublishedRun(name="nemo-rl-v0.5-llama3.1-8b-1off", source=SUMMARY_V05, model="llama-3.1-8b",
                 off_policy=True, num_gpus=16, avg_seq_len=1123, actor=_dense(1, 8),
                 tokens_per_s_per_gpu=2478, step_s=64.8),
    PublishedRun(name="nemo-rl-v0.6-qwen3-30b-a3b-on", source=SUMMARY_V06, model="qwen3-30b-a3b",
                 off_policy=False, num_gpus=32, avg_seq_len=3203,
                 tokens_per_s_per_gpu=1102, step_s=192, prompts=64, samples=32,
                 published_layout="G [TP 2, PP 1]; T [TP 1, CP 1, EP 8, PP 1]",
                 layout_note="t = 2 (generation tg = 2 must divide t), e = 4: 16 experts per "
                             "GPU as with EP 8 at expert TP 1",
                 actor={"p": 1, "t": 2, "d": 16, "e": 4, "zero": 1, "tg": 2,
                        "offload_optimizer": True}),
    PublishedRun(name="nemo-rl-v0.6-qwen3-30b-a3b-1off", source=SUMMARY_V06,
                 model="qwen3-30b-a3b", off_policy=True, num_gpus=32, avg_seq_len=3201,
                 tokens_per_s_per_gpu=1414, step_s=152, prompts=64, samples=32,
                 published_layout="G [TP 2, PP 1] on 16 GPUs; T [TP 1, CP 1, EP 8, PP 2] on 16",
                 layout_note="as published",
                 actor={"p": 2, "t": 1, "d": 8, "e": 8, "zero": 1, "tg": 2}),
    PublishedRun(name="nemo-rl-v0.6-qwen3-235b-a22b-on", source=SUMMARY_V06,
                 model="qwen3-235b-a22b", off_policy=False, num_gpus=128, avg_seq_len=5698,
                 tokens_per_s_per_gpu=58.9, step_s=395, prompts=16, samples=32, max_seq=8192,
                 published_layout="G [TP 16, PP 1]; T [TP 2, CP 2, EP 16, PP 8]",
                 layout_note="PP 8 must divide 94 layers: p = 2, t = 8, ring CP 2 as published, "
                             "d = 4, e = 2 (E/(e·t) = 8 experts per GPU as published); "
                             "generation tg 8 x pg 2",
                 actor={"p": 2, "t": 8, "cp": 2, "d": 4, "e": 2, "zero": 1, "tg": 8, "pg": 2,
                        "offload_optimizer": True}),
    PublishedRun(name="nemo-rl-v0.6-qwen3-235b-a22b-1off", source=SUMMARY_V06,
                 model="qwen3-235b-a22b", off_policy=True, num_gpus=256, avg_seq_len=5721,
                 tokens_per_s_per_gpu=58.7, step_s=231, prompts=16, samples=32, max_seq=8192,
                 published_layout="G [TP 8, PP 1] on 128 GPUs; T [TP 4, CP 1, EP 16, PP 8] on 128",
                 layout_note="PP 8 must divide 94 layers: p = 2, t = 8, d = 8, e = 8 (8 experts "
                             "per GPU as published); generation as published",
                 actor={"p": 2, "t": 8, "d": 8, "e": 8, "zero": 1, "tg": 8}),
    PublishedRun(name="nemo-rl-v0.6-deepseek-v3-on", source=SUMMARY_V06, model="deepseek-v3",
                 off_policy=False, num_gpus=256, avg_seq_len=701, tokens_per_s_per_gpu=12.1,
                 step_s=134, prompts=32, samples=16, max_seq=1536,
                 published_layout="G [TP 32, PP 1]; T [TP 1, CP 1, EP 16, PP 16]",
                 layout_note="PP 16 with NeMo RL's uneven stages (3, 14 x 4, 2 layers); "
                             "t = 8, d = 2, e = 2 (16 experts per GPU as with EP 16 at "
                             "expert TP 1) so that generation can reuse training shards: "
                             "vLLM TP 32 becomes tg 8 x pg 4 (stages of 15, 16, 16, 14 "
                             "layers: four training stages each)",
                 actor={"p": 16, "t": 8, "d": 2, "e": 2, "first_stage_layers": 3,
                        "last_stage_layers": 2, "zero": 1, "tg": 8, "pg": 4,
                        "offload_optimizer": True}),
    PublishedRun(name="nemo-rl-v0.6-deepseek-v3-1off", source=SUMMARY_V06, model="deepseek-v3",
                 off_policy=True, num_gpus=512, avg_seq_len=710, tokens_per_s_per_gpu=12.8,
                 step_s=64.1, prompts=32, samples=16, max_seq=1536,
                 published_layout="G [TP 32, PP 1] on 256 GPUs; T [TP 1, EP 16, PP 16] on 256",
                 layout_note="training as published (PP 16 with stages of 3, 14 x 4 and 2 "
                             "layers); generation TP 32 spans 4 nodes, which placeflow's "
                             "generation TP (inside a node) cannot: tg 8 x pg 4, vLLM's own "
                             "split of 61 layers (15, 15, 16, 15)",
                 actor={"p": 16, "t": 1, "d": 16, "e": 16, "first_stage_layers": 3,
                        "last_stage_layers": 2, "zero": 1, "tg": 8, "pg": 4}),
)  # fmt: skip


def response_median(avg_seq_len: int, max_seq: int = MAX_SEQ) -> int:
    """The lognormal median whose truncated mean response gives `avg_seq_len` in all."""
    target = avg_seq_len - PROMPT_LEN
    response_len = max_seq - PROMPT_LEN

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
    rollouts = run.prompts * run.samples
    workload = {
        "name": run.name,
        "algorithm": "grpo",
        "rollout_engine": "vllm",
        "reward_function": "arith",  # rule-based: the math verifier costs no GPU time
        "async_one_step_off": run.off_policy,
        "models": {"actor": run.model, "ref": run.model},
        "batch": {
            "prompts_per_step": run.prompts,
            "samples_per_prompt": run.samples,
            "prompt_len": PROMPT_LEN,
            "response_len": run.max_seq - PROMPT_LEN,
            "mini_batches": rollouts // run.train_batch,
            "response_len_dist": "lognormal",
            "response_len_median": response_median(run.avg_seq_len, run.max_seq),
            "response_len_sigma": SIGMA,
        },
    }
    train_gpus = run.num_gpus // 2 if run.off_policy else run.num_gpus
    actor = {"micro_batch": 1, "recompute": True, **run.actor}
    layout_keys = ("p", "t", "d", "e", "cp", "first_stage_layers", "last_stage_layers")
    ref = {k: actor[k] for k in layout_keys if k in actor} | {"micro_batch": 2}
    if not run.off_policy:
        # Colocated with vLLM, NeMo RL moves the policy's weights and optimizer state to
        # the host after each refit (offload_after_refit) and back for training; the
        # reference weights are kept on the host and swapped in for its log-probs.
        actor |= {"offload_optimizer": True, "offload_params": True}
        ref |= {"offload_params": True}
    sets: list[dict[str, Any]] = [
        {"roles": ["actor", "ref"], "pool": "h100", "first_device": 0, "num_devices": train_gpus}
    ]
    if run.off_policy:
        sets.append(
            {"roles": ["actor"], "pool": "h100", "first_device": train_gpus,
             "num_devices": run.num_gpus - train_gpus, "generator": True}
        )  # fmt: skip
    cluster = {
        "name": f"h100x{run.num_gpus}",
        "pools": [
            {"name": "h100", "gpu": "h100-sxm", "num_nodes": run.num_gpus // 8,
             "gpus_per_node": 8, "price_per_gpu_hour": 2.49}
        ],
    }  # fmt: skip
    return {
        "name": run.name,
        "workload": workload,
        "cluster": cluster,
        "sets": sets,
        "parallelism": {"actor": actor, "ref": ref},
    }


def annotate(path: Path, run: PublishedRun) -> None:
    """Say in the plan file which published row it stands for and how it departs from it."""
    if not run.published_layout:
        return
    notes = [
        f"Published row: {run.source}: {run.model}, {run.num_gpus} H100, "
        f"{'1-step off' if run.off_policy else 'on-policy'}, step {run.step_s} s.",
        f"Published layout: {run.published_layout}.",
        f"This plan: {run.layout_note}. "
        + ("" if "cp" in run.actor else "Context parallelism is not modelled (folded into d); ")
        + "expert TP equals t and e is carved out of d (placeflow.layout.TrainLayout).",
    ]
    if not run.off_policy:
        notes.append(
            "The actor's weights and Adam state are offloaded outside its calls and the "
            "reference's weights outside its own, as NeMo RL moves the colocated policy to "
            "the host after each refit and swaps the reference weights in from the host."
        )
    comment = "".join(f"# {line}\n" for note in notes for line in textwrap.wrap(note, 96))
    header, body = path.read_text(encoding="utf-8").split("\n", 1)
    path.write_text(f"{header}\n{comment}{body}", encoding="utf-8")


def simulate_row(run: PublishedRun) -> dict[str, Any]:
    """Write the row's plan, simulate it and compare."""
    row: dict[str, Any] = {
        "name": run.name,
        "source": run.source,
        "model": run.model,
        "num_gpus": run.num_gpus,
        "published_layout": run.published_layout,
        "layout_note": run.layout_note,
        "published_step_s": run.step_s,
        "published_tokens_per_s_per_gpu": run.tokens_per_s_per_gpu,
    }
    path = OUT_DIR / f"{run.name}.toml"
    save_plan(plan_from_dict(plan_dict(run), run.name, OUT_DIR), path)
    annotate(path, run)
    plan = load_plan(path)
    est = simulate(plan, cost_models_for(plan, "h100-sxm"))
    tokens = run.prompts * run.samples * run.avg_seq_len
    step_s = est.iteration_s
    return row | {
        "plan": str(path.relative_to(ROOT)),
        "simulated_step_s": step_s,
        "step_rel_error": (step_s - run.step_s) / run.step_s if est.feasible else None,
        "simulated_tokens_per_s_per_gpu": tokens / step_s / run.num_gpus if step_s else None,
        "simulated_phases_s": est.phase_totals_s(),
        "feasible": est.feasible,
        "infeasible_reason": est.infeasible_reason,
    }


def main() -> None:
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    rows = []
    for run in RUNS:
        row = simulate_row(run)
        rows.append(row)
        print(f"{run.name}: published {run.step_s} s, simulated {row['simulated_step_s']}",
              file=sys.stderr)  # fmt: skip
    errors = sorted(abs(r["step_rel_error"]) for r in rows if r["step_rel_error"] is not None)
    report = {
        "command": "python benchmarks/published_runs.py",
        "date": time.strftime("%Y-%m-%d"),
        "profile": "h100-sxm",
        "recipe": RECIPE,
        "moe_recipes": MOE_RECIPES,
        "assumptions": __doc__.split("What placeflow cannot express")[1].split("    python")[0],
        "median_abs_step_error": errors[len(errors) // 2],
        "rows": rows,
    }
    RESULTS.write_text(json.dumps(report, indent=1, default=str) + "\n")
    print("| run | GPUs | published step s | simulated step s | error | generate s "
          "| actor_update s |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        ph = r["simulated_phases_s"]
        err = "infeasible" if r["step_rel_error"] is None else f"{r['step_rel_error']:+.0%}"
        print(
            f"| {r['name']} | {r['num_gpus']} | {r['published_step_s']} | "
            f"{r['simulated_step_s']:.1f} | {err} | {ph.get(Phase.GENERATE, 0):.1f} | "
            f"{ph.get(Phase.ACTOR_UPDATE, 0):.1f} |"
        )


if __name__ == "__main__":
    main()
