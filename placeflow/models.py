"""ModelSpec: the shape of a decoder-only transformer (Llama / Qwen2 family).

A ModelSpec holds what the cost model, the memory model and the engines need:
layer count, hidden size, attention heads and KV heads, FFN size, vocabulary,
tied embeddings, QKV bias and dtype. It is built from the catalogue
(`placeflow.catalogue`) by name, or from a Hugging Face `config.json`.

Parameter counts follow the Llama/Qwen2 layout exactly (gated SwiGLU MLP,
RMSNorm with a weight only, no biases except Qwen2's QKV bias), so that they
match the published counts; `tests/test_models.py` checks them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from placeflow.errors import SpecError


class DType(StrEnum):
    BF16 = "bf16"
    FP16 = "fp16"
    FP32 = "fp32"

    @property
    def num_bytes(self) -> int:
        return 4 if self is DType.FP32 else 2

    @staticmethod
    def parse(value: str, where: str = "dtype") -> DType:
        aliases = {"bfloat16": "bf16", "float16": "fp16", "half": "fp16", "float32": "fp32"}
        value = aliases.get(value, value)
        try:
            return DType(value)
        except ValueError:
            known = ", ".join(d.value for d in DType)
            raise SpecError(f"{where}: unknown dtype {value!r}; known: {known}") from None


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """Shape of one decoder-only transformer.

    Fields are counts (no units) except `dtype`. `head_dim` defaults to
    hidden_size / num_heads (both families in the catalogue use that).
    """

    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    ffn_hidden_size: int
    vocab_size: int
    tied_embeddings: bool = False
    qkv_bias: bool = False
    dtype: DType = DType.BF16
    max_seq_len: int = 4096
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5

    def __post_init__(self) -> None:
        for field in (
            "num_layers",
            "hidden_size",
            "num_heads",
            "num_kv_heads",
            "ffn_hidden_size",
            "vocab_size",
            "max_seq_len",
        ):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise SpecError(
                    f"model {self.name!r}: {field} must be a positive integer, got {value!r}"
                )
        if self.hidden_size % self.num_heads:
            raise SpecError(
                f"model {self.name!r}: num_heads={self.num_heads} must divide "
                f"hidden_size={self.hidden_size}"
            )
        if self.num_heads % self.num_kv_heads:
            raise SpecError(
                f"model {self.name!r}: num_kv_heads={self.num_kv_heads} must divide "
                f"num_heads={self.num_heads} (grouped-query attention)"
            )
        if not isinstance(self.dtype, DType):
            raise SpecError(f"model {self.name!r}: dtype must be a DType, got {self.dtype!r}")

    # --- derived shapes -------------------------------------------------
    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    def supports_tp(self, t: int) -> bool:
        """Tensor parallelism t splits the heads evenly, and t and the KV heads divide one
        another (KV heads are split, or replicated when t exceeds them)."""
        kv = self.num_kv_heads
        return self.num_heads % t == 0 and (kv % t == 0 if t <= kv else t % kv == 0)

    def kv_heads_per_rank(self, t: int) -> int:
        """KV heads one TP rank holds; replicated when t exceeds the KV head count."""
        return max(1, self.num_kv_heads // t)

    # --- parameter counts -----------------------------------------------
    @property
    def num_params_per_layer(self) -> int:
        h = self.hidden_size
        attn = h * self.q_size + 2 * h * self.kv_size + self.q_size * h
        if self.qkv_bias:
            attn += self.q_size + 2 * self.kv_size
        mlp = 3 * h * self.ffn_hidden_size  # gate, up, down
        norms = 2 * h
        return attn + mlp + norms

    @property
    def num_embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    def num_params(self, *, value_head: bool = False) -> int:
        """Total parameters; with `value_head` the LM head is replaced by a scalar head.

        Critics and reward models in RLHF are the same trunk with a 1-output head.
        """
        trunk = self.num_layers * self.num_params_per_layer + self.num_embedding_params
        trunk += self.hidden_size  # final norm
        if value_head:
            return trunk + self.hidden_size + 1
        if self.tied_embeddings:
            return trunk
        return trunk + self.vocab_size * self.hidden_size

    def num_bytes(self, *, value_head: bool = False) -> int:
        """Bytes of the weights in the model's dtype."""
        return self.num_params(value_head=value_head) * self.dtype.num_bytes

    # --- per-token quantities used by the simulator ----------------------
    @property
    def kv_cache_bytes_per_token(self) -> int:
        """2 (K and V) x layers x kv_heads x head_dim x bytes."""
        return 2 * self.num_layers * self.kv_size * self.dtype.num_bytes

    def flops_per_token_forward(self, *, value_head: bool = False) -> float:
        """Dense forward FLOPs per token, 2 x N (attention scores excluded)."""
        return 2.0 * self.num_params(value_head=value_head)


def model_from_hf_config(path: str | Path, *, name: str | None = None) -> ModelSpec:
    """Build a ModelSpec from a Hugging Face `config.json` (Llama, Qwen2, Mistral layouts).

    `path` may be the file or the checkpoint directory holding it.
    """
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    try:
        cfg = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SpecError(f"{p}: config.json not found") from None
    except json.JSONDecodeError as exc:
        raise SpecError(f"{p}: malformed JSON: {exc}") from None
    model_type = cfg.get("model_type", "llama")
    supported = ("llama", "qwen2", "mistral")
    if model_type not in supported:
        raise SpecError(
            f"{p}: model_type {model_type!r} is not supported; supported: {', '.join(supported)}"
        )
    required = (
        "num_hidden_layers",
        "hidden_size",
        "num_attention_heads",
        "intermediate_size",
        "vocab_size",
    )
    missing = [k for k in required if k not in cfg]
    if missing:
        raise SpecError(f"{p}: missing key(s) {', '.join(missing)}")
    heads = cfg["num_attention_heads"]
    head_dim = cfg.get("head_dim")
    if head_dim is not None and head_dim * heads != cfg["hidden_size"]:
        raise SpecError(
            f"{p}: head_dim={head_dim} x heads={heads} != hidden_size={cfg['hidden_size']}; "
            "placeflow models need hidden_size = heads x head_dim"
        )
    return ModelSpec(
        name=name or cfg.get("_name_or_path") or p.parent.name,
        num_layers=cfg["num_hidden_layers"],
        hidden_size=cfg["hidden_size"],
        num_heads=heads,
        num_kv_heads=cfg.get("num_key_value_heads") or heads,
        ffn_hidden_size=cfg["intermediate_size"],
        vocab_size=cfg["vocab_size"],
        tied_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        qkv_bias=model_type == "qwen2" or bool(cfg.get("attention_bias", False)),
        dtype=DType.parse(
            str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16"), f"{p}: torch_dtype"
        ),
        max_seq_len=cfg.get("max_position_embeddings", 4096),
        # transformers 5 moved rope_theta into rope_parameters.
        rope_theta=float(
            cfg.get("rope_theta") or (cfg.get("rope_parameters") or {}).get("rope_theta", 10000.0)
        ),
        norm_eps=float(cfg.get("rms_norm_eps", 1e-5)),
    )
