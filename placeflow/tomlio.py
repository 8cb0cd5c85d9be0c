"""Reading TOML files into specs with errors that name the file, the key and the type.

`tomllib` parses; `Table` wraps one parsed table with typed getters so that a
wrong or missing value is reported as `file: key: expected <type>, got <value>`.
Unknown keys are rejected too: a misspelt key is a silent wrong answer otherwise.
"""

from __future__ import annotations

import math
import tomllib
from collections.abc import Callable, Iterable
from enum import StrEnum
from pathlib import Path
from typing import Any, TypeVar

from placeflow.errors import SpecError

T = TypeVar("T")
E = TypeVar("E", bound=StrEnum)


def parse_enum(cls: type[E], value: str, where: str | None, what: str) -> E:
    """`value` as a member of `cls`; anything else is a SpecError listing the members
    (`where: unknown <what> 'x'; known: a, b`, without `where: ` when it is None)."""
    try:
        return cls(value)
    except ValueError:
        known = ", ".join(m.value for m in cls)
        prefix = f"{where}: " if where else ""
        raise SpecError(f"{prefix}unknown {what} {value!r}; known: {known}") from None


def read_toml(path: str | Path) -> dict[str, Any]:
    """Parse a TOML file; a missing or malformed file raises SpecError naming it."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SpecError(f"{p}: file not found") from None
    except IsADirectoryError:
        raise SpecError(f"{p}: is a directory; give a TOML file") from None
    except UnicodeDecodeError as exc:
        raise SpecError(
            f"{p}: not a UTF-8 text file (byte {exc.start}); give a TOML file"
        ) from None
    except OSError as exc:
        raise SpecError(f"{p}: cannot read ({exc.strerror})") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise SpecError(f"{p}: malformed TOML: {exc}") from None


def load_spec(path: str | Path, parse: Callable[[dict[str, Any], str], T]) -> T:
    """Read a TOML file and parse it; every SpecError names the file (once)."""
    try:
        return parse(read_toml(path), str(path))
    except SpecError as exc:
        msg = str(exc)
        raise SpecError(msg if msg.startswith(str(path)) else f"{path}: {msg}") from None


class Table:
    """A parsed TOML table with typed, key-checked access; `where` names it in errors."""

    def __init__(self, data: Any, where: str) -> None:
        if not isinstance(data, dict):
            raise SpecError(f"{where}: expected a table, got {type(data).__name__} {data!r}")
        self.data: dict[str, Any] = data
        self.where = where

    def _missing(self, key: str, expected: str) -> SpecError:
        return SpecError(f"{self.where}: missing key {key!r} ({expected})")

    def _wrong(self, key: str, expected: str, value: Any) -> SpecError:
        return SpecError(
            f"{self.where}: key {key!r}: expected {expected}, got {type(value).__name__} {value!r}"
        )

    def has(self, key: str) -> bool:
        return key in self.data

    def get_int(self, key: str, default: int | None = None) -> int:
        if key not in self.data:
            if default is None:
                raise self._missing(key, "an integer")
            return default
        value = self.data[key]
        if isinstance(value, bool) or not isinstance(value, int):
            raise self._wrong(key, "an integer", value)
        return value

    def get_float(self, key: str, default: float | None = None) -> float:
        if key not in self.data:
            if default is None:
                raise self._missing(key, "a number")
            return default
        value = self.data[key]
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self._wrong(key, "a number", value)
        if not math.isfinite(value):  # nan and inf would pass every `<=` check silently
            raise self._wrong(key, "a finite number", value)
        return float(value)

    def optional_float(self, key: str) -> float | None:
        return self.get_float(key) if key in self.data else None

    def get_str(self, key: str, default: str | None = None) -> str:
        if key not in self.data:
            if default is None:
                raise self._missing(key, "a string")
            return default
        value = self.data[key]
        if not isinstance(value, str):
            raise self._wrong(key, "a string", value)
        return value

    def get_bool(self, key: str, default: bool | None = None) -> bool:
        if key not in self.data:
            if default is None:
                raise self._missing(key, "true or false")
            return default
        value = self.data[key]
        if not isinstance(value, bool):
            raise self._wrong(key, "true or false", value)
        return value

    def table(self, key: str) -> Table:
        if key not in self.data:
            raise self._missing(key, "a table")
        return Table(self.data[key], f"{self.where} [{key}]")

    def tables(self, key: str) -> list[Table]:
        """An array of tables (`[[key]]`)."""
        if key not in self.data:
            raise self._missing(key, "an array of tables")
        value = self.data[key]
        if not isinstance(value, list):
            raise self._wrong(key, "an array of tables", value)
        return [Table(v, f"{self.where} [[{key}]] #{i + 1}") for i, v in enumerate(value)]

    def reject_unknown(self, allowed: Iterable[str]) -> None:
        extra = sorted(set(self.data) - set(allowed))
        if extra:
            raise SpecError(
                f"{self.where}: unknown key(s) {', '.join(map(repr, extra))}; "
                f"allowed: {', '.join(sorted(allowed))}"
            )
