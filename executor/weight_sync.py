"""Weight sync between disjoint device sets: trainer ranks send, generator ranks receive.

Executes a `placeflow.reshard_plan.DisjointPlan` with torch.distributed
point-to-point messages (gloo on CPU, NCCL on GPU) in one world whose ranks
0..T-1 are the trainer's (its p-t-d layout) and T..T+G-1 the generator's.
For each generator rank and each of its buckets, every trainer rank with
slices in the bucket packs them into one flat message; the generator receives
it into a bucket-sized buffer and copies the rows straight into its
preallocated generation shard. So a generator rank holds at most its
generation shard plus one bucket, whatever the model size.

Deadlock freedom: every rank walks the same global order of messages
(generator rank, bucket, trainer rank) and handles the ones it is part of, so
blocking sends and receives always have a partner that is at the same message.
Posted sends (k-step-off, `posted`) never block the trainer; the generator
receives them in the same order, whenever its queue reaches the receive.

Messages go over a `Link`: in `placeflow run`, a process group of its own
between the trainer's and the generator's Ray workers (`open_sync_link`): each
device set keeps its own world for its roles' collectives, and only the sync
crosses sets. (The spawned worlds of the tests and the benchmark use their
default world, `benchmarks/reshard_worlds.py`, which also holds the naive
baseline: every full tensor gathered on trainer rank 0 and sent whole to every
generator rank, as verl streams it.)

`to_full_hf` is the generator side for engines that load weights by name
(vLLM's `load_weights`): a generator with tg = pg = 1 receives whole tensors,
renamed to Hugging Face names.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Protocol

import torch
import torch.distributed as dist

from placeflow.executor.engines.hf import to_hf
from placeflow.executor.reshard import MemoryMeter, Params
from placeflow.layout import TrainLayout, generator_stage_layers
from placeflow.reshard_plan import (
    DisjointPlan,
    GeneratorLayout,
    ParamSpec,
    Range,
    Sharding,
    TinyLlama,
    split_ranges,
    train_shard,
)


class Posted(Protocol):
    """A send in flight (a c10d Work): its tensor must live until `wait` returns."""

    def wait(self) -> Any: ...


class Link(Protocol):
    """Point-to-point messages between the ranks of one sync world: blocking `send` and
    `recv`, and `post`, a send that returns at once (k-step-off's snapshots)."""

    def send(self, tensor: torch.Tensor, dst: int) -> None: ...

    def post(self, tensor: torch.Tensor, dst: int) -> Posted: ...

    def recv(self, tensor: torch.Tensor, src: int) -> None: ...


class GroupLink:
    """A process group outside the default world (one per trainer/generator pair of sets)."""

    def __init__(self, group: Any) -> None:
        self.group = group  # a c10d backend (ProcessGroupGloo / ProcessGroupNCCL)

    def send(self, tensor: torch.Tensor, dst: int) -> None:
        self.group.send([tensor], dst, 0).wait()

    def post(self, tensor: torch.Tensor, dst: int) -> Posted:
        # Messages between two ranks with one tag arrive in the order they were posted
        # (gloo's pair, NCCL's stream), so posted snapshots reach the generator in order.
        work: Posted = self.group.send([tensor], dst, 0)
        return work

    def recv(self, tensor: torch.Tensor, src: int) -> None:
        self.group.recv([tensor], src, 0).wait()


def open_sync_link(
    *, host: str, port: int, rank: int, world_size: int, backend: str, timeout_s: float
) -> GroupLink:
    """Join the sync world of trainer ranks 0..T-1 and generator ranks T..T+G-1.

    Rank 0 hosts the TCP store at (host, port); every rank calls this at the same
    time. The group stands beside each worker's own default world, which it leaves
    untouched (torch.distributed allows one default group per process).
    """
    timeout = timedelta(seconds=timeout_s)
    store = dist.TCPStore(host, port, world_size, rank == 0, timeout=timeout)
    prefixed = dist.PrefixStore("placeflow-weight-sync", store)
    if backend == "nccl":
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout
        return GroupLink(dist.ProcessGroupNCCL(prefixed, rank, world_size, options))
    return GroupLink(dist.ProcessGroupGloo(prefixed, rank, world_size, timeout))


def generator_shard_ranges(
    model: TinyLlama, param: ParamSpec, gen: GeneratorLayout, rank: int
) -> tuple[Range, ...] | None:
    """Ranges of `param` in generator `rank`'s shard; None if its stage holds none."""
    _, gpp, gtp = gen.coords(rank)
    if param.stage(generator_stage_layers(model.num_layers, gen.pg)) != gpp:
        return None
    if param.sharding is Sharding.REPLICATED:
        return (Range(start=0, length=param.shape[param.dim]),)
    return split_ranges(param, gen.tg, gtp)


def shard_rows(t: torch.Tensor, param: ParamSpec, start: int, length: int) -> torch.Tensor:
    """Rows start..start+length of `t` (a tensor of `param`) along its split dim, a view."""
    return t.narrow(param.dim, start, length)


def _local_rows(
    model: TinyLlama, train: TrainLayout, src: int, param: ParamSpec, rows: Range
) -> int:
    """Offset along the split dim of full-tensor row `rows.start` inside trainer `src`'s shard."""
    ranges = train_shard(model, param, train, src)
    assert ranges is not None
    offset = 0
    for r in ranges:
        if r.start <= rows.start < r.start + r.length:
            return offset + rows.start - r.start
        offset += r.length
    raise AssertionError(f"rows {rows} of {param.name} are not on trainer rank {src}")


def sync_disjoint(
    plan: DisjointPlan,
    rank: int,
    shards: Params | None,
    meter: MemoryMeter,
    *,
    link: Link,
    device: torch.device | None = None,
    posted: list[tuple[torch.Tensor, Posted]] | None = None,
) -> tuple[Params, int]:
    """Run `plan` as sync-world rank `rank`; a generator returns (its shard, bytes received).

    Trainer ranks pass their training `shards` and get ({}, bytes sent). Generator
    shards and receive buffers are made on `device` (default CPU); messages go over
    `link`. With `posted`, a trainer rank posts its messages instead of waiting for
    each (`Link.post`) and appends each packed message and its send there: the
    caller keeps them (still counted by `meter`) until their sends complete.
    """
    model, train, gen = plan.model, plan.train, plan.gen
    num_train = train.world_size
    is_gen = rank >= num_train
    me = rank - num_train
    out: Params = {}
    if is_gen:
        for p in model.params():
            ranges = generator_shard_ranges(model, p, gen, me)
            if ranges is not None:
                out[p.name] = meter.hold(torch.empty(p.shard_shape(ranges), device=device))
    moved = 0
    # Posted messages with the same slices (the same position in each generator replica a
    # trainer rank serves) share one packed copy: a snapshot is one shard, not one per
    # replica served.
    packed_by_slices: dict[tuple[tuple[str, int, int], ...], torch.Tensor] = {}
    for dst, transfer in enumerate(plan.ranks):
        for bucket in transfer.buckets:
            for src in sorted({s.src for s in bucket.sends}):
                sends = [s for s in bucket.sends if s.src == src]
                numel = sum(s.numel for s in sends)
                if rank == src:
                    assert shards is not None
                    slices = tuple((s.param.name, s.rows.start, s.rows.length) for s in sends)
                    if posted is not None and slices in packed_by_slices:
                        packed = packed_by_slices[slices]
                        posted.append((packed, link.post(packed, num_train + dst)))
                        moved += numel * packed.element_size()
                        continue
                    pieces = [
                        shard_rows(
                            shards[s.param.name],
                            s.param,
                            _local_rows(model, train, src, s.param, s.rows),
                            s.rows.length,
                        ).reshape(-1)
                        for s in sends
                    ]
                    packed = meter.hold(torch.cat(pieces))  # a copy: training may go on
                    moved += numel * packed.element_size()
                    if posted is not None:
                        packed_by_slices[slices] = packed
                        posted.append((packed, link.post(packed, num_train + dst)))
                        continue
                    link.send(packed, num_train + dst)
                    meter.drop(packed)
                elif is_gen and me == dst:
                    buf = meter.hold(torch.empty(numel, device=device))
                    link.recv(buf, src)
                    offset = 0
                    for s in sends:
                        shape = list(s.param.shape)
                        shape[s.param.dim] = s.rows.length
                        piece = buf[offset : offset + s.numel].view(shape)
                        dst_rows = shard_rows(
                            out[s.param.name], s.param, s.dst_start, s.rows.length
                        )
                        dst_rows.copy_(piece)
                        offset += s.numel
                    meter.drop(buf)
                    moved += numel * buf.element_size()
    return out, moved


def to_full_hf(plan: DisjointPlan, weights: Params) -> Params:
    """Whole tensors of a tg = pg = 1 generator, renamed for engines that load by HF name."""
    if plan.gen.tg != 1 or plan.gen.pg != 1:
        raise ValueError("full tensors need a generator layout with tg = pg = 1")
    return to_hf(weights, plan.model)
