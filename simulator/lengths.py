"""Response-length distributions: the survival function the generation model needs.

`survival(s)` is P(length >= s) for s = 1..max. Lengths are either fixed at the
maximum, or log-normal with a median and log-space sigma, clipped at the
maximum (the clipped mass sits at the maximum: those are the stragglers that
run until max tokens).

Step-to-step variation (asynchronous steps, `longest_quantiles`): a generation
call ends with the longest of its sequences, and that longest length is the
maximum of n draws, so it differs from batch to batch. P(longest < s) =
(1 − P(length >= s))^n ≈ exp(−n·P(length >= s)), so its quantile q is the last
step at which n·P(length >= s) >= −ln q sequences are still expected to run.
`last_step`'s rule (half a sequence left) is the quantile e^−0.5 ≈ 0.61 of it,
close to its mean (the Gumbel limit puts the mean at the quantile e^−e^−γ ≈ 0.57).
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

    def last_step(self, num_seqs: int, left: float = 0.5) -> int:
        """Decode steps until the longest of `num_seqs` sequences is expected to finish.

        The last step at which at least `left` sequences are still expected to
        run (default half a sequence): with many sequences a long tail reaches
        the maximum (stragglers). `left` = −ln q gives the quantile q of the
        longest length (module docstring).
        """
        if not self.median or num_seqs <= 0:
            return self.max_len
        lo, hi = 1, self.max_len
        while lo < hi:  # largest s with num_seqs * survival(s) >= left
            mid = (lo + hi + 1) // 2
            if num_seqs * self.survival(mid) >= left:
                lo = mid
            else:
                hi = mid - 1
        return lo


STEP_DRAWS = 8  # strata of the longest length in an unrolled asynchronous schedule
# The order the strata are drawn in, step after step: a fixed shuffle, so that long
# and short batches come in runs as they would at random (not alternating).
_DRAW_ORDER = (5, 1, 6, 7, 2, 0, 4, 3)


def longest_quantiles(draws: int = STEP_DRAWS) -> tuple[float, ...]:
    """`draws` quantiles of a batch's longest length, one per stratum (the midpoints
    (i + 1/2)/draws), in the fixed order steps draw them (`_DRAW_ORDER`)."""
    order = _DRAW_ORDER if draws == len(_DRAW_ORDER) else tuple(range(draws))
    return tuple((i + 0.5) / draws for i in order)


def tail_left(quantile: float) -> float:
    """`last_step`'s `left` for the quantile `quantile` of the longest length."""
    return -math.log(quantile)


@cache
def _mean(model: LengthModel) -> float:
    if not model.median:
        return float(model.max_len)
    return sum(model.survival(s) for s in range(1, model.max_len + 1))
