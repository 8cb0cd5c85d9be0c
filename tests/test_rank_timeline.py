"""`benchmarks/rank_timeline.py`: a step's calls split between the driver and the ranks.

Hand-made records on one clock stand in for a run: two calls queued on the same two
ranks and one on two other ranks, every part computed by hand.
"""

from __future__ import annotations

import pytest
from rank_timeline import method_kinds, split_calls  # benchmarks/ is on the test path


def _rank(pid: str, call: str, start: float, end: float) -> dict:
    return {"pid": pid, "call": call, "start": start, "end": end, "cpu_s": end - start}


def test_each_call_splits_into_launch_spread_return_and_hand_over() -> None:
    driver = [
        {"phase": "ref_logprob", "launched": 0.000, "end": 0.030},
        {"phase": "old_logprob", "launched": 0.002, "end": 0.060},  # queued behind it
        {"phase": "values", "launched": 0.004, "end": 0.050},  # on the other set
    ]
    ranks = [
        _rank("a", "logprobs:ref", 0.001, 0.020),
        _rank("b", "logprobs:ref", 0.003, 0.025),
        _rank("a", "logprobs:actor", 0.027, 0.050),
        _rank("b", "logprobs:actor", 0.029, 0.055),
        _rank("c", "values:critic", 0.005, 0.045),
        _rank("d", "values:critic", 0.006, 0.046),
    ]
    parts = split_calls(driver, ranks)
    ref, old, values = parts["ref_logprob"], parts["old_logprob"], parts["values"]
    assert ref["to_first_s"] == pytest.approx([0.001])
    assert ref["spread_s"] == pytest.approx([0.002])
    assert ref["after_s"] == pytest.approx([0.005])
    assert ref["handover_s"] == []  # nothing ran on its ranks before it
    # Launched at 2 ms, its first rank starts at 27 ms: 25 ms behind the reference call.
    assert old["to_first_s"] == pytest.approx([0.025])
    assert old["spread_s"] == pytest.approx([0.002])
    assert old["after_s"] == pytest.approx([0.005])
    # The reference call's last rank ended at 25 ms, this call's last rank started at 29.
    assert old["handover_s"] == pytest.approx([0.004])
    assert values["to_first_s"] == pytest.approx([0.001])
    assert values["spread_s"] == pytest.approx([0.001])
    assert values["after_s"] == pytest.approx([0.004])
    assert values["handover_s"] == []


def test_safe_rlhf_s_cost_values_are_the_critic_s_second_values_call() -> None:
    driver = [
        {"phase": "values", "launched": 0.000, "end": 0.020},
        {"phase": "cost_values", "launched": 0.001, "end": 0.040},
    ]
    ranks = [_rank("c", "values:critic", 0.002, 0.018), _rank("c", "values:critic", 0.021, 0.038)]
    parts = split_calls(driver, ranks)
    assert parts["values"]["after_s"] == pytest.approx([0.002])
    assert parts["cost_values"]["handover_s"] == pytest.approx([0.003])
    assert method_kinds("cost_values") == {"values:critic"}
    assert method_kinds("generate_baseline") == {"generate"}
