"""The cost table under a deadline, and its Pareto filter against the quadratic original.

Oracles: the sort-and-sweep front equals the pairwise filter (every option
compared with every other) on random seeded option sets; the coarse-to-fine
order is a permutation whose prefix holds the extremes and the powers of two; a
build whose deadline has passed still costs one count and says it is incomplete.
"""

from __future__ import annotations

import random
import time
from pathlib import Path

import pytest

from placeflow.cluster import load_cluster
from placeflow.layout import TrainLayout
from placeflow.plan import RoleParallelism
from placeflow.planner.costtable import RoleOption, build_cost_table, coarse_to_fine, pareto_front
from placeflow.profiles.registry import fitted_cost_model
from placeflow.workload import Role, load_workload

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def _pairwise_front(options: list[RoleOption]) -> list[RoleOption]:
    return [o for o in options if not any(k.dominates(o) for k in options)]


def _option(rng: random.Random, i: int) -> RoleOption:
    def pick() -> float:
        return float(rng.choice([1, 2, 3, 4]))

    return RoleOption(
        role=Role.ACTOR,
        pool="p",
        num_gpus=8,
        par=RoleParallelism(train=TrainLayout(), micro_batch=i + 1),
        kv_seqs=0,
        stage_s=(pick(), pick(), pick()),
        resident_bytes=pick(),
        transient_bytes=pick(),
    )


@pytest.mark.parametrize("seed", range(20))
def test_sweep_front_equals_the_pairwise_filter(seed: int) -> None:
    rng = random.Random(seed)
    options = [_option(rng, i) for i in range(rng.randint(0, 120))]
    assert pareto_front(options) == _pairwise_front(options)


@pytest.mark.parametrize("n", [1, 2, 3, 11, 1003])
def test_coarse_to_fine_is_a_permutation_with_the_extremes_first(n: int) -> None:
    counts = [1, 2, 4, *(8 * k for k in range(1, n + 1))]
    order = coarse_to_fine(counts)
    assert sorted(order) == counts
    head = order[: 3 + n.bit_length() + 1]
    assert counts[-1] in head and 8 in head and 1 in head


def test_a_past_deadline_still_costs_one_count_and_says_incomplete() -> None:
    cluster = load_cluster(EXAMPLES / "clusters" / "a100x128.toml")
    workload = load_workload(EXAMPLES / "workloads" / "ppo-llama2-7b.toml")
    cms = {p.profile: fitted_cost_model(p.profile) for p in cluster.pools}
    seen: list[tuple[int, int]] = []
    table = build_cost_table(
        workload,
        cluster,
        cms,
        deadline=time.process_time(),
        progress=lambda d, t: seen.append((d, t)),
    )
    assert not table.complete
    assert len(seen) == 1 and seen[0][1] > 1
    assert {n for (_, _, n) in table.options} == {1}


def test_a_search_cut_short_keeps_every_row_and_says_feasible() -> None:
    """A time limit too short for the whole table: every placement still has its row
    (a plan or a reason), and the status is feasible, never optimal."""
    from test_planner import PPO_ROLES, cluster, workload

    from placeflow.catalogue import CATALOGUE
    from placeflow.planner import Status, plan_search

    h100 = {"h100-sxm": fitted_cost_model("h100-sxm")}
    wl = workload({r: CATALOGUE["qwen2.5-0.5b"] for r in PPO_ROLES})
    result = plan_search(cluster(2, 8), wl, h100, time_limit_s=1e-4)
    assert result.status is Status.FEASIBLE
    assert len(result.per_placement) == 15
    for row in result.per_placement:
        assert (row.best is None) == (row.reason is not None)
        if row.best is None:  # not proven infeasible: the table was cut short
            assert row.status is Status.FEASIBLE and "time limit" in (row.reason or "")
    full = plan_search(cluster(2, 8), wl, h100)
    assert full.status is Status.OPTIMAL
    assert all(r.status is not Status.FEASIBLE for r in full.per_placement)
