"""Offload and ZeRO as trainers do them: host optimizer step, ZeRO-3 for frozen roles,
the device memory reserve, the KV budget (gpu_memory_utilization, max_num_seqs), and
the executor keeping the Adam state where the plan says between phases.

Oracles: hand-computed bytes and seconds from the cost model's own primitives; for the
executor, plain AdamW on the device (bit for bit on CPU) and the tensors' storages.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
import torch
from test_engines_device import ARCH, _batch

from placeflow.catalogue import get_model
from placeflow.errors import SpecError
from placeflow.executor.engines.offload import HOST, OffloadMode
from placeflow.executor.engines.roles import (
    ActorEngine,
    EngineSetup,
    RoleGroups,
    UpdateConfig,
    WeightSource,
)
from placeflow.executor.engines.tp import SINGLE
from placeflow.executor.engines.trainer import OptimConfig
from placeflow.hardware import CUDA_RESERVE_BYTES, GIB, HARDWARE
from placeflow.layout import TrainLayout
from placeflow.phases import Phase
from placeflow.plan import OptimizerStep, RoleParallelism, load_plan, plan_to_dict
from placeflow.profiles.registry import fitted_cost_model
from placeflow.profiles.schema import CollectiveKind, Scope
from placeflow.simulator import callcosts, memory
from placeflow.simulator.rolecosts import resident_bytes
from placeflow.simulator.simulate import cost_models_for, simulate
from placeflow.workload import Role

ROOT = Path(__file__).resolve().parents[1]
OPENRLHF = ROOT / "examples/plans/ppo-llama2-13b-openrlhf-a800x8.toml"
CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def h100():
    return fitted_cost_model("h100-sxm")


def _host_step(par: RoleParallelism) -> RoleParallelism:
    return dataclasses.replace(par, offload_optimizer=True, optimizer_step=OptimizerStep.HOST)


# --- plan ---------------------------------------------------------------------------


def test_optimizer_step_is_validated_and_round_trips():
    plan = load_plan(OPENRLHF)
    actor = plan.parallelism[Role.ACTOR]
    assert actor.host_optimizer_step and actor.optimizer_step is OptimizerStep.HOST
    assert plan_to_dict(plan)["parallelism"]["actor"]["optimizer_step"] == "host"
    device = dataclasses.replace(actor, optimizer_step=OptimizerStep.DEVICE)
    assert not device.host_optimizer_step  # offload_optimizer = true alone: the device step
    assert (
        "optimizer_step"
        not in plan_to_dict(
            dataclasses.replace(plan, parallelism={**plan.parallelism, Role.ACTOR: device})
        )["parallelism"]["actor"]
    )
    with pytest.raises(SpecError, match="set offload_optimizer = true"):
        RoleParallelism(train=TrainLayout(), optimizer_step=OptimizerStep.HOST)


def test_unknown_optimizer_step_is_refused(tmp_path):
    text = OPENRLHF.read_text().replace('\noptimizer_step = "host"', '\noptimizer_step = "gpu"', 1)
    bad = tmp_path / "bad.toml"
    bad.write_text(text)
    with pytest.raises(SpecError, match="unknown optimizer_step 'gpu'; known: device, host"):
        load_plan(bad)


# --- memory -------------------------------------------------------------------------


def test_host_step_keeps_weights_and_gradients_only():
    """Llama-2-13B over d = 2 with ZeRO-3: (2 + 2) bytes per parameter / 2 on the device."""
    model = get_model("llama-2-13b")
    n = model.num_params()
    par = _host_step(RoleParallelism(train=TrainLayout(d=2), zero=3))
    assert resident_bytes(model, Role.ACTOR, par) == pytest.approx(n * 4 / 2)
    plain = dataclasses.replace(par, offload_optimizer=False, optimizer_step=OptimizerStep.DEVICE)
    assert resident_bytes(model, Role.ACTOR, plain) == pytest.approx(n * 16 / 2)


def test_frozen_role_with_zero3_shards_its_weights():
    """The issue's case: a 70B reference over 2 GPUs held 128.5 GiB per GPU at any ZeRO stage."""
    model = get_model("llama-2-70b")
    one = RoleParallelism(train=TrainLayout(d=2), zero=1)
    three = dataclasses.replace(one, zero=3)
    full = model.num_params() * 2
    assert resident_bytes(model, Role.REF, one) == full
    assert resident_bytes(model, Role.REF, three) == full / 2
    assert full / 2**30 == pytest.approx(128.5, abs=0.1)


def test_zero3_forward_gathers_each_layer(h100):
    """Forward of a ZeRO-3 role: each micro-batch all-gathers every layer's bytes and the
    root's (FSDP2's units: embedding, final norm and head are one)."""
    model = get_model("llama-2-7b")
    one = RoleParallelism(train=TrainLayout(d=2), zero=1, micro_batch=4)
    three = dataclasses.replace(one, zero=3)
    a = callcosts.forward_cost(h100, model, one, 16, 512, value_head=False, trained=True)
    b = callcosts.forward_cost(h100, model, three, 16, 512, value_head=False, trained=True)
    layer_bytes = model.num_params_per_layer * 2  # bf16, t = 1
    root_bytes = (model.num_params() - model.num_layers * model.num_params_per_layer) * 2
    # llama-2-7b's root: the embedding and the head, 32,000 x 4,096 each, and a norm.
    assert root_bytes == 2 * (2 * 32_000 * 4_096 + 4_096)
    gather = h100.collective_s(CollectiveKind.ALL_GATHER, layer_bytes, 2, Scope.INTRA)
    root = h100.collective_s(CollectiveKind.ALL_GATHER, root_bytes, 2, Scope.INTRA)
    micro = math.ceil(16 / 2 / 4)
    assert b.time_s - a.time_s == pytest.approx(micro * (model.num_layers * gather + root))
    assert b.transient_bytes - a.transient_bytes == pytest.approx(layer_bytes)


def test_zero3_actor_gathers_its_generation_weights(h100):
    """ZeRO-3 keeps M/(t·p·d): generating with tg = t still needs the rest, M − M/d."""
    from placeflow.layout import GenLayout
    from placeflow.simulator.rolecosts import needs_reshard

    model = get_model("qwen2.5-72b")
    m = model.num_bytes()
    gen = GenLayout(train=TrainLayout(d=8), tg=1, pg=1)
    assert memory.colocated_gen_extra_bytes(model, gen, 1) == 0
    assert memory.colocated_gen_extra_bytes(model, gen, 3) == pytest.approx(m - m / 8)
    assert not needs_reshard(gen, 1) and needs_reshard(gen, 3)
    cost = callcosts.reshard_cost(h100, model, gen, Scope.INTRA, train_zero=3)
    # `tp_shards` gathers one tensor at a time: per layer the fused qkv, its bias, o,
    # the fused gate_up, down and two norms; outside them the embedding, the head and
    # the final norm. Every byte of the model once.
    tensors = callcosts.zero3_tensor_bytes(model, gen.train)
    assert sum(n for _, n in tensors) == 7 * model.num_layers + 3
    assert sum(size * n for size, n in tensors) == m
    gathers = sum(
        n * h100.collective_s(CollectiveKind.ALL_GATHER, size, 8, Scope.INTRA)
        for size, n in tensors
    )
    assert cost.time_s == pytest.approx(gathers)
    assert cost.transient_bytes == pytest.approx(m - m / 8)


# --- time ---------------------------------------------------------------------------


def test_host_step_is_priced_from_the_host_profile_and_the_link(h100):
    """opt = d2h(grad partition) + CPU AdamW(partition) + h2d(weights partition), per step."""
    model = get_model("llama-2-7b")
    device = RoleParallelism(train=TrainLayout(d=2), zero=3, micro_batch=4)
    host = _host_step(device)
    args = (h100, model)
    kw = dict(num_samples=64, seq=512, ppo_epochs=1, mini_batches=2, dp_scope=Scope.INTRA)
    d = callcosts.train_cost(*args, device, **kw, value_head=False)
    h = callcosts.train_cost(*args, host, **kw, value_head=False)
    partition = math.ceil(model.num_params() / 2)
    cpu = fitted_cost_model("cpu")
    step = (
        h100.copy_s("d2h", partition * 2)
        + cpu.optimizer_s(partition)
        + h100.copy_s("h2d", partition * 2)
    )
    assert h.detail["optimizer_s"] == pytest.approx(step)
    assert h.detail["optimizer_on_host"] and not d.detail["optimizer_on_host"]
    assert h.time_s - d.time_s == pytest.approx(2 * (step - d.detail["optimizer_s"]))
    assert h.transient_bytes == d.transient_bytes  # no Adam state comes back to the device


def test_a_gpu_cost_model_without_its_host_refuses_the_host_step():
    from placeflow.profiles.costmodel import CostModel, ProfileCoverageError
    from placeflow.profiles.registry import load_profile

    bare = CostModel.fit(load_profile("h100-sxm"))
    with pytest.raises(ProfileCoverageError, match="host optimizer step"):
        bare.host_optimizer_s(1000)


# --- reserve and KV budget ----------------------------------------------------------


def test_reserve_is_booked():
    h100 = HARDWARE["h100-sxm"]
    assert h100.usable_bytes == 80 * GIB - CUDA_RESERVE_BYTES == 77 * GIB
    assert "CUDA context" in h100.reserve_source
    assert HARDWARE["cpu"].usable_bytes == HARDWARE["cpu"].memory_bytes
    plan = load_plan(ROOT / "examples/plans/ppo-7b-colocate-h100x16.toml")
    est = simulate(plan, cost_models_for(plan))
    assert all(s.capacity_bytes == 77 * GIB for s in est.sets)


def test_kv_capacity_is_the_utilised_share_capped_by_max_num_seqs():
    assert memory.kv_capacity_seqs(100.0, 10.0, 0.9, 256) == 9
    assert memory.kv_capacity_seqs(100.0, 10.0, 1.0, 256) == 10
    assert memory.kv_capacity_seqs(100.0, 10.0, 1.0, 4) == 4
    assert memory.kv_capacity_seqs(-5.0, 10.0, 1.0, 4) == 0


def test_simulator_kv_waves_follow_the_workload_fields():
    plan = load_plan(ROOT / "examples/plans/ppo-7b-colocate-h100x16.toml")
    cms = cost_models_for(plan)

    def gen_detail(**kw):
        wl = dataclasses.replace(plan.workload, **kw)
        est = simulate(dataclasses.replace(plan, workload=wl), cms)
        return {p.name: p for p in est.phases}[Phase.GENERATE].detail

    capped = gen_detail(max_num_seqs=8)
    assert capped["kv_capacity_seqs"] == 8
    assert capped["waves"] == math.ceil(capped["seqs_per_replica"] / 8)
    full, half = gen_detail(gpu_memory_utilization=1.0), gen_detail(gpu_memory_utilization=0.5)
    assert full["kv_capacity_seqs"] >= 2 * half["kv_capacity_seqs"] >= full["kv_capacity_seqs"] - 1
    with pytest.raises(SpecError, match="gpu_memory_utilization is a fraction"):
        dataclasses.replace(plan.workload, gpu_memory_utilization=1.5)
    with pytest.raises(SpecError, match="max_num_seqs must be a positive integer"):
        dataclasses.replace(plan.workload, max_num_seqs=0)


# --- the published run ----------------------------------------------------------------


def test_openrlhf_13b_on_8_gpus_is_feasible_only_with_the_host_step():
    plan = load_plan(OPENRLHF)
    cms = cost_models_for(plan)
    est = simulate(plan, cms)
    assert est.feasible, est.infeasible_reasons
    assert plan.num_gpus == 8
    device = {
        r: dataclasses.replace(p, optimizer_step=OptimizerStep.DEVICE)
        for r, p in plan.parallelism.items()
    }
    est_device = simulate(dataclasses.replace(plan, parallelism=device), cms)
    assert not est_device.feasible
    assert any("actor_update" in r for r in est_device.infeasible_reasons)


def test_openrlhf_70b_on_16_gpus_needs_the_host_step_and_zero3_frozen_roles():
    plan = load_plan(ROOT / "examples/plans/ppo-llama2-70b-openrlhf-a800x16.toml")
    cms = cost_models_for(plan)
    assert simulate(plan, cms).feasible and plan.num_gpus == 16
    par = dict(plan.parallelism)
    par[Role.ACTOR] = dataclasses.replace(par[Role.ACTOR], optimizer_step=OptimizerStep.DEVICE)
    assert not simulate(dataclasses.replace(plan, parallelism=par), cms).feasible
    par = dict(plan.parallelism)
    par[Role.REF] = dataclasses.replace(par[Role.REF], zero=1)
    reasons = simulate(dataclasses.replace(plan, parallelism=par), cms).infeasible_reasons
    assert any("(ref)" in r for r in reasons)


# --- executor -------------------------------------------------------------------------


def _actor(mode: OffloadMode) -> ActorEngine:
    setup = EngineSetup(
        arch=ARCH,
        weights=WeightSource(seed=0),
        micro_batch=3,
        optim=OptimConfig(lr=1e-3),
        offload=mode,
    )
    return ActorEngine(setup, RoleGroups(tp=SINGLE), CPU, gen=None, rank=0, reshard_plan=None)


def _storages(tensors) -> set[int]:
    return {t.untyped_storage().data_ptr() for t in tensors}


def test_plan_modes_reach_the_engine():
    plan = load_plan(OPENRLHF)
    par = plan.parallelism[Role.ACTOR]
    assert OffloadMode.of(par.offload_optimizer, par.host_optimizer_step) is OffloadMode.HOST_STEP
    assert OffloadMode.of(True, False) is OffloadMode.DEVICE_STEP
    assert OffloadMode.of(False, False) is OffloadMode.NONE


def test_adam_state_lives_where_the_mode_says_between_updates():
    """Two updates in each mode: same weights bit for bit (CPU), state where it belongs."""
    batch, cfg = _batch(), UpdateConfig()
    engines = {mode: _actor(mode) for mode in OffloadMode}
    for _ in range(2):
        for engine in engines.values():
            engine.update(batch, cfg)
    plain = engines[OffloadMode.NONE]
    params = list(plain.model.parameters())
    for mode, engine in engines.items():
        for p, q in zip(engine.model.parameters(), params, strict=True):
            assert torch.equal(p, q), mode
    # No offload: the optimizer holds the moments beside the weights.
    assert len(plain.trainer.optimizer.state) == len(params)

    # Device step: between phases the optimizer holds nothing; host copies hold it all.
    dev = engines[OffloadMode.DEVICE_STEP].trainer
    assert len(dev.optimizer.state) == 0
    host = dev.offload.host_state
    assert len(host) == len(params)
    moments = [t for st in host.values() for k, t in st.items() if k != "step"]
    assert moments and all(t.device == HOST for t in moments)
    device_storages = _storages(dev.model.parameters())
    assert not _storages(moments) & device_storages
    for p, q in zip(dev.model.parameters(), plain.model.parameters(), strict=True):
        ours = host[p]
        theirs = plain.trainer.optimizer.state[q]
        assert torch.equal(ours["exp_avg"], theirs["exp_avg"])
        assert torch.equal(ours["exp_avg_sq"], theirs["exp_avg_sq"])

    # Host step: the device optimizer never held state; fp32 masters and moments on the host.
    hs = engines[OffloadMode.HOST_STEP].trainer
    assert len(hs.optimizer.state) == 0
    assert hs.offload.host_optimizer is not None
    masters = [m for _, m in hs.offload._masters]
    assert all(m.device == HOST and m.dtype == torch.float32 for m in masters)
    assert not _storages(masters) & _storages(hs.model.parameters())
    assert len(hs.offload.host_optimizer.state) == len(params)


def test_offloaded_checkpoints_equal_the_plain_one():
    batch, cfg = _batch(), UpdateConfig()
    engines = {mode: _actor(mode) for mode in OffloadMode}
    for engine in engines.values():
        engine.update(batch, cfg)
    want = engines[OffloadMode.NONE].state()
    for mode in (OffloadMode.DEVICE_STEP, OffloadMode.HOST_STEP):
        got = engines[mode].state()
        assert got["model"].keys() == want["model"].keys()
        for a, b in zip(got["optimizer"], want["optimizer"], strict=True):
            assert a.keys() == b.keys()
            assert all(torch.equal(a[k], b[k]) for k in a), mode
        # Offloaded again after the checkpoint read it.
        assert len(engines[mode].trainer.optimizer.state) == 0
        fresh = _actor(mode)
        fresh.load_state(got)
        fresh.update(batch, cfg)
        engines[mode].update(batch, cfg)
        for p, q in zip(fresh.model.parameters(), engines[mode].model.parameters(), strict=True):
            assert torch.equal(p, q), mode


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_device_step_moves_the_state_off_the_gpu():
    from placeflow.executor.engines.offload import OptimizerOffload

    cuda = torch.device("cuda")
    p = torch.nn.Parameter(torch.ones(1024, device=cuda))
    opt = torch.optim.AdamW([p])
    offload = OptimizerOffload(OffloadMode.DEVICE_STEP, opt, opt, cuda)
    p.grad = torch.ones_like(p)
    offload.step_with(opt)
    assert len(opt.state) == 0
    moments = [t for st in offload.host_state.values() for t in st.values() if t.dim() > 0]
    assert moments and all(t.device == HOST and t.is_pinned() for t in moments)
