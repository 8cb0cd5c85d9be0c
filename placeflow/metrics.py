"""The names of a run's metrics (metrics.jsonl, validation.jsonl, the loggers), and how they
combine across micro-batches and ranks.

Declared once here, below the executor that writes them and the simulator's
fidelity and the reports that read them, as `placeflow.phases` declares the
phases. Members are `str`s (their values), so records keyed by them serialise
to the same JSON as plain names.

Combining: a metric whose name ends in `_max` is a maximum (over the
micro-batches of an update, over the ranks that hold results, over the ranks
of a transfer); every other metric is a mean. An update's engine accumulates
its micro-batches with `accumulate` and `averaged`; the controller combines
the result-holding ranks with `over_ranks`.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping, Sequence
from enum import StrEnum

from placeflow.phases import Phase

MAX_SUFFIX = "_max"


class RecordKey(StrEnum):
    """The keys of one metrics.jsonl line besides its metrics."""

    STEP = "step"
    PHASES = "phases"  # Phase value -> measured seconds
    TIMELINE = "timeline"  # one record per call (executor/timeline.py)
    SAMPLES = "samples"  # a few decoded prompts, responses and rewards


class Metric(StrEnum):
    # the step, measured by the controller
    STEP_TIME_S = "step_time_s"
    TOKENS_PER_S = "tokens_per_s"
    RESPONSE_LEN_MEAN = "response_len_mean"
    EPOCH = "epoch"  # of the dataset, when the workload has one
    STALENESS = "staleness"  # updates between the generating policy and the trained one
    # scores (rule-based reward function or reward/cost models)
    REWARD_MEAN = "reward_mean"
    REWARD_STD = "reward_std"
    BASELINE_REWARD_MEAN = "baseline_reward_mean"  # ReMax's greedy responses
    COST_MEAN = "cost_mean"  # Safe-RLHF
    EXACT_MATCH = "exact_match"  # share of responses with score 1
    REWARD_ERRORS = "reward_errors"  # responses the reward function failed on
    # the advantage phase
    KL_REF = "kl_ref"  # k3 estimate of KL(policy || reference) on the batch
    LAGRANGE_MULTIPLIER = "lagrange_multiplier"  # Safe-RLHF
    # rollout against trainer logprobs
    LOGPROB_DIFF_MAX = "logprob_diff_max"
    POLICY_LAG_LOGPROB_DIFF_MAX = "policy_lag_logprob_diff_max"  # one-step-off
    # weight transfers (bytes per rank, the most over the ranks)
    RESHARD_BYTES_MAX = "reshard_bytes_max"
    RESHARD_PEAK_BYTES_MAX = "reshard_peak_bytes_max"
    WEIGHT_SYNC_BYTES_SENT_MAX = "weight_sync_bytes_sent_max"
    WEIGHT_SYNC_BYTES_MAX = "weight_sync_bytes_max"
    WEIGHT_SYNC_PEAK_BYTES_MAX = "weight_sync_peak_bytes_max"
    # k-step-off: bytes of posted weight snapshots a trainer rank holds after posting
    WEIGHT_SNAPSHOT_BYTES_MAX = "weight_snapshot_bytes_max"
    # an update (engines/roles.py), means over its micro-batches and result-holding ranks
    PG_LOSS = "pg_loss"
    KL = "kl"  # the policy loss's KL term
    CLIP_FRACTION = "clip_fraction"
    APPROX_KL = "approx_kl"
    ENTROPY = "entropy"
    GRAD_NORM = "grad_norm"
    AUX_LOSS = "aux_loss"  # a mixture of experts' load-balancing loss
    VALUE_LOSS = "value_loss"
    COST_VALUE_LOSS = "cost_value_loss"  # Safe-RLHF's critic cost head
    # validation (validation.jsonl)
    VAL_REWARD_MEAN = "val/reward_mean"
    VAL_EXACT_MATCH = "val/exact_match"
    VAL_REWARD_ERRORS = "val/reward_errors"
    VAL_NUM_PROMPTS = "val/num_prompts"
    VAL_GENERATE_S = "generate_s"  # the validation rollout's seconds
    # names other frameworks' users read (the loggers add them)
    TIMING_STEP = "timing_s/step"  # verl's name for STEP_TIME_S
    PERF_THROUGHPUT = "perf/throughput"  # NeMo-RL's and verl's: tokens/s per GPU


def reward_extra(key: str) -> str:
    """The metric of a reward function's extra dict entry `key` (its mean over the batch)."""
    return f"reward_extra/{key}"


# placeflow's phase -> verl's timing name (the loggers sum phases that share one).
VERL_TIMING: Mapping[Phase, str] = {
    Phase.GENERATE: "timing_s/gen",
    Phase.GENERATE_BASELINE: "timing_s/gen_baseline",
    Phase.RESHARD: "timing_s/weight_sync",
    Phase.WEIGHT_SYNC: "timing_s/weight_sync",
    Phase.OLD_LOGPROB: "timing_s/old_log_prob",
    Phase.REF_LOGPROB: "timing_s/ref",
    Phase.VALUES: "timing_s/values",
    Phase.COST_VALUES: "timing_s/cost_values",
    Phase.REWARD: "timing_s/reward",
    Phase.COST: "timing_s/cost",
    Phase.ADVANTAGE: "timing_s/adv",
    Phase.ACTOR_UPDATE: "timing_s/update_actor",
    Phase.CRITIC_UPDATE: "timing_s/update_critic",
}


def is_maximum(name: str) -> bool:
    """Whether metric `name` combines as a maximum (else as a mean)."""
    return name.endswith(MAX_SUFFIX)


def accumulate(sums: MutableMapping[str, float], metrics: Mapping[str, float]) -> None:
    """Add one micro-batch's `metrics` into running `sums` (maxima for `_max` names)."""
    for k, v in metrics.items():
        sums[k] = max(sums.get(k, v), v) if is_maximum(k) else sums.get(k, 0.0) + v


def averaged(sums: Mapping[str, float], count: int) -> dict[str, float]:
    """Running `sums` of `count` micro-batches as means (maxima stay maxima)."""
    return {k: v if is_maximum(k) else v / max(count, 1) for k, v in sums.items()}


def over_ranks(per_rank: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """One metrics dict from the ranks' own: maxima for `_max` names, else means."""
    return {
        k: max(m[k] for m in per_rank)
        if is_maximum(k)
        else sum(m[k] for m in per_rank) / len(per_rank)
        for k in per_rank[0]
    }
