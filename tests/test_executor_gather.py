"""gather against a fake object store: results in rank order, failures named, deadline kept."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from ray.exceptions import ActorDiedError, ObjectLostError, RayTaskError

from placeflow.executor.errors import FailureKind, WorkerError
from placeflow.executor.gather import gather


class FakeClock:
    def __init__(self) -> None:
        self.now_s = 0.0

    def __call__(self) -> float:
        return self.now_s


class FakeSource:
    """Refs are names; each finishes at a scripted time with a value or an exception."""

    def __init__(self, clock: FakeClock, outcomes: dict[str, tuple[float, Any]]) -> None:
        self.clock = clock
        self.outcomes = outcomes
        self.waits: list[float] = []

    def wait(self, refs: Sequence[str], timeout_s: float) -> list[str]:
        self.waits.append(timeout_s)
        # Advance to the first ref that finishes, or to the timeout.
        first = min(self.outcomes[r][0] for r in refs)
        if first > self.clock.now_s + timeout_s:
            self.clock.now_s += timeout_s
            return []
        self.clock.now_s = max(self.clock.now_s, first)
        return [r for r in refs if self.outcomes[r][0] <= self.clock.now_s]

    def get(self, ref: str) -> Any:
        _, outcome = self.outcomes[ref]
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome


def run(outcomes: dict[str, tuple[float, Any]], timeout_s: float = 10.0) -> list[Any]:
    clock = FakeClock()
    source = FakeSource(clock, outcomes)
    return gather(
        source, list(outcomes), role="actor", call="compute_work", timeout_s=timeout_s, clock=clock
    )


def test_results_come_back_in_rank_order_whatever_finishes_first():
    assert run({"r0": (3.0, "a"), "r1": (1.0, "b"), "r2": (2.0, "c")}) == ["a", "b", "c"]
    assert run({}) == []


def test_a_raising_worker_is_named_with_its_cause():
    task_error = RayTaskError("compute_work", "Traceback ...", ValueError("bad shard"))
    with pytest.raises(WorkerError) as info:
        run({"r0": (1.0, "ok"), "r1": (2.0, task_error), "r2": (1.0, "ok")})
    err = info.value
    assert (err.role, err.rank, err.call, err.kind) == ("actor", 1, "compute_work", "raised")
    assert err.cause == "ValueError: bad shard"
    assert str(err) == "actor rank 1 failed in compute_work: raised: ValueError: bad shard"
    assert isinstance(err.__cause__, RayTaskError)


def test_a_dead_worker_fails_fast_without_waiting_for_the_others():
    clock = FakeClock()
    source = FakeSource(clock, {"r0": (100.0, "slow"), "r1": (0.5, ActorDiedError())})
    with pytest.raises(WorkerError) as info:
        gather(source, ["r0", "r1"], role="ref", call="ping", timeout_s=10.0, clock=clock)
    assert (info.value.rank, info.value.kind) == (1, FailureKind.DIED)
    assert "died unexpectedly" in info.value.cause
    assert clock.now_s == 0.5


def test_no_answer_within_the_deadline_names_the_pending_ranks():
    clock = FakeClock()
    source = FakeSource(clock, {"r0": (1.0, "a"), "r1": (50.0, "b"), "r2": (60.0, "c")})
    with pytest.raises(WorkerError) as info:
        gather(source, ["r0", "r1", "r2"], role="actor", call="ping", timeout_s=5.0, clock=clock)
    err = info.value
    assert (err.rank, err.kind) == (1, FailureKind.TIMEOUT)
    assert "within 5 s" in err.cause and "[1, 2]" in err.cause
    assert clock.now_s == pytest.approx(5.0)  # one deadline for all ranks, not 5 s each
    assert source.waits == [5.0, 4.0]


def test_other_ray_failures_are_named_too():
    lost = ObjectLostError("00" * 28, None, "")
    with pytest.raises(WorkerError) as info:
        run({"r0": (1.0, lost)})
    assert info.value.kind == FailureKind.RAY
    assert "ObjectLostError" in info.value.cause
    assert "\n" not in str(info.value)
