"""Context parallelism (ring, Ulysses) and sequence parallelism, against hand-computed oracles.

A fake cost model stands in for a profile: a GEMM costs nothing but is recorded,
causal attention costs batch·seq²·heads picoseconds (twice for the backward), a
send/recv costs its bytes at 1 GB/s, every other collective nothing, and an
elementwise op its bytes at 1 TB/s; the collectives asked for are kept, so that
each new term can be read back and compared with numbers worked out by hand.
"""

from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path

import pytest

from placeflow.catalogue import get_model
from placeflow.cluster import load_cluster
from placeflow.errors import SpecError
from placeflow.executable import executable_problems
from placeflow.export import Target, export_plan
from placeflow.layout import CPKind, GenLayout, TrainLayout
from placeflow.models import ModelSpec
from placeflow.plan import load_plan, plan_from_dict, plan_to_dict
from placeflow.planner.space import LONG_SEQUENCE_TOKENS, parallelism_options
from placeflow.profiles.schema import CollectiveKind, Scope
from placeflow.reshard_plan import GeneratorLayout, TinyLlama, plan_disjoint, plan_reshard
from placeflow.simulator import compute, memory
from placeflow.simulator.simulate import cost_models_for, simulate
from placeflow.workload import Role

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "plans" / "grpo-qwen2.5-7b-32k-cp4-h100x16.toml"
ATTN_S_PER_UNIT = 1e-12  # seconds per batch·seq²·head of causal attention
SEND_BYTES_PER_S = 1e9
ELEMENTWISE_BYTES_PER_S = 1e12


class FakeCostModel:
    """GEMMs free (recorded), attention ∝ batch·seq²·heads, send/recv ∝ bytes, the rest
    of the collectives free (recorded), elementwise ∝ bytes."""

    device_kind = "cuda"
    host_local = False

    def __init__(self) -> None:
        self.memo: dict = {}
        self.gemms: list[tuple[int, int, int]] = []
        self.collectives: list[tuple[CollectiveKind, int, int, Scope]] = []
        self.attention: list[tuple[int, int, int, int, bool]] = []

    def remember(self, key, compute):
        if key not in self.memo:
            self.memo[key] = compute()
        return self.memo[key]

    def framework_s(self, kind: object, num_units: int = 1) -> None:
        return None

    def framework_units(self, kind: object) -> tuple[int, ...]:
        return ()  # (no framework entries)

    def gemm_s(self, m: int, n: int, k: int) -> float:
        self.gemms.append((m, n, k))
        return 0.0

    def collective_s(
        self, kind, num_bytes, world_size, scope, *, ranks_per_node=1, after_s=None
    ) -> float:
        if world_size <= 1 or num_bytes <= 0:
            return 0.0
        self.collectives.append((kind, int(num_bytes), world_size, scope))
        return num_bytes / SEND_BYTES_PER_S if kind is CollectiveKind.SEND_RECV else 0.0

    def attn_prefill_s(self, batch, seq, heads, kv_heads, head_dim, backward=False) -> float:
        self.attention.append((batch, seq, heads, kv_heads, backward))
        return batch * seq * seq * heads * ATTN_S_PER_UNIT * (2 if backward else 1)

    def elementwise_s(self, kind, num_bytes) -> float:
        return num_bytes / ELEMENTWISE_BYTES_PER_S


# 8 heads of 16, 2 KV heads, hidden 128: small enough to work out by hand.
TINY = ModelSpec(
    name="tiny-cp",
    num_layers=2,
    hidden_size=128,
    num_heads=8,
    num_kv_heads=2,
    ffn_hidden_size=256,
    vocab_size=512,
)


# --- layout -------------------------------------------------------------------


def test_rank_order_and_groups_by_hand():
    """rank = tp + t·(pp + p·(cp + c·dp)): t = 2, cp = 2, d = 2 on 8 ranks."""
    lay = TrainLayout(t=2, cp=2, d=2)
    assert lay.world_size == 8
    assert lay.num_weight_replicas == 4
    assert lay.rank(pp=0, tp=1, dp=1, cp=0) == 5
    assert lay.coords(6) == (0, 0, 1) and lay.cp_rank(6) == 1
    assert lay.tp_groups() == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert lay.cp_groups() == [[0, 2], [1, 3], [4, 6], [5, 7]]
    # Gradients are reduced over the d·cp ranks that hold the same weights.
    assert lay.dp_groups() == [[0, 2, 4, 6], [1, 3, 5, 7]]


@pytest.mark.parametrize(
    ("p", "t", "cp", "d"), list(itertools.product((1, 2), (1, 2), (1, 2, 4), (1, 3)))
)
def test_coordinates_are_a_bijection(p, t, cp, d):
    """Brute force: every (pp, tp, cp, dp) names one rank and coords give it back."""
    lay = TrainLayout(p=p, t=t, cp=cp, d=d)
    seen = set()
    for pp, tp, c, dp in itertools.product(range(p), range(t), range(cp), range(d)):
        r = lay.rank(pp=pp, tp=tp, dp=dp, cp=c)
        assert lay.coords(r) == (pp, tp, dp) and lay.cp_rank(r) == c
        seen.add(r)
    assert seen == set(range(lay.world_size))
    for groups in (lay.cp_groups(), lay.dp_groups(), lay.tp_groups(), lay.pp_groups()):
        assert sorted(r for g in groups for r in g) == list(range(lay.world_size))


def test_expert_groups_are_carved_out_of_the_weight_replicas():
    """As Megatron-core folds cp into the expert groups: t = 1, cp = 2, d = 2, e = 2 has
    4 weight replicas; an EP group is 2 consecutive replicas (a sample's cp ranks here),
    each expert shard held d·cp/e = 2 times."""
    lay = TrainLayout(cp=2, d=2, e=2)
    assert lay.ep_groups() == [[0, 1], [2, 3]]
    assert lay.expert_dp == 2 and lay.expert_dp_groups() == [[0, 2], [1, 3]]
    assert [lay.ep_rank(r) for r in range(4)] == [0, 1, 0, 1]


def test_generation_treats_cp_ranks_as_weight_replicas():
    """Each cp rank holds whole weights: colocated generation has d·cp·dg replicas and the
    micro-DP groups stay inside one weight replica."""
    gen = GenLayout(train=TrainLayout(t=4, cp=2, d=2), tg=2)
    assert gen.num_replicas == 2 * 2 * 2
    groups = gen.micro_dp_groups()
    assert sorted(r for g in groups for r in g) == list(range(16))
    for g in groups:
        assert len({r // 4 for r in g}) == 1  # one replica: 4 consecutive ranks


@pytest.mark.parametrize("replicas", [1, 2, 4])
def test_reshard_and_weight_sync_treat_cp_ranks_as_dp_replicas(replicas):
    """Rank order puts cp where dp would be for weights: a t = 2, cp = 2, d = 1 trainer
    has the same transfer plans, rank for rank, as t = 2, d = 2."""
    model = TinyLlama.from_model_spec(get_model("qwen2.5-0.5b"))
    cp, dp = TrainLayout(t=2, cp=2), TrainLayout(t=2, d=2)
    gen = GeneratorLayout(tg=1, replicas=replicas)
    assert plan_disjoint(model, cp, gen, 1 << 24).ranks == (
        plan_disjoint(model, dp, gen, 1 << 24).ranks
    )
    a = plan_reshard(model, GenLayout(train=cp, tg=1))
    b = plan_reshard(model, GenLayout(train=dp, tg=1))
    assert a.ranks == b.ranks and [g.ranks for g in a.groups] == [g.ranks for g in b.groups]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"sequence_parallel": True}, "needs t >= 2"),
        ({"cp": 0}, "training cp must be a positive integer"),
        ({"cp": 2, "e": 4, "d": 1}, "must divide data parallel d=1 times context parallel cp=2"),
    ],
)
def test_bad_layouts_are_refused(kwargs, message):
    with pytest.raises(SpecError, match=message):
        TrainLayout(**kwargs)


def _example_dict() -> dict:
    return plan_to_dict(load_plan(EXAMPLE))


def test_plan_keys_round_trip_and_stay_out_when_unused():
    plan = load_plan(EXAMPLE)
    actor = plan.parallelism[Role.ACTOR].train
    assert (actor.cp, actor.cp_kind, actor.sequence_parallel) == (4, CPKind.RING, True)
    data = plan_to_dict(plan)
    assert data["parallelism"]["actor"]["cp"] == 4
    again = plan_from_dict(data, "round trip", ROOT)
    assert again.parallelism == plan.parallelism
    assert again.content_hash() == plan.content_hash()
    # cp = 1 and SP off write no keys, so that older plans keep their content hash.
    plain = load_plan(ROOT / "examples" / "plans" / "ppo-7b-colocate-h100x16.toml")
    assert not {"cp", "cp_kind", "sequence_parallel"} & set(
        plan_to_dict(plain)["parallelism"]["actor"]
    )


def test_world_size_counts_cp():
    data = _example_dict()
    data["parallelism"]["actor"]["d"] = 4  # 1·2·4·4 = 32 on 16 devices
    with pytest.raises(SpecError, match=r"p\*t\*cp\*d = 1\*2\*4\*4 = 32 must equal the 16"):
        plan_from_dict(data, "bad", ROOT)


def test_ring_needs_the_sample_in_2cp_chunks():
    data = _example_dict()
    data["workload"]["batch"]["response_len"] = 32764  # 33,788 tokens: not a multiple of 8
    with pytest.raises(SpecError, match="cuts each sample into 8 equal chunks"):
        plan_from_dict(data, "bad", ROOT)


def test_ulysses_degree_must_divide_the_heads_per_tp_rank():
    """Qwen2.5-7B: 28 heads, 4 KV heads; t = 2 leaves 14 and 2: Ulysses 4 does not divide 14."""
    data = _example_dict()
    for role in ("actor", "ref"):
        data["parallelism"][role]["cp_kind"] = "ulysses"
    with pytest.raises(SpecError, match="ulysses cp=4 must divide the 14 attention heads"):
        plan_from_dict(data, "bad", ROOT)
    for role in ("actor", "ref"):  # Ulysses 2 divides 14 heads and its 2 KV heads
        data["parallelism"][role].update(cp=2, d=4)
    plan = plan_from_dict(data, "ok", ROOT)
    assert plan.parallelism[Role.ACTOR].train.cp_kind is CPKind.ULYSSES


def test_unknown_cp_kind_is_refused():
    data = _example_dict()
    data["parallelism"]["actor"]["cp_kind"] = "zigzag"
    with pytest.raises(SpecError, match="cp_kind"):
        plan_from_dict(data, "bad", ROOT)


# --- memory -------------------------------------------------------------------


def _simulate(plan):
    return simulate(plan, cost_models_for(plan))


def _activations(layout: TrainLayout, *, recompute: bool, seq: int = 128) -> float:
    return memory.training_activation_bytes(
        TINY, layout, 1, seq, 1, recompute=recompute, value_head=True
    )


def test_activations_by_hand_with_sp_and_cp():
    """Korthikanti et al. 2022, Table 2 without the score term; s·b·h = 128·1·128."""
    sbh = 128 * 128
    layers = 2
    # TP only: sbh·(10 + 24/t) per layer; TP + SP: sbh·34/t.
    assert _activations(TrainLayout(t=2), recompute=False) == layers * sbh * (10 + 12)
    sp = TrainLayout(t=2, sequence_parallel=True)
    assert _activations(sp, recompute=False) == layers * sbh * 17
    # Full recomputation keeps each layer's input, split over t with SP, plus one layer.
    assert _activations(TrainLayout(t=2), recompute=True) == layers * 2 * sbh + sbh * 22
    assert _activations(sp, recompute=True) == layers * 2 * sbh / 2 + sbh * 17
    # Context parallelism: a rank holds seq/cp tokens (logits included).
    for cp in (2, 4):
        for recompute in (False, True):
            whole = memory.training_activation_bytes(
                TINY, TrainLayout(t=2), 1, 128, 1, recompute=recompute, value_head=False
            )
            part = memory.training_activation_bytes(
                TINY, TrainLayout(t=2, cp=cp), 1, 128, 1, recompute=recompute, value_head=False
            )
            assert part == whole / cp


def test_zero_shards_over_d_times_cp():
    """Megatron's distributed optimizer shards over the data-parallel group with CP."""
    model = get_model("qwen2.5-7b")
    for zero in (0, 1, 2, 3):
        with_cp = memory.training_state_bytes_per_gpu(
            model, TrainLayout(t=2, cp=2, d=2), zero, value_head=False
        )
        as_dp = memory.training_state_bytes_per_gpu(
            model, TrainLayout(t=2, d=4), zero, value_head=False
        )
        assert with_cp == as_dp


# --- time ---------------------------------------------------------------------


def _attention_units(batch: int, seq: int, heads: int) -> float:
    return batch * seq * seq * heads * ATTN_S_PER_UNIT


def test_ring_attention_steps_by_hand():
    """cp = 4, t = 1, one sample of 1024 tokens: the rank's attention is 1/4 of the
    whole, in 4 steps; steps 1-3 wait for a K/V chunk of 256 tokens × 2 KV heads × 16
    × 2 (K, V) × 2 bytes = 32,768 bytes, 32.8 µs at 1 GB/s."""
    cm = FakeCostModel()
    split = compute.SequenceSplit(cp=4)
    got = compute.context_attention_s(cm, TINY, 1, 1, 1024, split, backward=False)
    rank_s = _attention_units(1, 1024, 8) / 4
    step_s = rank_s / 4
    chunk = 256 * 2 * 16 * 2 * 2
    assert cm.collectives == [(CollectiveKind.SEND_RECV, chunk, 2, Scope.INTRA)]
    send_s = chunk / SEND_BYTES_PER_S
    assert send_s > step_s  # communication bound here
    assert got == pytest.approx(step_s + 3 * send_s)
    # The backward sends K/V and their gradients: twice the bytes a step.
    cm = FakeCostModel()
    back = compute.context_attention_s(cm, TINY, 1, 1, 1024, split, backward=True)
    assert cm.collectives == [(CollectiveKind.SEND_RECV, 2 * chunk, 2, Scope.INTRA)]
    assert back == pytest.approx(2 * step_s + 3 * max(2 * step_s, 2 * send_s))


def test_ring_attention_hides_a_small_send():
    """A long sequence: each step's compute exceeds its send, so the attention costs
    exactly the rank's share, 1/cp of the whole."""
    cm = FakeCostModel()
    split = compute.SequenceSplit(cp=2)
    got = compute.context_attention_s(cm, TINY, 1, 1, 65536, split, backward=False)
    assert got == pytest.approx(_attention_units(1, 65536, 8) / 2)


def test_ulysses_all_to_alls_by_hand():
    """cp = 2, t = 1, 1024 tokens: attention over the whole sequence with 4 heads and 1
    KV head; before it an all-to-all of the rank's Q, K, V (512 tokens × (8 + 2·2)
    heads × 16 × 2 bytes) and after it one of the output (512 × 8 × 16 × 2)."""
    cm = FakeCostModel()
    split = compute.SequenceSplit(cp=2, kind=CPKind.ULYSSES, cp_scope=Scope.INTER)
    got = compute.context_attention_s(cm, TINY, 1, 1, 1024, split, backward=False)
    assert cm.attention == [(1, 1024, 4, 1, False)]
    assert sorted(cm.collectives) == sorted(
        [
            (CollectiveKind.ALL_TO_ALL, 512 * 12 * 16 * 2, 2, Scope.INTER),
            (CollectiveKind.ALL_TO_ALL, 512 * 8 * 16 * 2, 2, Scope.INTER),
        ]
    )
    assert got == pytest.approx(_attention_units(1, 1024, 4))


def test_layer_gemms_run_the_ranks_tokens():
    cm = FakeCostModel()
    compute.layer_forward_kernels_s(cm, TINY, 1, 2, 1024, split=compute.SequenceSplit(cp=4))
    assert {m for m, _, _ in cm.gemms} == {2 * 1024 // 4}


def test_sequence_parallel_collectives_and_norms_by_hand():
    """SP with t = 2: each all-reduce of the m·h activations becomes a reduce-scatter and
    an all-gather of the same bytes; norms and adds run on m/t tokens."""
    m, h, t = 256, 128, 2
    act = m * h * 2
    plain_cm, sp_cm = FakeCostModel(), FakeCostModel()
    plain = compute.layer_forward_kernels_s(plain_cm, TINY, t, 1, m)
    sp = compute.layer_forward_kernels_s(
        sp_cm, TINY, t, 1, m, split=compute.SequenceSplit(sequence_parallel=True)
    )
    assert plain_cm.collectives == [(CollectiveKind.ALL_REDUCE, act, t, Scope.INTRA)]
    assert sorted(sp_cm.collectives) == sorted(
        [
            (CollectiveKind.REDUCE_SCATTER, act, t, Scope.INTRA),
            (CollectiveKind.ALL_GATHER, act, t, Scope.INTRA),
        ]
    )
    # The fake prices only attention and elementwise ops (2 norms + 2 adds of act bytes;
    # SwiGLU's bytes are the same in both), so the difference is the norms' and adds'.
    assert plain - sp == pytest.approx(4 * (act - act // t) / ELEMENTWISE_BYTES_PER_S)


def test_no_split_is_the_default():
    a, b = FakeCostModel(), FakeCostModel()
    assert compute.layer_backward_kernels_s(a, TINY, 2, 1, 512) == (
        compute.layer_backward_kernels_s(b, TINY, 2, 1, 512, split=compute.NO_SPLIT)
    )
    assert a.collectives == b.collectives and a.gemms == b.gemms


# --- consumers ------------------------------------------------------------------


def test_cp_makes_the_example_fit_and_cp1_does_not():
    """The README's example: with cp = 4 the update fits an H100; the same layout with
    cp = 1 (d = 8) does not."""
    plan = load_plan(EXAMPLE)
    est = _simulate(plan)
    assert est.feasible
    lay = plan.parallelism[Role.ACTOR].train
    flat = dataclasses.replace(lay, cp=1, d=lay.d * lay.cp)
    pars = {
        role: dataclasses.replace(par, train=dataclasses.replace(par.train, cp=1, d=flat.d))
        for role, par in plan.parallelism.items()
    }
    assert not _simulate(dataclasses.replace(plan, parallelism=pars)).feasible


@pytest.mark.parametrize(
    ("name", "iteration_s"),
    [
        # `placeflow simulate --json` on main at 8a80a93, before context parallelism;
        # the two 7B plans since then plus the rollout's load of its generation weights
        # (`rolecosts.rollout_sync_cost`, 4.4 ms each: they were 114.13778083659184 and
        # 146.21238553190386); the colocated one since inter-node collectives priced on
        # the nodes a ring crosses and gradient-sized inter-node entries (its DP ring of
        # 16 over 2 nodes; it was 114.14219230556759); all three since each call carries
        # the fields it reads (PPO's updates 2 float fields, not 3: 114.14151565114747,
        # 146.2167970008796, 1760.502961903588 before); all three since the engine's
        # scalar all-reduces are priced (`callcosts.control_syncs_s`: 114.13274885769249,
        # 146.2035944673538, 1759.5513720231436 before); the two 7B plans since the
        # sampler's decode step has one op fewer (`compute.EXTRA_OPS_DECODE_STEP` 68 -> 67:
        # 114.13381305502281 and 146.20384724050348 before); the two 7B plans (t = 2)
        # since the TP all-reduce outside the layers is priced (`compute._tp_edge_s`,
        # `_logits_gather_s`: 114.10799972248236 and 146.16443333490406 before); the
        # two 7B plans since ZeRO-1's gradient sync is priced as the engine runs it, one
        # all-reduce (`callcosts._dp_sync_and_optimizer_s`: 114.23919713098772 and
        # 146.37872887410563 before); the two 7B plans since a frozen model's forward
        # agrees on no micro-batch count (`callcosts.forward_cost`, `trained`:
        # 114.52375004031963 and 146.40344003643128 before); the 13B plan since a ZeRO-3
        # trainer's gather before its weight sync to a generator set is priced
        # (`callcosts.zero3_gather_s` in `weight_sync_cost`: 1759.5516116556582 before).
        ("ppo-7b-colocate-h100x16", 114.52367399092218),
        ("ppo-7b-split-h100x16", 146.4034020735856),
        ("ppo-llama2-13b-openrlhf-a800x8", 1759.6800994973196),
    ],
)
def test_cp1_plans_keep_their_figures(name, iteration_s):
    """cp = 1 and sequence_parallel = false change nothing: the same floats as before."""
    est = _simulate(load_plan(ROOT / "examples" / "plans" / f"{name}.toml"))
    assert est.iteration_s == iteration_s


def test_executor_refuses_cp_and_sp_with_reasons():
    problems = executable_problems(load_plan(EXAMPLE))
    assert any("context parallel cp=4 (ring)" in p and "use cp = 1" in p for p in problems)
    assert any("set sequence_parallel = false" in p for p in problems)


def test_planner_offers_cp_and_sp_for_long_samples_only():
    model = get_model("qwen2.5-7b")
    pool = load_cluster(ROOT / "examples" / "clusters" / "h100x16.toml").pools[0]
    short = parallelism_options(model, Role.ACTOR, 8, pool, seq_len=LONG_SEQUENCE_TOKENS - 8)
    assert {(p.train.cp, p.train.sequence_parallel) for p in short} == {(1, False)}
    assert short == parallelism_options(model, Role.ACTOR, 8, pool)
    long = parallelism_options(model, Role.ACTOR, 8, pool, seq_len=33792)
    assert {p.train.cp for p in long} == {1, 2, 4, 8}
    assert {p.train.sequence_parallel for p in long if p.train.t > 1} == {False, True}
    assert not any(p.train.sequence_parallel for p in long if p.train.t == 1)
    for par in long:
        assert par.train.world_size == 8
    # Frozen roles are not offered context parallelism.
    ref = parallelism_options(model, Role.REF, 8, pool, seq_len=33792)
    assert {p.train.cp for p in ref} == {1}


def test_example_exports_compose_for_verl_and_parse_for_openrlhf():
    """The example's CP and SP land in verl 0.9.1's composed Megatron config (hydra
    rejects unknown keys) and in OpenRLHF 0.11.2's parsed flags."""
    from test_export import _get, _openrlhf_args, _verl_config

    plan = load_plan(EXAMPLE)
    cfg = _verl_config(list(export_plan(plan, Target.VERL).arguments))
    for key in ("actor_rollout_ref.actor.megatron", "actor_rollout_ref.ref.megatron"):
        assert _get(cfg, f"{key}.context_parallel_size") == 4
        assert _get(cfg, f"{key}.sequence_parallel") is True
    ns = _openrlhf_args(export_plan(plan, Target.OPENRLHF).arguments)
    flags = vars(ns)
    assert flags["ds.ring_attn_size"] == 4
    assert flags["ds.ring_attn_head_stride"] == 1
    assert flags["ds.packing_samples"] is True
    # A plan without SP writes sequence_parallel = false: verl's default is true.
    plain = load_plan(ROOT / "examples" / "plans" / "ppo-7b-colocate-h100x16.toml")
    cfg = _verl_config(list(export_plan(plain, Target.VERL).arguments))
    assert _get(cfg, "actor_rollout_ref.actor.megatron.sequence_parallel") is False
    assert _get(cfg, "actor_rollout_ref.actor.megatron.context_parallel_size") == 1


def test_ulysses_export_notes_what_the_targets_lack():
    data = _example_dict()
    for role in ("actor", "ref"):
        data["parallelism"][role].update(cp_kind="ulysses", cp=2, d=4)
    plan = plan_from_dict(data, "ulysses", ROOT)
    verl = export_plan(plan, Target.VERL)
    assert any("ulysses_sequence_parallel_size belongs to its FSDP" in n for n in verl.unexpressed)
    openrlhf = export_plan(plan, Target.OPENRLHF)
    assert any("ring attention only" in n for n in openrlhf.unexpressed)


def test_example_simulates_as_the_readme_quotes():
    """The README quotes `placeflow simulate --json` of the example (cp = 4)."""
    est = _simulate(load_plan(EXAMPLE))
    readme = (ROOT / "README.md").read_text()
    assert f"iteration {est.iteration_s:.3f} s" in readme


def test_published_cp_row_is_expressed_with_cp():
    """NeMo RL's Qwen3-235B on-policy row (T: TP 2, CP 2, EP 16, PP 8) as a plan with
    ring cp = 2 and EP carved out of d·cp; it simulates as feasible."""
    plan = load_plan(ROOT / "examples" / "published" / "nemo-rl-v0.6-qwen3-235b-a22b-on.toml")
    actor = plan.parallelism[Role.ACTOR].train
    assert (actor.cp, actor.d, actor.e, actor.expert_dp) == (2, 4, 2, 4)
    assert plan.parallelism[Role.REF].train.cp == 2
    assert _simulate(plan).feasible
