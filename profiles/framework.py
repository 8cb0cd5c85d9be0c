"""Framework overhead: the host time of placeflow's engine per layer, per call, per decode step.

On a small model every op the engine runs costs its Python, `nn.Module`,
dispatcher and autograd bookkeeping, whatever its kernel does; on this CPU that
is several microseconds per op, far more than a bare elementwise add in a tight
loop (the old per-op price). This module times it the way the engine executes
it: the engine's own `Transformer`, `Sampler` and `TrainEngine`, built for the
catalogue model `REFERENCE_MODEL` with `LAYER_COUNTS` layers. The per-layer and
per-call pieces are timed at three sizes (`FORWARD_SIZES`: 1 x 4 tokens, where
the kernels are a few microseconds each, 8 x 32 and 32 x 32, the sizes of CPU
workers' micro-batches; `DECODE_SIZES`: decode steps of 1, 8 and 64 sequences),
one entry per size with its `num_units` (the size in units of the smallest), because much
of what the engine does beyond the priced kernels grows with the tokens
(rotary embeddings, masks, casts and the other elementwise ops that are not in
the kernel inventory of `placeflow.simulator.compute`). For each kind
(`schema.FrameworkKind`):

- per layer (layer_forward, layer_backward, layer_decode, optimizer_layer):
  the slope between the two layer counts, (t(L2) − t(L1)) / (L2 − L1);
- per call (call_forward, call_backward, decode_step, optimizer_call): the
  intercept, t(L1) − L1 · slope;
- a decode step: the slope between `DECODE_STEPS` generated tokens,
  (t(n2) − t(n1)) / (n2 − n1), which leaves out prefill and the call's setup;
- the backward: a forward plus backward less the forward;
- the optimizer: `TrainEngine.step` (gradient clipping and AdamW) with gradients set;
  and its AdamW alone (adamw_layer, adamw_call: `optimizer.step()`), the part a
  ZeRO-1/2 rank runs over its partition of the tensors only;
- the rollout load (load_layer, load_call): the actor's sync of its rollout engine
  where the layouts match (t = tg, d = 1), as `ActorEngine.sync_rollout` runs it: the
  reshard plan's walk over the tensors (`reshard_colocated`, nothing to gather) and
  the rollout model's `load_shards`, which copies each tensor in;
- the weight sync (sync_layer, sync_call): a generator set's sync of one trainer rank
  and one generator rank, as `executor.weight_sync.sync_disjoint` runs it on each side:
  the trainer packs its slices into the message, the generator allocates its shard
  and copies the message's slices into it. Both sides run in this thread over
  `_LoopbackLink`, which hands the packed message to the receive as one copy (the
  gloo message is priced by the collective entries, not here);
- ZeRO-3's FSDP2 (fsdp_layer_forward, fsdp_call_forward, fsdp_layer_backward,
  fsdp_call_backward): the same model wrapped as `TrainEngine` wraps it for zero = 3
  (`fully_shard` on each layer and on the root) over a gloo group of this one
  process (`one_rank_group`), its forward less the unwrapped forward, and its
  backward (a forward plus backward less the forward) less the unwrapped backward:
  what FSDP2's hooks, unshards, reshards and gradient reduce-scatters add per unit
  on a rank, its collectives of one rank included (what they move between ranks is
  the collective entries'), at the smallest size (the work is the weights', not the
  tokens').

The clock is this thread's CPU time (`time.thread_time`), not the wall clock:
the pieces are single-threaded host work, and CPU time leaves out the time the
thread waits for a core that other processes hold, which on a shared machine
would otherwise inflate the entries (the simulator prices core sharing
separately, `PoolSpec.cores_per_node`); on an idle core the two clocks agree.
The two layer counts are measured back to back (A, B, A, B...), so that a slow
stretch of a loaded machine falls on both; a sample is the mean of
`CALLS_PER_SAMPLE` runs, and an entry applies its formula to the pieces'
medians (p10 and p90 likewise). The measured time includes the kernels at the
size it was timed at (`reference_shape`); `placeflow.simulator.compute`
subtracts what the cost model prices for those kernels, so that they are not
counted twice. The engine's
forward runs in `Arch.compute_dtype` (fp32 on CPU) with one torch thread, as
the executor's CPU workers do.

    python -m placeflow.profiles.framework --add-to profiles/data/cpu.json

measures the kinds and replaces the file's framework entries with them.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from placeflow.cliargs import add_kinds_option
from placeflow.errors import MeasurementError
from placeflow.profiles.controller_work import CONTROLLER_KINDS
from placeflow.profiles.grid import REFERENCE_MODEL, WAKE_KINDS
from placeflow.profiles.reshard_host import RESHARD_KINDS
from placeflow.profiles.schema import (
    Entry,
    FrameworkKind,
    Op,
    Profile,
    Source,
    load_profile_file,
    op_note,
    save_profile,
    with_op_entries,
    with_some_kinds,
)
from placeflow.profiles.shared_cores import SHARED_KINDS, is_shared_entry, shared_collective_note
from placeflow.profiles.timing import summarize

log = logging.getLogger(__name__)

# The sizes the pieces are timed at, keyed by an entry's num_units (its size in units of
# the smallest): (batch, tokens per sequence) of the forward and backward pieces, and the
# sequences of a decode step. The per-layer and per-call kinds are timed at each; the
# simulator interpolates between them in tokens (`simulator.compute.framework_host_s`).
FORWARD_SIZES: dict[int, tuple[int, int]] = {1: (1, 4), 64: (8, 32), 256: (32, 32)}
DECODE_SIZES: dict[int, int] = {1: 1, 8: 8, 64: 64}
# The (forward, decode) num_units timed together in one pass, smallest first: the two
# tables must hold as many sizes (zip raises at import otherwise).
_TIMED_UNITS = tuple(zip(sorted(FORWARD_SIZES), sorted(DECODE_SIZES), strict=True))
REFERENCE_PROMPT = 3  # prompt tokens of the decode steps
LAYER_COUNTS = (2, 6)
DECODE_STEPS = (4, 20)
# The KV length of the reference decode steps' middle step (prompt + mean generated).
REFERENCE_DECODE_KV = REFERENCE_PROMPT + (DECODE_STEPS[0] + DECODE_STEPS[1]) // 2

Sampler = Callable[[int], float]  # layer count -> seconds of one run of a piece

_FORWARD_KINDS = (
    FrameworkKind.LAYER_FORWARD,
    FrameworkKind.LAYER_BACKWARD,
    FrameworkKind.CALL_FORWARD,
    FrameworkKind.CALL_BACKWARD,
)
_DECODE_KINDS = (FrameworkKind.LAYER_DECODE, FrameworkKind.DECODE_STEP)
# The kinds timed per layer of the reference model (the rest: per call or per step).
LAYER_KINDS = (
    FrameworkKind.LAYER_FORWARD,
    FrameworkKind.LAYER_BACKWARD,
    FrameworkKind.LAYER_DECODE,
    FrameworkKind.OPTIMIZER_LAYER,
    FrameworkKind.ADAMW_LAYER,
    FrameworkKind.LOAD_LAYER,
    FrameworkKind.SYNC_LAYER,
    FrameworkKind.FSDP_LAYER_FORWARD,
    FrameworkKind.FSDP_LAYER_BACKWARD,
)
# The framework kinds other modules measure (besides `shared_cores`', whose note runs
# to the framework note's end), by the module that measures them: a re-measure of this
# module's kinds keeps theirs.
OTHER_MODULES_KINDS: tuple[tuple[str, tuple[FrameworkKind, ...]], ...] = (
    ("placeflow.profiles.controller_work", tuple(CONTROLLER_KINDS)),
    ("placeflow.profiles.reshard_host", tuple(RESHARD_KINDS)),
    ("placeflow.profiles.wake_calls", tuple(WAKE_KINDS)),
)
# The kinds this module measures, and the timed pieces each is computed from.
ENGINE_KINDS = tuple(
    k
    for k in FrameworkKind
    if k not in SHARED_KINDS and not any(k in kinds for _, kinds in OTHER_MODULES_KINDS)
)
_PIECES_OF: dict[FrameworkKind, tuple[str, ...]] = {
    FrameworkKind.LAYER_FORWARD: ("forward",),
    FrameworkKind.CALL_FORWARD: ("forward",),
    FrameworkKind.LAYER_BACKWARD: ("forward", "train"),
    FrameworkKind.CALL_BACKWARD: ("forward", "train"),
    FrameworkKind.LAYER_DECODE: ("decode_short", "decode_long"),
    FrameworkKind.DECODE_STEP: ("decode_short", "decode_long"),
    FrameworkKind.OPTIMIZER_LAYER: ("step",),
    FrameworkKind.OPTIMIZER_CALL: ("step",),
    FrameworkKind.ADAMW_LAYER: ("adamw",),
    FrameworkKind.ADAMW_CALL: ("adamw",),
    FrameworkKind.LOAD_LAYER: ("load",),
    FrameworkKind.LOAD_CALL: ("load",),
    FrameworkKind.SYNC_LAYER: ("sync",),
    FrameworkKind.SYNC_CALL: ("sync",),
    FrameworkKind.FSDP_LAYER_FORWARD: ("forward", "fsdp_forward"),
    FrameworkKind.FSDP_CALL_FORWARD: ("forward", "fsdp_forward"),
    FrameworkKind.FSDP_LAYER_BACKWARD: ("forward", "train", "fsdp_forward", "fsdp_train"),
    FrameworkKind.FSDP_CALL_BACKWARD: ("forward", "train", "fsdp_forward", "fsdp_train"),
}
# The pieces that wrap the model in FSDP2, which needs a process group (`one_rank_group`).
_FSDP_PIECES = frozenset({"fsdp_forward", "fsdp_train"})


def measured_units(kind: FrameworkKind) -> tuple[int, ...]:
    """The num_units this module times `kind` at (1 for the optimizer's kinds, whose
    size is the parameters, priced by the optimizer's kernel entry)."""
    if kind in _FORWARD_KINDS:
        return tuple(sorted(FORWARD_SIZES))
    if kind in _DECODE_KINDS:
        return tuple(sorted(DECODE_SIZES))
    return (1,)


def reference_shape(kind: FrameworkKind, num_units: int) -> tuple[int, int]:
    """(batch, tokens per sequence) of `kind`'s piece at `num_units`: a decode step's
    batch with one new token; the smallest size for a num_units this module does not
    time (a profile measured before the pieces were timed at several sizes)."""
    if kind in _DECODE_KINDS:
        return DECODE_SIZES.get(num_units, DECODE_SIZES[1]), 1
    return FORWARD_SIZES.get(num_units, FORWARD_SIZES[1])


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


class _LoopbackLink:
    """The weight sync's `Link` inside one thread: a send is kept until the receive,
    which copies it into the receiver's buffer (as gloo writes a message into it)."""

    def __init__(self) -> None:
        self.sent: list[torch.Tensor] = []

    def send(self, tensor: torch.Tensor, dst: int) -> None:
        self.sent.append(tensor)

    def post(self, tensor: torch.Tensor, dst: int) -> Any:
        raise NotImplementedError("the framework profiler times blocking sends only")

    def recv(self, tensor: torch.Tensor, src: int) -> None:
        tensor.copy_(self.sent.pop(0))


def _pieces(num_layers: int, size: int, names: frozenset[str]) -> dict[str, Callable[[], float]]:
    """Timers of one run of each piece in `names` for a reference model of `num_layers`
    layers, the forward and decode pieces at the `size`-th pair of `_TIMED_UNITS` (0:
    the smallest)."""
    from placeflow.catalogue import get_model
    from placeflow.executor.engines.sampler import Sampler as Decoder
    from placeflow.executor.engines.sampler import SamplingParams
    from placeflow.executor.engines.trainer import OptimConfig, TrainEngine
    from placeflow.executor.engines.transformer import Arch, Transformer, random_model
    from placeflow.executor.reshard import MemoryMeter, reshard_colocated
    from placeflow.executor.weight_sync import sync_disjoint
    from placeflow.layout import GenLayout, TrainLayout
    from placeflow.reshard_plan import (
        WEIGHT_SYNC_BUCKET_BYTES,
        GeneratorLayout,
        TinyLlama,
        plan_disjoint,
        plan_reshard,
    )

    spec = dataclasses.replace(get_model(REFERENCE_MODEL), num_layers=num_layers)
    model = random_model(spec)
    sharded = _fsdp_model(spec) if names & _FSDP_PIECES else None
    trainer = TrainEngine(model, optim=OptimConfig(lr=1e-9))
    forward_units, decode_units = _TIMED_UNITS[size]
    batch, seq = FORWARD_SIZES[forward_units]
    ids = torch.randint(0, spec.vocab_size, (batch, seq))
    mask = torch.ones_like(ids, dtype=torch.bool)
    prompts = [[1] * REFERENCE_PROMPT] * DECODE_SIZES[decode_units]
    decoder = Decoder(model, pad_id=0)
    rollout = Transformer(Arch.of(spec))
    tiny = TinyLlama.from_model_spec(spec)
    plan = plan_reshard(tiny, GenLayout(train=TrainLayout(), tg=1))
    disjoint = plan_disjoint(tiny, TrainLayout(), GeneratorLayout(), WEIGHT_SYNC_BUCKET_BYTES)
    link = _LoopbackLink()

    def forward() -> float:
        with torch.no_grad():
            return _elapsed(lambda: model(ids, mask))

    def train() -> float:
        return _elapsed(
            lambda: model(ids, mask).float().logsumexp(-1).mean().backward(),
            lambda: model.zero_grad(set_to_none=True),
        )

    def fsdp_forward() -> float:
        assert sharded is not None
        with torch.no_grad():
            return _elapsed(lambda: sharded(ids, mask))

    def fsdp_train() -> float:
        assert sharded is not None
        return _elapsed(
            lambda: sharded(ids, mask).float().logsumexp(-1).mean().backward(),
            lambda: sharded.zero_grad(set_to_none=True),
        )

    def generate(steps: int) -> float:
        params = SamplingParams(max_tokens=steps, ignore_stop=True)
        return _elapsed(lambda: decoder.generate(prompts, params, 0))

    def set_grads() -> None:
        for p in model.parameters():
            p.grad = torch.zeros_like(p)

    def step() -> float:
        return _elapsed(trainer.step, set_grads)

    def adamw() -> float:
        # The step's AdamW alone (a plain AdamW at d = 1): what a ZeRO-1/2 rank's inner
        # optimizer runs over its partition only.
        return _elapsed(trainer.optimizer.step, set_grads)

    def sync() -> None:
        # `ActorEngine.sync_rollout` where the layouts match: nothing is gathered.
        weights, _ = reshard_colocated(plan, 0, trainer.tp_shards(), None, MemoryMeter())
        rollout.load_shards(weights)

    def weight_sync() -> None:
        # Trainer rank 0 packs and sends; generator rank 1 (sync-world rank) receives.
        sync_disjoint(disjoint, 0, trainer.tp_shards(), MemoryMeter(), link=link)
        sync_disjoint(disjoint, 1, None, MemoryMeter(), link=link)

    timers: dict[str, Callable[[], float]] = {
        "forward": forward,
        "train": train,
        "decode_short": lambda: generate(DECODE_STEPS[0]),
        "decode_long": lambda: generate(DECODE_STEPS[1]),
        "step": step,
        "adamw": adamw,
        "load": lambda: _elapsed(sync),
        "sync": lambda: _elapsed(weight_sync),
        "fsdp_forward": fsdp_forward,
        "fsdp_train": fsdp_train,
    }
    return {k: v for k, v in timers.items() if k in names}


def _fsdp_model(spec: Any) -> Any:
    """The reference model of `spec` wrapped as `TrainEngine` wraps it for zero = 3
    (`trainer.fsdp_shard`), over the process group of `one_rank_group`."""
    import torch.distributed as dist

    from placeflow.executor.engines.trainer import fsdp_shard
    from placeflow.executor.engines.transformer import random_model

    if not dist.is_initialized() or dist.get_world_size() != 1:
        raise MeasurementError(
            "framework overhead: the FSDP pieces need a process group of this one process "
            "(`framework.one_rank_group()`)"
        )
    model = random_model(spec)
    fsdp_shard(model, dist.group.WORLD)
    return model


@contextmanager
def one_rank_group() -> Iterator[None]:
    """A gloo process group of this process alone (an in-memory store) while inside,
    for the FSDP pieces; one the process already has is used as it is and kept."""
    import torch.distributed as dist

    if dist.is_initialized():
        yield
        return
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


# The pieces whose size is the weights, timed at the smallest size only.
_WEIGHT_PIECES = frozenset({"step", "adamw", "load", "sync", *_FSDP_PIECES})


def _paired_samples(
    repeats: int, warmup: int, size: int, names: frozenset[str]
) -> dict[str, tuple[list[float], list[float]]]:
    """Per piece of `names`, the times at the two layer counts, measured back to back,
    at the `size`-th size (the weights' pieces at the smallest only)."""
    if size > 0:
        names = names - _WEIGHT_PIECES
    small, large = (_pieces(n, size, names) for n in LAYER_COUNTS)
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


def measure_framework(
    *,
    repeats: int = 15,
    warmup: int = 2,
    kinds: Sequence[FrameworkKind] = ENGINE_KINDS,
    sizes: Sequence[int] | None = None,
) -> list[Entry]:
    """One entry per kind of `kinds` and size it is timed at (`measured_units`; module
    docstring; `sizes`: only those sizes' indices, 0 the smallest), one torch thread.

    A kind's median (p10, p90) is its formula applied to the medians (p10s,
    p90s) of the timed pieces: robust to the outliers of a loaded machine,
    which a difference of single samples is not.
    """
    names = frozenset(piece for k in kinds for piece in _PIECES_OF[k])
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with one_rank_group():
            return [
                e
                for size in (range(len(_TIMED_UNITS)) if sizes is None else sizes)
                for e in _entries_at(size, repeats, warmup, kinds, names)
            ]
    finally:
        torch.set_num_threads(threads)


# A size whose formulas give a non-positive time is timed again up to this many times
# in all: a kind is a difference of two timings, and one burst of other work on the
# host can flip its sign at the p10.
MAX_ATTEMPTS = 3


def _entries_at(
    size: int,
    repeats: int,
    warmup: int,
    kinds: Sequence[FrameworkKind],
    names: frozenset[str],
) -> list[Entry]:
    """The entries of `kinds` at the `size`-th size, timed again while any is not positive.

    A kind still not positive after MAX_ATTEMPTS is left out with a warning: a piece
    that two layer counts cannot tell from zero on this host (on 2026-11-27 this VM
    gave a sync's per-call part of -0.17 ms, median, in three attempts),
    which the simulator then prices as nothing (`callcosts`) or, for the engine's
    pieces, by its extra ops. Raises MeasurementError where no kind is left."""
    entries: list[Entry] = []
    bad: list[str] = []
    for _ in range(MAX_ATTEMPTS):
        t = {
            k: (_percentiles(a), _percentiles(b))
            for k, (a, b) in _paired_samples(repeats, warmup, size, names).items()
        }
        quantiles = [_kinds_at(t, q) for q in range(3)]
        entries, bad = [], []
        for kind in (k for k in quantiles[0] if k in kinds):
            p10, median, p90 = sorted(qs[kind] for qs in quantiles)
            if p10 <= 0:
                bad.append(f"{kind.value} ({p10 * 1e3:.3f} ms at p10, {median * 1e3:.3f} median)")
                continue
            entries.append(
                Entry(
                    op=Op.FRAMEWORK,
                    params={"kind": kind.value, "num_units": measured_units(kind)[size]},
                    median_s=median,
                    p10_s=p10,
                    p90_s=p90,
                    repeats=repeats,
                    source=Source.MEASURED,
                )
            )
        if not bad:
            return entries
    if not entries:
        raise MeasurementError(
            f"framework overhead: no piece timed positive in {MAX_ATTEMPTS} attempts "
            f"({', '.join(bad)}): the machine was too busy to tell the pieces apart; "
            "measure again on a quiet machine "
            "(`python -m placeflow.profiles.framework --add-to PROFILE`)"
        )
    log.warning(
        "framework overhead: left out %s, not positive in %d attempts (a per-call part "
        "two layer counts cannot tell from zero here, or a busy host)",
        ", ".join(bad),
        MAX_ATTEMPTS,
    )
    return entries


def _kinds_at(
    t: dict[str, tuple[tuple[float, float, float], tuple[float, float, float]]], q: int
) -> dict[FrameworkKind, float]:
    """Each kind's time from the pieces' (small, large) layer-count percentiles `t` at
    percentile index q: slopes per layer or decode step, intercepts per call."""
    (l1, l2), (n1, n2) = LAYER_COUNTS, DECODE_STEPS

    def at(piece: str) -> tuple[float, float]:
        return t[piece][0][q], t[piece][1][q]

    pairs = []
    if "forward" in t:
        fwd = at("forward")
        pairs.append(((FrameworkKind.LAYER_FORWARD, FrameworkKind.CALL_FORWARD), fwd))
        if "train" in t:
            train = at("train")
            bwd = (train[0] - fwd[0], train[1] - fwd[1])
            pairs.append(((FrameworkKind.LAYER_BACKWARD, FrameworkKind.CALL_BACKWARD), bwd))
    if "decode_short" in t:
        short, long = at("decode_short"), at("decode_long")
        decode = ((long[0] - short[0]) / (n2 - n1), (long[1] - short[1]) / (n2 - n1))
        pairs.append(((FrameworkKind.LAYER_DECODE, FrameworkKind.DECODE_STEP), decode))
    if "step" in t:
        pairs.append(((FrameworkKind.OPTIMIZER_LAYER, FrameworkKind.OPTIMIZER_CALL), at("step")))
    if "adamw" in t:
        pairs.append(((FrameworkKind.ADAMW_LAYER, FrameworkKind.ADAMW_CALL), at("adamw")))
    if "load" in t:
        pairs.append(((FrameworkKind.LOAD_LAYER, FrameworkKind.LOAD_CALL), at("load")))
    if "sync" in t:
        pairs.append(((FrameworkKind.SYNC_LAYER, FrameworkKind.SYNC_CALL), at("sync")))
    if "fsdp_forward" in t:
        # FSDP2's part of each piece: the wrapped piece less the unwrapped one.
        (f1, f2), (w1, w2) = at("forward"), at("fsdp_forward")
        forward_kinds = (FrameworkKind.FSDP_LAYER_FORWARD, FrameworkKind.FSDP_CALL_FORWARD)
        pairs.append((forward_kinds, (w1 - f1, w2 - f2)))
        if "fsdp_train" in t:
            (t1, t2), (v1, v2) = at("train"), at("fsdp_train")
            backward_kinds = (FrameworkKind.FSDP_LAYER_BACKWARD, FrameworkKind.FSDP_CALL_BACKWARD)
            pairs.append((backward_kinds, ((v1 - w1) - (t1 - f1), (v2 - w2) - (t2 - f2))))
    out = {}
    for (per_layer, per_call), (small, large) in pairs:
        slope = (large - small) / (l2 - l1)
        out[per_layer], out[per_call] = slope, small - l1 * slope
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--add-to", type=Path, required=True, help="a CPU profile JSON file")
    parser.add_argument("--repeats", type=int, default=15)
    add_kinds_option(parser, [k.value for k in ENGINE_KINDS])
    args = parser.parse_args(argv)
    kinds = [FrameworkKind(k) for k in args.kinds]
    profile = load_profile_file(args.add_to)
    from placeflow.profiles.profiler import cpu_busy_fraction

    busy = cpu_busy_fraction()
    entries = measure_framework(repeats=args.repeats, kinds=kinds)
    date = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    if set(kinds) != set(ENGINE_KINDS):
        return _save_some(profile, args.add_to, entries, kinds, date, busy)
    note = op_note(
        Op.FRAMEWORK,
        f"): measured {date} by "
        f"`python -m placeflow.profiles.framework --add-to {args.add_to}` (the engine's "
        f"own Transformer, Sampler, TrainEngine, rollout load, weight sync and FSDP2 "
        f"wrapping (a gloo group of one rank) on "
        f"{REFERENCE_MODEL}, forward and "
        f"backward at {' and '.join(f'{b}x{s}' for b, s in FORWARD_SIZES.values())} tokens "
        f"(num_units {', '.join(map(str, FORWARD_SIZES))}), decode steps of "
        f"{' and '.join(map(str, DECODE_SIZES.values()))} sequences (num_units "
        f"{', '.join(map(str, DECODE_SIZES))}), {LAYER_COUNTS} layers, paired samples, "
        f"1 torch thread; CPU busy with other work before: "
        f"{'?' if busy is None else f'{busy:.0%}'}).",
    )
    # Other modules' kinds are their own measurements: kept, and said to be.
    kept: list[Entry] = []
    for module, kinds_of in OTHER_MODULES_KINDS:
        values = {k.value for k in kinds_of}
        theirs = [e for e in profile.entries if e.op is Op.FRAMEWORK and e.params["kind"] in values]
        if theirs:
            found = ", ".join(sorted({str(e.params["kind"]) for e in theirs}))
            note += f" Kinds {found}: kept from before, measured by `python -m {module}`."
            kept.extend(theirs)
    # (so are the shared-cores entries: kept, their note with them, last: it runs to the
    # note's end, `shared_collective_note`)
    shared = [e for e in profile.entries if is_shared_entry(e)]
    if shared:
        note += shared_collective_note(profile)
    save_profile(
        with_op_entries(profile, Op.FRAMEWORK, [*entries, *shared, *kept], note),
        args.add_to,
    )
    _print(entries)
    return 0


def _save_some(
    profile: Profile,
    path: Path,
    entries: list[Entry],
    kinds: Sequence[FrameworkKind],
    date: str,
    busy: float | None,
) -> int:
    """Replace the entries of `kinds` only; the file's others are kept, and what its note
    said of them."""
    names = [k.value for k in kinds]
    text = (
        f"measured {date} by `python -m placeflow.profiles.framework --add-to {path} "
        f"--kinds {' '.join(names)}` (the engine's own code on {REFERENCE_MODEL}, "
        f"{LAYER_COUNTS} layers, paired samples, 1 torch thread; CPU busy with other work "
        f"before: {'?' if busy is None else f'{busy:.0%}'})."
    )
    save_profile(with_some_kinds(profile, Op.FRAMEWORK, entries, names, text), path)
    _print(entries)
    return 0


def _print(entries: list[Entry]) -> None:
    for e in entries:
        print(
            f"{e.params['kind']:>16} x{e.params['num_units']:<3}: "
            f"{e.median_s * 1e6:8.1f} us (p10 {e.p10_s * 1e6:.1f})"
        )


if __name__ == "__main__":
    raise SystemExit(main())
