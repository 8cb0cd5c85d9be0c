"""vLLM behind the rollout interface of `placeflow.executor.engines.sampler`.

`VLLMSampler.generate(prompts, params, seed)` takes and returns what
`Sampler.generate` does: token ids in (`TokensPrompt`), token ids and one
logprob per sampled token out (`SamplingParams(logprobs=0)` asks vLLM for the
sampled token's logprob only). No text anywhere: the engine starts with
`skip_tokenizer_init` and requests set `detokenize=False`.

New weights go by Hugging Face name (`to_hf`), full size, in buckets: each
bucket is written as a safetensors file to shared memory (/dev/shm) and its
path handed through `LLM.collective_rpc` to a method that `WeightReceiver`
adds to every vLLM worker (vLLM's `worker_extension_cls`, the route of vLLM's
RLHF examples, TRL and OpenRLHF); each worker's `model.load_weights` slices
its own TP shard. Only the path crosses vLLM's RPC because its engine-core
process decodes untyped RPC arguments as plain msgpack, which does not rebuild
tensors (vLLM's examples send metadata by RPC and tensors over NCCL or CUDA
IPC instead). A file works for any process layout on one node and on CPU in
tests.

Where it departs from `Sampler`:

- Randomness: vLLM draws with its own kernels and per-request generators, so
  a seed gives other tokens than `Sampler` does. Each prompt gets its own seed
  derived from `seed` (one seed for all would make a GRPO group's repeated
  prompts sample identically).
- Logprobs: the engine runs with `logprobs_mode="processed_logprobs"`, i.e.
  log softmax(logits / temperature) (untempered when greedy), as `Sampler`
  reports them, but taken after top-p masking: with `top_p < 1` they are
  renormalised over the nucleus. Recompute them with the trainer then (PPO's
  old logprobs are recomputed anyway).
- Stopping: only `params.stop_ids` end a response (`ignore_eos=True` keeps vLLM
  from adding the EOS ids of the checkpoint's generation config).

vLLM needs CUDA and is an optional dependency (`pip install 'placeflow[vllm]'`);
it is imported when a `VLLMSampler` is built, never by importing this module.
"""

from __future__ import annotations

import importlib
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import torch

from placeflow.errors import SpecError
from placeflow.executor.engines.hf import to_hf
from placeflow.executor.engines.sampler import Completion, SamplingParams, check_prompts
from placeflow.models import ModelSpec
from placeflow.reshard_plan import TinyLlama

_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


class EngineUnavailableError(SpecError):
    """The rollout engine a plan names is not installed here; the message says how to get it."""


def import_vllm() -> ModuleType:
    try:
        return importlib.import_module("vllm")
    except ImportError as exc:
        raise EngineUnavailableError(
            f"the vLLM rollout engine needs the vllm package ({exc}); install it with "
            "`pip install 'placeflow[vllm]'` on a Linux machine with an NVIDIA GPU and CUDA "
            "(vLLM has no CPU wheels), or use placeflow's own sampler"
        ) from None


@dataclass(frozen=True, kw_only=True)
class VLLMConfig:
    """How the engine is started; `dummy_weights` skips reading the checkpoint's weights."""

    tensor_parallel_size: int = 1
    dtype: str = "bfloat16"
    gpu_memory_utilization: float = 0.5  # of the whole GPU: leave room for a colocated trainer
    max_model_len: int | None = None  # None: the checkpoint's max_position_embeddings
    enforce_eager: bool = False  # True skips CUDA-graph capture (faster start, slower decode)
    dummy_weights: bool = False  # random weights until the first load_weights
    bucket_bytes: int = 256 << 20  # largest push per collective_rpc call (sizes as given)

    def __post_init__(self) -> None:
        if self.tensor_parallel_size < 1:
            raise SpecError(f"tensor_parallel_size must be >= 1, got {self.tensor_parallel_size}")
        if self.dtype not in _DTYPES:
            raise SpecError(f"dtype {self.dtype!r} not one of {', '.join(_DTYPES)}")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise SpecError(
                f"gpu_memory_utilization is a fraction in (0, 1], got {self.gpu_memory_utilization}"
            )
        if self.bucket_bytes < 1:
            raise SpecError(f"bucket_bytes must be >= 1, got {self.bucket_bytes}")


class WeightReceiver:
    """Mixed into each vLLM worker (`worker_extension_cls`); vLLM sets `model_runner`."""

    model_runner: Any

    def placeflow_load_weights(self, path: str) -> int:
        """Full-size tensors by Hugging Face name from a safetensors file; each worker slices
        its own TP shard. Returns how many tensors it loaded."""
        from safetensors.torch import load_file  # a vLLM dependency

        weights = load_file(path)
        self.model_runner.model.load_weights(weights=list(weights.items()))
        return len(weights)


# The vLLM worker method `load_weights` calls, named from the method itself.
LOAD_WEIGHTS = WeightReceiver.placeflow_load_weights.__name__


class VLLMSampler:
    """vLLM as a rollout engine, with `Sampler`'s `generate` (see the module docstring).

    Ordering: `load_weights` must complete before the `generate` that should
    see the new weights. Both block until every vLLM worker has answered, so
    calls made one after the other from one thread are ordered; calls from
    several threads at once are not supported.
    """

    def __init__(
        self,
        checkpoint: str | Path,
        spec: ModelSpec,
        config: VLLMConfig | None = None,
        *,
        seed: int = 0,
    ) -> None:
        config = config or VLLMConfig()
        path = Path(checkpoint)
        if not (path / "config.json").is_file():
            raise SpecError(
                f"{path}: vLLM needs a checkpoint directory with config.json "
                "(as transformers' save_pretrained writes)"
            )
        self._vllm = import_vllm()
        self.spec, self.config = spec, config
        self._weights = TinyLlama.from_model_spec(spec)
        self._llm = self._vllm.LLM(
            model=str(path),
            skip_tokenizer_init=True,
            tensor_parallel_size=config.tensor_parallel_size,
            dtype=config.dtype,
            gpu_memory_utilization=config.gpu_memory_utilization,
            max_model_len=config.max_model_len,
            enforce_eager=config.enforce_eager,
            load_format="dummy" if config.dummy_weights else "auto",
            logprobs_mode="processed_logprobs",
            worker_extension_cls=f"{WeightReceiver.__module__}.{WeightReceiver.__qualname__}",
            seed=seed,
        )

    def generate(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams, seed: int
    ) -> list[Completion]:
        if not prompts:
            return []
        check_prompts(prompts)
        requests = [self._vllm.TokensPrompt(prompt_token_ids=[int(t) for t in p]) for p in prompts]
        per_request = [
            vllm_sampling_params(self._vllm, params, s) for s in request_seeds(seed, len(prompts))
        ]
        outputs = self._llm.generate(requests, per_request, use_tqdm=False)
        return [completion_of(out.outputs[0]) for out in outputs]

    @torch.no_grad()
    def load_weights(self, params: Mapping[str, torch.Tensor]) -> None:
        """Push full (unsharded) canonical weights, every one of the model's, to all workers."""
        expected = {p.name for p in self._weights.params()}
        if params.keys() != expected:
            missing, unknown = sorted(expected - params.keys()), sorted(params.keys() - expected)
            raise SpecError(
                "load_weights takes every weight of the model: "
                f"missing {missing[:5]}, unknown {unknown[:5]}"
            )
        from safetensors.torch import save_file  # a vLLM dependency

        dtype = _DTYPES[self.config.dtype]
        named = to_hf(dict(params), self._weights)  # views: converted one bucket at a time
        with tempfile.TemporaryDirectory(prefix="placeflow-weights-", dir=_shared_memory()) as tmp:
            for i, bucket in enumerate(buckets(named, self.config.bucket_bytes)):
                path = Path(tmp) / f"bucket{i}.safetensors"
                # copy=True: safetensors wants tensors that own their memory, not views.
                save_file({n: t.detach().to("cpu", dtype, copy=True) for n, t in bucket}, str(path))
                # By name (vLLM's RPC sends a callable only by pickle, which its engine core
                # refuses unless VLLM_ALLOW_INSECURE_SERIALIZATION is set), taken from the method.
                self._llm.collective_rpc(LOAD_WEIGHTS, args=(str(path),))


def _shared_memory() -> str | None:
    """/dev/shm where there is one (files in RAM), else the default temporary folder."""
    return "/dev/shm" if Path("/dev/shm").is_dir() else None


def vllm_sampling_params(vllm: ModuleType, params: SamplingParams, seed: int) -> Any:
    """One request's vLLM SamplingParams: token ids only, the sampled token's logprob."""
    return vllm.SamplingParams(
        n=1,
        temperature=params.temperature,
        top_p=params.top_p,
        max_tokens=params.max_tokens,
        stop_token_ids=[] if params.ignore_stop else list(params.stop_ids),
        ignore_eos=True,
        logprobs=0,
        detokenize=False,
        seed=seed,
    )


def request_seeds(seed: int, num_requests: int) -> list[int]:
    """A seed per request, mixed from `seed` (nearby call seeds give unrelated request seeds)."""
    words = np.random.SeedSequence(seed).generate_state(num_requests, dtype=np.uint64)
    return [int(w) >> 1 for w in words]  # 63 bits: a non-negative int64


def completion_of(output: Any) -> Completion:
    """A vLLM CompletionOutput as a Completion (`logprobs`: one {token id: Logprob} per token)."""
    ids = [int(t) for t in output.token_ids]
    return Completion(ids, [float(output.logprobs[i][t].logprob) for i, t in enumerate(ids)])


def buckets(
    named: Mapping[str, torch.Tensor], max_bytes: int
) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Consecutive groups of at most `max_bytes` (a larger tensor goes alone), in order."""
    group: list[tuple[str, torch.Tensor]] = []
    size = 0
    for name, tensor in named.items():
        num_bytes = tensor.numel() * tensor.element_size()
        if group and size + num_bytes > max_bytes:
            yield group
            group, size = [], 0
        group.append((name, tensor))
        size += num_bytes
    if group:
        yield group
