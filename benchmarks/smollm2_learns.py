"""SmolLM2-135M-Instruct learns to add on this CPU: GRPO from a chat dataset, validated.

What it does, as a user would:
1. SmolLM2-135M-Instruct as a transformers checkpoint directory (the offline GGUF
   of `executor.engines.smollm2`, dequantised to fp32; benchmarks/trl_grpo.py's export);
2. a generated arithmetic dataset in chat format (examples/data/generate.py's rows:
   "What is 17+5? ..." -> "22"), a train and a held-out validation split;
3. a workload and plan naming them by paths relative to the workload, the
   exact-answer reward `examples/rewards/arith_exact.py:compute_score` (the
   response's last number equals the sum);
4. `placeflow run` with validation (greedy, no training) every K steps;
5. the run report (`placeflow report`, RUN_DIR/report.html), whose first figure is
   the validation curve;
6. the first and last validation exact-accuracy, the curve, the command, the report's
   path and the machine's load into benchmarks/results/smollm2_learns.json.

    python benchmarks/smollm2_learns.py --steps 16 --validate-every 8
    python benchmarks/smollm2_learns.py --report-only   # the report of the recorded run

The oracle is the held-out split: rows the run never trains on, scored by the
exact answer only (no partial credit).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from placeflow.metrics import Metric, RecordKey

ROOT = Path(__file__).resolve().parents[1]
RESULT = ROOT / "benchmarks/results/smollm2_learns.json"
QUESTION = "What is {prompt}? Reply with just the number."

PLAN = """
name = "smollm2-arith-grpo"
workload = "workload.toml"
sets = [{{ roles = ["actor"], pool = "cpu", first_device = 0, num_devices = 1 }}]

[cluster]
name = "this-cpu"
pools = [{{ name = "cpu", gpu = "cpu", num_nodes = 1, gpus_per_node = 1, memory_gib = 8 }}]

[parallelism.actor]
d = 1
micro_batch = {micro_batch}
zero = 0
recompute = false
"""

WORKLOAD = """
name = "smollm2-arith"
algorithm = "grpo"
reward_function = "{reward}"

[models]
actor = "checkpoint"

[data]
train = "data/train.jsonl"
validation = "data/val.jsonl"
chat_template = true
validate_every = {validate_every}

[batch]
prompts_per_step = {prompts}
samples_per_prompt = {samples}
prompt_len = 64
response_len = {response_len}

[rl]
lr = {lr}
temperature = {temperature}
kl_coef = 0.0
"""


def prepare(work: Path, args: argparse.Namespace) -> Path:
    """The checkpoint, the datasets, the workload and the plan under `work`."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from trl_grpo import export_smollm2  # type: ignore[import-not-found]

    from placeflow.executor.data import write_rows
    from placeflow.executor.tasks import TASKS

    checkpoint = work / "checkpoint"
    if not (checkpoint / "config.json").is_file():
        export_smollm2(checkpoint)
    task = TASKS["arith"]
    write_rows(task.rows(args.train_rows, seed=1, question=QUESTION), work / "data/train.jsonl")
    write_rows(task.rows(args.val_rows, seed=2, question=QUESTION), work / "data/val.jsonl")
    reward = ROOT / "examples/rewards/arith_exact.py"
    (work / "workload.toml").write_text(
        WORKLOAD.format(
            reward=f"{reward}:compute_score",
            validate_every=args.validate_every,
            prompts=args.prompts,
            samples=args.samples,
            response_len=args.response_len,
            lr=args.lr,
            temperature=args.temperature,
        )
    )
    plan = work / "plan.toml"
    plan.write_text(PLAN.format(micro_batch=args.prompts * args.samples))
    return plan


def load() -> dict[str, Any]:
    """The machine's load average and the busiest other processes (this one excluded)."""
    top = subprocess.run(
        ["ps", "-eo", "pcpu,comm", "--sort=-pcpu", "--no-headers"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.splitlines()[:6]
    return {"loadavg": os.getloadavg(), "cpus": os.cpu_count(), "top_processes_pcpu": top}


def report_of(run_dir: Path) -> dict[str, Any]:
    """The run's plotly report (RUN_DIR/report.html), checked to draw the validation
    curve: its figure's points are validation.jsonl's."""
    from placeflow.reports.run import run_report

    path = run_report(run_dir)
    html = path.read_text()
    val = [json.loads(x) for x in (run_dir / "validation.jsonl").read_text().splitlines()]
    points = json.dumps(
        {"x": [v[RecordKey.STEP] for v in val], "y": [v[Metric.VAL_EXACT_MATCH] for v in val]},
        separators=(",", ":"),
    )[1:-1]  # plotly writes the trace's x and y so, in this order
    title = f"Validation ({val[0][Metric.VAL_NUM_PROMPTS]} held-out prompts, greedy)"
    return {
        "report": str(path),
        "report_draws_validation_curve": points in html and title in html,
        "report_command": f"placeflow report {run_dir}",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--validate-every", type=int, default=8)
    parser.add_argument("--prompts", type=int, default=4, help="prompts per step")
    parser.add_argument("--samples", type=int, default=4, help="responses per prompt")
    parser.add_argument("--response-len", type=int, default=10)
    parser.add_argument("--lr", type=float, default=2e-5)
    # At 1.0 the small model's samples are rarely right (no group has a reward to learn
    # from); lower, they are right about as often as its greedy answers.
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--train-rows", type=int, default=512)
    parser.add_argument("--val-rows", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--work-dir", type=Path, default=Path("/tmp/placeflow-smollm2"))
    parser.add_argument(
        "--report-only",
        action="store_true",
        help="write the run report of the run the results file records, and record it",
    )
    args = parser.parse_args()
    if args.report_only:
        result = json.loads(RESULT.read_text())
        result |= report_of(Path(result["run_dir"]))
        RESULT.write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {result['report']}; recorded in {RESULT}")
        return
    work = args.work_dir
    work.mkdir(parents=True, exist_ok=True)
    plan = prepare(work, args)
    run_dir = work / f"run-{time.strftime('%Y%m%d-%H%M%S')}"
    command = [
        sys.executable, "-m", "placeflow.cli", "run", str(plan), "--steps", str(args.steps),
        "--run-dir", str(run_dir), "--threads", str(args.threads), "--no-progress",
    ]  # fmt: skip
    before = load()
    start = time.monotonic()
    subprocess.run(command, check=True)
    wall_s = time.monotonic() - start
    after = load()
    val = [json.loads(x) for x in (run_dir / "validation.jsonl").read_text().splitlines()]
    metrics = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    keys = (RecordKey.STEP, Metric.VAL_EXACT_MATCH, Metric.VAL_REWARD_MEAN)
    curve = [{k: v[k] for k in keys} for v in val]
    result = {
        "command": shlex.join([sys.executable, *sys.argv]),
        "run_command": shlex.join(command),
        "settings": vars(args) | {"work_dir": str(work)},
        "validation_curve": curve,
        "first_exact": curve[0][Metric.VAL_EXACT_MATCH],
        "last_exact": curve[-1][Metric.VAL_EXACT_MATCH],
        "rises": curve[-1][Metric.VAL_EXACT_MATCH] > curve[0][Metric.VAL_EXACT_MATCH],
        "train_reward_mean_per_step": [round(m[Metric.REWARD_MEAN], 4) for m in metrics],
        "step_time_s_median": sorted(m[Metric.STEP_TIME_S] for m in metrics)[len(metrics) // 2],
        "wall_s": wall_s,
        "load_before": before,
        "load_after": after,
        "validation_samples_last": val[-1][RecordKey.SAMPLES],
        "run_dir": str(run_dir),
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    } | report_of(run_dir)
    RESULT.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("validation_curve", "first_exact", "last_exact")}))
    print(f"wrote {RESULT}")


if __name__ == "__main__":
    main()
