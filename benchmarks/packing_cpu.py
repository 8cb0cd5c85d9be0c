"""Micro-batches counted in samples vs packed by tokens: one actor update on this CPU.

One process, no Ray: the actor engine (`executor/engines/roles.py`) of tiny-llama
runs one mini-batch of GRPO's update (forward, loss, backward; no optimizer step)
on 32 samples whose response lengths are log-normal (median 48, sigma 0.8, at
most 256 tokens; prompts of 16-48 tokens). Two ways to cut it:

- samples: micro-batches of 4 samples, contiguous chunks of the batch, each as
  wide as the batch (its longest prompt and response);
- tokens: micro-batches of at most 4 x the mean sample's tokens, packed by
  `balance.token_micro_batches` and each cut to the padding its own samples need.

The two sides run interleaved, `--repeats` times, one thread each; the figure
per side is the median seconds, and the padded tokens each side computes are
counted. Gradients are checked equal (to float tolerance) on every repeat.

    python benchmarks/packing_cpu.py [--repeats 5]

Results: benchmarks/results/packing_cpu.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "packing_cpu.json"
SAMPLES, MICRO = 32, 4


def batch(seed: int) -> Any:
    from placeflow.executor.batch import Batch
    from placeflow.fields import Field

    gen = torch.Generator().manual_seed(seed)
    p_len = torch.randint(16, 49, (SAMPLES,), generator=gen)
    r_len = (48 * torch.exp(0.8 * torch.randn(SAMPLES, generator=gen))).round().clamp(1, 256)
    r_len = r_len.long()
    wp, wr = int(p_len.max()), int(r_len.max())
    p_mask = torch.arange(wp)[None] >= (wp - p_len)[:, None]
    r_mask = torch.arange(wr)[None] < r_len[:, None]
    ids = lambda w: torch.randint(1, 256, (SAMPLES, w), generator=gen)  # noqa: E731
    return Batch(
        tensors={
            Field.PROMPT: ids(wp) * p_mask,
            Field.PROMPT_MASK: p_mask,
            Field.RESPONSE: ids(wr) * r_mask,
            Field.RESPONSE_MASK: r_mask,
            Field.ROLLOUT_LOGPROBS: torch.zeros(SAMPLES, wr),
            Field.ADVANTAGES: torch.randn(SAMPLES, generator=gen),
        }
    )


def side(tokens: int, b: Any) -> tuple[float, list[torch.Tensor], int]:
    """Seconds of one update mini-batch, the gradients, and the positions computed."""
    from test_engines_device import _loss

    from placeflow.catalogue import get_model
    from placeflow.executor.engines.roles import (
        ActorEngine,
        EngineSetup,
        RoleGroups,
        UpdateConfig,
        WeightSource,
        _micro_batches,
    )
    from placeflow.executor.engines.tp import SINGLE
    from placeflow.executor.engines.trainer import OptimConfig
    from placeflow.executor.engines.transformer import Arch
    from placeflow.fields import Field

    setup = EngineSetup(
        arch=Arch.of(get_model("tiny-llama")),
        weights=WeightSource(seed=0),
        optim=OptimConfig(lr=1e-3),
        micro_batch=MICRO,
        micro_batch_tokens=tokens,
    )
    engine = ActorEngine(setup, RoleGroups(tp=SINGLE), torch.device("cpu"), gen=None, rank=0,
                         reshard_plan=None)  # fmt: skip
    loss = _loss(engine, UpdateConfig())
    micros = _micro_batches(b, setup.micro(forward=False)).batches
    positions = sum(
        len(m) * (m.tensors[Field.PROMPT].shape[1] + m.tensors[Field.RESPONSE].shape[1])
        for m in micros
    )
    start = time.perf_counter()
    engine._train_mini_batch(b, loss, {})
    seconds = time.perf_counter() - start
    return seconds, [p.grad.clone() for p in engine.model.parameters()], positions


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--results", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT / "tests"))  # the actor's loss as `update` builds it
    torch.set_num_threads(1)
    b = batch(seed=7)
    real = int(b.tensors["prompt_mask"].sum() + b.tensors["response_mask"].sum())
    budget = MICRO * -(-real // SAMPLES)
    rows: dict[str, list[float]] = {"samples": [], "tokens": []}
    positions: dict[str, int] = {}
    side(0, b)  # warm-up: first-call allocations and kernel choices
    for r in range(args.repeats):
        order = ("samples", "tokens") if r % 2 == 0 else ("tokens", "samples")
        grads: dict[str, list[torch.Tensor]] = {}
        for name in order:
            load = os.getloadavg()[0]
            s, g, n = side(budget if name == "tokens" else 0, b)
            rows[name].append(s)
            grads[name], positions[name] = g, n
            print(f"repeat {r + 1} {name}: {s:.3f} s (load {load:.2f})", file=sys.stderr)
        for x, y in zip(grads["samples"], grads["tokens"], strict=True):
            torch.testing.assert_close(x, y, rtol=1e-3, atol=1e-5)
    med = {k: statistics.median(v) for k, v in rows.items()}
    result = {
        "command": "python benchmarks/packing_cpu.py " + " ".join(argv or sys.argv[1:]),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, 1 thread per side",
        "load_avg_1m_at_end": os.getloadavg()[0],
        "samples": SAMPLES,
        "real_tokens": real,
        "token_budget": budget,
        "positions_computed": positions,
        "seconds": rows,
        "median_s": med,
        "speedup": med["samples"] / med["tokens"],
        "gradients_equal": True,
    }
    args.results.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("positions_computed", "median_s", "speedup")}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
