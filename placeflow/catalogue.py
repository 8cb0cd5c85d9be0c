"""The model catalogue: published shapes of the models placeflow knows by name.

Shapes are copied from each model's published `config.json`. `PUBLISHED_PARAMS`
holds the parameter counts the publishers report (safetensors totals), against
which `tests/test_models.py` checks `ModelSpec.num_params` (within 1%).

The `tiny-*` models are random-init test models that train in seconds on CPU.
"""

from __future__ import annotations

from pathlib import Path

from placeflow.errors import UnknownNameError
from placeflow.models import DType, ModelSpec, model_from_hf_config


def _llama2(name: str, layers: int, hidden: int, heads: int, kv: int, ffn: int) -> ModelSpec:
    return ModelSpec(
        name=name,
        num_layers=layers,
        hidden_size=hidden,
        num_heads=heads,
        num_kv_heads=kv,
        ffn_hidden_size=ffn,
        vocab_size=32000,
        max_seq_len=4096,
    )


def _llama31(name: str, layers: int, hidden: int, heads: int, ffn: int) -> ModelSpec:
    return ModelSpec(
        name=name,
        num_layers=layers,
        hidden_size=hidden,
        num_heads=heads,
        num_kv_heads=8,
        ffn_hidden_size=ffn,
        vocab_size=128256,
        max_seq_len=131072,
        rope_theta=500000.0,
    )


def _qwen25(
    name: str, layers: int, hidden: int, heads: int, kv: int, ffn: int, vocab: int, tied: bool
) -> ModelSpec:
    return ModelSpec(
        name=name,
        num_layers=layers,
        hidden_size=hidden,
        num_heads=heads,
        num_kv_heads=kv,
        ffn_hidden_size=ffn,
        vocab_size=vocab,
        tied_embeddings=tied,
        qkv_bias=True,
        max_seq_len=32768,
        rope_theta=1000000.0,
        norm_eps=1e-6,
    )


CATALOGUE: dict[str, ModelSpec] = {
    m.name: m
    for m in (
        _llama2("llama-2-7b", 32, 4096, 32, 32, 11008),
        _llama2("llama-2-13b", 40, 5120, 40, 40, 13824),
        _llama2("llama-2-70b", 80, 8192, 64, 8, 28672),
        ModelSpec(
            name="codellama-34b",
            num_layers=48,
            hidden_size=8192,
            num_heads=64,
            num_kv_heads=8,
            ffn_hidden_size=22016,
            vocab_size=32000,
            max_seq_len=16384,
            rope_theta=1000000.0,
        ),
        _llama31("llama-3.1-8b", 32, 4096, 32, 14336),
        _llama31("llama-3.1-70b", 80, 8192, 64, 28672),
        _qwen25("qwen2.5-0.5b", 24, 896, 14, 2, 4864, 151936, True),
        _qwen25("qwen2.5-1.5b", 28, 1536, 12, 2, 8960, 151936, True),
        _qwen25("qwen2.5-7b", 28, 3584, 28, 4, 18944, 152064, False),
        _qwen25("qwen2.5-14b", 48, 5120, 40, 8, 13824, 152064, False),
        _qwen25("qwen2.5-32b", 64, 5120, 40, 8, 27648, 152064, False),
        _qwen25("qwen2.5-72b", 80, 8192, 64, 8, 29568, 152064, False),
        ModelSpec(
            name="smollm2-135m",
            num_layers=30,
            hidden_size=576,
            num_heads=9,
            num_kv_heads=3,
            ffn_hidden_size=1536,
            vocab_size=49152,
            tied_embeddings=True,
            max_seq_len=8192,
            rope_theta=100000.0,
        ),
        # Random-init test models (fp32: they run on CPU).
        ModelSpec(
            name="tiny-llama",
            num_layers=2,
            hidden_size=128,
            num_heads=4,
            num_kv_heads=2,
            ffn_hidden_size=352,
            vocab_size=256,
            dtype=DType.FP32,
            max_seq_len=512,
        ),
        ModelSpec(
            name="tiny-llama-m",
            num_layers=4,
            hidden_size=256,
            num_heads=8,
            num_kv_heads=4,
            ffn_hidden_size=704,
            vocab_size=256,
            dtype=DType.FP32,
            max_seq_len=512,
        ),
        ModelSpec(
            name="tiny-qwen2",
            num_layers=2,
            hidden_size=128,
            num_heads=4,
            num_kv_heads=2,
            ffn_hidden_size=352,
            vocab_size=256,
            tied_embeddings=True,
            qkv_bias=True,
            dtype=DType.FP32,
            max_seq_len=512,
        ),
    )
}

# Published parameter counts (safetensors totals on the publishers' model cards).
PUBLISHED_PARAMS: dict[str, int] = {
    "llama-2-7b": 6_738_415_616,
    "llama-2-13b": 13_015_864_320,
    "llama-2-70b": 68_976_648_192,
    "codellama-34b": 33_743_970_304,
    "llama-3.1-8b": 8_030_261_248,
    "llama-3.1-70b": 70_553_706_496,
    "qwen2.5-0.5b": 494_032_768,
    "qwen2.5-1.5b": 1_543_714_304,
    "qwen2.5-7b": 7_615_616_512,
    "qwen2.5-14b": 14_770_033_664,
    "qwen2.5-32b": 32_763_876_352,
    "qwen2.5-72b": 72_706_203_648,
    "smollm2-135m": 134_515_008,
}


def get_model(name: str) -> ModelSpec:
    """A catalogue model by name, or a local HF checkpoint directory / config.json path."""
    if name in CATALOGUE:
        return CATALOGUE[name]
    path = Path(name)
    if path.exists() and (path.is_dir() or path.suffix == ".json"):
        # Named by the path so that a workload written back out refers to it again.
        return model_from_hf_config(path, name=name)
    raise UnknownNameError("model", name, list(CATALOGUE) + ["<path to a HF config.json>"])
