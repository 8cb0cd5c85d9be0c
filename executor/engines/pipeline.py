"""Pipeline-parallel schedules over one PP group: 1F1B for training, one pass for inference.

Notation: p stages, this one s (0-based), M micro-batches of one mini-batch.
Stage s runs the layers `ParamSpec.stage` gives it (`reshard_plan`, the one
stage rule); only hidden states (batch, seq, hidden) travel between stages:
activations forward from s to s+1, their gradients backward from s+1 to s.
Every rank of a data-parallel replica holds the same Batch shard, so each stage
knows every micro-batch's shape and nothing but the tensor itself is sent.

Training, 1F1B (PipeDream-Flush, Megatron's non-interleaved schedule):

1. warm-up: w_s = min(p − s − 1, M) forwards;
2. steady state: M − w_s rounds of one forward then one backward;
3. cool-down: w_s backwards.

Backwards run in micro-batch order 0..M−1 on every stage, so micro-batch M−1 is
the last backward of the step: gradient reduction over DP is switched on just
before it (once per optimizer step, as without pipelining). Stage s holds the
activations of at most w_s + 1 micro-batches (GPipe holds M); the bubble is
(p − 1)/(M + p − 1) of the step. With p = 1 the schedule is forward, backward
per micro-batch: exactly the non-pipelined loop.

Communication follows Megatron's `p2p_communication`: the sends and receives of
one step are posted together with `batch_isend_irecv` and waited on together,
so a stage sending forward while its neighbour sends backward cannot deadlock,
and on NCCL both sides issue their operations in the same order. gloo on CPU,
NCCL on GPU, through the same calls.

Why not `torch.distributed.pipelining`: its schedules split the batch themselves
and call `loss_fn(output, target)` with one target tensor, while our losses need
each micro-batch's Batch (advantages, masks, old logprobs) and return metrics;
its stage backward uses `autograd.grad`, so FSDP2 needs its post-backward called
by hand; and our stages are built by the Transformer from the stage rule, not
traced and split. This schedule calls `Tensor.backward`, so FSDP2's and TP's
autograd hooks run as they do without pipelining.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from placeflow.layout import split_stages


@dataclass(frozen=True)
class PPGroup:
    """This rank's pipeline group: `size` stages, this one at `rank` (its stage index);
    `first_stage_layers` / `last_stage_layers` as in `TrainLayout` (0: even stages)."""

    group: Any = None  # a torch.distributed ProcessGroup; None when size is 1
    size: int = 1
    rank: int = 0
    first_stage_layers: int = 0
    last_stage_layers: int = 0

    def __post_init__(self) -> None:
        if self.size > 1 and self.group is None:
            raise ValueError(f"a PP group of size {self.size} needs a process group")
        if not 0 <= self.rank < self.size:
            raise ValueError(f"PP rank {self.rank} outside 0..{self.size - 1}")

    def stage_layers(self, num_layers: int) -> tuple[int, ...]:
        """Layers of every stage of this group (`placeflow.layout.split_stages`)."""
        return split_stages(num_layers, self.size, self.first_stage_layers, self.last_stage_layers)

    @property
    def is_first(self) -> bool:
        return self.rank == 0

    @property
    def is_last(self) -> bool:
        return self.rank == self.size - 1


SINGLE_STAGE = PPGroup()


@dataclass(frozen=True, kw_only=True)
class StageIO:
    """What crosses a stage boundary: micro-batch i's hidden states of `shape(i)`."""

    shape: Callable[[int], tuple[int, ...]]
    dtype: torch.dtype
    device: torch.device

    def empty(self, i: int) -> torch.Tensor:
        return torch.empty(self.shape(i), dtype=self.dtype, device=self.device)


def connect(pp: PPGroup, device: torch.device) -> None:
    """One collective over the PP group before any point-to-point call.

    NCCL requires that the first operation on a group involve all its ranks when
    that operation is a `batch_isend_irecv` (torch's documentation of it).
    """
    if pp.size > 1:
        dist.all_reduce(torch.zeros(1, device=device), group=pp.group)


def _communicate(
    pp: PPGroup,
    *,
    send_next: torch.Tensor | None = None,
    send_prev: torch.Tensor | None = None,
    recv_prev: torch.Tensor | None = None,
    recv_next: torch.Tensor | None = None,
) -> None:
    """Post the given sends and receives to the neighbouring stages together, then wait."""
    ops = []
    for tensor, peer, op in (
        (send_prev, pp.rank - 1, dist.isend),
        (recv_prev, pp.rank - 1, dist.irecv),
        (send_next, pp.rank + 1, dist.isend),
        (recv_next, pp.rank + 1, dist.irecv),
    ):
        if tensor is not None:
            ops.append(dist.P2POp(op, tensor.contiguous(), group=pp.group, group_peer=peer))
    if ops:
        for req in dist.batch_isend_irecv(ops):
            req.wait()


def exchange_add(pp: PPGroup, tensor: torch.Tensor, peer: int) -> None:
    """tensor += the peer stage's tensor of the same shape (both sides get a + b)."""
    other = torch.empty_like(tensor)
    ops = [
        dist.P2POp(dist.isend, tensor.contiguous(), group=pp.group, group_peer=peer),
        dist.P2POp(dist.irecv, other, group=pp.group, group_peer=peer),
    ]
    for req in dist.batch_isend_irecv(ops):
        req.wait()
    tensor.add_(other)


StageForward = Callable[[int, torch.Tensor | None], torch.Tensor]


def forward_only(
    pp: PPGroup, num_micro: int, forward: StageForward, io: StageIO
) -> list[torch.Tensor]:
    """Run micro-batches 0..M−1 through the stages; the last stage's outputs (others: [])."""
    outputs = []
    for i in range(num_micro):
        x = None
        if not pp.is_first:
            x = io.empty(i)
            _communicate(pp, recv_prev=x)
        y = forward(i, x)
        if pp.is_last:
            outputs.append(y)
        else:
            _communicate(pp, send_next=y)
    return outputs


def _recv_input(pp: PPGroup, io: StageIO, i: int) -> torch.Tensor | None:
    if pp.is_first:
        return None
    x = io.empty(i)
    _communicate(pp, recv_prev=x)
    return x.requires_grad_()


def _backward(
    x: torch.Tensor | None, y: torch.Tensor, grad: torch.Tensor | None
) -> torch.Tensor | None:
    """Backward through this stage; the gradient of its input (None on the first stage)."""
    if grad is None:
        y.backward()  # the last stage: y is the micro-batch's loss
    else:
        torch.autograd.backward(y, grad)
    return None if x is None else x.grad


def train_1f1b(
    pp: PPGroup,
    num_micro: int,
    forward: StageForward,
    io: StageIO,
    *,
    set_gradient_sync: Callable[[bool], None],
) -> None:
    """One mini-batch's forwards and backwards in 1F1B order (steps 1–3 of the module doc).

    `forward(i, x)` returns the stage's hidden states, or on the last stage the
    micro-batch's loss; gradients accumulate in the parameters.
    """
    warmup = min(pp.size - pp.rank - 1, num_micro)
    inflight: list[tuple[torch.Tensor | None, torch.Tensor]] = []
    set_gradient_sync(False)
    done = 0

    def backward_oldest(grad: torch.Tensor | None) -> torch.Tensor | None:
        nonlocal done
        if done == num_micro - 1:
            set_gradient_sync(True)
        x, y = inflight.pop(0)
        done += 1
        return _backward(x, y, grad)

    def grad_of(i: int) -> torch.Tensor | None:
        return None if pp.is_last else io.empty(i)

    for i in range(warmup):  # (1)
        x = _recv_input(pp, io, i)
        y = forward(i, x)
        _communicate(pp, send_next=None if pp.is_last else y.detach())
        inflight.append((x, y))
    for i in range(warmup, num_micro):  # (2)
        x = _recv_input(pp, io, i)
        y = forward(i, x)
        inflight.append((x, y))
        grad = grad_of(done)
        _communicate(pp, send_next=None if pp.is_last else y.detach(), recv_next=grad)
        gx = backward_oldest(grad)
        _communicate(pp, send_prev=None if pp.is_first else gx)
    while inflight:  # (3)
        grad = grad_of(done)
        _communicate(pp, recv_next=grad)
        gx = backward_oldest(grad)
        _communicate(pp, send_prev=None if pp.is_first else gx)
