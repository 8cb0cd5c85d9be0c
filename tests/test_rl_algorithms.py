"""The RL math of ReMax and Safe-RLHF against hand-computed numbers."""

from __future__ import annotations

import torch

from placeflow.executor import rl


def test_remax_advantage_is_reward_minus_greedy_reward() -> None:
    rewards = torch.tensor([1.0, 0.0, 0.5, 0.25])
    greedy = torch.tensor([0.5, 0.5, 0.5, 1.0])  # per sample: its prompt's greedy reward
    assert torch.equal(rl.remax_advantages(rewards, greedy), torch.tensor([0.5, -0.5, 0.0, -0.75]))


def test_lagrange_multiplier_rises_with_excess_cost_and_stays_non_negative() -> None:
    assert rl.lagrange_step(1.0, mean_cost=0.5, cost_limit=0.0, lr=0.1) == 1.05
    assert rl.lagrange_step(1.0, mean_cost=-0.5, cost_limit=0.0, lr=0.1) == 0.95
    assert rl.lagrange_step(0.01, mean_cost=-1.0, cost_limit=0.0, lr=0.1) == 0.0


def test_safe_advantage_weighs_cost_by_the_multiplier() -> None:
    a_r = torch.tensor([[1.0, 2.0]])
    a_c = torch.tensor([[3.0, -1.0]])
    # lambda = 1: (A_r - A_c) / 2
    assert torch.equal(rl.safe_advantages(a_r, a_c, 1.0), torch.tensor([[-1.0, 1.5]]))
    assert torch.equal(rl.safe_advantages(a_r, a_c, 0.0), a_r)
