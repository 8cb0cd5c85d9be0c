"""Datasheet profiles of unmeasured GPUs (H800, H20, A800, B200, GB200) from a measured sibling."""

import dataclasses
from pathlib import Path

import pytest

from placeflow.cluster import ClusterSpec, PoolSpec
from placeflow.hardware import HARDWARE
from placeflow.plan import load_plan
from placeflow.profiles.datasheet import H100_SXM, derive_efficiencies
from placeflow.profiles.registry import fitted_cost_model, load_profile
from placeflow.profiles.schema import CollectiveKind, Op, Scope, Source
from placeflow.profiles.siblings import (
    H20,
    H800_SXM,
    RECIPES,
    build_sibling_profile,
    transferred_efficiencies,
)
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


def _entry(profile, op, **params):
    return next(
        e for e in profile.entries_for(op) if all(e.params[k] == v for k, v in params.items())
    )


def test_h20_large_gemm_by_hand():
    h100 = load_profile("h100-sxm")
    eff = derive_efficiencies(h100, H100_SXM)
    h20 = load_profile("h20")
    big = max(h20.entries_for(Op.GEMM), key=lambda e: e.params["m"] * e.params["n"] * e.params["k"])
    p = big.params
    flops = 2 * p["m"] * p["n"] * p["k"]
    # Compute-bound at 148 TFLOP/s times the H100's achieved fraction, plus its fixed cost.
    assert big.median_s == pytest.approx(eff.fixed_s + flops / (148e12 * eff.compute_fraction))


def test_h800_is_an_h100_with_slower_nvlink():
    h100_eff = derive_efficiencies(load_profile("h100-sxm"), H100_SXM)
    h800_eff = transferred_efficiencies(load_profile("h100-sxm"), H100_SXM, H800_SXM)
    assert h800_eff.compute_fraction == h100_eff.compute_fraction
    for n, bus in h100_eff.network.allreduce_bus_bytes_per_s.items():
        assert h800_eff.network.allreduce_bus_bytes_per_s[n] == pytest.approx(bus * 200 / 450)
    h20_eff = transferred_efficiencies(load_profile("h100-sxm"), H100_SXM, H20)
    assert h20_eff.network.allreduce_bus_bytes_per_s == h100_eff.network.allreduce_bus_bytes_per_s


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
