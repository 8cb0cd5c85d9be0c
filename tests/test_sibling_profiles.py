"""Datasheet profiles of unmeasured GPUs (H800, H20, A800, B200, GB200) from a measured sibling."""

import dataclasses
from pathlib import Path

import pytest

from placeflow.cluster import ClusterSpec, PoolSpec
from placeflow.hardware import HARDWARE
from placeflow.plan import load_plan
from placeflow.profiles import ops
from placeflow.profiles.registry import fitted_cost_model, load_profile
from placeflow.profiles.schema import CollectiveKind, Op, Scope, Source
from placeflow.profiles.siblings import RECIPES, build_sibling_profile
from placeflow.simulator import simulate

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda r: r.name)
def test_shipped_profile_is_what_the_recipe_builds(recipe):
    shipped = load_profile(recipe.name)
    rebuilt = build_sibling_profile(recipe, load_profile(recipe.sibling), date="x")
    assert {e.key(): e.median_s for e in shipped.entries} == pytest.approx(
        {e.key(): e.median_s for e in rebuilt.entries}, rel=1e-9
    )
    assert shipped.provenance.source is Source.DATASHEET
    assert {e.source for e in shipped.entries} == {Source.DATASHEET}
    assert HARDWARE[recipe.name].profile == recipe.name
    assert "no kernel of this GPU was measured" in shipped.provenance.notes


def _pairs(name: str, op: Op):
    """(sibling entry, its series' floor, the new GPU's entry) for every point of `op`."""
    sibling = load_profile("h100-sxm")
    new = {e.key(): e for e in load_profile(name).entries_for(op)}
    floors: dict = {}
    for e in sibling.entries_for(op):
        k = ops.series_key(op, e.params)
        floors[k] = min(floors.get(k, e.median_s), e.median_s)
    return [
        (e, floors[ops.series_key(op, e.params)], new[e.key()]) for e in sibling.entries_for(op)
    ]


def test_h20_large_gemm_by_hand():
    # The largest GEMM is compute-bound on both: its time beyond the series' fixed cost
    # grows by the peak ratio 989 / 148 TFLOP/s.
    sib, floor, h20 = max(_pairs("h20", Op.GEMM), key=lambda t: ops.flops(Op.GEMM, t[0].params))
    assert h20.median_s == pytest.approx(floor + (sib.median_s - floor) * 989 / 148)


def test_h800_is_an_h100_with_slower_nvlink():
    for sib, _, h800 in _pairs("h800", Op.GEMM) + _pairs("h800", Op.ATTN_PREFILL_BWD):
        assert h800.median_s == pytest.approx(sib.median_s)
    intra = [t for t in _pairs("h800", Op.COLLECTIVE) if t[0].params["scope"] == "intra"]
    assert intra
    for sib, floor, h800 in intra:
        assert h800.median_s == pytest.approx(floor + (sib.median_s - floor) * 450 / 200)


def test_b200_keeps_the_fixed_cost_of_small_kernels():
    # Below the fixed cost nothing shrinks: a faster GPU does not launch faster.
    for sib, floor, b200 in _pairs("b200", Op.ELEMENTWISE):
        assert floor <= b200.median_s <= sib.median_s


def test_gb200_prices_all_reduce_across_its_nvl72_domain():
    gb200 = load_profile("gb200")
    worlds = {
        int(e.params["world_size"])
        for e in gb200.entries_for(Op.COLLECTIVE)
        if e.params["scope"] == Scope.INTRA.value
        and e.params["kind"] == CollectiveKind.ALL_REDUCE.value
    }
    assert {2, 4, 8, 16, 32, 64, 72} <= worlds
    assert max(worlds) == 72


def _on(gpu: str, plan):
    pool = dataclasses.replace(plan.cluster.pools[0], gpu=HARDWARE[gpu])
    cluster = ClusterSpec(name=f"{gpu}x16", pools=(pool,))
    return dataclasses.replace(plan, cluster=cluster)


def test_example_plan_simulates_on_every_new_gpu_and_orders_them():
    plan = load_plan(EXAMPLES / "plans" / "ppo-7b-colocate-h100x16.toml")
    times = {}
    for gpu in ("h100-sxm", "h800", "h20", "b200", "gb200"):
        p = _on(gpu, plan)
        est = simulate(p, fitted_cost_model(HARDWARE[gpu].profile))
        times[gpu] = est.iteration_s
    # B200 and GB200 have 2.3-2.5x the H100's peak and 2.4x its HBM; the H20 a seventh of
    # its peak; the H800 differs only in NVLink, which this plan's TP traffic uses.
    assert times["gb200"] <= times["b200"] < times["h100-sxm"] <= times["h800"] < times["h20"]


def test_pool_spec_accepts_new_gpus():
    assert PoolSpec(name="p", gpu=HARDWARE["b200"], num_nodes=1, gpus_per_node=8)
