"""Simulator: hand-computed steps on fake kernel costs, published figures, and invariants."""

import dataclasses
import itertools
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from placeflow.catalogue import CATALOGUE
from placeflow.cluster import ClusterSpec, PoolSpec
from placeflow.dataflow import build_dataflow
from placeflow.hardware import HARDWARE
from placeflow.layout import TrainLayout
from placeflow.phases import Phase
from placeflow.plan import DeviceSet, Plan, RoleParallelism, load_plan
from placeflow.profiles.controller_work import CONTROLLER_KINDS
from placeflow.profiles.costmodel import CostModel
from placeflow.profiles.registry import fitted_cost_model
from placeflow.profiles.shared_cores import SHARED_KINDS
from placeflow.simulator import memory, simulate
from placeflow.simulator.estimate import StepEstimate
from placeflow.workload import Algorithm, BatchSpec, Role, Workload

PLANS = Path(__file__).resolve().parents[1] / "examples" / "plans"
GEMM_S = 1e-3


@dataclasses.dataclass(frozen=True, kw_only=True)
class GemmOnlyCosts(CostModel):
    """Every GEMM takes 1 ms, everything else is free: steps can be computed by hand."""

    def gemm_s(self, m, n, k):
        return GEMM_S

    def attn_prefill_s(self, *args, **kwargs):
        return 0.0

    def attn_decode_s(self, *args, **kwargs):
        return 0.0

    def elementwise_s(self, kind, num_bytes):
        return 0.0

    def optimizer_s(self, num_params):
        return 0.0

    def collective_s(self, kind, num_bytes, world_size, scope, *, ranks_per_node=1, after_s=None):
        return 0.0

    def dispatch_s(self, kind, num_bytes, tensors=2):
        return 0.0


FAKE = GemmOnlyCosts(profile_name="fake", dtype_bytes=4, rooflines={}, series={})


def tiny_plan(
    sets,
    parallelism,
    *,
    response_len=4,
    algorithm=Algorithm.GRPO,
    roles=None,
    num_devices=4,
    memory_gib=5.0,
):
    model = CATALOGUE["tiny-llama"]
    roles = roles or (Role.ACTOR, Role.REF)
    workload = Workload(
        name="w",
        algorithm=algorithm,
        models={r: model for r in roles},
        batch=BatchSpec(
            prompts_per_step=4,
            samples_per_prompt=2,
            prompt_len=8,
            response_len=response_len,
            mini_batches=2,
        ),
        reward_function="arith",
    )
    gpu = dataclasses.replace(HARDWARE["cpu"], memory_bytes=int(memory_gib * 2**30))
    cluster = ClusterSpec(
        name="c", pools=(PoolSpec(name="cpu", gpu=gpu, num_nodes=1, gpus_per_node=num_devices),)
    )
    return Plan(
        name="p", workload=workload, cluster=cluster, sets=tuple(sets), parallelism=parallelism
    )


def one_device(**kw):
    return RoleParallelism(train=TrainLayout(), micro_batch=4, recompute=False, **kw)


def test_hand_computed_colocated_step():
    plan = tiny_plan(
        [DeviceSet(roles=(Role.ACTOR, Role.REF), pool="cpu", first_device=0, num_devices=1)],
        {Role.ACTOR: one_device(), Role.REF: one_device()},
    )
    est = simulate(plan, FAKE)
    d = {p.name: p.duration_s for p in est.phases}
    # generate: prefill 2 layers x 4 GEMMs + LM head = 9 GEMMs; 4 decode steps of 9 GEMMs;
    # FAKE is a CUDA cost model, so the built-in engine (tg = 1) captures its decode step
    # as a graph once: 2 warm-up runs and the captured run, 3 x 9 GEMMs.
    assert d[Phase.GENERATE] == pytest.approx((45 + 27) * GEMM_S)
    # forward: 8 samples in 2 micro-batches of 4; stage = 8 GEMMs, head 1 per micro-batch.
    assert d[Phase.REF_LOGPROB] == pytest.approx(18 * GEMM_S)
    assert d[Phase.OLD_LOGPROB] == pytest.approx(18 * GEMM_S)
    # update: 2 mini-batches x (fwd 8 + bwd 16 + head fwd 1 + head bwd 2) GEMMs.
    assert d[Phase.ACTOR_UPDATE] == pytest.approx(54 * GEMM_S)
    assert est.iteration_s == pytest.approx((135 + 27) * GEMM_S)
    # tg = t: nothing to move; the rollout's load of its weights is a copy, which this
    # profile prices at nothing.
    assert est.feasible and d[Phase.RESHARD] == 0.0
    tokens = 8 * (8 + 4)
    assert est.tokens_per_s == pytest.approx(tokens / est.iteration_s)


def test_hand_computed_split_step_overlaps_forward_calls():
    plan = tiny_plan(
        [
            DeviceSet(roles=(Role.ACTOR,), pool="cpu", first_device=0, num_devices=1),
            DeviceSet(roles=(Role.REF,), pool="cpu", first_device=1, num_devices=1),
        ],
        {Role.ACTOR: one_device(), Role.REF: one_device()},
    )
    est = simulate(plan, FAKE)
    assert est.iteration_s == pytest.approx((45 + 27 + 18 + 54) * GEMM_S)


def test_dataflow_graphs():
    def phases(algorithm, roles, reward_function=None):
        model = CATALOGUE["tiny-llama"]
        wl = Workload(
            name="w",
            algorithm=algorithm,
            models={r: model for r in roles},
            batch=BatchSpec(prompts_per_step=4, samples_per_prompt=2, prompt_len=8, response_len=8),
            reward_function=reward_function,
        )
        return set(build_dataflow(wl).nodes)

    ppo = phases(Algorithm.PPO, (Role.ACTOR, Role.CRITIC, Role.REF, Role.REWARD))
    assert ppo == {
        Phase.GENERATE,
        Phase.REF_LOGPROB,
        Phase.OLD_LOGPROB,
        Phase.VALUES,
        Phase.REWARD,
        Phase.ADVANTAGE,
        Phase.ACTOR_UPDATE,
        Phase.CRITIC_UPDATE,
    }
    grpo = phases(Algorithm.GRPO, (Role.ACTOR, Role.REF), "arith")
    assert Phase.VALUES not in grpo and Phase.CRITIC_UPDATE not in grpo
    remax = phases(Algorithm.REMAX, (Role.ACTOR, Role.REF, Role.REWARD))
    assert Phase.GENERATE_BASELINE in remax
    safe = phases(Algorithm.SAFE_RLHF, tuple(Role))
    assert {Phase.COST, Phase.COST_VALUES} <= safe


def test_published_memory_figures():
    m = CATALOGUE["llama-2-7b"]
    state = memory.training_state_bytes_per_gpu(m, TrainLayout(), 0, value_head=False)
    assert state == 16 * m.num_params()  # mixed-precision Adam, 16 bytes per parameter
    assert memory.kv_bytes_per_token_per_gpu(CATALOGUE["llama-3.1-8b"], 1, 1) == 131_072


@given(zero=st.sampled_from([0, 1, 2, 3]), d=st.sampled_from([1, 2, 4, 8, 16]))
def test_more_sharding_never_raises_memory(zero, d):
    m = CATALOGUE["llama-2-13b"]
    a = memory.training_state_bytes_per_gpu(m, TrainLayout(d=d), zero, value_head=False)
    b = memory.training_state_bytes_per_gpu(m, TrainLayout(d=2 * d), zero, value_head=False)
    assert b <= a


@pytest.fixture(scope="module")
def h100():
    return fitted_cost_model("h100-sxm")


@settings(max_examples=25, deadline=None)
@given(short=st.integers(16, 2048), extra=st.integers(0, 2048))
def test_longer_response_never_shortens_generation(h100, short, extra):
    plan = load_plan(PLANS / "ppo-7b-colocate-h100x16.toml")

    def gen_s(response_len):
        wl = dataclasses.replace(
            plan.workload, batch=dataclasses.replace(plan.workload.batch, response_len=response_len)
        )
        est = simulate(dataclasses.replace(plan, workload=wl), h100)
        return next(p.duration_s for p in est.phases if p.name is Phase.GENERATE)

    assert gen_s(short + extra) >= gen_s(short)


@pytest.mark.parametrize("path", sorted(PLANS.glob("*.toml")), ids=lambda p: p.stem)
def test_calls_on_one_set_never_overlap(path):
    plan = load_plan(path)
    from placeflow.simulator.simulate import cost_models_for

    est = simulate(plan, cost_models_for(plan))
    assert est.feasible, est.infeasible_reason
    for i in range(len(plan.sets)):
        on_set = sorted((p.start_s, p.end_s) for p in est.phases if p.device_set == i)
        for (_, end), (start, _) in itertools.pairwise(on_set):
            assert start >= end - 1e-12


def test_plan_that_does_not_fit_names_role_phase_and_bytes(h100):
    plan = load_plan(PLANS / "ppo-7b-standalone-h100x16.toml")
    big = CATALOGUE["llama-2-70b"]
    models = dict(plan.workload.models)
    models[Role.CRITIC] = big
    wl = dataclasses.replace(plan.workload, models=models)
    par = dict(plan.parallelism)
    par[Role.CRITIC] = RoleParallelism(train=TrainLayout(t=4), micro_batch=8)
    est = simulate(dataclasses.replace(plan, workload=wl, parallelism=par), h100)
    assert not est.feasible
    assert "role critic" in est.infeasible_reason and "short by" in est.infeasible_reason


def test_async_one_step_off_overlaps_generation_with_training(h100):
    plan = load_plan(PLANS / "ppo-7b-split-h100x16.toml")
    sets = (
        DeviceSet(roles=(Role.ACTOR, Role.REF), pool="h100", first_device=0, num_devices=4),
        DeviceSet(roles=(Role.ACTOR,), pool="h100", first_device=4, num_devices=4, generator=True),
        *plan.sets[1:],
    )
    par = dict(plan.parallelism)
    par[Role.ACTOR] = RoleParallelism(train=TrainLayout(t=4), tg=2, micro_batch=8)
    par[Role.REF] = RoleParallelism(train=TrainLayout(t=2, d=2), micro_batch=16)
    sync_plan = dataclasses.replace(plan, sets=sets, parallelism=par)
    async_plan = dataclasses.replace(
        sync_plan, workload=dataclasses.replace(sync_plan.workload, max_staleness=1)
    )
    sync_est, async_est = simulate(sync_plan, h100), simulate(async_plan, h100)
    assert sync_est.feasible and async_est.feasible
    assert Phase.WEIGHT_SYNC in {p.name for p in sync_est.phases}
    assert async_est.iteration_s < sync_est.iteration_s


def test_optimizer_offload_trades_memory_for_copy_time(h100):
    plan = load_plan(PLANS / "ppo-7b-standalone-h100x16.toml")
    par = dict(plan.parallelism)
    par[Role.ACTOR] = dataclasses.replace(par[Role.ACTOR], offload_optimizer=True)
    offloaded = dataclasses.replace(plan, parallelism=par)
    base, off = simulate(plan, h100), simulate(offloaded, h100)
    actor_set = plan.set_of(Role.ACTOR)
    assert off.sets[actor_set].resident_bytes < base.sets[actor_set].resident_bytes
    update = {e.name: e for e in base.phases}[Phase.ACTOR_UPDATE]
    update_off = {e.name: e for e in off.phases}[Phase.ACTOR_UPDATE]
    assert update_off.duration_s > update.duration_s
    assert update_off.detail["offload_s"] > 0


def test_optimizer_offload_needs_a_trained_role():
    """A CPU pool may offload (its workers honour it: test_offload.py); a frozen role may not."""
    plan = load_plan(PLANS / "grpo-tiny-cpu4-colocate.toml")
    par = dict(plan.parallelism)
    par[Role.ACTOR] = dataclasses.replace(par[Role.ACTOR], offload_optimizer=True)
    dataclasses.replace(plan, parallelism=par)
    par[Role.REF] = dataclasses.replace(par[Role.REF], offload_optimizer=True)
    with pytest.raises(ValueError, match="offload_optimizer needs a trained role"):
        dataclasses.replace(plan, parallelism=par)


def test_cpu_workers_sharing_cores_are_stretched(monkeypatch: pytest.MonkeyPatch) -> None:
    """cpu4: 4 logical workers on 2 cores. A phase on all 4 runs at half speed; on 2, at
    full speed alone and at half speed beside another 2-worker phase. (Without the
    engine's scalar all-reduces: a collective of 4 ranks was measured on the 2 cores,
    its sharing included, so it is not stretched again; tests/test_control_syncs.py.)"""
    import dataclasses as dc

    from placeflow.simulator import callcosts
    from placeflow.simulator.simulate import cost_models_for

    monkeypatch.setattr(callcosts, "control_syncs_s", lambda *args, **kwargs: 0.0)

    plans = Path(__file__).resolve().parents[1] / "examples" / "plans"
    runs = {}
    for name in ("grpo-tiny-cpu4-colocate", "grpo-tiny-cpu4-split"):
        plan = load_plan(plans / f"{name}.toml")
        assert plan.cluster.pools[0].cores_per_node == 2
        free_pool = dc.replace(plan.cluster.pools[0], cores_per_node=None)
        free = dc.replace(plan, cluster=dc.replace(plan.cluster, pools=(free_pool,)))
        cms = {"*": without_host_waits(cost_models_for(plan, "cpu")["*"])}
        runs[name] = simulate(plan, cms).phase_totals_s(), simulate(free, cms).phase_totals_s()
    shared, alone = runs["grpo-tiny-cpu4-colocate"]
    for phase, seconds in alone.items():  # every phase keeps all 4 workers busy
        assert shared[phase] == pytest.approx(seconds * 2.0), phase
    # Split: 2 workers per set. Generation and the update run alone at full speed; the
    # reference and old-policy forwards run at once on the two sets, 4 workers on 2 cores
    # (simulator/schedule.py): both at half speed until the shorter (s alone) ends at 2s,
    # then the longer (l alone) finishes its l − s alone, at l + s.
    shared, alone = runs["grpo-tiny-cpu4-split"]
    for phase in (Phase.GENERATE, Phase.ACTOR_UPDATE):
        assert shared[phase] == pytest.approx(alone[phase]), phase
    short, long = sorted((alone[Phase.REF_LOGPROB], alone[Phase.OLD_LOGPROB]))
    assert sorted((shared[Phase.REF_LOGPROB], shared[Phase.OLD_LOGPROB])) == pytest.approx(
        [2 * short, long + short]
    )


def test_calls_of_two_sets_crowding_a_host_pay_its_slices_overhead() -> None:
    """The split plan's reference and old-policy forwards (2 workers each, alone on the 2
    cores unstretched) run at once: 4 workers on 2 cores, with a measured stretch there of
    2.5 by hand (a slices' cost of 0.25 beyond the 2x share), so both run at 0.4 until
    the shorter (s alone) ends at 2.5 s; the longer (l alone) has done s by then, and
    ends at 2.5 s + l - s."""
    from placeflow.frozen import FrozenMap
    from placeflow.profiles.costmodel import Series
    from placeflow.profiles.schema import Op
    from placeflow.simulator.simulate import cost_models_for

    plans = Path(__file__).resolve().parents[1] / "examples" / "plans"
    plan = load_plan(plans / "grpo-tiny-cpu4-split.toml")
    cm = without_host_waits(cost_models_for(plan, "cpu")["*"])
    # By busy ranks on the 2 cores: 4 ms alone or with 2 (a core each), 10 ms with 4.
    params = tuple(FrozenMap({"kind": "shared_compute", "num_units": n}) for n in (1, 2, 4))
    series = {**cm.series, (Op.FRAMEWORK, ("shared_compute",)): Series(
        sizes=(1.0, 2.0, 4.0), times_s=(4e-3, 4e-3, 10e-3), params=params
    )}  # fmt: skip
    sliced = simulate(plan, {"*": dataclasses.replace(cm, series=series, _memo={})})
    bare = simulate(plan, {"*": cm})  # the same crowd without slices: 2s and l + s

    def forwards(estimate: StepEstimate) -> list[float]:
        totals = estimate.phase_totals_s()
        return sorted((totals[Phase.REF_LOGPROB], totals[Phase.OLD_LOGPROB]))

    crowded_short, crowded_long = forwards(bare)
    short = crowded_short / 2
    long = crowded_long - short
    assert forwards(sliced) == pytest.approx([2.5 * short, 2.5 * short + long - short])


@pytest.mark.parametrize(("micro_batch", "shared_ms"), [(4, 9.0), (2, 18.0)])
def test_pipeline_bubbles_leave_cores_free(micro_batch: int, shared_ms: float) -> None:
    """4 workers on 2 cores, the reference in 2 stages x 2 replicas (GEMMs 1 ms each). A
    stage is 1 layer = 4 GEMMs, the head 1 GEMM. Per rank 4 samples in m micro-batches:
    m + 1 stage slots and m heads; a stage works m of them, so on average
    4 * busy / time workers are busy, and only past 2 of them does a worker slow down.
    m = 1: 2 * 4 + 1 = 9 ms, busy 4 + 1/2 = 4.5 ms, 2 workers busy: not stretched.
    m = 2: 3 * 4 + 2 = 14 ms, busy 2 * 4.5 = 9 ms, 4 * 9/14 workers busy on 2 cores:
    14 ms x (36/14)/2 = 18 ms."""
    pipe = RoleParallelism(train=TrainLayout(p=2, d=2), micro_batch=micro_batch, recompute=False)
    plan = tiny_plan(
        [DeviceSet(roles=(Role.ACTOR, Role.REF), pool="cpu", first_device=0, num_devices=4)],
        {Role.ACTOR: pipe, Role.REF: pipe},
    )
    shared_pool = dataclasses.replace(plan.cluster.pools[0], cores_per_node=2)
    shared = dataclasses.replace(
        plan, cluster=dataclasses.replace(plan.cluster, pools=(shared_pool,))
    )
    free_ms = simulate(plan, FAKE).phase_totals_s()[Phase.REF_LOGPROB] * 1e3
    assert free_ms == pytest.approx(9.0 if micro_batch == 4 else 14.0)
    assert simulate(shared, FAKE).phase_totals_s()[Phase.REF_LOGPROB] * 1e3 == pytest.approx(
        shared_ms
    )


def without_host_waits(cm: CostModel) -> CostModel:
    """`cm` without what the host adds around the sets' work: the driver's per-rank
    launches and gets and its scoring and advantages between the calls (the controller's
    own work, which shares the head node's cores too), the collectives' wait for
    partners on shared cores, the time slices' cost and a crowded call's fixed time;
    only the rates left."""
    dropped = {(s.value,) for s in (*SHARED_KINDS, *CONTROLLER_KINDS)}
    kept = {
        k: v
        for k, v in cm.series.items()
        if (k[0] != "dispatch" or k[1] == ("ray_call",))
        and (k[0] != "framework" or k[1] not in dropped)
    }
    return dataclasses.replace(cm, series=kept, _memo={})


def test_cores_per_node_is_for_cpu_pools_only() -> None:
    from placeflow.cluster import cluster_from_dict
    from placeflow.errors import SpecError

    pool = {"gpu": "h100-sxm", "num_nodes": 1, "gpus_per_node": 8, "cores_per_node": 4}
    with pytest.raises(SpecError, match="CPU pools only"):
        cluster_from_dict({"name": "x", "pools": [pool]})


def test_single_update_grpo_has_no_old_logprob_phase() -> None:
    plan = load_plan(
        Path(__file__).resolve().parents[1] / "examples/plans/grpo-tiny-cpu4-split.toml"
    )
    one = dataclasses.replace(plan.workload.batch, mini_batches=1)
    single = dataclasses.replace(plan.workload, batch=one)
    assert Phase.OLD_LOGPROB in build_dataflow(plan.workload)
    assert Phase.OLD_LOGPROB not in build_dataflow(single)
    models = {**single.models, Role.CRITIC: single.models[Role.ACTOR]}
    ppo = dataclasses.replace(single, algorithm=Algorithm.PPO, models=models)
    assert ppo.recomputes_old_logprobs  # its KL-shaped reward needs them
