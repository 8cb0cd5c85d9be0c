"""The engine's scalar all-reduces (`callcosts.control_syncs_s`), counted.

Oracle: the executor's calls read by hand. A trained role's forward call over a
data-parallel group of more than one rank agrees on its micro-batch count
(`roles._micro_count`, one all-reduce of one int64); a frozen model's
(`roles.ScoringEngine`: reference, reward, cost) runs its own shard's count and
agrees on nothing; an optimizer step agrees on the mini-batch's token
count and micro-batch count (two), and `trainer.grad_norm` sums the norm's parts
over TP, the experts' group and PP where each has more than one rank, and over the
DP group under FSDP (ZeRO-3 with d > 1). Every one carries 8 bytes.
"""

from __future__ import annotations

import pytest
from test_lora import FlopCostModel
from test_ray_roundtrip import WORKLOADS

from placeflow.catalogue import get_model
from placeflow.layout import TrainLayout
from placeflow.phases import Phase
from placeflow.plan import RoleParallelism
from placeflow.profiles.registry import fitted_cost_model
from placeflow.profiles.schema import CollectiveKind, Scope
from placeflow.simulator import callcosts
from placeflow.simulator.rolecosts import role_call_costs
from placeflow.workload import Role, load_workload

MODEL = get_model("tiny-llama")


class WorldPriced(FlopCostModel):
    """An all-reduce of `CONTROL_BYTES` costs its world size in seconds (so a sum tells
    the groups apart), across nodes 1000 times that; every other collective is free."""

    def collective_s(self, kind, num_bytes, world_size, scope, *, ranks_per_node=1, after_s=None):  # type: ignore[no-untyped-def]
        super().collective_s(kind, num_bytes, world_size, scope, ranks_per_node=ranks_per_node)
        if kind is CollectiveKind.ALL_REDUCE and num_bytes == callcosts.CONTROL_BYTES:
            return float(world_size) * (1000.0 if scope is Scope.INTER else 1.0)
        return 0.0


def _control(lay: TrainLayout, *, train: bool, zero: int = 1, scope: Scope = Scope.INTRA) -> float:
    dp = callcosts._DPGroups(scope=scope)
    return callcosts.control_syncs_s(WorldPriced(), lay, dp, train=train, zero=zero)  # type: ignore[arg-type]


def test_a_forward_agrees_on_its_micro_batch_count_over_dp_only() -> None:
    assert _control(TrainLayout(d=4), train=False) == 4.0
    assert _control(TrainLayout(t=2, p=2, d=1), train=False) == 0.0  # TP and PP: no count
    assert _control(TrainLayout(d=4), train=False, scope=Scope.INTER) == 4000.0


def test_an_optimizer_step_counts_tokens_and_micro_batches_and_sums_the_norm() -> None:
    # d = 8: tokens and micro-batches, 2 x 8; the norm over t = 2 and p = 4.
    assert _control(TrainLayout(t=2, p=4, d=8), train=True) == 2 * 8 + 2 + 4
    # FSDP adds the norm over the DP group; experts (e = 2) over theirs.
    assert _control(TrainLayout(t=2, p=4, d=8), train=True, zero=3) == 3 * 8 + 2 + 4
    assert _control(TrainLayout(d=8, e=2), train=True) == 2 * 8 + 2
    assert _control(TrainLayout(), train=True) == 0.0


PAR = RoleParallelism(train=TrainLayout(d=2), micro_batch=4, recompute=False)


def _forward(cm: FlopCostModel, *, trained: bool = True) -> callcosts.CallCost:
    return callcosts.forward_cost(cm, MODEL, PAR, 16, 32, value_head=False, trained=trained)  # type: ignore[arg-type]


def _update(cm: FlopCostModel) -> callcosts.CallCost:
    return callcosts.train_cost(
        cm,  # type: ignore[arg-type]
        MODEL,
        PAR,
        16,
        32,
        ppo_epochs=2,
        mini_batches=2,
        dp_scope=Scope.INTRA,
        value_head=False,
    )


def test_forward_and_train_costs_add_them_once_per_call_and_per_step() -> None:
    """16 samples over d = 2; a forward call pays 2 s once; an update of 2 mini-batches
    and 2 epochs, 4 optimizer steps, pays 2 x 2 s each (against the same calls with
    every collective free)."""
    cm = WorldPriced()
    fwd = _forward(cm)
    assert fwd.detail["control_sync_s"] == 2.0
    assert fwd.time_s == pytest.approx(2.0 + _forward(FlopCostModel()).time_s)
    assert cm.collectives.count((CollectiveKind.ALL_REDUCE, 8, 2)) == 1
    train = _update(WorldPriced())
    assert train.detail["control_sync_s"] == 4.0
    assert train.time_s - _update(FlopCostModel()).time_s == pytest.approx(4 * 4.0)


def test_a_frozen_models_forward_agrees_on_nothing() -> None:
    """The reference's logprobs (`ScoringEngine.logprobs`: `_forward_stages` without a
    count) over the same d = 2: no all-reduce, the same time as with every collective
    free."""
    cm = WorldPriced()
    fwd = _forward(cm, trained=False)
    assert fwd.detail["control_sync_s"] == 0.0
    assert fwd.time_s == pytest.approx(_forward(FlopCostModel(), trained=False).time_s)
    assert not [c for c in cm.collectives if c[0] is CollectiveKind.ALL_REDUCE]


def test_role_costs_give_the_count_to_trained_roles_only() -> None:
    """Through `rolecosts.role_call_costs` with the shipped CPU profile: the actor's old
    logprobs and the critic's values pay the count's all-reduce over d = 2 (the
    profile's 8-byte all-reduce of 2 ranks); the reference's logprobs do not."""
    cm = fitted_cost_model("cpu")
    wl = load_workload(WORKLOADS / "ppo-tiny-cpu.toml")
    one = cm.collective_s(CollectiveKind.ALL_REDUCE, callcosts.CONTROL_BYTES, 2, Scope.INTRA)
    assert one > 0
    calls = (
        (Role.ACTOR, Phase.OLD_LOGPROB),
        (Role.CRITIC, Phase.VALUES),
        (Role.REF, Phase.REF_LOGPROB),
    )
    syncs = {
        role: role_call_costs(wl, role, PAR, cm, first_device=0, gpus_per_node=4)[phase].detail[
            "control_sync_s"
        ]
        for role, phase in calls
    }
    assert syncs == {Role.ACTOR: one, Role.CRITIC: one, Role.REF: 0.0}
