"""Datasets: the prompts of a run and the ground truths its reward function checks.

A dataset is a JSONL or parquet file (`[data]` in the workload, `DataSpec`),
one row per prompt, read whole (pyarrow for parquet): small RL prompt sets fit
in memory, and a bad row is found before any worker starts. The row layout is
verl's: `prompt` is a string or a list of chat messages, the ground truth sits
under `answer_key` (a dotted key such as `reward_model.ground_truth` reaches
into a nested column, as verl's parquet files have it), and `data_source` and
`extra_info` are passed to the reward function as they are.

Step k's prompts are rows k·n .. k·n + n - 1 of the run's sequence (n prompts
per step): the rows of epoch e in an order shuffled with a seed from the run
seed and e, so that a resumed run sees the same prompts.

A workload without `[data]` reads the dataset shipped for the built-in checker its
`reward_function` names (`executor/datasets/arith.jsonl`, `reverse.jsonl`, written by
`examples/data/generate.py`), through the same path as any dataset (`data_of`); one
scored by a reward model alone reads `arith`'s prompts. Any other reward function
needs `[data]`: the ground truths it checks come from there.
"""

from __future__ import annotations

import functools
import json
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from placeflow.errors import SpecError
from placeflow.executor.tasks import TASKS
from placeflow.workload import DATA_SUFFIXES, DataSpec, Workload

# The shipped datasets of the built-in tasks: package data, so that an installed
# placeflow finds them as a source checkout does.
BUILTIN_DATA_DIR = Path(__file__).resolve().parent / "datasets"
# The prompts of a workload scored by a reward model alone.
REWARD_MODEL_TASK = "arith"

# A chat prompt: [{"role": "user", "content": "..."}, ...]
Messages = list[dict[str, str]]


@dataclass(frozen=True)
class Example:
    """One row: what the model is asked, and what its reward function is given."""

    prompt: str | Messages
    answer: str  # the ground truth, as text
    data_source: str = ""
    extra_info: dict[str, Any] = field(default_factory=dict, hash=False)


def data_of(w: Workload) -> DataSpec:
    """`w`'s [data], or the shipped dataset of its built-in checker (see the module doc);
    a one-line SpecError when it has neither."""
    if w.data is not None:
        return w.data
    task = w.reward_function or REWARD_MODEL_TASK
    if task not in TASKS:
        raise SpecError(
            f"workload {w.name!r}: reward_function {task!r} needs [data] (train = a JSONL or "
            "parquet file of prompts and the ground truths it checks); only the built-in "
            f"checkers ({', '.join(TASKS)}) have a shipped dataset"
        )
    path = BUILTIN_DATA_DIR / f"{task}.jsonl"
    if not path.is_file():
        raise SpecError(
            f"workload {w.name!r} has no [data] and the {task!r} dataset is not at {path}; "
            f"write it with `python examples/data/generate.py --shipped`, or give [data] train"
        )
    return DataSpec(train=path)


def read_rows(path: Path) -> list[dict[str, Any]]:
    """The rows of a JSONL or parquet file as dicts; a malformed file is a one-line SpecError."""
    if path.suffix not in DATA_SUFFIXES:
        raise SpecError(f"{path}: unknown file type {path.suffix!r}; use .jsonl or .parquet")
    if path.suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            return list(pq.read_table(path).to_pylist())
        except (OSError, pa.ArrowInvalid) as exc:
            raise SpecError(f"{path}: not a readable parquet file ({exc})") from None
    rows = []
    with path.open(encoding="utf-8") as f:
        for i, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise SpecError(f"{path}: row {i}: not valid JSON ({exc.msg})") from None
    return rows


def write_rows(rows: Sequence[dict[str, Any]], path: Path) -> None:
    """Rows to a JSONL or parquet file (by suffix): the inverse of `read_rows`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(list(rows)), path)
    elif path.suffix == ".jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    else:
        raise SpecError(f"{path}: unknown file type {path.suffix!r}; use .jsonl or .parquet")


def _lookup(row: dict[str, Any], key: str) -> tuple[bool, Any]:
    """(found, value) of a possibly dotted key."""
    value: Any = row
    for part in key.split("."):
        if not isinstance(value, dict) or part not in value:
            return False, None
        value = value[part]
    return True, value


def _is_messages(value: Any) -> bool:
    return (
        isinstance(value, list)
        and bool(value)
        and all(
            isinstance(m, dict)
            and isinstance(m.get("role"), str)
            and isinstance(m.get("content"), str)
            for m in value
        )
    )


def load_examples(path: Path, spec: DataSpec) -> list[Example]:
    """The rows of `path` as Examples; a missing key, a wrong type or an empty file is a
    SpecError naming the file, the row (1-based) and the key."""
    rows = read_rows(path)
    if not rows:
        raise SpecError(
            f"{path}: no rows; give at least one row with {spec.prompt_key!r} and "
            f"{spec.answer_key!r}"
        )
    out = []
    for i, row in enumerate(rows, start=1):
        where = f"{path}: row {i}"
        if not isinstance(row, dict):
            raise SpecError(f"{where}: expected an object, got {type(row).__name__}")
        found, prompt = _lookup(row, spec.prompt_key)
        if not found:
            raise SpecError(
                f"{where}: no key {spec.prompt_key!r} (keys: {', '.join(sorted(row))}); "
                "name the prompt column with [data] prompt_key"
            )
        if _is_messages(prompt):
            if not spec.chat_template:
                raise SpecError(
                    f"{where}: key {spec.prompt_key!r} holds chat messages; set [data] "
                    "chat_template = true to render them with the model's template"
                )
        elif not isinstance(prompt, str) or not prompt:
            raise SpecError(
                f"{where}: key {spec.prompt_key!r}: expected a non-empty string or a list of "
                f"{{role, content}} messages, got {type(prompt).__name__} {prompt!r:.60}"
            )
        found, answer = _lookup(row, spec.answer_key)
        if not found:
            raise SpecError(
                f"{where}: no key {spec.answer_key!r} (keys: {', '.join(sorted(row))}); "
                "name the ground-truth column with [data] answer_key"
            )
        if isinstance(answer, bool) or not isinstance(answer, str | int | float):
            raise SpecError(
                f"{where}: key {spec.answer_key!r}: expected a string or a number, "
                f"got {type(answer).__name__} {answer!r:.60}"
            )
        extra = row.get("extra_info") or {}
        if not isinstance(extra, dict):
            raise SpecError(f"{where}: key 'extra_info': expected an object, got {extra!r:.60}")
        out.append(
            Example(
                prompt=prompt,
                answer=str(answer),
                data_source=str(row.get("data_source", path.stem)),
                extra_info=extra,
            )
        )
    return out


def num_steps(num_examples: int, prompts_per_step: int, epochs: int) -> int:
    """Whole steps that `epochs` passes over `num_examples` rows give (the last partial
    step is not taken)."""
    return num_examples * epochs // prompts_per_step


@dataclass(frozen=True)
class PromptSchedule:
    """Which rows step k trains on: the run's sequence of epochs, each shuffled with
    `seed` and its index, cut into steps of `prompts_per_step` rows."""

    examples: Sequence[Example]
    prompts_per_step: int
    seed: int
    shuffle: bool = True

    def order(self, epoch: int) -> Sequence[int]:
        if not self.shuffle:
            return range(len(self.examples))
        return _shuffled(len(self.examples), self.seed * 1_000_003 + epoch)

    def rows(self, step: int) -> list[Example]:
        n, size = self.prompts_per_step, len(self.examples)
        orders: dict[int, Sequence[int]] = {}  # the (one or two) epochs this step spans
        out = []
        for i in range(step * n, step * n + n):
            epoch, pos = divmod(i, size)
            if epoch not in orders:
                orders[epoch] = self.order(epoch)
            out.append(self.examples[orders[epoch][pos]])
        return out

    def epoch_of(self, step: int) -> int:
        return step * self.prompts_per_step // len(self.examples)


@functools.lru_cache(maxsize=4)
def _shuffled(size: int, seed: int) -> tuple[int, ...]:
    """0..size-1 shuffled by `random.Random(seed)`. Kept: the controller asks for a step's
    rows twice a step (its prompts, then its ground truths), and shuffling a dataset of a
    few thousand rows in Python costs milliseconds of the driver's time each time."""
    ix = list(range(size))
    random.Random(seed).shuffle(ix)
    return tuple(ix)


def prompt_text(example: Example, tokenizer: Any, chat_template: bool) -> str:
    """The text the model sees: the prompt as it is, or rendered with the model's chat
    template (a generation prompt appended, as for inference)."""
    if not chat_template:
        assert isinstance(example.prompt, str)  # load_examples refuses messages without it
        return example.prompt
    messages = (
        [{"role": "user", "content": example.prompt}]
        if isinstance(example.prompt, str)
        else example.prompt
    )
    return str(
        chat_renderer(tokenizer).apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True
        )
    )


def chat_renderer(tokenizer: Any) -> Any:
    """The transformers tokenizer behind `tokenizer` that holds a chat template; a
    SpecError when there is none (the byte tokenizer of random-init models)."""
    inner = getattr(tokenizer, "_tok", None)  # HFTokenizer keeps transformers' tokenizer here
    if inner is None or not getattr(inner, "chat_template", None):
        raise SpecError(
            "[data] chat_template = true needs a model checkpoint whose tokenizer has a chat "
            "template; this model's tokenizer has none (set chat_template = false)"
        )
    return inner
