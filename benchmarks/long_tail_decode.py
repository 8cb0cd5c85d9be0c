"""Benchmark: the built-in engine's eager decode over responses of many lengths (CPU).

The simulator prices each decode step at the sequences still running
(`simulator/callcosts._decode_sum_s`); the built-in engine's eager decode runs
so since it drops a finished row from its batch and cache
(`executor/engines/sampler.py`). This script checks the two against each other
on a long tail the engine really produces: `--batch` prompts of `--prompt`
tokens through a random-init catalogue model (`--model`, one torch thread, as a
CPU worker runs), sampled at temperature 1 with every `--stop-every`-th token id
a stop token, so that rows stop at many different steps. It records

- measured: `Sampler.generate`'s median wall time over `--repeats` after one
  warm-up (the same seed each time, so the same lengths), the prefill alone,
  the realised lengths, and the batch of every decode step (a forward
  pre-hook on the model); and, interleaved with it, the same generation with
  every row running to `--tokens` (`ignore_stop`);
- priced by the profile (`--profile`): the generation's prefill as
  `callcosts.generation_cost` prices it, plus `callcosts.decode_pass_s` at
  each step's realised batch and KV length (the sum `_decode_sum_s` integrates
  over a survival curve); the same steps with every row kept to the last one
  (what the engine ran before it dropped finished rows); and the fixed-length
  generation.

The long tail's share of the fixed-length generation, measured against priced,
checks what dropping rows saves independently of how fast the host is against
the profile's (this VM's speed moves by tens of percent from minute to minute).

Results go to benchmarks/results/long_tail_decode.json with the command, the
date and the host. Run from the repository root:

    python benchmarks/long_tail_decode.py [--model tiny-llama-m] [--batch 32]
        [--prompt 16] [--tokens 64] [--stop-every 24] [--profile cpu]
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

from placeflow.catalogue import get_model
from placeflow.executor.engines.sampler import DecodeMode, Sampler, SamplingParams
from placeflow.executor.engines.transformer import KVCache, random_model
from placeflow.layout import GenLayout, TrainLayout
from placeflow.profiles.registry import fitted_cost_model
from placeflow.simulator import callcosts
from placeflow.simulator.lengths import LengthModel
from placeflow.workload import RolloutEngine

RESULT = Path(__file__).resolve().parents[1] / "benchmarks/results/long_tail_decode.json"
SEED = 11


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny-llama-m")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--prompt", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=64, help="max new tokens")
    parser.add_argument(
        "--stop-every", type=int, default=24, help="every n-th token id stops a response"
    )
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--profile", default="cpu")
    parser.add_argument("--out", type=Path, default=RESULT)
    args = parser.parse_args()
    if min(args.batch, args.prompt, args.tokens, args.stop_every, args.repeats) < 1:
        parser.error("--batch, --prompt, --tokens, --stop-every and --repeats are 1 or more")

    torch.set_num_threads(1)
    spec = get_model(args.model)
    model = random_model(spec).eval()
    sampler = Sampler(model, pad_id=0, decode=DecodeMode.DYNAMIC)
    stops = tuple(range(args.stop_every - 1, spec.vocab_size, args.stop_every))
    params = SamplingParams(temperature=1.0, max_tokens=args.tokens, stop_ids=stops)
    prompts = [[1 + (i + j) % (spec.vocab_size - 1) for j in range(args.prompt)] for i in
               range(args.batch)]  # fmt: skip

    batches: list[int] = []
    hook = model.register_forward_pre_hook(lambda _m, a: batches.append(int(a[0].shape[0])))
    completions = sampler.generate(prompts, params, SEED)
    hook.remove()
    lengths = [len(c.token_ids) for c in completions]
    decode_batches = batches[1:]  # the first forward is the prefill

    fixed = dataclasses.replace(params, ignore_stop=True)
    times: list[float] = []
    fixed_times: list[float] = []
    sampler.generate(prompts, fixed, SEED)
    for _ in range(args.repeats):
        for p, out in ((params, times), (fixed, fixed_times)):
            start = time.perf_counter()
            sampler.generate(prompts, p, SEED)
            out.append(time.perf_counter() - start)
    ids = torch.tensor(prompts)
    mask = torch.ones_like(ids, dtype=torch.bool)
    prefills = []
    with torch.no_grad():
        for _ in range(args.repeats + 1):
            cache = KVCache.empty(model, args.batch, args.prompt + args.tokens, ids.device)
            start = time.perf_counter()
            model(ids, mask, cache=cache, head_from=args.prompt - 1)
            prefills.append(time.perf_counter() - start)

    cm = fitted_cost_model(args.profile)
    gen = GenLayout(train=TrainLayout(), tg=1)
    shape = callcosts.GenerationShape(
        num_seqs=args.batch,
        prompt_len=args.prompt,
        lengths=LengthModel(args.tokens),
        kv_capacity_seqs=args.batch,
        engine=RolloutEngine.BUILTIN,
    )
    prefill_priced = callcosts.generation_cost(cm, spec, gen, shape).detail["prefill_s"]

    def decode_priced(rows: list[int]) -> float:
        # Decode step k (fed token k) attends over the prompt and k tokens, as the
        # simulator's step s does.
        return sum(
            callcosts.decode_pass_s(cm, spec, gen, shape, n, args.prompt + k)
            for k, n in enumerate(rows, start=1)
        )

    running = decode_priced(decode_batches)
    full = decode_priced([args.batch] * len(decode_batches))
    every_step = decode_priced([args.batch] * (args.tokens - 1))
    measured, measured_fixed = statistics.median(times), statistics.median(fixed_times)
    share = measured / measured_fixed
    priced_share = (prefill_priced + running) / (prefill_priced + every_step)
    report = {
        "command": "python benchmarks/long_tail_decode.py " + " ".join(sys.argv[1:]),
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "host": platform.node(),
        "cpu_count": torch.get_num_threads(),
        "model": args.model,
        "batch": args.batch,
        "prompt": args.prompt,
        "max_tokens": args.tokens,
        "stop_every": args.stop_every,
        "profile": args.profile,
        "lengths": lengths,
        "mean_length": statistics.fmean(lengths),
        "decode_batches": decode_batches,
        "measured_generate_s": measured,
        "measured_prefill_s": statistics.median(prefills[1:]),
        "priced_prefill_s": prefill_priced,
        "priced_generate_s": prefill_priced + running,
        "priced_generate_every_row_s": prefill_priced + full,
        "rel_error": (prefill_priced + running) / measured - 1,
        "measured_fixed_length_s": measured_fixed,
        "priced_fixed_length_s": prefill_priced + every_step,
        "measured_share_of_fixed": share,
        "priced_share_of_fixed": priced_share,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(
        f"{args.model}, {args.batch} prompts: lengths {min(lengths)}-{max(lengths)} "
        f"(mean {report['mean_length']:.1f}); generate measured {measured * 1e3:.1f} ms, "
        f"priced {(prefill_priced + running) * 1e3:.1f} ms ({report['rel_error']:+.0%}); "
        f"every row to the end priced {(prefill_priced + full) * 1e3:.1f} ms; "
        f"share of the fixed-length generation measured {share:.2f}, priced {priced_share:.2f}"
    )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
