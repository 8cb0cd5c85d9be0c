"""Device propagation without a GPU: what would break on the first step on CUDA breaks here.

On a GPU, a tensor an engine or a Batch creates without naming a device lands
on the CPU and meets the batch's CUDA tensors in one op ("Expected all tensors
to be on the same device"). Here the engines run on the CPU while the default
device is `meta`: a tensor made without the device of the data it meets is a
meta tensor, and `NoMixedDevices` fails the op that mixes it with real ones.
The oracle for the results is the same call without the trap.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from placeflow.catalogue import get_model
from placeflow.executor.batch import Batch
from placeflow.executor.engines.roles import (
    RESPONSE_MASK,
    ActorEngine,
    CriticEngine,
    EngineSetup,
    RoleGroups,
    ScoringEngine,
    UpdateConfig,
    WeightSource,
    _micro_batches,
    completions_batch,
)
from placeflow.executor.engines.sampler import Sampler, SamplingParams
from placeflow.executor.engines.tp import SINGLE
from placeflow.executor.engines.trainer import OptimConfig
from placeflow.executor.engines.transformer import Arch, Transformer, random_full
from placeflow.executor.worker import HOST, Worker, WorkerSpec
from placeflow.hardware import DeviceKind
from placeflow.workload import Role

CPU = torch.device("cpu")
ARCH = Arch.of(get_model("tiny-llama"))
PROMPTS = [[5, 6, 7], [9], [1, 2, 3, 4, 5], [8, 8]]


class NoMixedDevices(TorchDispatchMode):
    """Fails any op whose tensor inputs (0-dim ones aside, as CUDA allows) sit on two devices."""

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        leaves = pytree.tree_leaves((args, kwargs))
        devices = {t.device for t in leaves if isinstance(t, torch.Tensor) and t.dim() > 0}
        if len(devices) > 1:
            raise AssertionError(f"{func} mixes tensors on {sorted(map(str, devices))}")
        return func(*args, **kwargs)


def trapped(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """`fn` with every device-less tensor made on `meta` and mixed-device ops failing."""
    with torch.device("meta"), NoMixedDevices():
        return fn(*args, **kwargs)


def test_the_trap_catches_a_tensor_made_without_the_data_device() -> None:
    values = torch.randn(3, 4)
    end = torch.tensor([0, 1, 2])
    with pytest.raises(AssertionError, match="mixes tensors"):
        trapped(lambda: values[torch.arange(3), end])  # the step-0 bug's shape
    assert trapped(lambda: values[torch.arange(3, device=values.device), end]).shape == (3,)


def _batch() -> Batch:
    model = Transformer(ARCH).eval()
    model.load_shards(random_full(ARCH, seed=1))
    outs = Sampler(model, pad_id=0).generate(PROMPTS, SamplingParams(max_tokens=5), seed=2)
    b = completions_batch(PROMPTS, outs, pad_id=0)
    adv = torch.linspace(-1, 1, len(PROMPTS))[:, None].expand_as(b.tensors[RESPONSE_MASK])
    return Batch(tensors={**b.tensors, "advantages": adv.contiguous()})


def _setup(**kw: Any) -> EngineSetup:
    kw.setdefault("weights", WeightSource(seed=0))
    return EngineSetup(arch=ARCH, micro_batch=3, **kw)


def test_batch_ops_make_their_tensors_on_the_data_device() -> None:
    b = _batch()
    for fn in (
        lambda: b.select([2, 0]),
        lambda: b.chunk(3),
        lambda: _micro_batches(b, 3, count=6),  # padding micro-batches too
        lambda: Batch.from_sequences({"x": [torch.ones(3), torch.ones(1)]}),
    ):
        trapped(fn)
    assert trapped(Batch.from_sequences, {"x": [torch.ones(2)]}).tensors["attention_mask"].is_cpu


def test_scoring_engine_logprobs_and_scores_stay_on_the_data_device() -> None:
    b = _batch()
    ref = ScoringEngine(_setup(), RoleGroups(tp=SINGLE), CPU)
    reward = ScoringEngine(
        _setup(critic=True, weights=WeightSource(seed=0, value_head_std=1.0)),
        RoleGroups(tp=SINGLE),
        CPU,
    )
    for engine, call in ((ref, lambda e: e.logprobs(b, 1.0)), (reward, lambda e: e.scores(b))):
        expected = call(engine)
        got = trapped(call, engine)
        for k, t in expected.tensors.items():
            assert torch.equal(got.tensors[k], t)


def test_actor_generate_logprobs_and_update_stay_on_the_data_device() -> None:
    b = _batch()
    cfg = UpdateConfig()

    def actor() -> ActorEngine:
        return ActorEngine(
            _setup(optim=OptimConfig(lr=1e-3)),
            RoleGroups(tp=SINGLE),
            CPU,
            gen=None,
            rank=0,
            reshard_plan=None,
        )

    plain, checked = actor(), actor()
    assert torch.equal(
        trapped(checked.logprobs, b, 1.0).tensors["logprobs"],
        plain.logprobs(b, 1.0).tensors["logprobs"],
    )
    # The optimizer's own step counter is made on the CPU on purpose (torch's AdamW does so
    # for CUDA parameters too), so the trap covers the forward, loss and backward here.
    checked.trainer.step = plain.trainer.step  # type: ignore[method-assign]
    metrics = trapped(checked._train_mini_batch, b, _loss(checked, cfg), {})
    assert metrics == plain._train_mini_batch(b, _loss(plain, cfg), {})
    for p, q in zip(checked.model.parameters(), plain.model.parameters(), strict=True):
        assert p.grad is not None and torch.equal(p.grad, q.grad)


def _loss(engine: ActorEngine, cfg: UpdateConfig) -> Any:
    """The actor's loss function, as `update` builds it (captured from one call)."""
    captured: list[Any] = []
    original = engine._train
    engine._train = lambda batch, c, loss_fn: captured.append(loss_fn) or {}  # type: ignore[method-assign]
    engine.update(Batch(tensors={}), cfg)
    engine._train = original  # type: ignore[method-assign]
    return captured[0]


def test_critic_values_stay_on_the_data_device() -> None:
    b = _batch()
    critic = CriticEngine(_setup(critic=True, optim=OptimConfig()), RoleGroups(tp=SINGLE), CPU)
    expected = critic.values(b).tensors["values"]
    assert torch.equal(trapped(critic.values, b).tensors["values"], expected)


def test_sampler_makes_its_tensors_on_the_model_device() -> None:
    model = Transformer(ARCH).eval()
    model.load_shards(random_full(ARCH, seed=1))
    params = SamplingParams(max_tokens=4, top_p=0.9, stop_ids=(3,))
    expected = Sampler(model, pad_id=0).generate(PROMPTS, params, seed=7)
    assert trapped(Sampler(model, pad_id=0).generate, PROMPTS, params, seed=7) == expected


class _Recorder:
    """Stands in for a scoring engine: records the devices its batches arrive on."""

    def __init__(self) -> None:
        self.devices: set[torch.device] = set()

    def logprobs(self, batch: Batch, temperature: float) -> Batch:
        self.devices |= {t.device for t in batch.tensors.values()}
        return Batch(tensors={"logprobs": torch.zeros(len(batch))})


def test_worker_moves_each_batch_onto_its_device_and_results_to_the_host() -> None:
    threads = torch.get_num_threads()
    worker = Worker(
        WorkerSpec(
            set_index=0,
            device_index=0,
            num_devices=1,
            roles=(Role.REF,),
            device_kind=DeviceKind.CPU,
        )
    )
    torch.set_num_threads(threads)
    worker.device = torch.device("meta")  # a device other than the one batches arrive on
    recorder = _Recorder()
    worker.engines[Role.REF] = recorder  # type: ignore[assignment]
    out = worker.logprobs(Role.REF, _batch(), 1.0)
    assert recorder.devices == {torch.device("meta")}
    assert out.tensors["logprobs"].device == HOST
