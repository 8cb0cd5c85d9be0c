"""Micro-batches counted in tokens (sequence packing): plan keys, the cost model's
split, the executor's packing, and the exports.

Oracles: brute force over partitions for the packing of small instances; hand-computed
micro-batch counts and activation sizes for the cost model; for the engines, the
same calls with micro-batches counted in samples (outputs and gradients must agree:
packing changes how samples are grouped, never what a sample computes); verl's
config and OpenRLHF's parser for the exports.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import random
from pathlib import Path
from typing import Any

import pytest
import torch

from placeflow.api import simulate
from placeflow.catalogue import get_model
from placeflow.errors import SpecError
from placeflow.executor.balance import token_micro_batches
from placeflow.executor.batch import Batch
from placeflow.executor.engines.roles import (
    ActorEngine,
    EngineSetup,
    RoleGroups,
    ScoringEngine,
    UpdateConfig,
    WeightSource,
    _micro_batches,
    _packed,
    completions_batch,
    sample_tokens,
)
from placeflow.executor.engines.sampler import Sampler, SamplingParams
from placeflow.executor.engines.tp import SINGLE
from placeflow.executor.engines.trainer import OptimConfig
from placeflow.executor.engines.transformer import Arch, Transformer, random_full
from placeflow.export import Target, export_plan
from placeflow.fields import Field
from placeflow.layout import TrainLayout
from placeflow.plan import (
    MicroBatching,
    RoleParallelism,
    load_plan,
    plan_from_dict,
    plan_to_dict,
)
from placeflow.profiles.registry import fitted_cost_model
from placeflow.simulator import callcosts
from placeflow.workload import Role

ROOT = Path(__file__).resolve().parents[1]
PLAN = ROOT / "examples" / "plans" / "ppo-7b-colocate-h100x16.toml"
CPU = torch.device("cpu")
ARCH = Arch.of(get_model("tiny-llama"))
PROMPTS = [[5, 6, 7], [9], [1, 2, 3, 4, 5], [8, 8], [4, 4, 4, 4], [2], [3, 1, 3], [7, 7]]


# --- packing --------------------------------------------------------------------------


def _fewest_bins(tokens: list[int], budget: int) -> int:
    """Brute force: the fewest micro-batches of at most `budget` tokens."""
    n = len(tokens)
    for k in range(1, n + 1):
        for labels in itertools.product(range(k), repeat=n):
            sums = [0] * k
            for t, b in zip(tokens, labels, strict=True):
                sums[b] += t
            if max(sums) <= budget:
                return k
    return n


def test_packing_respects_the_budget_and_places_every_sample_once() -> None:
    rng = random.Random(3)
    optimal = 0
    trials = 150
    for _ in range(trials):
        n = rng.randint(1, 7)
        tokens = [rng.randint(1, 20) for _ in range(n)]
        budget = rng.randint(max(tokens), 45)
        count = rng.randint(0, 9)
        bins = token_micro_batches(tokens, budget, count)
        assert sorted(i for b in bins for i in b) == list(range(n))
        assert all(sum(tokens[i] for i in b) <= budget for b in bins)
        fewest = _fewest_bins(tokens, budget)
        assert len(bins) >= min(count, n)
        unforced = token_micro_batches(tokens, budget)
        assert len(bins) == max(len(unforced), min(count, n))
        assert fewest <= len(unforced) <= fewest + 1  # a balanced partition, not bin packing
        optimal += len(unforced) == fewest
    assert optimal >= 0.9 * trials  # measured on these instances: all 150 reach the fewest


def test_packing_refuses_a_sample_longer_than_the_budget() -> None:
    with pytest.raises(ValueError, match="a sample of 12 tokens does not fit a micro-batch of 10"):
        token_micro_batches([3, 12, 4], 10)


# --- plan keys ------------------------------------------------------------------------


def test_split_counts_micro_batches_in_tokens() -> None:
    # 16 samples of 1,000 tokens per rank, 4,096-token micro-batches: ceil(16,000 / 4,096)
    # = 4 micro-batches of 4 samples; activations for a full one of 4,096 tokens.
    assert MicroBatching(2, 4096).split(16, 1000) == (4, 4, 4096)
    # A budget above the rank's tokens: one micro-batch of all of them.
    assert MicroBatching(2, 65536).split(16, 1000) == (16, 1, 16000)
    # In samples, as before: micro-batches of 2 samples.
    assert MicroBatching(2).split(16, 1000) == (2, 8, 2000)


def test_forward_calls_take_their_own_unit_or_the_training_one() -> None:
    lay = load_plan(PLAN).parallelism[Role.ACTOR].train
    par = RoleParallelism(train=lay, micro_batch=2, micro_batch_tokens=8192)
    assert par.forward_micro == par.train_micro == MicroBatching(2, 8192)
    assert dataclasses.replace(par, forward_micro_batch=16).forward_micro == MicroBatching(16)
    fwd = dataclasses.replace(par, forward_micro_batch_tokens=32768)
    assert fwd.forward_micro == MicroBatching(2, 32768)
    assert fwd.token_budgets == (8192, 32768)
    with pytest.raises(SpecError, match="counted in samples or in tokens, give one"):
        dataclasses.replace(fwd, forward_micro_batch=16)
    with pytest.raises(SpecError, match="micro_batch_tokens must be a positive number"):
        dataclasses.replace(par, micro_batch_tokens=-1)


def _with_tokens(plan: Any, role: Role, **kw: int) -> dict[str, Any]:
    data = plan_to_dict(plan)
    data["parallelism"][role.value].update(kw)
    return data


def test_plan_files_round_trip_and_refuse_a_budget_below_the_longest_sample() -> None:
    plan = load_plan(PLAN)
    data = _with_tokens(plan, Role.ACTOR, micro_batch_tokens=8192, forward_micro_batch_tokens=16384)
    again = plan_from_dict(data, "test", ROOT)
    par = again.parallelism[Role.ACTOR]
    assert (par.micro_batch_tokens, par.forward_micro_batch_tokens) == (8192, 16384)
    assert plan_to_dict(again)["parallelism"]["actor"]["micro_batch_tokens"] == 8192
    assert "micro_batch_tokens" not in plan_to_dict(plan)["parallelism"]["actor"]  # same hash
    longest = plan.workload.batch.prompt_len + plan.workload.batch.response_len
    bad = _with_tokens(plan, Role.REF, forward_micro_batch_tokens=longest - 1)
    with pytest.raises(SpecError, match=f"set micro_batch_tokens .* to at least {longest}"):
        plan_from_dict(bad, "test", ROOT)


# --- cost model -----------------------------------------------------------------------


def test_cost_model_prices_the_micro_batches_the_tokens_need() -> None:
    """64 samples of 512 tokens on d = 2 ranks: 32 per rank, 16,384 tokens; micro-batches
    of 4,096 tokens: 4 of 8 samples (in samples of 2: 16 of 2). Activations are linear in
    tokens: a full 4,096-token micro-batch holds 4 times those of 2 samples (1,024)."""
    cm = fitted_cost_model("a100-80gb")
    model = load_plan(PLAN).workload.models[Role.ACTOR]
    samples = RoleParallelism(train=TrainLayout(p=2, d=2), micro_batch=2)
    tokens = dataclasses.replace(samples, micro_batch_tokens=4096)
    for call in (
        lambda par: callcosts.forward_cost(cm, model, par, 64, 512, value_head=False, trained=True),
        lambda par: callcosts.train_cost(
            cm, model, par, 64, 512, 1, 1, callcosts.Scope.INTRA, value_head=False
        ),
    ):
        small, packed = call(samples), call(tokens)
        assert (small.detail["micro_batches"], packed.detail["micro_batches"]) == (16, 4)
        assert packed.detail["micro_batch"] == 8 and packed.detail["micro_batch_tokens"] == 4096
        assert "micro_batch_tokens" not in small.detail
        assert packed.transient_bytes == pytest.approx(4 * small.transient_bytes)
        # The same as 8-sample micro-batches in time: the work is the same tokens.
        eight = call(dataclasses.replace(samples, micro_batch=8))
        assert packed.time_s == pytest.approx(eight.time_s)


def test_example_plan_simulates_with_packed_micro_batches() -> None:
    plan = load_plan(PLAN)
    w = plan.workload
    budget = 4 * (w.batch.prompt_len + w.batch.response_len)
    par = {
        r: dataclasses.replace(p, micro_batch_tokens=budget) for r, p in plan.parallelism.items()
    }
    result = simulate(dataclasses.replace(plan, parallelism=par))
    assert result.feasible and result.iteration_s > 0


# --- exports --------------------------------------------------------------------------


def test_exports_pack_where_the_targets_can() -> None:
    from test_export import _get, _openrlhf_args, _verl_config

    plan = load_plan(PLAN)
    par = {**plan.parallelism}
    par[Role.ACTOR] = dataclasses.replace(
        par[Role.ACTOR], micro_batch_tokens=8192, forward_micro_batch_tokens=16384
    )
    par[Role.REF] = dataclasses.replace(par[Role.REF], forward_micro_batch_tokens=24576)
    plan = dataclasses.replace(plan, parallelism=par)
    cfg = _verl_config(list(export_plan(plan, Target.VERL).arguments))
    assert _get(cfg, "actor_rollout_ref.actor.use_dynamic_bsz") is True
    assert _get(cfg, "actor_rollout_ref.actor.ppo_max_token_len_per_gpu") == 8192
    assert _get(cfg, "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu") == 16384
    assert _get(cfg, "actor_rollout_ref.ref.log_prob_use_dynamic_bsz") is True
    assert _get(cfg, "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu") == 24576
    # The critic packs nothing: verl's default (the actor's switch) is overridden.
    assert _get(cfg, "critic.use_dynamic_bsz") is False
    openrlhf = export_plan(plan, Target.OPENRLHF)
    flags = _openrlhf_args(openrlhf.arguments)
    assert getattr(flags, "train.dynamic_batch_enable") and getattr(flags, "ds.packing_samples")
    assert getattr(flags, "train.max_tokens_per_gpu") == 8192
    assert getattr(flags, "rollout.max_tokens_per_gpu") == 24576  # the ref's forward passes
    assert any("packs every model or none" in n for n in openrlhf.unexpressed)


# --- engines --------------------------------------------------------------------------


def _batch() -> Batch:
    model = Transformer(ARCH).eval()
    model.load_shards(random_full(ARCH, seed=1))
    params = SamplingParams(max_tokens=6)
    outs = Sampler(model, pad_id=0).generate(PROMPTS, params, seed=2)
    b = completions_batch(PROMPTS, outs, pad_id=0)
    mask = b.tensors[Field.RESPONSE_MASK]
    adv = torch.linspace(-1, 1, len(PROMPTS))[:, None].expand_as(mask).contiguous()
    return Batch(tensors={**b.tensors, Field.ADVANTAGES: adv})


def _setup(**kw: Any) -> EngineSetup:
    return EngineSetup(arch=ARCH, weights=WeightSource(seed=0), micro_batch=2, **kw)


def test_packed_micro_batches_hold_the_budget_and_cut_only_padding() -> None:
    b = _batch()
    tokens = sample_tokens(b)
    micros = _micro_batches(b, MicroBatching(2, 12), count=0)
    assert micros.order is not None and sorted(micros.order) == list(range(len(b)))
    for mb in micros.batches:
        t = mb.tensors
        assert int(t[Field.PROMPT_MASK].sum() + t[Field.RESPONSE_MASK].sum()) <= 12
        # No column of padding that every sample of the micro-batch has.
        assert t[Field.PROMPT_MASK][:, 0].any() and t[Field.RESPONSE_MASK][:, -1].any()
    assert [t for mb in micros.batches for t in sample_tokens(mb)] == [
        tokens[i] for i in micros.order
    ]
    padded = _micro_batches(b, MicroBatching(2, 12), count=len(b) + 2)
    assert padded.real == len(b) and len(padded.batches) == len(b) + 2
    assert not padded.batches[-1].tensors[Field.RESPONSE_MASK].any()
    assert _packed(b).tensors[Field.RESPONSE].shape == b.tensors[Field.RESPONSE].shape


def test_scoring_with_packed_micro_batches_matches_micro_batches_of_samples() -> None:
    b = _batch()
    ref = ScoringEngine(_setup(), RoleGroups(tp=SINGLE), CPU)
    packed = ScoringEngine(_setup(forward_micro_batch_tokens=12), RoleGroups(tp=SINGLE), CPU)
    want, got = (
        ref.logprobs(b, 1.0).tensors[Field.LOGPROBS],
        packed.logprobs(b, 1.0).tensors[Field.LOGPROBS],
    )
    mask = b.tensors[Field.RESPONSE_MASK]
    assert got.shape == want.shape
    torch.testing.assert_close(got[mask], want[mask], rtol=1e-5, atol=1e-6)


def test_update_with_packed_micro_batches_matches_micro_batches_of_samples() -> None:
    """Same samples, same loss normalisation (tokens of the mini-batch): the gradients
    agree whatever the grouping."""
    from test_engines_device import _loss

    b = _batch()
    cfg = UpdateConfig()

    def actor(**kw: int) -> ActorEngine:
        return ActorEngine(
            _setup(optim=OptimConfig(lr=1e-3), **kw),
            RoleGroups(tp=SINGLE),
            CPU,
            gen=None,
            rank=0,
            reshard_plan=None,
        )

    plain, packed = actor(), actor(micro_batch_tokens=12)
    assert plain._train_mini_batch(b, _loss(plain, cfg), {}) == len(b) // 2
    micros = packed._train_mini_batch(b, _loss(packed, cfg), {})
    assert micros == len(_micro_batches(b, MicroBatching(2, 12)).batches)
    for p, q in zip(packed.model.parameters(), plain.model.parameters(), strict=True):
        assert p.grad is not None and q.grad is not None
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-6)


# --- a run ----------------------------------------------------------------------------


def _packed_plan(name: str) -> Any:
    plan = load_plan(ROOT / "examples" / "plans" / f"{name}.toml")
    b = plan.workload.batch
    budget = 2 * (b.prompt_len + b.response_len)
    par = {
        r: dataclasses.replace(p, micro_batch_tokens=budget, forward_micro_batch_tokens=2 * budget)
        for r, p in plan.parallelism.items()
    }
    return dataclasses.replace(plan, parallelism=par)


def test_ppo_with_packed_micro_batches_runs(ray_cluster: None, tmp_path: Path) -> None:
    """PPO's per-token advantages, returns and values are cut with the responses."""
    from placeflow.executor.run import RunConfig, run_plan

    result = run_plan(
        _packed_plan("ppo-tiny-cpu4-split"), tmp_path / "run", RunConfig(steps=3, progress=False)
    )
    for rec in result.records:
        for key in ("pg_loss", "value_loss", "kl_ref", "grad_norm", "reward_mean"):
            assert math.isfinite(rec.metrics[key]), (key, rec.metrics)
        assert rec.metrics["logprob_diff_max"] < 1e-3


def test_grpo_with_packed_micro_batches_raises_reward(ray_cluster: None, tmp_path: Path) -> None:
    """Every role packs its micro-batches (two of the longest samples' worth of tokens):
    the run learns as the plan in samples does (tests/test_executor_rl.py), and the
    trainer still scores the rollout's tokens as the rollout did."""
    from placeflow.executor.run import RunConfig, run_plan

    plan = _packed_plan("grpo-tiny-cpu4-colocate")
    steps = 16
    result = run_plan(plan, tmp_path / "run", RunConfig(steps=steps, progress=False))
    rewards = [r.metrics["reward_mean"] for r in result.records]
    assert sum(rewards[-4:]) / 4 > sum(rewards[:4]) / 4 + 0.08, f"reward did not rise: {rewards}"
    for rec in result.records:
        assert rec.metrics["logprob_diff_max"] < 1e-3
