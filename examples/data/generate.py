"""Write a built-in task's problems to a dataset file that a workload's [data] reads.

    python examples/data/generate.py arith --count 256 --seed 1 --out arith-train.jsonl
    python examples/data/generate.py arith --count 64 --seed 2 --out val.parquet \
        --question "What is {prompt} Answer with the number only."

Rows follow verl's layout: `prompt` (a string, or with --question one chat
message to render with the model's chat template), `answer` (the ground truth)
and `data_source` (the task). The same seed writes the same rows.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from placeflow.executor.data import write_rows
from placeflow.executor.tasks import TASKS


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("task", choices=sorted(TASKS))
    parser.add_argument("--count", type=int, required=True, help="rows to write")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True, help="a .jsonl or .parquet file")
    parser.add_argument(
        "--question", help="chat format: the user message, with {prompt} for the problem"
    )
    args = parser.parse_args()
    if args.count < 1:
        parser.error(f"--count must be at least 1, got {args.count}")
    rows = TASKS[args.task].rows(args.count, args.seed, question=args.question)
    write_rows(rows, args.out)
    print(f"wrote {len(rows)} {args.task} rows to {args.out}")


if __name__ == "__main__":
    main()
