"""`benchmarks/decode_alone.py` on a small case: what it records is consistent.

Oracle: each row's price is its prefill plus its decode (one generator alone: no
reads from memory, no graph capture on CPU), its error that price over the
measured time less one, by hand; more sequences decode at no lower price; both
models are measured at every sequence count asked for.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from benchrun import run_benchmark


def test_decode_alone_records_each_rows_measured_and_priced_generation(tmp_path: Path) -> None:
    out = tmp_path / "decode_alone.json"
    args = ["--profile", "cpu", "--prompt", "3", "--response", "4", "--seqs", "2", "4"]
    args += ["--repeats", "1", "--out", str(out)]
    done = run_benchmark("decode_alone.py", args)
    assert done.returncode == 0, done.stderr
    report = json.loads(out.read_text())
    assert report["command"].endswith(" ".join(args))
    rows = report["rows"]
    assert [(r["model"], r["seqs"]) for r in rows] == [
        ("tiny-llama", 2),
        ("tiny-llama", 4),
        ("tiny-llama-m", 2),
        ("tiny-llama-m", 4),
    ]
    for r in rows:
        assert r["measured_s"] > 0 and r["prefill_s"] > 0 and r["decode_s"] > 0
        assert r["priced_s"] == pytest.approx(r["prefill_s"] + r["decode_s"])
        assert r["rel_error"] == pytest.approx(r["priced_s"] / r["measured_s"] - 1)
        assert r["host_speed"] is None
    for small, large in (rows[:2], rows[2:]):
        assert large["decode_s"] >= small["decode_s"]
