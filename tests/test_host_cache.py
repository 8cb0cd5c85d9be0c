"""Weights that outgrow the host's last-level cache: read from memory on every pass.

Oracles: a fake sysfs cache directory whose sizes are written by hand; a generation of
8 sequences of exactly 16 tokens (one prefill and 16 decode steps: 17 passes over the
weights); tiny-llama-m's 12.3 MB of fp32 weights, four copies of which (49 MB) overflow
a 32 MiB cache and two of which (24.7 MB) do not.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from handmade import with_framework

from placeflow.catalogue import get_model
from placeflow.layout import GenLayout, TrainLayout
from placeflow.profiles.profiler import last_level_cache_bytes, level2_cache_bytes
from placeflow.profiles.registry import fitted_cost_model
from placeflow.profiles.schema import FrameworkKind
from placeflow.simulator import callcosts
from placeflow.simulator.lengths import LengthModel

MIB = 1 << 20
M = get_model("tiny-llama-m")


def test_the_last_level_cache_is_the_highest_level_the_os_reports(tmp_path: Path) -> None:
    for index, (level, size) in enumerate([(1, "32K"), (1, "32K"), (2, "512K"), (3, "32768K")]):
        d = tmp_path / f"index{index}"
        d.mkdir()
        (d / "level").write_text(f"{level}\n")
        (d / "size").write_text(f"{size}\n")
    assert last_level_cache_bytes(tmp_path) == 32 * MIB
    assert last_level_cache_bytes(tmp_path / "none") is None
    assert level2_cache_bytes(tmp_path) == 512 * 1024
    assert level2_cache_bytes(tmp_path / "none") is None


def test_the_cpu_profile_records_its_hosts_cache_and_reads_memory_at_half_a_copy() -> None:
    cm = fitted_cost_model("cpu")
    assert cm.host_cache_bytes == 32 * MIB  # this machine's L3, from the profile
    assert cm.memory_read_s(12 * MIB) == pytest.approx(cm.stream_copy_s("h2d", 12 * MIB) / 2)
    assert fitted_cost_model("a100-80gb").host_cache_bytes is None


def test_four_copies_of_tiny_llama_m_outgrow_the_cache_two_do_not() -> None:
    cm = fitted_cost_model("cpu")
    gen = GenLayout(train=TrainLayout(d=4), tg=1)
    # Per layer q and o 256x256, k and v 256x128, gate, up, down 256x704, two norms;
    # outside the embedding and head 256x256 each and the final norm; fp32.
    layer = 2 * 256 * 256 + 2 * 256 * 128 + 3 * 256 * 704 + 2 * 256
    assert M.num_bytes() == 4 * (4 * layer + 2 * 256 * 256 + 256) == 12_329_984
    assert callcosts.weights_from_memory(cm, M, gen, 4)  # 49.3 MB > 33.6 MB
    assert not callcosts.weights_from_memory(cm, M, gen, 2)  # 24.7 MB
    assert not callcosts.weights_from_memory(cm, get_model("tiny-llama"), gen, 4)  # 7 MB
    assert not callcosts.weights_from_memory(fitted_cost_model("a100-80gb"), M, gen, 1024)


def test_each_pass_over_the_weights_reads_them_from_memory() -> None:
    # Without the shared cache's reads (`cold_weights`, which reads from memory replace:
    # tests/test_cold_weights.py), so that the two generations differ by the reads alone.
    cm = with_framework(fitted_cost_model("cpu"), FrameworkKind.COLD_WEIGHTS, None)
    gen = GenLayout(train=TrainLayout(d=4), tg=1)
    shape = callcosts.GenerationShape(
        num_seqs=8, prompt_len=16, lengths=LengthModel(16), kv_capacity_seqs=64
    )
    cached = callcosts.generation_cost(cm, M, gen, shape)
    read = callcosts.generation_cost(
        cm, M, gen, dataclasses.replace(shape, weights_from_memory=True)
    )
    assert cached.detail["weight_reads_s"] == 0.0
    expected = 17 * cm.memory_read_s(M.num_bytes())
    assert read.detail["weight_reads_s"] == pytest.approx(expected)
    assert read.time_s == pytest.approx(cached.time_s + expected)
