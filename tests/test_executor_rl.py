"""End-to-end RL on the executor (Ray, 4 logical CPU workers): GRPO learns, PPO runs, runs resume.

The oracles: a fixed-seed GRPO run's mean reward over its last steps clearly
exceeds its first steps; a resumed run writes the same metrics as an
uninterrupted one; the rollout's logprobs equal the trainer's for the same
tokens; a worker killed mid-run gives a RunError that names it and keeps the
last checkpoint.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
from pathlib import Path

import pytest
import ray

from placeflow.errors import SpecError
from placeflow.executor.engines.tp import TPImpl
from placeflow.executor.loop import RLLoop, StepRecord, check_executable, tokenizer_for
from placeflow.executor.run import RunConfig, RunError, read_metrics, run_plan
from placeflow.executor.timeline import union_s
from placeflow.plan import Plan, load_plan
from placeflow.workload import Role

PLANS = Path(__file__).resolve().parents[1] / "examples" / "plans"
TIMING = ("step_time_s", "tokens_per_s")


def _plan(name: str) -> Plan:
    return load_plan(PLANS / f"{name}.toml")


def _deterministic(metrics: list[dict]) -> list[dict]:
    """Metrics without the wall-clock fields."""
    return [
        {
            k: v
            for k, v in m.items()
            if k not in TIMING
            and k not in ("phases", "timeline")
            and not k.startswith(("timing_s/", "perf/"))  # verl's phase seconds, tokens/s/GPU
        }
        for m in metrics
    ]


@pytest.mark.parametrize("plan_name", ["grpo-tiny-cpu4-colocate", "grpo-tiny-cpu4-split"])
def test_grpo_raises_reward(ray_cluster: None, tmp_path: Path, plan_name: str) -> None:
    steps = 16
    result = run_plan(_plan(plan_name), tmp_path / "run", RunConfig(steps=steps, progress=False))
    rewards = [r.metrics["reward_mean"] for r in result.records]
    first, last = sum(rewards[:4]) / 4, sum(rewards[-4:]) / 4
    assert last > first + 0.08, f"reward did not rise: {rewards}"
    for rec in result.records:
        # The rollout sampled these tokens; the trainer (another TP layout) scores them alike.
        assert rec.metrics["logprob_diff_max"] < 1e-3
        assert set(rec.phases) >= {"reshard", "generate", "reward", "old_logprob", "actor_update"}
    lines = read_metrics(tmp_path / "run")
    assert [m["step"] for m in lines] == list(range(steps))
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["plan"]["content_hash"] == _plan(plan_name).content_hash()
    assert manifest["profile"]["name"] == "cpu" and manifest["profile"]["sha256"]
    assert {"torch", "ray", "python"} <= set(manifest["versions"])


def test_remax_raises_reward(ray_cluster: None, tmp_path: Path) -> None:
    steps = 24
    plan = _plan("remax-tiny-cpu4-split")
    result = run_plan(plan, tmp_path / "run", RunConfig(steps=steps, progress=False))
    rewards = [r.metrics["reward_mean"] for r in result.records]
    first, last = sum(rewards[:4]) / 4, sum(rewards[-4:]) / 4
    assert last > first + 0.04, f"reward did not rise: {rewards}"
    for rec in result.records:
        # The greedy baseline rollout ran and was scored; the update used the difference.
        assert {"generate", "generate_baseline", "reward", "actor_update"} <= set(rec.phases)
        assert math.isfinite(rec.metrics["baseline_reward_mean"])
        # The reference set scores the sampled batch while the actor's set generates the
        # greedy baseline (it is collected after the forward calls are launched).
        spans = {r["name"]: (r["start_s"], r["end_s"]) for r in rec.timeline}
        assert spans["ref_logprob"][0] < spans["generate_baseline"][1], spans


def test_safe_rlhf_raises_reward_and_logs_the_multiplier(ray_cluster: None, tmp_path: Path) -> None:
    plan = _plan("safe-rlhf-tiny-cpu4-split")
    result = run_plan(plan, tmp_path / "run", RunConfig(steps=16, progress=False))
    rewards = [r.metrics["reward_mean"] for r in result.records]
    assert sum(rewards[-4:]) / 4 > sum(rewards[:4]) / 4 + 0.05, rewards
    multipliers = [r.metrics["lagrange_multiplier"] for r in result.records]
    assert len(set(multipliers)) > 1 and min(multipliers) >= 0.0  # a dual step per step
    for rec in result.records:
        assert {"cost", "values", "cost_values", "critic_update"} <= set(rec.phases)
        for key in ("cost_mean", "value_loss", "cost_value_loss", "pg_loss"):
            assert math.isfinite(rec.metrics[key]), key


@pytest.mark.parametrize("plan_name", ["ppo-tiny-cpu4-colocate", "ppo-tiny-cpu4-split"])
def test_ppo_runs_with_finite_losses(ray_cluster: None, tmp_path: Path, plan_name: str) -> None:
    result = run_plan(_plan(plan_name), tmp_path / "run", RunConfig(steps=3, progress=False))
    for rec in result.records:
        for key in ("pg_loss", "value_loss", "kl_ref", "entropy", "grad_norm", "reward_mean"):
            assert math.isfinite(rec.metrics[key]), (key, rec.metrics)
        assert {"values", "critic_update", "ref_logprob"} <= set(rec.phases)
        assert rec.metrics["logprob_diff_max"] < 1e-3


@pytest.mark.parametrize(
    "plan_name", ["grpo-tiny-cpu4-split", "ppo-tiny-cpu4-colocate", "safe-rlhf-tiny-cpu4-split"]
)
def test_resume_is_identical(ray_cluster: None, tmp_path: Path, plan_name: str) -> None:
    plan = _plan(plan_name)
    whole = tmp_path / "whole"
    run_plan(plan, whole, RunConfig(steps=4, checkpoint_every=2, progress=False))
    parts = tmp_path / "parts"
    run_plan(plan, parts, RunConfig(steps=2, checkpoint_every=2, progress=False))
    resumed = run_plan(plan, parts, RunConfig(steps=4, resume=True, progress=False))
    assert resumed.first_step == 2
    assert _deterministic(read_metrics(parts)) == _deterministic(read_metrics(whole))


def test_concurrent_controller_matches_serial_order_and_overlaps(
    ray_cluster: None, tmp_path: Path
) -> None:
    # PPO split: ref and old logprobs on the actor's set while the critic's values run on
    # the other set, and the two updates at once. Launching them together changes when
    # they run, not what they compute: the same metrics as one call at a time.
    plan = _plan("ppo-tiny-cpu4-split")
    both = run_plan(plan, tmp_path / "overlap", RunConfig(steps=3, progress=False))
    serial = run_plan(plan, tmp_path / "serial", RunConfig(steps=3, progress=False, overlap=False))
    assert _deterministic(read_metrics(tmp_path / "overlap")) == _deterministic(
        read_metrics(tmp_path / "serial")
    )
    overlapped = 0
    for rec in both.records:
        spans = [r for r in rec.timeline if r["device_set"] is not None]
        assert {r["device_set"] for r in spans} == {0, 1}
        overlapped += any(
            a["device_set"] != b["device_set"]
            and a["start_s"] < b["end_s"]
            and b["start_s"] < a["end_s"]
            for a in spans
            for b in spans
        )
        # The measured phases add up to more than the time their calls cover: calls ran
        # at the same time. (Not more than the step time: the driver's launches and its
        # work between phases are in the step and in no phase, and on a loaded 2-core
        # host they can outweigh the overlap.)
        covered = union_s([(r["start_s"], r["end_s"]) for r in rec.timeline])
        assert sum(rec.phases.values()) > covered
    assert overlapped == len(both.records)
    for rec in serial.records:  # one call at a time: no two calls overlap
        spans = sorted((r["start_s"], r["end_s"]) for r in rec.timeline)
        assert all(a[1] <= b[0] + 1e-6 for a, b in itertools.pairwise(spans))
    line = read_metrics(tmp_path / "overlap")[0]
    assert {"name", "device_set", "role", "start_s", "end_s"} <= set(line["timeline"][0])


def test_one_step_off_overlaps_generation_with_training(ray_cluster: None, tmp_path: Path) -> None:
    # Trainer and generator one worker each: step k+1's rollout runs on the generator while
    # step k trains, then the update's weights follow it there. Every step after the first
    # trains on a batch one update old, with the ratio against the rollout's policy.
    plan = _plan("grpo-tiny-cpu2-async")
    steps = 16
    result = run_plan(plan, tmp_path / "run", RunConfig(steps=steps, progress=False))
    assert [r.metrics["staleness"] for r in result.records] == [0.0] + [1.0] * (steps - 1)
    for rec in result.records[1:]:
        gen = [r for r in rec.timeline if r["name"] == "generate"]
        update = [r for r in rec.timeline if r["name"] == "actor_update"]
        assert [r["device_set"] for r in gen] == [1] and [r["device_set"] for r in update] == [0]
        assert gen[0]["start_s"] < update[0]["end_s"] and update[0]["start_s"] < gen[0]["end_s"]
    rewards = [r.metrics["reward_mean"] for r in result.records]
    assert sum(rewards[-4:]) / 4 > sum(rewards[:4]) / 4 + 0.02, rewards


def test_one_step_off_rollout_is_timed_to_its_end(ray_cluster: None, tmp_path: Path) -> None:
    # Short responses and six epochs: the next step's rollout (a few ms) ends long before
    # the update (about a second here). It is collected only after the update; its
    # record must end when it ended, not when the driver collected it.
    plan = _plan("grpo-tiny-cpu2-async")
    wl = plan.workload
    batch = dataclasses.replace(wl.batch, response_len=4, ppo_epochs=6)
    plan = dataclasses.replace(plan, workload=dataclasses.replace(wl, batch=batch))
    result = run_plan(plan, tmp_path / "run", RunConfig(steps=3, progress=False))
    for rec in result.records[1:]:
        [gen] = [r for r in rec.timeline if r["name"] == "generate"]
        [update] = [r for r in rec.timeline if r["name"] == "actor_update"]
        assert gen["end_s"] < update["end_s"], rec.timeline
        # The weights follow the rollout on the generator: the receive starts at its end.
        receive = [r for r in rec.timeline if r["name"] == "weight_sync" and r["device_set"] == 1]
        assert receive and receive[0]["start_s"] >= gen["end_s"]


def test_resume_refuses_another_plan(ray_cluster: None, tmp_path: Path) -> None:
    run_plan(_plan("grpo-tiny-cpu4-split"), tmp_path, RunConfig(steps=1, progress=False))
    with pytest.raises(SpecError, match="this plan differs"):
        run_plan(_plan("grpo-tiny-cpu4-colocate"), tmp_path, RunConfig(steps=2, resume=True))
    with pytest.raises(SpecError, match="already holds a run"):
        run_plan(_plan("grpo-tiny-cpu4-split"), tmp_path, RunConfig(steps=2))


def test_worker_death_keeps_checkpoint(ray_cluster: None, tmp_path: Path) -> None:
    def kill_after_step_one(loop: RLLoop, rec: StepRecord) -> None:
        if rec.step == 1:
            ray.kill(loop.c.group(loop.plan.workload.roles[0]).workers[1], no_restart=True)

    with pytest.raises(RunError) as err:
        run_plan(
            _plan("grpo-tiny-cpu4-split"),
            tmp_path,
            RunConfig(steps=4, checkpoint_every=2, progress=False, timeout_s=60),
            after_step=kill_after_step_one,
        )
    message = str(err.value)
    assert "step 2" in message and "rank 1" in message and "--resume" in message
    assert (tmp_path / "checkpoints" / "step-000001" / "state.json").is_file()
    assert "step 1 is kept" in (tmp_path / "error.txt").read_text()


def test_generator_set_run_matches_colocated_run(
    ray_cluster: None, tmp_path: Path, cpu4_plans: dict[str, Plan]
) -> None:
    # The same actor (t2, one generation replica of tg2) generating on a set of its own:
    # the weight sync hands the generator exactly the weights the colocated reshard gives,
    # so with the same seeds both runs sample, score and update alike, step for step.
    apart = cpu4_plans["generator"]
    together = dataclasses.replace(apart, name="colocated", sets=(apart.sets[0],))
    a = run_plan(apart, tmp_path / "apart", RunConfig(steps=2, progress=False))
    b = run_plan(together, tmp_path / "together", RunConfig(steps=2, progress=False))
    for ra, rb in zip(a.records, b.records, strict=True):
        assert "weight_sync" in ra.phases and "reshard" not in ra.phases
        assert "reshard" in rb.phases and "weight_sync" not in rb.phases
        for key in ("reward_mean", "pg_loss", "grad_norm", "entropy", "response_len_mean"):
            assert ra.metrics[key] == rb.metrics[key], key
        # Each generator rank holds at most its shard plus one bucket (here the model fits
        # one bucket); the colocated reshard (tg = t here) hands the training shards over as
        # views, holding nothing extra.
        assert rb.metrics["reshard_peak_bytes_max"] == 0
        assert ra.metrics["weight_sync_peak_bytes_max"] <= 2 * ra.metrics["weight_sync_bytes_max"]
    lines = read_metrics(tmp_path / "apart")
    assert all(m["weight_sync_bytes_max"] > 0 for m in lines)


def _with_batch(plan: Plan, **batch: int) -> Plan:
    b = dataclasses.replace(plan.workload.batch, **batch)
    return dataclasses.replace(plan, workload=dataclasses.replace(plan.workload, batch=b))


def _with_micro_batch(plan: Plan, role: Role, micro_batch: int) -> Plan:
    par = dict(plan.parallelism)
    par[role] = dataclasses.replace(par[role], micro_batch=micro_batch)
    return dataclasses.replace(plan, parallelism=par)


def test_uneven_batches_train_as_one_batch(ray_cluster: None, tmp_path: Path) -> None:
    # 9 samples over the FSDP2 actor's 2 DP ranks: 5 and 4. With micro-batches of 4 the
    # first rank runs 2 micro-batches and the second 1 real one plus a padding one (FSDP's
    # collectives need the same count); with micro-batches of 8 both run one. The loss is
    # scaled by the global token count, so both take the same optimizer step.
    plan = _with_batch(_plan("ppo-tiny-cpu4-colocate"), prompts_per_step=9, mini_batches=1)
    check_executable(plan)
    small = run_plan(
        _with_micro_batch(plan, Role.ACTOR, 4), tmp_path / "a", RunConfig(steps=2, progress=False)
    )
    large = run_plan(
        _with_micro_batch(plan, Role.ACTOR, 8), tmp_path / "b", RunConfig(steps=2, progress=False)
    )
    for a, b in zip(small.records, large.records, strict=True):
        assert a.metrics["reward_mean"] == b.metrics["reward_mean"]
        assert a.metrics["grad_norm"] == pytest.approx(b.metrics["grad_norm"], rel=1e-4)
        assert math.isfinite(a.metrics["pg_loss"]) and math.isfinite(a.metrics["value_loss"])


def test_unexecutable_plans_are_refused_before_start() -> None:
    too_few = _with_batch(
        _plan("grpo-tiny-cpu4-split"), prompts_per_step=1, samples_per_prompt=2, mini_batches=2
    )
    with pytest.raises(SpecError, match="fewer than d=2 replicas x 2 mini-batches"):
        check_executable(too_few)
    with pytest.raises(SpecError, match="vocabulary of 32000"):
        tokenizer_for(_plan("ppo-7b-colocate-h100x16"))


def test_standalone_plan_with_a_reward_model_runs(
    ray_cluster: None, tmp_path: Path, cpu4_plans: dict[str, Plan]
) -> None:
    # GRPO scored by a (random-init) reward model on its own device: the role's path runs.
    result = run_plan(cpu4_plans["standalone"], tmp_path, RunConfig(steps=2, progress=False))
    for rec in result.records:
        assert "reward" in rec.phases and math.isfinite(rec.metrics["reward_mean"])
        assert "exact_match" not in rec.metrics


def test_single_update_grpo_skips_the_rescoring_phase(ray_cluster: None, tmp_path: Path) -> None:
    plan = _plan("grpo-tiny-cpu4-split")
    batch = dataclasses.replace(plan.workload.batch, mini_batches=1)
    plan = dataclasses.replace(plan, workload=dataclasses.replace(plan.workload, batch=batch))
    assert not plan.workload.recomputes_old_logprobs
    result = run_plan(plan, tmp_path, RunConfig(steps=2, progress=False))
    for rec in result.records:
        assert "old_logprob" not in rec.phases
        # The update's own forward checked the rollout's logprobs.
        assert rec.metrics["logprob_diff_max"] < 1e-3


def test_megatron_tp_path_trains_like_the_native_one(ray_cluster: None, tmp_path: Path) -> None:
    # The colocate plan trains the actor with t=2: megatron-core's layers must give the
    # same step as placeflow's own TP (same weights, same samples, same arithmetic).
    plan = _plan("grpo-tiny-cpu4-colocate")
    native = run_plan(plan, tmp_path / "n", RunConfig(steps=1, progress=False))
    mega = run_plan(
        plan, tmp_path / "m", RunConfig(steps=1, progress=False, tp_impl=TPImpl.MEGATRON)
    )
    (a,), (b,) = native.records, mega.records
    assert a.metrics["reward_mean"] == b.metrics["reward_mean"]  # same samples
    for key in ("pg_loss", "grad_norm", "entropy"):
        assert a.metrics[key] == pytest.approx(b.metrics[key], rel=1e-4, abs=1e-6), key
    assert b.metrics["logprob_diff_max"] < 1e-3
    manifest = json.loads((tmp_path / "m" / "manifest.json").read_text())
    assert manifest["tp_impl"] == "megatron"


def test_manifest_names_the_profile_each_used_pool_is_priced_with(tmp_path: Path) -> None:
    from placeflow.executor.run import write_manifest

    plan = _plan("ppo-7b-colocate-h100x16")
    # The pool prices its H100s with the A100 profile: the manifest must say so,
    # not name the pool's GPU.
    pool = dataclasses.replace(plan.cluster.pools[0], profile="a100-80gb")
    plan = dataclasses.replace(plan, cluster=dataclasses.replace(plan.cluster, pools=(pool,)))
    write_manifest(tmp_path, plan, RunConfig(steps=1, progress=False))
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["profile"]["name"] == "a100-80gb" and manifest["profile"]["sha256"]
    assert manifest["profiles"] == {pool.name: manifest["profile"]}
