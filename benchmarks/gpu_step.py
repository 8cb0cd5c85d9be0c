"""Benchmark: one GRPO step of a 0.9B Llama-shaped model on one GPU, measured and simulated.

The plan is `examples/plans/grpo-llama-0.9b-h100x1.toml` (issue 20): actor and
reference colocated on one GPU, 32 prompts x 4 samples x up to 128 response
tokens; `--plan` names another one-GPU plan (`grpo-tiny-llama-h100x1.toml` and
`grpo-tiny-llama-m-h100x1.toml`: the host-bound end). The script

1. measures the GPU's dense bf16 matmul peak on the spot (8192^3 `torch.mm`,
   CUDA events, median of repeats): the denominator of every MFU below;
2. runs the plan with `placeflow.executor.run.run_plan` for `--warmup` +
   `--steps` steps in a fresh local Ray instance (one GPU) and keeps the
   measured steps;
3. simulates the same plan with the plan's device profile.

Per phase it reports measured and simulated seconds, tokens/s, and, for the
model calls, achieved TFLOP/s and MFU from the standard counts (forward
2·N per token, update 6·N per token; `ModelSpec.flops_per_token_forward`).
Results go to benchmarks/results/gpu_step.json with the command, the device
and the fields `device`, `mfu_update`, `step_s` and `simulated_step_s`.

Without a CUDA device it says so and exits with status 2: it measures a GPU,
there is nothing to fall back to. Run from the repository root (the plan names
its model by a path relative to it):

    python benchmarks/gpu_step.py [--steps 3] [--warmup 1]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
PLAN = ROOT / "examples/plans/grpo-llama-0.9b-h100x1.toml"
RESULT = ROOT / "benchmarks/results/gpu_step.json"
MATMUL_N = 8192


def require_cuda() -> None:
    if not torch.cuda.is_available():
        print(
            f"gpu_step.py measures a GPU, and torch {torch.__version__} sees no CUDA device "
            "here (torch.cuda.is_available() is False); run it on a machine with an NVIDIA GPU "
            "and a CUDA build of torch",
            file=sys.stderr,
        )
        sys.exit(2)


def matmul_peak_tflops(repeats: int = 20) -> float:
    """Median dense bf16 TFLOP/s of an N^3 matmul on the current GPU (CUDA events)."""
    a = torch.randn(MATMUL_N, MATMUL_N, device="cuda", dtype=torch.bfloat16)
    b = torch.randn_like(a)
    for _ in range(3):
        torch.mm(a, b)
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.mm(a, b)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return 2 * MATMUL_N**3 / statistics.median(times) / 1e12


def phase_flops(plan: Any, tokens: float) -> dict[str, float]:
    """FLOPs of a step's model calls for `tokens` (prompt + response) tokens."""
    from placeflow.phases import Phase
    from placeflow.workload import Role

    models = plan.workload.models
    fwd = {role: spec.flops_per_token_forward() for role, spec in models.items()}
    # Forward + backward = 3 forwards.
    out: dict[str, float] = {Phase.ACTOR_UPDATE: 3 * fwd[Role.ACTOR] * tokens}
    if Role.REF in models:
        out[Phase.REF_LOGPROB] = fwd[Role.REF] * tokens
    return out


def run(plan: Any, steps: int, warmup: int) -> list[Any]:
    import ray

    from placeflow.executor.run import RunConfig, run_plan

    ray.init(address="local", num_gpus=1, include_dashboard=False)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            cfg = RunConfig(steps=warmup + steps, seed=0, progress=False)
            return run_plan(plan, Path(tmp) / "run", cfg).records[warmup:]
    finally:
        ray.shutdown()


def with_micro_batch(plan: Any, micro_batch: int) -> Any:
    """`plan` with the actor's training micro-batch set to `micro_batch` (0: as it is)."""
    from placeflow.workload import Role

    if not micro_batch:
        return plan
    par = dict(plan.parallelism)
    par[Role.ACTOR] = dataclasses.replace(par[Role.ACTOR], micro_batch=micro_batch)
    return dataclasses.replace(plan, parallelism=par)


def head_commit() -> str:
    """The repository's HEAD commit ("" outside a git checkout)."""
    done = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    return done.stdout.strip()


def set_simulated(report: dict[str, Any], estimate: Any, step_s: float) -> None:
    """Fill a report's simulated fields from `estimate`: the step, its error against the
    measured `step_s`, and each measured phase's simulated seconds (None for a phase the
    simulator has not)."""
    simulated = estimate.phase_totals_s()
    report["simulated_step_s"] = round(estimate.iteration_s, 4)
    report["step_error"] = round(estimate.iteration_s / step_s - 1, 4)
    for name, row in report["phases"].items():
        row["simulated_s"] = round(simulated[name], 4) if name in simulated else None


def resimulate(path: Path) -> None:
    """The run recorded in `path` simulated again with the current model: its measured
    figures kept, its simulated ones (step, error, per phase) replaced, the model's
    commit recorded beside the run's."""
    from placeflow.plan import load_plan
    from placeflow.simulator import simulate
    from placeflow.simulator.simulate import cost_models_for

    report = json.loads(path.read_text())
    plan = with_micro_batch(load_plan(ROOT / report["plan"]), report.get("actor_micro_batch", 0))
    set_simulated(report, simulate(plan, cost_models_for(plan)), report["step_s"])
    report["resimulated"] = {
        "command": f"python benchmarks/gpu_step.py --resimulate {path}",
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "placeflow_commit": head_commit(),
    }
    out = path.with_name(path.stem + "_resimulated.json")
    out.write_text(json.dumps(report, indent=1) + "\n")
    errors = {
        name: round(row["simulated_s"] / row["measured_s"] - 1, 3)
        for name, row in report["phases"].items()
        if row["simulated_s"] is not None and row["measured_s"] > 0
    }
    print(
        f"{path.name}: measured {report['step_s']} s, simulated {report['simulated_step_s']} s "
        f"({report['step_error']:+.1%}); per phase {errors}; wrote {out}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3, help="measured steps")
    parser.add_argument("--warmup", type=int, default=1, help="steps run first, not measured")
    parser.add_argument(
        "--micro-batch",
        type=int,
        default=0,
        help="the actor's training micro-batch in place of the plan's (0: the plan's)",
    )
    parser.add_argument("--out", type=Path, default=RESULT, help="results file")
    parser.add_argument(
        "--plan", type=Path, default=PLAN, help="a one-GPU plan in place of the 0.9B one"
    )
    parser.add_argument(
        "--resimulate",
        type=Path,
        help="re-simulate a results file's run with the current model (no GPU needed) and "
        "write FILE_resimulated.json beside it",
    )
    args = parser.parse_args()
    if args.steps < 1 or args.warmup < 1:
        raise SystemExit(f"--steps and --warmup must be >= 1, got {args.steps}, {args.warmup}")
    if args.resimulate:
        resimulate(args.resimulate)
        return
    require_cuda()

    from placeflow.metrics import Metric
    from placeflow.phases import Phase
    from placeflow.plan import load_plan
    from placeflow.simulator import simulate
    from placeflow.simulator.simulate import cost_models_for
    from placeflow.workload import Role

    plan_path = args.plan.resolve()
    plan = with_micro_batch(load_plan(plan_path), args.micro_batch)
    peak = matmul_peak_tflops()
    records = run(plan, args.steps, args.warmup)
    estimate = simulate(plan, cost_models_for(plan))

    step_s = statistics.mean(r.metrics[Metric.STEP_TIME_S] for r in records)
    tokens = statistics.mean(
        r.metrics[Metric.TOKENS_PER_S] * r.metrics[Metric.STEP_TIME_S] for r in records
    )
    flops = phase_flops(plan, tokens)
    phases: dict[str, dict[str, float | None]] = {}
    for name in sorted({k for r in records for k in r.phases}):
        measured = statistics.mean(r.phases.get(name, 0.0) for r in records)
        tflops = flops[name] / measured / 1e12 if name in flops and measured > 0 else None
        phases[name] = {
            "measured_s": round(measured, 4),
            "simulated_s": None,  # set_simulated below
            "tokens_per_s": round(tokens / measured, 1) if measured > 0 else None,
            "tflops": round(tflops, 1) if tflops is not None else None,
            "mfu": round(tflops / peak, 4) if tflops is not None else None,
        }
    update = phases.get(Phase.ACTOR_UPDATE, {})
    report = {
        "command": "python " + " ".join(["benchmarks/gpu_step.py", *sys.argv[1:]]),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "placeflow_commit": head_commit(),
        # Relative to the repository where it lies there, so that --resimulate finds it.
        "plan": str(plan_path.relative_to(ROOT) if plan_path.is_relative_to(ROOT) else plan_path),
        "profile": estimate.profile_name,
        "settings": {"steps": args.steps, "warmup": args.warmup},
        "actor_micro_batch": plan.parallelism[Role.ACTOR].micro_batch,
        "matmul_peak_tflops": round(peak, 1),
        "step_s": round(step_s, 4),
        "simulated_step_s": None,  # set_simulated below
        "step_error": None,
        "tokens_per_step": round(tokens),
        "tokens_per_s": round(tokens / step_s, 1),
        "mfu_update": update.get("mfu"),
        "phases": phases,
        "steps": [{"metrics": r.metrics, "phases": r.phases} for r in records],
    }
    set_simulated(report, estimate, step_s)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps({k: v for k, v in report.items() if k != "steps"}, indent=1))


if __name__ == "__main__":
    main()
