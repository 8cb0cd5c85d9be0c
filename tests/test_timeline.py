"""The executor's interval arithmetic (`executor.timeline`), against hand-computed cases."""

from __future__ import annotations

import pytest

from placeflow.executor.timeline import StepClock, TimelineRecord, union_s


def test_union_counts_overlap_once_and_adds_gaps() -> None:
    assert union_s([]) == 0.0
    assert union_s([(1.0, 3.0)]) == pytest.approx(2.0)
    # [0, 2] and [1, 4] overlap over [1, 2]: 4 s; [5, 6] after a gap adds 1; [5.5, 5.8] is inside
    assert union_s([(5.0, 6.0), (1.0, 4.0), (0.0, 2.0), (5.5, 5.8)]) == pytest.approx(5.0)
    # touching intervals: no gap, no double count
    assert union_s([(0.0, 1.0), (1.0, 2.5)]) == pytest.approx(2.5)


def test_phase_seconds_is_the_union_per_name() -> None:
    def rec(name: str, dset: int | None, start: float, end: float) -> TimelineRecord:
        return TimelineRecord(name=name, device_set=dset, role=None, start_s=start, end_s=end)

    clock = StepClock(
        records=[
            rec("weight_sync", 0, 0.10, 0.30),  # send on set 0
            rec("weight_sync", 1, 0.15, 0.35),  # receive on set 1, beside it: 0.25 s in all
            rec("generate", 1, 0.35, 1.35),
            rec("generate", 1, 1.50, 1.60),  # a second call later: adds 0.10
        ]
    )
    assert clock.phase_seconds() == pytest.approx({"weight_sync": 0.25, "generate": 1.10})
    assert list(clock.phase_seconds()) == ["weight_sync", "generate"]  # first-seen order
