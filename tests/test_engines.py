"""Engines and RL math in one process: sampler, trainer, GRPO/PPO formulas, tasks.

Oracles: hand-computed advantages and losses; the sampler's logprobs against
a plain forward of the same tokens; greedy decoding against argmax of full
forwards; a trainer step against torch's AdamW on the same gradients.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from placeflow.catalogue import get_model
from placeflow.errors import SpecError, UnknownNameError
from placeflow.executor import rl
from placeflow.executor.engines.roles import (
    completions_batch,
    response_logp,
    response_outputs,
    sequence,
)
from placeflow.executor.engines.sampler import Sampler, SamplingParams, left_pad
from placeflow.executor.engines.trainer import OptimConfig, TrainEngine
from placeflow.executor.engines.transformer import Arch, Transformer, random_full
from placeflow.executor.tasks import Problem, get_task
from placeflow.fields import Field
from placeflow.simulator import compute
from placeflow.workload import RLConfig


@pytest.fixture(scope="module")
def model() -> Transformer:
    m = Transformer(Arch.of(get_model("tiny-llama")))
    m.load_shards(random_full(m.arch, seed=3))
    return m.eval()


PROMPTS = [[5, 6, 7], [9], [1, 2, 3, 4, 5]]


def test_sampler_logprobs_equal_a_plain_forward(model: Transformer) -> None:
    params = SamplingParams(temperature=0.7, max_tokens=6, stop_ids=(10,))
    outs = Sampler(model, pad_id=0).generate(PROMPTS, params, seed=11)
    batch = completions_batch(PROMPTS, outs, pad_id=0)
    with torch.no_grad():
        logp, _ = response_logp(response_outputs(model, batch), batch, 0.7)
    m = batch.tensors[Field.RESPONSE_MASK]
    assert torch.allclose(logp[m], batch.tensors["rollout_logprobs"][m], atol=1e-5)


def test_greedy_matches_argmax_and_stops(model: Transformer) -> None:
    params = SamplingParams(temperature=0, max_tokens=5)
    (out,) = Sampler(model, pad_id=0).generate([PROMPTS[0]], params, seed=0)
    seq = list(PROMPTS[0])
    for token in out.token_ids:
        with torch.no_grad():
            ids = torch.tensor([seq])
            expected = int(model(ids, torch.ones_like(ids, dtype=torch.bool))[0, -1].argmax())
        assert token == expected
        seq.append(token)
    first = out.token_ids[0]
    (stopped,) = Sampler(model, pad_id=0).generate(
        [PROMPTS[0]], SamplingParams(temperature=0, max_tokens=5, stop_ids=(first,)), seed=0
    )
    assert stopped.token_ids == [first]


def test_sampling_is_seeded_and_fixed_length(model: Transformer) -> None:
    s = Sampler(model, pad_id=0)
    p = SamplingParams(max_tokens=8, top_p=0.9, stop_ids=(1, 2, 3), ignore_stop=True)
    a, b = s.generate(PROMPTS, p, seed=5), s.generate(PROMPTS, p, seed=5)
    assert a == b and all(len(c.token_ids) == 8 for c in a)
    assert s.generate(PROMPTS, p, seed=6) != a


def test_left_pad() -> None:
    ids, mask = left_pad([[1, 2], [3]], pad_id=0)
    assert ids.tolist() == [[1, 2], [0, 3]] and mask.tolist() == [[True, True], [False, True]]


def test_sampling_params_validate() -> None:
    with pytest.raises(SpecError, match="top_p"):
        SamplingParams(top_p=0)
    with pytest.raises(SpecError, match="max_tokens"):
        SamplingParams(max_tokens=0)


def test_group_advantages_by_hand() -> None:
    adv = rl.group_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0, 2.0, 2.0]), 2)
    s = math.sqrt(0.5)  # sample std of (1, 0)
    assert torch.allclose(adv[:4], torch.tensor([0.5 / s, -0.5 / s, -0.5 / s, 0.5 / s]), atol=1e-5)
    assert torch.equal(adv[4:], torch.zeros(2))  # a group of equal rewards teaches nothing
    with pytest.raises(ValueError):
        rl.group_advantages(torch.ones(5), 2)


def test_policy_loss_clips_by_hand() -> None:
    logp = torch.log(torch.tensor([[1.5, 0.5]]))  # ratios 1.5 and 0.5 against old logp 0
    old = torch.zeros(1, 2)
    mask = torch.ones(1, 2, dtype=torch.bool)
    terms = rl.policy_loss(logp, old, torch.tensor([1.0]), mask, clip=0.2, num_tokens=2)
    # A=+1: token 1 clipped to 1.2 (max of -1.5, -1.2 = -1.2), token 2 unclipped (-0.5).
    assert terms.loss.item() == pytest.approx((-1.2 - 0.5) / 2)
    assert terms.clip_fraction == pytest.approx(0.5)
    # The global token count and DP size scale the sum (DP averaging undoes dp_size).
    scaled = rl.policy_loss(logp, old, torch.tensor([1.0]), mask, clip=0.2, num_tokens=4, dp_size=2)
    assert scaled.loss.item() == pytest.approx(terms.loss.item())


def test_k3_kl_is_zero_at_the_reference() -> None:
    logp = torch.randn(2, 3)
    mask = torch.ones(2, 3, dtype=torch.bool)
    t = rl.policy_loss(logp, logp, torch.zeros(2), mask, clip=0.2, num_tokens=6,
                       ref_logprobs=logp, kl_coef=0.1)  # fmt: skip
    assert t.kl == 0.0 and t.loss.item() == 0.0


def test_gae_by_hand() -> None:
    rewards = torch.tensor([[0.0, 1.0]])
    values = torch.tensor([[0.5, 0.25]])
    mask = torch.ones(1, 2, dtype=torch.bool)
    adv, ret = rl.gae(rewards, values, mask, gamma=0.9, lam=0.8)
    d1 = 1.0 - 0.25  # last token: r - V
    d0 = 0.0 + 0.9 * 0.25 - 0.5
    raw = torch.tensor([[d0 + 0.9 * 0.8 * d1, d1]])
    assert torch.allclose(ret, raw + values)
    assert torch.allclose(adv, (raw - raw.mean()) / raw.std(unbiased=False), atol=1e-4)


def test_token_rewards_put_the_score_last() -> None:
    mask = torch.tensor([[True, True, False]])
    r = rl.token_rewards(torch.tensor([2.0]), torch.zeros(1, 3), torch.zeros(1, 3), mask, 0.1)
    assert r.tolist() == [[0.0, 2.0, 0.0]]


def test_trainer_step_equals_adamw(model: Transformer) -> None:
    arch = model.arch
    a = Transformer(arch)
    a.load_shards(random_full(arch, seed=1))
    b = Transformer(arch)
    b.load_shards(random_full(arch, seed=1))
    engine = TrainEngine(a, optim=OptimConfig(lr=1e-2, grad_clip=0.0))
    ref_opt = torch.optim.AdamW(b.parameters(), lr=1e-2, weight_decay=0.0)
    ids = torch.randint(0, 256, (2, 6))
    mask = torch.ones_like(ids, dtype=torch.bool)
    engine(ids, mask).logsumexp(-1).mean().backward()
    engine.step()
    b(ids, mask).logsumexp(-1).mean().backward()
    ref_opt.step()
    for (name, p), q in zip(a.named_parameters(), b.parameters(), strict=True):
        assert torch.equal(p, q), name
    state = engine.state()
    fresh = TrainEngine(Transformer(arch), optim=OptimConfig(lr=1e-2, grad_clip=0.0))
    fresh.load_state(state)
    assert all(
        torch.equal(x, y) for x, y in zip(fresh.model.parameters(), a.parameters(), strict=True)
    )


def test_grad_clip_bounds_the_norm(model: Transformer) -> None:
    m = Transformer(model.arch)
    m.load_shards(random_full(model.arch, seed=1))
    engine = TrainEngine(m, optim=OptimConfig(lr=1e-3, grad_clip=1e-3))
    ids = torch.randint(0, 256, (2, 6))
    (engine(ids, torch.ones_like(ids, dtype=torch.bool)).sum() * 100).backward()
    norm = engine.grad_norm()
    assert norm > 1e-3
    for p in m.parameters():
        assert p.grad is not None
    engine.step()  # clips, then steps; gradients are cleared
    assert all(p.grad is None for p in m.parameters())


def test_critic_value_head_starts_at_zero(model: Transformer) -> None:
    critic = Transformer(model.arch, value_head=True)
    critic.load_shards(random_full(model.arch, seed=3, critic=True))
    ids = torch.randint(0, 256, (2, 4))
    values = critic(ids, torch.ones_like(ids, dtype=torch.bool))
    assert values.shape == (2, 4) and torch.equal(values, torch.zeros(2, 4))


def test_arith_task_scores() -> None:
    task = get_task("arith")
    p = Problem(prompt="17+5=", answer="22")
    assert task.score(p, "22\n") == 1.0
    assert task.score(p, "22") < 1.0  # no stop token: not exact
    assert task.score(p, "23\n") == pytest.approx(0.2 + 0.2 + 0.6 * 0.5)
    assert task.score(p, "") == 0.0
    assert 0.0 <= task.score(p, "xx9999999\n") < 0.5
    problems = task.problems(5, seed=1)
    assert problems == task.problems(5, seed=1) and problems != task.problems(5, seed=2)
    for q in problems:
        a, b = q.prompt.rstrip("=").split("+")
        assert int(q.answer) == int(a) + int(b)
    with pytest.raises(UnknownNameError, match="arith"):
        get_task("nope")


def test_rl_config_validates() -> None:
    with pytest.raises(SpecError, match="lr"):
        RLConfig(lr=0)
    with pytest.raises(SpecError, match="gamma"):
        RLConfig(gamma=1.5)


def test_sequence_layout_round_trip() -> None:
    from placeflow.executor.engines.sampler import Completion

    b = completions_batch(
        [[1, 2], [3]], [Completion([4], [-0.1]), Completion([5, 6], [-1.0, -2.0])], 0
    )
    ids, mask, width = sequence(b)
    assert (
        width == 2
        and b.tensors[Field.PROMPT].shape == (2, 2)
        and b.tensors[Field.RESPONSE].shape == (2, 2)
    )
    assert ids.tolist() == [[1, 2, 4, 0], [0, 3, 5, 6]]
    assert mask.tolist() == [[True, True, True, False], [False, True, True, True]]


class _CountOps(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        self.count += 1
        return func(*args, **(kwargs or {}))


def _ops(fn: Callable[[], object]) -> int:
    counter = _CountOps()
    with counter:
        fn()
    return counter.count


def test_engine_op_counts_match_the_simulator() -> None:
    """The simulator's framework-op counts (simulator/compute.py) are this engine's."""
    counts = {}
    for layers in (2, 4):
        spec = dataclasses.replace(get_model("tiny-llama"), num_layers=layers)
        m = Transformer(Arch.of(spec))
        m.load_shards(random_full(m.arch, seed=0))
        ids = torch.randint(0, 256, (4, 10))
        mask = torch.ones_like(ids, dtype=torch.bool)
        with torch.no_grad():
            fwd = _ops(lambda m=m, ids=ids, mask=mask: m(ids, mask))

        def train(m: Transformer = m, ids: torch.Tensor = ids, mask: torch.Tensor = mask) -> None:
            m(ids, mask).float().logsumexp(-1).mean().backward()

        both = _ops(train)
        s = Sampler(m, pad_id=0)
        steps = {
            n: _ops(
                lambda s=s, n=n: s.generate(
                    [[1, 2, 3]] * 4, SamplingParams(max_tokens=n, ignore_stop=True), 0
                )
            )
            for n in (4, 8)
        }
        counts[layers] = (fwd, both - fwd, (steps[8] - steps[4]) / 4)
    per_layer = [(counts[4][i] - counts[2][i]) / 2 for i in range(3)]
    base = [counts[2][i] - 2 * per_layer[i] for i in range(3)]
    kernels_fwd, kernels_bwd = 10, 17  # GEMMs, attention, norms, adds, SwiGLU (compute.py)
    assert per_layer[0] - kernels_fwd == compute.EXTRA_OPS_LAYER_FORWARD
    assert per_layer[1] - kernels_bwd == compute.EXTRA_OPS_LAYER_BACKWARD
    assert per_layer[2] - kernels_fwd == compute.EXTRA_OPS_LAYER_DECODE
    assert base[0] - 2 == compute.EXTRA_OPS_CALL_FORWARD  # head GEMM + log-softmax
    assert base[1] - 3 == compute.EXTRA_OPS_CALL_BACKWARD  # two head GEMMs + softmax
    assert base[2] - 2 == compute.EXTRA_OPS_DECODE_STEP
