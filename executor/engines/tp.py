"""Tensor-parallel communication with autograd: Megatron's four mappings over a TP group.

The loss is computed identically on every TP rank, so each mapping's backward
is the dual of its forward: copying an input into the TP region (identity)
all-reduces its gradient; reducing a row-parallel output (all-reduce) passes
its gradient through; gathering vocab-parallel logits (all-gather) takes back
this rank's slice. Only gloo-supported collectives are used (no reduce-scatter),
so the same code runs on CPU and, with NCCL, on CUDA. A group of size 1 makes
every mapping the identity.

`TPImpl.MEGATRON` routes the same mappings through megatron-core
(`megatron.core.tensor_parallel.mappings`, given the group explicitly) and
makes the transformer's column-parallel projections and LM head megatron-core
`ColumnParallelLinear` layers: the Megatron-core tensor-parallel path (the
vocabulary gather stays ours: megatron-core's allocates on CUDA). Its
layers run on CPU with gloo (`use_cpu_initialization`); placeflow's own
parameters stay the weights (passed to the layer per call), so shards,
resharding and checkpoints are the same on both paths.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import torch
import torch.distributed as dist


class TPImpl(StrEnum):
    NATIVE = "native"  # the autograd functions below
    MEGATRON = "megatron"  # megatron-core's mappings and ColumnParallelLinear


@dataclass(frozen=True)
class TPGroup:
    """This rank's tensor-parallel group: `size` ranks, this one at `rank`."""

    group: Any = None  # a torch.distributed ProcessGroup; None when size is 1
    size: int = 1
    rank: int = 0
    impl: TPImpl = TPImpl.NATIVE

    @property
    def megatron(self) -> bool:
        return self.impl is TPImpl.MEGATRON and self.size > 1

    def __post_init__(self) -> None:
        if self.size > 1 and self.group is None:
            raise ValueError(f"a TP group of size {self.size} needs a process group")
        if not 0 <= self.rank < self.size:
            raise ValueError(f"TP rank {self.rank} outside 0..{self.size - 1}")


SINGLE = TPGroup()


class _CopyToTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, tp: TPGroup) -> torch.Tensor:
        ctx.tp = tp
        return x

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        grad = grad.contiguous()
        dist.all_reduce(grad, group=ctx.tp.group)
        return grad, None


class _ReduceFromTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, tp: TPGroup) -> torch.Tensor:
        x = x.contiguous()
        dist.all_reduce(x, group=tp.group)
        return x

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad, None


class _GatherFromTP(torch.autograd.Function):
    """All-gather along the last dim (vocab-parallel logits)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, tp: TPGroup) -> torch.Tensor:
        ctx.tp, ctx.width = tp, x.shape[-1]
        parts = [torch.empty_like(x) for _ in range(tp.size)]
        dist.all_gather(parts, x.contiguous(), group=tp.group)
        return torch.cat(parts, dim=-1)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        w, r = ctx.width, ctx.tp.rank
        return grad[..., r * w : (r + 1) * w].contiguous(), None


def copy_to_tp(x: torch.Tensor, tp: TPGroup) -> torch.Tensor:
    if tp.size == 1:
        return x
    if tp.megatron:
        return _mappings().copy_to_tensor_model_parallel_region(x, group=tp.group)
    return _CopyToTP.apply(x, tp)


def reduce_from_tp(x: torch.Tensor, tp: TPGroup) -> torch.Tensor:
    if tp.size == 1:
        return x
    if tp.megatron:
        return _mappings().reduce_from_tensor_model_parallel_region(x, group=tp.group)
    return _ReduceFromTP.apply(x, tp)


def gather_from_tp(x: torch.Tensor, tp: TPGroup) -> torch.Tensor:
    # Always ours: megatron-core's gather allocates its buffer on the current CUDA
    # device, so on CPU it cannot run.
    return x if tp.size == 1 else _GatherFromTP.apply(x, tp)


def _mappings() -> Any:
    from megatron.core.tensor_parallel import mappings  # optional: the Megatron path only

    return mappings


def column_linear(tp: TPGroup, in_features: int, out_features: int, *, gather: bool) -> Any:
    """A megatron-core ColumnParallelLinear over `tp` that takes its weight per call."""
    import torch as _torch
    from megatron.core.model_parallel_config import ModelParallelConfig
    from megatron.core.tensor_parallel import ColumnParallelLinear

    config = ModelParallelConfig(
        tensor_model_parallel_size=tp.size,
        use_cpu_initialization=True,
        perform_initialization=False,  # placeflow loads every weight itself
        params_dtype=_torch.float32,
    )
    return ColumnParallelLinear(
        in_features,
        out_features,
        config=config,
        init_method=lambda w: None,
        bias=False,
        gather_output=gather,
        skip_weight_param_allocation=True,
        tp_group=tp.group,
    )
