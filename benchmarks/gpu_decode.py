"""Benchmark: the built-in rollout engine's generation on one GPU, piece by piece.

`benchmarks/gpu_step.py` measures a whole `generate` call inside a run; this
script takes the same model (`examples/models/llama-0.9b-byte/config.json`,
bf16, random weights) and the engine's own `Sampler` outside Ray, and times
what a generation is made of, so that the simulator's decode pricing can be
read against each piece:

- `generate_s`: one `Sampler.generate` of `--batch` prompts of `--prompt`
  tokens to exactly `--tokens` new tokens (`ignore_stop`), per decode mode
  (`DecodeMode`: graph, the engine's default on CUDA; static; dynamic);
- `prefill_s`: the prompt's forward alone (the first token's logits);
- `decode_replay_s`: one fixed-shape decode step as the engine runs it in that
  mode (a CUDA graph replay for graph), back to back without a host sync
  between steps: the device's time per step;
- `decode_synced_s`: the same with a host sync after each step, as the
  sampler's loop has where it checks stop tokens (there a count of the finished
  rows; here `bool(done.all())`, the same one read back).

Every time is the median of `--repeats` after one warm-up, by CUDA
synchronisation around wall clocks. Results go to
benchmarks/results/gpu_decode.json with the command and the device. Without a
CUDA device it says so and exits with status 2. Run from the repository root:

    python benchmarks/gpu_decode.py [--batch 32 128] [--prompt 64] [--tokens 128]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
MODEL = ROOT / "examples/models/llama-0.9b-byte/config.json"
RESULT = ROOT / "benchmarks/results/gpu_decode.json"


def timed(fn: Callable[[], object], repeats: int) -> float:
    """Median wall seconds of `fn` after one warm-up call, the device synchronised."""
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def step_s(
    model: Any,
    sampler: Any,
    ids: torch.Tensor,
    mask: torch.Tensor,
    tokens: int,
    steps: int,
    repeats: int,
    *,
    sync: bool = False,
) -> float:
    """Median seconds per decode step over `steps` steps as `sampler` runs them, each
    repeat on a fresh prefilled cache and decoder (the step writes the next slot of the
    cache, which must stay inside its capacity); `sync`: a host sync after each step."""
    from placeflow.executor.engines.transformer import KVCache

    batch, width = ids.shape
    device = torch.device("cuda")
    token = torch.ones(batch, dtype=torch.long, device=device)
    done = torch.zeros(batch, dtype=torch.bool, device=device)
    assert steps + 2 <= tokens, "the graph's warm-up and the steps must fit the cache"
    times = []
    for _ in range(repeats + 1):  # the first is a warm-up
        cache = KVCache.empty(model, batch, width + tokens, device)
        model(ids, mask, cache=cache, head_from=width - 1)
        decode = sampler._decoder(cache, batch, device)
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(steps):
            decode(token, done)
            if sync:
                bool(done.all())
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) / steps)
    return statistics.median(times[1:])


def measure(batch: int, prompt: int, tokens: int, repeats: int, steps: int) -> dict[str, Any]:
    from placeflow.executor.engines.sampler import DecodeMode, Sampler, SamplingParams, left_pad
    from placeflow.executor.engines.tp import SINGLE
    from placeflow.executor.engines.transformer import (
        Arch,
        KVCache,
        Transformer,
        random_full,
        shard_full,
    )
    from placeflow.models import model_from_hf_config

    arch = Arch.of(model_from_hf_config(MODEL))
    model = Transformer(arch, dtype=arch.compute_dtype).to("cuda")
    model.load_shards(shard_full(random_full(arch, 0), arch, SINGLE))
    model.eval()
    model.requires_grad_(False)
    gen = torch.Generator().manual_seed(0)
    prompts = torch.randint(1, arch.weights.vocab, (batch, prompt), generator=gen).tolist()
    params = SamplingParams(temperature=1.0, max_tokens=tokens, ignore_stop=True)
    out: dict[str, Any] = {"batch": batch, "prompt": prompt, "tokens": tokens, "modes": {}}
    ids, mask = left_pad(prompts, 0, "cuda")
    with torch.no_grad():

        def prefill() -> None:
            cache = KVCache.empty(model, batch, prompt + tokens, torch.device("cuda"))
            model(ids, mask, cache=cache, head_from=prompt - 1)

        out["prefill_s"] = timed(prefill, repeats)
        for mode in (DecodeMode.GRAPH, DecodeMode.STATIC, DecodeMode.DYNAMIC):
            sampler = Sampler(model, pad_id=0, decode=mode)

            def generate(s: Sampler = sampler) -> None:
                s.generate(prompts, params, 0)

            row: dict[str, float] = {"generate_s": timed(generate, repeats)}
            if mode is not DecodeMode.DYNAMIC:
                row["decode_replay_s"] = step_s(model, sampler, ids, mask, tokens, steps, repeats)
                row["decode_synced_s"] = step_s(
                    model, sampler, ids, mask, tokens, steps, repeats, sync=True
                )
            out["modes"][str(mode)] = row
            print(f"batch {batch} {mode}: {row}", flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, nargs="+", default=[32, 128])
    parser.add_argument("--prompt", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print(
            f"gpu_decode.py measures a GPU, and torch {torch.__version__} sees no CUDA device "
            "here; run it on a machine with an NVIDIA GPU and a CUDA build of torch",
            file=sys.stderr,
        )
        sys.exit(2)
    steps = min(32, args.tokens - 2)
    rows = [measure(b, args.prompt, args.tokens, args.repeats, steps) for b in args.batch]
    report = {
        "command": "python " + " ".join(["benchmarks/gpu_decode.py", *sys.argv[1:]]),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "model": str(MODEL.relative_to(ROOT)),
        "rows": rows,
    }
    RESULT.write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
