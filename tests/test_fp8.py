"""FP8 precisions: the datasheet's FP8 GEMM speedup in the cost model, FP8 generation
weights and KV cache in memory, the executor's refusal and the exports.

Oracles: the datasheet ratio (dense FP8 / dense BF16 peaks) applied by hand to the
bf16 GEMM time; bytes per parameter and per KV element by hand; unchanged figures
for bf16 workloads; verl's config and OpenRLHF's parser for the exports.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from placeflow.api import simulate
from placeflow.catalogue import get_model
from placeflow.errors import SpecError
from placeflow.executable import executable_problems
from placeflow.export import Target, export_plan
from placeflow.plan import Plan, load_plan
from placeflow.profiles.registry import fitted_cost_model
from placeflow.profiles.siblings import FIGURES_BY_PROFILE
from placeflow.simulator import memory
from placeflow.simulator.estimate import StepEstimate
from placeflow.workload import KVCacheDType, Precision, load_workload, workload_to_dict

ROOT = Path(__file__).resolve().parents[1]
PLANS = ROOT / "examples" / "plans"


def _with(plan: Plan, **kw: object) -> Plan:
    return dataclasses.replace(plan, workload=dataclasses.replace(plan.workload, **kw))


@pytest.mark.parametrize(
    ("profile", "speedup"),
    [("h100-sxm", 2.0), ("h800", 2.0), ("h20", 2.0), ("b200", 2.0), ("gb200", 2.0)],
)
def test_fp8_gemm_is_the_bf16_gemm_over_the_datasheet_ratio(profile: str, speedup: float) -> None:
    cm = fitted_cost_model(profile)
    fig = FIGURES_BY_PROFILE[profile]
    # Dense peaks: H100 1,979 / 989 TFLOP/s, H20 296 / 148, B200 4.5 / 2.25 PFLOP/s ...
    ratio = fig.peak_fp8_flops_per_s / fig.peak_bf16_flops_per_s
    assert ratio == pytest.approx(speedup, rel=2e-3)
    fp8 = cm.fp8()
    for m, n, k in ((1, 4096, 4096), (4096, 4096, 4096), (8192, 14336, 4096)):
        assert fp8.gemm_s(m, n, k) == pytest.approx(cm.gemm_s(m, n, k) / ratio)
    # Only GEMMs change: attention and collectives are those of the profile's dtype.
    assert fp8.attn_decode_s(8, 1024, 32, 8, 128) == cm.attn_decode_s(8, 1024, 32, 8, 128)
    assert cm.fp8() is fp8  # one view per model, its answers remembered


@pytest.mark.parametrize("profile", ["a100-80gb", "a800-80gb", "cpu"])
def test_fp8_on_a_device_without_fp8_is_a_clear_error(profile: str) -> None:
    with pytest.raises(SpecError, match="has no FP8 tensor cores"):
        fitted_cost_model(profile).fp8()


def test_fp8_generation_weights_and_kv_cache_take_one_byte() -> None:
    model = get_model("qwen2.5-7b")
    params = model.num_bytes() / model.dtype.num_bytes
    assert memory.generation_weight_bytes(model, Precision.FP8) == params
    assert memory.generation_weight_bytes(model, Precision.BF16) == 2 * params
    auto = memory.kv_bytes_per_token_per_gpu(model, 2, 1)
    # Qwen2.5-7B: 28 layers, 4 KV heads of 128 over tg = 2: 2·28·2·128 elements per token.
    assert auto == 2 * 28 * 2 * 128 * 2
    assert memory.kv_bytes_per_token_per_gpu(model, 2, 1, KVCacheDType.FP8) == auto / 2


def _phases(est: StepEstimate) -> dict[str, float]:
    """Seconds of each phase of the step that stands for one step."""
    return {p.name: p.duration_s for p in est.phases if p.step == est.steady_step}


def test_fp8_generation_speeds_generation_and_frees_kv_memory() -> None:
    plan = load_plan(PLANS / "ppo-7b-colocate-h100x16.toml")
    base = simulate(plan)
    fp8 = simulate(_with(plan, generation_precision=Precision.FP8))
    kv8 = simulate(_with(plan, kv_cache_dtype=KVCacheDType.FP8))
    phase, gen8 = _phases(base), _phases(fp8)
    assert fp8.feasible and kv8.feasible
    assert gen8["generate"] < phase["generate"]
    # Training phases price as before: only generation's GEMMs are FP8.
    assert gen8["actor_update"] == pytest.approx(phase["actor_update"])
    assert fp8.iteration_s < base.iteration_s
    assert kv8.iteration_s <= base.iteration_s
    train8 = simulate(_with(plan, train_precision=Precision.FP8))
    updates = _phases(train8)
    assert updates["actor_update"] < phase["actor_update"]
    assert updates["ref_logprob"] == pytest.approx(phase["ref_logprob"])  # frozen: bf16


def test_fp8_on_a100_pools_is_refused_when_simulated() -> None:
    plan = load_plan(PLANS / "ppo-llama2-13b-openrlhf-a800x8.toml")
    with pytest.raises(SpecError, match="no FP8 tensor cores"):
        simulate(_with(plan, generation_precision=Precision.FP8))


def test_precision_keys_round_trip_and_default_files_keep_their_text() -> None:
    w = load_workload(ROOT / "examples" / "workloads" / "grpo-qwen2.5-7b-fp8.toml")
    assert (w.generation_precision, w.kv_cache_dtype, w.train_precision) == (
        Precision.FP8,
        KVCacheDType.FP8,
        Precision.BF16,
    )
    d = workload_to_dict(w)
    assert d["generation_precision"] == "fp8" and "train_precision" not in d
    plain = load_workload(ROOT / "examples" / "workloads" / "grpo-qwen2.5-7b.toml")
    assert "generation_precision" not in workload_to_dict(plain)


def test_bad_precision_is_a_clear_error(tmp_path: Path) -> None:
    text = (ROOT / "examples" / "workloads" / "grpo-qwen2.5-7b-fp8.toml").read_text()
    bad = tmp_path / "w.toml"
    bad.write_text(text.replace('generation_precision = "fp8"', 'generation_precision = "int4"'))
    with pytest.raises(SpecError, match="generation_precision"):
        load_workload(bad)


def test_executor_refuses_fp8_and_exports_say_what_they_can() -> None:
    from test_export import _get, _openrlhf_args, _verl_config

    plan = _with(
        load_plan(PLANS / "ppo-7b-colocate-h100x16.toml"),
        generation_precision=Precision.FP8,
        kv_cache_dtype=KVCacheDType.FP8,
    )
    assert any("generation_precision = fp8" in p for p in executable_problems(plan))
    verl = export_plan(plan, Target.VERL)
    cfg = _verl_config(list(verl.arguments))
    assert _get(cfg, "actor_rollout_ref.rollout.quantization") == "fp8"
    assert _get(cfg, "actor_rollout_ref.rollout.engine_kwargs.vllm.kv_cache_dtype") == "fp8"
    assert not any("kv_cache_dtype" in n for n in verl.unexpressed)
    openrlhf = export_plan(plan, Target.OPENRLHF)
    _openrlhf_args(openrlhf.arguments)
    assert any("no FP8 flag" in n for n in openrlhf.unexpressed)
