"""The named tensors of the RL loop's Batch: declared once, read by the controller and engines.

A step's Batch starts as the rollout's output (the sequence layout below) and
gathers each call's output under its own name as the step goes; every name a
controller or an engine reads or writes is a member here, so that a typo is an
AttributeError at import, not a KeyError mid-run. Members are `str`s (their
values), so a Batch keyed by them compares, prints and pickles like one keyed
by the plain names.

Each model call is sent only the fields it reads (`call_inputs`, one table: the
controller selects a call's shard by it and the simulator prices the tensors and
bytes it makes), and answers with `call_outputs`.

Sequence layout (every tensor indexed by sample first):
  prompt_ids, prompt_mask      (B, P)  left-padded prompts
  response_ids, response_mask  (B, R)  right-padded responses
so that `cat(prompt, response)` is what the rollout's KV cache held, token for
token, and the trainer's logprobs match the rollout's. Per-token tensors below
are (B, R), aligned with the responses; per-sample ones are (B,).
"""

from __future__ import annotations

from enum import StrEnum

from placeflow.dataflow import FORWARD_PHASES, CallKind
from placeflow.phases import Phase
from placeflow.workload import Algorithm, Workload


class Field(StrEnum):
    # the generic sequence layout of `Batch.from_sequences`: which positions are real tokens
    ATTENTION_MASK = "attention_mask"

    # the rollout (engines/roles.py `completions_batch`)
    PROMPT = "prompt_ids"
    PROMPT_MASK = "prompt_mask"
    RESPONSE = "response_ids"
    RESPONSE_MASK = "response_mask"
    ROLLOUT_LOGPROBS = "rollout_logprobs"  # per token, as the rollout engine sampled them

    # what a forward call returns (the worker's `logprobs`, `values`, `scores`)
    LOGPROBS = "logprobs"  # per token
    VALUES = "values"  # per token, (B, R, 2) for Safe-RLHF's two-headed critic
    SCORES = "scores"  # per sample: a reward or cost model's score

    # the step's batch, where the controller puts each call's output
    REF_LOGPROBS = "ref_logprobs"
    OLD_LOGPROBS = "old_logprobs"
    COST_VALUES = "cost_values"  # Safe-RLHF: the critic's cost head
    COSTS = "costs"  # Safe-RLHF: the cost model's scores (SCORES holds the rewards)
    BASELINE_SCORES = "baseline_scores"  # ReMax: the greedy response's score, per sample

    # the advantage phase's output, the updates' input
    ADVANTAGES = "advantages"
    RETURNS = "returns"
    COST_RETURNS = "cost_returns"
    REF_LOGPROBS_IN_LOSS = "ref_logprobs_in_loss"  # GRPO's k3 KL term in the policy loss


# The per-token tensors, (B, R, ...) aligned with the responses: what cutting a batch's
# response padding cuts (`engines/roles.py`, micro-batches counted in tokens). ADVANTAGES
# is per token in PPO and Safe-RLHF (GAE) and per sample, (B,), in GRPO and ReMax.
PER_TOKEN = frozenset(
    {
        Field.RESPONSE,
        Field.RESPONSE_MASK,
        Field.ROLLOUT_LOGPROBS,
        Field.LOGPROBS,
        Field.VALUES,
        Field.REF_LOGPROBS,
        Field.OLD_LOGPROBS,
        Field.COST_VALUES,
        Field.ADVANTAGES,
        Field.RETURNS,
        Field.COST_RETURNS,
        Field.REF_LOGPROBS_IN_LOSS,
    }
)


# A sample's tokens in the sequence layout: what every model call reads.
SEQUENCE = (Field.PROMPT, Field.PROMPT_MASK, Field.RESPONSE, Field.RESPONSE_MASK)

# What a rollout call returns (engines/roles.py `completions_batch`).
ROLLOUT = (*SEQUENCE, Field.ROLLOUT_LOGPROBS)


def call_inputs(workload: Workload, phase: Phase, *, off_policy: bool) -> tuple[Field, ...]:
    """The fields of the step's Batch that `phase`'s model call reads, as sent to it.

    A forward call reads the sequence. The actor's update reads its advantages and
    the behaviour policy's logprobs: OLD_LOGPROBS where the step has them (re-scored
    by `old_logprob`, or the rollout's own under asynchrony, `off_policy`), else the
    rollout's, against which the update's own forward is checked; and the reference's
    logprobs where its loss has a KL term (`Workload.kl_in_loss`). The critic's
    update reads its old values and returns, per head (Safe-RLHF's cost head too).
    """
    if phase in FORWARD_PHASES:
        return SEQUENCE
    if phase is Phase.ACTOR_UPDATE:
        recomputed = workload.recomputes_old_logprobs or off_policy
        behaviour = Field.OLD_LOGPROBS if recomputed else Field.ROLLOUT_LOGPROBS
        kl = (Field.REF_LOGPROBS_IN_LOSS,) if workload.kl_in_loss else ()
        return (*SEQUENCE, behaviour, Field.ADVANTAGES, *kl)
    if phase is Phase.CRITIC_UPDATE:
        cost = (
            (Field.COST_VALUES, Field.COST_RETURNS)
            if workload.algorithm is Algorithm.SAFE_RLHF
            else ()
        )
        return (*SEQUENCE, Field.VALUES, Field.RETURNS, *cost)
    raise ValueError(f"phase {phase.value!r} is not a model call that reads the step's batch")


def call_outputs(kind: CallKind) -> int:
    """How many tensors a model call of `kind` answers with: a rollout's batch, one
    tensor from a forward call, none from an update (its metrics are floats)."""
    if kind is CallKind.GENERATE:
        return len(ROLLOUT)
    if kind is CallKind.FORWARD:
        return 1
    if kind is CallKind.TRAIN:
        return 0
    raise ValueError(f"a {kind.value} call is not a model call")
