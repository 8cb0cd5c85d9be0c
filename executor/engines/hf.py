"""Hugging Face checkpoints <-> the canonical fused weights of `placeflow.reshard_plan`.

Hugging Face Llama/Qwen2 keep q, k, v (and gate, up) as separate tensors named
`model.layers.{i}.self_attn.q_proj.weight` and so on; the engines fuse them.
`to_canonical` and `to_hf` are inverses (a test checks the round trip and the
logits against transformers' own model). `load_checkpoint` reads a local
checkpoint directory (config.json + safetensors/bin, or a GGUF file through
transformers) into a `ModelSpec` and full canonical weights.
"""

from __future__ import annotations

from pathlib import Path

import torch

from placeflow.errors import SpecError
from placeflow.models import ModelSpec, model_from_hf_config
from placeflow.reshard_plan import TinyLlama

_LAYER = "model.layers.{i}."
_SIMPLE = {
    "input_norm": "input_layernorm.weight",
    "o_proj": "self_attn.o_proj.weight",
    "post_norm": "post_attention_layernorm.weight",
    "down_proj": "mlp.down_proj.weight",
}
_FUSED = {
    "qkv": ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"),
    "qkv_bias": ("self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias"),
    "gate_up": ("mlp.gate_proj.weight", "mlp.up_proj.weight"),
}


def _hf_names(model: TinyLlama) -> dict[str, tuple[str, ...]]:
    """Canonical name -> the Hugging Face tensor(s) it fuses, in fusion order."""
    out: dict[str, tuple[str, ...]] = {"embed": ("model.embed_tokens.weight",)}
    for p in model.params():
        if not p.name.startswith("layers."):
            continue
        _, i, short = p.name.split(".", 2)
        pre = _LAYER.format(i=i)
        if short in _SIMPLE:
            out[p.name] = (pre + _SIMPLE[short],)
        else:
            out[p.name] = tuple(pre + n for n in _FUSED[short])
    out["norm"] = ("model.norm.weight",)
    if not model.tied_embeddings:
        out["lm_head"] = ("lm_head.weight",)
    return out


def to_canonical(hf: dict[str, torch.Tensor], model: TinyLlama) -> dict[str, torch.Tensor]:
    """Fuse a Hugging Face state dict into canonical weights (fp32 copies)."""
    out = {}
    for name, sources in _hf_names(model).items():
        missing = [s for s in sources if s not in hf]
        if missing:
            raise SpecError(f"checkpoint lacks {missing[0]} (needed for {name})")
        out[name] = torch.cat([hf[s].float() for s in sources], dim=0)
    return out


def to_hf(params: dict[str, torch.Tensor], model: TinyLlama) -> dict[str, torch.Tensor]:
    """Split full canonical weights into Hugging Face names (for engines that load by name)."""
    specs = {p.name: p for p in model.params()}
    out = {}
    for name, sources in _hf_names(model).items():
        parts = specs[name].parts if len(sources) > 1 else (params[name].shape[0],)
        for src, piece in zip(sources, params[name].split(list(parts), dim=0), strict=True):
            out[src] = piece
    return out


def load_checkpoint(path: str | Path) -> tuple[ModelSpec, dict[str, torch.Tensor]]:
    """A local checkpoint directory (or .gguf file) as (ModelSpec, full canonical weights)."""
    p = Path(path)
    if p.suffix == ".gguf":
        if not p.is_file():
            raise SpecError(f"{p}: GGUF file not found")
        config, state = _gguf_state_dict(p)
        spec = _spec_of_config(config, name=p.stem)
    else:
        if not (p / "config.json").is_file():
            raise SpecError(
                f"{p}: not a checkpoint directory (no config.json); give a directory saved "
                "by transformers' save_pretrained or a .gguf file"
            )
        spec = model_from_hf_config(p, name=p.name)
        from transformers import AutoModelForCausalLM  # heavy import, only when loading

        hf_model = AutoModelForCausalLM.from_pretrained(str(p), dtype=torch.float32)
        state = dict(hf_model.state_dict())
    weights = to_canonical(state, TinyLlama.from_model_spec(spec))
    return spec, weights


def _gguf_state_dict(path: Path) -> tuple[object, dict[str, torch.Tensor]]:
    """transformers' config and dequantised state dict (transformers' names) of a GGUF file.

    `from_pretrained(gguf_file=...)` refuses to run without `accelerate`, which
    it needs only for device placement; these are the two steps it takes, the
    tensors renamed through a weightless (meta-device) skeleton of the model.
    """
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    config = AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name)
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(config)
    loaded = load_gguf_checkpoint(str(path), return_tensors=True, model_to_load=skeleton)
    return config, dict(loaded["tensors"])


def _spec_of_config(config: object, *, name: str) -> ModelSpec:
    """A ModelSpec from a transformers config object (as a GGUF file's)."""
    import json
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        cfg = config.to_dict()  # type: ignore[attr-defined]
        # A GGUF's quantised weights are dequantised to fp32 here: that is the model's dtype.
        cfg["torch_dtype"] = "float32"
        (Path(tmp) / "config.json").write_text(json.dumps(cfg), encoding="utf-8")
        return model_from_hf_config(tmp, name=name)
