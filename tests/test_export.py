"""`placeflow export`: a plan as verl overrides and OpenRLHF flags.

The oracles: verl's own config (its hydra defaults, from the installed `verl`
package, composed without importing verl) accepts every override, and the
composed values are the plan's: pool sizes, per-role tensor, pipeline, expert and
(implied) data-parallel sizes, rollout tensor size, micro-batches, optimizer
sharding and offload, recomputation, batch shape; what verl cannot place as the
plan does is named in the notes, role by role. OpenRLHF's flags are parsed by
the argument parser of the installed OpenRLHF's own `train_ppo_ray` (its source
run up to `parse_args`, without importing OpenRLHF), which refuses an unknown
flag or a value of the wrong type, and the parsed values are the plan's.

Both targets are installed without their dependencies (they pull a CUDA torch):
pip install --no-deps verl==0.9.1 openrlhf==0.11.2
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import os
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from placeflow.cli import main
from placeflow.export import Target, export_plan
from placeflow.export.verl import CONFIG_NAME
from placeflow.plan import OptimizerStep, Plan, load_plan
from placeflow.workload import Role

PLANS = Path(__file__).resolve().parents[1] / "examples" / "plans"
PPO_7B = ["ppo-7b-colocate-h100x16", "ppo-7b-split-h100x16", "ppo-7b-standalone-h100x16"]


def _verl_config(overrides: list[str]) -> Any:
    """verl's trainer config composed with `overrides`: hydra rejects a key that verl's
    schema lacks and a value of the wrong type."""
    pytest.importorskip("hydra")
    spec = importlib.util.find_spec("verl")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("verl is not installed (pip install --no-deps verl==0.9.1)")
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    config_dir = Path(next(iter(spec.submodule_search_locations))) / "trainer" / "config"
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(config_dir), version_base=None):
        return compose(config_name=CONFIG_NAME, overrides=overrides)


def _get(cfg: Any, key: str) -> Any:
    from omegaconf import OmegaConf

    return OmegaConf.select(cfg, key, throw_on_missing=True)


@pytest.mark.parametrize("name", PPO_7B)
def test_verl_export_composes_and_matches_the_plan(name: str) -> None:
    plan = load_plan(PLANS / f"{name}.toml")
    result = export_plan(plan, Target.VERL)
    cfg = _verl_config(list(result.arguments))
    actor_set = plan.sets[plan.set_of(Role.ACTOR)]
    assert _get(cfg, "trainer.nnodes") * _get(cfg, "trainer.n_gpus_per_node") == (
        actor_set.num_devices
    )
    for role, key in [
        (Role.ACTOR, "actor_rollout_ref.actor"),
        (Role.REF, "actor_rollout_ref.ref"),
        (Role.CRITIC, "critic"),
    ]:
        par = plan.parallelism[role]
        assert _get(cfg, f"{key}.megatron.tensor_model_parallel_size") == par.train.t, role
        assert _get(cfg, f"{key}.megatron.pipeline_model_parallel_size") == par.train.p, role
    _assert_optimizers_match(cfg, plan)
    # verl's data parallelism is the rest of the pool: the plan's d for every role there.
    pool = actor_set.num_devices
    for role, key in [
        (Role.ACTOR, "actor_rollout_ref.actor"),
        (Role.REF, "actor_rollout_ref.ref"),
        (Role.CRITIC, "critic"),
    ]:
        if plan.set_of(role) == plan.set_of(Role.ACTOR):
            t = _get(cfg, f"{key}.megatron.tensor_model_parallel_size")
            p = _get(cfg, f"{key}.megatron.pipeline_model_parallel_size")
            assert pool // (t * p) == plan.parallelism[role].train.d, role
    actor = plan.parallelism[Role.ACTOR]
    assert _get(cfg, "actor_rollout_ref.rollout.tensor_model_parallel_size") == actor.tg
    assert _get(cfg, "actor_rollout_ref.rollout.pipeline_model_parallel_size") == actor.pg
    assert _get(cfg, "actor_rollout_ref.model.enable_gradient_checkpointing") == actor.recompute
    assert _get(cfg, "critic.model.enable_gradient_checkpointing") == (
        plan.parallelism[Role.CRITIC].recompute
    )
    assert _get(cfg, "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu") == actor.micro_batch
    assert _get(cfg, "critic.ppo_micro_batch_size_per_gpu") == (
        plan.parallelism[Role.CRITIC].micro_batch
    )
    assert _get(cfg, "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu") == (
        plan.parallelism[Role.REF].micro_batch
    )
    b = plan.workload.batch
    assert _get(cfg, "data.train_batch_size") == b.prompts_per_step
    assert _get(cfg, "actor_rollout_ref.actor.ppo_mini_batch_size") * b.mini_batches == (
        b.prompts_per_step
    )
    assert _get(cfg, "algorithm.adv_estimator") == "gae"
    assert _get(cfg, "reward.reward_model.rollout.tensor_model_parallel_size") == (
        plan.parallelism[Role.REWARD].train.t
    )
    # The reward model: the actor's pool, or a pool of the reward set's size.
    reward_set = plan.sets[plan.set_of(Role.REWARD)]
    own_pool = _get(cfg, "reward.reward_model.enable_resource_pool")
    assert own_pool == (plan.set_of(Role.REWARD) != plan.set_of(Role.ACTOR))
    if own_pool:
        size = _get(cfg, "reward.reward_model.nnodes") * _get(
            cfg, "reward.reward_model.n_gpus_per_node"
        )
        assert size == reward_set.num_devices
    # Every role verl places otherwise than the plan is named in the notes.
    moved = {
        r
        for r in (Role.REF, Role.CRITIC)
        if plan.set_of(r) != plan.set_of(Role.ACTOR)  # verl: the actor's global pool
    }
    noted = {r for r in Role if any(n.startswith(f"{r}:") for n in result.unexpressed)}
    assert moved <= noted
    assert moved == noted - {Role.REWARD}


def _assert_optimizers_match(cfg: Any, plan: Plan) -> None:
    """ZeRO, expert parallelism and offload of the trained roles, as verl composed them."""
    for role, key, optim in [
        (Role.ACTOR, "actor_rollout_ref.actor", "actor_rollout_ref.actor.optim"),
        (Role.CRITIC, "critic", "critic.optim"),
    ]:
        if role not in plan.workload.models:
            continue
        par = plan.parallelism[role]
        assert _get(cfg, f"{key}.megatron.expert_model_parallel_size") == par.train.e, role
        assert _get(cfg, f"{key}.megatron.use_distributed_optimizer") == (par.zero >= 1), role
        host = par.offload_optimizer and par.optimizer_step is OptimizerStep.HOST
        assert _get(cfg, f"{key}.megatron.optimizer_offload") == (
            par.offload_optimizer and not host
        ), role
        overrides = _get(cfg, f"{optim}.override_optimizer_config") or {}
        assert overrides.get("optimizer_cpu_offload", False) == host, role
        if host:
            assert overrides["optimizer_offload_fraction"] == 1.0


def _with_offload(plan: Plan, step: OptimizerStep) -> Plan:
    parallelism = dict(plan.parallelism)
    for role in (Role.ACTOR, Role.CRITIC):
        parallelism[role] = dataclasses.replace(
            parallelism[role], offload_optimizer=True, optimizer_step=step
        )
    return dataclasses.replace(plan, parallelism=parallelism)


@pytest.mark.parametrize("step", list(OptimizerStep))
def test_verl_offload_follows_the_plan(step: OptimizerStep) -> None:
    """Optimizer offload with the update on the device (verl's optimizer_offload) or on
    the host (Megatron-core's CPU optimizer) composes and lands where the plan says."""
    plan = _with_offload(load_plan(PLANS / "ppo-7b-split-h100x16.toml"), step)
    cfg = _verl_config(list(export_plan(plan, Target.VERL).arguments))
    _assert_optimizers_match(cfg, plan)
    flags = _openrlhf_args(export_plan(plan, Target.OPENRLHF).arguments)
    assert getattr(flags, "ds.adam_offload") is True


def test_verl_rejects_an_unknown_key() -> None:
    """The compose check can fail: a key verl's schema lacks is refused."""
    from hydra.errors import ConfigCompositionException

    with pytest.raises(ConfigCompositionException):
        _verl_config(["actor_rollout_ref.actor.megatron.no_such_key=1"])


def _openrlhf_parser() -> argparse.ArgumentParser:
    """The argument parser of the installed OpenRLHF's `train_ppo_ray`: its source from
    `parser = argparse.ArgumentParser()` up to `parse_args`, run on its own (OpenRLHF's
    import needs deepspeed and a GPU build of vLLM)."""
    spec = importlib.util.find_spec("openrlhf")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("OpenRLHF is not installed (pip install --no-deps openrlhf==0.11.2)")
    path = Path(next(iter(spec.submodule_search_locations))) / "cli" / "train_ppo_ray.py"
    lines = path.read_text().splitlines()
    start = next(i for i, x in enumerate(lines) if "parser = argparse.ArgumentParser()" in x)
    end = next(i for i, x in enumerate(lines) if "args = parser.parse_args()" in x)
    body = "\n".join(x[4:] for x in lines[start:end])  # out of `if __name__ == "__main__":`
    scope: dict[str, Any] = {"argparse": argparse, "os": os, "datetime": datetime}
    exec(compile(body, str(path), "exec"), scope)
    parser: argparse.ArgumentParser = scope["parser"]
    parser.exit_on_error = False
    return parser


def _openrlhf_args(args: tuple[str, ...]) -> argparse.Namespace:
    """`args` parsed by OpenRLHF's parser: an unknown flag or a bad value fails the test."""
    ns, unknown = _openrlhf_parser().parse_known_args(list(args))
    assert not unknown, f"flags OpenRLHF's train_ppo_ray does not have: {unknown}"
    return ns


def test_openrlhf_parser_rejects_an_unknown_flag() -> None:
    """The parse check can fail: a flag train_ppo_ray lacks is refused."""
    with pytest.raises(AssertionError, match="--actor_num_nodes"):
        _openrlhf_args(("--actor_num_nodes", "1"))  # OpenRLHF < 0.10's spelling


@pytest.mark.parametrize(
    ("name", "colocation", "gpus"),
    [
        ("ppo-7b-colocate-h100x16", {"colocate_all"}, (16, 16, 16, 16)),
        (
            "ppo-7b-split-h100x16",
            {"colocate_actor_ref", "colocate_critic_reward"},
            (8, 8, 8, 8),
        ),
        ("ppo-7b-standalone-h100x16", set(), (8, 4, 2, 2)),
    ],
)
def test_openrlhf_flags_parse_and_match_the_plan(
    name: str, colocation: set[str], gpus: tuple[int, ...]
) -> None:
    plan = load_plan(PLANS / f"{name}.toml")
    args = _openrlhf_args(export_plan(plan, Target.OPENRLHF).arguments)
    flag = vars(args)
    assert {k for k in ("colocate_all", "colocate_actor_ref", "colocate_critic_reward")
            if flag[f"train.{k}"]} == colocation  # fmt: skip
    for role, n in zip(("actor", "critic", "ref", "reward"), gpus, strict=True):
        assert flag[f"{role}.num_nodes"] * flag[f"{role}.num_gpus_per_node"] == n, role
        assert n == plan.sets[plan.set_of(Role(role))].num_devices
    actor, critic = plan.parallelism[Role.ACTOR], plan.parallelism[Role.CRITIC]
    # One engine per tg GPUs of the devices that generate (the actor's).
    assert flag["vllm.num_engines"] * actor.tg == gpus[0]
    assert flag["vllm.tensor_parallel_size"] == actor.tg
    assert flag["ds.tensor_parallel_size"] == actor.train.t
    assert flag["ds.zero_stage"] == max(actor.zero, critic.zero)
    assert flag["train.micro_batch_size"] == actor.micro_batch
    assert flag["rollout.micro_batch_size"] == plan.parallelism[Role.REF].micro_batch
    assert flag["actor.gradient_checkpointing_enable"] == (actor.recompute or critic.recompute)
    assert flag["ds.adam_offload"] == (actor.offload_optimizer or critic.offload_optimizer)
    b = plan.workload.batch
    assert flag["train.batch_size"] == 256  # 1024 samples in 4 mini-batches
    assert flag["rollout.batch_size"] == b.prompts_per_step
    assert flag["rollout.n_samples_per_prompt"] == b.samples_per_prompt
    assert flag["data.max_len"] == b.prompt_len + b.response_len
    assert flag["rollout.max_new_tokens"] == b.response_len
    assert flag["train.max_epochs"] == b.ppo_epochs
    assert flag["algo.advantage.estimator"] == "gae"


@pytest.mark.parametrize("path", sorted(PLANS.glob("*.toml")), ids=lambda p: p.stem)
def test_every_example_plan_parses_as_openrlhf_flags(path: Path) -> None:
    plan = load_plan(path)
    args = vars(_openrlhf_args(export_plan(plan, Target.OPENRLHF).arguments))
    assert args["rollout.n_samples_per_prompt"] == plan.workload.batch.samples_per_prompt


def _plan_with_generator() -> Plan:
    return load_plan(PLANS / "grpo-tiny-cpu2-async.toml")


def test_generator_set_is_noted_for_verl_and_exact_for_openrlhf() -> None:
    plan = _plan_with_generator()
    assert plan.generator_set() is not None
    assert any("set of its own" in n for n in export_plan(plan, Target.VERL).unexpressed)
    notes = export_plan(plan, Target.OPENRLHF).unexpressed
    assert not any("generates on the actor's devices" in n for n in notes)


def test_cli_export_writes_a_script(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "verl.sh"
    assert (
        main(
            ["export", str(PLANS / "ppo-7b-split-h100x16.toml"), "--to", "verl", "--out", str(out)]
        )
        == 0
    )
    text = out.read_text()
    assert text.startswith("# placeflow plan 'ppo-7b-split-h100x16'")
    assert "python3 -m verl.trainer.main_ppo --config-name=ppo_megatron_trainer" in text
    assert "#   - critic: the plan runs it apart" in text
    assert main(["export", str(PLANS / "ppo-7b-colocate-h100x16.toml"), "--to", "openrlhf"]) == 0
    assert "--train.colocate_all" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exc:
        main(["export", str(PLANS / "ppo-7b-colocate-h100x16.toml"), "--to", "nope"])
    assert exc.value.code == 2


@pytest.mark.parametrize("path", sorted(PLANS.glob("*.toml")), ids=lambda p: p.stem)
def test_every_example_plan_composes_against_verl(path: Path) -> None:
    """GRPO, ReMax, Safe-RLHF and generator-set plans too: every override is one verl
    accepts, and what it cannot run (Safe-RLHF's cost model) is said."""
    plan = load_plan(path)
    result = export_plan(plan, Target.VERL)
    cfg = _verl_config(list(result.arguments))
    assert _get(cfg, "actor_rollout_ref.rollout.n") == plan.workload.batch.samples_per_prompt
    if plan.workload.algorithm.value == "safe-rlhf":
        assert any("safe-rlhf: verl has no such algorithm" in n for n in result.unexpressed)
        assert any(n.startswith("cost: verl has no cost model") for n in result.unexpressed)


@pytest.mark.parametrize("targets", ["all-linear", "attention"])
def test_lora_exports_compose_for_verl_and_parse_for_openrlhf(targets: str) -> None:
    """[lora] lands in verl's actor and critic model configs and in OpenRLHF's
    --ds.lora.* flags, with the rank, alpha and target modules of the workload."""
    from placeflow.lora import LoRATargets
    from placeflow.workload import LoRASpec

    plan = load_plan(PLANS / "ppo-7b-split-h100x16.toml")
    lora = LoRASpec(
        rank=16, alpha=32, targets=LoRATargets(targets), roles=(Role.ACTOR, Role.CRITIC)
    )
    plan = dataclasses.replace(plan, workload=dataclasses.replace(plan.workload, lora=lora))
    cfg = _verl_config(list(export_plan(plan, Target.VERL).arguments))
    modules = "all-linear" if targets == "all-linear" else ["q_proj", "k_proj", "v_proj", "o_proj"]
    for prefix in ("actor_rollout_ref.model", "critic.model"):
        assert _get(cfg, f"{prefix}.lora_rank") == 16
        assert _get(cfg, f"{prefix}.lora_alpha") == 32
        got = _get(cfg, f"{prefix}.target_modules")
        assert (got if isinstance(got, str) else list(got)) == modules
    flags = _openrlhf_args(export_plan(plan, Target.OPENRLHF).arguments)
    assert getattr(flags, "ds.lora.rank") == 16 and getattr(flags, "ds.lora.alpha") == 32
    # nargs="*": the words given, a list also for the single word all-linear.
    words = [modules] if isinstance(modules, str) else modules
    assert getattr(flags, "ds.lora.target_modules") == words
