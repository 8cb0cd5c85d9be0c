"""The Llama / Qwen2 decoder the engines run: tensor- and pipeline-parallel, with a KV cache.

Parameters are named and shaped exactly as `placeflow.reshard_plan` describes
them (`embed`, `layers.i.qkv`, `layers.i.gate_up`, ... ), holding this TP
rank's shard: fused q/k/v and gate/up split part by part, o_proj and
down_proj split by columns, embedding and lm_head split by vocabulary rows,
norms whole. So a training shard, a generation shard from the resharder and a
checkpoint all load with `load_shards` and no renaming. Hugging Face names
are mapped in `placeflow.executor.engines.hf`.

The math is Hugging Face's Llama (RMSNorm, rotate-half RoPE, SiLU-gated MLP,
grouped-query attention); Qwen2 adds the q/k/v bias; Qwen3 sets head_dim
explicitly (heads x head_dim may differ from hidden) and normalises each
query and key head (RMSNorm over head_dim, before RoPE: `q_norm`, `k_norm`).
A mixture of experts (Qwen3-MoE, Mixtral, DeepSeek's shared experts) replaces
the MLP of every layer after its first `dense_layers` with `MoEMLP`
(`engines/moe.py`): experts split over the expert-parallel group given as
`ep` (a training layout with e > 1), all of them on every rank otherwise (a
generation replica); `aux_loss` is the load-balancing loss of the last
forward. Expert tensor parallelism (t > 1 with experts) is not run. A critic or reward model
is the same trunk with `value_head` (one output per token) instead of lm_head.

Pipeline stages: a `Transformer` built with a `PPGroup` holds one stage, the
weights `ParamSpec.stage` places there (contiguous layers; the embedding on the
first stage, the final norm and the head on the last), under their full-model
names (`layers.6.qkv` stays `layers.6.qkv` on stage 1). A stage after the
first takes the previous stage's hidden states instead of token ids' embedding;
a stage before the last returns its hidden states. Tied embeddings (no
lm_head) put the vocabulary matrix on both ends: as in Megatron, the last stage
keeps a copy named `embed` whose gradient the trainer adds to the first
stage's (`TrainEngine`), so both copies take the same steps; the stage rule,
resharding and the gradient norm count only the first stage's.

Sequences are left-padded prompts followed by responses: `mask` marks real
tokens, positions count real tokens only, and a query attends to earlier real
keys and to itself (so a padding row never takes a softmax over nothing).
Generation and training run the same code on the same layout, which is what
makes their logprobs agree.

Precision, as mixed-precision trainers do it: the model's dtype (the
workload's `ModelSpec.dtype`) is the compute dtype, `Arch.compute_dtype`. A
trained model keeps fp32 master weights (so its optimizer state is fp32 too)
and runs its forward under `torch.autocast` in the compute dtype: matmuls and
attention in bf16, norms, softmax and the residual stream in fp32. A frozen
model (reference, reward, the rollout copy of the policy) holds its weights in
the compute dtype itself and needs no autocast. Attention is
`scaled_dot_product_attention` everywhere (prefill, decode, training), which
picks the fused kernels the device has. fp16 is refused: it needs loss
scaling, which nothing here does.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from placeflow.errors import SpecError
from placeflow.executor.engines.moe import (
    SINGLE_EP,
    EPGroup,
    MoEMLP,
    RoutingRecord,
    load_balancing_loss,
)
from placeflow.executor.engines.pipeline import SINGLE_STAGE, PPGroup
from placeflow.executor.engines.tp import (
    SINGLE,
    TPGroup,
    column_linear,
    copy_to_tp,
    gather_from_tp,
    reduce_from_tp,
)
from placeflow.models import DType, ModelSpec
from placeflow.reshard_plan import Sharding, TinyLlama, split_ranges

COMPUTE_DTYPES = {DType.FP32: torch.float32, DType.BF16: torch.bfloat16}


@dataclass(frozen=True, kw_only=True)
class Arch:
    """Shapes, the two constants the math needs besides them, and the compute dtype."""

    weights: TinyLlama
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    compute_dtype: torch.dtype = torch.float32  # matmuls and attention (see the docstring)
    experts_per_token: int = 0  # top-k of a mixture of experts (0: dense)
    router_aux_loss_coef: float = 0.0  # weight of the load-balancing loss in training
    norm_topk_prob: bool = True  # renormalise the top-k router weights (MoESpec)

    @classmethod
    def of(cls, spec: ModelSpec) -> Arch:
        if spec.dtype not in COMPUTE_DTYPES:
            raise SpecError(
                f"model {spec.name!r}: dtype {spec.dtype} is not run by the built-in engines "
                f"(fp16 needs loss scaling); use one of {[str(d) for d in COMPUTE_DTYPES]}"
            )
        return cls(
            weights=TinyLlama.from_model_spec(spec),
            rope_theta=spec.rope_theta,
            norm_eps=spec.norm_eps,
            compute_dtype=COMPUTE_DTYPES[spec.dtype],
            experts_per_token=spec.moe.experts_per_token if spec.moe else 0,
            router_aux_loss_coef=spec.moe.router_aux_loss_coef if spec.moe else 0.0,
            norm_topk_prob=spec.moe.norm_topk_prob if spec.moe else True,
        )


@dataclass
class KVCache:
    """Preallocated keys and values per layer: (batch, local kv heads, capacity, head_dim)."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    mask: torch.Tensor  # (batch, capacity) bool: which cache slots hold real tokens
    length: int = 0

    @classmethod
    def empty(cls, model: Transformer, batch: int, capacity: int, device: torch.device) -> KVCache:
        shape = (batch, model.local_kv_heads, capacity, model.head_dim)
        dtype, n = model.arch.compute_dtype, len(model.layers)
        return cls(
            keys=[torch.zeros(shape, dtype=dtype, device=device) for _ in range(n)],
            values=[torch.zeros(shape, dtype=dtype, device=device) for _ in range(n)],
            mask=torch.zeros((batch, capacity), dtype=torch.bool, device=device),
        )

    def keep_rows(self, rows: torch.Tensor) -> None:
        """Keep only the batch rows `rows` (indices, in order): the sampler drops the
        sequences that have finished, so the steps after run on the rows still decoding."""
        self.keys = [k.index_select(0, rows) for k in self.keys]
        self.values = [v.index_select(0, rows) for v in self.values]
        self.mask = self.mask.index_select(0, rows)


@dataclass(frozen=True, kw_only=True)
class Attention:
    """What every layer's attention shares in one forward: rotary tables, mask, cache place.

    `mask` (batch, 1, queries, keys) is True where a query may attend. With `cache`,
    the new keys go to positions start..start+seq, or, with `slot` (decode with fixed
    shapes), to that one slot while attention runs over the whole capacity. Passed
    as one value so that the layer's call and its attention share one signature; the
    tensors are already in the compute dtype (FSDP2's input cast has nothing to do).
    """

    cos: torch.Tensor
    sin: torch.Tensor
    mask: torch.Tensor
    cache: KVCache | None = None
    start: int = 0
    slot: torch.Tensor | None = None


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    var = x.float().pow(2).mean(-1, keepdim=True)
    return (x.float() * torch.rsqrt(var + eps)).to(x.dtype) * weight


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rope(
    positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of shape (batch, 1, seq, head_dim) for integer `positions` (batch, seq)."""
    inv = 1.0 / (
        theta ** (torch.arange(0, head_dim, 2, device=positions.device).float() / head_dim)
    )
    freqs = positions.float()[..., None] * inv  # (b, s, hd/2)
    emb = torch.cat((freqs, freqs), dim=-1)[:, None]
    return emb.cos().to(dtype), emb.sin().to(dtype)


class Layer(nn.Module):
    def __init__(
        self, arch: Arch, tp: TPGroup, dtype: torch.dtype, index: int = 0, ep: EPGroup = SINGLE_EP
    ) -> None:
        super().__init__()
        w, t = arch.weights, tp.size
        hd = w.head_dim
        q, kv = w.num_heads * hd // t, w.num_kv_heads * hd // t
        self.input_norm = nn.Parameter(torch.ones(w.hidden, dtype=dtype))
        self.qkv = nn.Parameter(torch.empty(q + 2 * kv, w.hidden, dtype=dtype))
        self.qkv_bias = nn.Parameter(torch.zeros(q + 2 * kv, dtype=dtype)) if w.qkv_bias else None
        self.q_norm = nn.Parameter(torch.ones(hd, dtype=dtype)) if w.qk_norm else None
        self.k_norm = nn.Parameter(torch.ones(hd, dtype=dtype)) if w.qk_norm else None
        self.o_proj = nn.Parameter(torch.empty(w.hidden, q, dtype=dtype))
        self.post_norm = nn.Parameter(torch.ones(w.hidden, dtype=dtype))
        self.moe: MoEMLP | None = None
        self.gate_up: nn.Parameter | None = None
        self.down_proj: nn.Parameter | None = None
        if w.is_moe_layer(index):
            if t > 1:
                raise SpecError(
                    f"expert tensor parallelism (t={t} with experts) is not run by the built-in "
                    "engines; train and generate a mixture of experts with t = 1 and tg = 1"
                )
            self.moe = MoEMLP(w.hidden, w.expert_ffn, w.num_experts, arch.experts_per_token,
                              shared_ffn=w.shared_ffn, ep=ep, dtype=dtype,
                              norm_topk_prob=arch.norm_topk_prob)  # fmt: skip
        else:
            self.gate_up = nn.Parameter(torch.empty(2 * w.ffn // t, w.hidden, dtype=dtype))
            self.down_proj = nn.Parameter(torch.empty(w.hidden, w.ffn // t, dtype=dtype))
        self.q, self.kv, self.ffn = q, kv, w.ffn // t
        self.heads, self.kv_heads, self.head_dim = w.num_heads // t, w.num_kv_heads // t, hd
        self.tp, self.eps = tp, arch.norm_eps
        if tp.megatron and self.moe is None:  # megatron-core layers around this layer's weights
            full_qkv = (w.num_heads + 2 * w.num_kv_heads) * hd
            self.qkv_linear = column_linear(tp, w.hidden, full_qkv, gather=False)
            self.gate_up_linear = column_linear(tp, w.hidden, 2 * w.ffn, gather=False)

    def forward(
        self,
        x: torch.Tensor,
        attn: Attention,
        index: int,
        token_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        # Called as a module (not a method of the model) so that FSDP2's per-layer
        # hooks gather this layer's weights around it.
        x = x + self._attention(x, attn, index)
        if self.moe is not None:
            return x + self.moe(rms_norm(x, self.post_norm, self.eps), token_mask)
        return x + self._mlp(x)

    def _attention(self, x: torch.Tensor, attn: Attention, index: int) -> torch.Tensor:
        cos, sin, cache, start, slot = attn.cos, attn.sin, attn.cache, attn.start, attn.slot
        b, s, _ = x.shape
        h = rms_norm(x, self.input_norm, self.eps)
        if self.tp.megatron:
            qkv = self.qkv_linear(h, weight=self.qkv)[0]  # copies into the TP region itself
            if self.qkv_bias is not None:
                qkv = qkv + self.qkv_bias
        else:
            qkv = F.linear(copy_to_tp(h, self.tp), self.qkv, self.qkv_bias)
        q, k, v = qkv.split((self.q, self.kv, self.kv), dim=-1)
        hd = self.head_dim
        q = q.view(b, s, self.heads, hd).transpose(1, 2)
        k = k.view(b, s, self.kv_heads, hd).transpose(1, 2)
        v = v.view(b, s, self.kv_heads, hd).transpose(1, 2)
        if self.q_norm is not None and self.k_norm is not None:  # Qwen3: per head, before RoPE
            q, k = rms_norm(q, self.q_norm, self.eps), rms_norm(k, self.k_norm, self.eps)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        if cache is not None and slot is not None:  # fixed shapes: the whole capacity
            cache.keys[index].index_copy_(2, slot, k)
            cache.values[index].index_copy_(2, slot, v)
            k, v = cache.keys[index], cache.values[index]
        elif cache is not None:
            cache.keys[index][:, :, start : start + s] = k
            cache.values[index][:, :, start : start + s] = v
            k = cache.keys[index][:, :, : start + s]
            v = cache.values[index][:, :, : start + s]
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=attn.mask, enable_gqa=self.heads != self.kv_heads
        )
        out = out.transpose(1, 2).reshape(b, s, self.q)
        return reduce_from_tp(out @ self.o_proj.t(), self.tp)

    def _mlp(self, x: torch.Tensor) -> torch.Tensor:
        assert self.gate_up is not None and self.down_proj is not None
        h = rms_norm(x, self.post_norm, self.eps)
        if self.tp.megatron:
            gu = self.gate_up_linear(h, weight=self.gate_up)[0]
        else:
            gu = copy_to_tp(h, self.tp) @ self.gate_up.t()
        gate, up = gu.split(self.ffn, dim=-1)
        return reduce_from_tp((F.silu(gate) * up) @ self.down_proj.t(), self.tp)


class Transformer(nn.Module):
    """One TP rank's shard of one pipeline stage of a decoder; `value_head` makes it a critic."""

    def __init__(
        self,
        arch: Arch,
        *,
        tp: TPGroup = SINGLE,
        pp: PPGroup = SINGLE_STAGE,
        ep: EPGroup = SINGLE_EP,
        value_head: bool = False,
        num_values: int = 1,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__()
        w = arch.weights
        if w.num_kv_heads % tp.size or w.ffn % tp.size or w.vocab % tp.size:
            raise SpecError(
                f"TP size {tp.size} must divide num_kv_heads {w.num_kv_heads}, "
                f"ffn {w.ffn} and vocab {w.vocab} (each rank holds whole heads and rows)"
            )
        pp.stage_layers(w.num_layers)  # SpecError unless the layers split into its stages
        self.arch, self.tp, self.pp, self.is_critic = arch, tp, pp, value_head
        self.num_values = num_values
        held = stage_weights(w, pp)
        vocab_rows = w.vocab // tp.size
        # The last stage of a tied LM needs the vocabulary matrix for its head: a copy.
        self.tied_copy = w.tied_embeddings and not value_head and pp.is_last and not pp.is_first
        self.embed = (
            nn.Parameter(torch.empty(vocab_rows, w.hidden, dtype=dtype))
            if "embed" in held or self.tied_copy
            else None
        )
        layers = sorted(
            {p.layer for p in w.params() if p.name in held and p.layer in range(w.num_layers)}
        )
        self.layers = nn.ModuleDict({str(i): Layer(arch, tp, dtype, i, ep) for i in layers})
        last = "norm" in held
        self.norm = nn.Parameter(torch.ones(w.hidden, dtype=dtype)) if last else None
        # A critic's head is replicated (one output); an LM head is vocab-parallel.
        self.value_head = (
            nn.Parameter(torch.zeros(num_values, w.hidden, dtype=dtype))
            if value_head and last
            else None
        )
        self.lm_head = (
            nn.Parameter(torch.empty(vocab_rows, w.hidden, dtype=dtype))
            if not value_head and "lm_head" in held
            else None
        )
        self.head_dim = w.head_dim
        self.ep = ep
        self.local_kv_heads = w.num_kv_heads // tp.size
        self.dtype = dtype
        if tp.megatron and not value_head and last:
            self.head_linear = column_linear(tp, w.hidden, w.vocab, gather=False)

    # --- weights ------------------------------------------------------------
    def shard_names(self) -> list[str]:
        return [name for name, _ in self.named_parameters()]

    @torch.no_grad()
    def load_shards(self, shards: dict[str, torch.Tensor], *, strict: bool = True) -> None:
        """Copy this rank's shards in; shapes must match (`strict`: every weight given)."""
        params = dict(self.named_parameters())
        unknown = sorted(set(shards) - set(params))
        missing = sorted(set(params) - set(shards))
        if unknown or (strict and missing):
            raise SpecError(
                f"weights do not match the model: unknown {unknown[:5]}, missing {missing[:5]}"
            )
        for name, tensor in shards.items():
            if tuple(tensor.shape) != tuple(params[name].shape):
                raise SpecError(
                    f"weight {name}: shape {tuple(tensor.shape)} given, "
                    f"{tuple(params[name].shape)} expected for TP {self.tp.size}"
                )
            params[name].copy_(tensor)

    def load_full(self, full: dict[str, torch.Tensor]) -> None:
        """This rank's TP slice of the full weights this stage holds (every one must be there)."""
        names = set(self.shard_names())
        device = next(self.parameters()).device
        shards = shard_full({k: v for k, v in full.items() if k in names}, self.arch, self.tp)
        self.load_shards({k: v.to(device) for k, v in shards.items()})

    # --- forward ------------------------------------------------------------
    def forward(
        self,
        ids: torch.Tensor,
        mask: torch.Tensor,
        *,
        cache: KVCache | None = None,
        head_from: int = 0,
        hidden: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Logits (batch, seq, vocab) or values (batch, seq) for `ids` (batch, seq); see `_forward`.

        fp32 weights with a lower compute dtype (a trained model's master weights) run
        under autocast; weights already in the compute dtype run as they are.
        """
        compute = self.arch.compute_dtype
        with torch.autocast(ids.device.type, dtype=compute, enabled=compute != self.dtype):
            out = self._forward(ids, mask, cache=cache, head_from=head_from, hidden=hidden)
        # Values and logits leave in fp32 (losses, advantages and log-softmax are fp32).
        return out if out.dtype == torch.float32 or not self.pp.is_last else out.float()

    def _forward(
        self,
        ids: torch.Tensor,
        mask: torch.Tensor,
        *,
        cache: KVCache | None,
        head_from: int,
        hidden: torch.Tensor | None,
    ) -> torch.Tensor:
        """Logits (batch, seq, vocab) or values (batch, seq) for `ids` (batch, seq).

        With `cache`, `ids` continue the cached sequence: `mask` covers the new
        tokens only and the cache grows by seq. `head_from` skips the head on the
        first positions (outputs start there). A pipeline stage after the first
        takes the previous stage's `hidden` (batch, seq, hidden); a stage before
        the last returns its own hidden states (all positions).
        """
        s = ids.shape[1]
        if cache is None:
            key_mask = mask
            positions = (mask.long().cumsum(-1) - 1).clamp(min=0)
            start = 0
        else:
            start = cache.length
            cache.mask[:, start : start + s] = mask
            key_mask = cache.mask[:, : start + s]
            positions = (key_mask.long().cumsum(-1) - 1).clamp(min=0)[:, start:]
        # Query i (absolute start+i) sees real keys j <= start+i, and always itself.
        q_idx = torch.arange(start, start + s, device=ids.device)[:, None]
        k_idx = torch.arange(start + s, device=ids.device)[None, :]
        causal = k_idx <= q_idx
        attn_mask = (causal[None] & key_mask[:, None, :]) | (k_idx == q_idx)[None]
        attn_mask = attn_mask[:, None]  # (b, 1, s, start+s)
        cos, sin = rope(positions, self.head_dim, self.arch.rope_theta, self.arch.compute_dtype)
        attn = Attention(cos=cos, sin=sin, mask=attn_mask, cache=cache, start=start)

        if self.pp.is_first:
            x = self._embed(ids)
        else:
            assert hidden is not None, "a pipeline stage after the first needs hidden states"
            x = hidden
        for i, layer in enumerate(self.layers.values()):
            x = layer(x, attn, i, token_mask=mask)
        if cache is not None:
            cache.length = start + s
        if not self.pp.is_last:
            return x
        return self._head(x[:, head_from:])

    def aux_loss(self) -> torch.Tensor | None:
        """The load-balancing loss of the last forward of this stage's MoE layers; None if dense."""
        records: list[RoutingRecord] = []
        for layer in self.layers.values():
            assert isinstance(layer, Layer)
            if layer.moe is not None and layer.moe.record is not None:
                records.append(layer.moe.record)
        if not records:
            return None
        return load_balancing_loss(records, self.arch.weights.num_experts)

    def decode_static(
        self, token: torch.Tensor, live: torch.Tensor, cache: KVCache, slot: torch.Tensor
    ) -> torch.Tensor:
        """One decode step with fixed shapes: logits (batch, vocab) for `token` (batch, 1).

        The token goes to cache slot `slot` (a one-element tensor on the device, read
        when the step runs, so that a captured CUDA graph replays at the next slot once
        it is advanced) and attention runs over the whole capacity, masked to the real
        keys so far and the token itself: the result of `forward(token, live,
        cache=cache)` with no shape that changes from step to step. `live` (batch, 1)
        marks real tokens. Whole-model (one pipeline stage) language models only.
        """
        assert self.pp.is_first and self.pp.is_last and self.value_head is None
        cache.mask.index_copy_(1, slot, live)
        k_idx = torch.arange(cache.mask.shape[1], device=token.device)[None, :]
        attn_mask = (cache.mask | (k_idx == slot))[:, None, None, :]  # (b, 1, 1, capacity)
        positions = (cache.mask.long().cumsum(-1) - 1).clamp(min=0).index_select(1, slot)
        cos, sin = rope(positions, self.head_dim, self.arch.rope_theta, self.arch.compute_dtype)
        attn = Attention(cos=cos, sin=sin, mask=attn_mask, cache=cache, slot=slot)
        x = self._embed(token)
        for i, layer in enumerate(self.layers.values()):
            x = layer(x, attn, i)
        return self._head(x)[:, -1]

    def _head(self, x: torch.Tensor) -> torch.Tensor:
        """The last stage's final norm and head on hidden states (batch, seq, hidden)."""
        assert self.norm is not None
        x = rms_norm(x, self.norm, self.arch.norm_eps)
        if self.value_head is not None:
            out = x @ self.value_head.t()  # (..., num_values): one value per head
            return out.squeeze(-1) if self.num_values == 1 else out
        head = self.lm_head if self.lm_head is not None else self.embed
        assert head is not None
        if self.tp.megatron:
            return gather_from_tp(self.head_linear(x, weight=head)[0], self.tp)
        return gather_from_tp(copy_to_tp(x, self.tp) @ head.t(), self.tp)

    def _embed(self, ids: torch.Tensor) -> torch.Tensor:
        assert self.embed is not None
        if self.tp.size == 1:
            return F.embedding(ids, self.embed)
        rows = self.embed.shape[0]
        lo = self.tp.rank * rows
        inside = (ids >= lo) & (ids < lo + rows)
        local = F.embedding((ids - lo).clamp(0, rows - 1), self.embed) * inside[..., None]
        return reduce_from_tp(local, self.tp)


def stage_weights(weights: TinyLlama, pp: PPGroup) -> set[str]:
    """Names of the plan's weights on stage `pp.rank` of `pp.size` (ParamSpec.stage's rule)."""
    stages = pp.stage_layers(weights.num_layers)
    return {p.name for p in weights.params() if p.stage(stages) == pp.rank}


# --- full weights and their shards ----------------------------------------------


def random_full(
    arch: Arch,
    seed: int,
    *,
    critic: bool = False,
    num_values: int = 1,
    head_std: float = 0.0,
) -> dict[str, torch.Tensor]:
    """A seeded random model in canonical names: N(0, 0.02) weights, unit norms, zero biases.

    A critic gets a `value_head` of `num_values` rows in place of lm_head: zero, so its
    first values are 0, or N(0, head_std) for a random-init reward or cost model whose
    scores should vary (drawn after every other weight, which stay the same).
    """
    gen = torch.Generator().manual_seed(seed)
    out: dict[str, torch.Tensor] = {}
    for p in arch.weights.params():
        if p.name == "lm_head" and critic:
            continue
        if p.name.endswith("norm"):
            out[p.name] = torch.ones(p.shape)
        elif p.name.endswith("bias"):
            out[p.name] = torch.zeros(p.shape)
        else:
            out[p.name] = torch.randn(p.shape, generator=gen) * 0.02
    if critic:
        shape = (num_values, arch.weights.hidden)
        head = torch.randn(shape, generator=gen) * head_std if head_std else torch.zeros(shape)
        out["value_head"] = head
    return out


def random_model(spec: ModelSpec, seed: int = 0) -> Transformer:
    """The whole (unsharded) `spec` with `random_full` weights of `seed`: what the
    profilers time the engine's own code on."""
    model = Transformer(Arch.of(spec))
    model.load_shards(random_full(model.arch, seed=seed))
    return model


def shard_full(full: dict[str, torch.Tensor], arch: Arch, tp: TPGroup) -> dict[str, torch.Tensor]:
    """This TP rank's shards of full weights (names outside the plan, e.g. value_head, whole)."""
    specs = {p.name: p for p in arch.weights.params()}
    out = {}
    for name, tensor in full.items():
        p = specs.get(name)
        if p is None or p.sharding is Sharding.REPLICATED:
            out[name] = tensor.clone()
            continue
        ranges = split_ranges(p, tp.size, tp.rank)
        out[name] = torch.cat([tensor.narrow(p.dim, r.start, r.length) for r in ranges], p.dim)
    return out
