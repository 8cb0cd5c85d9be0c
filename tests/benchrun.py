"""Running a `benchmarks/` script as a user does, for the tests that check its output."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_benchmark(
    script: str, args: Sequence[str] = (), *, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """`python benchmarks/SCRIPT ARGS...` from the repository root, its output captured."""
    return subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
