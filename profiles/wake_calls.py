"""What each of a rank's calls costs after the rank ran its other calls and slept.

A rank of a CPU run never repeats one call back to back: an actor rank generates, then
runs the old log-probs' forward, then its update, and between them it waits while the
driver and the other sets work. Every entry of the profile was timed back to back, hot;
the `wake_call` entries (`profiles.shared_cores`) time one forward of the reference
model after that same forward and a sleep. On the Intel VM of 2026-12-02 (ad hoc, 15
pairs each, thread CPU), after 30 ms asleep the reference model's update cost 3.0 ms
more and its forward 1.2 ms; run in turn with 30 ms pauses, tiny-llama-m's generation
cost 5.8-9.1 ms more than back to back, its forward 2.6-4.0 ms, where the simulator
charged every call the reference forward's curve (1.2 ms after 30 ms in the same runs).
A pure-Python loop of the same length after the same sleeps cost nothing more (0.00-0.3
ms), and no call page-faulted more in turn than back to back: the refill is the engine's
code and data going cold, and it depends on the call and on the model's size.

This module times it as a rank runs it. On one torch thread it builds the engine's
Transformer, TrainEngine and Sampler of a model, and for each pause of `WAKE_PAUSES_MS`,
each round:

- runs each call twice back to back and times the second (hot);
- then runs the calls in turn, a generation, a forward, an update, sleeping the pause
  before each, and times each (every call after another call and a sleep, as in a run).

A call's sample is its time in turn less its hot time. The median over `ROUNDS` rounds
is a `framework` entry of kind `wake_generate`, `wake_forward` or `wake_update`,
num_units the pause in ms, on the framework profiler's reference model, and of the same
kind with `_large` on `grid.COLD_MODEL`; a pause whose median is not above 0 has no
entry (no measurable cost: the cost model reads 0 there). The cost model mixes a call's
curve between the two models by its rank's weight bytes and holds its first point back
to 0 idle, since a call right after another pays the switch
(`CostModel.call_wake_curve`); the simulator charges each model call its kind's curve by
the time its set was idle before it (`simulator.schedule`).

    python -m placeflow.profiles.wake_calls --add-to PROFILE

adds them to a CPU profile; `placeflow profile --device cpu` measures them too.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from placeflow.profiles.grid import COLD_MODEL, REFERENCE_MODEL, WAKE_KINDS, WAKE_KINDS_OF
from placeflow.profiles.schema import (
    Entry,
    add_kinds_command,
)
from placeflow.profiles.shared_cores import SHARED_COMPUTE_SHAPE, extra_entries

# The pauses (ms, the entries' num_units) before each call in turn: from a call that
# follows another at once to the gaps of a CPU run's phases.
WAKE_PAUSES_MS = (1, 3, 10, 30, 100)
ROUNDS = 20
WARMUP_CALLS = 3
# The generation timed: GEN_PROMPTS prompts of GEN_PROMPT_LEN tokens, GEN_TOKENS new
# tokens each (a small rollout's shape); the forward and the update at
# `shared_cores.SHARED_COMPUTE_SHAPE`, as the `wake_call` entries.
GEN_PROMPTS = 4
GEN_PROMPT_LEN = 8
GEN_TOKENS = 16

Call = tuple[str, Callable[[], object]]


def engine_calls(model_name: str) -> list[Call]:
    """The engine's generation, forward and update of `model_name` (random weights), as
    calls in a rank's order; the update is a forward, a backward and the optimizer's
    step, its gradients dropped after it."""
    from placeflow.catalogue import get_model
    from placeflow.executor.engines.sampler import Sampler, SamplingParams
    from placeflow.executor.engines.trainer import OptimConfig, TrainEngine
    from placeflow.executor.engines.transformer import random_model

    spec = get_model(model_name)
    model = random_model(spec)
    trainer = TrainEngine(model, optim=OptimConfig(lr=1e-9))
    sampler = Sampler(model, pad_id=0)
    ids = torch.randint(0, spec.vocab_size, SHARED_COMPUTE_SHAPE)
    mask = torch.ones_like(ids, dtype=torch.bool)
    prompts = [[1] * GEN_PROMPT_LEN] * GEN_PROMPTS
    params = SamplingParams(max_tokens=GEN_TOKENS, ignore_stop=True)

    def generate() -> None:
        sampler.generate(prompts, params, 0)

    def forward() -> None:
        with torch.no_grad():
            model(ids, mask)

    def update() -> None:
        model(ids, mask).float().logsumexp(-1).mean().backward()
        trainer.step()
        model.zero_grad(set_to_none=True)

    # Named by their call kinds (`grid.WAKE_KINDS_OF`), in a rank's order.
    return [("generate", generate), ("forward", forward), ("train", update)]


def turn_samples(
    calls: Sequence[Call],
    pauses_ms: Sequence[int],
    *,
    rounds: int,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.thread_time,
) -> dict[str, dict[int, list[float]]]:
    """Per call and pause: `rounds` differences, the call's seconds in turn with the
    others (the pause slept before each) less its seconds right after itself (hot). The
    pauses take turns within each round, so that a slow stretch of the host falls on all
    of them. `clock` is this thread's CPU time: the call's own work, not the time others
    held its core."""
    out: dict[str, dict[int, list[float]]] = {
        name: {ms: [] for ms in pauses_ms} for name, _ in calls
    }
    for _ in range(rounds):
        for ms in pauses_ms:
            hot: dict[str, float] = {}
            for name, call in calls:
                call()  # the timed one follows itself
                t0 = clock()
                call()
                hot[name] = clock() - t0
            for name, call in calls:
                sleep(ms / 1000)
                t0 = clock()
                call()
                out[name][ms].append(clock() - t0 - hot[name])
    return out


def entries_of(samples: dict[str, dict[int, list[float]]], *, large: bool) -> list[Entry]:
    """The entries of `turn_samples`' differences, of each call's kind on the reference
    model or (`large`) on `grid.COLD_MODEL`: the median by pause, p10 floored at 1 ns,
    p90; no entry where the median is not above 0."""
    out: list[Entry] = []
    for name, (small_kind, large_kind) in WAKE_KINDS_OF.items():
        if name in samples:
            out.extend(extra_entries(large_kind if large else small_kind, samples[name]))
    return out


def measure_wake_calls(*, rounds: int = ROUNDS) -> list[Entry]:
    """The six kinds' entries (module docstring): the reference model's calls, then
    `grid.COLD_MODEL`'s, on one torch thread."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        entries: list[Entry] = []
        for model_name, large in ((REFERENCE_MODEL, False), (COLD_MODEL, True)):
            calls = engine_calls(model_name)
            for _ in range(WARMUP_CALLS):
                for _, call in calls:
                    call()
            samples = turn_samples(calls, WAKE_PAUSES_MS, rounds=rounds)
            entries.extend(entries_of(samples, large=large))
    finally:
        torch.set_num_threads(threads)
    return entries


def note_text(date: str, path: Path | str) -> str:
    batch, tokens = SHARED_COMPUTE_SHAPE
    return (
        f"measured {date} by `python -m placeflow.profiles.wake_calls --add-to {path}` "
        f"(the engine's generation ({GEN_PROMPTS} prompts of {GEN_PROMPT_LEN} tokens, "
        f"{GEN_TOKENS} new), forward and update at {batch}x{tokens} tokens of "
        f"{REFERENCE_MODEL} and (_large) {COLD_MODEL}, one torch thread, run in turn "
        f"with a pause of {', '.join(map(str, WAKE_PAUSES_MS))} ms (num_units) before "
        f"each less each right after itself, {ROUNDS} rounds, thread CPU time, p10 "
        "floored at 1 ns; a pause with no measurable cost has no entry)."
    )


def main(argv: Sequence[str] | None = None) -> int:
    # (a lambda: the module's `measure_*` looked up when the command runs)
    entries = add_kinds_command(
        argv, __doc__.split("\n")[0], WAKE_KINDS, lambda: measure_wake_calls(), note_text
    )
    for e in entries:
        print(
            f"{e.params['kind']:>19} after {e.params['num_units']:>3} ms: "
            f"{e.median_s * 1e3:7.3f} ms more (p10 {e.p10_s * 1e3:.3f}, p90 {e.p90_s * 1e3:.3f})"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
