"""Hugging Face checkpoints <-> the canonical fused weights of `placeflow.reshard_plan`.

Hugging Face Llama/Qwen2 keep q, k, v (and gate, up) as separate tensors named
`model.layers.{i}.self_attn.q_proj.weight` and so on; the engines fuse them.
`to_canonical` and `to_hf` are inverses (a test checks the round trip and the
logits against transformers' own model). Qwen3 adds `self_attn.q_norm` and
`k_norm`; Qwen3-MoE's layers hold `mlp.gate` (the router) and, as
transformers 5 stores them, every expert in one tensor per projection,
`mlp.experts.gate_up_proj` (experts, 2·ffn, hidden; gate rows then up rows)
and `mlp.experts.down_proj`: expert j is row j of those (`name#j` below).
`load_checkpoint` reads a local
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
    "q_norm": "self_attn.q_norm.weight",
    "k_norm": "self_attn.k_norm.weight",
    "moe.router": "mlp.gate.weight",
    "moe.shared_down": "mlp.shared_experts.down_proj.weight",
}
_FUSED = {
    "qkv": ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"),
    "qkv_bias": ("self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias"),
    "gate_up": ("mlp.gate_proj.weight", "mlp.up_proj.weight"),
    "moe.shared_gate_up": (
        "mlp.shared_experts.gate_proj.weight",
        "mlp.shared_experts.up_proj.weight",
    ),
}
_EXPERT = {"gate_up": "mlp.experts.gate_up_proj", "down": "mlp.experts.down_proj"}


def _hf_names(model: TinyLlama) -> dict[str, tuple[str, ...]]:
    """Canonical name -> the Hugging Face tensor(s) it fuses, in fusion order."""
    out: dict[str, tuple[str, ...]] = {"embed": ("model.embed_tokens.weight",)}
    for p in model.params():
        if not p.name.startswith("layers."):
            continue
        _, i, short = p.name.split(".", 2)
        pre = _LAYER.format(i=i)
        if p.expert >= 0:  # moe.experts.<j>.<gate_up|down>: row j of the stacked tensor
            out[p.name] = (f"{pre}{_EXPERT[short.rsplit('.', 1)[1]]}#{p.expert}",)
        elif short in _SIMPLE:
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
        missing = [s for s in sources if s.split("#")[0] not in hf]
        if missing:
            raise SpecError(f"checkpoint lacks {missing[0]} (needed for {name})")
        out[name] = torch.cat([_source(hf, s).float() for s in sources], dim=0)
    return out


def _source(hf: dict[str, torch.Tensor], name: str) -> torch.Tensor:
    """A tensor by HF name, or row j of a stacked expert tensor for `name#j`."""
    base, _, row = name.partition("#")
    return hf[base][int(row)] if row else hf[base]


def to_hf(params: dict[str, torch.Tensor], model: TinyLlama) -> dict[str, torch.Tensor]:
    """Split full canonical weights into Hugging Face names (for engines that load by name)."""
    specs = {p.name: p for p in model.params()}
    out = {}
    experts: dict[str, dict[int, torch.Tensor]] = {}
    for name, sources in _hf_names(model).items():
        parts = specs[name].parts if len(sources) > 1 else (params[name].shape[0],)
        for src, piece in zip(sources, params[name].split(list(parts), dim=0), strict=True):
            base, _, row = src.partition("#")
            if row:
                experts.setdefault(base, {})[int(row)] = params[name]
            else:
                out[src] = piece
    for base, rows in experts.items():
        out[base] = torch.stack([rows[j] for j in sorted(rows)])
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
