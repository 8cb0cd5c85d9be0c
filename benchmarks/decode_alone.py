"""Benchmark: the engine's generation alone against the cost model's price of it.

The CPU fidelity benchmark runs every phase inside Ray workers beside other ranks;
this script takes all of that away to test the cost model's composition of a
generation on its own: it times the built-in engine's `Sampler.generate` (prefill
and decode of n sequences of `--prompt` tokens, `--response` tokens each, stops
ignored, as the fidelity plans run) of tiny-llama and tiny-llama-m in this
process, one torch thread, thread CPU time (the median of `--repeats` after a
warm-up), and beside it `callcosts.generation_cost` of the same shape from a
profile: its prefill and decode, with the pass over weights past a core's own
cache where the profile has `cold_weights` entries. No Ray, no core sharing, no
dispatch: a difference here is the composition's (kernels, framework pieces,
cold weights), not the run's. With `--host-speed` each row is priced with the
profile brought to the host's speed checked right before and right after its
measurement (`fidelity_cpu.host_speeds`: the GEMMs' and the engine pieces'; the
2-core VM's single-thread speed moves by 1.5x within minutes).

    python benchmarks/decode_alone.py --profile PROFILE [--host-speed] [--prompt 6]
        [--response 16] [--seqs 4 8 16] [--repeats 15]
        [--out benchmarks/results/decode_alone.json]

Writes the rows (model, sequences, measured, priced with its parts, error) with
the command, the date, the load and the profile to the results file, and prints a
table.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fidelity_breakdown import _median_s, rollout_prompts
from fidelity_cpu import _bracket, cost_models_at, host_speeds

from placeflow.catalogue import get_model
from placeflow.executor.engines.roles import WeightSource
from placeflow.executor.engines.sampler import Sampler, SamplingParams
from placeflow.executor.engines.tp import SINGLE
from placeflow.executor.engines.transformer import Arch, Transformer
from placeflow.layout import GenLayout, TrainLayout
from placeflow.profiles.costmodel import CostModel
from placeflow.profiles.registry import fitted_cost_model, load_profile
from placeflow.simulator import callcosts
from placeflow.simulator.lengths import LengthModel

ROOT = Path(__file__).resolve().parents[1]
MODELS = ("tiny-llama", "tiny-llama-m")


def measure_generate_s(
    model: Transformer, seqs: int, prompt: int, response: int, repeats: int
) -> float:
    """Median thread CPU seconds of one `Sampler.generate` of `seqs` prompts of `prompt`
    tokens to exactly `response` tokens each, after one warm-up."""
    prompts = rollout_prompts(seqs, prompt)
    params = SamplingParams(max_tokens=response, ignore_stop=True)
    sampler = Sampler(model, pad_id=0)
    return _median_s(lambda: sampler.generate(prompts, params, 0), repeats)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="cpu", help="a profile name or file")
    parser.add_argument("--prompt", type=int, default=6)
    parser.add_argument("--response", type=int, default=16)
    parser.add_argument("--seqs", type=int, nargs="+", default=[4, 8, 16])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument(
        "--host-speed", action="store_true", help="price each row at the host's checked speed"
    )
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/decode_alone.json")
    args = parser.parse_args()
    torch.set_num_threads(1)
    profile = load_profile(args.profile)
    base = fitted_cost_model(args.profile)

    def speeds() -> tuple[float | None, float | None]:
        checked = host_speeds(profile)
        return checked.speed, checked.work_speed

    before = speeds() if args.host_speed else (None, None)
    load_before = os.getloadavg()[0]
    rows: list[dict[str, Any]] = []
    for name in MODELS:
        spec = get_model(name)
        arch = Arch.of(spec)
        model = Transformer(arch, tp=SINGLE, dtype=arch.compute_dtype)
        model.load_full(WeightSource().full(arch, critic=False))
        model.eval().requires_grad_(False)
        for seqs in args.seqs:
            with torch.no_grad():
                measured = measure_generate_s(model, seqs, args.prompt, args.response, args.repeats)
            cm: CostModel = base
            speed: float | None = None
            work: float | None = None
            if args.host_speed:
                # (each speed from the checks around the row, `fidelity_cpu._bracket`; a
                # first check that found none: the one after)
                after = speeds()
                (speed, _, next_speed), (work, _, next_work) = (
                    _bracket(b, a) if b is not None else (a, [b, a], a)
                    for b, a in zip(before, after, strict=True)
                )
                before = (next_speed, next_work)
                at = cost_models_at(profile, speed, "decode_alone", work)
                cm = at["*"] if at is not None else base
            shape = callcosts.GenerationShape(
                num_seqs=seqs,
                prompt_len=args.prompt,
                lengths=LengthModel(args.response),
                kv_capacity_seqs=seqs,
            )
            cost = callcosts.generation_cost(cm, spec, GenLayout(train=TrainLayout(), tg=1), shape)
            row = {
                "model": name,
                "seqs": seqs,
                "measured_s": measured,
                "priced_s": cost.time_s,
                "prefill_s": cost.detail["prefill_s"],
                "decode_s": cost.detail["decode_s"],
                "rel_error": cost.time_s / measured - 1,
                "host_speed": speed,
                "host_work_speed": work,
            }
            rows.append(row)
            print(
                f"{name:13s} {seqs:3d} seqs: measured {measured * 1e3:7.2f} ms, priced "
                f"{cost.time_s * 1e3:7.2f} ms (prefill {row['prefill_s'] * 1e3:.2f}, decode "
                f"{row['decode_s'] * 1e3:.2f}) {row['rel_error']:+.0%}"
                + (f", host {speed:.2f}x, engine {work:.2f}x" if speed and work else ""),
                flush=True,
            )
    result = {
        "command": "python " + " ".join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]]),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "profile": str(args.profile),
        "prompt": args.prompt,
        "response": args.response,
        "repeats": args.repeats,
        "host_speed": args.host_speed,
        "load_1min_before": load_before,
        "load_1min_after": os.getloadavg()[0],
        "rows": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
