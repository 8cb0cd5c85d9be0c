"""The search space: placements, GPU counts per set and parallelism per role.

- Placements are the set partitions of the workload's roles (Bell numbers: 15
  for PPO's four models, 52 for Safe-RLHF's five), each named by its kind:
  colocate (one set), standalone (every role alone), split (actor+ref |
  critic+reward), hybrid (any other partition).
- A set gets either whole nodes of one pool, or a power-of-two divisor of a
  node. Power-of-two sizes divide one another, so sub-node sets always pack
  into the nodes left over (first-fit decreasing is then exact). Whole-node
  counts are k nodes with k a sum of at most two powers of two (1, 2, 3, 4,
  5, 6, 8, 9, 10, 12, 16, 17, 18, 20, 24, 32, ...; a step of at most 1/4 of
  the count) or the whole pool: about 2·log2(N)²/2 counts rather than N, which
  keeps the cost table small on clusters of hundreds of nodes. "Optimal" is
  optimal within this space.
- A role's parallelism on n GPUs: tensor t a power of two within a node that
  divides n and the heads (and agrees with the KV heads), pipeline p a power
  of two up to 8 dividing the layers with p·t | n, d = n/(p·t); ZeRO 1 or 3
  for trained roles; micro-batches of 1, 4 or 16 samples; for the actor a
  generation tensor size tg | t (generation pipeline pg = 1: a single decode
  batch gains no time from pipelining, see simulator.compute). A
  mixture-of-experts model also chooses its expert parallelism e, a power of
  two dividing d and the experts (`expert_parallel_options`; e = 1 for dense
  models); an EP group spans e·t·p consecutive devices, and the simulator
  prices its all-to-all across nodes when that exceeds a node, so groups
  inside a node win where they fit. For long samples (prompt + response of
  at least `LONG_SEQUENCE_TOKENS`, 8k) the trained roles also choose
  Megatron's ring context parallelism cp, a power of two up to
  `MAX_CONTEXT_PARALLEL` with p·t·cp | n and the sample splitting into 2·cp
  chunks (d = n/(p·t·cp)), and, where t > 1, sequence parallelism on or off:
  both cut activation memory, so they are worth their communication only when
  activations dominate; below 8k tokens the space is the one without them, so
  that short-sequence plans are unchanged. (Ulysses is priced and plannable by
  hand, not searched: for the same degree it saves the same memory.) Trained roles
  also choose the memory savers users otherwise set by hand: activation
  recomputation on or off, and (on GPU pools) the Adam state offloaded to host
  memory outside the update, priced by the simulator from the host link
  (`simulator.calls.train_cost`), alone or with the weights (`offload_params`,
  verl's param_offload: the weights come back over the host link for every call,
  `simulator.rolecosts.with_param_reload`); forward-only roles may offload their
  weights the same way. A colocated set then holds one role's weights at a time,
  which buys KV cache and micro-batch room for the copies' time.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from enum import StrEnum

from placeflow.cluster import PoolSpec
from placeflow.hardware import DeviceKind
from placeflow.layout import TrainLayout
from placeflow.models import ModelSpec
from placeflow.plan import OptimizerStep, RoleParallelism
from placeflow.workload import Role

MICRO_BATCHES = (1, 4, 16)
MAX_PIPELINE = 8
LONG_SEQUENCE_TOKENS = 8192  # samples at least this long also search cp and SP
MAX_CONTEXT_PARALLEL = 8


class PlacementKind(StrEnum):
    COLOCATE = "colocate"
    STANDALONE = "standalone"
    SPLIT = "split"
    HYBRID = "hybrid"


@dataclass(frozen=True)
class Placement:
    """A partition of roles into colocated sets, in canonical order."""

    sets: tuple[tuple[Role, ...], ...]
    kind: PlacementKind

    def label(self) -> str:
        return " | ".join("+".join(r.value for r in s) for s in self.sets)


def set_partitions(items: tuple[Role, ...]) -> Iterator[tuple[tuple[Role, ...], ...]]:
    """All partitions of `items`; each block and the block list keep the input order."""
    if not items:
        yield ()
        return
    first, rest = items[0], items[1:]
    for partition in set_partitions(rest):
        yield ((first,), *partition)
        for i in range(len(partition)):
            yield (*partition[:i], (first, *partition[i]), *partition[i + 1 :])


def placement_kind(sets: tuple[tuple[Role, ...], ...]) -> PlacementKind:
    if len(sets) == 1:
        return PlacementKind.COLOCATE
    if all(len(s) == 1 for s in sets):
        return PlacementKind.STANDALONE
    blocks = {frozenset(s) for s in sets}
    if blocks == {frozenset({Role.ACTOR, Role.REF}), frozenset({Role.CRITIC, Role.REWARD})}:
        return PlacementKind.SPLIT
    return PlacementKind.HYBRID


def enumerate_placements(roles: tuple[Role, ...]) -> list[Placement]:
    order = list(Role)
    out = []
    for partition in set_partitions(roles):
        canon = tuple(
            sorted(
                (tuple(sorted(b, key=order.index)) for b in partition),
                key=lambda b: order.index(b[0]),
            )
        )
        out.append(Placement(sets=canon, kind=placement_kind(canon)))
    return out


MAX_NODE_COUNT_BITS = 2


def candidate_counts(pool: PoolSpec) -> list[int]:
    """GPU counts a set may take in `pool`: power-of-two divisors of a node, or k whole
    nodes with k a sum of at most MAX_NODE_COUNT_BITS powers of two, or the whole pool."""
    per_node = pool.gpus_per_node
    sub = [
        c
        for c in (1 << i for i in range(per_node.bit_length()))
        if c < per_node and per_node % c == 0
    ]
    nodes = [
        k
        for k in range(1, pool.num_nodes + 1)
        if k.bit_count() <= MAX_NODE_COUNT_BITS or k == pool.num_nodes
    ]
    return sub + [k * per_node for k in nodes]


def _powers_of_two(limit: int) -> list[int]:
    return [1 << i for i in range(limit.bit_length()) if (1 << i) <= limit]


def parallelism_options(
    model: ModelSpec, role: Role, n: int, pool: PoolSpec, *, seq_len: int = 0
) -> list[RoleParallelism]:
    """Every parallelism of `role` on n GPUs (module docstring); `seq_len`, a sample's
    prompt + response tokens, opens context and sequence parallelism when long."""
    trained = role.trained
    out = []
    for t in _powers_of_two(min(n, pool.gpus_per_node)):
        if n % t or not model.supports_tp(t):
            continue
        for p in _powers_of_two(MAX_PIPELINE):
            if n % (p * t) or model.num_layers % p:
                continue
            layouts = _layouts(model, n, p, t, seq_len if trained else 0)
            d = n // (p * t)
            tgs = (
                [tg for tg in _powers_of_two(t) if t % tg == 0 and model.supports_tp(tg)]
                if role is Role.ACTOR
                else [1]
            )
            # Frozen roles shard their weights with zero = 3 (over d > 1 only).
            zeros = (1, 3) if trained or d > 1 else (1,)
            for layout, zero, mb, tg, savers in itertools.product(
                layouts, zeros, MICRO_BATCHES, tgs, _memory_savers(role, pool)
            ):
                recompute, offload, step, offload_params = savers
                out.append(
                    RoleParallelism(
                        train=layout,
                        tg=tg,
                        pg=1,
                        micro_batch=mb,
                        zero=zero,
                        recompute=recompute,
                        offload_optimizer=offload,
                        optimizer_step=step,
                        offload_params=offload_params,
                    )
                )
    return out


def _layouts(model: ModelSpec, n: int, p: int, t: int, seq_len: int) -> list[TrainLayout]:
    """Training layouts with p, t on n GPUs: experts over d (MoE), and for samples of
    at least LONG_SEQUENCE_TOKENS ring context parallelism and sequence parallelism."""
    long = seq_len >= LONG_SEQUENCE_TOKENS
    cps = [
        cp
        for cp in _powers_of_two(MAX_CONTEXT_PARALLEL if long else 1)
        if n % (p * t * cp) == 0 and seq_len % (2 * cp if cp > 1 else 1) == 0
    ]
    sps = (False, True) if long and t > 1 else (False,)
    return [
        TrainLayout(p=p, t=t, d=n // (p * t * cp), e=e, cp=cp, sequence_parallel=sp)
        for cp in cps
        for e in expert_parallel_options(model, n // (p * t))  # e divides d·cp
        for sp in sps
    ]


def expert_parallel_options(model: ModelSpec, d: int) -> list[int]:
    """Expert-parallel sizes e for `model` with data parallelism d: powers of two that
    divide d and the experts (the plan's rule); [1] for a dense model."""
    if model.moe is None:
        return [1]
    experts = model.moe.num_experts
    return [e for e in _powers_of_two(d) if d % e == 0 and experts % e == 0]


def _memory_savers(role: Role, pool: PoolSpec) -> list[tuple[bool, bool, OptimizerStep, bool]]:
    """(recompute, offload_optimizer, optimizer_step, offload_params) a role may use: for
    trained roles recomputation on or off times no offload, the Adam state offloaded with
    the device step or with the host step, or the Adam state and the weights offloaded
    (verl's optimizer_offload + param_offload); for forward-only roles the weights kept
    or offloaded. Offloads only on GPU pools (a CPU worker's host is its device)."""
    device = OptimizerStep.DEVICE
    gpu = pool.gpu.kind is DeviceKind.CUDA
    if not role.trained:
        return [(False, False, device, False)] + ([(False, False, device, True)] if gpu else [])
    offloads = [(False, device, False)]
    if gpu:
        offloads += [(True, device, False), (True, OptimizerStep.HOST, False), (True, device, True)]
    return [(r, o, step, params) for r in (True, False) for o, step, params in offloads]
