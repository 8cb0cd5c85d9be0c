"""Metric names and how they combine: hand-computed micro-batch and rank aggregates."""

from __future__ import annotations

import json

import pytest

from placeflow.metrics import Metric, accumulate, averaged, is_maximum, over_ranks


def test_micro_batches_average_and_maxima_stay_maxima() -> None:
    sums: dict[str, float] = {}
    accumulate(sums, {Metric.PG_LOSS: 1.0, Metric.LOGPROB_DIFF_MAX: 0.5})
    accumulate(sums, {Metric.PG_LOSS: 3.0, Metric.LOGPROB_DIFF_MAX: 0.25})
    accumulate(sums, {Metric.PG_LOSS: 5.0, Metric.LOGPROB_DIFF_MAX: -1.0})
    assert averaged(sums, 3) == {"pg_loss": 3.0, "logprob_diff_max": 0.5}
    assert averaged({}, 0) == {}


def test_ranks_average_and_maxima_stay_maxima() -> None:
    per_rank = [
        {Metric.GRAD_NORM: 2.0, Metric.WEIGHT_SYNC_BYTES_MAX: 10.0},
        {Metric.GRAD_NORM: 4.0, Metric.WEIGHT_SYNC_BYTES_MAX: 30.0},
        {Metric.GRAD_NORM: 9.0, Metric.WEIGHT_SYNC_BYTES_MAX: 20.0},
    ]
    assert over_ranks(per_rank) == {"grad_norm": 5.0, "weight_sync_bytes_max": 30.0}


@pytest.mark.parametrize("metric", list(Metric))
def test_names_serialise_as_their_plain_strings(metric: Metric) -> None:
    # metrics.jsonl keys stay what they were before the names were declared
    assert json.loads(json.dumps({metric: 1.0})) == {metric.value: 1.0}
    assert is_maximum(metric) == metric.value.endswith("_max")


def test_names_are_distinct() -> None:
    # a repeated value would make a second member an alias of the first
    assert len(Metric.__members__) == len(Metric)
