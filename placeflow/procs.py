"""Worlds of spawned processes: start ranks, gather their messages, never hang.

The profiler's collectives and the resharding executor both run a small
torch.distributed world in processes spawned here; a gloo rank joins its world with
`join_gloo_world`. A rank function receives
`(rank, job, results)` and reports through the `results` queue:

- `("error", rank, traceback_text)` when it fails (then exits non-zero),
- `("done", rank)` when it has finished,
- any other tuple: a payload for the caller's `on_message`.

`run_ranks` returns when every rank is done, and otherwise raises the caller's
error type naming the rank and the cause: a rank that raised (its traceback),
a rank that died without a word (its exit code), or no message for
`stall_timeout_s`. The other ranks are killed first, so nothing is left running.
"""

from __future__ import annotations

import queue as queue_module
import socket
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

RankFn = Callable[[int, Any, Any], None]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (for a rendezvous)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def join_gloo_world(
    rank: int, world_size: int, port: int, *, timeout_s: float | None = None
) -> None:
    """This spawned rank in a gloo world of `world_size` met at 127.0.0.1:`port`, with one
    torch thread (W ranks on a small machine: no intra-op oversubscription); `timeout_s`
    None keeps torch.distributed's default."""
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world_size,
        timeout=None if timeout_s is None else timedelta(seconds=timeout_s),
    )


def report_rank(rank: int, results: Any, body: Callable[[], None]) -> None:
    """Run one rank's `body`, then send ("done", rank); on failure ("error", rank, tb), exit 1."""
    try:
        body()
        results.put(("done", rank))
    except BaseException:
        results.put(("error", rank, traceback.format_exc()))
        raise SystemExit(1) from None


def run_ranks(
    rank_fn: RankFn,
    job: Any,
    world_size: int,
    *,
    label: str,
    error: type[Exception],
    on_message: Callable[[tuple[Any, ...]], None],
    stall_timeout_s: float,
) -> None:
    """Spawn `world_size` ranks of `rank_fn(rank, job, results)`; see the module docstring."""
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = [
        ctx.Process(target=rank_fn, args=(rank, job, results), daemon=True, name=f"rank{rank}")
        for rank in range(world_size)
    ]
    for p in procs:
        p.start()
    grace_s = 0.0  # on any failure, kill the other ranks at once
    try:
        _collect(procs, results, label, error, on_message, stall_timeout_s)
        grace_s = 10.0  # every rank reported done: let them exit on their own
    finally:
        _stop(procs, grace_s)
        results.close()


def _collect(
    procs: list[Any],
    results: Any,
    label: str,
    error: type[Exception],
    on_message: Callable[[tuple[Any, ...]], None],
    stall_timeout_s: float,
) -> None:
    world = len(procs)
    done: set[int] = set()
    last_message = time.monotonic()
    while len(done) < world:
        try:
            msg = results.get(timeout=0.2)
        except queue_module.Empty:
            dead = [(r, p.exitcode) for r, p in enumerate(procs) if p.exitcode not in (None, 0)]
            if dead:
                raise error(_why_dead(label, world, dead, results)) from None
            if time.monotonic() - last_message > stall_timeout_s:
                raise error(
                    f"{label} (world size {world}): no progress for {stall_timeout_s:.0f} s; "
                    "ranks killed"
                ) from None
            continue
        last_message = time.monotonic()
        if msg[0] == "error":
            raise error(f"{label} rank {msg[1]} of {world} failed:\n{msg[2]}")
        if msg[0] == "done":
            done.add(msg[1])
        else:
            on_message(msg)


def _why_dead(label: str, world: int, dead: list[tuple[int, int]], results: Any) -> str:
    # A dying rank may have queued its traceback just before exiting: give the queue a moment.
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline:
        try:
            msg = results.get(timeout=0.2)
        except queue_module.Empty:
            continue
        if msg[0] == "error":
            return f"{label} rank {msg[1]} of {world} failed:\n{msg[2]}"
    rank, code = dead[0]
    return (
        f"{label} rank {rank} of {world} exited with code {code} without reporting an error "
        "(killed, or crashed in native code)"
    )


def _stop(procs: list[Any], grace_s: float) -> None:
    """Give the ranks `grace_s` to exit, then kill those still running (blocked on a dead peer)."""
    deadline = time.monotonic() + grace_s
    for p in procs:
        p.join(timeout=max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join(timeout=10.0)
