"""The actor's rollout engine on a generator set of its own (trainer and generator apart).

A plan with a `generator = true` set trains the actor on one device set and
generates on another. The generator ranks hold no trainer and no optimizer
state: only the generation shard of the policy (tg-way tensor parallel, all
layers: the planner emits pg = 1) and the sampler's KV cache. Their weights
arrive every step from the trainer ranks through the bucketed sync of
`placeflow.executor.weight_sync` (`load_rollout`); before the first sync they
hold the same initial weights as the trainer, so a step's rollout is the same
as a colocated actor's with the same generation replicas and seeds.
"""

from __future__ import annotations

import torch

from placeflow.executor.batch import Batch
from placeflow.executor.engines.roles import EngineSetup, completions_batch
from placeflow.executor.engines.sampler import Sampler, SamplingParams
from placeflow.executor.engines.tp import TPGroup
from placeflow.executor.engines.transformer import Transformer, shard_full


class GeneratorEngine:
    """A frozen policy shard that samples; its weights are replaced by `load_rollout`."""

    def __init__(self, setup: EngineSetup, tp: TPGroup, device: torch.device) -> None:
        self.setup = setup
        model = Transformer(setup.arch, tp=tp, dtype=setup.arch.compute_dtype).to(device)
        model.eval()
        model.requires_grad_(False)
        full = setup.weights.full(setup.arch, critic=False)
        model.load_shards({k: v.to(device) for k, v in shard_full(full, setup.arch, tp).items()})
        self.sampler = Sampler(model, pad_id=setup.pad_id)

    def load_rollout(self, weights: dict[str, torch.Tensor]) -> None:
        """Generation shards from the trainer (this rank's, by reshard-plan name)."""
        self.sampler.model.load_shards(weights)

    def generate(self, prompts: list[list[int]], params: SamplingParams, seed: int) -> Batch:
        return completions_batch(
            prompts, self.sampler.generate(prompts, params, seed), self.setup.pad_id
        )
