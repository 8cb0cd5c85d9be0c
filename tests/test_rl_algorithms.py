"""The RL math of ReMax and Safe-RLHF against hand-computed numbers."""

from __future__ import annotations

import torch

from placeflow.executor import rl


def test_remax_advantage_is_reward_minus_greedy_reward() -> None:
    rewards = torch.tensor([1.0, 0.0, 0.5, 0.25])
    greedy = torch.tensor([0.5, 0.5, 0.5, 1.0])  # per sample: its prompt's greedy reward
    assert torch.equal(rl.remax_advantages(rewards, greedy), torch.tensor([0.5, -0.5, 0.0, -0.75]))
