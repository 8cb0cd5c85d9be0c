"""Command-line output helpers: progress that suits the terminal, writes that fall back.

- `table_progress`: a progress callback for a long loop; a tqdm bar on stderr when
  stderr is a terminal, else a few plain lines (no carriage returns in logs).
- `write_or_fallback`: when writing a result fails at the end (the disk filled, a
  folder vanished), the result is written to the temp folder and the user told where,
  so that minutes of work are not lost to the last step.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from tqdm import tqdm

from placeflow.errors import SpecError
from placeflow.fsio import fallback_path

PLAIN_EVERY = 0.25  # piped output: a line per quarter of the work


@contextlib.contextmanager
def table_progress(desc: str, *, quiet: bool = False) -> Iterator[Callable[[int, int], None]]:
    """A `progress(done, total)` callback, rendered to stderr as suits it."""
    if quiet:
        yield lambda done, total: None
        return
    if sys.stderr.isatty():
        bar: Any = None

        def update(done: int, total: int) -> None:
            nonlocal bar
            if bar is None:
                bar = tqdm(total=total, desc=desc, unit="count", leave=False, file=sys.stderr)
            bar.update(done - bar.n)

        try:
            yield update
        finally:
            if bar is not None:
                bar.close()
        return
    shown = [0.0]

    def plain(done: int, total: int) -> None:
        if done == total or done / total >= shown[0] + PLAIN_EVERY:
            shown[0] = done / total
            print(f"placeflow: {desc}: {done}/{total}", file=sys.stderr, flush=True)

    yield plain


def write_or_fallback(write: Callable[[Path], Any], path: Path) -> Path:
    """`write(path)`; if that fails with an OSError, `write` to a fallback path and say so."""
    try:
        write(path)
        return path
    except OSError as exc:
        fallback = fallback_path(path)
        try:
            write(fallback)
        except OSError:
            raise SpecError(f"cannot write {path} ({exc.strerror}) nor {fallback}") from None
        print(
            f"placeflow: could not write {path} ({exc.strerror}); wrote {fallback} instead",
            file=sys.stderr,
        )
        return fallback
