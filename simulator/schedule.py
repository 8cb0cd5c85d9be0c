"""A discrete-event schedule of model calls on device sets.

Each piece of `Work` (a model call, a transition, controller work) occupies
one or more device sets for its duration; `schedule` gives each its `Span`.
Work starts when all its predecessors have ended and all its sets are free;
calls on one set therefore serialise, calls on disjoint sets overlap where the
graph allows. Among ready work the one that can start earliest goes first;
ties go to the lower `priority` (the dataflow's topological order), so the
schedule is deterministic. Work with no set (controller work) only waits for
its predecessors.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class Work:
    id: Hashable
    sets: tuple[int, ...]
    duration_s: float
    preds: tuple[Hashable, ...] = ()
    priority: int = 0


@dataclass(frozen=True, kw_only=True)
class Span:
    id: Hashable
    start_s: float
    end_s: float


def schedule(tasks: Sequence[Work]) -> dict[Hashable, Span]:
    """Start and end of every task; raises ValueError on a dependency cycle or unknown id."""
    by_id = {t.id: t for t in tasks}
    for t in tasks:
        for p in t.preds:
            if p not in by_id:
                raise ValueError(f"task {t.id!r} depends on unknown task {p!r}")
    set_free: dict[int, float] = {}
    done: dict[Hashable, Span] = {}
    pending = list(tasks)
    while pending:
        best: tuple[float, int, int] | None = None
        for i, t in enumerate(pending):
            if any(p not in done for p in t.preds):
                continue
            ready = max((done[p].end_s for p in t.preds), default=0.0)
            start = max([ready, *(set_free.get(s, 0.0) for s in t.sets)])
            cand = (start, t.priority, i)
            if best is None or cand < best:
                best = cand
        if best is None:
            raise ValueError(f"dependency cycle among {[t.id for t in pending]}")
        start, _, i = best
        task = pending.pop(i)
        end = start + task.duration_s
        done[task.id] = Span(id=task.id, start_s=start, end_s=end)
        for s in task.sets:
            set_free[s] = end
    return done
