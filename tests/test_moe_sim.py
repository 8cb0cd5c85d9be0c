"""Mixture of experts and latent attention in the simulator, against hand-computed oracles.

A recording cost model stands in for a profile: every GEMM costs its FLOPs at
1 PFLOP/s and every other op nothing, and the collectives it is asked for are
kept, so that a layer's time is its GEMM FLOPs and its collectives can be read
back and compared with the numbers worked out by hand below.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from pathlib import Path

import pytest

from placeflow.catalogue import CATALOGUE
from placeflow.layout import GenLayout, TrainLayout
from placeflow.models import ModelSpec, MoESpec
from placeflow.plan import RoleParallelism, load_plan
from placeflow.profiles import ops
from placeflow.profiles.registry import fitted_cost_model
from placeflow.profiles.schema import CollectiveKind, Scope
from placeflow.simulator import callcosts, compute, memory, simulate

ROOT = Path(__file__).resolve().parent.parent
FLOPS_PER_S = 1e15


class RecordingCostModel:
    """GEMM time = FLOPs / 1 PFLOP/s; other ops free; collectives recorded."""

    device_kind = "cuda"
    host_local = False

    def __init__(self) -> None:
        self.memo: dict = {}
        self.gemms: list[tuple[int, int, int]] = []
        self.collectives: list[tuple[CollectiveKind, int, int]] = []

    def remember(self, key, compute):
        if key not in self.memo:
            self.memo[key] = compute()
        return self.memo[key]

    def framework_s(self, kind: object, num_units: int = 1) -> None:
        return None  # no framework entries: the counted extra ops, as a GPU profile

    def framework_units(self, kind: object) -> tuple[int, ...]:
        return ()  # (no framework entries)

    def gemm_s(self, m: int, n: int, k: int) -> float:
        self.gemms.append((m, n, k))
        return 2.0 * m * n * k / FLOPS_PER_S

    def collective_s(
        self,
        kind: CollectiveKind,
        num_bytes: int,
        world_size: int,
        scope: Scope,
        *,
        ranks_per_node: int = 1,
        after_s: float | None = None,
    ) -> float:
        if world_size > 1 and num_bytes > 0:
            self.collectives.append((kind, int(num_bytes), world_size))
        return 0.0

    def attn_prefill_s(self, *args, **kwargs) -> float:
        return 0.0

    def attn_decode_s(self, *args, **kwargs) -> float:
        return 0.0

    def elementwise_s(self, kind: str, num_bytes: int) -> float:
        return 0.0

    def optimizer_s(self, num_params: int) -> float:
        return 0.0


H, E, K, F_E, F_S = 64, 4, 2, 96, 32

TINY_MOE = ModelSpec(
    name="tiny-moe",
    num_layers=2,
    hidden_size=H,
    num_heads=4,
    num_kv_heads=2,
    ffn_hidden_size=128,
    vocab_size=256,
    moe=MoESpec(
        num_experts=E, experts_per_token=K, expert_ffn_hidden_size=F_E, shared_ffn_hidden_size=F_S
    ),
)


def test_one_routed_layer_forward_flops_and_all_to_all_by_hand():
    cm = RecordingCostModel()
    tokens, e = 32, 2
    time_s = compute.layer_forward_kernels_s(cm, TINY_MOE, 1, 1, tokens, e=e)
    q, kv_each = 4 * 16, 2 * 16  # heads x head_dim, kv_heads x head_dim
    attention = 2 * tokens * H * (q + 2 * kv_each) + 2 * tokens * q * H
    router = 2 * tokens * E * H
    # e ranks send 32 tokens x 2 routes each to 4 experts: 32 rows per expert, and this
    # rank holds 2 experts: 64 rows through gate+up (2 F_E) and down (F_E).
    experts = 2 * (tokens * K) * 3 * H * F_E
    shared = 2 * tokens * 3 * H * F_S
    assert time_s * FLOPS_PER_S == pytest.approx(attention + router + experts + shared)
    a2a = [c for c in cm.collectives if c[0] is CollectiveKind.ALL_TO_ALL]
    # Dispatch and combine: each rank's buffer is tokens x top-k x hidden x 2 bytes.
    assert a2a == [(CollectiveKind.ALL_TO_ALL, tokens * K * H * 2, e)]
    assert len(cm.collectives) == 1  # priced once, paid twice (dispatch and combine)
    assert compute.all_to_all_bytes(TINY_MOE, tokens) == tokens * K * H * 2


def test_backward_runs_every_gemm_twice_and_the_all_to_alls_again():
    fwd_cm, bwd_cm = RecordingCostModel(), RecordingCostModel()
    tokens = 64
    fwd = compute.layer_forward_kernels_s(fwd_cm, TINY_MOE, 1, 1, tokens, e=2)
    bwd = compute.layer_backward_s(bwd_cm, TINY_MOE, 1, 1, tokens, e=2)
    assert bwd == pytest.approx(2 * fwd)
    assert {c[0] for c in bwd_cm.collectives} == {CollectiveKind.ALL_TO_ALL}


def test_all_to_all_moves_all_but_its_own_share_of_the_buffer():
    params = {"kind": "all_to_all", "world_size": 8, "scope": "intra", "num_bytes": 8 << 20}
    assert ops.bytes_moved(ops.Op.COLLECTIVE, params, 2) == (8 << 20) * 7 / 8


def test_one_expert_at_ep1_is_the_dense_mlp_of_the_same_size():
    dense = dataclasses.replace(TINY_MOE, name="dense", moe=None, ffn_hidden_size=F_E)
    one = dataclasses.replace(
        TINY_MOE,
        name="one-expert",
        moe=MoESpec(num_experts=1, experts_per_token=1, expert_ffn_hidden_size=F_E),
    )
    for t in (1, 2):
        a, b = RecordingCostModel(), RecordingCostModel()
        dense_s = compute.layer_forward_kernels_s(a, dense, t, 2, 16)
        moe_s = compute.layer_forward_kernels_s(b, one, t, 2, 16)
        router_s = 2 * 32 * 1 * H / FLOPS_PER_S
        assert moe_s == pytest.approx(dense_s + router_s)
        assert sorted(b.gemms) == sorted([*a.gemms, (32, 1, H)])
    # Parameters and training state: the router's h weights per layer apart.
    assert one.num_params() == dense.num_params() + 2 * H
    lay = TrainLayout(d=4)
    extra = 2 * H * (4 + 12 / 4)  # ZeRO-1 over d = 4
    assert memory.training_state_bytes_per_gpu(one, lay, 1, value_head=False) == pytest.approx(
        memory.training_state_bytes_per_gpu(dense, lay, 1, value_head=False) + extra
    )


def test_expected_distinct_experts_match_brute_force():
    # Every token picks a uniform top-k subset; enumerate all choices of 2 tokens.
    subsets = list(itertools.combinations(range(E), K))
    mean = sum(len(set(a) | set(b)) for a in subsets for b in subsets) / len(subsets) ** 2
    assert compute.active_experts(E, K, 2) == pytest.approx(mean)
    assert compute.active_experts(E, K, 1) == pytest.approx(K)
    assert compute.active_experts(128, 8, 10_000) == pytest.approx(128)


def test_a_small_decode_batch_reads_only_the_experts_it_touches():
    model = CATALOGUE["qwen3-30b-a3b"]
    cm = RecordingCostModel()
    compute.layer_forward_kernels_s(cm, model, 1, 1, 1, decode_kv_len=64)
    moe = model.moe
    assert moe is not None
    # One token touches k = 8 of 128 experts: the grouped GEMM reads 8 experts' weights.
    gate_up = [g for g in cm.gemms if g[1] == 2 * moe.expert_ffn_hidden_size]
    assert gate_up == [(1, 2 * moe.expert_ffn_hidden_size, 8 * model.hidden_size)]


def test_expert_memory_and_zero_groups_by_hand():
    model = CATALOGUE["qwen3-30b-a3b"]
    moe = model.moe
    assert moe is not None
    experts = model.num_moe_layers * moe.num_experts * 3 * model.hidden_size * 768
    dense = model.num_params() - experts
    lay = TrainLayout(t=2, d=16, e=4)
    want = dense / 2 * (2 + 2 + 12 / 16) + experts / 8 * (2 + 2 + 12 / 4)
    got = memory.training_state_bytes_per_gpu(model, lay, 1, value_head=False)
    assert got == pytest.approx(want)
    assert memory.weight_bytes_per_gpu(model, 2, 1, value_head=False, e=4) == pytest.approx(
        (dense / 2 + experts / 8) * 2
    )


def test_gradients_reduce_dense_over_d_and_experts_over_d_over_e():
    model = TINY_MOE
    cm = RecordingCostModel()
    par = RoleParallelism(train=TrainLayout(d=8, e=4), zero=1)
    callcosts.train_cost(cm, model, par, 64, 16, 1, 1, Scope.INTRA, value_head=False)
    experts = memory.expert_params(model)
    dense = model.num_params() - experts
    # ZeRO-1 as the engine runs it: each gradient all-reduced whole, over its group.
    ar = [c for c in cm.collectives if c[0] is CollectiveKind.ALL_REDUCE and c[2] in (2, 8)]
    big = [c for c in ar if c[1] > 64]  # not the engine's scalar agreements
    assert sorted(big, key=lambda c: c[2]) == [
        (CollectiveKind.ALL_REDUCE, (experts // 4) * 2, 2),
        (CollectiveKind.ALL_REDUCE, dense * 2, 8),
    ]


def test_latent_attention_caches_the_latent_on_every_tp_rank():
    model = CATALOGUE["deepseek-v3"]
    assert memory.kv_bytes_per_token_per_gpu(model, 8, 1) == 61 * (512 + 64) * 2
    assert memory.kv_bytes_per_token_per_gpu(model, 8, 4) == 61 * (512 + 64) * 2 / 4
    cm = RecordingCostModel()
    compute.layer_forward_kernels_s(cm, model, 8, 1, 4)
    h, heads = 7168, 128 // 8
    # q down, q up, kv down, kv up, o: the projections of MLA on one of 8 TP ranks.
    projections = [(4, 1536, h), (4, heads * 192, 1536), (4, 576, h), (4, heads * 256, 512)]
    assert cm.gemms[:5] == [*projections, (4, h, heads * 128)]


def test_colocated_moe_reshard_gathers_the_generation_shard():
    model = CATALOGUE["qwen3-30b-a3b"]
    gen = GenLayout(train=TrainLayout(t=2, d=16, e=4), tg=2)
    cm = RecordingCostModel()
    cost = callcosts.reshard_cost(cm, model, gen, Scope.INTRA)
    gen_shard = model.num_bytes() / 2
    train_shard = memory.weight_bytes_per_gpu(model, 2, 1, value_head=False, e=4)
    assert cost.transient_bytes == pytest.approx(gen_shard - train_shard)
    (gather,) = cm.collectives
    assert gather == (CollectiveKind.ALL_GATHER, int(gen_shard), round(gen_shard / train_shard))


@pytest.mark.parametrize(
    "name", ["nemo-rl-v0.6-qwen3-30b-a3b-on", "nemo-rl-v0.6-qwen3-235b-a22b-1off"]
)
def test_published_moe_plans_simulate(name):
    plan = load_plan(ROOT / "examples" / "published" / f"{name}.toml")
    est = simulate(plan, fitted_cost_model("h100-sxm"))
    assert est.feasible, est.infeasible_reason
    assert math.isfinite(est.iteration_s) and est.iteration_s > 0
    actor = plan.parallelism[next(iter(plan.parallelism))]
    assert actor.train.e > 1
    if plan.generator_set() is None:
        # dg = 1 (tg x pg = t x p), yet each rank holds 1/e of the experts: a reshard.
        assert actor.gen_layout().dg == 1
        assert est.phase_totals_s()["reshard"] > 0


def test_all_to_all_across_nodes_costs_more_than_inside_one():
    cm = fitted_cost_model("h100-sxm")
    intra = cm.collective_s(CollectiveKind.ALL_TO_ALL, 64 << 20, 8, Scope.INTRA)
    inter = cm.collective_s(CollectiveKind.ALL_TO_ALL, 64 << 20, 8, Scope.INTER)
    assert 0 < intra < inter


def test_expert_all_to_alls_across_nodes_count_the_ranks_on_each_node():
    """EP 16 over two nodes, 8 ranks on each: a layer's dispatch and combine are the cost
    model's spanning all-to-all with 8 ranks per node (each rank's own NIC carries only
    the share that leaves its node), not one rank per node; the difference in a layer's
    forward is exactly theirs, averaged over the MoE layers."""
    from placeflow.simulator.rolecosts import train_scopes

    cm = fitted_cost_model("h100-sxm")
    model = CATALOGUE["qwen3-30b-a3b"]
    layout = TrainLayout(d=16, e=16)
    _, ep, _, _, ep_rpn = train_scopes(0, 8, layout)
    assert (ep, ep_rpn) == (Scope.INTER, 8)
    tokens = 4 * 1024
    sent = compute.all_to_all_bytes(model, tokens)
    a2a = CollectiveKind.ALL_TO_ALL
    spread = cm.collective_s(a2a, sent, 16, Scope.INTER, ranks_per_node=8)
    single = cm.collective_s(a2a, sent, 16, Scope.INTER)
    assert spread < single

    def layer(ranks_per_node: int) -> float:
        return compute.layer_forward_kernels_s(
            cm, model, 1, 4, 1024, e=16, ep_scope=Scope.INTER, ep_ranks_per_node=ranks_per_node
        )

    moe_share = model.num_moe_layers / model.num_layers
    assert layer(1) - layer(8) == pytest.approx(moe_share * 2 * (single - spread), rel=1e-9)


def test_the_planner_searches_expert_parallelism_for_moe_roles_only():
    import dataclasses as dc

    from placeflow.cluster import PoolSpec
    from placeflow.hardware import HARDWARE
    from placeflow.planner.space import expert_parallel_options, parallelism_options
    from placeflow.workload import Role

    pool = PoolSpec(name="h100", gpu=HARDWARE["h100-sxm"], num_nodes=2, gpus_per_node=8)
    moe = CATALOGUE["qwen3-30b-a3b"]  # 128 experts
    assert expert_parallel_options(moe, 16) == [1, 2, 4, 8, 16]
    assert expert_parallel_options(moe, 12) == [1, 2, 4]
    few = dc.replace(moe, moe=dc.replace(moe.moe, num_experts=6, experts_per_token=2))
    assert expert_parallel_options(few, 8) == [1, 2]
    assert expert_parallel_options(CATALOGUE["qwen3-8b"], 16) == [1]
    options = parallelism_options(moe, Role.ACTOR, 16, pool)
    seen = {(o.train.t, o.train.p, o.train.e) for o in options}
    # Every (t, p) layout comes with every e that divides its d and the experts.
    for t, p, _ in seen:
        d = 16 // (t * p)
        assert {e for tt, pp, e in seen if (tt, pp) == (t, p)} == {
            e for e in (1, 2, 4, 8, 16) if d % e == 0
        }
    dense = parallelism_options(CATALOGUE["qwen3-8b"], Role.ACTOR, 16, pool)
    assert {o.train.e for o in dense} == {1}


def test_a_moe_search_returns_a_plan_the_simulator_accepts():
    from placeflow.cluster import ClusterSpec, PoolSpec
    from placeflow.hardware import HARDWARE
    from placeflow.planner import Status, plan_search
    from placeflow.planner.costtable import build_cost_table
    from placeflow.workload import Algorithm, BatchSpec, Role, Workload

    model = CATALOGUE["qwen3-30b-a3b"]
    pool = PoolSpec(name="h100", gpu=HARDWARE["h100-sxm"], num_nodes=2, gpus_per_node=8)
    cl = ClusterSpec(name="c", pools=(pool,))
    wl = Workload(
        name="w",
        algorithm=Algorithm.GRPO,
        models={Role.ACTOR: model, Role.REF: model},
        batch=BatchSpec(
            prompts_per_step=64, samples_per_prompt=2, prompt_len=256, response_len=256
        ),
        reward_function="arith",
    )
    costs = {"h100-sxm": fitted_cost_model("h100-sxm")}
    table = build_cost_table(wl, cl, costs)
    kept_e = {o.par.train.e for opts in table.options.values() for o in opts}
    assert kept_e > {1}  # expert-parallel layouts survive the Pareto pruning
    result = plan_search(cl, wl, costs, time_limit_s=30)
    assert result.status is Status.OPTIMAL
    assert result.best.estimate.feasible


def test_the_profiler_times_an_all_to_all_over_gloo():
    from placeflow.procs import free_port
    from placeflow.profiles.collectives import CollectiveJob, run_world

    job = CollectiveJob(
        device="cpu",
        dtype="fp32",
        world_size=2,
        port=free_port(),
        kinds=(CollectiveKind.ALL_TO_ALL,),
        sizes_bytes=(4096,),
        warmup=1,
        repeats=3,
        point_budget_s=0.1,
        init_timeout_s=30.0,
    )
    (timing,) = run_world(job, stall_timeout_s=120.0)
    assert timing.kind is CollectiveKind.ALL_TO_ALL and timing.num_bytes == 4096
    assert timing.timing.median_s > 0
