"""ModelSpec: parameter counts against published counts, HF config loading, validation."""

import json

import pytest

from placeflow.catalogue import CATALOGUE, PUBLISHED_PARAMS, get_model
from placeflow.errors import SpecError, UnknownNameError
from placeflow.models import DType, ModelSpec, model_from_hf_config

REQUIRED = {
    "llama-2-7b",
    "llama-2-13b",
    "codellama-34b",
    "llama-2-70b",
    "llama-3.1-8b",
    "llama-3.1-70b",
    "qwen2.5-0.5b",
    "qwen2.5-1.5b",
    "qwen2.5-7b",
    "qwen2.5-14b",
    "qwen2.5-32b",
    "qwen2.5-72b",
    "smollm2-135m",
}


def test_catalogue_has_the_required_models_and_tiny_ones():
    assert set(CATALOGUE) >= REQUIRED
    assert set(PUBLISHED_PARAMS) >= REQUIRED
    assert any(name.startswith("tiny-") for name in CATALOGUE)


@pytest.mark.parametrize("name", sorted(PUBLISHED_PARAMS))
def test_param_count_matches_published_within_1_percent(name):
    computed = CATALOGUE[name].num_params()
    assert abs(computed - PUBLISHED_PARAMS[name]) / PUBLISHED_PARAMS[name] < 0.01


def test_param_count_by_hand_for_tiny_llama():
    m = CATALOGUE["tiny-llama"]
    h, f, v, layers, hd = 128, 352, 256, 2, 32
    attn = h * 4 * hd + 2 * h * 2 * hd + 4 * hd * h  # q, k, v (2 kv heads), o
    per_layer = attn + 3 * h * f + 2 * h
    assert m.num_params() == layers * per_layer + v * h + h + v * h


def test_value_head_replaces_lm_head():
    m = CATALOGUE["llama-2-7b"]
    assert m.num_params() - m.num_params(value_head=True) == 32000 * 4096 - 4096 - 1


def test_kv_cache_bytes_llama3_8b():
    # DESIGN.md: 131,072 bytes per token for Llama-3-8B in bf16.
    assert CATALOGUE["llama-3.1-8b"].kv_cache_bytes_per_token == 131_072


def test_from_hf_config_matches_catalogue(tmp_path):
    cfg = {
        "model_type": "qwen2",
        "num_hidden_layers": 24,
        "hidden_size": 896,
        "num_attention_heads": 14,
        "num_key_value_heads": 2,
        "intermediate_size": 4864,
        "vocab_size": 151936,
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
        "max_position_embeddings": 32768,
    }
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    m = model_from_hf_config(tmp_path, name="q")
    assert m.num_params() == PUBLISHED_PARAMS["qwen2.5-0.5b"]
    assert m.dtype is DType.BF16 and m.qkv_bias
    assert get_model(str(tmp_path)).num_params() == m.num_params()


def test_hf_config_errors_are_clear(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "gpt2"}')
    with pytest.raises(SpecError, match="not supported"):
        model_from_hf_config(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(SpecError, match="malformed JSON"):
        model_from_hf_config(tmp_path)


def test_unknown_model_lists_known():
    with pytest.raises(UnknownNameError, match="llama-2-7b"):
        get_model("llama-9")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"num_heads": 3}, "must divide hidden_size"),
        ({"num_kv_heads": 3}, "must divide num_heads"),
        ({"num_layers": 0}, "positive integer"),
    ],
)
def test_impossible_specs_are_rejected(change, message):
    base = dict(
        name="m",
        num_layers=2,
        hidden_size=128,
        num_heads=4,
        num_kv_heads=2,
        ffn_hidden_size=256,
        vocab_size=100,
    )
    with pytest.raises(SpecError, match=message):
        ModelSpec(**{**base, **change})
