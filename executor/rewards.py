"""Rule-based reward functions: built-in, from a package, or from a file; scored per sample.

A workload's `reward_function` is one of
  - a built-in name: `arith` and `reverse` (the graded checkers of `executor/tasks.py`),
    `math` (math-verify: the response's final answer equals the ground truth);
  - `package.module:function`, imported;
  - `path/to/file.py:function`, loaded from the file (resolved against the workload's
    directory when the workload is read).

The function has verl's signature, called with keywords:
`f(data_source=..., solution_str=..., ground_truth=..., extra_info=...)`; it returns
a float, or a dict with a `score` (other numeric entries are logged as
`reward_extra/<key>` means). `solution_str` is the response decoded without special
tokens, as verl decodes it. An exception in the function, or a return of another
kind, scores that sample 0.0 and is counted (`reward_errors`) and logged; it
never stops the run.

Scoring runs on the driver, or in `reward_workers` Ray tasks launched while the
model calls of the step run (`launch_scoring`), each loading the function itself.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import math
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ray

from placeflow.errors import SpecError
from placeflow.executor.tasks import TASKS

log = logging.getLogger(__name__)
RewardFn = Callable[..., Any]


def math_reward(
    data_source: str, solution_str: str, ground_truth: str, extra_info: dict | None = None
) -> float:
    """1.0 when math-verify finds the ground truth's value in the response, else 0.0."""
    from math_verify import parse, verify

    # math-verify's timeouts use SIGALRM, which only the main thread may set; elsewhere
    # (a helper thread) it scores without one, and its warning that says so is muted.
    timeout = 5 if threading.current_thread() is threading.main_thread() else None
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    gold = parse(ground_truth, parsing_timeout=timeout)
    answer = parse(solution_str, parsing_timeout=timeout)
    return float(verify(gold, answer, timeout_seconds=timeout))


def _task_reward(name: str) -> RewardFn:
    task = TASKS[name]

    def score(
        data_source: str, solution_str: str, ground_truth: str, extra_info: dict | None = None
    ) -> float:
        return task.score_answer(ground_truth, solution_str)

    score.__name__ = f"{name}_reward"
    return score


BUILTIN: dict[str, RewardFn] = {
    **{name: _task_reward(name) for name in TASKS},
    "math": math_reward,
}


def load_reward_function(spec: str) -> RewardFn:
    """The function `spec` names (see the module docstring); a one-line SpecError when
    it cannot be found, saying which forms are accepted."""
    if spec in BUILTIN:
        return BUILTIN[spec]
    target, sep, name = spec.rpartition(":")
    if not sep or not target or not name:
        raise SpecError(
            f"reward_function {spec!r}: not a built-in ({', '.join(BUILTIN)}) nor "
            "'package.module:function' nor 'path/to/file.py:function'"
        )
    if target.endswith(".py"):
        module = _module_from_file(Path(target), spec)
    else:
        try:
            module = importlib.import_module(target)
        except ImportError as exc:
            raise SpecError(f"reward_function {spec!r}: cannot import {target!r} ({exc})") from None
    fn = getattr(module, name, None)
    if not callable(fn):
        raise SpecError(f"reward_function {spec!r}: {target} has no function {name!r}")
    return fn


def _module_from_file(path: Path, spec: str) -> Any:
    if not path.is_file():
        raise SpecError(f"reward_function {spec!r}: {path}: file not found")
    module_name = f"placeflow_reward_{abs(hash(str(path)))}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    loader_spec = importlib.util.spec_from_file_location(module_name, path)
    assert loader_spec is not None and loader_spec.loader is not None
    module = importlib.util.module_from_spec(loader_spec)
    try:
        loader_spec.loader.exec_module(module)
    except Exception as exc:  # the user's file: any error in it is theirs to fix
        raise SpecError(
            f"reward_function {spec!r}: {path} failed to load: {type(exc).__name__}: {exc}"
        ) from None
    sys.modules[module_name] = module
    return module


@dataclass(frozen=True)
class RewardInput:
    """What the reward function is called with for one response."""

    data_source: str
    solution_str: str
    ground_truth: str
    extra_info: dict[str, Any] = field(default_factory=dict, hash=False)


@dataclass(frozen=True)
class Scores:
    """A batch's scores; failed samples score 0.0 and are counted."""

    values: list[float]
    num_errors: int = 0
    first_error: str | None = None  # the first failure's message, for the log
    extras: dict[str, list[float]] = field(default_factory=dict)  # dict returns' other keys

    @staticmethod
    def join(parts: Sequence[Scores]) -> Scores:
        extras: dict[str, list[float]] = {}
        for p in parts:
            for k, v in p.extras.items():
                extras.setdefault(k, []).extend(v)
        return Scores(
            values=[v for p in parts for v in p.values],
            num_errors=sum(p.num_errors for p in parts),
            first_error=next((p.first_error for p in parts if p.first_error), None),
            extras=extras,
        )


def _one(fn: RewardFn, item: RewardInput) -> tuple[float, dict[str, float]]:
    out = fn(
        data_source=item.data_source,
        solution_str=item.solution_str,
        ground_truth=item.ground_truth,
        extra_info=item.extra_info,
    )
    extras: dict[str, float] = {}
    if isinstance(out, dict):
        if "score" not in out:
            raise TypeError(f"returned a dict without 'score' (keys: {', '.join(map(str, out))})")
        extras = {
            str(k): float(v)
            for k, v in out.items()
            if k != "score" and isinstance(v, int | float) and not isinstance(v, bool)
        }
        out = out["score"]
    if isinstance(out, bool) or not isinstance(out, int | float):
        raise TypeError(f"returned {type(out).__name__}; return a float or a dict with 'score'")
    if not math.isfinite(out):
        raise ValueError(f"returned {out}; a score must be finite")
    return float(out), extras


def score_items(fn: RewardFn, items: Sequence[RewardInput]) -> Scores:
    """`fn` on every item; a sample whose call fails scores 0.0 and is counted."""
    values, errors, first = [], 0, None
    extras: dict[str, list[float]] = {}
    for item in items:
        try:
            value, extra = _one(fn, item)
        except Exception as exc:  # the user's function: a failure is that sample's, not the run's
            value, extra = 0.0, {}
            errors += 1
            first = first or f"{type(exc).__name__}: {exc}"
        values.append(value)
        for k, v in extra.items():
            extras.setdefault(k, []).append(v)
    return Scores(values=values, num_errors=errors, first_error=first, extras=extras)


@ray.remote(num_cpus=0)
def _score_task(spec: str, items: Sequence[RewardInput]) -> Scores:
    return score_items(load_reward_function(spec), items)


def launch_scoring(spec: str, items: Sequence[RewardInput], num_tasks: int) -> list[Any]:
    """`num_tasks` Ray tasks scoring consecutive chunks of `items` (refs, in order)."""
    size = -(-len(items) // num_tasks)
    return [_score_task.remote(spec, list(items[i : i + size])) for i in range(0, len(items), size)]


def collect_scoring(refs: Sequence[Any], timeout_s: float) -> Scores:
    return Scores.join(ray.get(list(refs), timeout=timeout_s))


def log_errors(scores: Scores, where: str) -> None:
    if scores.num_errors:
        log.warning(
            "%s: the reward function failed on %d of %d samples (scored 0.0); first: %s",
            where,
            scores.num_errors,
            len(scores.values),
            scores.first_error,
        )
