"""The RL algorithms as dataflow graphs of model calls (networkx DiGraph).

A node is a model call named by its `Phase`, with the role that runs it and the
number of samples it processes; an edge is a data dependency. The graphs:

- PPO: generate -> ref_logprob, old_logprob, values, reward -> advantage ->
  actor_update, critic_update.
- GRPO: as PPO without the critic (group-normalised advantages); the reward
  model call is absent when the reward is rule-based.
- ReMax: adds generate_baseline (one greedy response per prompt); the reward
  model scores both the sampled and the greedy responses.
- Safe-RLHF: adds the cost model (`cost`) and the critic's cost-value head
  (`cost_values`); five models: actor, critic, ref, reward, cost.

`ref_logprob` exists only when the workload has a reference model (KL term).

One definition below both users: the simulator costs these calls and schedules
them (calls on one device set serialise, disjoint sets overlap), and the
executor's controller runs the same calls in the same order, launching every
forward call of a step at once so that calls on disjoint sets overlap there too.
The transitions between layouts (reshard, weight sync) are not nodes: both add
them before generation from the plan's sets.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from functools import cache

import networkx as nx

from placeflow.phases import Phase
from placeflow.workload import Algorithm, Role, Workload


class CallKind(StrEnum):
    """How a call is costed and run (its Phase says which call it is)."""

    GENERATE = "generate"
    FORWARD = "forward"
    TRAIN = "train"
    CONTROLLER = "controller"


@dataclass(frozen=True, kw_only=True)
class ModelCall:
    """One node: `phase` run by `role` (None for controller-side work) on `num_samples`."""

    phase: Phase
    role: Role | None
    kind: CallKind
    num_samples: int
    greedy: bool = False


_FORWARDS: tuple[tuple[Phase, Role], ...] = (
    (Phase.REF_LOGPROB, Role.REF),
    (Phase.OLD_LOGPROB, Role.ACTOR),
    (Phase.VALUES, Role.CRITIC),
    (Phase.COST_VALUES, Role.CRITIC),
    (Phase.REWARD, Role.REWARD),
    (Phase.COST, Role.COST),
)
# The phases of the forward (scoring) calls.
FORWARD_PHASES = frozenset(phase for phase, _ in _FORWARDS)


def build_dataflow(workload: Workload) -> nx.DiGraph:
    """The dataflow graph of one RL step of `workload` (a fresh graph; callers may mutate)."""
    return _cached_dataflow(
        workload.algorithm,
        frozenset(workload.roles),
        workload.batch.num_samples,
        workload.batch.prompts_per_step,
        workload.recomputes_old_logprobs,
    ).copy()


@cache
def _cached_dataflow(
    algorithm: Algorithm,
    roles: frozenset[Role],
    num_samples: int,
    num_prompts: int,
    old_logprob: bool = True,
) -> nx.DiGraph:
    g: nx.DiGraph = nx.DiGraph()

    def add(call: ModelCall) -> Phase:
        g.add_node(call.phase, call=call)
        return call.phase

    gen = add(
        ModelCall(
            phase=Phase.GENERATE, role=Role.ACTOR, kind=CallKind.GENERATE, num_samples=num_samples
        )
    )
    sources = [gen]
    if algorithm is Algorithm.REMAX:
        sources.append(
            add(
                ModelCall(
                    phase=Phase.GENERATE_BASELINE,
                    role=Role.ACTOR,
                    kind=CallKind.GENERATE,
                    num_samples=num_prompts,
                    greedy=True,
                )
            )
        )
    adv = add(
        ModelCall(
            phase=Phase.ADVANTAGE, role=None, kind=CallKind.CONTROLLER, num_samples=num_samples
        )
    )
    for src in sources:
        # The advantage needs the responses themselves, not only their scores: a
        # rule-based reward scores them on the controller, and a step whose only model
        # is the actor (no forward call between) must still wait for its rollout.
        g.add_edge(src, adv)
    for phase, role in _FORWARDS:
        if role not in roles:
            continue
        if phase is Phase.COST_VALUES and algorithm is not Algorithm.SAFE_RLHF:
            continue
        if phase is Phase.OLD_LOGPROB and not old_logprob:
            continue  # on-policy single update: the update's forward is the old policy
        extra = num_prompts if (phase is Phase.REWARD and algorithm is Algorithm.REMAX) else 0
        node = add(
            ModelCall(
                phase=phase, role=role, kind=CallKind.FORWARD, num_samples=num_samples + extra
            )
        )
        for src in sources:
            if src is gen or phase is Phase.REWARD:
                g.add_edge(src, node)
        g.add_edge(node, adv)
    for phase, role in ((Phase.ACTOR_UPDATE, Role.ACTOR), (Phase.CRITIC_UPDATE, Role.CRITIC)):
        if role in roles:
            node = add(
                ModelCall(phase=phase, role=role, kind=CallKind.TRAIN, num_samples=num_samples)
            )
            g.add_edge(adv, node)
    assert nx.is_directed_acyclic_graph(g)
    return g


def dataflow_calls(workload: Workload) -> tuple[tuple[ModelCall, tuple[Phase, ...]], ...]:
    """The calls of one step in topological order, each with its predecessors (cached)."""
    return _cached_calls(
        workload.algorithm,
        frozenset(workload.roles),
        workload.batch.num_samples,
        workload.batch.prompts_per_step,
        workload.recomputes_old_logprobs,
    )


@cache
def _cached_calls(
    algorithm: Algorithm,
    roles: frozenset[Role],
    num_samples: int,
    num_prompts: int,
    old_logprob: bool = True,
) -> tuple[tuple[ModelCall, tuple[Phase, ...]], ...]:
    g = _cached_dataflow(algorithm, roles, num_samples, num_prompts, old_logprob)
    return tuple((c, tuple(g.predecessors(c.phase))) for c in calls_in_order(g))


def calls_in_order(g: nx.DiGraph) -> list[ModelCall]:
    """Calls in a deterministic topological order (ties broken by Phase order)."""
    order = list(Phase)
    return [
        g.nodes[n]["call"]
        for n in nx.lexicographical_topological_sort(g, key=lambda p: order.index(p))
    ]
