"""Argument types of the command line: numbers and paths checked when they are parsed.

Each function is an argparse `type=`: it returns the parsed value or raises
`ArgumentTypeError`, which argparse prints as one `placeflow: error: ...` line
with exit code 2, before any work starts.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Sequence


def _number(text: str, kind: type[int] | type[float]) -> float:
    try:
        value = kind(text)
    except ValueError:
        noun = "an integer" if kind is int else "a number"
        raise argparse.ArgumentTypeError(f"expected {noun}, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def positive_int(text: str) -> int:
    value = int(_number(text, int))
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def non_negative_int(text: str) -> int:
    value = int(_number(text, int))
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return value


def seed(text: str) -> int:
    value = non_negative_int(text)
    if value >= 2**63:
        raise argparse.ArgumentTypeError(f"must be below 2**63, got {value}")
    return value


def positive_float(text: str) -> float:
    value = _number(text, float)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be greater than 0, got {text}")
    return value


def seconds(text: str) -> float:
    """A duration: positive, finite and at most a week (a larger one is a typo)."""
    value = positive_float(text)
    if value > 7 * 24 * 3600:
        raise argparse.ArgumentTypeError(f"at most one week (604800 s), got {text}")
    return value


def bounded_int(low: int, high: int, what: str) -> Callable[[str], int]:
    """An integer in [low, high]; `what` says why the bound (shown in the error)."""

    def parse(text: str) -> int:
        value = int(_number(text, int))
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be {low} to {high} ({what}), got {value}")
        return value

    parse.__name__ = f"int in [{low}, {high}]"
    return parse


def nonempty(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError("must not be empty")
    if "\x00" in text:
        raise argparse.ArgumentTypeError("must not contain a NUL character")
    return text


def add_kinds_option(parser: argparse.ArgumentParser, kinds: Sequence[str]) -> None:
    """`--kinds`: which of a profiling module's `kinds` to measure, all by default (the
    profile file's entries of the others are kept)."""
    parser.add_argument(
        "--kinds",
        nargs="+",
        choices=list(kinds),
        default=list(kinds),
        help="the kinds to measure (the file's entries of other kinds are kept)",
    )
