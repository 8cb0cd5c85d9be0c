"""A mixture of experts in the executor: its reshard plan and gloo reshard against hand-sliced
oracles, Qwen3's QK-norm and head_dim and the load-balancing loss against direct formulas, and
a tiny MoE GRPO run with expert parallelism e = 2 on Ray CPU workers (reward rises; its first
step equals the e = 1 run's)."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from reshard_worlds import Method, ReshardJob, full_params, run_world
from test_reshard import oracle

from placeflow.errors import SpecError
from placeflow.executor.engines.hf import to_canonical, to_hf
from placeflow.executor.engines.transformer import Arch, Transformer, random_full, rms_norm
from placeflow.executor.loop import check_executable
from placeflow.executor.run import RunConfig, run_plan
from placeflow.layout import GenLayout, TrainLayout
from placeflow.models import model_from_hf_config
from placeflow.plan import Plan, load_plan
from placeflow.procs import free_port
from placeflow.reshard_plan import TinyLlama, plan_reshard, train_shard

ROOT = Path(__file__).resolve().parents[1]
PLAN = ROOT / "examples" / "plans" / "grpo-tiny-moe-ep2-cpu.toml"
TINY_MOE = ROOT / "examples" / "models" / "tiny-moe" / "config.json"

# Layer 0 dense, layers 1-3 with 4 experts (ffn 24) and a shared expert (ffn 16).
MOE = TinyLlama(num_layers=4, hidden=32, num_heads=4, num_kv_heads=2, ffn=48, vocab=64,
                num_experts=4, expert_ffn=24, shared_ffn=16, dense_layers=1)  # fmt: skip
SEED = 3


# --- the reshard plan and its execution -------------------------------------------


def test_each_expert_is_held_by_one_ep_rank_per_replica_group():
    train = TrainLayout(d=4, e=2)
    for p in MOE.params():
        holders = [r for r in range(train.world_size) if train_shard(MOE, p, train, r)]
        if p.expert < 0:
            assert holders == [0, 1, 2, 3], p.name
        else:  # experts 0-1 on EP rank 0 (dp 0 and 2), experts 2-3 on EP rank 1 (dp 1 and 3)
            assert holders == ([0, 2] if p.expert < 2 else [1, 3]), p.name
    names = {p.name for p in MOE.params()}
    assert "layers.0.gate_up" in names and "layers.1.gate_up" not in names
    want = {"layers.1.moe.router", "layers.1.moe.shared_gate_up", "layers.3.moe.experts.3.down"}
    assert want <= names


def test_expert_bytes_by_hand():
    """t = tg = 1, e = 2: dense weights stay, each rank receives the other half of the experts."""
    gen = GenLayout(train=TrainLayout(d=2, e=2))
    plan = plan_reshard(MOE, gen)
    expert_numel = 3 * 4 * 3 * 24 * 32  # MoE layers x experts x (gate, up, down) x ffn x hidden
    for rank in plan.ranks:
        assert rank.received_sharded_bytes == 4 * expert_numel // 2
        assert rank.received_replicated_bytes == 0
        assert rank.gen_shard_bytes == MOE.total_bytes()  # every expert, every weight
    assert [g.ranks for g in plan.expert_groups] == [(0, 1)]
    dense = dataclasses.replace(MOE, num_experts=0, expert_ffn=0, shared_ffn=0, dense_layers=0)
    assert plan_reshard(dense, gen).expert_groups == ()
    assert all(r.wire_bytes == 0 for r in plan_reshard(dense, gen).ranks)


def test_experts_must_split_over_the_ep_ranks():
    with pytest.raises(SpecError, match="must divide the 4 experts"):
        plan_reshard(MOE, GenLayout(train=TrainLayout(d=3, e=3)))


CASES = [
    GenLayout(train=TrainLayout(d=4, e=2)),
    GenLayout(train=TrainLayout(d=4, e=4)),
    GenLayout(train=TrainLayout(t=2, d=2, e=2), tg=1),
    GenLayout(train=TrainLayout(t=2, d=2, e=2), tg=2),
    GenLayout(train=TrainLayout(p=2, d=2, e=2), pg=1),
]


def test_expert_reshard_gathers_every_expert_bit_exact():
    job = ReshardJob(model=MOE, cases=tuple(CASES), methods=(Method.PLANNED, Method.NAIVE),
                     world_size=4, port=free_port(), seed=SEED, return_params=True)  # fmt: skip
    results = run_world(job)
    full = full_params(MOE, SEED)
    assert len(results) == len(CASES) * 2 * 4
    for res in results:
        gen = CASES[res.case]
        want = oracle(MOE, full, gen, res.rank)
        assert res.gen_params is not None
        got = {k: torch.from_numpy(v) for k, v in res.gen_params.items()}
        assert got.keys() == want.keys()
        for name, w in want.items():
            assert torch.equal(got[name], w), (gen, res.method, res.rank, name)
        if res.method is Method.PLANNED:
            assert res.moved_bytes == plan_reshard(MOE, gen).ranks[res.rank].wire_bytes


# --- the model's math ---------------------------------------------------------------


def test_qk_norm_and_head_dim_match_a_direct_computation():
    """Qwen3 attention written out: per-head RMSNorm of q and k before RoPE, heads of head_dim
    with heads x head_dim != hidden."""
    spec = dataclasses.replace(model_from_hf_config(TINY_MOE), moe=None, head_dim=48, num_layers=1)
    arch = Arch.of(spec)
    model = Transformer(arch)
    model.load_full(random_full(model.arch, 0))
    with torch.no_grad():
        layer = model.layers["0"]
        layer.q_norm.copy_(torch.linspace(0.5, 1.5, 48))
        layer.k_norm.copy_(torch.linspace(1.5, 0.5, 48))
    ids = torch.randint(0, 256, (1, 5), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(1, 5, dtype=torch.bool)
    got = model(ids, mask)

    eps, hd, h = spec.norm_eps, 48, spec.hidden_size
    x = model.embed[ids[0]]
    a = rms_norm(x, layer.input_norm, eps)
    q, k, v = (a @ layer.qkv.t()).split((4 * hd, 2 * hd, 2 * hd), dim=-1)
    pos = torch.arange(5).float()[:, None]
    inv = 1.0 / (spec.rope_theta ** (torch.arange(0, hd, 2).float() / hd))
    ang = torch.cat((pos * inv, pos * inv), dim=-1)
    heads = []
    for i in range(4):
        qi = rms_norm(q[:, i * hd : (i + 1) * hd], layer.q_norm, eps)
        j = i // 2  # grouped-query attention: two query heads per KV head
        ki = rms_norm(k[:, j * hd : (j + 1) * hd], layer.k_norm, eps)
        vi = v[:, j * hd : (j + 1) * hd]

        def rot(t: torch.Tensor) -> torch.Tensor:
            return t * ang.cos() + torch.cat((-t[:, hd // 2 :], t[:, : hd // 2]), -1) * ang.sin()

        scores = rot(qi) @ rot(ki).t() / math.sqrt(hd)
        scores = scores.masked_fill(torch.ones(5, 5).triu(1).bool(), float("-inf"))
        heads.append(torch.softmax(scores, -1) @ vi)
    x = x + torch.cat(heads, -1) @ layer.o_proj.t()
    m = rms_norm(x, layer.post_norm, eps)
    gate, up = (m @ layer.gate_up.t()).split(spec.ffn_hidden_size, -1)
    x = x + (F.silu(gate) * up) @ layer.down_proj.t()
    want = rms_norm(x, model.norm, eps) @ model.lm_head.t()
    assert h != 4 * hd
    torch.testing.assert_close(got[0], want, rtol=1e-5, atol=1e-5)


def test_load_balancing_loss_is_hf_formula():
    """Against HF's load_balancing_loss_func written out: layers concatenated, padding masked."""
    spec = model_from_hf_config(TINY_MOE)
    model = Transformer(Arch.of(spec))
    model.load_full(random_full(model.arch, 0))
    with torch.no_grad():  # a router that prefers some experts, so the loss is not its minimum
        for layer in model.layers.values():
            layer.moe.router.normal_(0, 0.5, generator=torch.Generator().manual_seed(2))
    ids = torch.randint(0, 256, (3, 6), generator=torch.Generator().manual_seed(4))
    mask = torch.ones(3, 6, dtype=torch.bool)
    mask[0, :2] = mask[2, :4] = False  # left padding
    probs_by_layer = []
    hooks = [
        layer.moe.register_forward_hook(
            lambda mod, args, out: probs_by_layer.append(mod.route(args[0].reshape(-1, 128))[2])
        )
        for layer in model.layers.values()
    ]
    model(ids, mask)
    for h in hooks:
        h.remove()
    got = model.aux_loss()
    e, k = 4, 2
    probs = torch.cat(probs_by_layer)  # (layers * tokens, experts)
    real = mask.reshape(-1).repeat(len(probs_by_layer)).float()
    chosen = F.one_hot(probs.topk(k, dim=-1).indices, e).float()  # (rows, k, experts)
    tokens_per_expert = (chosen * real[:, None, None]).sum(0) / real.sum()
    router_prob = (probs * real[:, None]).sum(0) / real.sum()
    want = e * (tokens_per_expert * router_prob[None]).sum()
    assert got is not None
    torch.testing.assert_close(got, want)
    assert float(got.detach()) > k  # an unbalanced router costs more than the balanced k


@pytest.mark.parametrize(
    ("moe", "norm_topk_prob", "published_keys"),
    [(False, True, True), (True, True, True), (True, False, False)],
    ids=["qwen3", "qwen3-moe", "qwen3-moe-unnormalised-saved-keys"],
)
def test_logits_match_transformers_qwen3(
    moe: bool, norm_topk_prob: bool, published_keys: bool, tmp_path: Path
) -> None:
    """transformers' own Qwen3 / Qwen3-MoE (every weight randomised, norms too): QK-norm,
    head_dim 16 on hidden 48 with 4 heads, a dense first layer, top-2 of 4 experts,
    with and without renormalised top-k weights; the config read as Qwen publishes it
    (`num_experts`) and as transformers 5 saves it (`num_local_experts`, and no
    `norm_topk_prob` key when it is the default false)."""
    transformers = pytest.importorskip("transformers")
    common = dict(
        vocab_size=96, hidden_size=48, intermediate_size=40, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6,
        max_position_embeddings=64, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 5000.0},
        attn_implementation="eager", dtype="float32",
    )  # fmt: skip
    if moe:
        cfg = transformers.Qwen3MoeConfig(
            **common, moe_intermediate_size=24, num_experts=4, num_experts_per_tok=2,
            norm_topk_prob=norm_topk_prob, mlp_only_layers=[0],
        )  # fmt: skip
        hf = transformers.Qwen3MoeForCausalLM(cfg)
    else:
        hf = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**common))
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for name, p in hf.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            p.copy_(1 + 0.1 * noise if "norm" in name else 0.1 * noise)
    hf.eval()
    hf.config.save_pretrained(tmp_path)
    cfg_path = tmp_path / "config.json"
    saved = json.loads(cfg_path.read_text())
    if moe and published_keys:  # Qwen's published configs say num_experts
        saved["num_experts"] = saved.pop("num_local_experts")
    elif moe:
        saved.pop("num_experts", None)
        if not norm_topk_prob:  # a config that leaves it out means HF's default, false
            saved.pop("norm_topk_prob", None)
    cfg_path.write_text(json.dumps(saved))
    spec = model_from_hf_config(tmp_path)
    assert spec.qk_norm and spec.head_dim == 16 and (spec.moe is not None) is moe
    assert spec.moe is None or spec.moe.norm_topk_prob is norm_topk_prob
    weights = TinyLlama.from_model_spec(spec)
    ours = Transformer(Arch.of(spec))
    state = dict(hf.state_dict())
    ours.load_shards(to_canonical(state, weights))
    back = to_hf(to_canonical(state, weights), weights)
    assert back.keys() == state.keys()
    assert all(torch.equal(back[k], v) for k, v in state.items())
    gen_ids = torch.Generator().manual_seed(6)
    ids = torch.randint(0, 96, (3, 9), generator=gen_ids)
    mask = torch.ones(3, 9, dtype=torch.bool)
    mask[1, :3] = mask[2, :5] = False
    positions = (mask.long().cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        want = hf(input_ids=ids, attention_mask=mask.long(), position_ids=positions).logits
        got = ours.eval()(ids, mask)
    torch.testing.assert_close(got[mask], want[mask], atol=1e-5, rtol=0)


# --- the executor ---------------------------------------------------------------------


def test_moe_parallelism_the_engines_do_not_run_is_refused():
    plan = load_plan(PLAN)

    def with_actor(**changes: object) -> Plan:
        par = plan.parallelism
        actor = next(r for r in par if r.value == "actor")
        train = dataclasses.replace(par[actor].train, **{
            k: v for k, v in changes.items() if k in ("t", "p", "d", "e")
        })  # fmt: skip
        rest = {k: v for k, v in changes.items() if k not in ("t", "p", "d", "e")}
        new = dataclasses.replace(par[actor], train=train, **rest)
        return dataclasses.replace(plan, parallelism={**par, actor: new})

    check_executable(plan)
    with pytest.raises(SpecError, match="expert TP"):
        check_executable(with_actor(t=2, d=1, e=1))
    with pytest.raises(SpecError, match="ZeRO stage 1 with expert parallel e=2"):
        check_executable(with_actor(zero=1))


def _run(plan: Plan, path: Path, steps: int) -> list[dict[str, float]]:
    return [r.metrics for r in run_plan(plan, path, RunConfig(steps=steps, progress=False)).records]


def test_tiny_moe_grpo_with_ep2_raises_reward(ray_cluster: None, tmp_path: Path) -> None:
    metrics = _run(load_plan(PLAN), tmp_path / "run", 16)
    rewards = [m["reward_mean"] for m in metrics]
    first, last = sum(rewards[:4]) / 4, sum(rewards[-4:]) / 4
    assert last > first + 0.08, f"reward did not rise: {rewards}"
    for m in metrics:
        # The rollout (all experts on each worker, after the expert all-gather) samples
        # what the EP = 2 trainer scores.
        assert m["logprob_diff_max"] < 1e-3
        assert 2.0 <= m["aux_loss"] < 4.0  # top-2 of 4: k when balanced, E*k at worst


def test_ep2_first_step_equals_ep1(ray_cluster: None, tmp_path: Path) -> None:
    ep2 = load_plan(PLAN)
    single = {
        role: dataclasses.replace(par, train=dataclasses.replace(par.train, e=1))
        for role, par in ep2.parallelism.items()
    }
    ep1 = dataclasses.replace(ep2, parallelism=single)
    a = _run(ep2, tmp_path / "ep2", 1)[0]
    b = _run(ep1, tmp_path / "ep1", 1)[0]
    assert a["reward_mean"] == b["reward_mean"]  # the same rollout
    for key in ("pg_loss", "aux_loss", "grad_norm", "entropy"):
        assert a[key] == pytest.approx(b[key], rel=1e-5, abs=1e-7), key


def test_rehearsal_stands_in_a_tiny_mixture_of_experts():
    from placeflow.catalogue import CATALOGUE
    from placeflow.executor.rehearsal import rehearsal_plan
    from placeflow.workload import Role

    plan = load_plan(ROOT / "examples" / "plans" / "ppo-7b-colocate-h100x16.toml")
    big = CATALOGUE["qwen3-30b-a3b"]
    workload = dataclasses.replace(plan.workload, models={r: big for r in plan.workload.models})
    actor = plan.parallelism[Role.ACTOR]
    moe_actor = dataclasses.replace(actor, train=dataclasses.replace(actor.train, e=4))
    plan = dataclasses.replace(
        plan, workload=workload, parallelism={**plan.parallelism, Role.ACTOR: moe_actor}
    )
    tiny = rehearsal_plan(plan).workload.models[Role.ACTOR]
    assert tiny.moe is not None and tiny.qk_norm
    assert tiny.moe.num_experts % 4 == 0 and tiny.moe.experts_per_token == 2
    assert tiny.num_params() < 10**7


def test_generator_set_receives_every_expert(ray_cluster: None, tmp_path: Path) -> None:
    """The weight sync to a generator set of its own: each expert from the EP rank holding it."""
    from placeflow.plan import plan_from_dict

    workload = {
        "name": "grpo-tiny-moe",
        "algorithm": "grpo",
        "reward_function": "arith",
        "models": {"actor": str(TINY_MOE), "ref": str(TINY_MOE)},
        "batch": {"prompts_per_step": 8, "samples_per_prompt": 4, "prompt_len": 16,
                  "response_len": 16},
    }  # fmt: skip
    plan = plan_from_dict(
        {
            "name": "grpo-tiny-moe-generator",
            "cluster": "../clusters/cpu4.toml",
            "workload": workload,
            "sets": [
                {"roles": ["actor", "ref"], "pool": "cpu", "first_device": 0, "num_devices": 2},
                {
                    "roles": ["actor"],
                    "pool": "cpu",
                    "first_device": 2,
                    "num_devices": 2,
                    "generator": True,
                },
            ],
            "parallelism": {"actor": {"d": 2, "e": 2, "zero": 0}, "ref": {"d": 2}},
        },
        "generator",
        PLAN.parent,
    )
    metrics = _run(plan, tmp_path / "run", 2)
    # Step 1 samples with weights synced after an update: the trainer scores them alike.
    assert all(m["logprob_diff_max"] < 1e-3 for m in metrics)
