"""Framework overhead: the host time of placeflow's engine per layer, per call, per decode step.

On a small model every op the engine runs costs its Python, `nn.Module`,
dispatcher and autograd bookkeeping, whatever its kernel does; on this CPU that
is several microseconds per op, far more than a bare elementwise add in a tight
loop (the old per-op price). This module times it the way the engine executes
it: the engine's own `Transformer`, `Sampler` and `TrainEngine`, built for the
catalogue model `REFERENCE_MODEL` at `REFERENCE_BATCH` x `REFERENCE_SEQ`
tokens, where the kernels are a few microseconds each, with `LAYER_COUNTS`
layers. For each kind (`schema.FrameworkKind`):

- per layer (layer_forward, layer_backward, layer_decode, optimizer_layer):
  the slope between the two layer counts, (t(L2) − t(L1)) / (L2 − L1);
- per call (call_forward, call_backward, decode_step, optimizer_call): the
  intercept, t(L1) − L1 · slope;
- a decode step: the slope between `DECODE_STEPS` generated tokens,
  (t(n2) − t(n1)) / (n2 − n1), which leaves out prefill and the call's setup;
- the backward: a forward plus backward less the forward;
- the optimizer: `TrainEngine.step` (gradient clipping and AdamW) with gradients set.

The clock is this thread's CPU time (`time.thread_time`), not the wall clock:
the pieces are single-threaded host work, and CPU time leaves out the time the
thread waits for a core that other processes hold, which on a shared machine
would otherwise inflate the entries (the simulator prices core sharing
separately, `PoolSpec.cores_per_node`); on an idle core the two clocks agree.
The two sizes are measured back to back (A, B, A, B...), so that a slow
stretch of a loaded machine falls on both; a sample is the mean of
`CALLS_PER_SAMPLE` runs, and an entry applies its formula to the pieces'
medians (p10 and p90 likewise). The measured time includes the kernels at the
reference size; `placeflow.simulator.compute` subtracts what the cost model
prices for those kernels, so that they are not counted twice. The engine's
forward runs in `Arch.compute_dtype` (fp32 on CPU) with one torch thread, as
the executor's CPU workers do.

    python -m placeflow.profiles.framework --add-to profiles/data/cpu.json

measures the kinds and replaces the file's framework entries with them.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from placeflow.profiles.schema import (
    Entry,
    FrameworkKind,
    Op,
    Source,
    load_profile_file,
    op_note,
    save_profile,
    with_op_entries,
)
from placeflow.profiles.shared_cores import shared_collective_note
from placeflow.profiles.timing import summarize

REFERENCE_MODEL = "tiny-llama"
REFERENCE_BATCH = 1
REFERENCE_SEQ = 4  # tokens per sequence of the forward and backward
REFERENCE_PROMPT = 3  # prompt tokens of the decode steps
LAYER_COUNTS = (2, 6)
# The kinds this module measures (the shared-cores entry is `profiles.shared_cores`').
_ENGINE_KINDS = tuple(k for k in FrameworkKind if k is not FrameworkKind.SHARED_COLLECTIVE)
DECODE_STEPS = (4, 20)
# The KV length of the reference decode steps' middle step (prompt + mean generated).
REFERENCE_DECODE_KV = REFERENCE_PROMPT + (DECODE_STEPS[0] + DECODE_STEPS[1]) // 2

Sampler = Callable[[int], float]  # layer count -> seconds of one run of a piece


CALLS_PER_SAMPLE = 8  # runs averaged in one sample: a loaded machine's jitter averages out


def _elapsed(fn: Callable[[], object], prepare: Callable[[], object] = lambda: None) -> float:
    """Mean seconds of `fn` over `CALLS_PER_SAMPLE` runs, `prepare` (untimed) before each."""
    total = 0.0
    for _ in range(CALLS_PER_SAMPLE):
        prepare()
        t0 = time.thread_time()
        fn()
        total += time.thread_time() - t0
    return total / CALLS_PER_SAMPLE


def _pieces(num_layers: int) -> dict[str, Callable[[], float]]:
    """Timers of one run of each piece for a reference model of `num_layers` layers."""
    from placeflow.catalogue import get_model
    from placeflow.executor.engines.sampler import Sampler as Decoder
    from placeflow.executor.engines.sampler import SamplingParams
    from placeflow.executor.engines.trainer import OptimConfig, TrainEngine
    from placeflow.executor.engines.transformer import Arch, Transformer, random_full

    spec = dataclasses.replace(get_model(REFERENCE_MODEL), num_layers=num_layers)
    model = Transformer(Arch.of(spec))
    model.load_shards(random_full(model.arch, seed=0))
    trainer = TrainEngine(model, optim=OptimConfig(lr=1e-9))
    ids = torch.randint(0, spec.vocab_size, (REFERENCE_BATCH, REFERENCE_SEQ))
    mask = torch.ones_like(ids, dtype=torch.bool)
    prompts = [[1] * REFERENCE_PROMPT] * REFERENCE_BATCH
    decoder = Decoder(model, pad_id=0)

    def forward() -> float:
        with torch.no_grad():
            return _elapsed(lambda: model(ids, mask))

    def train() -> float:
        return _elapsed(
            lambda: model(ids, mask).float().logsumexp(-1).mean().backward(),
            lambda: model.zero_grad(set_to_none=True),
        )

    def generate(steps: int) -> float:
        params = SamplingParams(max_tokens=steps, ignore_stop=True)
        return _elapsed(lambda: decoder.generate(prompts, params, 0))

    def set_grads() -> None:
        for p in model.parameters():
            p.grad = torch.zeros_like(p)

    def step() -> float:
        return _elapsed(trainer.step, set_grads)

    return {
        "forward": forward,
        "train": train,
        "decode_short": lambda: generate(DECODE_STEPS[0]),
        "decode_long": lambda: generate(DECODE_STEPS[1]),
        "step": step,
    }


def _paired_samples(repeats: int, warmup: int) -> dict[str, tuple[list[float], list[float]]]:
    """Per piece, the times at the two layer counts, measured back to back."""
    small, large = (_pieces(n) for n in LAYER_COUNTS)
    out: dict[str, tuple[list[float], list[float]]] = {k: ([], []) for k in small}
    for i in range(warmup + repeats):
        for name in small:
            a, b = small[name](), large[name]()
            if i >= warmup:
                out[name][0].append(a)
                out[name][1].append(b)
    return out


def _percentiles(values: list[float]) -> tuple[float, float, float]:
    t = summarize(values, 1)
    return t.p10_s, t.median_s, t.p90_s


def measure_framework(*, repeats: int = 15, warmup: int = 2) -> list[Entry]:
    """One entry per `FrameworkKind` (module docstring), one torch thread.

    A kind's median (p10, p90) is its formula applied to the medians (p10s,
    p90s) of the timed pieces: robust to the outliers of a loaded machine,
    which a difference of single samples is not.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        t = {
            k: (_percentiles(a), _percentiles(b))
            for k, (a, b) in _paired_samples(repeats, warmup).items()
        }
    finally:
        torch.set_num_threads(threads)
    (l1, l2), (n1, n2) = LAYER_COUNTS, DECODE_STEPS

    def at(piece: str, q: int) -> tuple[float, float]:
        """(small, large) layer-count times of `piece` at percentile index q."""
        return t[piece][0][q], t[piece][1][q]

    def per_q(q: int) -> dict[FrameworkKind, float]:
        fwd = at("forward", q)
        train = at("train", q)
        bwd = (train[0] - fwd[0], train[1] - fwd[1])
        short, long = at("decode_short", q), at("decode_long", q)
        decode = ((long[0] - short[0]) / (n2 - n1), (long[1] - short[1]) / (n2 - n1))
        out = {}
        for (per_layer, per_call), (small, large) in (
            ((FrameworkKind.LAYER_FORWARD, FrameworkKind.CALL_FORWARD), fwd),
            ((FrameworkKind.LAYER_BACKWARD, FrameworkKind.CALL_BACKWARD), bwd),
            ((FrameworkKind.LAYER_DECODE, FrameworkKind.DECODE_STEP), decode),
            ((FrameworkKind.OPTIMIZER_LAYER, FrameworkKind.OPTIMIZER_CALL), at("step", q)),
        ):
            slope = (large - small) / (l2 - l1)
            out[per_layer], out[per_call] = slope, small - l1 * slope
        return out

    quantiles = [per_q(q) for q in range(3)]
    entries = []
    for kind in _ENGINE_KINDS:
        p10, median, p90 = sorted(qs[kind] for qs in quantiles)
        if p10 <= 0:
            raise RuntimeError(
                f"framework {kind}: a non-positive time ({p10:.2e} s) from the timed "
                "pieces; the machine was too noisy, measure again with more repeats"
            )
        entries.append(
            Entry(
                op=Op.FRAMEWORK,
                params={"kind": kind.value, "num_units": 1},
                median_s=median,
                p10_s=p10,
                p90_s=p90,
                repeats=repeats,
                source=Source.MEASURED,
            )
        )
    return entries


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--add-to", type=Path, required=True, help="a CPU profile JSON file")
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args(argv)
    profile = load_profile_file(args.add_to)
    from placeflow.profiles.profiler import cpu_busy_fraction

    busy = cpu_busy_fraction()
    entries = measure_framework(repeats=args.repeats)
    date = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    note = op_note(
        Op.FRAMEWORK,
        f"): measured {date} by "
        f"`python -m placeflow.profiles.framework --add-to {args.add_to}` (the engine's "
        f"own Transformer, Sampler and TrainEngine on {REFERENCE_MODEL} at "
        f"{REFERENCE_BATCH}x{REFERENCE_SEQ} tokens, {LAYER_COUNTS} layers, paired samples, "
        f"1 torch thread; CPU busy with other work before: "
        f"{'?' if busy is None else f'{busy:.0%}'}).",
    )
    # (the shared-cores entry is another module's measurement: kept, its note with it)
    shared = [
        e
        for e in profile.entries
        if e.op is Op.FRAMEWORK and e.params["kind"] == FrameworkKind.SHARED_COLLECTIVE.value
    ]
    if shared:
        note += shared_collective_note(profile)
    updated = with_op_entries(profile, Op.FRAMEWORK, [*entries, *shared], note)
    save_profile(updated, args.add_to)
    for e in entries:
        print(f"{e.params['kind']:>16}: {e.median_s * 1e6:8.1f} us (p10 {e.p10_s * 1e6:.1f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
