"""A discrete-event schedule of model calls on device sets.

Each piece of `Work` (a model call, a transition, controller work) occupies
one or more device sets for its duration; `schedule` gives each its `Span`.
Work starts when all its predecessors have ended and all its sets are free;
calls on one set therefore serialise, calls on disjoint sets overlap where the
graph allows. Among ready work the one that can start earliest goes first;
ties go to the lower `priority` (the dataflow's topological order), so the
schedule is deterministic. Work with no set (controller work) only waits for
its predecessors.

Shared host cores (CPU workers, `PoolSpec.cores_per_node`). Work may name the
hosts its workers run on and how many of them it keeps busy there on average
(`Work.hosts`: a fraction where a pipeline's stages wait in its bubbles); its
`duration_s` is its time with only its own workers busy.
Where calls on different sets run at the same time on one host with `c`
cores, the host's cores are shared among all their busy workers (processor
sharing): with W workers busy on the host, a call of w of them, whose duration
already counts its own stretch S(w/c), progresses at rate

    r = S(w/c) / S(W/c)                     (the slowest of its hosts)

where S(x) is the measured stretch of a busy rank's work at x busy ranks per
core (`costmodel.sliced` on the host's `CostModel.slicing` curve, `slicing[h]`;
max(1, x), the share of a core alone, where the host has none): two 2-worker
calls on a 2-core host each run at about half speed, and a call alone keeps
its duration. Rates change only when a call starts or ends,
so the schedule advances from event to event. Without shared hosts every rate
is 1 and the schedule is the list schedule above.

Collectives wait for their partners on a crowded host: a rank that reaches one
first idles until the kernel schedules its partner, which may be running another
set's slice (`profiles.shared_cores`). A call's duration already holds these
waits at its own crowding (the simulator prices a set whose workers outnumber
their cores with `CostModel.shared_cores`); where other work crowds the host
further, each of the `Work.collectives` on a rank's path adds the host's
measured wait `waits[h]` (at two busy workers per core) times the extra
crowding, a = max(1, W/c) − max(1, w/c) in busy workers per core, linear
between none (a = 0) and the measured point (a = 1). A call's ranks blocked in a
collective (`Work.latency_s`: the part of its duration that the profile's
`paired_collective` entries price, a partner's data awaited after compute, and the
blocked part of the collectives' back-to-back entries, the profile's blocked share of
their latency-sized part, `CostModel.blocked_collective_s`) are not slowed by the
crowd: that part keeps its time. Run in that state throughout, the call would take
(duration − latency)/r + latency + collectives·waits[h]·a; its rate is its duration
over that.

A host also runs what no call holds: Ray's daemons, the Ray threads of every worker
and of the driver, the kernel's own threads (`background[h]`, in cores: the profile's
measured `ray_background`, `CostModel.ray_background`). Model calls were priced from
entries timed without Ray running (the kernels, the engine's pieces, the slicing curve
S), so they count it among the host's busy workers, W + b (`Work.background`); a weight
transition (priced from the measured empty Ray call) and the driver's work (from Ray's
measured launches and gets) were timed with Ray up and hold it already. A 2-rank call
alone on a 2-core host with b = 0.09 then runs at S(1)/S(1.045), 5 % slower on the
fidelity profile's curve.

S holds what time slicing costs beyond the share of a core (cache refills and
switches) and the slowest rank's bad luck where busy ranks do not divide evenly
among the cores, both measured (`profiles.shared_cores`). It depends on the work: a
decode's small steps and a training step's backward pay the slices differently from a
forward, so a call whose kind has a curve of its own on a host (`Work.curves`: the
simulator gives generations the measured decode's and updates the training step's)
runs by that curve, S_own(w/c) / S_own(W/c); the others by the host's. The driver's own work
(its launches and gets, `Work.sliced` False) is one thread that pickles small
objects: it has no slowest of several ranks and no model's working set to refill,
so it runs at the plain share of a core, r = max(1, w/c) / max(1, W/c), while it
counts as a busy worker for the others' rates. On the 2-core VM of 2026-11-29 a
driver's launch of a call to 4 ranks took 7.3 ms alone and 10.4 / 13.1 ms beside 2 / 4
busy ranks (1.43x / 1.80x; the share alone says 1.5x / 2.5x, the shipped profile's
curve 1.7x / 2.8x; `benchmarks/driver_share.py`): nearer the share, and below it
where the host is most crowded (a thread that sleeps between its bursts is woken
ahead of the busy ones).

A rank that slept before a call refills its caches in it (`Work.wake`: the
measured extra seconds by the time asleep, `costmodel.woken`). Its sets' idle
time is only known here: from the end of the last work on them to the call's
start, the longest of its sets' (a set that has run nothing yet has slept since
ever: the curve's last point). A call queued right behind another on its set
pays nothing; one that waited for the driver's work between phases pays for
that wait. The charge joins the call's duration when it starts (`Span.wake_s`).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass

from placeflow.profiles.costmodel import SliceCurve, WakeCurve, sliced, woken

# Remaining work below this (seconds) counts as done: float residue of rate changes.
_DONE_S = 1e-12


@dataclass(frozen=True, kw_only=True)
class Work:
    id: Hashable
    sets: tuple[int, ...]
    duration_s: float
    preds: tuple[Hashable, ...] = ()
    priority: int = 0
    # (host, workers this work keeps busy there), for hosts whose cores are shared.
    hosts: tuple[tuple[Hashable, float], ...] = ()
    # Collectives on one rank's path that wait for partners on a crowded host.
    collectives: float = 0.0
    # Of `duration_s`, the seconds its ranks wait blocked in collectives (a partner's
    # data after compute, `CostModel.paired_collective_s`, and the blocked part of the
    # collectives' own entries, `CostModel.blocked_collective_s`): a crowded host does
    # not slow this part.
    latency_s: float = 0.0
    # What the work costs more by how long its sets were idle before it started (the
    # ranks' caches gone cold, `costmodel.woken`), in the units of `duration_s`.
    wake: WakeCurve = ()
    # Whether its workers' stretch on a crowded host follows the host's measured slicing
    # curve (model calls' ranks) or the plain share of a core (the driver's one thread:
    # module docstring).
    sliced: bool = True
    # Per host, the stretch curve its ranks follow there in place of the host's (a
    # generation's or an update's own measured curve: module docstring).
    curves: tuple[tuple[Hashable, SliceCurve], ...] = ()
    # Whether the host's background load (Ray's and the kernel's own threads) slows it:
    # work priced from entries timed without Ray running, a model call (module docstring).
    background: bool = False


@dataclass(frozen=True, kw_only=True)
class Span:
    id: Hashable
    start_s: float
    end_s: float
    wake_s: float = 0.0  # of which its ranks' wake-up after their idle time (`Work.wake`)


def _wake_s(task: Work, start_s: float, last_end: Mapping[int, float]) -> float:
    """`task.wake` at the longest its sets were idle before `start_s` (a set that has run
    nothing yet: idle since ever, the curve's last point)."""
    if not task.wake or not task.sets:
        return 0.0
    idle = max(start_s - last_end.get(s, -math.inf) for s in task.sets)
    return woken(idle, task.wake)


def schedule(
    tasks: Sequence[Work],
    cores: Mapping[Hashable, int] | None = None,
    waits: Mapping[Hashable, float] | None = None,
    slicing: Mapping[Hashable, SliceCurve] | None = None,
    background: Mapping[Hashable, float] | None = None,
) -> dict[Hashable, Span]:
    """Start and end of every task; raises ValueError on a dependency cycle or unknown id.

    `cores`: the cores of each shared host that `Work.hosts` names; `waits`: the seconds
    a collective waits for its partner there at two busy workers per core; `slicing`:
    the measured stretch curve there; `background`: the cores its own background load
    keeps busy (module docstring; none where a host is missing).
    """
    by_id = {t.id: t for t in tasks}
    for t in tasks:
        for p in t.preds:
            if p not in by_id:
                raise ValueError(f"task {t.id!r} depends on unknown task {p!r}")
    if cores and any(h in cores for t in tasks for h, _ in t.hosts):
        return _shared_schedule(tasks, cores, waits or {}, slicing or {}, background or {})
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
        wake = _wake_s(task, start, set_free)
        end = start + task.duration_s + wake
        done[task.id] = Span(id=task.id, start_s=start, end_s=end, wake_s=wake)
        for s in task.sets:
            set_free[s] = end
    return done


def _rates(
    running: Sequence[Work],
    cores: Mapping[Hashable, int],
    waits: Mapping[Hashable, float],
    slicing: Mapping[Hashable, SliceCurve],
    background: Mapping[Hashable, float],
) -> list[float]:
    """Each running task's progress per second (module docstring)."""
    busy: dict[Hashable, float] = {}
    for t in running:
        for h, w in t.hosts:
            busy[h] = busy.get(h, 0) + w
    rates = []
    for t in running:
        rate = 1.0
        for h, w in t.hosts:
            if h in cores:
                c = cores[h]
                curve = dict(t.curves).get(h, slicing.get(h, ())) if t.sliced else ()
                with_bg = busy[h] + (background.get(h, 0.0) if t.background else 0.0)
                r = sliced(w / c, curve) / sliced(with_bg / c, curve)
                own, crowd = max(1.0, w / c), max(1.0, busy[h] / c)
                extra = t.collectives * waits.get(h, 0.0) * (crowd - own)
                lat = min(t.latency_s, t.duration_s)
                if (extra > 0 or lat > 0) and t.duration_s > 0:
                    r = t.duration_s / ((t.duration_s - lat) / r + lat + extra)
                rate = min(rate, r)
        rates.append(rate)
    return rates


def _shared_schedule(
    tasks: Sequence[Work],
    cores: Mapping[Hashable, int],
    waits: Mapping[Hashable, float],
    slicing: Mapping[Hashable, SliceCurve],
    background: Mapping[Hashable, float],
) -> dict[Hashable, Span]:
    """The schedule advanced event by event, with rates from shared host cores."""
    now = 0.0
    busy_sets: set[int] = set()
    done: dict[Hashable, Span] = {}
    started: dict[Hashable, float] = {}
    remaining: dict[Hashable, float] = {}
    wakes: dict[Hashable, float] = {}
    last_end: dict[int, float] = {}
    running: list[Work] = []
    pending = list(tasks)
    while pending or running:
        # Start, in priority order, everything whose predecessors ended and sets are free.
        for _, t in sorted(enumerate(pending), key=lambda it: (it[1].priority, it[0])):
            if all(p in done for p in t.preds) and not busy_sets.intersection(t.sets):
                wakes[t.id] = _wake_s(t, now, last_end)
                started[t.id], remaining[t.id] = now, t.duration_s + wakes[t.id]
                running.append(t)
                busy_sets.update(t.sets)
        pending = [t for t in pending if t.id not in started]
        if not running:
            raise ValueError(f"dependency cycle among {[t.id for t in pending]}")
        rates = _rates(running, cores, waits, slicing, background)
        step = min(remaining[t.id] / r for t, r in zip(running, rates, strict=True))
        now += step
        still = []
        for t, r in zip(running, rates, strict=True):
            remaining[t.id] -= step * r
            if remaining[t.id] <= _DONE_S:
                done[t.id] = Span(id=t.id, start_s=started[t.id], end_s=now, wake_s=wakes[t.id])
                busy_sets.difference_update(t.sets)
                last_end.update((s, now) for s in t.sets)
            else:
                still.append(t)
        running = still
    return done
