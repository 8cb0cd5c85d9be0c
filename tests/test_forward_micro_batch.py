"""forward_micro_batch: forward-only calls cut into their own micro-batches, in the plan
file, the simulator and the exports (the executor's engines: tests/test_pipeline.py)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from placeflow.errors import SpecError
from placeflow.export import Target, export_plan
from placeflow.layout import TrainLayout
from placeflow.plan import RoleParallelism, load_plan, save_plan
from placeflow.profiles.registry import fitted_cost_model
from placeflow.simulator import callcosts
from placeflow.workload import Role

ROOT = Path(__file__).resolve().parents[1]
PLAN = ROOT / "examples" / "plans" / "ppo-7b-split-h100x16.toml"


def test_forward_calls_use_their_own_micro_batch() -> None:
    """64 samples on d = 2 ranks: 32 per rank, in 4 forward micro-batches of 8 (not 16 of
    2); a forward's transient memory (one layer's buffers and the logits) grows with the
    micro-batch's tokens: 4 times."""
    cm = fitted_cost_model("a100-80gb")
    model = load_plan(PLAN).workload.models[Role.ACTOR]
    train = RoleParallelism(train=TrainLayout(p=2, d=2), micro_batch=2)
    fwd = dataclasses.replace(train, forward_micro_batch=8)
    assert (train.forward_mb, fwd.forward_mb) == (2, 8)
    small = callcosts.forward_cost(cm, model, train, 64, 512, value_head=False, trained=True)
    large = callcosts.forward_cost(cm, model, fwd, 64, 512, value_head=False, trained=True)
    assert (small.detail["micro_batches"], large.detail["micro_batches"]) == (16, 4)
    assert large.detail["micro_batch"] == 8
    assert large.transient_bytes == pytest.approx(4 * small.transient_bytes)
    # Training keeps its own micro-batch.
    update = callcosts.train_cost(
        cm, model, fwd, 64, 512, 1, 1, callcosts.Scope.INTRA, value_head=False
    )
    assert update.detail["micro_batch"] == 2


def test_forward_micro_batch_in_plan_files_and_exports(tmp_path: Path) -> None:
    plan = load_plan(PLAN)
    par = {**plan.parallelism}
    par[Role.ACTOR] = dataclasses.replace(par[Role.ACTOR], forward_micro_batch=16)
    par[Role.REF] = dataclasses.replace(par[Role.REF], forward_micro_batch=32)
    plan = dataclasses.replace(plan, parallelism=par)
    again = load_plan(save_plan(plan, tmp_path / "p.toml"))
    assert again.parallelism[Role.ACTOR].forward_micro_batch == 16
    assert again.content_hash() == plan.content_hash()
    # Without it a plan keeps the hash it had before the key existed.
    assert "forward_micro_batch" not in (ROOT / "examples" / "plans" / PLAN.name).read_text()
    verl = dict(a.split("=", 1) for a in export_plan(plan, Target.VERL).arguments)
    assert verl["actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu"] == "16"
    assert verl["actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu"] == "32"
    assert verl["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"] == str(
        par[Role.ACTOR].micro_batch
    )
    with pytest.raises(SpecError, match="forward_micro_batch must be a positive integer"):
        dataclasses.replace(par[Role.ACTOR], forward_micro_batch=-1)
