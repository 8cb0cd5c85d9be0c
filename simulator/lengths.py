"""Response-length distributions: the survival function the generation model needs.

`survival(s)` is P(length >= s) for s = 1..max. Lengths are either fixed at the
maximum, or log-normal with a median and log-space sigma, clipped at the
maximum (the clipped mass sits at the maximum: those are the stragglers that
run until max tokens).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache

from placeflow.workload import BatchSpec


@dataclass(frozen=True)
class LengthModel:
    max_len: int
    median: int = 0  # 0: fixed at max_len
    sigma: float = 0.0

    @staticmethod
    def of(batch: BatchSpec) -> LengthModel:
        if batch.response_len_dist == "fixed":
            return LengthModel(batch.response_len)
        return LengthModel(batch.response_len, batch.response_len_median, batch.response_len_sigma)

    def survival(self, s: float) -> float:
        """P(length >= s)."""
        if s <= 1:
            return 1.0
        if s > self.max_len:
            return 0.0
        if not self.median:
            return 1.0
        z = (math.log(s - 0.5) - math.log(self.median)) / self.sigma
        return 0.5 * math.erfc(z / math.sqrt(2.0))

    @property
    def mean(self) -> float:
        return _mean(self)

    def last_step(self, num_seqs: int) -> int:
        """Decode steps until the longest of `num_seqs` sequences is expected to finish.

        The step at which fewer than half a sequence is still expected to run:
        with many sequences a long tail reaches the maximum (stragglers).
        """
        if not self.median or num_seqs <= 0:
            return self.max_len
        lo, hi = 1, self.max_len
        while lo < hi:  # largest s with num_seqs * survival(s) >= 0.5
            mid = (lo + hi + 1) // 2
            if num_seqs * self.survival(mid) >= 0.5:
                lo = mid
            else:
                hi = mid - 1
        return lo


@cache
def _mean(model: LengthModel) -> float:
    if not model.median:
        return float(model.max_len)
    return sum(model.survival(s) for s in range(1, model.max_len + 1))
