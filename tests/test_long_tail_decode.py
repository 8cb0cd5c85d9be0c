"""`benchmarks/long_tail_decode.py` on a small case: what it records is consistent.

Oracle: the decode batch of each step is the number of sequences whose length
is over the tokens drawn before it (the engine drops a row once it stops), and
the priced generation at those batches is no more than at the whole batch.
"""

from __future__ import annotations

import json
from pathlib import Path

from benchrun import run_benchmark


def test_long_tail_benchmark_records_each_steps_batch_and_both_prices(tmp_path: Path) -> None:
    out = tmp_path / "long_tail.json"
    args = ["--model", "tiny-llama", "--batch", "8", "--prompt", "4", "--tokens", "12"]
    args += ["--stop-every", "4", "--repeats", "1", "--out", str(out)]
    done = run_benchmark("long_tail_decode.py", args)
    assert done.returncode == 0, done.stderr
    report = json.loads(out.read_text())
    lengths = report["lengths"]
    assert len(lengths) == 8 and len(set(lengths)) > 1  # rows stopped at different steps
    want = [sum(n > k for n in lengths) for k in range(1, max(lengths))]
    assert report["decode_batches"] == want
    assert report["command"].endswith(" ".join(args))
    priced, every_row = report["priced_generate_s"], report["priced_generate_every_row_s"]
    assert 0 < report["priced_prefill_s"] < priced <= every_row
    assert every_row <= report["priced_fixed_length_s"]
    assert report["measured_generate_s"] > 0 and report["measured_fixed_length_s"] > 0
