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

It starts a local Ray instance of one CPU unless Ray is already up (then it uses that one
and leaves it running). The entries are op `dispatch`, kind `ray_call`, source measured.

    python -m placeflow.profiles.ray_roundtrip --add-to profiles/data/cpu.json

measures the factory grid's sizes and replaces the file's dispatch entries with them.
"""

from __future__ import annotations

import argparse
import datetime
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from placeflow.profiles.grid import DISPATCH_BYTES
from placeflow.profiles.schema import (
    DispatchKind,
    Entry,
    Op,
    Source,
    load_profile_file,
    op_note,
    save_profile,
    with_op_entries,
)
from placeflow.profiles.timing import summarize


class _Worker:
    """The far side of a call: unpickles the payload, answers with a small result."""

    def take(self, payload: dict[str, torch.Tensor]) -> int:
        return sum(t.numel() for t in payload.values())


def _payload(num_bytes: int) -> dict[str, torch.Tensor]:
    # Token ids and a mask, as a scoring call's shard carries (int64 and bool).
    ids = max(1, num_bytes * 8 // 9 // 8)
    return {
        "input_ids": torch.zeros(ids, dtype=torch.int64),
        "attention_mask": torch.ones(max(1, num_bytes - 8 * ids), dtype=torch.bool),
    }


def measure_dispatch(
    sizes: Sequence[int],
    *,
    warmup: int = 3,
    repeats: int = 20,
    on_point: Callable[[], None] = lambda: None,
) -> list[Entry]:
    """One `ray_call` entry per payload size in `sizes` (bytes)."""
    if not sizes:
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
        for num_bytes in sizes:
            payload = _payload(num_bytes)
            samples = []
            for i in range(warmup + repeats):
                t0 = time.perf_counter()
                ray.get(worker.take.remote(payload))
                if i >= warmup:
                    samples.append(time.perf_counter() - t0)
            t = summarize(samples, 1)
            entries.append(
                Entry(
                    op=Op.DISPATCH,
                    params={"kind": DispatchKind.RAY_CALL.value, "num_bytes": num_bytes},
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


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--add-to", type=Path, required=True, help="a profile JSON file")
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args(argv)
    profile = load_profile_file(args.add_to)
    from placeflow.profiles.profiler import cpu_busy_fraction

    busy = cpu_busy_fraction()
    entries = measure_dispatch(DISPATCH_BYTES, repeats=args.repeats)
    date = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    note = op_note(
        Op.DISPATCH,
        f", kind ray_call): measured {date} by "
        f"`python -m placeflow.profiles.ray_roundtrip --add-to {args.add_to}` "
        f"(Ray call round trips, driver wall clock; CPU busy with other work before: "
        f"{'?' if busy is None else f'{busy:.0%}'}).",
    )
    updated = with_op_entries(profile, Op.DISPATCH, entries, note)
    save_profile(updated, args.add_to)
    for e in entries:
        print(f"ray_call {e.params['num_bytes']:>10} B: {e.median_s * 1e3:.3f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
