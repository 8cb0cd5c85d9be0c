"""ModelSpec: the shape of a decoder-only transformer (Llama / Qwen2 / Qwen3 / DeepSeek-V3).

A ModelSpec holds what the cost model, the memory model and the engines need:
layer count, hidden size, attention heads and KV heads, head size, FFN size,
vocabulary, tied embeddings, QKV bias, QK-norm and dtype; for a mixture of
experts its experts (`MoESpec`), and for multi-head latent attention its
low-rank projections (`MLASpec`). It is built from the catalogue
(`placeflow.catalogue`) by name, or from a Hugging Face `config.json`.

Parameter counts follow the published layouts exactly (gated SwiGLU MLP and
experts, RMSNorm with a weight only, no biases except Qwen2's QKV bias, Qwen3's
per-head RMSNorm on queries and keys, DeepSeek's MLA with its two norms), so
that they match the published counts; `tests/test_models.py` checks them, both
the total and, for a mixture of experts, the parameters active per token.

`features` names what a model uses beyond a dense GQA Llama layer; a component
that does not implement one of them yet refuses the model with `require_features`
instead of pricing or running a different model silently.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from placeflow.errors import SpecError
from placeflow.tomlio import parse_enum


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
        return parse_enum(DType, aliases.get(value, value), where, "dtype")


def _positive(owner: str, values: dict[str, object]) -> None:
    for field, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise SpecError(f"model {owner!r}: {field} must be a positive integer, got {value!r}")


@dataclass(frozen=True, kw_only=True)
class MoESpec:
    """The experts of a mixture-of-experts layer (Qwen3-MoE, DeepSeek-V3 layouts).

    Every MoE layer has `num_experts` routed SwiGLU experts of FFN size
    `expert_ffn_hidden_size`, of which a token uses `experts_per_token`, a
    router (hidden x num_experts, no bias) and, as in DeepSeek, shared experts
    that every token uses (`shared_ffn_hidden_size` in total, 0 for none). The
    first `dense_layers` layers keep a dense MLP of the model's
    `ffn_hidden_size` (DeepSeek's `first_k_dense_replace`). `norm_topk_prob`
    says whether the k chosen experts' router probabilities are renormalised to
    sum to one (Mixtral and DeepSeek-V3 always; Qwen3-MoE when its config says
    so, and Hugging Face's default there is false).
    """

    num_experts: int
    experts_per_token: int
    expert_ffn_hidden_size: int
    shared_ffn_hidden_size: int = 0
    dense_layers: int = 0
    # Weight of the load-balancing loss in training (HF's `router_aux_loss_coef`).
    router_aux_loss_coef: float = 0.001
    norm_topk_prob: bool = True

    def check(self, owner: str, num_layers: int) -> None:
        _positive(
            owner,
            {
                "moe.num_experts": self.num_experts,
                "moe.experts_per_token": self.experts_per_token,
                "moe.expert_ffn_hidden_size": self.expert_ffn_hidden_size,
            },
        )
        if self.experts_per_token > self.num_experts:
            raise SpecError(
                f"model {owner!r}: moe.experts_per_token={self.experts_per_token} exceeds "
                f"moe.num_experts={self.num_experts}"
            )
        if not isinstance(self.norm_topk_prob, bool):
            raise SpecError(
                f"model {owner!r}: moe.norm_topk_prob must be true or false, "
                f"got {self.norm_topk_prob!r}"
            )
        for field in ("shared_ffn_hidden_size", "dense_layers"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise SpecError(f"model {owner!r}: moe.{field} must be >= 0, got {value!r}")
        if self.dense_layers >= num_layers:
            raise SpecError(
                f"model {owner!r}: moe.dense_layers={self.dense_layers} leaves no MoE layer "
                f"of {num_layers}"
            )


@dataclass(frozen=True, kw_only=True)
class MLASpec:
    """Multi-head latent attention (DeepSeek-V2/V3): low-rank queries and keys/values.

    Queries go hidden -> `q_lora_rank` (RMSNorm) -> heads x (nope + rope) dims (or
    straight from hidden when `q_lora_rank` is 0); keys and values share one
    compressed latent of `kv_lora_rank` (RMSNorm) plus one RoPE key of
    `qk_rope_head_dim`, expanded per head to nope keys and `v_head_dim` values.
    The KV cache holds the latent and the RoPE key only, as vLLM and FlashMLA do.
    """

    q_lora_rank: int
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int

    def check(self, owner: str) -> None:
        _positive(
            owner,
            {
                "mla.kv_lora_rank": self.kv_lora_rank,
                "mla.qk_nope_head_dim": self.qk_nope_head_dim,
                "mla.qk_rope_head_dim": self.qk_rope_head_dim,
                "mla.v_head_dim": self.v_head_dim,
            },
        )
        q = self.q_lora_rank
        if isinstance(q, bool) or not isinstance(q, int) or q < 0:
            raise SpecError(f"model {owner!r}: mla.q_lora_rank must be >= 0, got {q!r}")

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    def params_per_layer(self, hidden: int, heads: int) -> int:
        qk = self.qk_head_dim
        if self.q_lora_rank:
            q = hidden * self.q_lora_rank + self.q_lora_rank + self.q_lora_rank * heads * qk
        else:
            q = hidden * heads * qk
        kv_down = hidden * (self.kv_lora_rank + self.qk_rope_head_dim) + self.kv_lora_rank
        kv_up = self.kv_lora_rank * heads * (self.qk_nope_head_dim + self.v_head_dim)
        out = heads * self.v_head_dim * hidden
        return q + kv_down + kv_up + out


class Feature(StrEnum):
    """What a model uses beyond a dense grouped-query-attention Llama layer."""

    MOE = "mixture of experts"
    MLA = "multi-head latent attention"
    QK_NORM = "QK-norm"
    HEAD_DIM = "head_dim other than hidden_size / num_heads"


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """Shape of one decoder-only transformer.

    Fields are counts (no units) except `dtype`. `head_dim` 0 means
    hidden_size / num_heads (Llama, Qwen2); Qwen3 sets it explicitly (Qwen3-32B:
    64 heads of 128 on a hidden size of 5,120). With `mla`, `head_dim` is the
    query/key head size (nope + rope dims) and `num_kv_heads` equals `num_heads`.
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
    qk_norm: bool = False
    head_dim: int = 0
    moe: MoESpec | None = None
    mla: MLASpec | None = None
    dtype: DType = DType.BF16
    max_seq_len: int = 4096
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5

    def __post_init__(self) -> None:
        _positive(
            self.name,
            {
                f: getattr(self, f)
                for f in (
                    "num_layers",
                    "hidden_size",
                    "num_heads",
                    "num_kv_heads",
                    "ffn_hidden_size",
                    "vocab_size",
                    "max_seq_len",
                )
            },
        )
        hd = self.head_dim
        if isinstance(hd, bool) or not isinstance(hd, int) or hd < 0:
            raise SpecError(
                f"model {self.name!r}: head_dim must be a positive integer (or 0 for "
                f"hidden_size / num_heads), got {hd!r}"
            )
        if hd == 0:
            if self.hidden_size % self.num_heads:
                raise SpecError(
                    f"model {self.name!r}: num_heads={self.num_heads} must divide "
                    f"hidden_size={self.hidden_size} (or give head_dim explicitly)"
                )
            # Frozen: the derived value is stored once so that every reader sees one number.
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_heads)
        if self.moe is not None:
            if not isinstance(self.moe, MoESpec):
                raise SpecError(f"model {self.name!r}: moe must be a MoESpec, got {self.moe!r}")
            self.moe.check(self.name, self.num_layers)
        if self.mla is not None:
            if not isinstance(self.mla, MLASpec):
                raise SpecError(f"model {self.name!r}: mla must be a MLASpec, got {self.mla!r}")
            self.mla.check(self.name)
            if self.num_kv_heads != self.num_heads or self.head_dim != self.mla.qk_head_dim:
                raise SpecError(
                    f"model {self.name!r}: with MLA, num_kv_heads must equal num_heads "
                    f"({self.num_heads}) and head_dim the nope + rope dims "
                    f"({self.mla.qk_head_dim}); got {self.num_kv_heads} and {self.head_dim}"
                )
        if self.num_heads % self.num_kv_heads:
            raise SpecError(
                f"model {self.name!r}: num_kv_heads={self.num_kv_heads} must divide "
                f"num_heads={self.num_heads} (grouped-query attention)"
            )
        if not isinstance(self.dtype, DType):
            raise SpecError(f"model {self.name!r}: dtype must be a DType, got {self.dtype!r}")

    # --- what the model uses ---------------------------------------------
    @property
    def features(self) -> frozenset[Feature]:
        out = set()
        if self.moe is not None:
            out.add(Feature.MOE)
        if self.mla is not None:
            out.add(Feature.MLA)
        if self.qk_norm:
            out.add(Feature.QK_NORM)
        if self.mla is None and self.head_dim * self.num_heads != self.hidden_size:
            out.add(Feature.HEAD_DIM)
        return frozenset(out)

    def require_features(self, supported: frozenset[Feature] | set[Feature], where: str) -> None:
        """Refuse this model in `where` if it uses a feature `where` does not implement."""
        missing = self.features - set(supported)
        if missing:
            names = ", ".join(sorted(f.value for f in missing))
            raise SpecError(
                f"model {self.name!r} uses {names}, which {where} does not support yet; "
                "use a dense model with hidden_size = heads x head_dim there"
            )

    # --- derived shapes -------------------------------------------------
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
    def num_attention_params_per_layer(self) -> int:
        """Attention projections, their biases and norms (QK-norm, MLA's latent norms)."""
        h = self.hidden_size
        if self.mla is not None:
            return self.mla.params_per_layer(h, self.num_heads)
        attn = h * self.q_size + 2 * h * self.kv_size + self.q_size * h
        if self.qkv_bias:
            attn += self.q_size + 2 * self.kv_size
        if self.qk_norm:
            attn += 2 * self.head_dim
        return attn

    @property
    def num_dense_layers(self) -> int:
        """Layers with a dense MLP of `ffn_hidden_size` (all of them without MoE)."""
        return self.num_layers if self.moe is None else self.moe.dense_layers

    @property
    def num_moe_layers(self) -> int:
        return self.num_layers - self.num_dense_layers

    def _moe_mlp_params(self, experts: int) -> int:
        """One MoE layer's MLP holding `experts` routed experts: router, experts, shared."""
        assert self.moe is not None
        h = self.hidden_size
        routed = experts * 3 * h * self.moe.expert_ffn_hidden_size
        return h * self.moe.num_experts + routed + 3 * h * self.moe.shared_ffn_hidden_size

    def _layers_params(self, *, active: bool) -> int:
        h = self.hidden_size
        per_layer = self.num_attention_params_per_layer + 2 * h  # two RMSNorms
        total = self.num_layers * per_layer
        total += self.num_dense_layers * 3 * h * self.ffn_hidden_size  # gate, up, down
        if self.moe is not None:
            experts = self.moe.experts_per_token if active else self.moe.num_experts
            total += self.num_moe_layers * self._moe_mlp_params(experts)
        return total

    @property
    def num_params_per_layer(self) -> int:
        """Parameters of one decoder layer (the mean over layers for a mixture of experts)."""
        return self._layers_params(active=False) // self.num_layers

    @property
    def num_embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    def num_params(self, *, value_head: bool = False) -> int:
        """Total parameters; with `value_head` the LM head is replaced by a scalar head.

        Critics and reward models in RLHF are the same trunk with a 1-output head.
        """
        return self._num_params(value_head=value_head, active=False)

    def num_active_params(self, *, value_head: bool = False) -> int:
        """Parameters a token passes through: every routed expert counts only
        `experts_per_token` times (equal to `num_params` for a dense model)."""
        return self._num_params(value_head=value_head, active=True)

    def _num_params(self, *, value_head: bool, active: bool) -> int:
        trunk = self._layers_params(active=active) + self.num_embedding_params
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
        """2 (K and V) x layers x kv_heads x head_dim x bytes; with MLA the cached
        latent and RoPE key, layers x (kv_lora_rank + rope dims) x bytes."""
        if self.mla is not None:
            width = self.mla.kv_lora_rank + self.mla.qk_rope_head_dim
            return self.num_layers * width * self.dtype.num_bytes
        return 2 * self.num_layers * self.kv_size * self.dtype.num_bytes

    def flops_per_token_forward(self, *, value_head: bool = False) -> float:
        """Forward FLOPs per token, 2 x the active parameters (attention scores excluded)."""
        return 2.0 * self.num_active_params(value_head=value_head)


SUPPORTED_HF_MODEL_TYPES = (
    "llama",
    "mistral",
    "qwen2",
    "qwen3",
    "qwen3_moe",
    "mixtral",
    "deepseek_v3",
)


def _hf_moe(cfg: dict, model_type: str, where: Path) -> MoESpec | None:
    """The experts of a HF config, in each family's spelling."""
    if model_type == "qwen3_moe":
        if cfg.get("decoder_sparse_step", 1) != 1:
            raise SpecError(
                f"{where}: decoder_sparse_step={cfg['decoder_sparse_step']} is not supported; "
                "placeflow models an MoE MLP in every layer except mlp_only_layers"
            )
        return MoESpec(
            num_experts=_qwen3_num_experts(cfg),
            experts_per_token=cfg["num_experts_per_tok"],
            expert_ffn_hidden_size=cfg["moe_intermediate_size"],
            router_aux_loss_coef=cfg.get("router_aux_loss_coef", 0.001),
            # Costs do not depend on where the dense layers sit, only on how many.
            dense_layers=len(cfg.get("mlp_only_layers") or ()),
            # Hugging Face's Qwen3MoeConfig defaults to false; Qwen's released
            # checkpoints write true. Reading the default keeps the routing the
            # checkpoint was trained with.
            norm_topk_prob=cfg.get("norm_topk_prob", False),
        )
    if model_type == "mixtral":
        return MoESpec(
            num_experts=cfg["num_local_experts"],
            experts_per_token=cfg["num_experts_per_tok"],
            expert_ffn_hidden_size=cfg["intermediate_size"],
            router_aux_loss_coef=cfg.get("router_aux_loss_coef", 0.001),
        )
    if model_type == "deepseek_v3":
        if cfg.get("moe_layer_freq", 1) != 1:
            raise SpecError(f"{where}: moe_layer_freq={cfg['moe_layer_freq']} is not supported")
        return MoESpec(
            num_experts=cfg["n_routed_experts"],
            experts_per_token=cfg["num_experts_per_tok"],
            expert_ffn_hidden_size=cfg["moe_intermediate_size"],
            shared_ffn_hidden_size=cfg.get("n_shared_experts", 0) * cfg["moe_intermediate_size"],
            dense_layers=cfg.get("first_k_dense_replace", 0),
            norm_topk_prob=cfg.get("norm_topk_prob", True),
        )
    return None


def _qwen3_num_experts(cfg: dict) -> int:
    # Qwen's published configs say `num_experts`; transformers 5 saves the same
    # number as `num_local_experts` (its attribute map), so a config written by
    # `save_pretrained` has only that key.
    return cfg["num_experts"] if "num_experts" in cfg else cfg["num_local_experts"]


def model_from_hf_config(path: str | Path, *, name: str | None = None) -> ModelSpec:
    """Build a ModelSpec from a Hugging Face `config.json` (the families of
    `SUPPORTED_HF_MODEL_TYPES`).

    `path` may be the file or the checkpoint directory holding it. DeepSeek-V3's
    multi-token-prediction layers (`num_nextn_predict_layers`) are not counted:
    RL post-training runs the main model only.
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
    if not isinstance(cfg, dict):
        raise SpecError(f"{p}: expected a JSON object, got {type(cfg).__name__}")
    model_type = cfg.get("model_type", "llama")
    if model_type not in SUPPORTED_HF_MODEL_TYPES:
        raise SpecError(
            f"{p}: model_type {model_type!r} is not supported; supported: "
            f"{', '.join(SUPPORTED_HF_MODEL_TYPES)}"
        )
    required = [
        "num_hidden_layers",
        "hidden_size",
        "num_attention_heads",
        "intermediate_size",
        "vocab_size",
    ]
    required += {
        "qwen3_moe": ["num_experts_per_tok", "moe_intermediate_size"],
        "mixtral": ["num_local_experts", "num_experts_per_tok"],
        "deepseek_v3": [
            "n_routed_experts",
            "num_experts_per_tok",
            "moe_intermediate_size",
            "kv_lora_rank",
            "qk_nope_head_dim",
            "qk_rope_head_dim",
            "v_head_dim",
        ],
    }.get(model_type, [])
    missing = [k for k in required if k not in cfg]
    if model_type == "qwen3_moe" and not {"num_experts", "num_local_experts"} & cfg.keys():
        missing.append("num_experts (or num_local_experts)")
    if missing:
        raise SpecError(f"{p}: missing key(s) {', '.join(missing)}")
    try:
        return _spec_from_hf(cfg, model_type, p, name)
    except SpecError:
        raise
    except (TypeError, ValueError) as exc:
        raise SpecError(f"{p}: a value has the wrong type: {exc}") from None


def _spec_from_hf(cfg: dict, model_type: str, p: Path, name: str | None) -> ModelSpec:
    heads = cfg["num_attention_heads"]
    mla = None
    if model_type == "deepseek_v3":
        mla = MLASpec(
            q_lora_rank=cfg.get("q_lora_rank") or 0,
            kv_lora_rank=cfg["kv_lora_rank"],
            qk_nope_head_dim=cfg["qk_nope_head_dim"],
            qk_rope_head_dim=cfg["qk_rope_head_dim"],
            v_head_dim=cfg["v_head_dim"],
        )
        head_dim = mla.qk_head_dim
        kv_heads = heads
    else:
        head_dim = cfg.get("head_dim") or 0
        if model_type in ("qwen3", "qwen3_moe") and not head_dim:
            head_dim = 128  # transformers' Qwen3Config default
        kv_heads = cfg.get("num_key_value_heads") or heads
    return ModelSpec(
        name=name or cfg.get("_name_or_path") or p.parent.name,
        num_layers=cfg["num_hidden_layers"],
        hidden_size=cfg["hidden_size"],
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        ffn_hidden_size=cfg["intermediate_size"],
        vocab_size=cfg["vocab_size"],
        tied_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        qkv_bias=model_type == "qwen2" or bool(cfg.get("attention_bias", False)),
        qk_norm=model_type in ("qwen3", "qwen3_moe"),
        moe=_hf_moe(cfg, model_type, p),
        mla=mla,
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
