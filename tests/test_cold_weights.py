"""Weights past a core's own cache: measured, priced, charged to generation.

Oracles: `cold_samples`' paired differences from a fake clock that advances one
unit per reading, by hand; the cost model's curve between, below and beyond its
hand-made entries and its scaling by the bytes past the level-2 cache, by hand;
a generation's prefill and decode steps each charged the curve at their rows, by
hand against the same generation without the entries; none where the weights
come from memory, fit in the level-2 cache, or the profile is a GPU one.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from handmade import with_framework

from placeflow.catalogue import get_model
from placeflow.layout import GenLayout, TrainLayout
from placeflow.profiles.costmodel import CostModel
from placeflow.profiles.grid import COLD_MODEL, cold_model_bytes
from placeflow.profiles.registry import fitted_cost_model, load_profile
from placeflow.profiles.schema import FrameworkKind, Op, load_profile_file, save_profile
from placeflow.profiles.shared_cores import cold_samples, main, measure_cold_weights
from placeflow.simulator import callcosts
from placeflow.simulator.lengths import LengthModel

L2 = 512 * 1024
# 1 ms more per pass over the reference's weights at 1 row, 2 ms at 8 rows, 3 ms at 32.
HAND = {1: 1e-3, 8: 2e-3, 32: 3e-3}


def _cold(cm: CostModel, times_s: dict[int, float] | None, l2: int | None = L2) -> CostModel:
    return dataclasses.replace(
        with_framework(cm, FrameworkKind.COLD_WEIGHTS, times_s), host_l2_bytes=l2
    )


def test_cold_samples_are_a_pass_in_turn_less_each_gemm_hot_by_hand() -> None:
    ticks = iter(range(10_000))
    weights = [torch.zeros(4, 3), torch.zeros(5, 4), torch.zeros(2, 5)]
    # Every clock reading one unit later: each hot GEMM's repeats read 1 over 4
    # passes, the pass in turn 1 over 4 passes: 1/4 - 3 * 1/4 a pair.
    got = cold_samples(weights, 2, pairs=3, passes=4, clock=lambda: float(next(ticks)))
    assert got == pytest.approx([1 / 4 - 3 / 4] * 3)


def test_the_cold_curve_scales_by_the_bytes_past_the_level2_cache_by_hand() -> None:
    cm = _cold(fitted_cost_model("cpu"), HAND)
    past = cold_model_bytes() - L2
    assert cold_model_bytes() == get_model(COLD_MODEL).num_bytes()
    # The reference's own bytes: the entries themselves, between them linear in rows.
    assert cm.cold_weights_s(cold_model_bytes(), 8) == pytest.approx(2e-3)
    assert cm.cold_weights_s(cold_model_bytes(), 20) == pytest.approx(2.5e-3)
    # Held below the first row count and beyond the last.
    assert cm.cold_weights_s(cold_model_bytes(), 1) == pytest.approx(1e-3)
    assert cm.cold_weights_s(cold_model_bytes(), 512) == pytest.approx(3e-3)
    # Half the reference's bytes past the cache: half the time.
    assert cm.cold_weights_s(L2 + past / 2, 8) == pytest.approx(1e-3)
    # Weights that fit in the level-2 cache, no entries, no level-2 size, a GPU: nothing.
    assert cm.cold_weights_s(L2, 8) == 0.0
    assert _cold(fitted_cost_model("cpu"), None).cold_weights_s(cold_model_bytes(), 8) == 0.0
    assert _cold(fitted_cost_model("cpu"), HAND, None).cold_weights_s(10**8, 8) == 0.0
    assert fitted_cost_model("h100-sxm").cold_weights_s(10**9, 8) == 0.0


def test_a_generation_pays_each_pass_at_its_rows_by_hand() -> None:
    """tiny-llama-m (12.3 MB, its whole weights one replica's): 8 sequences of a 4-token
    prompt, 3 new tokens. The prefill is one pass of 32 rows; decode steps 1 to 3 at 8
    rows (fixed lengths: the trapezoid sums the three steps)."""
    model = get_model("tiny-llama-m")
    base = fitted_cost_model("cpu")
    cm = _cold(base, HAND)
    gen = GenLayout(train=TrainLayout(), tg=1)
    shape = callcosts.GenerationShape(
        num_seqs=8, prompt_len=4, lengths=LengthModel(3), kv_capacity_seqs=8
    )
    plain = callcosts.generation_cost(_cold(base, None), model, gen, shape)
    cold = callcosts.generation_cost(cm, model, gen, shape)
    share = (model.num_bytes() - L2) / (cold_model_bytes() - L2)
    assert share == pytest.approx(1.0)
    assert cold.detail["prefill_s"] - plain.detail["prefill_s"] == pytest.approx(3e-3)
    assert cold.detail["decode_s"] - plain.detail["decode_s"] == pytest.approx(3 * 2e-3)
    assert cold.time_s - plain.time_s == pytest.approx(3e-3 + 3 * 2e-3)
    # Weights read from memory are priced by `weight_reads_s` instead.
    memory = callcosts.generation_cost(
        cm, model, gen, dataclasses.replace(shape, weights_from_memory=True)
    )
    plain_memory = callcosts.generation_cost(
        _cold(base, None), model, gen, dataclasses.replace(shape, weights_from_memory=True)
    )
    assert memory.time_s == pytest.approx(plain_memory.time_s)
    # A KV cache of 4 sequences: two prefill waves, each a pass of 16 rows (a third of
    # the way from 8 rows to 32: 2 + 1/3 ms).
    waves = dataclasses.replace(shape, kv_capacity_seqs=4)
    extra = callcosts.generation_cost(cm, model, gen, waves).detail["prefill_s"]
    extra -= callcosts.generation_cost(_cold(base, None), model, gen, waves).detail["prefill_s"]
    assert extra == pytest.approx(2 * (2e-3 + 1e-3 / 3))


def test_the_command_records_the_level2_cache_with_the_entries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import placeflow.profiles.profiler as profiler
    import placeflow.profiles.shared_cores as shared_cores

    path = tmp_path / "cpu.json"
    save_profile(load_profile("cpu"), path)
    cores = int(load_profile_file(path).provenance.host["cpu_count"])
    monkeypatch.setattr(shared_cores.os, "cpu_count", lambda: cores)
    monkeypatch.setattr(profiler, "level2_cache_bytes", lambda: L2)
    entries = [
        shared_cores.framework_entry(FrameworkKind.COLD_WEIGHTS, r, [t]) for r, t in HAND.items()
    ]
    monkeypatch.setattr(shared_cores, "measure_cold_weights", lambda: entries)
    assert main(["--add-to", str(path), "--kinds", "cold_weights"]) == 0
    after = load_profile_file(path)
    assert after.provenance.host["l2_bytes"] == L2
    cold = [e for e in after.entries_for(Op.FRAMEWORK) if e.params["kind"] == "cold_weights"]
    assert [e.params["num_units"] for e in cold] == [1, 8, 32]
    cm = fitted_cost_model(str(path))
    assert cm.host_l2_bytes == L2
    assert cm.cold_weights_s(cold_model_bytes(), 8) == pytest.approx(2e-3)


@pytest.mark.slow
def test_measure_cold_weights_times_real_gemms() -> None:
    for e in measure_cold_weights(pairs=2):
        assert e.params["kind"] == "cold_weights"
        assert e.params["num_units"] in (1, 8, 32, 128, 512)
        assert 0 < e.p10_s <= e.median_s <= e.p90_s < 1.0 and e.repeats == 2
