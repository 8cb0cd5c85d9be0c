"""Ray round trip: what one Ray actor call carrying a batch of tensors costs the driver.

The profile calls this per-call `dispatch` (op `dispatch`, kind `ray_call`); it is not
`executor/dispatch.py`, which decides which data each rank receives.

Every model call of a step is a controller -> worker Ray call (`worker.method.remote(shard)`)
whose arguments and result are pickled, moved through Ray's object transfer and unpickled
on the other side; on a loaded CPU host this costs milliseconds, as much as the tiny
models' kernels. `measure_dispatch` times it as the executor pays it: the driver calls a
method of a Ray actor in another process with a dict of tensors of `num_bytes` bytes
(what a `Batch` shard pickles to) and waits for its small result, one call at a time,
wall clock on the driver (median, p10, p90 over repeats after warm-up).

A call to a set of R ranks is R such calls, and the driver makes them one after
another: it pickles and submits every rank's arguments before the last rank starts,
and unpickles every rank's result before it has the call's output. Two more kinds
time the driver's own share of each (kinds `ray_launch`: `.remote()` until it returns,
with the arguments of `num_bytes`; `ray_get`: `ray.get` of a result of `num_bytes` that
is already in the driver's object store), so that the simulator can price the R − 1
launches and gets that one round trip does not cover.

Those three carry two tensors (token ids and a mask), but a call's arguments and
result are dicts of as many tensors as it reads or answers (`placeflow.fields`),
each pickled and moved on its own. Three more kinds (`ray_call_tensor`,
`ray_launch_tensor`, `ray_get_tensor`) time what one more tensor adds to each:
the same call with 2 + 16 tensors of 64 bytes and with 2, alternated, each pair's
difference over 16 (median, p10, p90 over the pairs), at `num_bytes` 64.
`measure_dispatch(kinds=...)` measures any of the six kinds.

It starts a local Ray instance of one CPU unless Ray is already up (then it uses that one
and leaves it running). The entries are op `dispatch`, source measured.

    python -m placeflow.profiles.ray_roundtrip --add-to profiles/data/cpu.json [--kinds ...]

measures the factory grid's sizes and replaces the file's dispatch entries of those kinds
(default: all three) with them.
"""

from __future__ import annotations

import argparse
import datetime
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from placeflow.cliargs import add_kinds_option
from placeflow.profiles.grid import DISPATCH_BYTES, DISPATCH_TENSOR_BYTES
from placeflow.profiles.schema import (
    DISPATCH_ENTRY_TENSORS,
    PER_TENSOR,
    DispatchKind,
    Entry,
    Op,
    Source,
    load_profile_file,
    save_profile,
    with_some_kinds,
)
from placeflow.profiles.timing import summarize


class _Worker:
    """The far side of a call: unpickles the payload, answers with a small result."""

    def take(self, payload: dict[str, torch.Tensor]) -> int:
        return sum(t.numel() for t in payload.values())

    def give(self, num_bytes: int) -> dict[str, torch.Tensor]:
        return _payload(num_bytes)

    def give_tensors(self, count: int) -> dict[str, torch.Tensor]:
        return _tensors(count)


def _payload(num_bytes: int) -> dict[str, torch.Tensor]:
    # Token ids and a mask, as a scoring call's shard carries (int64 and bool).
    ids = max(1, num_bytes * 8 // 9 // 8)
    return {
        "input_ids": torch.zeros(ids, dtype=torch.int64),
        "attention_mask": torch.ones(max(1, num_bytes - 8 * ids), dtype=torch.bool),
    }


# The extra tensors of a per-tensor kind's larger payload (module docstring).
_EXTRA_TENSORS = 16


def _tensors(count: int) -> dict[str, torch.Tensor]:
    """`count` tensors of `DISPATCH_TENSOR_BYTES` each."""
    return {f"t{i}": torch.zeros(DISPATCH_TENSOR_BYTES, dtype=torch.uint8) for i in range(count)}


def dispatch_points(
    sizes: Sequence[int], kinds: Sequence[DispatchKind]
) -> list[tuple[DispatchKind, int]]:
    """(kind, num_bytes) of every entry `measure_dispatch` makes: each size for the three
    payload kinds, the one per-tensor size for the per-tensor kinds."""
    per_tensor = set(PER_TENSOR.values())
    return [
        (kind, size)
        for kind in kinds
        for size in ((DISPATCH_TENSOR_BYTES,) if kind in per_tensor else sizes)
    ]


def measure_dispatch(
    sizes: Sequence[int],
    *,
    warmup: int = 3,
    repeats: int = 20,
    on_point: Callable[[], None] = lambda: None,
    kinds: Sequence[DispatchKind] = (DispatchKind.RAY_CALL,),
) -> list[Entry]:
    """One entry per kind in `kinds` and payload size in `sizes` (bytes)."""
    if not sizes or not kinds:
        return []
    import ray

    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        # Any: Ray's handle types do not know the remote methods of a class made remote here.
        worker: Any = ray.remote(num_cpus=0)(_Worker).remote()
        ray.get(worker.take.remote({}))  # the worker process is up
        entries = []
        for kind, num_bytes in dispatch_points(sizes, kinds):
            if kind in PER_TENSOR.values():
                samples = _tensor_samples(worker, kind, warmup + repeats)[warmup:]
            else:
                samples = _samples(worker, kind, num_bytes, warmup + repeats)[warmup:]
            t = summarize(samples, 1)
            entries.append(
                Entry(
                    op=Op.DISPATCH,
                    params={"kind": kind.value, "num_bytes": num_bytes},
                    median_s=t.median_s,
                    p10_s=t.p10_s,
                    p90_s=t.p90_s,
                    repeats=t.repeats,
                    source=Source.MEASURED,
                )
            )
            on_point()
        ray.kill(worker)
        return entries
    finally:
        if started:
            ray.shutdown()


def _time_once(
    worker: Any, kind: DispatchKind, payload: dict[str, torch.Tensor], give: Any
) -> float:
    """One driver wall-clock time of `kind` (`ray_call`, `ray_launch` or `ray_get`): a call
    with `payload` as its arguments, or the get of the result `give()` asks for."""
    import ray

    if kind is DispatchKind.RAY_CALL:
        t0 = time.perf_counter()
        ray.get(worker.take.remote(payload))
        return time.perf_counter() - t0
    if kind is DispatchKind.RAY_LAUNCH:
        t0 = time.perf_counter()
        ref = worker.take.remote(payload)
        spent = time.perf_counter() - t0
        ray.get(ref)  # one call at a time: the next launch finds the worker idle
        return spent
    ref = give()
    ray.wait([ref], fetch_local=True)  # ready and local: only the unpickling is left
    t0 = time.perf_counter()
    ray.get(ref)
    return time.perf_counter() - t0


def _samples(worker: Any, kind: DispatchKind, num_bytes: int, count: int) -> list[float]:
    """`count` driver wall-clock times of `kind` with a payload of `num_bytes`."""
    payload = _payload(num_bytes)
    return [
        _time_once(worker, kind, payload, lambda: worker.give.remote(num_bytes))
        for _ in range(count)
    ]


def _tensor_samples(worker: Any, kind: DispatchKind, count: int) -> list[float]:
    """`count` pairs' differences, per extra tensor, of the kind's operation on
    2 + `_EXTRA_TENSORS` tensors and on 2 (module docstring)."""
    [base] = [k for k, per_tensor in PER_TENSOR.items() if per_tensor is kind]
    few = DISPATCH_ENTRY_TENSORS
    many = few + _EXTRA_TENSORS
    payloads = {few: _tensors(few), many: _tensors(many)}

    def once(n: int) -> float:
        return _time_once(worker, base, payloads[n], lambda: worker.give_tensors.remote(n))

    return [(once(many) - once(few)) / _EXTRA_TENSORS for _ in range(count)]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--add-to", type=Path, required=True, help="a profile JSON file")
    parser.add_argument("--repeats", type=int, default=20)
    add_kinds_option(parser, [k.value for k in DispatchKind])
    args = parser.parse_args(argv)
    kinds = [DispatchKind(k) for k in args.kinds]
    profile = load_profile_file(args.add_to)
    from placeflow.profiles.profiler import cpu_busy_fraction

    busy = cpu_busy_fraction()
    entries = measure_dispatch(DISPATCH_BYTES, repeats=args.repeats, kinds=kinds)
    date = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    names = [k.value for k in kinds]
    text = (
        f"measured {date} by `python -m placeflow.profiles.ray_roundtrip --add-to "
        f"{args.add_to} --kinds {' '.join(names)}` (driver wall clock; CPU busy with other "
        f"work before: {'?' if busy is None else f'{busy:.0%}'})."
    )
    save_profile(with_some_kinds(profile, Op.DISPATCH, entries, names, text), args.add_to)
    for e in entries:
        print(f"{e.params['kind']:<10} {e.params['num_bytes']:>10} B: {e.median_s * 1e3:.3f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
