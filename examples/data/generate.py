"""Write a built-in task's problems to a dataset file that a workload's [data] reads.

    python examples/data/generate.py arith --count 256 --seed 1 --out arith-train.jsonl
    python examples/data/generate.py arith --count 64 --seed 2 --out val.parquet \
        --question "What is {prompt} Answer with the number only."
    python examples/data/generate.py --shipped     # rewrite the shipped datasets

Rows follow verl's layout: `prompt` (a string, or with --question one chat
message to render with the model's chat template), `answer` (the ground truth)
and `data_source` (the task). The same seed writes the same rows.

The shipped datasets are this script's output (`SHIPPED`; a test checks them byte
for byte): `arith.jsonl` and `reverse.jsonl`, package data in
`executor/datasets/` (`placeflow.executor.data.BUILTIN_DATA_DIR`), are the prompts
of a workload that has no [data] and is scored by that task's checker (or by a
reward model alone: `arith`); `arith-train.jsonl` and `arith-val.jsonl` in this
folder are the tiny dataset example's (examples/workloads/grpo-tiny-data-cpu.toml).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from placeflow.executor.data import BUILTIN_DATA_DIR, write_rows
from placeflow.executor.tasks import TASKS

HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Shipped:
    """A shipped dataset file and the arguments that write it; `builtin`: a built-in
    checker's dataset (package data), else an example in this folder."""

    file: str
    task: str
    count: int
    seed: int
    builtin: bool = False


# 2,048 rows: a test run (16 prompts a step, up to ~100 steps) seldom passes over them
# twice; later epochs repeat them, shuffled anew.
SHIPPED = (
    Shipped(file="arith.jsonl", task="arith", count=2048, seed=0, builtin=True),
    Shipped(file="reverse.jsonl", task="reverse", count=2048, seed=0, builtin=True),
    Shipped(file="arith-train.jsonl", task="arith", count=256, seed=1),
    Shipped(file="arith-val.jsonl", task="arith", count=32, seed=2),
)


def write_shipped(examples: Path = HERE, builtin: Path = BUILTIN_DATA_DIR) -> list[Path]:
    """Every shipped dataset: the built-in checkers' under `builtin`, the examples under
    `examples`."""
    out = []
    for s in SHIPPED:
        path = (builtin if s.builtin else examples) / s.file
        path.parent.mkdir(parents=True, exist_ok=True)
        write_rows(TASKS[s.task].rows(s.count, s.seed), path)
        out.append(path)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("task", nargs="?", choices=sorted(TASKS))
    parser.add_argument("--count", type=int, help="rows to write")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, help="a .jsonl or .parquet file")
    parser.add_argument(
        "--question", help="chat format: the user message, with {prompt} for the problem"
    )
    parser.add_argument(
        "--shipped",
        action="store_true",
        help="rewrite the shipped datasets (examples/data, executor/datasets)",
    )
    args = parser.parse_args()
    if args.shipped:
        if args.task or args.out or args.count:
            parser.error("--shipped takes no task, --count or --out")
        for path in write_shipped():
            print(f"wrote {path}")
        return
    if args.task is None or args.out is None or args.count is None:
        parser.error("give a task, --count and --out (or --shipped)")
    if args.count < 1:
        parser.error(f"--count must be at least 1, got {args.count}")
    rows = TASKS[args.task].rows(args.count, args.seed, question=args.question)
    write_rows(rows, args.out)
    print(f"wrote {len(rows)} {args.task} rows to {args.out}")


if __name__ == "__main__":
    main()
