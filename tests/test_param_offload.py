"""Parameter offload (`offload_params`, verl's param_offload): a role's weights in host
memory between its calls, priced as copies over the host link, searched by the planner
and run by the executor.

Oracles: bytes per parameter by hand (bf16 mixed-precision Adam: 2 + 2 + 12), seconds
from the cost model's own copy primitive, and for the executor the same run without
offload (bit for bit on CPU) and the tensors' storages.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from test_engines_device import ARCH, _batch

from placeflow.catalogue import get_model
from placeflow.cluster import load_cluster
from placeflow.dataflow import CallKind
from placeflow.executor.engines.offload import ParamOffload
from placeflow.executor.engines.roles import (
    ActorEngine,
    EngineSetup,
    RoleGroups,
    UpdateConfig,
    WeightSource,
)
from placeflow.executor.engines.tp import SINGLE
from placeflow.executor.engines.trainer import OptimConfig
from placeflow.executor.run import RunConfig, run_plan
from placeflow.layout import TrainLayout
from placeflow.phases import Phase
from placeflow.plan import Plan, RoleParallelism, load_plan, plan_from_dict, plan_to_dict
from placeflow.planner.space import _memory_savers
from placeflow.profiles.registry import fitted_cost_model
from placeflow.simulator import memory
from placeflow.simulator.rolecosts import call_cost, resident_bytes, role_calls
from placeflow.simulator.simulate import cost_models_for, simulate
from placeflow.workload import Role

ROOT = Path(__file__).resolve().parents[1]
PPO_7B = ROOT / "examples/plans/ppo-7b-colocate-h100x16.toml"
PPO_TINY = ROOT / "examples/plans/ppo-tiny-cpu4-colocate.toml"
CPU = torch.device("cpu")
TIMING = ("step_time_s", "tokens_per_s")


@pytest.fixture(scope="module")
def h100():
    return fitted_cost_model("h100-sxm")


def _offloaded(plan: Plan, roles: tuple[Role, ...] | None = None) -> Plan:
    pars = {
        r: dataclasses.replace(par, offload_params=True) if roles is None or r in roles else par
        for r, par in plan.parallelism.items()
    }
    return dataclasses.replace(plan, parallelism=pars)


# --- plan -------------------------------------------------------------------------------


def test_offload_params_round_trips_and_leaves_older_plans_alone():
    plan = load_plan(PPO_7B)
    assert not any(p.offload_params for p in plan.parallelism.values())
    assert "offload_params" not in plan_to_dict(plan)["parallelism"]["actor"]
    off = _offloaded(plan, (Role.REF,))
    data = plan_to_dict(off)
    assert data["parallelism"]["ref"]["offload_params"] is True
    back = plan_from_dict(data, "test", ROOT)
    assert back.parallelism[Role.REF].offload_params
    assert not back.parallelism[Role.ACTOR].offload_params
    assert back.content_hash() == off.content_hash() != plan.content_hash()


# --- memory -----------------------------------------------------------------------------


def test_resident_state_without_the_weights():
    """Llama-2-7B over d = 2, ZeRO-1: 2 + 2 + 12/2 bytes per parameter resident; with the
    weights offloaded the Adam share 12/2 only; both offloads: nothing. A frozen role: 2 or 0."""
    model = get_model("llama-2-7b")
    n = model.num_params()
    par = RoleParallelism(train=TrainLayout(d=2), zero=1)
    off = dataclasses.replace(par, offload_params=True)
    assert resident_bytes(model, Role.ACTOR, par) == pytest.approx(n * (2 + 2 + 6))
    assert resident_bytes(model, Role.ACTOR, off) == pytest.approx(n * 6)
    both = dataclasses.replace(off, offload_optimizer=True)
    assert resident_bytes(model, Role.ACTOR, both) == pytest.approx(0, abs=1)
    assert memory.offloaded_param_bytes(model, off, trained=True, value_head=False) == (
        pytest.approx(n * 2),
        pytest.approx(n * 2),
    )
    assert resident_bytes(model, Role.REF, par) == n * 2
    assert resident_bytes(model, Role.REF, off) == 0
    # ZeRO-3 shards what is offloaded too: 1/d of the weights and gradients.
    z3 = dataclasses.replace(off, zero=3)
    assert memory.offloaded_param_bytes(model, z3, trained=True, value_head=False) == (
        pytest.approx(n * 2 / 2),
        pytest.approx(n * 2 / 2),
    )


# --- time -------------------------------------------------------------------------------


def test_each_call_reloads_and_an_update_writes_back(h100):
    """forward: + h2d(W), W transient; update: + h2d(W) + d2h(W), W + G transient."""
    plan = load_plan(PPO_7B)
    wl = plan.workload
    for role in (Role.ACTOR, Role.CRITIC, Role.REF):
        par = plan.parallelism[role]
        off = dataclasses.replace(par, offload_params=True)
        model = wl.models[role]
        trained = role in (Role.ACTOR, Role.CRITIC)
        w, g = memory.offloaded_param_bytes(
            model, off, trained=trained, value_head=role.has_value_head
        )
        assert w > 0 and (g > 0) == trained
        for call in role_calls(wl, role):
            if call.kind == CallKind.GENERATE:
                continue
            kw = dict(first_device=0, gpus_per_node=8)
            before = call_cost(wl, call, par, h100, **kw)
            after = call_cost(wl, call, off, h100, **kw)
            copy = h100.copy_s("h2d", int(w))
            extra = w
            if call.kind == CallKind.TRAIN:
                copy += h100.copy_s("d2h", int(w))
                extra += g
            assert after.time_s - before.time_s == pytest.approx(copy), call.phase
            assert after.detail["param_reload_s"] == pytest.approx(copy)
            assert after.transient_bytes - before.transient_bytes == pytest.approx(extra)


def test_colocated_generation_reloads_a_generator_set_does_not(h100):
    plan = load_plan(PPO_7B)
    cms = cost_models_for(plan)
    base = simulate(plan, cms)
    off = simulate(_offloaded(plan, (Role.ACTOR,)), cms)
    gen = next(p for p in off.phases if p.name is Phase.GENERATE)
    # The generation call itself pays one h2d of the actor's training shard.
    par = dataclasses.replace(plan.parallelism[Role.ACTOR], offload_params=True)
    w, _ = memory.offloaded_param_bytes(
        plan.workload.models[Role.ACTOR], par, trained=True, value_head=False
    )
    assert gen.detail["param_reload_s"] == pytest.approx(h100.copy_s("h2d", int(w)))
    assert base.feasible and off.feasible
    split = load_plan(ROOT / "examples/plans/ppo-7b-split-h100x16.toml")
    if split.generator_set() is not None:  # generation apart: only the sync reloads
        est = simulate(_offloaded(split, (Role.ACTOR,)), cost_models_for(split))
        gen = next(p for p in est.phases if p.name is Phase.GENERATE)
        assert "param_reload_s" not in gen.detail


def test_offloading_every_role_buys_kv_cache_on_a_colocated_set():
    """The 7B PPO plan on 16 H100 holds four roles' state on every GPU: with their weights
    on the host the set's resident state is the two Adam shares, the KV cache gets the
    room, and generation needs fewer waves; every call pays its copies."""
    plan = load_plan(PPO_7B)
    cms = cost_models_for(plan)
    base, off = simulate(plan, cms), simulate(_offloaded(plan), cms)
    assert off.sets[0].resident_bytes < base.sets[0].resident_bytes / 2

    def gen(est):
        return next(p for p in est.phases if p.name is Phase.GENERATE)

    assert gen(off).detail["kv_capacity_seqs"] > gen(base).detail["kv_capacity_seqs"]
    for phase in (Phase.REF_LOGPROB, Phase.ACTOR_UPDATE):
        got = next(p for p in off.phases if p.name is phase)
        assert got.detail["param_reload_s"] > 0


# --- planner ----------------------------------------------------------------------------


def test_planner_offers_weight_offload_on_gpu_pools_only():
    gpu = load_cluster(ROOT / "examples/clusters/h100x16.toml").pools[0]
    cpu = load_cluster(ROOT / "examples/clusters/cpu4.toml").pools[0]
    assert any(s[3] for s in _memory_savers(Role.ACTOR, gpu))
    assert any(s[3] for s in _memory_savers(Role.REF, gpu))
    assert not any(s[3] for s in _memory_savers(Role.ACTOR, cpu))
    # verl's pairing: the weights go with the Adam state (never without it)
    assert all(s[1] for s in _memory_savers(Role.CRITIC, gpu) if s[3])


# --- executor ---------------------------------------------------------------------------


def _actor() -> ActorEngine:
    setup = EngineSetup(
        arch=ARCH, weights=WeightSource(seed=0), micro_batch=3, optim=OptimConfig(lr=1e-3)
    )
    return ActorEngine(setup, RoleGroups(tp=SINGLE), CPU, gen=None, rank=0, reshard_plan=None)


def test_weights_leave_the_device_between_calls_and_come_back_unchanged():
    batch, cfg = _batch(), UpdateConfig()
    plain, ours = _actor(), _actor()
    offload = ParamOffload(ours.model, CPU)
    n = sum(p.numel() * p.element_size() for p in ours.model.parameters())
    assert offload.num_bytes == n
    offload.offload()
    assert all(p.untyped_storage().nbytes() == 0 for p in ours.model.parameters())
    for _ in range(2):
        plain.update(batch, cfg)
        with offload.loaded(changes=True):
            ours.update(batch, cfg)
        assert all(p.untyped_storage().nbytes() == 0 for p in ours.model.parameters())
        want = plain.logprobs(batch, 1.0)
        with offload.loaded():
            got = ours.logprobs(batch, 1.0)
        assert torch.equal(got.tensors["logprobs"], want.tensors["logprobs"])
    offload.reload()
    for p, q in zip(ours.model.parameters(), plain.model.parameters(), strict=True):
        assert torch.equal(p, q)
    assert all(p.grad is None for p in ours.model.parameters())


def test_a_forward_only_call_does_not_write_back():
    engine = _actor()
    offload = ParamOffload(engine.model, CPU)
    offload.offload()
    with offload.loaded():
        for p in engine.model.parameters():
            p.data.add_(1.0)  # changed on the device, but the call said it would not
    offload.reload()
    fresh = _actor()
    for p, q in zip(engine.model.parameters(), fresh.model.parameters(), strict=True):
        assert torch.equal(p, q)


def test_offloaded_plan_runs_like_the_resident_one(ray_cluster: None, tmp_path: Path) -> None:
    # PPO with actor (t 2 x d 2, FSDP), critic and reference colocated on 4 CPU workers:
    # every role offloaded gives the same metrics, step for step.
    plan = load_plan(PPO_TINY)
    config = RunConfig(steps=3, progress=False)
    base = run_plan(plan, tmp_path / "a", config)
    off = run_plan(_offloaded(plan), tmp_path / "b", config)

    def metrics(result) -> list[dict]:
        return [{k: v for k, v in r.metrics.items() if k not in TIMING} for r in result.records]

    assert metrics(off) == metrics(base)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_offloaded_weights_free_the_gpu_and_sit_in_pinned_memory():
    cuda = torch.device("cuda")
    module = torch.nn.Linear(1024, 1024, device=cuda)
    want = [p.detach().clone() for p in module.parameters()]
    offload = ParamOffload(module, cuda)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    offload.offload()
    torch.cuda.synchronize()
    assert before - torch.cuda.memory_allocated() >= offload.num_bytes
    assert all(host.is_pinned() for _, _, host in offload.storages)
    with offload.loaded():
        assert all(torch.equal(p, q) for p, q in zip(module.parameters(), want, strict=True))


def test_a_cpu_plan_with_offload_is_priced_from_the_cpu_profiles_host_copies():
    """On CPU workers the host is the device: an offload is a copy between host buffers,
    which the `cpu` profile measures (`python -m placeflow.profiles.profiler --copies-to`)."""
    plan = load_plan(PPO_TINY)
    pars = {
        r: dataclasses.replace(
            par, offload_params=True, offload_optimizer=r in (Role.ACTOR, Role.CRITIC)
        )
        for r, par in plan.parallelism.items()
    }
    off = dataclasses.replace(plan, parallelism=pars)
    cms = cost_models_for(off)
    est = simulate(off, cms)
    assert est.feasible
    (cm,) = cms.values()
    ref = next(p for p in est.phases if p.name is Phase.REF_LOGPROB)
    w, _ = memory.offloaded_param_bytes(
        off.workload.models[Role.REF], pars[Role.REF], trained=False, value_head=False
    )
    assert cm.copy_s("h2d", int(w)) > 0
    assert ref.detail["param_reload_s"] == pytest.approx(cm.copy_s("h2d", int(w)))
