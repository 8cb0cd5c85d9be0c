"""Per-call dispatch: the Ray round trip every model call pays, measured and priced,
and the driver's serial launches and gets of a call to many ranks.

Oracles: payload bytes counted by hand from the Batch fields a call carries;
a call's cost is the same call without dispatch plus the profile's entry at
that payload; a step with the driver's work is the step without it plus the
launches and gets that lie on its critical path, worked out by hand; the
measurement runs real Ray calls on the session's Ray.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
from test_simulator import FAKE, GemmOnlyCosts, tiny_plan

from placeflow.dataflow import dataflow_calls
from placeflow.layout import TrainLayout
from placeflow.phases import Phase
from placeflow.plan import DeviceSet, RoleParallelism
from placeflow.profiles.ray_roundtrip import measure_dispatch
from placeflow.profiles.registry import fitted_cost_model, load_profile
from placeflow.profiles.schema import DispatchKind, Op, Source
from placeflow.simulator import callcosts, simulate
from placeflow.simulator.rolecosts import (
    DriverWork,
    Payload,
    call_driver_work,
    call_payload,
    driver_work,
    role_call_costs,
    role_calls,
    train_seq_len,
)
from placeflow.workload import Role, load_workload

WORKLOADS = Path(__file__).resolve().parents[1] / "examples" / "workloads"


def _call(wl, phase):
    return next(c for c, _ in dataflow_calls(wl) if c.phase is phase)


def test_payloads_by_hand() -> None:
    """8 samples a rank of the tiny GRPO workload, with and without a KL loss, and of
    the tiny PPO workload's updates."""
    wl = load_workload(WORKLOADS / "grpo-tiny-cpu.toml")
    seq = train_seq_len(wl)
    prompt = wl.batch.prompt_len
    # generate: prompt token lists in (no tensors), the rollout's 5 tensors out.
    assert call_payload(wl, _call(wl, Phase.GENERATE), 8) == Payload(
        in_bytes=8 * prompt * 9, out_bytes=8 * seq * 13, in_tensors=0, out_tensors=5
    )
    # forward: the 4 sequence tensors in (9 bytes a token), one float a token out.
    assert call_payload(wl, _call(wl, Phase.REF_LOGPROB), 8) == Payload(
        in_bytes=8 * seq * 9, out_bytes=8 * seq * 4, in_tensors=4, out_tensors=1
    )
    # GRPO actor update without a KL term (kl_coef 0): the sequence, the behaviour
    # logprobs and the advantages, 2 float fields; metrics (no tensors) back.
    assert not wl.kl_in_loss
    assert call_payload(wl, _call(wl, Phase.ACTOR_UPDATE), 8) == Payload(
        in_bytes=8 * seq * (9 + 8), out_bytes=0, in_tensors=6, out_tensors=0
    )
    # With one, the reference's logprobs too: 3 float fields.
    kl = dataclasses.replace(wl, rl=dataclasses.replace(wl.rl, kl_coef=0.04))
    assert kl.kl_in_loss
    assert call_payload(kl, _call(kl, Phase.ACTOR_UPDATE), 8) == Payload(
        in_bytes=8 * seq * (9 + 12), out_bytes=0, in_tensors=7, out_tensors=0
    )
    # PPO: no KL term in the loss (it is in the reward); the critic reads values and returns.
    ppo = load_workload(WORKLOADS / "ppo-tiny-cpu.toml")
    assert not ppo.kl_in_loss
    pseq = train_seq_len(ppo)
    for phase in (Phase.ACTOR_UPDATE, Phase.CRITIC_UPDATE):
        assert call_payload(ppo, _call(ppo, phase), 8) == Payload(
            in_bytes=8 * pseq * (9 + 8), out_bytes=0, in_tensors=6, out_tensors=0
        )


def test_a_call_prices_the_tensors_it_carries() -> None:
    """The profile's round trip is timed with 2 tensors: each one more adds its per-tensor
    entry, each one fewer takes it off (an empty call: both)."""
    cm = fitted_cost_model("cpu")
    base = cm.dispatch_s(DispatchKind.RAY_CALL, 4096)
    per_tensor = cm.dispatch_s(DispatchKind.RAY_CALL_TENSOR, 64)
    assert 0 < per_tensor < base
    assert cm.dispatch_s(DispatchKind.RAY_CALL, 4096, 7) == pytest.approx(base + 5 * per_tensor)
    assert cm.dispatch_s(DispatchKind.RAY_CALL, 4096, 0) == pytest.approx(base - 2 * per_tensor)
    launch = cm.driver_s(DispatchKind.RAY_LAUNCH, 4096)
    launch_tensor = cm.dispatch_s(DispatchKind.RAY_LAUNCH_TENSOR, 64)
    assert launch is not None
    assert cm.driver_s(DispatchKind.RAY_LAUNCH, 4096, 4) == pytest.approx(
        launch + 2 * launch_tensor
    )
    # A GPU profile imports the round trip alone: no per-tensor term.
    gpu = fitted_cost_model("h100-sxm")
    assert gpu.dispatch_s(DispatchKind.RAY_CALL, 4096, 9) == gpu.dispatch_s(
        DispatchKind.RAY_CALL, 4096
    )


def test_cost_model_answers_the_measured_dispatch_entries() -> None:
    profile = load_profile("cpu")
    entries = profile.entries_for(Op.DISPATCH)
    assert len(entries) >= 5 and {e.source for e in entries} == {Source.MEASURED}
    cm = fitted_cost_model("cpu")
    for e in entries:  # exact at every profiled point
        if e.params["kind"] == DispatchKind.RAY_CALL:
            # (an entry's payload is 2 tensors: the default count)
            assert cm.dispatch_s(DispatchKind.RAY_CALL, int(e.params["num_bytes"])) == e.median_s
    # GPU profiles carry the same host's round trips, imported, and not its driver's
    # per-rank launches and gets (their head node's CPU was not measured).
    gpu = load_profile("h100-sxm").entries_for(Op.DISPATCH)
    assert {e.source for e in gpu} == {Source.IMPORTED}
    round_trips = [e for e in entries if e.params["kind"] == DispatchKind.RAY_CALL]
    assert sorted(e.median_s for e in gpu) == sorted(e.median_s for e in round_trips)
    for kind in (DispatchKind.RAY_LAUNCH, DispatchKind.RAY_GET):
        measured = [e for e in entries if e.params["kind"] == kind]
        assert len(measured) >= 5
        for e in measured:
            assert cm.driver_s(kind, int(e.params["num_bytes"])) == e.median_s
        assert fitted_cost_model("h100-sxm").driver_s(kind, 1024) is None


def test_every_call_pays_its_round_trip_once() -> None:
    wl = load_workload(WORKLOADS / "grpo-tiny-cpu.toml")
    cm = fitted_cost_model("cpu")
    par = RoleParallelism(train=TrainLayout(d=2), micro_batch=8)
    got = role_call_costs(wl, Role.REF, par, cm, first_device=0, gpus_per_node=4)
    seq = train_seq_len(wl)
    samples = wl.batch.num_samples
    bare = callcosts.forward_cost(
        cm, wl.models[Role.REF], par, samples, seq, value_head=False, trained=False
    )
    payload = math.ceil(samples / 2) * seq * 13
    # 4 sequence tensors there, the logprobs back; the driver's launch of the call comes
    # before its clock starts (`driver_work`), the rest of the round trip inside it.
    launch = cm.driver_s(DispatchKind.RAY_LAUNCH, math.ceil(samples / 2) * seq * 9, 4)
    assert launch is not None
    expected = bare.time_s + cm.dispatch_s(DispatchKind.RAY_CALL, payload, 5) - launch
    cost = got[Phase.REF_LOGPROB]
    assert cost.time_s == pytest.approx(expected)
    assert cost.detail["payload_bytes"] == payload
    assert cost.detail["payload_tensors"] == 5


def test_driver_work_launches_every_rank_and_gets_the_others() -> None:
    cm = fitted_cost_model("cpu")
    launch = cm.driver_s(DispatchKind.RAY_LAUNCH, 4096)
    get = cm.driver_s(DispatchKind.RAY_GET, 1024)
    assert launch is not None and get is not None
    # The executor's clock starts a call once all its launches returned; one get is in
    # the call's round trip: 4 ranks, 4 launches before it and 3 gets after it.
    two = Payload(in_bytes=4096, out_bytes=1024, in_tensors=2, out_tensors=2)
    assert driver_work(cm, 4, two) == DriverWork(launch_s=4 * launch, collect_s=3 * get, get_s=get)
    assert driver_work(cm, 1, two) == DriverWork(launch_s=launch, collect_s=0.0, get_s=get)
    assert driver_work(fitted_cost_model("h100-sxm"), 8, two) is None


def test_call_driver_work_payloads_by_hand() -> None:
    wl = load_workload(WORKLOADS / "grpo-tiny-cpu.toml")
    cm = fitted_cost_model("cpu")
    par = RoleParallelism(train=TrainLayout(d=2), micro_batch=8)
    seq = train_seq_len(wl)
    ref = next(c for c in role_calls(wl, Role.REF) if c.phase is Phase.REF_LOGPROB)
    per_rank = math.ceil(wl.batch.num_samples / 2)
    # In: ids and masks (9 bytes a token) in 4 tensors; out: one float32 a token, 1 tensor.
    got = call_driver_work(wl, ref, par, cm, ranks=4)
    launch = cm.driver_s(DispatchKind.RAY_LAUNCH, per_rank * seq * 9, 4)
    get = cm.driver_s(DispatchKind.RAY_GET, per_rank * seq * 4, 1)
    assert launch is not None and get is not None
    assert got == DriverWork(launch_s=4 * launch, collect_s=3 * get, get_s=get)


LAUNCH_S, GET_S = 2e-3, 1e-3


@dataclasses.dataclass(frozen=True, kw_only=True)
class DriverCosts(GemmOnlyCosts):
    """GemmOnlyCosts with a driver that takes 2 ms to launch a rank's call, 1 ms to get one
    rank's result."""

    def driver_s(self, kind, num_bytes, tensors=2):
        return LAUNCH_S if kind == DispatchKind.RAY_LAUNCH else GET_S


def test_driver_launches_and_gets_on_the_critical_path_by_hand() -> None:
    two = RoleParallelism(train=TrainLayout(d=2), micro_batch=4, recompute=False)
    plan = tiny_plan(
        [DeviceSet(roles=(Role.ACTOR, Role.REF), pool="cpu", first_device=0, num_devices=2)],
        {Role.ACTOR: two, Role.REF: two},
    )
    base = simulate(plan, FAKE)
    driven = simulate(plan, DriverCosts(profile_name="d", dtype_bytes=4, rooflines={}, series={}))
    before = {p.name: p.duration_s for p in base.phases}
    after = {p.name: p.duration_s for p in driven.phases}
    # Two ranks: two launches before each call (the fake's round trip is 0, so nothing
    # comes off it), one more get after it. The calls run one after another on the set;
    # ref and old are launched together after the rollout is collected, so old's
    # launches hide behind ref's run and ref's get behind old's. Critical path: the
    # rollout's sync (launches, get: a call to both ranks even with nothing to
    # reshard), generate (launches, get), ref (launches), old (get), update (launches,
    # get).
    launches = 2 * LAUNCH_S
    added = 2 * (launches + GET_S) + launches + GET_S + (launches + GET_S)
    assert driven.iteration_s == pytest.approx(base.iteration_s + added)
    # A call's interval ends at its last get and starts after its launches, or where the
    # previous call on its set ended, as the executor's clock stamps it: old starts
    # after ref's get (while the driver took it, old already ran).
    for phase in (Phase.GENERATE, Phase.REF_LOGPROB, Phase.ACTOR_UPDATE):
        assert after[phase] == pytest.approx(before[phase] + GET_S)
    assert after[Phase.OLD_LOGPROB] == pytest.approx(before[Phase.OLD_LOGPROB])
    # One rank per set: its launch only, on the same critical path (old's hidden).
    one = tiny_plan(
        [DeviceSet(roles=(Role.ACTOR, Role.REF), pool="cpu", first_device=0, num_devices=1)],
        {Role.ACTOR: dataclasses.replace(two, train=TrainLayout()), Role.REF: one_rank(two)},
    )
    assert simulate(one, FAKE).iteration_s + 4 * LAUNCH_S == pytest.approx(
        simulate(
            one, DriverCosts(profile_name="d", dtype_bytes=4, rooflines={}, series={})
        ).iteration_s
    )


def one_rank(par: RoleParallelism) -> RoleParallelism:
    return dataclasses.replace(par, train=TrainLayout())


def test_measure_dispatch_times_real_ray_calls(ray_session: None) -> None:
    entries = measure_dispatch([1024, 1 << 20], warmup=1, repeats=5)
    assert [e.params for e in entries] == [
        {"kind": "ray_call", "num_bytes": 1024},
        {"kind": "ray_call", "num_bytes": 1 << 20},
    ]
    for e in entries:
        assert e.source is Source.MEASURED and e.repeats == 5
        assert 0 < e.p10_s <= e.median_s <= e.p90_s < 10.0
    kinds = (DispatchKind.RAY_LAUNCH, DispatchKind.RAY_GET)
    driver = measure_dispatch([1024], warmup=1, repeats=5, kinds=kinds)
    assert [e.params["kind"] for e in driver] == ["ray_launch", "ray_get"]
    # The driver's share of a call is part of its round trip.
    assert all(0 < e.median_s < entries[0].p90_s * 5 for e in driver)


@dataclasses.dataclass(frozen=True, kw_only=True)
class LaunchOnlyCosts(GemmOnlyCosts):
    """DriverCosts without gets: the driver takes 2 ms to launch a rank's call, 0 to get."""

    def driver_s(self, kind, num_bytes, tensors=2):
        return LAUNCH_S if kind == DispatchKind.RAY_LAUNCH else 0.0


def test_one_step_off_takes_the_rollout_s_results_with_the_next_sync_by_hand() -> None:
    # One-step-off on one trainer and one generator rank. The executor stamps rollout k
    # as it ends and gets its result (one rank: 1 ms) only when it collects the sync
    # that feeds generation k+1, whose own collect gets the second of its two ranks'
    # results (1 ms). Against a driver whose gets are free: rollout k's call 1 ms shorter
    # (its get was in its round trip), nothing to collect after it, the sync's collect
    # 2 ms and after rollout k's end; the first rollout (collected as it ends, on-policy)
    # and the last (after the window) as before.
    from placeflow.simulator.simulate import COLLECT, _cost_calls, _resident_bytes, _tasks

    one = RoleParallelism(train=TrainLayout(), micro_batch=4, recompute=False)
    plan = tiny_plan(
        [
            DeviceSet(roles=(Role.ACTOR,), pool="cpu", first_device=0, num_devices=1),
            DeviceSet(
                roles=(Role.ACTOR,), pool="cpu", first_device=1, num_devices=1, generator=True
            ),
        ],
        {Role.ACTOR: one},
        roles=(Role.ACTOR,),
    )
    blank = dict(profile_name="d", dtype_bytes=4, rooflines={}, series={})

    def tasks(cm: GemmOnlyCosts, staleness: int) -> dict:
        resident = [_resident_bytes(plan, i) for i in range(len(plan.sets))]
        costed, _ = _cost_calls(plan, {"*": cm}, resident)
        return {t.id: t for t in _tasks(plan, costed, 5, staleness)}

    free, gets = tasks(LaunchOnlyCosts(**blank), 1), tasks(DriverCosts(**blank), 1)
    gen, sync = Phase.GENERATE, Phase.WEIGHT_SYNC
    for k in (1, 2, 3):
        assert gets[k, gen].duration_s == pytest.approx(free[k, gen].duration_s - GET_S)
        assert gets[k, gen, COLLECT].duration_s == 0.0
        assert gets[k + 1, sync, COLLECT].duration_s == pytest.approx(2 * GET_S)
        assert (k, gen, COLLECT) in gets[k + 1, sync, COLLECT].preds
    for k in (0, 4):
        assert gets[k, gen].duration_s == pytest.approx(free[k, gen].duration_s)
    assert gets[1, sync, COLLECT].duration_s == pytest.approx(GET_S)
    # Synchronous: the sync's other rank's get only, the rollout's in its round trip.
    free, gets = tasks(LaunchOnlyCosts(**blank), 0), tasks(DriverCosts(**blank), 0)
    assert gets[0, gen].duration_s == pytest.approx(free[0, gen].duration_s)
    assert gets[0, sync, COLLECT].duration_s == pytest.approx(GET_S)
