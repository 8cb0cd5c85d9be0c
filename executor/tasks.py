"""Built-in verifiable tasks: a seeded problem generator and a graded checker each.

The executor never draws prompts from these generators: `examples/data/generate.py`
writes a task's problems to a JSONL or parquet file, and a run reads prompts only
through `[data]` (`executor/data.py`). The shipped datasets `executor/datasets/arith.jsonl`
and `reverse.jsonl` are written by that script and serve a workload that has no
`[data]` and names the task's checker (`executor/data.py`, `data_of`). Each checker
is offered as a reward function under the task's name (`executor/rewards.py`).

`arith` asks for the sum of two small numbers ("17+5=") and checks the response,
which should be the digits of the sum followed by a newline. Its score is graded
so that a policy starting from random weights gets a signal before it can add:

    0.2 · (share of response characters that are digits)
  + 0.2 · (the response ended with the newline, and is no longer than the answer + 1)
  + 0.6 · (share of the answer's characters the response has in the right place)

An exact answer scores 1.0 and only an exact answer does. `reverse` asks for a
short lowercase word backwards ("abc>") with the same grading over letters. The
checker reads the response as every reward function gets it, decoded without
special tokens: with the byte tokenizer of the random-init models the end token is
the newline byte itself, which decoding keeps, so a response that stopped ends with
the newline; a real tokenizer drops its end token, so for real models
`examples/rewards/arith_exact.py` (the last number of the response) is the reward.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from placeflow.errors import UnknownNameError


@dataclass(frozen=True)
class Problem:
    prompt: str
    answer: str


@dataclass(frozen=True)
class Task:
    name: str
    make: Callable[[random.Random], Problem]
    is_symbol: Callable[[str], bool]  # characters an answer is made of
    stop: str = "\n"

    def problems(self, count: int, seed: int) -> list[Problem]:
        rng = random.Random(seed)
        return [self.make(rng) for _ in range(count)]

    def score(self, problem: Problem, response: str) -> float:
        """The graded score of `response` (text as decoded)."""
        return self.score_answer(problem.answer, response)

    def score_answer(self, answer: str, response: str) -> float:
        stopped = response.endswith(self.stop)
        body = response[: -len(self.stop)] if stopped else response
        if stopped and body == answer:
            return 1.0
        symbols = sum(self.is_symbol(c) for c in body) / len(body) if body else 0.0
        ended = float(stopped and len(body) <= len(answer) + 1)
        right = sum(a == b for a, b in zip(body, answer, strict=False))
        return 0.2 * symbols + 0.2 * ended + 0.6 * right / len(answer)

    def rows(self, count: int, seed: int, *, question: str | None = None) -> list[dict[str, Any]]:
        """`count` problems as dataset rows (`prompt`, `answer`, `data_source`); with
        `question` (a format string with `{prompt}`, given the problem without its cue:
        "17+5"), the prompt as one chat message."""
        return [
            {
                "prompt": p.prompt
                if question is None
                # The problem without its completion cue ("=" or ">"), inside the question.
                else [{"role": "user", "content": question.format(prompt=p.prompt[:-1])}],
                "answer": p.answer,
                "data_source": self.name,
            }
            for p in self.problems(count, seed)
        ]


def _arith(rng: random.Random) -> Problem:
    a, b = rng.randint(0, 49), rng.randint(0, 49)
    return Problem(prompt=f"{a}+{b}=", answer=str(a + b))


def _reverse(rng: random.Random) -> Problem:
    word = "".join(rng.choice("abcdefghij") for _ in range(rng.randint(2, 5)))
    return Problem(prompt=f"{word}>", answer=word[::-1])


TASKS: dict[str, Task] = {
    "arith": Task(name="arith", make=_arith, is_symbol=str.isdigit),
    "reverse": Task(name="reverse", make=_reverse, is_symbol=str.isalpha),
}


def get_task(name: str) -> Task:
    try:
        return TASKS[name]
    except KeyError:
        raise UnknownNameError("reward_function", name, list(TASKS)) from None
