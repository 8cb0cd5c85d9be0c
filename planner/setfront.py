"""Set options: the Pareto front of one colocated set's role choices, given its devices.

A set S (a block of a placement) on n devices of pool q runs one option o_r of
each of its roles r ∈ S (cost table options on (r, q, n)). What the rest of
the model sees of that choice is the set's load in each stage and whether the
actor leaves generation to a generator set:

    L_k(o) = Σ_{r ∈ S} t_k(o_r)          (stage k, in the table's time unit)
    A(o)   = [the actor's option has gen_apart]

and the choice is allowed only if it fits each device (the memory constraint):

    (5)  Σ_{r ∈ S} ⌈res(o_r)⌉ + max_{r ∈ S} ⌈tr(o_r)⌉ <= ⌊C_q⌋        (MiB)

Colocated roles keep their weights (and trained roles their gradients and
optimizer state) on the devices throughout; calls run one at a time on a set,
so only one role's transient memory (activations, logits, or the actor's KV
cache and generation weights) is added at once. Bytes are rounded up to MiB for
usage and down for capacity, so a rounded choice is never optimistic.

The step time is monotone in every set's loads (sums within a set, maxima
across sets, sums across stages), so among choices with the same A only the
Pareto front in (L_0, L_1, L_2) can be optimal; the model picks one element of
that front per set (`SetOption`). The front is built role by role: a partial
choice over the first roles of S is kept unless another one with the same A is
no worse in (L_0, L_1, L_2, Σ res, max tr) — any completion of the dominated
one is dominated by the same completion of the other, since sums and maxima are
monotone — and partial choices that already exceed (5) are dropped. This is
exact, and small: the roles' options interact only through these five numbers.

Fronts depend on (S, q, n) only, so one `SetFronts` serves every placement of a
search (a block such as actor+ref appears in several placements), and partial
fronts are shared between blocks with a common prefix of roles.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from placeflow.cluster import ClusterSpec
from placeflow.planner.costtable import NUM_STAGES, CostTable, RoleOption
from placeflow.planner.pareto import _CHUNK, pareto_indices
from placeflow.workload import Role

MIB = 1 << 20


@dataclass(frozen=True, kw_only=True)
class SetOption:
    """One Pareto-optimal choice of options for the roles of one set on (pool, num_gpus)."""

    roles: tuple[Role, ...]
    pool: str
    num_gpus: int
    options: tuple[RoleOption, ...]  # one per role, in `roles` order
    stage_units: tuple[int, ...]  # L_k in the cost table's time unit, k = 0..2
    gen_apart: bool  # the actor is in the set and leaves generation to a generator set


@dataclass(frozen=True)
class _Partial:
    """Partial choices over a prefix of a set's roles: one row per choice."""

    choice: np.ndarray  # (N, roles so far) option index per role
    crit: np.ndarray  # (N, 6): L_0, L_1, L_2, Σ res MiB, max tr MiB, A


def _role_rows(opts: list[RoleOption], table: CostTable) -> np.ndarray:
    return np.array(
        [
            [
                *(table.to_units(o.stage_s[k]) for k in range(NUM_STAGES)),
                math.ceil(o.resident_bytes / MIB),
                math.ceil(o.transient_bytes / MIB),
                int(o.gen_apart),
            ]
            for o in opts
        ],
        dtype=np.int64,
    ).reshape(len(opts), NUM_STAGES + 3)


def _prune(choice: np.ndarray, crit: np.ndarray, capacity_mib: int) -> _Partial:
    fits = crit[:, 3] + crit[:, 4] <= capacity_mib  # (5), already for the prefix
    choice, crit = choice[fits], crit[fits]
    keep = np.concatenate(
        [np.flatnonzero(crit[:, 5] == a)[pareto_indices(crit[crit[:, 5] == a])] for a in (0, 1)]
    )
    return _Partial(choice=choice[keep], crit=crit[keep])


def _combine(head: _Partial | None, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Every partial choice of `head` extended by every option row of one more role."""
    if head is None:
        return np.arange(len(rows))[:, None], rows
    a, b = len(head.choice), len(rows)
    choice = np.concatenate(
        [np.repeat(head.choice, b, axis=0), np.tile(np.arange(b), a)[:, None]], axis=1
    )
    left, right = np.repeat(head.crit, b, axis=0), np.tile(rows, (a, 1))
    crit = left + right
    crit[:, 4] = np.maximum(left[:, 4], right[:, 4])  # max transient
    crit[:, 5] = np.maximum(left[:, 5], right[:, 5])  # A: only the actor sets it
    return choice, crit


def _last_role(
    head: _Partial | None, rows: np.ndarray, capacity_mib: int
) -> tuple[np.ndarray, np.ndarray]:
    """The choices of a whole set that fit (5), not dominated in (L_0, L_1, L_2) by another
    choice with the same last-role option: for each option of the last role, only the
    stage front of the partial choices that fit beside it can be part of the set's
    front.
    """
    if head is None:
        fits = rows[:, 3] + rows[:, 4] <= capacity_mib  # (5)
        return np.flatnonzero(fits)[:, None], rows[fits]
    res, tr = head.crit[:, 3], head.crit[:, 4]
    # fit[a, p]: partial choice p fits beside option a of the last role (5).
    fit = res[None, :] + rows[:, 3:4] + np.maximum(tr[None, :], rows[:, 4:5]) <= capacity_mib
    options, ps = _fitting_fronts(head.crit[:, :NUM_STAGES], fit)
    if not len(ps):
        empty = np.zeros((0, head.choice.shape[1] + 1), dtype=np.int64)
        return empty, np.zeros((0, NUM_STAGES + 3), dtype=np.int64)
    crit = head.crit[ps] + rows[options]
    crit[:, 4] = np.maximum(head.crit[ps, 4], rows[options, 4])
    crit[:, 5] = rows[options, 5]  # A: only the actor, which comes last, sets it
    return np.concatenate([head.choice[ps], options[:, None]], axis=1), crit


def _fitting_fronts(stages: np.ndarray, fit: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For each row a of `fit`, `pareto_indices` of the stage loads of the partial choices
    p with fit[a, p]: the pairs (a, p), a ascending.

    The partial choices hold no actor, so their generation stage L_0 is 0 and at most two
    stage columns vary; then one sweep serves every row a at once: in the partial
    choices' lexicographic order (ties by index), p is on row a's front iff it fits
    and its last varying load is below that of every earlier p that fits. Otherwise
    (any other roles' calls in stage 0) each distinct row of `fit` gets its own front.
    """
    varying = np.flatnonzero(stages.max(axis=0) != stages.min(axis=0))  # stages: >= 1 row
    if len(varying) > 2:
        fronts: dict[bytes, np.ndarray] = {}
        per_option = []
        for a in range(len(fit)):
            front = fronts.get(key := np.packbits(fit[a]).tobytes())
            if front is None:
                inside = np.flatnonzero(fit[a])
                front = fronts[key] = inside[pareto_indices(stages[inside])]
            per_option.append(front)
        options = np.repeat(np.arange(len(fit)), [len(f) for f in per_option])
        ps = np.concatenate(per_option) if per_option else np.zeros(0, dtype=np.intp)
        return options, ps.astype(np.intp)
    cols = [np.zeros(len(stages), dtype=stages.dtype)] * (2 - len(varying))
    cols += [stages[:, k] for k in varying]
    order = np.lexsort((np.arange(len(stages)), cols[1], cols[0]))
    last = cols[1][order]
    fit = fit[:, order]
    masked = np.where(fit, last[None, :], np.iinfo(np.int64).max)
    earlier = np.minimum.accumulate(masked, axis=1)
    front = fit.copy()
    front[:, 1:] &= last[None, 1:] < earlier[:, :-1]
    options, at = np.nonzero(front)
    # Each row's front in `pareto_indices`'s order: by index up to _CHUNK fitting
    # choices, else lexicographic (the sweep's order); the solver's variables follow it.
    by_index = fit.sum(axis=1)[options] <= _CHUNK
    within = np.where(by_index, order[at], at)
    keep = np.lexsort((within, options))
    return options[keep], order[at][keep]


class SetFronts:
    """The set options of every (roles, pool, count), computed on first use and kept.

    Roles are combined in reverse order (the actor, with the most options, last),
    and the last role's combination is pruned in (L_0, L_1, L_2) only, once (5) is
    checked: memory no longer matters then.
    """

    def __init__(self, table: CostTable, cluster: ClusterSpec) -> None:
        self.table = table
        self._capacity_mib = {p.name: p.gpu.usable_bytes // MIB for p in cluster.pools}
        self._partial: dict[tuple[tuple[Role, ...], str, int], _Partial | None] = {}
        self._options: dict[tuple[tuple[Role, ...], str, int], list[SetOption]] = {}
        self._role_rows: dict[tuple[Role, str, int], np.ndarray | None] = {}

    def _rows(self, role: Role, pool: str, n: int) -> np.ndarray | None:
        key = (role, pool, n)
        if key not in self._role_rows:
            opts = self.table.options.get(key)
            self._role_rows[key] = _role_rows(opts, self.table) if opts else None
        return self._role_rows[key]

    def _prefix(self, order: tuple[Role, ...], pool: str, n: int) -> _Partial | None:
        """The 5-criteria front of partial choices over the roles `order`."""
        key = (order, pool, n)
        if key not in self._partial:
            rows = self._rows(order[-1], pool, n)
            head = self._prefix(order[:-1], pool, n) if len(order) > 1 else None
            result = None
            if rows is not None and (head is not None or len(order) == 1):
                pruned = _prune(*_combine(head, rows), self._capacity_mib[pool])
                result = pruned if len(pruned.choice) else None
            self._partial[key] = result
        return self._partial[key]

    def options(self, roles: tuple[Role, ...], pool: str, n: int) -> list[SetOption]:
        """The front of set `roles` on n devices of `pool`; empty if no choice fits (5)."""
        key = (roles, pool, n)
        if key not in self._options:
            self._options[key] = self._front(roles, pool, n)
        return self._options[key]

    def across_counts(self, roles: tuple[Role, ...], pool: str) -> list[SetOption]:
        """The set options of `roles` on every count of `pool` that no option on as many
        devices or fewer, with the same A, beats or equals in every stage load.

        Devices enter the rest of the model only through the pool budget (4) and the
        objectives, all monotone in the devices used, so this too is exact.
        """
        key = (roles, pool, 0)
        if key not in self._options:
            found = [
                f
                for n in sorted({c for (r, q, c) in self.table.options if q == pool})
                for f in self.options(roles, pool, n)
            ]
            crit = np.array(
                [(f.num_gpus, *f.stage_units, f.gen_apart) for f in found], dtype=np.int64
            ).reshape(len(found), NUM_STAGES + 2)
            keep = np.concatenate(
                [
                    np.flatnonzero(crit[:, -1] == a)[pareto_indices(crit[crit[:, -1] == a, :-1])]
                    for a in (0, 1)
                ]
            )
            self._options[key] = [found[i] for i in sorted(keep)]
        return self._options[key]

    def _front(self, roles: tuple[Role, ...], pool: str, n: int) -> list[SetOption]:
        order = roles[::-1]
        rows = self._rows(order[-1], pool, n)
        head = self._prefix(order[:-1], pool, n) if len(order) > 1 else None
        if rows is None or (head is None and len(order) > 1):
            return []
        choice, crit = _last_role(head, rows, self._capacity_mib[pool])
        out = []
        for a in (0, 1):
            group = np.flatnonzero(crit[:, 5] == a)
            for i in group[pareto_indices(crit[group, :NUM_STAGES])]:
                by_role = dict(zip(order, choice[i], strict=True))
                out.append(
                    SetOption(
                        roles=roles,
                        pool=pool,
                        num_gpus=n,
                        options=tuple(self.table.options[(r, pool, n)][by_role[r]] for r in roles),
                        stage_units=tuple(int(u) for u in crit[i, :NUM_STAGES]),
                        gen_apart=bool(a),
                    )
                )
        return out
