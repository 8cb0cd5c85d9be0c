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

Writes benchmarks/results/repeatability_cpu.json (or `--out PATH`; with the command, both runs'
dates, profiles and commands).

`--rounds FILE` takes one results file of `fidelity_cpu.py --rounds N` instead,
whose rows keep each of the N runs of a plan, and asks what the benchmark's
score can resolve when it compares the model with the median of N runs: what
a model that predicted every phase's true time exactly would score there. Each
phase (and step) is taken to run at its true time times a log-normal factor
whose spread is that of its N runs (the sample standard deviation of their
logarithms); `--draws` times (seeded), N runs of every phase are drawn, their
median scored against the true time (the true time / the median - 1, the sign
`fidelity_cpu.py` gives the model's error), and the median and the worst
|error| over the phases and over the steps taken. It reports their medians
over the draws and how often they stay within issue 17's bounds (a median of
10 % and a worst of 25 %), beside the model's own score in the file and each
run scored against the median of the others. The spread within one file's
minutes is all it sees: a host that runs slower for the whole file than when
it was profiled moves every phase alike and is not in it, so the floor is a
lower bound.

    python benchmarks/repeatability.py --rounds ROUNDS.json [--model RESIMULATED.json]
        [--draws 2000] [--seed 0]

`--model` scores the model from a `fidelity_cpu.py --resimulate` of the same runs
(whose rows do not keep the runs) instead of the rounds file's own errors.

Writes benchmarks/results/repeatability_rounds_cpu.json (or `--out PATH`; with the command and the
file's date, profile and command).

`--across FILE FILE FILE...` takes three or more results files of the same plans made
at different times (sessions, hours, VMs of this kind) and asks what the benchmark's
score resolves from one run to the next: each file's measured times (as it scored
them, the median of its rounds) against the median of the other files' times, as
`fidelity_cpu.py` scores the model (the others' median over this file's - 1), raw
and at the same speed (each time over its row's host speed, then times this file's),
beside the model's own score in each file. A model could be no closer to one run than
the other runs' own measurements are, whatever it leaves out; what moves between
sessions (the host's speed, its neighbours) is in it, which the `--rounds` floor does
not see.

    python benchmarks/repeatability.py --across A.json B.json C.json [D.json ...]

Writes benchmarks/results/repeatability_across_cpu.json (or `--out PATH`; with the command and each
file's date, profile and command).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"

Key = tuple[str, str]  # (plan, phase); phase "step" is the row's step

# Issue 17's bounds on the benchmark's score: the median and the worst |error|.
MEDIAN_BOUND = 0.10
WORST_BOUND = 0.25
LEAVE_OUT = (1, 3, 5)  # the floor's worst phase also without this many of the noisiest


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


def _summary_text(s: Mapping[str, Any]) -> str:
    """One `summary` as a line: its phases' and steps' counts, medians and worsts."""
    return (
        f"{s['phases']:3d} phases: median {_pct(s['median_abs_phases'])}, worst "
        f"{_pct(s['worst_abs_phases'])}; {s['steps']} steps: median "
        f"{_pct(s['median_abs_steps'])}, worst {_pct(s['worst_abs_steps'])}"
    )


def round_times(report: Mapping[str, Any]) -> dict[Key, list[float]]:
    """Every phase's and step's measured seconds in each run of a `fidelity_cpu.py
    --rounds N` results file (its rows' `runs`), in run order; a phase some run did not
    measure (or measured at 0) is left out."""
    out: dict[Key, list[float]] = {}
    for row in report["rows"]:
        runs = row.get("runs") or []
        if len(runs) < 2:
            continue
        keys = {ph for run in runs for ph in run["phases"]}
        for phase in sorted(keys):
            times = [run["phases"].get(phase) for run in runs]
            if all(t is not None and t > 0 for t in times):
                out[(row["plan"], phase)] = [float(t) for t in times]
        steps = [run.get("step_s") for run in runs]
        if all(t is not None and t > 0 for t in steps):
            out[(row["plan"], "step")] = [float(t) for t in steps]
    return out


def log_spread(times: Sequence[float]) -> float:
    """The sample standard deviation of the logarithms of one phase's run times."""
    return statistics.stdev(math.log(t) for t in times)


def _within(values: Sequence[float], bound: float) -> float:
    return sum(v <= bound for v in values) / len(values)


def noise_floor(times: Mapping[Key, Sequence[float]], *, draws: int, seed: int) -> dict[str, Any]:
    """What a model exactly right would score against the median of the runs `times`
    (`round_times`; module docstring): per phase kind ("phases", "steps") the medians
    over `draws` of the median and the worst |error|, and the share of draws within
    each bound."""
    if not times:
        raise ValueError("no plan of the file has two or more runs (fidelity_cpu.py --rounds N)")
    spreads = {k: log_spread(v) for k, v in times.items()}
    rng = random.Random(seed)
    scores: dict[str, dict[str, list[float]]] = {
        kind: {"median": [], "worst": []} for kind in ("phases", "steps")
    }
    # The worst phase without the LEAVE_OUT phases of widest spread: how much of the
    # floor's worst a handful of phases make.
    by_spread = sorted((k for k in spreads if k[1] != "step"), key=lambda k: -spreads[k])
    worst_without: dict[int, list[float]] = {k: [] for k in LEAVE_OUT if k < len(by_spread)}
    for _ in range(draws):
        errors: dict[Key, float] = {}
        for key, sigma in spreads.items():
            median = statistics.median(rng.gauss(0.0, sigma) for _ in times[key])
            errors[key] = abs(math.exp(-median) - 1)
        for kind, s in scores.items():
            errs = [e for k, e in errors.items() if (k[1] == "step") == (kind == "steps")]
            if errs:
                s["median"].append(statistics.median(errs))
                s["worst"].append(max(errs))
        for k, worsts in worst_without.items():
            worsts.append(max(errors[key] for key in by_spread[k:]))
    out: dict[str, Any] = {"draws": draws, "seed": seed}
    for kind, s in scores.items():
        keys = [k for k in spreads if (k[1] == "step") == (kind == "steps")]
        if not keys:
            continue
        both = [
            m <= MEDIAN_BOUND and w <= WORST_BOUND
            for m, w in zip(s["median"], s["worst"], strict=True)
        ]
        noisiest = max(keys, key=lambda k: spreads[k])
        out[kind] = {
            "count": len(keys),
            "median_log_spread": statistics.median(spreads[k] for k in keys),
            "noisiest": list(noisiest) + [spreads[noisiest]],
            "median_abs": statistics.median(s["median"]),
            "worst_abs": statistics.median(s["worst"]),
            "share_median_within": _within(s["median"], MEDIAN_BOUND),
            "share_worst_within": _within(s["worst"], WORST_BOUND),
            "share_both_within": sum(both) / len(both),
        }
        if kind == "phases":
            out[kind]["without_widest"] = [
                {
                    "left_out": [list(key) for key in by_spread[:k]],
                    "worst_abs": statistics.median(w),
                    "share_worst_within": _within(w, WORST_BOUND),
                }
                for k, w in worst_without.items()
            ]
    return out


def run_vs_rest(times: Mapping[Key, Sequence[float]]) -> list[dict]:
    """Each run of a `--rounds N` file (its `round_times`) scored against the median of
    the other runs of the same plan, as the benchmark scores the model (`summary`)."""
    runs = max((len(v) for v in times.values()), default=0)
    out = []
    for i in range(runs):
        errors = {
            k: v[i] / statistics.median([*v[:i], *v[i + 1 :]]) - 1
            for k, v in times.items()
            if len(v) > i
        }
        out.append(summary(errors, errors))
    return out


def rounds_report(
    report: Mapping[str, Any],
    *,
    draws: int,
    seed: int,
    model_report: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The `--rounds` report: the noise floor, each run against the rest, the model (its
    errors in `model_report`, a `--resimulate` of the same runs, where given; else the
    file's own)."""
    model = per_phase(model_report or report, "rel_error")
    times = round_times(report)
    return {
        "bounds": {"median": MEDIAN_BOUND, "worst": WORST_BOUND},
        "exact_model_against_the_median": noise_floor(times, draws=draws, seed=seed),
        "run_against_the_others": run_vs_rest(times),
        "model_against_the_median": summary(model, model),
    }


def _print_rounds(report: Mapping[str, Any]) -> None:
    floor = report["exact_model_against_the_median"]
    for kind in ("phases", "steps"):
        f = floor.get(kind)
        if f is None:
            continue
        print(
            f"exact model vs the median of the runs, {f['count']} {kind}: median "
            f"{_pct(f['median_abs'])}, worst {_pct(f['worst_abs'])}; within "
            f"{_pct(MEDIAN_BOUND)} / {_pct(WORST_BOUND)} in {_pct(f['share_median_within'])} / "
            f"{_pct(f['share_worst_within'])} of {floor['draws']} draws (both: "
            f"{_pct(f['share_both_within'])}); noisiest {f['noisiest'][0]} {f['noisiest'][1]} "
            f"(log spread {f['noisiest'][2]:.2f})"
        )
    for w in floor.get("phases", {}).get("without_widest", []):
        print(
            f"  without the {len(w['left_out'])} phases of widest spread: worst "
            f"{_pct(w['worst_abs'])}, within {_pct(WORST_BOUND)} in {_pct(w['share_worst_within'])}"
        )
    for i, s in enumerate(report["run_against_the_others"], start=1):
        print(
            f"run {i} vs the others' median: phases median {_pct(s['median_abs_phases'])}, "
            f"worst {_pct(s['worst_abs_phases'])}; steps median {_pct(s['median_abs_steps'])}, "
            f"worst {_pct(s['worst_abs_steps'])}"
        )
    m = report["model_against_the_median"]
    print(
        f"model vs the median of the runs: phases median {_pct(m['median_abs_phases'])}, worst "
        f"{_pct(m['worst_abs_phases'])}; steps median {_pct(m['median_abs_steps'])}, worst "
        f"{_pct(m['worst_abs_steps'])}"
    )


def across_report(reports: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """`--across`: for each report, the other reports' median time of each phase and step
    they all measured, scored against this report's (others / this - 1, `summary`), raw
    and at this report's host speeds (`at_same_speed`; each other time over its row's
    speed, times this row's; only the plans every report gave a speed), and the
    report's own model error over the same keys."""
    if len(reports) < 3:
        raise ValueError(f"give three or more results files, got {len(reports)}")
    times = [per_phase(r, "measured_s") for r in reports]
    speeds = [host_speeds(r) for r in reports]
    common = set.intersection(*(set(t) for t in times))
    if not common:
        raise ValueError("the files have no phase in common")
    out = []
    for i, report in enumerate(reports):
        others = [j for j in range(len(reports)) if j != i]
        raw = {k: statistics.median(times[j][k] for j in others) / times[i][k] - 1 for k in common}
        same: dict[Key, float] = {}
        for k in common:
            given = [speeds[j].get(k[0]) for j in range(len(reports))]
            known = [s for s in given if s is not None]
            if len(known) < len(given):
                continue
            scaled = [times[j][k] / known[j] * known[i] for j in others]
            same[k] = statistics.median(scaled) / times[i][k] - 1
        model = per_phase(report, "rel_error")
        out.append(
            {
                "date": report.get("date"),
                "others_median_vs_run": summary(raw, common),
                "others_median_vs_run_same_speed": summary(same, same) if same else None,
                "model_vs_run": summary(model, common),
            }
        )
    return out


def main_across(paths: Sequence[Path], given: Sequence[str], out_path: Path | None = None) -> int:
    reports = [_read(p) for p in paths]
    try:
        report = across_report(reports)
    except ValueError as e:
        raise SystemExit(f"repeatability: --across: {e}") from e
    for path, r in zip(paths, report, strict=True):
        for label, key in (
            ("others' median", "others_median_vs_run"),
            ("at same speed", "others_median_vs_run_same_speed"),
            ("model", "model_vs_run"),
        ):
            s = r[key]
            if s is None:
                continue
            print(f"{path.name:44s} {label:15s} {_summary_text(s)}")
    out = {
        "command": "python benchmarks/repeatability.py " + " ".join(given),
        "runs": [
            {k: r.get(k) for k in ("date", "command", "profile", "rounds", "total_s")}
            | {"file": p.name}
            for p, r in zip(paths, reports, strict=True)
        ],
        "bounds": {"median": MEDIAN_BOUND, "worst": WORST_BOUND},
        "report": report,
    }
    (out_path or RESULTS / "repeatability_across_cpu.json").write_text(
        json.dumps(out, indent=1) + "\n"
    )
    return 0


def _read(path: Path) -> dict[str, Any]:
    try:
        report = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise SystemExit(f"repeatability: cannot read a results file: {e}") from e
    if not isinstance(report, dict) or "rows" not in report:
        raise SystemExit(f"repeatability: {path} is not a results file of fidelity_cpu.py")
    return report


def main_rounds(
    path: Path,
    model_path: Path | None,
    draws: int,
    seed: int,
    given: Sequence[str],
    out_path: Path | None = None,
) -> int:
    source = _read(path)
    model = None if model_path is None else _read(model_path)
    if model is not None:
        missing = set(per_phase(source, "measured_s")) - set(per_phase(model, "rel_error"))
        if missing:
            some = ", ".join(f"{plan} {phase}" for plan, phase in sorted(missing)[:3])
            raise SystemExit(
                f"repeatability: {model_path} does not score {len(missing)} phases of {path} "
                f"({some}): give a --resimulate of that file"
            )
    try:
        report = rounds_report(source, draws=draws, seed=seed, model_report=model)
    except ValueError as e:
        raise SystemExit(f"repeatability: {path}: {e}") from e
    _print_rounds(report)
    out = {
        "command": "python benchmarks/repeatability.py " + " ".join(given),
        "file": path.name,
        "model_file": None if model_path is None else model_path.name,
        "run": {k: source.get(k) for k in ("date", "command", "profile", "rounds", "total_s")},
        "report": report,
    }
    (out_path or RESULTS / "repeatability_rounds_cpu.json").write_text(
        json.dumps(out, indent=1) + "\n"
    )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("first", type=Path, nargs="?")
    parser.add_argument("second", type=Path, nargs="?")
    parser.add_argument("--long-ms", type=float, default=10.0)
    parser.add_argument(
        "--rounds",
        type=Path,
        default=None,
        help="one results file of fidelity_cpu.py --rounds N: the floor under its score",
    )
    parser.add_argument(
        "--model",
        type=Path,
        default=None,
        help="with --rounds: the model's errors from this file (a --resimulate of the same runs)",
    )
    parser.add_argument(
        "--across",
        type=Path,
        nargs="+",
        default=None,
        help="three or more results files of the same plans: each against the others' median",
    )
    parser.add_argument("--draws", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="where to write the report (default benchmarks/results/repeatability_cpu.json, "
        "repeatability_rounds_cpu.json with --rounds, repeatability_across_cpu.json with "
        "--across)",
    )
    args = parser.parse_args(argv)
    given = sys.argv[1:] if argv is None else argv
    if args.across is not None:
        if args.first is not None or args.rounds is not None:
            parser.error("--across takes its files itself; give no other files")
        return main_across(args.across, given, args.out)
    if args.rounds is not None:
        if args.first is not None:
            parser.error("--rounds takes one file; give either it or two results files")
        if args.draws < 1:
            parser.error(f"--draws is how many draws of the runs: 1 or more, got {args.draws}")
        return main_rounds(args.rounds, args.model, args.draws, args.seed, given, args.out)
    if args.first is None or args.second is None:
        parser.error("give two results files of fidelity_cpu.py, or --rounds FILE")
    first, second = _read(args.first), _read(args.second)
    report = compare(first, second, args.long_ms / 1e3)
    for name, by_set in report.items():
        for label, s in by_set.items():
            print(f"{name:24s} {label:16s} {_summary_text(s)}")
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
    (args.out or RESULTS / "repeatability_cpu.json").write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
