"""Set options (`planner.setfront`) against brute force over every choice of role options.

Oracle: for a set of roles on n devices, enumerate every combination of the
roles' cost-table options, keep those that fit memory (constraint (5), in MiB
as the model counts it) and take their Pareto front in (A, L_0, L_1, L_2) by
pairwise comparison; the set options must have exactly these loads. Across
counts, no set option may be beaten by one on as many devices or fewer.
"""

import itertools
import math
import random

import numpy as np
import pytest
from test_planner import PPO_ROLES, SMALL_MODELS, cluster, truncated, workload

from placeflow.catalogue import CATALOGUE
from placeflow.planner.costtable import NUM_STAGES, build_cost_table
from placeflow.planner.generators import with_generators
from placeflow.planner.pareto import pareto_indices
from placeflow.planner.setfront import MIB, SetFronts
from placeflow.profiles.registry import fitted_cost_model
from placeflow.workload import Role


@pytest.fixture(scope="module")
def h100():
    return {"h100-sxm": fitted_cost_model("h100-sxm")}


def brute_front(table, roles, pool, n, capacity_mib):
    loads = set()
    for combo in itertools.product(*(table.options[(r, pool, n)] for r in roles)):
        used = sum(math.ceil(o.resident_bytes / MIB) for o in combo) + max(
            math.ceil(o.transient_bytes / MIB) for o in combo
        )
        if used > capacity_mib:
            continue
        stages = tuple(sum(table.to_units(o.stage_s[k]) for o in combo) for k in range(NUM_STAGES))
        loads.add((int(any(o.gen_apart for o in combo)), *stages))
    return {
        a
        for a in loads
        if not any(
            b != a and b[0] == a[0] and all(x <= y for x, y in zip(b, a, strict=True))
            for b in loads
        )
    }


@pytest.mark.parametrize("seed", range(4))
def test_set_options_are_the_memory_feasible_stage_front(h100, seed):
    rng = random.Random(seed)
    models = {r: CATALOGUE[rng.choice(SMALL_MODELS)] for r in PPO_ROLES}
    cl = cluster(1, 4, memory_gib=rng.choice([4.0, 8.0, 80.0]))
    wl = workload(models, response_len=rng.choice([64, 512]))
    table = truncated(with_generators(build_cost_table(wl, cl, h100), wl, cl, h100), keep=5)
    fronts = SetFronts(table, cl)
    pool = cl.pools[0]
    capacity = pool.gpu.memory_bytes // MIB
    for size in (1, 2, 3):
        for roles in itertools.combinations(PPO_ROLES, size):
            for n in (1, 2, 4):
                if any((r, pool.name, n) not in table.options for r in roles):
                    assert fronts.options(roles, pool.name, n) == []
                    continue
                got = {
                    (int(f.gen_apart), *f.stage_units) for f in fronts.options(roles, pool.name, n)
                }
                assert got == brute_front(table, roles, pool.name, n, capacity)
                for f in fronts.options(roles, pool.name, n):
                    assert [o.role for o in f.options] == list(roles)
                    assert f.gen_apart == any(o.gen_apart for o in f.options)
            across = fronts.across_counts(roles, pool.name)
            for f, g in itertools.product(across, repeat=2):
                beaten = g.num_gpus <= f.num_gpus and all(
                    x <= y for x, y in zip(g.stage_units, f.stage_units, strict=True)
                )
                assert f is g or g.gen_apart != f.gen_apart or not beaten


def test_pareto_indices_equals_pairwise_filter():
    rng = np.random.default_rng(0)
    for dims, scale, size in [(3, 3, 50), (3, 20_000, 2_000), (6, 5, 1_000), (5, 50, 400)]:
        points = rng.integers(0, scale, (size, dims))
        no_worse = (points[:, None, :] <= points[None, :, :]).all(axis=2)
        better = (points[:, None, :] < points[None, :, :]).any(axis=2)
        expected = {tuple(p) for p in points[~(no_worse & better).any(axis=0)]}
        kept = points[pareto_indices(points)]
        assert {tuple(p) for p in kept} == expected and len(kept) == len(expected)


def test_a_set_that_cannot_fit_has_no_options(h100):
    wl = workload({r: CATALOGUE["llama-2-7b"] for r in PPO_ROLES})
    cl = cluster(1, 2, memory_gib=24.0)
    table = build_cost_table(wl, cl, h100)
    fronts = SetFronts(table, cl)
    assert fronts.options(tuple(PPO_ROLES), "h100", 2) == []
    assert fronts.options((Role.REF,), "h100", 2) != []
