"""Per-call dispatch: the Ray round trip every model call pays, measured and priced.

Oracles: payload bytes counted by hand from the Batch fields a call carries;
a call's cost is the same call without dispatch plus the profile's entry at
that payload; the measurement runs real Ray calls on the session's Ray.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from placeflow.dataflow import CallKind
from placeflow.layout import TrainLayout
from placeflow.phases import Phase
from placeflow.plan import RoleParallelism
from placeflow.profiles.ray_roundtrip import measure_dispatch
from placeflow.profiles.registry import fitted_cost_model, load_profile
from placeflow.profiles.schema import DispatchKind, Op, Source
from placeflow.simulator import callcosts
from placeflow.simulator.rolecosts import call_payload_bytes, role_call_costs, train_seq_len
from placeflow.workload import Role, load_workload

WORKLOADS = Path(__file__).resolve().parents[1] / "examples" / "workloads"


def test_payload_bytes_by_hand() -> None:
    # 8 samples of 16 prompt tokens, 24 tokens with the mean response.
    # generate: 16·9 prompt bytes in; 24·(9 + 4) out per sample.
    assert call_payload_bytes(CallKind.GENERATE, 8, 16, 24) == 8 * (16 * 9 + 24 * 13)
    # forward: 24·9 in, 24·4 out.
    assert call_payload_bytes(CallKind.FORWARD, 8, 16, 24) == 8 * 24 * 13
    # update: ids and mask plus old logprobs, reference logprobs and advantages.
    assert call_payload_bytes(CallKind.TRAIN, 8, 16, 24) == 8 * 24 * (9 + 12)


def test_cost_model_answers_the_measured_dispatch_entries() -> None:
    profile = load_profile("cpu")
    entries = profile.entries_for(Op.DISPATCH)
    assert len(entries) >= 5 and {e.source for e in entries} == {Source.MEASURED}
    cm = fitted_cost_model("cpu")
    for e in entries:  # exact at every profiled point
        assert cm.dispatch_s(DispatchKind.RAY_CALL, int(e.params["num_bytes"])) == e.median_s
    # GPU profiles carry the same host's entries, imported.
    gpu = load_profile("h100-sxm").entries_for(Op.DISPATCH)
    assert {e.source for e in gpu} == {Source.IMPORTED}
    assert sorted(e.median_s for e in gpu) == sorted(e.median_s for e in entries)


def test_every_call_pays_its_round_trip_once() -> None:
    wl = load_workload(WORKLOADS / "grpo-tiny-cpu.toml")
    cm = fitted_cost_model("cpu")
    par = RoleParallelism(train=TrainLayout(d=2), micro_batch=8)
    got = role_call_costs(wl, Role.REF, par, cm, first_device=0, gpus_per_node=4)
    seq = train_seq_len(wl)
    samples = wl.batch.num_samples
    bare = callcosts.forward_cost(cm, wl.models[Role.REF], par, samples, seq, value_head=False)
    payload = math.ceil(samples / 2) * seq * 13
    expected = bare.time_s + cm.dispatch_s(DispatchKind.RAY_CALL, payload)
    cost = got[Phase.REF_LOGPROB]
    assert cost.time_s == pytest.approx(expected)
    assert cost.detail["payload_bytes"] == payload


def test_measure_dispatch_times_real_ray_calls(ray_session: None) -> None:
    entries = measure_dispatch([1024, 1 << 20], warmup=1, repeats=5)
    assert [e.params for e in entries] == [
        {"kind": "ray_call", "num_bytes": 1024},
        {"kind": "ray_call", "num_bytes": 1 << 20},
    ]
    for e in entries:
        assert e.source is Source.MEASURED and e.repeats == 5
        assert 0 < e.p10_s <= e.median_s <= e.p90_s < 10.0
