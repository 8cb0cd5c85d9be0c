"""LoRA: which projections low-rank adapters adapt, and how many parameters they add.

A workload's `[lora]` table (`placeflow.workload.LoRASpec`) trains adapters
instead of the full weights of its trained roles (verl's `lora_rank` /
`target_modules`, OpenRLHF's `--lora_rank`): each adapted linear layer W
(in -> out) gains A (in -> r) and B (r -> out), r·(in + out) trainable
parameters, and the base W stays frozen. `targets` names the adapted
projections of every decoder layer, as PEFT spells them: `all-linear` (q, k,
v, o, gate, up, down) or `attention` (q, k, v, o). The embedding, the LM head
and a critic's value head are not adapted (PEFT's `all-linear` leaves the
output layer out); a critic's value head is trained in full, as verl does.

What follows elsewhere (one place each): trained-state memory
(`simulator/memory.py`: the frozen base in the model's dtype, gradients and
Adam state for the adapters only), the update (`simulator/callcosts.py`: no
weight gradients for the base GEMMs, the adapters' own GEMMs, gradients
reduced and Adam stepped over the adapters only) and what reaches generation
(only the adapters move after an update: the rollout engine keeps the base and
loads the new adapters, as verl and OpenRLHF do with vLLM's LoRA support).
"""

from __future__ import annotations

from enum import StrEnum

from placeflow.errors import SpecError
from placeflow.models import ModelSpec


class LoRATargets(StrEnum):
    ALL_LINEAR = "all-linear"
    ATTENTION = "attention"


def adapted_shapes(model: ModelSpec, targets: LoRATargets) -> tuple[tuple[int, int], ...]:
    """(in, out) of every adapted projection of one decoder layer."""
    h, q, kv, f = model.hidden_size, model.q_size, model.kv_size, model.ffn_hidden_size
    attention = ((h, q), (h, kv), (h, kv), (q, h))
    if targets is LoRATargets.ATTENTION:
        return attention
    return attention + ((h, f), (h, f), (f, h))


def adapter_params_per_layer(model: ModelSpec, rank: int, targets: LoRATargets) -> int:
    """Trainable adapter parameters of one decoder layer: r·(in + out) per target."""
    return sum(rank * (i + o) for i, o in adapted_shapes(model, targets))


def check_adaptable(model: ModelSpec, rank: int, where: str) -> None:
    """SpecError for a model whose adapters placeflow cannot count, or a rank too big."""
    if model.moe is not None or model.mla is not None:
        raise SpecError(
            f"{where}: adapters on {model.name!r}'s mixture-of-experts or latent-attention "
            "layers are not modelled; use a dense model, or full fine-tuning (no [lora])"
        )
    if rank >= model.hidden_size:
        raise SpecError(
            f"{where}: rank {rank} must be below {model.name!r}'s hidden size "
            f"{model.hidden_size} (a low-rank adapter)"
        )
