"""Colocated resharding from training to generation weights with torch.distributed.

Each rank holds its training shards (Megatron TP/PP, `reshard_plan`) and builds
its generation shard (GenLayout's tg, pg) by `reshard_colocated`: HybridFlow's
micro-DP all-gather, executing a `ReshardPlan` slot by slot; each received
piece is copied straight into the preallocated generation tensors, re-fusing
qkv and gate_up part by part. A mixture of experts then gathers its routed
experts the same way over the plan's expert groups (the EP group's micro-DP
groups together), so that every generation rank holds every expert.

It counts the bytes a rank receives from the others and, in a `MemoryMeter`,
the peak of the extra bytes it holds at once (generation tensors plus live
transfer buffers; the training shards are not counted). The naive baseline it
is measured against, and the spawned gloo worlds that test it rank by rank,
are in `benchmarks/reshard_worlds.py`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from placeflow.layout import GenLayout, TrainLayout
from placeflow.reshard_plan import (
    ParamSpec,
    Range,
    ReshardPlan,
    Slot,
    TinyLlama,
    gen_shard,
    placements,
    train_shard,
    transfer_piece,
)

# torch 2.13 renamed all_gather_into_tensor (which now warns); older torch has only the old name.
all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor

Params = dict[str, torch.Tensor]


class MemoryMeter:
    """Bytes of transfer-side tensors alive at once, and their peak."""

    def __init__(self) -> None:
        self.live_bytes = 0
        self.peak_bytes = 0

    def hold(self, t: torch.Tensor) -> torch.Tensor:
        self.live_bytes += t.numel() * t.element_size()
        self.peak_bytes = max(self.peak_bytes, self.live_bytes)
        return t

    def drop(self, t: torch.Tensor) -> None:
        self.live_bytes -= t.numel() * t.element_size()


# --- tensors ------------------------------------------------------------------


def place(
    dst: torch.Tensor,
    param: ParamSpec,
    piece: torch.Tensor,
    src: tuple[Range, ...],
    rank_gen: tuple[Range, ...],
) -> None:
    """Copy the rows of `piece` (covering `src` of the full tensor) that fall in `rank_gen`
    into `dst` (the tensor covering `rank_gen`)."""
    for pl in placements(src, rank_gen):
        dst.narrow(param.dim, pl.dst_start, pl.length).copy_(
            piece.narrow(param.dim, pl.src_start, pl.length)
        )


def full_params(model: TinyLlama, seed: int) -> Params:
    """The whole model, filled in canonical order from one seeded generator."""
    gen = torch.Generator().manual_seed(seed)
    return {p.name: torch.randn(p.shape, generator=gen) for p in model.params()}


def take(full: torch.Tensor, param: ParamSpec, ranges: tuple[Range, ...]) -> torch.Tensor:
    """The shard of `full` made of `ranges` along the split dim, contiguous."""
    return torch.cat([full.narrow(param.dim, r.start, r.length) for r in ranges], param.dim)


def train_params(model: TinyLlama, train: TrainLayout, rank: int, full: Params) -> Params:
    """Training shards of `rank`, cut from the full weights."""
    out = {}
    for p in model.params():
        ranges = train_shard(model, p, train, rank)
        if ranges is not None:
            out[p.name] = take(full[p.name], p, ranges)
    return out


# --- the reshard ---------------------------------------------------------------


def _piece(
    model: TinyLlama, param: ParamSpec, gen: GenLayout, rank: int, shards: Params
) -> tuple[torch.Tensor, tuple[Range, ...]]:
    """What `rank` sends of `param` (a view of its shard) and the ranges it covers."""
    ranges = transfer_piece(model, param, gen, rank)
    assert ranges is not None
    own = train_shard(model, param, gen.train, rank)
    if own == ranges:
        return shards[param.name], ranges
    # A norm chunk: the shard is the full (replicated) tensor, so ranges index it directly.
    (r,) = ranges
    return shards[param.name].narrow(param.dim, r.start, r.length), ranges


def reshard_colocated(
    plan: ReshardPlan,
    rank: int,
    shards: Params,
    group: Any,
    meter: MemoryMeter,
    expert_group: Any = None,
    *,
    gather: Callable[..., Any] = all_gather,
) -> tuple[Params, int]:
    """Build `rank`'s generation weights by the plan's micro-DP all-gathers, then its expert
    all-gathers over `expert_group` (the process group of `plan.expert_group_of(rank)`);
    (weights, bytes in). `gather(output, input, group=...)` runs each all-gather (the
    profiler passes a timed one, `placeflow.profiles.reshard_host`)."""
    model, gen = plan.model, plan.gen
    out: Params = {}
    for p in model.params():
        ranges = gen_shard(model, p, gen, rank)
        if ranges is None:
            continue
        # HybridFlow's grouping makes every own training shard part of the generation shard.
        own = train_shard(model, p, gen.train, rank)
        if own == ranges:  # nothing to gather (tg = t): the training shard itself, no copy
            out[p.name] = shards[p.name]
            continue
        like = shards[p.name] if p.name in shards else next(iter(shards.values()))
        out[p.name] = meter.hold(like.new_empty(p.shard_shape(ranges)))
        if own is not None:
            place(out[p.name], p, shards[p.name], own, ranges)
    transfer = plan.group_of(rank)
    received = 0
    for slot in transfer.slots:
        received += _gather_slot(
            plan, transfer.ranks, slot, rank, shards, out, group, meter, gather
        )
    experts = plan.expert_group_of(rank)
    for slot in experts.slots if experts is not None else ():
        assert experts is not None
        received += _gather_slot(
            plan, experts.ranks, slot, rank, shards, out, expert_group, meter, gather
        )
    return out, received


def _gather_slot(
    plan: ReshardPlan,
    ranks: tuple[int, ...],
    slot: Slot,
    rank: int,
    shards: Params,
    out: Params,
    group: Any,
    meter: MemoryMeter,
    gather: Callable[..., Any],
) -> int:
    model, gen, me, padded = plan.model, plan.gen, ranks.index(rank), slot.padded_numel
    piece = slot.pieces[me]
    own = None if piece is None else _piece(model, piece, gen, rank, shards)[0].reshape(-1)
    padded_copy = own is None or own.numel() < padded
    send = own
    if send is None or padded_copy:
        # all-gather needs equal sizes: pad (or send zeros) up to the slot's largest piece
        send = meter.hold(out[piece.name if piece else next(iter(out))].new_zeros(padded))
        if own is not None:
            send[: own.numel()] = own
    buf = meter.hold(send.new_empty(len(ranks) * padded))
    gather(buf, send, group=group)
    for k, (p, numel) in enumerate(zip(slot.pieces, slot.numels, strict=True)):
        if k == me or p is None:
            continue
        src = transfer_piece(model, p, gen, ranks[k])
        assert src is not None
        chunk = buf[k * padded : k * padded + numel].view(p.shard_shape(src))
        place(out[p.name], p, chunk, src, gen_shard(model, p, gen, rank) or ())
    meter.drop(buf)
    if padded_copy:
        meter.drop(send)
    return (len(ranks) - 1) * padded * buf.element_size()
