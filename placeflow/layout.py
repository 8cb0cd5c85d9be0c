"""Rank layouts of a model's training and generation, and what moving between them costs.

This module is the one source of truth for rank arithmetic: the simulator uses
it to cost a transition, the executor to perform one. It is pure (no
torch.distributed).

Training layout p-t-cp-d on p·t·cp·d ranks. Rank order (the one place of it)
is tp fastest, then pp, then cp, then dp:

    rank = tp + t·(pp + p·(cp + c·dp))

so that one weight replica (its t·p model-parallel ranks) is a block of
consecutive ranks and a TP group never straddles more devices than it must.
Context-parallel ranks hold identical weights (each runs 1/c of every
sequence), so for weights they are replicas like data-parallel ones: the
weight replica of a rank is cp + c·dp, d·c replicas in all, and gradients are
reduced and ZeRO state sharded over those d·c ranks (Megatron-core's data
parallel group "with context parallel"). Megatron orders tp-cp-ep-dp-pp,
which keeps a CP group on consecutive ranks; here a CP group is strided by t·p
(on the same node whenever t·p·c fits one), the price of the contiguous-replica
order that HybridFlow's grouping below needs.

Generation layout pg-tg-dg-d (HybridFlow §5): each training replica's t·p
ranks become dg = (t·p)/(tg·pg) generation replicas. Following HybridFlow's
grouping, inside a replica with local tp index i and pp index j:

- the micro-DP group of a rank is the mt = t/tg consecutive tp indices and the
  mp = p/pg consecutive pp indices around it: {i // mt · mt + a} × {j // mp · mp + b};
- its generation TP rank is i // mt and its generation PP rank is j // mp, so
  generation TP/PP groups are strided by mt and mp;
- hence every training shard is a sub-shard of the rank's generation shard, and
  an all-gather inside the micro-DP group builds the generation weights with no
  redundant copy: each rank receives (dg − 1)·M/(t·p) bytes, that is
  (t·p − tg·pg)/(tg·pg·t·p)·M, and holds M/(tg·pg) at peak.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from enum import StrEnum

from placeflow.errors import SpecError


def _positive(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise SpecError(f"{name} must be a positive integer, got {value!r}")


class CPKind(StrEnum):
    """How context-parallel ranks share a sequence's attention.

    RING: Megatron-core's context parallelism (`context_parallel_size`): every
    rank keeps 1/c of the tokens and the ranks pass their K/V chunks around a
    ring, c − 1 steps per attention, each overlapped with a step of attention
    compute. ULYSSES: DeepSpeed-Ulysses (verl's `ulysses_sequence_parallel_size`):
    every rank keeps 1/c of the tokens outside attention, and an all-to-all before
    attention trades sequence for heads (each rank attends over the whole
    sequence for heads/c heads), another after it trades them back.
    """

    RING = "ring"
    ULYSSES = "ulysses"


@dataclass(frozen=True, kw_only=True)
class TrainLayout:
    """Training parallelism: pipeline p, tensor t, data d (ZeRO sharding over d).

    Expert parallelism e (mixture-of-experts models only) is carved out of the
    d·cp weight replicas (data- and context-parallel ranks), as Megatron-core
    does with expert tensor parallelism equal to t: the e consecutive weight
    replicas at one (pp, tp) position form an expert-parallel group, each
    member holding num_experts / e of every MoE layer's experts (its tp-th
    slice of each); expert weights are then replicated d·cp / e times (the
    expert-data-parallel groups, which all-reduce expert gradients). Dense
    weights stay replicated d·cp times. e = 1 is a dense layout.

    Pipeline stages hold contiguous layers, L/p each, unless the first or the
    last stage is given its own layer count (Megatron-core's
    `num_layers_in_first_pipeline_stage` / `num_layers_in_last_pipeline_stage`,
    which NeMo RL sets for DeepSeek-V3's 61 layers: 3, then 14 stages of 4,
    then 2); the other stages then split the remaining layers evenly.
    `stage_layers` is the one place of that rule.

    Context parallelism cp splits every sequence over cp ranks (`CPKind` says
    how attention is shared); sequence_parallel is Megatron's sequence
    parallelism over the t ranks: the activations outside the attention and MLP
    GEMMs (norms, dropout, residuals) are split along the sequence over t, and
    each of the layer's two all-reduces becomes a reduce-scatter plus an
    all-gather of the same bytes.
    """

    p: int = 1
    t: int = 1
    d: int = 1
    e: int = 1
    cp: int = 1
    cp_kind: CPKind = CPKind.RING
    sequence_parallel: bool = False
    first_stage_layers: int = 0  # 0: not set, the first stage is an even one
    last_stage_layers: int = 0  # 0: not set, the last stage is an even one

    def __post_init__(self) -> None:
        for name in ("p", "t", "d", "e", "cp"):
            _positive(f"training {name}", getattr(self, name))
        if not isinstance(self.cp_kind, CPKind):
            raise SpecError(
                f"cp_kind must be one of {[k.value for k in CPKind]}, got {self.cp_kind!r}"
            )
        if self.sequence_parallel and self.t < 2:
            raise SpecError(
                "sequence_parallel splits activations over the tensor-parallel ranks: it "
                f"needs t >= 2, got t={self.t} (set sequence_parallel = false or raise t)"
            )
        for name in ("first_stage_layers", "last_stage_layers"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise SpecError(f"{name} must be a non-negative integer, got {value!r}")
        if self.uneven and self.p < 2:
            raise SpecError(
                "first_stage_layers / last_stage_layers need pipeline stages (p >= 2); "
                f"p={self.p} has one stage holding every layer"
            )
        if self.p == 2 and self.first_stage_layers and self.last_stage_layers:
            raise SpecError(
                "with p = 2 give first_stage_layers or last_stage_layers, not both "
                "(the other stage holds the remaining layers)"
            )
        if self.num_weight_replicas % self.e:
            times_cp = f" times context parallel cp={self.cp}" if self.cp > 1 else ""
            raise SpecError(
                f"expert parallel e={self.e} must divide data parallel d={self.d}{times_cp} "
                "(expert-parallel groups are carved out of the data-parallel replicas)"
            )

    @property
    def world_size(self) -> int:
        return self.p * self.t * self.cp * self.d

    @property
    def num_weight_replicas(self) -> int:
        """Ranks holding the same weights, d·cp: the gradient-reduction and ZeRO group."""
        return self.d * self.cp

    @property
    def uneven(self) -> bool:
        """Whether the first or last pipeline stage has its own layer count."""
        return bool(self.first_stage_layers or self.last_stage_layers)

    def stage_layers(self, num_layers: int) -> tuple[int, ...]:
        """Layers of each pipeline stage, first to last (class docstring); SpecError
        when `num_layers` does not split that way."""
        return split_stages(num_layers, self.p, self.first_stage_layers, self.last_stage_layers)

    def heaviest_stage_layers(self, num_layers: int) -> int:
        """Layers of the stage that bounds a pipeline's pace and a rank's memory."""
        return max(self.stage_layers(num_layers))

    @property
    def model_parallel_size(self) -> int:
        return self.p * self.t

    def rank(self, *, pp: int, tp: int, dp: int, cp: int = 0) -> int:
        """The rank at these coordinates (module docstring: tp, pp, cp, dp)."""
        return self.replica_rank(pp=pp, tp=tp, replica=cp + self.cp * dp)

    def replica_rank(self, *, pp: int, tp: int, replica: int) -> int:
        """The rank at (pp, tp) of weight replica `replica` (= cp + c·dp)."""
        return tp + self.t * (pp + self.p * replica)

    def coords(self, rank: int) -> tuple[int, int, int]:
        """(pp, tp, dp) of a rank; its cp index is `cp_rank`."""
        pp, tp, replica = self.replica_coords(rank)
        return pp, tp, replica // self.cp

    def cp_rank(self, rank: int) -> int:
        """The rank's index in its context-parallel group (which part of a sequence)."""
        return self.replica_coords(rank)[2] % self.cp

    def replica_coords(self, rank: int) -> tuple[int, int, int]:
        """(pp, tp, weight replica) of a rank: ranks equal but for the replica hold the
        same weights (data- and context-parallel peers)."""
        tp = rank % self.t
        pp = (rank // self.t) % self.p
        return pp, tp, rank // (self.t * self.p)

    def tp_groups(self) -> list[list[int]]:
        return [
            [self.replica_rank(pp=pp, tp=tp, replica=r) for tp in range(self.t)]
            for r in range(self.num_weight_replicas)
            for pp in range(self.p)
        ]

    def dp_groups(self) -> list[list[int]]:
        """Gradient-reduction groups: the d·cp ranks at one (pp, tp), which hold the same
        weights (Megatron-core's data-parallel group with context parallelism)."""
        return [
            [self.replica_rank(pp=pp, tp=tp, replica=r) for r in range(self.num_weight_replicas)]
            for pp in range(self.p)
            for tp in range(self.t)
        ]

    def cp_groups(self) -> list[list[int]]:
        """Context-parallel groups: the cp ranks sharing one sequence (ring or Ulysses)."""
        return [
            [self.rank(pp=pp, tp=tp, dp=dp, cp=c) for c in range(self.cp)]
            for dp in range(self.d)
            for pp in range(self.p)
            for tp in range(self.t)
        ]

    def pp_groups(self) -> list[list[int]]:
        return [
            [self.replica_rank(pp=pp, tp=tp, replica=r) for pp in range(self.p)]
            for r in range(self.num_weight_replicas)
            for tp in range(self.t)
        ]

    @property
    def expert_dp(self) -> int:
        """How many times each expert shard is replicated: d·cp / e."""
        return self.num_weight_replicas // self.e

    def ep_groups(self) -> list[list[int]]:
        """Expert-parallel groups: e consecutive weight replicas at one (pp, tp) (the
        all-to-all)."""
        return [
            [self.replica_rank(pp=pp, tp=tp, replica=block * self.e + j) for j in range(self.e)]
            for block in range(self.expert_dp)
            for pp in range(self.p)
            for tp in range(self.t)
        ]

    def expert_dp_groups(self) -> list[list[int]]:
        """Ranks holding the same expert shard (they all-reduce its gradients)."""
        return [
            [
                self.replica_rank(pp=pp, tp=tp, replica=block * self.e + j)
                for block in range(self.expert_dp)
            ]
            for j in range(self.e)
            for pp in range(self.p)
            for tp in range(self.t)
        ]

    def ep_rank(self, rank: int) -> int:
        """The rank's index in its expert-parallel group (which experts it holds)."""
        return self.replica_coords(rank)[2] % self.e


@dataclass(frozen=True, kw_only=True)
class GenLayout:
    """Generation parallelism of an actor trained with `train`: tensor tg, pipeline pg.

    Generation replicas per training (weight) replica: dg = t·p / (tg·pg); in all
    d·cp·dg replicas (a context-parallel rank's weights are a whole replica's:
    generation has no context parallelism).
    """

    train: TrainLayout
    tg: int = 1
    pg: int = 1

    def __post_init__(self) -> None:
        _positive("generation tg", self.tg)
        _positive("generation pg", self.pg)
        if self.train.t % self.tg:
            raise SpecError(
                f"generation tg={self.tg} must divide training t={self.train.t} "
                "(HybridFlow's grouping reuses training shards)"
            )
        if self.train.p % self.pg:
            raise SpecError(f"generation pg={self.pg} must divide training p={self.train.p}")

    @property
    def dg(self) -> int:
        return (self.train.t * self.train.p) // (self.tg * self.pg)

    def stage_layers(self, num_layers: int) -> tuple[int, ...]:
        """Layers of each generation pipeline stage: generation stage j is made of the
        p/pg consecutive training stages it gathers (HybridFlow's grouping above), so
        uneven training stages give uneven generation stages."""
        train = self.train.stage_layers(num_layers)
        return tuple(sum(train[j * self._mp : (j + 1) * self._mp]) for j in range(self.pg))

    @property
    def num_replicas(self) -> int:
        return self.train.num_weight_replicas * self.dg

    @property
    def _mt(self) -> int:
        return self.train.t // self.tg

    @property
    def _mp(self) -> int:
        return self.train.p // self.pg

    def coords(self, rank: int) -> tuple[int, int, int]:
        """(generation replica, gen pp rank, gen tp rank) of a training rank."""
        pp, tp, replica = self.train.replica_coords(rank)
        micro = tp % self._mt + self._mt * (pp % self._mp)
        return replica * self.dg + micro, pp // self._mp, tp // self._mt

    def micro_dp_groups(self) -> list[list[int]]:
        """Ranks that all-gather their training shards into one generation shard."""
        groups = []
        for replica in range(self.train.num_weight_replicas):
            for gpp in range(self.pg):
                for gtp in range(self.tg):
                    groups.append(
                        [
                            self.train.replica_rank(
                                pp=gpp * self._mp + b, tp=gtp * self._mt + a, replica=replica
                            )
                            for b in range(self._mp)
                            for a in range(self._mt)
                        ]
                    )
        return groups

    def tp_groups(self) -> list[list[int]]:
        """Generation TP groups (strided by t/tg inside a training TP group)."""
        by_key: dict[tuple[int, int], list[int]] = {}
        for rank in range(self.train.world_size):
            replica, gpp, _ = self.coords(rank)
            by_key.setdefault((replica, gpp), []).append(rank)
        return [sorted(g, key=lambda r: self.coords(r)[2]) for g in by_key.values()]

    def train_shards_of(self, rank: int) -> list[tuple[int, int]]:
        """(pp, tp) training shard indices making up this rank's generation shard."""
        _, gpp, gtp = self.coords(rank)
        return [
            (gpp * self._mp + b, gtp * self._mt + a)
            for b in range(self._mp)
            for a in range(self._mt)
        ]


@functools.cache
def split_stages(num_layers: int, p: int, first: int = 0, last: int = 0) -> tuple[int, ...]:
    """Layers of each of `p` contiguous pipeline stages: `first` / `last` layers on the
    first / last stage where given (non-zero), the rest split evenly (TrainLayout's rule;
    memoised because reshard plans ask it once per weight)."""
    fixed = (first > 0) + (last > 0)
    middle_stages = p - fixed
    middle_layers = num_layers - first - last
    if middle_stages == 0:
        if middle_layers != 0:
            raise SpecError(
                f"first_stage_layers={first} + last_stage_layers={last} must equal the "
                f"{num_layers} layers when p = 2"
            )
        return (first, last)
    if middle_layers < middle_stages or middle_layers % middle_stages:
        given = f" after first_stage_layers={first}" if first else ""
        given += f" and last_stage_layers={last}" if last else ""
        raise SpecError(
            f"pipeline p={p} must split the {num_layers} layers into contiguous stages: "
            f"{middle_layers} layers{given} do not divide into {middle_stages} equal stages; "
            "choose p dividing the layers, or set first_stage_layers / last_stage_layers "
            "(Megatron's uneven stages) so that the rest divides"
        )
    stages = [middle_layers // middle_stages] * middle_stages
    if first:
        stages.insert(0, first)
    if last:
        stages.append(last)
    return tuple(stages)


@functools.cache
def generator_stage_layers(num_layers: int, pg: int) -> tuple[int, ...]:
    """Layers of each pipeline stage of a generator on its own devices, as vLLM splits
    them (`vllm.distributed.utils.get_pp_indices` without VLLM_PP_LAYER_PARTITION):
    L // pg each, the remainder one more each on the stages before the last, from the
    end backwards (the last stage carries the final norm and head)."""
    if not 1 <= pg <= num_layers:
        raise SpecError(f"generation pg={pg} must be between 1 and the {num_layers} layers")
    stages = [num_layers // pg] * pg
    for i in range(2, num_layers % pg + 2):
        stages[-i] += 1
    return tuple(stages)


def stage_of_layer(layer: int, stages: tuple[int, ...]) -> int:
    """Pipeline stage holding `layer` when stage i holds stages[i] contiguous layers;
    the embedding (layer < 0) sits on the first stage, the final norm and head
    (layer >= the layer count) on the last."""
    bound = 0
    for stage, count in enumerate(stages):
        bound += count
        if layer < bound:
            return stage
    return len(stages) - 1


def colocated_transfer_bytes_per_rank(model_bytes: int, gen: GenLayout) -> float:
    """HybridFlow micro-DP all-gather volume received per GPU: (tp − tg·pg)/(tg·pg·tp)·M."""
    tp = gen.train.t * gen.train.p
    return (tp - gen.tg * gen.pg) / (gen.tg * gen.pg * tp) * model_bytes


def gen_shard_bytes(model_bytes: int, tg: int, pg: int) -> float:
    """Weights one generation rank holds: M/(tg·pg). The one place of this formula."""
    return model_bytes / (tg * pg)


def generation_shard_bytes(model_bytes: int, gen: GenLayout) -> float:
    """Weights one generation rank of `gen` holds (the colocated transfer's peak)."""
    return gen_shard_bytes(model_bytes, gen.tg, gen.pg)


def disjoint_transfer_bytes_per_gen_rank(model_bytes: int, tg: int, pg: int) -> float:
    """A generator on other devices receives its whole shard, M/(tg·pg), over the link."""
    return gen_shard_bytes(model_bytes, tg, pg)
