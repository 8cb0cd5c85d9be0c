"""Benchmark: the cost model's roofline far beyond the profiled data, against a real GEMM.

Takes the series of the largest GEMM in the shipped CPU profile, asks the cost
model for 8x its largest token count (well past the data, so the answer comes
from the roofline anchored at the series' end), times that GEMM here with the
profile's thread count, and writes the ratio predicted / measured to
benchmarks/results/roofline_extrapolation.json. Target: within 2x. A timing
on a loaded machine is noisy, which is why this is a benchmark and not a test.

    python benchmarks/roofline_extrapolation.py
"""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path

import torch

from placeflow.profiles import ops
from placeflow.profiles.costmodel import CostModel
from placeflow.profiles.registry import load_profile
from placeflow.profiles.schema import Op
from placeflow.profiles.timing import CpuClock, time_fn

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    profile = load_profile("cpu")
    model = CostModel.fit(profile)
    gemms = profile.entries_for(Op.GEMM)
    largest = max(gemms, key=lambda e: ops.flops(Op.GEMM, e.params))
    n, k = int(largest.params["n"]), int(largest.params["k"])
    m_max = max(int(e.params["m"]) for e in gemms if (e.params["n"], e.params["k"]) == (n, k))
    m = 8 * m_max
    a, b = torch.randn(m, k), torch.randn(k, n)
    threads = int(profile.provenance.host.get("torch_threads", 2))
    torch.set_num_threads(threads)
    measured = time_fn(lambda: a @ b, CpuClock(), warmup=2, repeats=5, budget_s=20.0).median_s
    predicted = model.gemm_s(m, n, k)
    report = {
        "command": "python benchmarks/roofline_extrapolation.py",
        "date": time.strftime("%Y-%m-%d"),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "torch_threads": threads,
        "gemm": {"m": m, "n": n, "k": k, "largest_profiled_m": m_max},
        "measured_s": measured,
        "predicted_s": predicted,
        "ratio": predicted / measured,
        "within_2x": 0.5 <= predicted / measured <= 2.0,
    }
    out = ROOT / "benchmarks/results/roofline_extrapolation.json"
    out.write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
