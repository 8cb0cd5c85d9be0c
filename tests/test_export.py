"""`placeflow export`: a plan as verl overrides and OpenRLHF flags.

The oracles: verl's own config (its hydra defaults, from the installed `verl`
package, composed without importing verl) accepts every override, and the
composed values are the plan's: pool sizes, per-role tensor and pipeline sizes,
rollout tensor size, micro-batches, batch shape; what verl cannot place as the
plan does is named in the notes, role by role. OpenRLHF's flags are checked
against hand-read values of the same plans.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

from placeflow.cli import main
from placeflow.export import Target, export_plan
from placeflow.export.verl import CONFIG_NAME
from placeflow.plan import Plan, load_plan
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
    actor = plan.parallelism[Role.ACTOR]
    assert _get(cfg, "actor_rollout_ref.rollout.tensor_model_parallel_size") == actor.tg
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


def test_verl_rejects_an_unknown_key() -> None:
    """The compose check can fail: a key verl's schema lacks is refused."""
    from hydra.errors import ConfigCompositionException

    with pytest.raises(ConfigCompositionException):
        _verl_config(["actor_rollout_ref.actor.megatron.no_such_key=1"])


def _flags(args: tuple[str, ...]) -> dict[str, str | bool]:
    out: dict[str, str | bool] = {}
    items = list(args)
    while items:
        flag = items.pop(0)
        out[flag] = items.pop(0) if items and not items[0].startswith("--") else True
    return out


@pytest.mark.parametrize(
    ("name", "colocation", "gpus"),
    [
        ("ppo-7b-colocate-h100x16", {"--colocate_all_models"}, (16, 16, 16, 16)),
        (
            "ppo-7b-split-h100x16",
            {"--colocate_actor_ref", "--colocate_critic_reward"},
            (8, 8, 8, 8),
        ),
        ("ppo-7b-standalone-h100x16", set(), (8, 4, 2, 2)),
    ],
)
def test_openrlhf_flags(name: str, colocation: set[str], gpus: tuple[int, ...]) -> None:
    plan = load_plan(PLANS / f"{name}.toml")
    flags = _flags(export_plan(plan, Target.OPENRLHF).arguments)
    assert {f for f in flags if f.startswith("--colocate")} == colocation
    for role, n in zip(("actor", "critic", "ref", "reward"), gpus, strict=True):
        nodes, per_node = (
            int(flags[f"--{role}_num_nodes"]),
            int(flags[f"--{role}_num_gpus_per_node"]),
        )
        assert nodes * per_node == n, role
    actor = plan.parallelism[Role.ACTOR]
    # One engine per tg GPUs of the devices that generate (the actor's).
    assert int(flags["--vllm_num_engines"]) * actor.tg == gpus[0]
    assert flags["--vllm_tensor_parallel_size"] == str(actor.tg)
    assert flags["--micro_train_batch_size"] == str(actor.micro_batch)
    assert flags["--train_batch_size"] == "256"  # 1024 samples in 4 mini-batches


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
    assert "--colocate_all_models" in capsys.readouterr().out
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
