"""A mixture-of-experts MLP with expert parallelism over a process group (gloo or NCCL).

The layer is Qwen3-MoE's and DeepSeek's: a router (hidden -> experts, no
bias) scores every token, softmax in float32, the top k experts are kept and
their weights renormalised to sum to one (`norm_topk_prob`), each chosen
expert is a SwiGLU MLP, and shared experts (DeepSeek) run on every token.

Expert parallelism EP = e splits the experts into e contiguous blocks, one per
rank of the EP group (expert j lives on rank j // (experts / e)); the router and
the shared experts are replicated. A forward sends every (token, expert)
pair to the rank that holds the expert and brings the result back, with two
`all_to_all_single` calls whose split sizes are exchanged first (Megatron's
token dispatcher, without capacity dropping: every routed token is computed).
Their backward is the same exchange with the splits swapped, so gradients flow
to the tokens' own ranks and each expert's gradient stays where the expert is.

Each rank of the group routes its own tokens; with e = 1 the layer is the
plain single-device MoE, which is what the tests check the EP layer against.
No auxiliary load-balancing loss is added: RL post-training of a pretrained
MoE usually keeps the router as it is or trains it with a small coefficient,
and placeflow's losses do not include one yet.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True, kw_only=True)
class EPGroup:
    """This rank's place in its expert-parallel group (`group` None when size is 1)."""

    rank: int = 0
    size: int = 1
    group: Any = None


SINGLE_EP = EPGroup()


def _all_to_all(x: torch.Tensor, send: list[int], recv: list[int], group: Any) -> torch.Tensor:
    """Rows of `x` sent `send[r]` to rank r, rows received `recv[r]` from rank r."""
    out = x.new_empty((sum(recv), *x.shape[1:]))
    dist.all_to_all_single(
        out, x.contiguous(), output_split_sizes=recv, input_split_sizes=send, group=group
    )
    return out


class _AllToAll(torch.autograd.Function):
    """`_all_to_all` with autograd: the backward sends gradients back the same way."""

    @staticmethod
    def forward(
        ctx: Any, x: torch.Tensor, send: list[int], recv: list[int], group: Any
    ) -> torch.Tensor:
        ctx.send, ctx.recv, ctx.group = send, recv, group
        return _all_to_all(x, send, recv, group)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        return _all_to_all(grad, ctx.recv, ctx.send, ctx.group), None, None, None


def _exchange_counts(send: torch.Tensor, ep: EPGroup) -> torch.Tensor:
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=ep.group)
    return recv


class MoEMLP(nn.Module):
    """Router, this rank's block of routed experts, and the shared experts (if any)."""

    def __init__(
        self,
        hidden: int,
        expert_ffn: int,
        num_experts: int,
        top_k: int,
        *,
        shared_ffn: int = 0,
        ep: EPGroup = SINGLE_EP,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__()
        if num_experts % ep.size:
            raise ValueError(f"EP size {ep.size} must divide the {num_experts} experts")
        if not 0 < top_k <= num_experts:
            raise ValueError(f"top_k must be in 1..{num_experts}, got {top_k}")
        self.num_experts, self.top_k, self.ep = num_experts, top_k, ep
        self.local = num_experts // ep.size
        self.first = ep.rank * self.local  # global index of this rank's first expert
        self.router = nn.Parameter(torch.empty(num_experts, hidden, dtype=dtype))
        self.gate_up = nn.Parameter(torch.empty(self.local, 2 * expert_ffn, hidden, dtype=dtype))
        self.down = nn.Parameter(torch.empty(self.local, hidden, expert_ffn, dtype=dtype))
        self.expert_ffn = expert_ffn
        self.shared_gate_up = (
            nn.Parameter(torch.empty(2 * shared_ffn, hidden, dtype=dtype)) if shared_ffn else None
        )
        self.shared_down = (
            nn.Parameter(torch.empty(hidden, shared_ffn, dtype=dtype)) if shared_ffn else None
        )
        self.shared_ffn = shared_ffn

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(weights, experts) of shape (tokens, top_k): renormalised top-k softmax."""
        probs = torch.softmax((x @ self.router.t()).float(), dim=-1)
        weights, experts = probs.topk(self.top_k, dim=-1)
        weights = weights / weights.sum(dim=-1, keepdim=True)
        return weights.to(x.dtype), experts

    def _experts(self, x: torch.Tensor, local_ids: torch.Tensor) -> torch.Tensor:
        """Rows of `x` through this rank's experts `local_ids` (0..local-1), row by row."""
        out = torch.empty_like(x)
        for j in range(self.local):
            rows = (local_ids == j).nonzero(as_tuple=True)[0]
            if rows.numel() == 0:
                continue
            gate, up = (x[rows] @ self.gate_up[j].t()).split(self.expert_ffn, dim=-1)
            out[rows] = (F.silu(gate) * up) @ self.down[j].t()
        return out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        weights, experts = self.route(x)
        flat = experts.reshape(-1)  # (tokens * k,): pair i is token i // k
        order = flat.argsort(stable=True)  # pairs grouped by expert, so by destination rank
        tokens = order // self.top_k
        dispatched = x[tokens]
        if self.ep.size == 1:
            done = self._experts(dispatched, flat[order])
        else:
            dest = flat[order] // self.local
            send = torch.bincount(dest, minlength=self.ep.size)
            recv = _exchange_counts(send, self.ep)
            send_l, recv_l = send.tolist(), recv.tolist()
            arrived = _AllToAll.apply(dispatched, send_l, recv_l, self.ep.group)
            ids = _all_to_all(flat[order], send_l, recv_l, self.ep.group)
            computed = self._experts(arrived, ids - self.first)
            done = _AllToAll.apply(computed, recv_l, send_l, self.ep.group)
        gate = weights.reshape(-1)[order].unsqueeze(-1)
        out = torch.zeros_like(x).index_add(0, tokens, done * gate)
        if self.shared_gate_up is not None and self.shared_down is not None:
            sg, su = (x @ self.shared_gate_up.t()).split(self.shared_ffn, dim=-1)
            out = out + (F.silu(sg) * su) @ self.shared_down.t()
        return out.reshape(shape)

    def expert_block(self) -> range:
        """Global indices of the experts this rank holds."""
        return range(self.first, self.first + self.local)


__all__ = ["SINGLE_EP", "EPGroup", "MoEMLP"]
