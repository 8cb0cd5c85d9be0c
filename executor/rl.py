"""The RL math of GRPO, ReMax, PPO and Safe-RLHF: pure tensor functions (no processes, no models).

Shapes: a batch of B responses padded to R tokens; `mask` (B, R) marks real
response tokens. Losses are sums over tokens divided by a `num_tokens` the
caller gives, so a mini-batch split over data-parallel ranks and micro-batches
still optimises the mean over all its tokens (the caller passes the global
count; DDP/FSDP average gradients over ranks, hence the `dp_size` factor).

GRPO (Shao et al. 2024): a response's advantage is its reward normalised within
its prompt's group, the same for every token; the clipped ratio objective; KL
to the reference with the k3 estimator inside the loss.
PPO (Ouyang et al. 2022 / HybridFlow's recipe): per-token reward = -beta * KL(k1)
with the score added at the last token; GAE over the critic's values; clipped
policy and value losses.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    m = mask.to(x.dtype)
    return (x * m).sum() / m.sum().clamp(min=1)


def masked_sum(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (x * mask.to(x.dtype)).sum()


def group_advantages(rewards: torch.Tensor, group_size: int, eps: float = 1e-6) -> torch.Tensor:
    """GRPO: (r - mean of the group) / (std of the group + eps); groups are consecutive."""
    if rewards.numel() % group_size:
        raise ValueError(f"{rewards.numel()} rewards do not form groups of {group_size}")
    g = rewards.view(-1, group_size).float()
    std = g.std(dim=1, keepdim=True) if group_size > 1 else torch.zeros_like(g[:, :1])
    return ((g - g.mean(dim=1, keepdim=True)) / (std + eps)).view(-1)


def remax_advantages(rewards: torch.Tensor, baseline_rewards: torch.Tensor) -> torch.Tensor:
    """ReMax (Li et al. 2023): a response's reward minus the reward of its prompt's greedy
    response, the same for every token (`baseline_rewards` already per sample)."""
    return rewards.float() - baseline_rewards.float()


def lagrange_step(multiplier: float, mean_cost: float, cost_limit: float, lr: float) -> float:
    """Safe-RLHF's dual update (Dai et al. 2023; PPO-Lagrangian, Ray et al. 2019):
    projected gradient ascent on lambda of lambda * (J_c - d), i.e.
    lambda <- max(0, lambda + lr * (mean episode cost - cost limit))."""
    return max(0.0, multiplier + lr * (mean_cost - cost_limit))


def safe_advantages(
    reward_advantages: torch.Tensor, cost_advantages: torch.Tensor, multiplier: float
) -> torch.Tensor:
    """Safe-RLHF's combined advantage (A_r - lambda * A_c) / (1 + lambda): the policy
    maximises reward and minimises cost, weighted by the current multiplier."""
    return (reward_advantages - multiplier * cost_advantages) / (1.0 + multiplier)


def token_rewards(
    scores: torch.Tensor,
    logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor | None,
    mask: torch.Tensor,
    kl_coef: float,
) -> torch.Tensor:
    """PPO's per-token reward: -kl_coef * (logp - ref_logp), plus the score on the last token."""
    out = torch.zeros_like(logprobs)
    if ref_logprobs is not None and kl_coef:
        out = -kl_coef * (logprobs - ref_logprobs)
    last = mask.long().sum(1).clamp(min=1) - 1
    out = out * mask
    out[torch.arange(len(scores)), last] += scores.to(out.dtype)
    return out


def gae(
    rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float, lam: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(advantages, returns) by generalised advantage estimation; whitened advantages."""
    b, r = rewards.shape
    adv = torch.zeros_like(rewards)
    last = torch.zeros(b, dtype=rewards.dtype)
    m = mask.to(rewards.dtype)
    values = values * m
    for t in reversed(range(r)):
        next_value = values[:, t + 1] if t + 1 < r else torch.zeros(b, dtype=rewards.dtype)
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        last = (delta + gamma * lam * last) * m[:, t]
        adv[:, t] = last
    returns = adv + values
    mean = masked_mean(adv, mask)
    var = masked_mean((adv - mean) ** 2, mask)
    return (adv - mean) * torch.rsqrt(var + 1e-8) * m, returns


@dataclass(frozen=True)
class PolicyLossTerms:
    loss: torch.Tensor  # scaled for backward (see module docstring)
    pg_loss: float  # token means of this micro-batch, for metrics
    kl: float
    clip_fraction: float
    approx_kl: float


def policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip: float,
    num_tokens: int,
    dp_size: int = 1,
    ref_logprobs: torch.Tensor | None = None,
    kl_coef: float = 0.0,
) -> PolicyLossTerms:
    """The clipped surrogate; with ref_logprobs and kl_coef, GRPO's k3 KL term in the loss."""
    if advantages.dim() == 1:
        advantages = advantages[:, None].expand_as(logprobs)
    log_ratio = logprobs - old_logprobs
    ratio = log_ratio.exp()
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1 - clip, 1 + clip)
    per_token = torch.maximum(unclipped, clipped)
    kl = torch.zeros_like(per_token)
    if ref_logprobs is not None and kl_coef:
        d = ref_logprobs - logprobs
        kl = d.exp() - d - 1  # k3: unbiased, always >= 0
        per_token = per_token + kl_coef * kl
    loss = masked_sum(per_token, mask) * (dp_size / num_tokens)
    with torch.no_grad():
        return PolicyLossTerms(
            loss=loss,
            pg_loss=float(masked_mean(torch.maximum(unclipped, clipped), mask)),
            kl=float(masked_mean(kl, mask)),
            clip_fraction=float(masked_mean((clipped > unclipped).float(), mask)),
            approx_kl=float(masked_mean(0.5 * log_ratio**2, mask)),
        )


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip: float,
    num_tokens: int,
    dp_size: int = 1,
) -> tuple[torch.Tensor, float]:
    """PPO's clipped value loss 0.5 * max((v - R)^2, (clip(v) - R)^2); (scaled loss, token mean)."""
    clipped = old_values + (values - old_values).clamp(-clip, clip)
    per_token = 0.5 * torch.maximum((values - returns) ** 2, (clipped - returns) ** 2)
    loss = masked_sum(per_token, mask) * (dp_size / num_tokens)
    return loss, float(masked_mean(per_token.detach(), mask))


def entropy(logp: torch.Tensor) -> torch.Tensor:
    """Entropy per position of distributions given as log-probabilities (..., vocab)."""
    return -(logp.exp() * logp).sum(-1)
