"""Training engine: one TP shard of a `Transformer`, data-parallel over its DP group.

The plan's ZeRO stage picks torch's own implementation:

- zero 3: FSDP2 (`fully_shard`, per layer and the root) over a DeviceMesh of
  the DP group: parameters, gradients and optimizer state sharded;
- zero 1 and 2: gradients all-reduced once per optimizer step, plus torch's
  `ZeroRedundancyOptimizer` (optimizer state sharded, parameters replicated, as
  Megatron's distributed optimizer);
- zero 0 (or d = 1): the same all-reduce and a plain AdamW.

The replicated-parameter all-reduce is one flat buffer in parameter order
rather than torch's DDP: DDP re-buckets gradients in the order autograd
produced them on the first iteration of each process, which changes the order
in which a ring all-reduce sums each element, so a resumed process would drift
from an uninterrupted one in the last bits.

TP is inside the model (`tp.py`); the model is one pipeline stage
(`pipeline.py` runs the schedule), and the optimizer steps this stage's
weights. Gradient accumulation over micro-batches syncs once per optimizer
step (`set_gradient_sync`). Clipping uses the global gradient norm: squares
summed over the TP shards of split weights, once for TP-replicated weights,
over DP shards under FSDP, and over the pipeline stages (the last stage's copy
of a tied embedding not counted: its gradient is the first stage's, added to it
across the PP group as Megatron's embedding group does).

Expert parallelism (a mixture of experts trained with e > 1): a rank holds
only its EP block of the routed experts, so the experts' gradients are
all-reduced over the expert-data-parallel group (the d / e ranks holding the
same experts) and every other gradient over the DP group, both divided by d
(each expert's gradient already sums its EP group's tokens through the
all-to-all's backward); their squared norms are summed over the EP group.
ZeRO is not run with e > 1 (ZeroRedundancyOptimizer and FSDP would shard and
broadcast parameters across ranks that hold different experts): zero 0 only.

Precision: the model's weights, gradients and AdamW state are fp32 (master
weights); its forward runs in `Arch.compute_dtype` under autocast
(transformer.py). AdamW is torch's fused kernel on CUDA.

Checkpoints are per rank (its local shards and its optimizer state in
parameter order), which is what makes `--resume` bit-identical: nothing is
re-gathered or re-split on the way.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.distributed.tensor import DTensor

from placeflow.errors import SpecError
from placeflow.executor.engines.offload import OffloadMode, OptimizerOffload
from placeflow.executor.engines.pipeline import exchange_add
from placeflow.executor.engines.transformer import Transformer
from placeflow.reshard_plan import Sharding


def fsdp_shard(model: Transformer, dp_group: Any) -> None:
    """Wrap `model` for ZeRO-3 in place: FSDP2 (`fully_shard`) on each decoder layer and
    on the root, over a DeviceMesh of `dp_group` on the model's device."""
    mesh = DeviceMesh.from_group(dp_group, next(model.parameters()).device.type)
    # FSDP2's mixed precision: gather parameters in the compute dtype, reduce gradients
    # in fp32 into the fp32 shards (fp32: no cast either way).
    mp = MixedPrecisionPolicy(param_dtype=model.arch.compute_dtype, reduce_dtype=torch.float32)
    for layer in model.layers.values():
        fully_shard(layer, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)


@dataclass(frozen=True, kw_only=True)
class OptimConfig:
    lr: float = 1e-5
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    grad_clip: float = 1.0


class TrainEngine:
    def __init__(
        self,
        model: Transformer,
        *,
        optim: OptimConfig,
        zero: int = 0,
        dp_group: Any = None,
        dp_size: int = 1,
        offload: OffloadMode = OffloadMode.NONE,
        expert_dp_group: Any = None,
    ) -> None:
        self.model, self.optim_config, self.zero = model, optim, zero
        self.dp_group, self.dp_size = dp_group, dp_size
        self.expert_dp_group = expert_dp_group  # None: a group of one (d = e) or no EP
        # Routed experts' weights this rank holds; apart from the rest only under EP.
        self._experts = {
            p.name for p in model.arch.weights.params() if p.expert >= 0 and model.ep.size > 1
        }
        if self._experts and zero > 0 and dp_size > 1:
            raise SpecError(
                f"ZeRO stage {zero} with expert parallel e={model.ep.size} is not run: its "
                "optimizer would shard weights across ranks holding different experts; use zero = 0"
            )
        # Weights split across TP (their squared norms are summed over the TP group);
        # the rest (norms, a critic's value head) every TP rank holds whole, counted once.
        # The sharding is reshard_plan's, as for the shards themselves (shard_full).
        self._tp_split = {
            p.name for p in model.arch.weights.params() if p.sharding is not Sharding.REPLICATED
        }
        self.device = next(model.parameters()).device
        self.fsdp = dp_size > 1 and zero == 3
        if self.fsdp:
            fsdp_shard(model, dp_group)
        params = list(model.parameters())
        kwargs: dict[str, Any] = {
            "lr": optim.lr,
            "weight_decay": optim.weight_decay,
            "betas": optim.betas,
            # One fused kernel for the whole step on a GPU; on CPU torch's default loop,
            # whose results the tests compare bit for bit.
            "fused": self.device.type == "cuda",
        }
        self.optimizer: torch.optim.Optimizer
        if dp_size > 1 and zero in (1, 2):
            # Bucket views: after the step each rank broadcasts its partition as one
            # flat bucket, not one broadcast per parameter tensor (torch's default), so a
            # step costs d broadcasts, as the simulator's gather prices it, and not one
            # collective per weight (30 a step for tiny-llama, each a wait on a shared CPU).
            self.optimizer = ZeroRedundancyOptimizer(
                params,
                optimizer_class=torch.optim.AdamW,
                process_group=dp_group,
                parameters_as_bucket_view=True,
                **kwargs,
            )
        else:
            self.optimizer = torch.optim.AdamW(params, **kwargs)
        # Where the Adam state lives between phases (executor/engines/offload.py).
        self.offload = OptimizerOffload(
            offload, self.optimizer, self._core_optimizer(), self.device
        )

    def __call__(self, ids: torch.Tensor, mask: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        return self.model(ids, mask, **kwargs)

    def set_gradient_sync(self, sync: bool) -> None:
        """Whether the following backward passes reduce gradients across DP (FSDP only;
        the replicated path reduces once in `step`)."""
        if self.fsdp:
            assert isinstance(self.model, FSDPModule)
            self.model.set_requires_gradient_sync(sync)

    def _add_tied_embedding_gradients(self) -> None:
        """First and last stage each add the other's gradient of the tied embedding."""
        pp = self.model.pp
        if not (self.model.arch.weights.tied_embeddings and (pp.is_first or pp.is_last)):
            return
        if self.model.is_critic or pp.size == 1:
            return
        embed = self.model.embed
        assert embed is not None and embed.grad is not None
        grad = embed.grad.to_local() if isinstance(embed.grad, DTensor) else embed.grad
        exchange_add(pp, grad, peer=pp.size - 1 if pp.is_first else 0)

    def _average_gradients(self) -> None:
        """Mean of the replicas' gradients: one all-reduce of a flat buffer in parameter order
        (routed experts under EP: another one over their expert-data-parallel group)."""
        named = [(n, p.grad) for n, p in self.model.named_parameters() if p.grad is not None]
        dense = [g for n, g in named if n not in self._experts]
        experts = [g for n, g in named if n in self._experts]
        _all_reduce_mean(dense, self.dp_group, self.dp_size)
        if experts:
            _all_reduce_mean(experts, self.expert_dp_group, self.dp_size)

    def step(self) -> float:
        """Clip to the global norm, take an optimizer step, zero gradients; the norm."""
        if self.dp_size > 1 and not self.fsdp:
            self._average_gradients()
        self._add_tied_embedding_gradients()
        norm = self.grad_norm()
        clip = self.optim_config.grad_clip
        if clip > 0 and math.isfinite(norm) and norm > clip:
            for p in self.model.parameters():
                if p.grad is not None:
                    p.grad.mul_(clip / (norm + 1e-6))
        self.offload.step_with(self.optimizer)
        self.optimizer.zero_grad(set_to_none=True)
        return norm

    def grad_norm(self) -> float:
        split = torch.zeros((), dtype=torch.float64, device=self.device)
        whole = torch.zeros((), dtype=torch.float64, device=self.device)
        experts = torch.zeros((), dtype=torch.float64, device=self.device)
        for name, p in self.model.named_parameters():
            if p.grad is None or (name == "embed" and self.model.tied_copy):
                continue
            g = p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad
            sq = g.double().pow(2).sum()
            if name in self._experts:  # this EP rank's experts (expert TP is not run)
                experts += sq
            elif name in self._tp_split:
                split += sq
            else:
                whole += sq
        if self.fsdp:  # each DP rank holds a disjoint piece of every gradient
            both = torch.stack([split, whole])
            dist.all_reduce(both, group=self.dp_group)
            split, whole = both[0], both[1]
        tp, pp = self.model.tp, self.model.pp
        if tp.size > 1:
            dist.all_reduce(split, group=tp.group)
        if self._experts:
            dist.all_reduce(experts, group=self.model.ep.group)
        total = split + whole + experts
        if pp.size > 1:  # each stage holds different weights
            dist.all_reduce(total, group=pp.group)
        return float(total.sqrt())

    # --- weights for the rollout and for checkpoints -------------------------
    @torch.no_grad()
    def tp_shards(self) -> dict[str, torch.Tensor]:
        """This rank's whole TP shard of every weight (gathered over DP under FSDP)."""
        out = {}
        for name, p in self.model.named_parameters():
            out[name] = p.full_tensor() if isinstance(p, DTensor) else p.detach()
        return out

    def state(self) -> dict[str, Any]:
        """This rank's model and optimizer state, as plain local tensors."""
        with self.offload.resident() as core:
            params = [p for g in core.param_groups for p in g["params"]]
            return {
                "model": {n: _local(p).clone() for n, p in self.model.named_parameters()},
                "optimizer": [
                    {k: _local(v).clone() for k, v in core.state.get(p, {}).items()} for p in params
                ],
            }

    @torch.no_grad()
    def load_state(self, state: dict[str, Any]) -> None:
        params = dict(self.model.named_parameters())
        if set(state["model"]) != set(params):
            raise ValueError("checkpoint weights do not match this model and layout")
        for name, p in params.items():
            _local(p).copy_(state["model"][name])
        with self.offload.resident() as core:
            ordered = [p for g in core.param_groups for p in g["params"]]
            if len(ordered) != len(state["optimizer"]):
                raise ValueError("checkpoint optimizer state does not match this layout")
            for p, saved in zip(ordered, state["optimizer"], strict=True):
                if saved:
                    core.state[p] = {k: _like(p, v) for k, v in saved.items()}

    def _core_optimizer(self) -> torch.optim.Optimizer:
        # ZeroRedundancyOptimizer steps an inner optimizer over this rank's partition.
        inner = getattr(self.optimizer, "optim", None)
        return inner if isinstance(inner, torch.optim.Optimizer) else self.optimizer


def _all_reduce_mean(grads: list[torch.Tensor], group: Any, divisor: int) -> None:
    """Sum `grads` over `group` (None: this rank alone) as one flat buffer, divide by `divisor`."""
    if not grads:
        return
    flat = torch.cat([g.reshape(-1) for g in grads])
    if group is not None:
        dist.all_reduce(flat, group=group)
    flat /= divisor
    offset = 0
    for g in grads:
        g.copy_(flat[offset : offset + g.numel()].view_as(g))
        offset += g.numel()


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


def _like(param: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """An optimizer state tensor for `param`: a DTensor alike when the parameter is one."""
    if isinstance(param, DTensor) and value.dim() > 0:
        return DTensor.from_local(value.clone(), param.device_mesh, param.placements)
    return value.clone()
