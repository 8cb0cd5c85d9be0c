"""A step's measured timeline, and collecting several launched calls at once.

The controller launches calls on several worker groups before it waits for
any (`Launched`), then `StepClock.collect` waits for all of them together and
stamps each call's end when its last result arrives, so calls on disjoint
device sets overlap and are measured as they ran. Results come back through
`Controller.gather` (failures named by role, rank and call, with its deadline).

Times are taken on the driver, in seconds from the step's start. A call's
start is its launch, or the end of the previous call on the same device set if
that is later: a set's worker runs its calls one after another in launch order
(one Ray actor per device), so a call queued behind another starts when that
one ends. Controller-side work (rule-based rewards, advantages) is timed with
`span` on device set None.

A record per call goes to the step's line in metrics.jsonl as `timeline`:
{name, device_set, role, start_s, end_s}; `phases` sums the records per name.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import ray
from ray.exceptions import RayError

from placeflow.executor.controller import Controller
from placeflow.executor.groups import WorkerGroup
from placeflow.executor.worker import WorkerMethod
from placeflow.phases import Phase
from placeflow.workload import Role


def union_s(spans: Sequence[tuple[float, float]]) -> float:
    """Length of the union of intervals (start, end): overlapping time counts once,
    intervals one after another add up; 0 for none."""
    total, covered_to = 0.0, float("-inf")
    for start, end in sorted(spans):
        total += max(0.0, end - max(start, covered_to))
        covered_to = max(covered_to, end)
    return total


@dataclass(frozen=True, kw_only=True)
class TimelineRecord:
    name: str  # the phase (the simulator's vocabulary)
    device_set: int | None  # index into plan.sets; None: the controller
    role: str | None
    start_s: float  # from the step's start
    end_s: float

    def as_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "device_set": self.device_set,
            "role": self.role,
            "start_s": self.start_s,
            "end_s": self.end_s,
        }


@dataclass(kw_only=True)
class Launched:
    """A call sent to the ranks of one group and not collected yet.

    Times are `time.perf_counter()` readings, not step times: a k-step-off rollout is
    launched in one step and collected in a later one."""

    phase: Phase
    group: WorkerGroup
    refs: Sequence[Any]
    method: WorkerMethod  # the Worker method called (`Worker.update`), for error messages
    launched_at: float
    done_at: float | None = None  # when every rank finished, once seen (or serial mode)
    recorded: bool = False  # its record is in a step's timeline already


@dataclass
class StepClock:
    """The timeline of one step, measured on the driver."""

    serial: bool = False  # wait for each call at its launch: no two calls overlap
    origin: float = field(default_factory=time.perf_counter)
    records: list[TimelineRecord] = field(default_factory=list)
    set_free_s: dict[int, float] = field(default_factory=dict)  # when each set's last call ended
    watch: list[Launched] = field(default_factory=list)  # in flight for later steps (collect)

    def now(self) -> float:
        return time.perf_counter() - self.origin

    def launch(
        self, phase: Phase, group: WorkerGroup, refs: Sequence[Any], method: WorkerMethod
    ) -> Launched:
        at = time.perf_counter()
        call = Launched(phase=phase, group=group, refs=refs, method=method, launched_at=at)
        if self.serial:
            ray.wait(list(refs), num_returns=len(refs))  # failures count as done: gather names them
            call.done_at = time.perf_counter()
        return call

    def collect(self, c: Controller, calls: Sequence[Launched]) -> list[list[Any]]:
        """Every call's results (in call order), each call's end stamped as it completes.

        Calls in `watch` that this wait does not need (k-step-off rollouts of later
        steps) are stamped and recorded in this step's timeline if they finish
        meanwhile; their results are taken when they are collected.

        Fails fast as `gather` does: the first failed rank stops the wait and its call's
        `gather` raises the WorkerError that names it; past the controller's deadline the
        first unfinished call's `gather` raises the timeout.
        """
        ends = {i: call.done_at for i, call in enumerate(calls) if call.done_at is not None}
        values: dict[Any, Any] = {}
        deadline = time.monotonic() + c.timeout_s
        waiting = [r for call in calls for r in call.refs]
        watched = [w for w in self.watch if w.done_at is None and all(w is not x for x in calls)]
        seen: set[Any] = set()
        extra = [r for w in watched for r in w.refs]
        failed: int | None = None
        while waiting and failed is None and time.monotonic() < deadline:
            ready, _ = ray.wait(
                waiting + extra, num_returns=1, timeout=max(0.0, deadline - time.monotonic())
            )
            for ref in ready:
                if ref in extra:  # a watched call's rank: only its time matters here
                    extra.remove(ref)
                    seen.add(ref)
                    continue
                waiting.remove(ref)
                try:
                    values[ref] = ray.get(ref, timeout=0)
                except RayError:
                    failed = next(i for i, call in enumerate(calls) if ref in call.refs)
            now = time.perf_counter()
            for i, call in enumerate(calls):
                if i not in ends and all(r in values for r in call.refs):
                    ends[i] = now
            for w in watched:
                if w.done_at is None and all(r in seen for r in w.refs):
                    w.done_at = now
                    self._record(w, now)
        if failed is not None or waiting:
            culprit = calls[
                failed if failed is not None else min(set(range(len(calls))) - set(ends))
            ]
            c.gather(culprit.group, culprit.refs, culprit.method, timeout_s=0.01)
            raise AssertionError("gather raises for a failed or unfinished call")
        for i, call in sorted(enumerate(calls), key=lambda ic: ends[ic[0]]):
            call.done_at = ends[i]
            if not call.recorded:
                self._record(call, ends[i])
        return [[values[r] for r in call.refs] for call in calls]

    def _record(self, call: Launched, end_at: float) -> None:
        """`call`'s record in this step's timeline; a call launched in an earlier step
        (k-step-off) is drawn from this step's start."""
        call.recorded = True
        s = call.group.spec.set_index
        end_s = end_at - self.origin
        start = max(call.launched_at - self.origin, self.set_free_s.get(s, 0.0), 0.0)
        self.set_free_s[s] = end_s
        self.records.append(
            TimelineRecord(
                name=call.phase.value,
                device_set=s,
                role=call.group.role.value,
                start_s=start,
                end_s=max(start, end_s),
            )
        )

    @contextmanager
    def span(self, phase: Phase, role: Role | None = None) -> Iterator[None]:
        """Controller-side work of the step."""
        start = self.now()
        try:
            yield
        finally:
            self.records.append(
                TimelineRecord(
                    name=phase.value,
                    device_set=None,
                    role=role.value if role else None,
                    start_s=start,
                    end_s=self.now(),
                )
            )

    def phase_seconds(self) -> dict[str, float]:
        """Seconds per phase name (the `phases` of metrics.jsonl): the length of the union
        of its calls' intervals, so that one phase on two sets at once (a weight sync's
        send and receive) counts once, and calls one after another add up."""
        return {
            name: union_s([(r.start_s, r.end_s) for r in self.records if r.name == name])
            for name in dict.fromkeys(r.name for r in self.records)
        }
