"""The model catalogue: published shapes of the models placeflow knows by name.

Shapes are copied from each model's published `config.json`. `PUBLISHED_PARAMS`
holds the parameter counts the publishers report (safetensors totals), against
which `tests/test_models.py` checks `ModelSpec.num_params` (within 1%).
`PUBLISHED_PARAMS_ROUNDED` holds the rounded counts of the model cards that
give no exact total (Qwen3, DeepSeek-V3), total and active per token, which
the computed counts must round to.

The `tiny-*` models are random-init test models that train in seconds on CPU.
"""

from __future__ import annotations

from pathlib import Path

from placeflow.errors import UnknownNameError
from placeflow.models import DType, MLASpec, ModelSpec, MoESpec, model_from_hf_config


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


def _qwen3(
    name: str,
    layers: int,
    hidden: int,
    heads: int,
    kv: int,
    ffn: int,
    tied: bool,
    moe: MoESpec | None = None,
) -> ModelSpec:
    return ModelSpec(
        name=name,
        num_layers=layers,
        hidden_size=hidden,
        num_heads=heads,
        num_kv_heads=kv,
        head_dim=128,
        qk_norm=True,
        ffn_hidden_size=ffn,
        vocab_size=151936,
        tied_embeddings=tied,
        moe=moe,
        max_seq_len=40960,
        rope_theta=1000000.0,
        norm_eps=1e-6,
    )


def _qwen3_moe(experts_ffn: int) -> MoESpec:
    return MoESpec(num_experts=128, experts_per_token=8, expert_ffn_hidden_size=experts_ffn)


# DeepSeek-V3 (and R1, same shape): MLA, 256 routed experts + 1 shared, top 8,
# the first 3 layers dense. Its multi-token-prediction layer is not counted.
_DEEPSEEK_V3 = ModelSpec(
    name="deepseek-v3",
    num_layers=61,
    hidden_size=7168,
    num_heads=128,
    num_kv_heads=128,
    head_dim=192,
    ffn_hidden_size=18432,
    vocab_size=129280,
    mla=MLASpec(
        q_lora_rank=1536,
        kv_lora_rank=512,
        qk_nope_head_dim=128,
        qk_rope_head_dim=64,
        v_head_dim=128,
    ),
    moe=MoESpec(
        num_experts=256,
        experts_per_token=8,
        expert_ffn_hidden_size=2048,
        shared_ffn_hidden_size=2048,
        dense_layers=3,
    ),
    max_seq_len=163840,
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
        _qwen3("qwen3-0.6b", 28, 1024, 16, 8, 3072, True),
        _qwen3("qwen3-1.7b", 28, 2048, 16, 8, 6144, True),
        _qwen3("qwen3-4b", 36, 2560, 32, 8, 9728, True),
        _qwen3("qwen3-8b", 36, 4096, 32, 8, 12288, False),
        _qwen3("qwen3-14b", 40, 5120, 40, 8, 17408, False),
        _qwen3("qwen3-32b", 64, 5120, 64, 8, 25600, False),
        _qwen3("qwen3-30b-a3b", 48, 2048, 32, 4, 6144, False, _qwen3_moe(768)),
        _qwen3("qwen3-235b-a22b", 94, 4096, 64, 4, 12288, False, _qwen3_moe(1536)),
        _DEEPSEEK_V3,
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

# Rounded counts from the model cards, in billions: (total, active per token or
# None for dense, decimals given). Qwen3 cards (huggingface.co/Qwen/Qwen3-*):
# "Number of Parameters"; DeepSeek-V3 (huggingface.co/deepseek-ai/DeepSeek-V3):
# 671B total, 37B activated, main model without its 14B MTP module.
PUBLISHED_PARAMS_ROUNDED: dict[str, tuple[float, float | None, int]] = {
    "qwen3-0.6b": (0.6, None, 1),
    "qwen3-1.7b": (1.7, None, 1),
    "qwen3-4b": (4.0, None, 1),
    "qwen3-8b": (8.2, None, 1),
    "qwen3-14b": (14.8, None, 1),
    "qwen3-32b": (32.8, None, 1),
    "qwen3-30b-a3b": (30.5, 3.3, 1),
    "qwen3-235b-a22b": (235.0, 22.0, 0),
    "deepseek-v3": (671.0, 37.0, 0),
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
