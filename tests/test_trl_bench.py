"""The TRL comparison's own helpers (`benchmarks/trl_grpo.py`): which sides it runs, which
TRL side each placeflow side is compared with, the plans it writes, the bf16 checkpoint
view, and the fairness checks. The timed runs themselves are the benchmark, not a test."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

pytest.importorskip("psutil")  # the benchmark's CPU monitor (the `bench` extra)
trl_grpo = pytest.importorskip("trl_grpo")  # benchmarks/ is on the test path

from placeflow.models import DType  # noqa: E402
from placeflow.plan import plan_from_dict  # noqa: E402
from placeflow.workload import Role  # noqa: E402

Precision, Layout, Settings = trl_grpo.Precision, trl_grpo.Layout, trl_grpo.Settings

TINY_LLAMA = {
    "model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64,
    "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128,
    "vocab_size": 256, "dtype": "float32",
}  # fmt: skip


def test_sides_per_precision_and_their_baselines() -> None:
    assert trl_grpo.all_sides(2, [Precision.FP32, Precision.BF16]) == [
        "trl",
        "placeflow-1x2",
        "placeflow-2x1",
        "placeflow-1x1+gen1x1-async",
        "trl-bf16",
        "placeflow-1x2-bf16",
        "placeflow-2x1-bf16",
        "placeflow-1x1+gen1x1-async-bf16",
    ]
    # One thread: no T x 1 layout, and no even split between a trainer and a generator.
    assert trl_grpo.all_sides(1, [Precision.FP32]) == ["trl", "placeflow-1x1"]
    assert trl_grpo.baseline_of("placeflow-1x1+gen1x1-async-bf16") == "trl-bf16"
    assert trl_grpo.baseline_of("placeflow-2x1") == "trl"
    for threads in (2, 4):
        for lay in trl_grpo.layouts(threads, Precision.BF16):  # every layout spends T threads
            workers = lay.num_workers + lay.generator_workers
            assert workers * lay.threads_per_worker == threads


def _checkpoint(tmp_path: Path) -> Path:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text(json.dumps(TINY_LLAMA))
    (ckpt / "model.safetensors").write_bytes(b"weights")
    return ckpt


def test_bf16_view_shares_the_weights_and_declares_bf16(tmp_path: Path) -> None:
    ckpt = _checkpoint(tmp_path)
    assert trl_grpo.checkpoint_of(ckpt, Precision.FP32) == ckpt
    view = trl_grpo.checkpoint_of(ckpt, Precision.BF16)
    assert (view / "model.safetensors").resolve() == (ckpt / "model.safetensors").resolve()
    assert json.loads((view / "config.json").read_text())["dtype"] == "bfloat16"
    assert json.loads((ckpt / "config.json").read_text())["dtype"] == "float32"  # untouched
    assert trl_grpo.checkpoint_of(ckpt, Precision.BF16) == view  # made once


@pytest.mark.parametrize("precision", list(Precision))
def test_plans_the_benchmark_writes(tmp_path: Path, precision: Precision) -> None:
    ckpt = trl_grpo.checkpoint_of(_checkpoint(tmp_path), precision)
    data = tmp_path / "prompts.jsonl"
    data.write_text('{"prompt": "1+1", "answer": "2"}\n')
    s = Settings()
    plans = {}
    for lay in trl_grpo.layouts(2, precision):
        text = trl_grpo.plan_toml(s, ckpt, lay, prompt_len=16, data=data)
        plans[lay.label] = plan_from_dict(tomllib.loads(text), lay.label, tmp_path)
    for plan in plans.values():
        assert plan.workload.models[Role.ACTOR].dtype is DType(str(precision))
    one_step_off = plans[Layout(num_workers=1, threads_per_worker=1, generator_workers=1,
                                precision=precision).label]  # fmt: skip
    assert one_step_off.workload.asynchronous
    gen = one_step_off.generator_set()
    assert gen is not None
    assert (one_step_off.sets[gen].first_device, one_step_off.sets[gen].num_devices) == (1, 1)
    colocated = plans[Layout(num_workers=2, threads_per_worker=1, precision=precision).label]
    assert not colocated.workload.asynchronous and colocated.generator_set() is None
    assert colocated.parallelism[Role.ACTOR].train.d == 2


def test_fairness_checks_count_the_threads_of_every_side() -> None:
    s = Settings(num_threads=2)
    tokens = {"trl-bf16": [[100]], "placeflow-1x1+gen1x1-async-bf16": [[100]]}
    lengths = {k: [s.response_len, s.response_len] for k in tokens}
    ok = trl_grpo.Checks(
        tokens_per_step=tokens,
        completion_len=lengths,
        threads={"trl-bf16": [2], "placeflow-1x1+gen1x1-async-bf16": [1, 1]},
        placeflow=["abc"],
    )
    assert ok.failures(s) == []
    short = trl_grpo.Checks(
        tokens_per_step={**tokens, "trl": [[99]]},
        completion_len=lengths,
        threads={"trl-bf16": [1, 1], "placeflow-1x1+gen1x1-async-bf16": [1]},
        placeflow=["abc"],
    )
    failures = short.failures(s)
    assert len(failures) == 3  # tokens differ; TRL in two processes; the async side short
    assert "tokens per step differ" in failures[0]
