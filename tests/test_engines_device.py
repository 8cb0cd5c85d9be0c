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
from placeflow.fields import Field
from placeflow.hardware import DeviceKind
from placeflow.plan import MicroBatching
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
    adv = torch.linspace(-1, 1, len(PROMPTS))[:, None].expand_as(b.tensors[Field.RESPONSE_MASK])
    return Batch(tensors={**b.tensors, "advantages": adv.contiguous()})


def _setup(**kw: Any) -> EngineSetup:
    kw.setdefault("weights", WeightSource(seed=0))
    return EngineSetup(arch=ARCH, micro_batch=3, **kw)


def test_batch_ops_make_their_tensors_on_the_data_device() -> None:
    b = _batch()
    for fn in (
        lambda: b.select([2, 0]),
        lambda: b.chunk(3),
        lambda: _micro_batches(b, MicroBatching(3), count=6),  # padding micro-batches too
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


# --- mixed precision -------------------------------------------------------------------

BF16_ARCH = Arch(weights=ARCH.weights, compute_dtype=torch.bfloat16)


class _MatmulDtypes(TorchDispatchMode):
    """The operand dtypes of every matmul and attention op run under it."""

    OPS = ("mm", "bmm", "addmm", "_scaled_dot_product", "linear")

    def __init__(self) -> None:
        super().__init__()
        self.dtypes: set[torch.dtype] = set()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if any(name in str(func) for name in self.OPS):
            # The operands (attention's backward also takes its fp32 log-sum-exp, by design).
            self.dtypes |= {a.dtype for a in args[:2] if isinstance(a, torch.Tensor)}
        return func(*args, **(kwargs or {}))


def test_arch_takes_the_workload_dtype_and_refuses_fp16() -> None:
    import dataclasses

    from placeflow.errors import SpecError
    from placeflow.models import DType

    spec = get_model("tiny-llama")
    assert Arch.of(spec).compute_dtype == torch.float32  # the test models are fp32
    assert Arch.of(dataclasses.replace(spec, dtype=DType.BF16)).compute_dtype == torch.bfloat16
    with pytest.raises(SpecError, match="fp16 needs loss scaling"):
        Arch.of(dataclasses.replace(spec, dtype=DType.FP16))


def test_bf16_training_keeps_fp32_masters_and_computes_in_bf16() -> None:
    b = _batch()
    setup = EngineSetup(
        arch=BF16_ARCH, weights=WeightSource(seed=0), micro_batch=4, optim=OptimConfig(lr=1e-3)
    )
    actor = ActorEngine(setup, RoleGroups(tp=SINGLE), CPU, gen=None, rank=0, reshard_plan=None)
    seen = _MatmulDtypes()
    with seen:
        actor.update(b, UpdateConfig())
    assert seen.dtypes == {torch.bfloat16}  # every matmul and attention, forward and backward
    assert {p.dtype for p in actor.model.parameters()} == {torch.float32}
    state = actor.trainer.optimizer.state
    assert {t.dtype for st in state.values() for k, t in st.items() if k != "step"} == {
        torch.float32
    }
    # The oracle: the same batch's logprobs in fp32 with the same weights, to bf16 accuracy.
    fp32 = Transformer(ARCH).eval()
    fp32.load_shards(dict(actor.model.named_parameters()))
    mixed = actor.logprobs(b, 1.0).tensors["logprobs"]
    with torch.no_grad():
        from placeflow.executor.engines.roles import response_logp, response_outputs

        exact = response_logp(response_outputs(fp32, b), b, 1.0)[0]
    m = b.tensors[Field.RESPONSE_MASK]
    assert mixed.dtype == torch.float32
    assert 0 < (mixed - exact)[m].abs().max() < 0.1


def test_bf16_frozen_and_rollout_models_hold_bf16_weights() -> None:
    from placeflow.executor.engines.generator import GeneratorEngine

    setup = EngineSetup(arch=BF16_ARCH, weights=WeightSource(seed=0), micro_batch=4)
    ref = ScoringEngine(setup, RoleGroups(tp=SINGLE), CPU)
    gen = GeneratorEngine(setup, SINGLE, CPU)
    for model in (ref.model, gen.sampler.model):
        assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    outs = gen.generate(PROMPTS, SamplingParams(max_tokens=4), seed=1)
    assert outs.tensors["rollout_logprobs"].dtype == torch.float32
    assert ref.logprobs(outs, 1.0).tensors["logprobs"].dtype == torch.float32


def test_fused_adamw_only_where_the_device_has_it() -> None:
    actor = ActorEngine(
        _setup(optim=OptimConfig()), RoleGroups(tp=SINGLE), CPU, gen=None, rank=0, reshard_plan=None
    )
    assert actor.trainer.optimizer.defaults["fused"] is False  # CPU: torch's default loop


def test_colocated_reshard_without_a_gather_hands_over_views() -> None:
    """tg = t (dg = 1, one GPU): the generation shards are the training shards, not copies."""
    from placeflow.executor.reshard import MemoryMeter, reshard_colocated
    from placeflow.layout import GenLayout, TrainLayout
    from placeflow.reshard_plan import plan_reshard

    model = Transformer(ARCH)
    model.load_shards(random_full(ARCH, seed=4))
    shards = {k: v.detach() for k, v in model.named_parameters()}
    plan = plan_reshard(ARCH.weights, GenLayout(train=TrainLayout()))
    meter = MemoryMeter()
    weights, received = reshard_colocated(plan, 0, shards, None, meter)
    assert received == 0 and meter.peak_bytes == 0
    assert weights.keys() == shards.keys()
    assert all(weights[k].data_ptr() == shards[k].data_ptr() for k in shards)
    rollout = Transformer(BF16_ARCH, dtype=torch.bfloat16)
    rollout.load_shards(weights)  # the one copy: fp32 masters cast into bf16 weights
    assert all(p.dtype == torch.bfloat16 for p in rollout.parameters())


# --- static KV cache (the CUDA-graph decode's eager twin) -----------------------------


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_static_decode_equals_the_growing_cache(temperature: float) -> None:
    """The fixed-shape step a CUDA graph replays gives the eager decode's tokens and logprobs."""
    from placeflow.executor.engines.sampler import DecodeMode, default_decode

    model = Transformer(ARCH).eval()
    model.load_shards(random_full(ARCH, seed=5))
    params = SamplingParams(temperature=temperature, max_tokens=7, stop_ids=(3,))
    dynamic = Sampler(model, pad_id=0, decode=DecodeMode.DYNAMIC).generate(PROMPTS, params, 9)
    static = Sampler(model, pad_id=0, decode=DecodeMode.STATIC).generate(PROMPTS, params, 9)
    assert [c.token_ids for c in static] == [c.token_ids for c in dynamic]
    for s, d in zip(static, dynamic, strict=True):
        assert torch.allclose(torch.tensor(s.logprobs), torch.tensor(d.logprobs), atol=1e-5)
    assert default_decode(model) is DecodeMode.DYNAMIC  # graphs only on CUDA
    assert (
        trapped(Sampler(model, pad_id=0, decode=DecodeMode.STATIC).generate, PROMPTS, params, 9)
        == static
    )  # and it makes its tensors on the model's device


def test_eager_decode_drops_finished_rows_and_draws_the_same_tokens() -> None:
    """The eager decode runs each step on the sequences still going (finished rows leave
    its batch and cache); the fixed-shape decode keeps them masked. Same tokens either way."""
    from placeflow.executor.engines.sampler import DecodeMode

    model = Transformer(ARCH).eval()
    model.load_shards(random_full(ARCH, seed=5))
    # A third of the vocabulary stops: rows end at different steps.
    params = SamplingParams(temperature=1.0, max_tokens=12, stop_ids=tuple(range(0, 256, 3)))
    prompts = PROMPTS * 4
    batches: list[int] = []
    hook = model.register_forward_pre_hook(lambda _m, args: batches.append(args[0].shape[0]))
    dynamic = Sampler(model, pad_id=0, decode=DecodeMode.DYNAMIC).generate(prompts, params, 7)
    hook.remove()
    static = Sampler(model, pad_id=0, decode=DecodeMode.STATIC).generate(prompts, params, 7)
    assert [c.token_ids for c in dynamic] == [c.token_ids for c in static]
    for d, s in zip(dynamic, static, strict=True):
        assert torch.allclose(torch.tensor(d.logprobs), torch.tensor(s.logprobs), atol=1e-5)
    lengths = [len(c.token_ids) for c in dynamic]
    assert len(set(lengths)) > 2  # the case tests something: rows stop at several steps
    # Oracle: the prefill holds every row; the decode step after token k holds the rows
    # that have not stopped by then (their length is over k), up to the longest.
    want = [len(prompts)] + [sum(n > k for n in lengths) for k in range(1, max(lengths))]
    assert batches == want


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")
def test_cuda_graph_decode_equals_eager_on_cuda() -> None:
    from placeflow.executor.engines.sampler import DecodeMode

    model = Transformer(ARCH).to("cuda").eval()
    model.load_shards({k: v.cuda() for k, v in random_full(ARCH, seed=5).items()})
    params = SamplingParams(temperature=0.0, max_tokens=7)
    eager = Sampler(model, pad_id=0, decode=DecodeMode.DYNAMIC).generate(PROMPTS, params, 9)
    graph = Sampler(model, pad_id=0, decode=DecodeMode.GRAPH).generate(PROMPTS, params, 9)
    assert [c.token_ids for c in graph] == [c.token_ids for c in eager]
