"""A pipeline stage's send is priced after the stage's compute (`callcosts.forward_cost`,
`callcosts.train_cost`): gloo's sender waits until its receiver posts the receive
(`benchmarks/p2p_rendezvous.py`), so on a CPU host the pair pays the `paired_collective`
floor as a collective's ranks do (`CostModel._paired_floor_s`).

Oracle, by hand: with GEMMs at FLOPs / 1 PFLOP/s and everything else free
(`test_lora.FlopCostModel`), and a send that costs exactly the compute named before it,
a forward of m micro-batches over p stages costs (m + p − 1) x stage more than with free
sends, stage being the stage's layers' forward (`compute.layer_forward_s`); an update's
1F1B sends a micro-batch's activations after the forward and its input's gradient after
the backward, so each optimizer step costs (m + p − 1) x (forward + backward) more.
"""

from __future__ import annotations

import pytest
from test_lora import FlopCostModel

from placeflow.catalogue import get_model
from placeflow.layout import TrainLayout
from placeflow.plan import RoleParallelism
from placeflow.profiles.registry import fitted_cost_model
from placeflow.profiles.schema import CollectiveKind, Scope
from placeflow.simulator import callcosts, compute

MODEL = get_model("tiny-llama")  # 2 layers: one a stage at p = 2
PAR = RoleParallelism(train=TrainLayout(p=2), micro_batch=4, recompute=False)
SAMPLES, SEQ, MB = 16, 32, 4  # 4 micro-batches


class SendAfter(FlopCostModel):
    """A send costs the compute named before it (`after_s`); other collectives are free."""

    def __init__(self) -> None:
        super().__init__()
        self.afters: list[float | None] = []

    def collective_s(self, kind, num_bytes, world_size, scope, *, ranks_per_node=1, after_s=None):  # type: ignore[no-untyped-def]
        super().collective_s(kind, num_bytes, world_size, scope, ranks_per_node=ranks_per_node)
        if kind is CollectiveKind.SEND_RECV:
            self.afters.append(after_s)
            return after_s or 0.0
        return 0.0


def test_a_forward_stage_sends_after_its_layers() -> None:
    cm = SendAfter()
    got = callcosts.forward_cost(cm, MODEL, PAR, SAMPLES, SEQ, value_head=False, trained=True)  # type: ignore[arg-type]
    free = callcosts.forward_cost(
        FlopCostModel(),  # type: ignore[arg-type]
        MODEL,
        PAR,
        SAMPLES,
        SEQ,
        value_head=False,
        trained=True,
    )
    stage = compute.layer_forward_s(FlopCostModel(), MODEL, 1, MB, SEQ)  # type: ignore[arg-type]
    assert stage > 0
    assert cm.afters == [pytest.approx(stage)]
    m, p = SAMPLES // MB, 2
    assert got.time_s - free.time_s == pytest.approx((m + p - 1) * stage)


def test_an_update_sends_after_the_forward_and_after_the_backward() -> None:
    def update(cm: FlopCostModel) -> callcosts.CallCost:
        return callcosts.train_cost(
            cm,  # type: ignore[arg-type]
            MODEL,
            PAR,
            SAMPLES,
            SEQ,
            ppo_epochs=2,
            mini_batches=1,
            dp_scope=Scope.INTRA,
            value_head=False,
        )

    cm = SendAfter()
    got, free = update(cm), update(FlopCostModel())
    fwd = compute.layer_forward_s(FlopCostModel(), MODEL, 1, MB, SEQ)  # type: ignore[arg-type]
    bwd = compute.layer_backward_s(FlopCostModel(), MODEL, 1, MB, SEQ)  # type: ignore[arg-type]
    assert sorted(a or 0.0 for a in cm.afters) == pytest.approx(sorted([fwd, bwd]))
    m, p, steps = SAMPLES // MB, 2, 2
    assert got.time_s - free.time_s == pytest.approx(steps * (m + p - 1) * (fwd + bwd))


def test_the_shipped_cpu_profile_floors_a_small_send_after_compute() -> None:
    """With the shipped CPU profile a 4 KiB send after 550 µs of compute costs the
    `paired_collective` curve there, above its back-to-back entry; on a GPU profile (no
    curve) the entry."""
    cm = fitted_cost_model("cpu")
    send = cm.collective_s(CollectiveKind.SEND_RECV, 4096, 2, Scope.INTRA)
    after = cm.collective_s(CollectiveKind.SEND_RECV, 4096, 2, Scope.INTRA, after_s=550e-6)
    assert after == pytest.approx(max(send, cm.paired_collective_s(550e-6)))
    assert after > send
    gpu = fitted_cost_model("h100-sxm")
    assert gpu.collective_s(
        CollectiveKind.SEND_RECV, 4096, 2, Scope.INTRA, after_s=550e-6
    ) == gpu.collective_s(CollectiveKind.SEND_RECV, 4096, 2, Scope.INTRA)
