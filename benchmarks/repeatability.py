"""Benchmark: how far two runs of the same plans measure apart: the floor under
`fidelity_cpu.py`'s error.

The CPU fidelity benchmark compares the simulator with one executor run of each
plan. On a shared VM the run itself moves: the same forward takes 5.6 ms one
minute and 8.2 ms the next (`/proc/stat` counted no CPU steal; the cause is not
measured), and a phase of a millisecond or two moves by a scheduler slice. A model
cannot be expected to land closer to one run than a second run of the same code
lands. This script takes two results files of `fidelity_cpu.py` made with the same
code (run one after the other) and scores the first run's measured times against
the second's exactly as `fidelity_cpu.py` scores the simulator: per phase
|a / b - 1|, the median and the worst over every phase, and over the steps. Where
both rows recorded the host's speed (`--host-speed`), the times are also compared
at the same speed (each over its row's speed, as the simulator was given them).
Beside it stand each run's own model error, and the same figures over the phases
of at least `--long-ms` milliseconds, whose noise is not a scheduler slice.

    python benchmarks/repeatability.py FIRST.json SECOND.json [--long-ms 10]

Writes benchmarks/results/repeatability_cpu.json (with the command, both runs'
dates, profiles and commands).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"

Key = tuple[str, str]  # (plan, phase); phase "step" is the row's step


def per_phase(report: Mapping[str, Any], field: str) -> dict[Key, float]:
    """`field` ("measured_s" or "rel_error") of every phase and step of a
    `fidelity_cpu.py` results file."""
    out = {}
    for row in report["rows"]:
        for p in row["phases"]:
            out[(row["plan"], p["phase"])] = p[field]
        out[(row["plan"], "step")] = row["step"][field]
    return out


def host_speeds(report: Mapping[str, Any]) -> dict[str, float | None]:
    """Each plan's host speed as its row recorded it (`--host-speed` runs; else None)."""
    return {row["plan"]: row.get("host_speed") for row in report["rows"]}


def run_differences(
    first: Mapping[str, Any], second: Mapping[str, Any], *, at_same_speed: bool
) -> dict[Key, float]:
    """first / second - 1 for each phase and step both runs measured; with
    `at_same_speed` each time over its row's host speed (only where both rows have one)."""
    a_s, b_s = per_phase(first, "measured_s"), per_phase(second, "measured_s")
    a_speed, b_speed = host_speeds(first), host_speeds(second)
    out = {}
    for key, a in a_s.items():
        if key not in b_s:
            continue
        b = b_s[key]
        if at_same_speed:
            speed_a, speed_b = a_speed[key[0]], b_speed.get(key[0])
            if speed_a is None or speed_b is None:
                continue
            a, b = a / speed_a, b / speed_b
        out[key] = a / b - 1
    return out


def summary(errors: Mapping[Key, float], keys: Iterable[Key]) -> dict:
    """Median and worst |error| over the phases and over the steps among `keys`."""
    chosen = [k for k in keys if k in errors]
    phase_keys = [k for k in chosen if k[1] != "step"]
    phases = [abs(errors[k]) for k in phase_keys]
    steps = [abs(errors[k]) for k in chosen if k[1] == "step"]
    worst = max(phase_keys, key=lambda k: abs(errors[k]), default=None)
    return {
        "phases": len(phases),
        "median_abs_phases": statistics.median(phases) if phases else None,
        "worst_abs_phases": max(phases) if phases else None,
        "worst_phase": None if worst is None else list(worst),
        "steps": len(steps),
        "median_abs_steps": statistics.median(steps) if steps else None,
        "worst_abs_steps": max(steps) if steps else None,
    }


def compare(first: Mapping[str, Any], second: Mapping[str, Any], long_s: float) -> dict:
    """The report: run against run (raw, and at the same speed where both recorded it) and
    each run's model error, over all phases and over the phases of at least `long_s`
    seconds in both runs."""
    a, b = per_phase(first, "measured_s"), per_phase(second, "measured_s")
    both = [k for k in a if k in b]
    long = [k for k in both if k[1] == "step" or min(a[k], b[k]) >= long_s]
    sets = {"all": both, f"phases >= {long_s * 1e3:g} ms": long}
    diffs = {
        "run vs run": run_differences(first, second, at_same_speed=False),
        "run vs run, same speed": run_differences(first, second, at_same_speed=True),
        "model vs first run": per_phase(first, "rel_error"),
        "model vs second run": per_phase(second, "rel_error"),
    }
    return {
        name: {label: summary(errors, keys) for label, keys in sets.items()}
        for name, errors in diffs.items()
        if errors
    }


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.0%}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("first", type=Path)
    parser.add_argument("second", type=Path)
    parser.add_argument("--long-ms", type=float, default=10.0)
    args = parser.parse_args(argv)
    try:
        first, second = (json.loads(p.read_text()) for p in (args.first, args.second))
    except (OSError, json.JSONDecodeError) as e:
        raise SystemExit(f"repeatability: cannot read a results file: {e}") from e
    for name, report in ((args.first, first), (args.second, second)):
        if "rows" not in report:
            raise SystemExit(f"repeatability: {name} is not a results file of fidelity_cpu.py")
    report = compare(first, second, args.long_ms / 1e3)
    for name, by_set in report.items():
        for label, s in by_set.items():
            print(
                f"{name:24s} {label:16s} {s['phases']:3d} phases: median "
                f"{_pct(s['median_abs_phases'])}, worst {_pct(s['worst_abs_phases'])}; "
                f"{s['steps']} steps: median {_pct(s['median_abs_steps'])}, worst "
                f"{_pct(s['worst_abs_steps'])}"
            )
    given = sys.argv[1:] if argv is None else argv
    out = {
        "command": "python benchmarks/repeatability.py " + " ".join(given),
        "runs": [
            {k: r.get(k) for k in ("date", "command", "profile", "total_s", "load_1min_median")}
            | {"file": p.name}
            for p, r in ((args.first, first), (args.second, second))
        ],
        "long_ms": args.long_ms,
        "report": report,
    }
    (RESULTS / "repeatability_cpu.json").write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
