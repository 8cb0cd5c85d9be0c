"""Tensor-parallel communication with autograd: Megatron's four mappings over a TP group.

The loss is computed identically on every TP rank, so each mapping's backward
is the dual of its forward: copying an input into the TP region (identity)
all-reduces its gradient; reducing a row-parallel output (all-reduce) passes
its gradient through; gathering vocab-parallel logits (all-gather) takes back
this rank's slice. Only gloo-supported collectives are used (no reduce-scatter),
so the same code runs on CPU and, with NCCL, on CUDA. A group of size 1 makes
every mapping the identity.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class TPGroup:
    """This rank's tensor-parallel group: `size` ranks, this one at `rank`."""

    group: Any = None  # a torch.distributed ProcessGroup; None when size is 1
    size: int = 1
    rank: int = 0

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
    return x if tp.size == 1 else _CopyToTP.apply(x, tp)


def reduce_from_tp(x: torch.Tensor, tp: TPGroup) -> torch.Tensor:
    return x if tp.size == 1 else _ReduceFromTP.apply(x, tp)


def gather_from_tp(x: torch.Tensor, tp: TPGroup) -> torch.Tensor:
    return x if tp.size == 1 else _GatherFromTP.apply(x, tp)
