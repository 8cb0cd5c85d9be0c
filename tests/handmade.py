"""Hand-made profile entries for tests: a cost model with a framework kind's series
replaced by given times, or left out."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from placeflow.frozen import FrozenMap
from placeflow.profiles.costmodel import CostModel, Series
from placeflow.profiles.schema import FrameworkKind, Op


def with_framework(
    cm: CostModel, kind: FrameworkKind, times_s: Mapping[int, float] | None
) -> CostModel:
    """`cm` with its `framework` entries of `kind` replaced by `times_s` (seconds by
    num_units), or left out of its profile where `times_s` is None."""
    key = (Op.FRAMEWORK, (kind.value,))
    series = {k: v for k, v in cm.series.items() if k != key}
    if times_s is not None:
        units = sorted(times_s)
        series[key] = Series(
            sizes=tuple(float(u) for u in units),
            times_s=tuple(times_s[u] for u in units),
            params=tuple(FrozenMap({"kind": kind.value, "num_units": u}) for u in units),
        )
    return dataclasses.replace(cm, series=series, _memo={})
