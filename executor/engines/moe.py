"""A mixture-of-experts MLP with expert parallelism over a process group (gloo or NCCL).

The layer is Qwen3-MoE's and DeepSeek's: a router (hidden -> experts, no
bias) scores every token, softmax in float32, the top k experts are kept and
their weights renormalised to sum to one when the model says so
(`norm_topk_prob`; otherwise they stay the softmax probabilities), each chosen
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

Each routed expert is a module of its own, `experts.<j>` by its global index
j, holding `gate_up` (2·ffn x hidden, gate rows then up rows) and `down`: the
names `placeflow.reshard_plan` gives expert weights, so that a rank's
parameters are exactly the experts it holds and a generation replica (e = 1)
loads all of them by the same names.

Load balancing: every forward records, over the real tokens (`token_mask`),
how many routing choices each expert got and the sum of its router
probabilities; `load_balancing_loss` turns the records of a model's MoE layers
into Switch/Mixtral's auxiliary loss as Hugging Face's Qwen3-MoE and Mixtral
compute it (`load_balancing_loss_func`: the records pooled over layers and
tokens, num_experts · Σ_e f_e · P_e, f_e the fraction of routing choices and
P_e the mean probability of expert e), which the trainer adds times the
model's `router_aux_loss_coef`. Each rank's loss covers its own tokens, as in
data-parallel training with HF's loss.
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


@dataclass(frozen=True, kw_only=True)
class RoutingRecord:
    """One forward's routing over its real tokens: choices and summed probabilities per expert."""

    choices: torch.Tensor  # (experts,) routing choices each expert got (no gradient)
    probs: torch.Tensor  # (experts,) sum of the router's probabilities (with gradient)
    num_tokens: torch.Tensor  # () real tokens routed


class Expert(nn.Module):
    """One routed expert: a SwiGLU MLP with fused gate/up rows."""

    def __init__(self, hidden: int, ffn: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.gate_up = nn.Parameter(torch.empty(2 * ffn, hidden, dtype=dtype))
        self.down = nn.Parameter(torch.empty(hidden, ffn, dtype=dtype))
        self.ffn = ffn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = (x @ self.gate_up.t()).split(self.ffn, dim=-1)
        return (F.silu(gate) * up) @ self.down.t()


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
        norm_topk_prob: bool = True,
    ) -> None:
        super().__init__()
        if num_experts % ep.size:
            raise ValueError(f"EP size {ep.size} must divide the {num_experts} experts")
        if not 0 < top_k <= num_experts:
            raise ValueError(f"top_k must be in 1..{num_experts}, got {top_k}")
        self.num_experts, self.top_k, self.ep = num_experts, top_k, ep
        self.norm_topk_prob = norm_topk_prob
        self.local = num_experts // ep.size
        self.first = ep.rank * self.local  # global index of this rank's first expert
        self.router = nn.Parameter(torch.empty(num_experts, hidden, dtype=dtype))
        self.shared_gate_up = (
            nn.Parameter(torch.empty(2 * shared_ffn, hidden, dtype=dtype)) if shared_ffn else None
        )
        self.shared_down = (
            nn.Parameter(torch.empty(hidden, shared_ffn, dtype=dtype)) if shared_ffn else None
        )
        self.shared_ffn = shared_ffn
        self.experts = nn.ModuleDict(
            {str(j): Expert(hidden, expert_ffn, dtype) for j in self.expert_block()}
        )
        self.record: RoutingRecord | None = None

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(weights, experts) of shape (tokens, top_k): the top-k softmax probabilities,
        renormalised when `norm_topk_prob`; and the float32 probabilities over all
        experts (tokens, experts)."""
        probs = torch.softmax((x @ self.router.t()).float(), dim=-1)
        weights, experts = probs.topk(self.top_k, dim=-1)
        if self.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return weights.to(x.dtype), experts, probs

    def _experts(self, x: torch.Tensor, local_ids: torch.Tensor) -> torch.Tensor:
        """Rows of `x` through this rank's experts `local_ids` (0..local-1), expert by expert."""
        out = torch.empty_like(x)
        for j in range(self.local):
            rows = (local_ids == j).nonzero(as_tuple=True)[0]
            if rows.numel() == 0:
                continue
            out[rows] = self.experts[str(self.first + j)](x[rows]).to(out.dtype)
        return out

    def _record(
        self, experts: torch.Tensor, probs: torch.Tensor, mask: torch.Tensor | None
    ) -> None:
        real = (
            torch.ones(probs.shape[0], 1, device=probs.device)
            if mask is None
            else mask.reshape(-1, 1).to(probs.dtype)
        )
        with torch.no_grad():
            hits = F.one_hot(experts, self.num_experts).sum(1).to(probs.dtype)
        self.record = RoutingRecord(
            choices=(hits * real).sum(0), probs=(probs * real).sum(0), num_tokens=real.sum()
        )

    def forward(self, x: torch.Tensor, token_mask: torch.Tensor | None = None) -> torch.Tensor:
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        weights, experts, probs = self.route(x)
        self._record(experts, probs, token_mask)
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
        out = torch.zeros_like(x).index_add(0, tokens, (done * gate).to(x.dtype))
        if self.shared_gate_up is not None and self.shared_down is not None:
            sg, su = (x @ self.shared_gate_up.t()).split(self.shared_ffn, dim=-1)
            out = out + (F.silu(sg) * su) @ self.shared_down.t()
        return out.reshape(shape)

    def expert_block(self) -> range:
        """Global indices of the experts this rank holds."""
        return range(self.first, self.first + self.local)


def load_balancing_loss(records: list[RoutingRecord], num_experts: int) -> torch.Tensor:
    """HF's `load_balancing_loss_func` over the layers' records: E · Σ_e f_e · P_e.

    f_e: routing choices of expert e over all (layer, token) rows, divided by the
    rows (so Σ_e f_e = top_k); P_e: its mean router probability over the rows.
    """
    choices = torch.stack([r.choices for r in records]).sum(0)
    probs = torch.stack([r.probs for r in records]).sum(0)
    rows = torch.stack([r.num_tokens for r in records]).sum().clamp(min=1)
    return num_experts * ((choices / rows) * (probs / rows)).sum()


__all__ = ["SINGLE_EP", "EPGroup", "Expert", "MoEMLP", "RoutingRecord", "load_balancing_loss"]
