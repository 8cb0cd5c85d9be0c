"""Gathering the results of remote worker calls: one deadline for all ranks, failures named by
role, rank and method.

`gather` is written against `RefSource`, a two-method view of Ray's object
store, so that its deadline and error mapping are tested with fakes; `RaySource`
is the real one. It returns as soon as any rank fails (fail fast): a collective
call whose peer died would otherwise wait for it until its own timeout. Calls
still running on other ranks are left as they are; after a WorkerError the
caller shuts the controller down, which kills them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

import ray
from ray.exceptions import GetTimeoutError, RayActorError, RayError, RayTaskError

from placeflow.executor.errors import FailureKind, WorkerError

R = TypeVar("R")


class RefSource(Protocol[R]):
    def wait(self, refs: Sequence[R], timeout_s: float) -> list[R]:
        """Some of `refs` that are done (at least one), or [] when `timeout_s` passes first."""
        ...

    def get(self, ref: R) -> Any:
        """The value of a done ref, or raise its failure."""
        ...


class RaySource:
    """Ray's object store as a RefSource."""

    def wait(self, refs: Sequence[ray.ObjectRef], timeout_s: float) -> list[ray.ObjectRef]:
        ready, _ = ray.wait(list(refs), num_returns=1, timeout=timeout_s)
        return ready

    def get(self, ref: ray.ObjectRef) -> Any:
        return ray.get(ref, timeout=0)


def gather(
    source: RefSource[R],
    refs: Sequence[R],
    *,
    role: str,
    call: str,
    timeout_s: float,
    ranks: Sequence[int] | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> list[Any]:
    """The results of `refs`, in order, or a WorkerError for the first that fails.

    refs[i] is a call to rank ranks[i] (default: rank i), the rank errors name.
    """
    ranks = list(range(len(refs))) if ranks is None else list(ranks)
    assert len(ranks) == len(refs)
    deadline = clock() + timeout_s
    results: list[Any] = [None] * len(refs)
    pending = dict(enumerate(refs))
    while pending:
        left_s = deadline - clock()
        done = source.wait(list(pending.values()), left_s) if left_s > 0 else []
        if not done:
            still = sorted(ranks[i] for i in pending)
            raise WorkerError(
                role=role,
                rank=still[0],
                call=call,
                kind=FailureKind.TIMEOUT,
                cause=f"no answer within {timeout_s:g} s (ranks still running: {still})",
            )
        for i in [i for i, ref in pending.items() if ref in done]:
            try:
                results[i] = source.get(pending.pop(i))
            except RayError as exc:
                raise worker_error(exc, role=role, rank=ranks[i], call=call) from exc
    return results


def worker_error(exc: RayError, *, role: str, rank: int, call: str) -> WorkerError:
    """Name a Ray failure of one rank's call: what kind, and its cause in one line."""
    if isinstance(exc, RayTaskError):
        cause = exc.cause
        kind, text = FailureKind.RAISED, f"{type(cause).__name__}: {cause}"
    elif isinstance(exc, RayActorError):
        kind, text = FailureKind.DIED, str(exc)
    elif isinstance(exc, GetTimeoutError):
        kind, text = FailureKind.TIMEOUT, str(exc)
    else:
        kind, text = FailureKind.RAY, f"{type(exc).__name__}: {exc}"
    one_line = "; ".join(line.strip() for line in text.splitlines() if line.strip())
    return WorkerError(role=role, rank=rank, call=call, kind=kind, cause=one_line)
