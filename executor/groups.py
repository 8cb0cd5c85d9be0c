"""Worker groups: the workers of one role, in rank order, with the role's rank layouts.

`group_specs` reads from a plan which groups exist, without Ray: one per role
on the set that trains or serves it and, when the plan has a generator set, one
more for the actor's generation there. A `WorkerGroup` is a spec plus the actor
handles, `workers[rank]`; colocated roles' groups hold the same handles.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from placeflow.executor.dispatch import DispatchLayout
from placeflow.layout import GenLayout, TrainLayout
from placeflow.plan import Plan
from placeflow.workload import Role


@dataclass(frozen=True, kw_only=True)
class RoleLayout:
    """A role's rank mesh on its set (p-t-d), and for a generating actor its generation layout."""

    train: TrainLayout
    gen: GenLayout | None = None


@dataclass(frozen=True, kw_only=True)
class GroupSpec:
    role: Role
    set_index: int
    layout: RoleLayout
    generator: bool = False  # the actor's generation on a set of its own

    @property
    def label(self) -> str:
        return f"{self.role} (generator)" if self.generator else str(self.role)

    @property
    def num_ranks(self) -> int:
        return self.layout.train.world_size

    @property
    def dispatch(self) -> DispatchLayout:
        """Data-parallel replicas of the p-t-d mesh (training and forward calls)."""
        return DispatchLayout.of_train(self.layout.train)

    @property
    def gen_dispatch(self) -> DispatchLayout:
        """Generation replicas (pg-tg-dg-d)."""
        if self.layout.gen is None:
            raise ValueError(f"group {self.label} does not generate; it has no generation layout")
        return DispatchLayout.of_gen(self.layout.gen)


def group_specs(plan: Plan) -> list[GroupSpec]:
    """The worker groups of a plan, in set order and, within a set, in role order."""
    gen_set = plan.generator_set()
    specs = []
    for i, s in enumerate(plan.sets):
        for role in s.roles:
            par = plan.parallelism[role]
            if s.generator:
                gen = par.gen_layout(s.num_devices)
                layout = RoleLayout(train=gen.train, gen=gen)
            elif role is Role.ACTOR and gen_set is None:
                layout = RoleLayout(train=par.train, gen=par.gen_layout())
            else:
                layout = RoleLayout(train=par.train)
            specs.append(GroupSpec(role=role, set_index=i, layout=layout, generator=s.generator))
    return specs


@dataclass(frozen=True, kw_only=True)
class WorkerGroup:
    """A group's spec and its workers (Ray actor handles), `workers[rank]`."""

    spec: GroupSpec
    workers: tuple[Any, ...]

    def __post_init__(self) -> None:
        assert len(self.workers) == self.spec.num_ranks

    @property
    def role(self) -> Role:
        return self.spec.role

    @property
    def label(self) -> str:
        return self.spec.label

    @property
    def dispatch(self) -> DispatchLayout:
        return self.spec.dispatch

    @property
    def gen_dispatch(self) -> DispatchLayout:
        return self.spec.gen_dispatch
