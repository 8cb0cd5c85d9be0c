"""Where each weight lives in training and in generation, and the colocated transfer between them.

Pure (no torch.distributed): `placeflow.executor.reshard` executes these plans,
`placeflow.simulator.callcosts` costs them (bytes and buckets), tests check them
without processes. It lives in the root package, not in the executor, so that
the simulator can import it (imports point one way). Rank arithmetic comes from
`placeflow.layout` only. `TinyLlama.from_model_spec` describes any catalogue
`ModelSpec` in the same form.

Sharding is Megatron's. Column-parallel weights (q, k, v, gate, up) split along
dim 0, row-parallel weights (o_proj, down_proj) along dim 1, embeddings and
lm_head along the vocabulary (dim 0); norms are replicated across TP. A fused
weight (qkv, gate_up) is split part by part: TP rank i holds
[q_i; k_i; v_i], not rows i·n/t..(i+1)·n/t of the fused tensor. A shard is
therefore a list of `Range`s of the full tensor along the split dim,
concatenated in order. Pipeline stages hold contiguous layers; the embedding
sits on the first stage, the final norm and lm_head on the last.

Colocated transfer (HybridFlow §5): each micro-DP group all-gathers its
training shards into generation shards. The departure from a plain all-gather
of one flat buffer is bucketing by *slot*: every rank lists the pieces it sends
(its stage's parameters in a stage-local order that aligns the stages: vocab
weight first, then layers, then the final norm), and slot j all-gathers the
j-th piece of every member, padded to the largest. The receiver places each
piece straight into its preallocated generation tensors, so at peak a rank
holds its generation shard plus one slot's gather buffer, never a second copy.

Replicated norms need no transfer when pg = p (a rank already has its stage's
norms). When pg < p a generation rank needs the norms of the other stages of its
group; the mt = t/tg ranks of a stage each send 1/mt of them (a chunk along
dim 0) so nothing is sent twice by one stage. Their bytes are counted apart
from the sharded bytes, which alone follow HybridFlow's formula.

Experts (mixture-of-experts layers): each routed expert is its own pair of
weights, `layers.i.moe.experts.j.gate_up` and `.down` (the router and the
shared experts are `layers.i.moe.router`, replicated as Megatron's router is,
and `layers.i.moe.shared_gate_up` / `shared_down`, split like the dense MLP).
An expert's weights are TP-split like the dense MLP's (expert TP = t, as
`TrainLayout` says) and held only by the expert-parallel rank whose block of
num_experts / e experts contains it, as a pipeline stage holds its layers. The
generation layout has no EP: every generation rank holds every expert (its tg
slice). So the colocated transfer gathers experts in a wider group than the
micro-DP one: the micro-DP groups of the e replicas of one EP group together
(`expert_groups`); with e = 1 that is the micro-DP group itself. A dense model
plans exactly as before.

Disjoint transfer (trainer and generator on different devices, `plan_disjoint`):
each generator rank receives its whole generation shard, M/(tg·pg) of the
sharded weights plus its stage's norms, as slices of the trainer ranks' shards
(generator replica r reads trainer replica r mod d). The slices are packed in
canonical order into buckets of at most `bucket_bytes`; a slice that does not fit
is split by rows across buckets, so one huge tensor (lm_head) never needs a
buffer of its own size.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from enum import StrEnum
from typing import ClassVar

from placeflow.errors import SpecError
from placeflow.layout import GenLayout, TrainLayout, generator_stage_layers, stage_of_layer
from placeflow.models import Feature, ModelSpec


class Sharding(StrEnum):
    COLUMN = "column"  # split dim 0, part by part for fused weights
    ROW = "row"  # split dim 1
    VOCAB = "vocab"  # split dim 0 (vocabulary)
    REPLICATED = "replicated"  # every TP rank holds all of it


@dataclass(frozen=True, kw_only=True)
class Range:
    """Rows (or columns) start..start+length of a full tensor along its split dim."""

    start: int
    length: int


@dataclass(frozen=True, kw_only=True)
class Placement:
    """Copy `length` slices along dim from `src_start` of a piece to `dst_start` of a shard."""

    src_start: int
    dst_start: int
    length: int


@dataclass(frozen=True, kw_only=True)
class ParamSpec:
    """One weight. `layer` is -1 for the embedding and num_layers for the final norm / lm_head."""

    name: str
    shape: tuple[int, ...]
    sharding: Sharding
    parts: tuple[int, ...]  # sizes of the fused parts along `dim` (one part if unfused)
    layer: int
    expert: int = -1  # index of the routed expert this weight belongs to; -1: not an expert

    @property
    def dim(self) -> int:
        return 1 if self.sharding is Sharding.ROW else 0

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    def numel_of(self, ranges: tuple[Range, ...]) -> int:
        """Elements of the shard made of `ranges` along `dim`."""
        return self.numel // self.shape[self.dim] * sum(r.length for r in ranges)

    def shard_shape(self, ranges: tuple[Range, ...]) -> tuple[int, ...]:
        shape = list(self.shape)
        shape[self.dim] = sum(r.length for r in ranges)
        return tuple(shape)

    def stage(self, stages: tuple[int, ...]) -> int:
        """Pipeline stage holding this weight when stage i holds stages[i] contiguous
        layers (`TrainLayout.stage_layers`, `GenLayout.stage_layers`)."""
        return stage_of_layer(self.layer, stages)


@dataclass(frozen=True, kw_only=True)
class TinyLlama:
    """A Llama/Qwen2/Qwen3-shaped model with fused qkv and gate_up; dtype_bytes per element.

    `qkv_bias` adds Qwen2's fused q/k/v bias (split like qkv); `qk_norm` adds
    Qwen3's per-head query and key RMSNorm weights (replicated: every rank
    applies the same head_dim weights to its heads); `head_dim` 0 means
    hidden / num_heads; `tied_embeddings` drops lm_head (the embedding is its
    only copy, so bytes match ModelSpec).
    """

    num_layers: int
    hidden: int
    num_heads: int
    num_kv_heads: int
    ffn: int
    vocab: int
    dtype_bytes: int = 4
    qkv_bias: bool = False
    qk_norm: bool = False
    head_dim: int = 0
    tied_embeddings: bool = False
    num_experts: int = 0  # routed experts per MoE layer; 0: a dense model
    expert_ffn: int = 0
    shared_ffn: int = 0  # shared experts' FFN size in all (0: none)
    dense_layers: int = 0  # the first layers keep a dense MLP of `ffn`

    # The ModelSpec features whose weights this layout describes.
    SUPPORTED: ClassVar[frozenset[Feature]] = frozenset(
        {Feature.QK_NORM, Feature.HEAD_DIM, Feature.MOE}
    )

    @classmethod
    def from_model_spec(cls, spec: ModelSpec) -> TinyLlama:
        """The weights of a catalogue (or HF config) model, in the plan's ParamSpec form."""
        spec.require_features(cls.SUPPORTED, "resharding (placeflow/reshard_plan.py)")
        moe = spec.moe
        return cls(
            num_layers=spec.num_layers,
            hidden=spec.hidden_size,
            num_heads=spec.num_heads,
            num_kv_heads=spec.num_kv_heads,
            head_dim=spec.head_dim,
            ffn=spec.ffn_hidden_size,
            vocab=spec.vocab_size,
            dtype_bytes=spec.dtype.num_bytes,
            qkv_bias=spec.qkv_bias,
            qk_norm=spec.qk_norm,
            tied_embeddings=spec.tied_embeddings,
            num_experts=moe.num_experts if moe else 0,
            expert_ffn=moe.expert_ffn_hidden_size if moe else 0,
            shared_ffn=moe.shared_ffn_hidden_size if moe else 0,
            dense_layers=moe.dense_layers if moe else 0,
        )

    def is_moe_layer(self, layer: int) -> bool:
        return self.num_experts > 0 and layer >= self.dense_layers

    def expert_rank(self, param: ParamSpec, e: int) -> int:
        """The expert-parallel rank (of e) holding `param`'s expert: contiguous blocks."""
        assert param.expert >= 0
        return param.expert // (self.num_experts // e)

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads or (
            not self.head_dim and self.hidden % self.num_heads
        ):
            raise SpecError(
                f"hidden {self.hidden} must be a multiple of num_heads {self.num_heads} (or "
                f"head_dim given), itself a multiple of num_kv_heads {self.num_kv_heads}"
            )
        if not self.head_dim:
            # Frozen: the derived value is stored once, as ModelSpec does.
            object.__setattr__(self, "head_dim", self.hidden // self.num_heads)

    def params(self) -> list[ParamSpec]:
        """All weights, in the canonical order (the order a seeded generator fills them)."""
        # A copy of the cached tuple: large models have hundreds of weights and the
        # plan asks for them once per rank.
        return list(_params(self))

    def _build_params(self) -> list[ParamSpec]:
        h, f, hd = self.hidden, self.ffn, self.head_dim
        q, kv = self.num_heads * hd, self.num_kv_heads * hd
        out = [ParamSpec(name="embed", shape=(self.vocab, h), sharding=Sharding.VOCAB,
                         parts=(self.vocab,), layer=-1)]  # fmt: skip
        for i in range(self.num_layers):
            pre = f"layers.{i}."
            out += [
                ParamSpec(name=pre + "input_norm", shape=(h,), sharding=Sharding.REPLICATED,
                          parts=(h,), layer=i),
                ParamSpec(name=pre + "qkv", shape=(q + 2 * kv, h), sharding=Sharding.COLUMN,
                          parts=(q, kv, kv), layer=i),
            ]  # fmt: skip
            if self.qkv_bias:
                bias = ParamSpec(name=pre + "qkv_bias", shape=(q + 2 * kv,),
                                 sharding=Sharding.COLUMN, parts=(q, kv, kv), layer=i)  # fmt: skip
                out.append(bias)
            if self.qk_norm:
                out += [
                    ParamSpec(name=pre + norm, shape=(hd,), sharding=Sharding.REPLICATED,
                              parts=(hd,), layer=i)
                    for norm in ("q_norm", "k_norm")
                ]  # fmt: skip
            out += [
                ParamSpec(name=pre + "o_proj", shape=(h, q), sharding=Sharding.ROW,
                          parts=(q,), layer=i),
                ParamSpec(name=pre + "post_norm", shape=(h,), sharding=Sharding.REPLICATED,
                          parts=(h,), layer=i),
            ]  # fmt: skip
            out += self._moe_params(i) if self.is_moe_layer(i) else self._mlp_params(i, f, "")
        n = self.num_layers
        out.append(
            ParamSpec(name="norm", shape=(h,), sharding=Sharding.REPLICATED, parts=(h,), layer=n)
        )
        if not self.tied_embeddings:
            out.append(ParamSpec(name="lm_head", shape=(self.vocab, h), sharding=Sharding.VOCAB,
                                 parts=(self.vocab,), layer=n))  # fmt: skip
        return out

    def _mlp_params(self, i: int, f: int, kind: str, expert: int = -1) -> list[ParamSpec]:
        """A SwiGLU MLP's fused gate_up (column) and down (row) weights named `kind`."""
        h, pre = self.hidden, f"layers.{i}."
        down = "down" if kind else "down_proj"
        return [
            ParamSpec(name=f"{pre}{kind}gate_up", shape=(2 * f, h), sharding=Sharding.COLUMN,
                      parts=(f, f), layer=i, expert=expert),
            ParamSpec(name=f"{pre}{kind}{down}", shape=(h, f), sharding=Sharding.ROW,
                      parts=(f,), layer=i, expert=expert),
        ]  # fmt: skip

    def _moe_params(self, i: int) -> list[ParamSpec]:
        """Router, shared experts (if any), then the routed experts in index order."""
        e, h = self.num_experts, self.hidden
        out = [ParamSpec(name=f"layers.{i}.moe.router", shape=(e, h),
                         sharding=Sharding.REPLICATED, parts=(e,), layer=i)]  # fmt: skip
        if self.shared_ffn:
            out += self._mlp_params(i, self.shared_ffn, "moe.shared_")
        for j in range(e):
            out += self._mlp_params(i, self.expert_ffn, f"moe.experts.{j}.", expert=j)
        return out

    def check_layout(self, train: TrainLayout) -> None:
        """Raise SpecError unless every weight splits evenly under `train`."""
        if self.num_kv_heads % train.t:
            raise SpecError(
                f"num_kv_heads {self.num_kv_heads} must be a multiple of t={train.t} "
                "(Megatron TP gives each rank whole heads)"
            )
        train.stage_layers(self.num_layers)  # SpecError unless the layers split into stages
        if train.e > 1 and self.num_experts % train.e:
            raise SpecError(
                f"expert parallel e={train.e} must divide the {self.num_experts} experts "
                "(each EP rank holds a contiguous block of them)"
            )
        for param in self.params():
            if any(part % train.t for part in param.parts):
                raise SpecError(
                    f"{param.name}: parts {param.parts} must be multiples of t={train.t} "
                    "(Megatron TP splits whole heads and rows)"
                )

    def total_bytes(self, *, sharded_only: bool = False) -> int:
        return self.dtype_bytes * sum(
            p.numel
            for p in self.params()
            if not (sharded_only and p.sharding is Sharding.REPLICATED)
        )


@functools.cache
def _params(model: TinyLlama) -> tuple[ParamSpec, ...]:
    return tuple(model._build_params())


# --- shards ------------------------------------------------------------------


def split_ranges(param: ParamSpec, degree: int, index: int) -> tuple[Range, ...]:
    """Shard `index` of `degree` along `dim`: the index-th slice of every fused part."""
    ranges, offset = [], 0
    for part in param.parts:
        size = part // degree
        ranges.append(Range(start=offset + index * size, length=size))
        offset += part
    return tuple(ranges)


def _full(param: ParamSpec) -> tuple[Range, ...]:
    return (Range(start=0, length=param.shape[param.dim]),)


def train_shard(
    model: TinyLlama, param: ParamSpec, train: TrainLayout, rank: int
) -> tuple[Range, ...] | None:
    """Ranges of `param` that training `rank` holds; None if another stage holds it."""
    pp, tp, _ = train.coords(rank)
    if param.stage(train.stage_layers(model.num_layers)) != pp:
        return None
    if param.expert >= 0 and model.expert_rank(param, train.e) != train.ep_rank(rank):
        return None  # another EP rank's expert
    if param.sharding is Sharding.REPLICATED:
        return _full(param)
    return split_ranges(param, train.t, tp)


def gen_shard(
    model: TinyLlama, param: ParamSpec, gen: GenLayout, rank: int
) -> tuple[Range, ...] | None:
    """Ranges of `param` that `rank` holds for generation (GenLayout's tg, pg); None if none."""
    _, gpp, gtp = gen.coords(rank)
    if param.stage(gen.stage_layers(model.num_layers)) != gpp:
        return None
    if param.sharding is Sharding.REPLICATED:
        return _full(param)
    return split_ranges(param, gen.tg, gtp)


def transfer_piece(
    model: TinyLlama, param: ParamSpec, gen: GenLayout, rank: int
) -> tuple[Range, ...] | None:
    """Ranges of `param` that `rank` sends in its micro-DP all-gather; None if it sends none."""
    ranges = train_shard(model, param, gen.train, rank)
    if ranges is None or param.sharding is not Sharding.REPLICATED:
        return ranges
    mp, mt = gen.train.p // gen.pg, gen.train.t // gen.tg
    if mp == 1:
        return None  # every generation rank already holds its own stage's norms
    # The stage's mt ranks in the group each send 1/mt of the norm, not mt copies of it.
    chunk = param.shape[0] // mt
    return (Range(start=(gen.train.coords(rank)[1] % mt) * chunk, length=chunk),)


def placements(src: tuple[Range, ...], dst: tuple[Range, ...]) -> list[Placement]:
    """Where each range of a piece lands in a shard; every src range lies inside one dst range."""
    out, src_offset = [], 0
    for s in src:
        dst_offset = 0
        for d in dst:
            if d.start <= s.start and s.start + s.length <= d.start + d.length:
                out.append(
                    Placement(
                        src_start=src_offset,
                        dst_start=dst_offset + s.start - d.start,
                        length=s.length,
                    )
                )
                break
            dst_offset += d.length
        else:
            raise AssertionError(f"range {s} is not inside the shard {dst}")
        src_offset += s.length
    return out


# --- the colocated transfer plan --------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Slot:
    """One bucket: member k sends `pieces[k]` (or nothing), padded to `padded_numel`."""

    pieces: tuple[ParamSpec | None, ...]
    numels: tuple[int, ...]
    padded_numel: int


@dataclass(frozen=True, kw_only=True)
class GroupTransfer:
    """The all-gathers of one micro-DP group, slot by slot; `ranks` in the layout's group order."""

    ranks: tuple[int, ...]
    slots: tuple[Slot, ...]


@dataclass(frozen=True, kw_only=True)
class RankTransfer:
    """What one rank moves and holds in the colocated reshard (bytes)."""

    rank: int
    received_sharded_bytes: int  # TP/PP-sharded weights from the other members (payload)
    received_replicated_bytes: int  # norm chunks from the other members (payload)
    wire_bytes: int  # received including slot padding; also what it sends in a ring all-gather
    gen_shard_bytes: int  # its generation weights (allocated up front)
    bucket_bytes: int  # largest slot: gather output plus a padded send buffer
    peak_extra_bytes: int  # gen_shard_bytes + bucket_bytes


@dataclass(frozen=True, kw_only=True)
class ReshardPlan:
    model: TinyLlama
    gen: GenLayout
    groups: tuple[GroupTransfer, ...]
    ranks: tuple[RankTransfer, ...]  # indexed by rank
    # The experts' all-gathers (`expert_groups`); empty for a dense model.
    expert_groups: tuple[GroupTransfer, ...] = ()

    def group_of(self, rank: int) -> GroupTransfer:
        return next(g for g in self.groups if rank in g.ranks)

    def expert_group_of(self, rank: int) -> GroupTransfer | None:
        return next((g for g in self.expert_groups if rank in g.ranks), None)


def expert_groups(gen: GenLayout) -> list[list[int]]:
    """Ranks that all-gather routed experts: the micro-DP groups of one EP group's e
    replicas, EP member by member (the micro-DP groups themselves when e = 1)."""
    train = gen.train
    ep_of = {r: g for g in train.ep_groups() for r in g}
    return [
        [ep_of[r][j] for j in range(train.e) for r in group]
        for group in gen.micro_dp_groups()
        if train.ep_rank(group[0]) == 0  # one per EP group: the one of its first replica
    ]


def stage_order(
    model: TinyLlama, gen: GenLayout, rank: int, *, experts: bool = False
) -> list[ParamSpec]:
    """The pieces `rank` sends, vocab weight first so that the stages' slots line up;
    the routed experts' pieces only (`experts`) or every other weight's."""
    pp = gen.train.coords(rank)[0]
    stages = gen.train.stage_layers(model.num_layers)
    sent = [
        (p.sharding is not Sharding.VOCAB, i, p)
        for i, p in enumerate(model.params())
        # Another stage's parameters send nothing (transfer_piece is None): skip them cheaply.
        if p.stage(stages) == pp
        and (p.expert >= 0) == experts
        and transfer_piece(model, p, gen, rank) is not None
    ]
    # Sort on (vocab first, canonical index); the index keeps the sort off ParamSpec.
    return [p for *_, p in sorted(sent, key=lambda e: (e[0], e[1]))]


def _sent_pieces(
    model: TinyLlama, gen: GenLayout, rank: int, *, experts: bool
) -> tuple[tuple[ParamSpec, int], ...]:
    """`stage_order`'s pieces of `rank`, each with the elements it sends."""
    return tuple(
        (p, p.numel_of(transfer_piece(model, p, gen, rank) or ()))
        for p in stage_order(model, gen, rank, experts=experts)
    )


def _group_transfer(
    model: TinyLlama,
    gen: GenLayout,
    ranks: list[int],
    *,
    experts: bool = False,
    memo: dict[tuple[int, int, bool], tuple[tuple[ParamSpec, int], ...]] | None = None,
) -> GroupTransfer:
    # A group of one (tg = t, pg = p, e = 1) keeps its shards: nothing to gather.
    if len(ranks) <= 1:
        return GroupTransfer(ranks=tuple(ranks), slots=())
    memo = {} if memo is None else memo
    lists = []
    for r in ranks:
        # What a rank sends depends on its training stage and EP rank only (a TP
        # rank's slice of a weight has the same size as every other's), so the
        # ranks of one stage share their list, in a group and across groups.
        key = (gen.train.coords(r)[0], gen.train.ep_rank(r), experts)
        if key not in memo:
            memo[key] = _sent_pieces(model, gen, r, experts=experts)
        lists.append(memo[key])
    slots = []
    for j in range(max(len(pl) for pl in lists)):
        sent = [pl[j] if j < len(pl) else None for pl in lists]
        numels = tuple(0 if s is None else s[1] for s in sent)
        pieces = tuple(None if s is None else s[0] for s in sent)
        slots.append(Slot(pieces=pieces, numels=numels, padded_numel=max(numels)))
    return GroupTransfer(ranks=tuple(ranks), slots=tuple(slots))


def _gen_shard_bytes(model: TinyLlama, gen: GenLayout, rank: int) -> int:
    return model.dtype_bytes * sum(
        p.numel_of(ranges)
        for p in model.params()
        if (ranges := gen_shard(model, p, gen, rank)) is not None
    )


@dataclass(frozen=True, kw_only=True)
class _GroupTotals:
    """One group's sums over its slots: what its members send, by kind, and the wire."""

    sharded: tuple[int, ...]  # per member: the elements of TP/PP-sharded pieces it sends
    replicated: tuple[int, ...]  # per member: the elements of norm chunks it sends
    wire_numel: int  # sum over slots of (size - 1) x padded
    bucket_numel: int  # largest slot's (size + 1) x padded


def _group_totals(group: GroupTransfer) -> _GroupTotals:
    size = len(group.ranks)
    sharded, replicated = [0] * size, [0] * size
    wire = bucket = 0
    for slot in group.slots:
        wire += (size - 1) * slot.padded_numel
        bucket = max(bucket, (size + 1) * slot.padded_numel)
        for k, (piece, numel) in enumerate(zip(slot.pieces, slot.numels, strict=True)):
            if piece is None:
                continue
            if piece.sharding is Sharding.REPLICATED:
                replicated[k] += numel
            else:
                sharded[k] += numel
    return _GroupTotals(
        sharded=tuple(sharded),
        replicated=tuple(replicated),
        wire_numel=wire,
        bucket_numel=bucket,
    )


def _rank_transfer(
    model: TinyLlama,
    groups: list[tuple[GroupTransfer, _GroupTotals]],
    rank: int,
    gen_bytes: int,
) -> RankTransfer:
    """A rank receives every other member's pieces of each of its groups."""
    b = model.dtype_bytes
    sharded = replicated = wire = bucket = 0
    for group, totals in groups:
        me = group.ranks.index(rank)
        sharded += (sum(totals.sharded) - totals.sharded[me]) * b
        replicated += (sum(totals.replicated) - totals.replicated[me]) * b
        wire += totals.wire_numel * b
        bucket = max(bucket, totals.bucket_numel * b)
    return RankTransfer(
        rank=rank,
        received_sharded_bytes=sharded,
        received_replicated_bytes=replicated,
        wire_bytes=wire,
        gen_shard_bytes=gen_bytes,
        bucket_bytes=bucket,
        peak_extra_bytes=gen_bytes + bucket,
    )


def plan_reshard(model: TinyLlama, gen: GenLayout) -> ReshardPlan:
    """The colocated transfer of `model` from `gen.train` to `gen`, group by group
    (then, for a mixture of experts, the routed experts' groups)."""
    model.check_layout(gen.train)
    memo: dict[tuple[int, int, bool], tuple[tuple[ParamSpec, int], ...]] = {}
    groups = tuple(_group_transfer(model, gen, g, memo=memo) for g in gen.micro_dp_groups())
    experts = (
        tuple(_group_transfer(model, gen, g, experts=True, memo=memo) for g in expert_groups(gen))
        if model.num_experts
        else ()
    )
    totals = {id(g): _group_totals(g) for g in (*groups, *experts)}
    expert_of: dict[int, list[GroupTransfer]] = {}
    for g in experts:
        for r in g.ranks:
            expert_of.setdefault(r, []).append(g)
    by_rank = {}
    # A generation shard's size depends only on the rank's generation stage (its
    # TP slices of a weight all have one size): sized once per stage.
    gen_bytes: dict[int, int] = {}
    for group in groups:
        for rank in group.ranks:
            gpp = gen.coords(rank)[1]
            if gpp not in gen_bytes:
                gen_bytes[gpp] = _gen_shard_bytes(model, gen, rank)
            mine = [group, *expert_of.get(rank, [])]
            by_rank[rank] = _rank_transfer(
                model, [(g, totals[id(g)]) for g in mine], rank, gen_bytes[gpp]
            )
    return ReshardPlan(
        model=model,
        gen=gen,
        groups=groups,
        ranks=tuple(by_rank[r] for r in range(gen.train.world_size)),
        expert_groups=experts,
    )


@dataclass(frozen=True, kw_only=True)
class RankWork:
    """A rank's host work in its colocated reshard beyond the all-gathers, counted as
    `executor.reshard.reshard_colocated` runs it: `pieces` copies into its generation
    tensors (its own training shard's part of each tensor that it does not hand over
    as is, then every other member's piece of each slot), `slots` all-gathers (each
    with its send and receive buffers to allocate), and the bytes those copies move."""

    pieces: int
    slots: int
    placed_bytes: int


def rank_work(plan: ReshardPlan, rank: int) -> RankWork:
    """`rank`'s `RankWork` in `plan` (its dense group, then its expert group)."""
    model, gen = plan.model, plan.gen
    b = model.dtype_bytes
    pieces = placed = 0
    for p in model.params():
        ranges = gen_shard(model, p, gen, rank)
        own = train_shard(model, p, gen.train, rank)
        if ranges is None or own is None or own == ranges:
            continue  # nothing of its own to copy in (no tensor, or handed over as is)
        pieces += 1
        placed += p.numel_of(own) * b
    groups = [plan.group_of(rank), plan.expert_group_of(rank)]
    slots = 0
    for group in groups:
        if group is None:
            continue
        me = group.ranks.index(rank)
        slots += len(group.slots)
        for slot in group.slots:
            for k, (piece, numel) in enumerate(zip(slot.pieces, slot.numels, strict=True)):
                if k != me and piece is not None:
                    pieces += 1
                    placed += numel * b
    return RankWork(pieces=pieces, slots=slots, placed_bytes=placed)


# --- the disjoint transfer plan ---------------------------------------------
#
# Trainer and generator on different devices: nothing is gathered in place, each
# generator rank receives its whole generation shard over the link, in buckets,
# from the trainer ranks that hold the slices of it.


# Bucket size of the weight sync between disjoint sets: the executor sends in
# buckets of this size and the simulator prices the same buckets.
WEIGHT_SYNC_BUCKET_BYTES = 512 << 20


@dataclass(frozen=True, kw_only=True)
class GeneratorLayout:
    """Generation parallelism on its own ranks: tensor tg, pipeline pg, `replicas` copies.

    Rank order mirrors TrainLayout: tg fastest, then pg, then replica.
    """

    tg: int = 1
    pg: int = 1
    replicas: int = 1

    def __post_init__(self) -> None:
        for name in ("tg", "pg", "replicas"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise SpecError(f"generator {name} must be a positive integer, got {value!r}")

    @property
    def world_size(self) -> int:
        return self.tg * self.pg * self.replicas

    def rank(self, *, replica: int, pp: int, tp: int) -> int:
        return tp + self.tg * (pp + self.pg * replica)

    def coords(self, rank: int) -> tuple[int, int, int]:
        """(replica, gen pp rank, gen tp rank) of a generator rank."""
        return rank // (self.tg * self.pg), (rank // self.tg) % self.pg, rank % self.tg


@dataclass(frozen=True, kw_only=True)
class Send:
    """Trainer `src` sends `rows` of `param` (along its split dim) to generator rank `dst`.

    `dst_start` is where the rows land along that dim in the generator's shard.
    """

    src: int
    dst: int
    param: ParamSpec
    rows: Range
    dst_start: int

    @property
    def numel(self) -> int:
        return self.param.numel_of((self.rows,))


@dataclass(frozen=True, kw_only=True)
class Bucket:
    """Sends that a generator rank receives as one message batch (at most the bucket size)."""

    sends: tuple[Send, ...]
    num_bytes: int


@dataclass(frozen=True, kw_only=True)
class GeneratorTransfer:
    """Everything one generator rank receives, bucket by bucket (bytes)."""

    rank: int
    buckets: tuple[Bucket, ...]
    received_sharded_bytes: int  # TP/PP-sharded weights: M_sharded/(tg·pg) on average
    received_replicated_bytes: int  # its stage's norms, whole


@dataclass(frozen=True, kw_only=True)
class DisjointPlan:
    model: TinyLlama
    train: TrainLayout
    gen: GeneratorLayout
    bucket_bytes: int
    ranks: tuple[GeneratorTransfer, ...]  # indexed by generator rank


def _sources(
    model: TinyLlama, param: ParamSpec, train: TrainLayout, gen: GeneratorLayout, dst: int
) -> list[Send]:
    """The slices of `dst`'s generation shard of `param`, each from the trainer rank holding it."""
    replica, gpp, gtp = gen.coords(dst)
    if param.stage(generator_stage_layers(model.num_layers, gen.pg)) != gpp:
        return []
    stage = param.stage(train.stage_layers(model.num_layers))
    # Generator replica r pulls from trainer weight replica r mod d·cp, so replicas
    # spread their load over the trainer's copies (data- and context-parallel ranks
    # hold the same weights).
    dp = replica % train.num_weight_replicas
    if param.expert >= 0:  # held by one EP member of that replica's EP group (cp = 1)
        dp = dp // train.e * train.e + model.expert_rank(param, train.e)
    if param.sharding is Sharding.REPLICATED:
        src = train.replica_rank(pp=stage, tp=gtp % train.t, replica=dp)  # spread over TP
        return [Send(src=src, dst=dst, param=param, rows=_full(param)[0], dst_start=0)]
    sends, dst_start = [], 0
    # Parts are split one by one (fused weights), so each generation range lies
    # inside one part; intersect it with each trainer TP rank's slice of that part.
    part_start = 0
    for part, want in zip(param.parts, split_ranges(param, gen.tg, gtp), strict=True):
        size = part // train.t
        for tp in range(train.t):
            lo = max(want.start, part_start + tp * size)
            hi = min(want.start + want.length, part_start + (tp + 1) * size)
            if lo < hi:
                src = train.replica_rank(pp=stage, tp=tp, replica=dp)
                sends.append(
                    Send(
                        src=src,
                        dst=dst,
                        param=param,
                        rows=Range(start=lo, length=hi - lo),
                        dst_start=dst_start + lo - want.start,
                    )
                )
        dst_start += want.length
        part_start += part
    return sends


def _bucketed(model: TinyLlama, sends: list[Send], bucket_bytes: int) -> list[Bucket]:
    """Fill buckets in order; a slice larger than the space left is split by rows."""
    buckets: list[Bucket] = []
    current: list[Send] = []
    used = 0
    for send in sends:
        row_bytes = send.param.numel_of((Range(start=0, length=1),)) * model.dtype_bytes
        if row_bytes > bucket_bytes:
            raise SpecError(
                f"bucket of {bucket_bytes} bytes is smaller than one row ({row_bytes} bytes) "
                f"of {send.param.name}"
            )
        rest: Send | None = send
        while rest is not None:
            fit = min((bucket_bytes - used) // row_bytes, rest.rows.length)
            if fit == 0:
                buckets.append(Bucket(sends=tuple(current), num_bytes=used))
                current, used = [], 0
                continue
            head = Send(
                src=rest.src,
                dst=rest.dst,
                param=rest.param,
                rows=Range(start=rest.rows.start, length=fit),
                dst_start=rest.dst_start,
            )
            current.append(head)
            used += fit * row_bytes
            left = rest.rows.length - fit
            rest = (
                None
                if left == 0
                else Send(
                    src=rest.src,
                    dst=rest.dst,
                    param=rest.param,
                    rows=Range(start=rest.rows.start + fit, length=left),
                    dst_start=rest.dst_start + fit,
                )
            )
    if current:
        buckets.append(Bucket(sends=tuple(current), num_bytes=used))
    return buckets


def plan_disjoint(
    model: TinyLlama, train: TrainLayout, gen: GeneratorLayout, bucket_bytes: int
) -> DisjointPlan:
    """Which trainer rank sends which slice to which generator rank, bucket by bucket."""
    model.check_layout(train)
    model.check_layout(TrainLayout(p=gen.pg, t=gen.tg))  # generation shards split evenly too
    if bucket_bytes <= 0:
        raise SpecError(f"bucket_bytes must be positive, got {bucket_bytes}")
    ranks = []
    for dst in range(gen.world_size):
        sends = [s for p in model.params() for s in _sources(model, p, train, gen, dst)]
        sharded = sum(s.numel for s in sends if s.param.sharding is not Sharding.REPLICATED)
        replicated = sum(s.numel for s in sends if s.param.sharding is Sharding.REPLICATED)
        ranks.append(
            GeneratorTransfer(
                rank=dst,
                buckets=tuple(_bucketed(model, sends, bucket_bytes)),
                received_sharded_bytes=sharded * model.dtype_bytes,
                received_replicated_bytes=replicated * model.dtype_bytes,
            )
        )
    return DisjointPlan(
        model=model, train=train, gen=gen, bucket_bytes=bucket_bytes, ranks=tuple(ranks)
    )
