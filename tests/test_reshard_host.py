"""The colocated reshard's host work beyond its all-gathers: the plan's counts of pieces,
slots and copied bytes against hand counts, the probe's solve, its entries, and the
simulator's price of them (`reshard_plan.rank_work`, `profiles.reshard_host`,
`callcosts.reshard_host_s`)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from placeflow.catalogue import get_model
from placeflow.errors import MeasurementError
from placeflow.layout import GenLayout, TrainLayout
from placeflow.profiles import reshard_host
from placeflow.profiles.costmodel import CostModel
from placeflow.profiles.registry import fitted_cost_model, load_profile
from placeflow.profiles.schema import CollectiveKind, Entry, FrameworkKind, Op, Scope, Source
from placeflow.reshard_plan import RankWork, TinyLlama, plan_reshard, rank_work
from placeflow.simulator import callcosts

# 2 layers, hidden 8, 2 heads of 4 (2 KV heads), ffn 16, vocab 10, fp32. A layer: qkv
# (8 + 8 + 8) x 8, o 8 x 8, gate_up 32 x 8, down 8 x 16, two norms of 8; outside: the
# embedding and the head 10 x 8 each, the final norm.
MODEL = TinyLlama(num_layers=2, hidden=8, num_heads=2, num_kv_heads=2, ffn=16, vocab=10)
LAYER_SHARDED = 24 * 8 + 8 * 8 + 32 * 8 + 8 * 16
OUTSIDE_SHARDED = 2 * 10 * 8


def test_a_tp_gather_copies_its_own_half_and_the_peers_half_of_every_sharded_tensor() -> None:
    """TP 2 to 1: each of the 4 sharded tensors a layer and the embedding and the head is
    one slot; the rank copies its own half in and the peer's half out of the gather (two
    pieces a slot), the whole tensor in all; the norms are whole on both ranks, handed over
    as they are."""
    plan = plan_reshard(MODEL, GenLayout(train=TrainLayout(t=2), tg=1))
    sharded = 2 * 4 + 2
    bytes_ = 4 * (2 * LAYER_SHARDED + OUTSIDE_SHARDED)
    for rank in (0, 1):
        assert rank_work(plan, rank) == RankWork(
            pieces=2 * sharded, slots=sharded, placed_bytes=bytes_
        )


def test_a_pp_gather_copies_the_other_stage_in_and_hands_its_own_over() -> None:
    """PP 2 to 1: a rank's own stage is whole already (no copy); it receives the other
    stage's 6 tensors a layer, and the embedding (rank 1) or the final norm and the head
    (rank 0), one piece each."""
    plan = plan_reshard(MODEL, GenLayout(train=TrainLayout(p=2), pg=1))
    layer = 4 * (LAYER_SHARDED + 2 * 8)
    head, embed, norm = 4 * 10 * 8, 4 * 10 * 8, 4 * 8
    first, second = rank_work(plan, 0), rank_work(plan, 1)
    assert (first.pieces, first.placed_bytes) == (6 + 2, layer + norm + head)
    assert (second.pieces, second.placed_bytes) == (6 + 1, layer + embed)
    assert first.slots == second.slots == len(plan.group_of(0).slots)


def test_no_gather_no_work() -> None:
    plan = plan_reshard(MODEL, GenLayout(train=TrainLayout()))
    assert rank_work(plan, 0) == RankWork(pieces=0, slots=0, placed_bytes=0)


def test_the_solve_recovers_a_piece_and_a_slot() -> None:
    a, b = 60e-6, 140e-6
    rows = [(20, 10, 20 * a + 10 * b), (8, 8, 8 * a + 8 * b), (7, 8, 7 * a + 8 * b)]
    assert reshard_host.solve(rows) == pytest.approx((a, b))


def _samples(a: float, b: float, n: int = 5) -> dict[int, dict[tuple[int, int], float]]:
    works = [
        [rank_work(plan_reshard(reshard_host.PROBE_MODEL, g), r) for r in (0, 1)]
        for g in reshard_host.PROBE_LAYOUTS
    ]
    return {
        s: {
            (i, r): (1 + 0.01 * s) * (works[i][r].pieces * a + works[i][r].slots * b)
            for i in range(2)
            for r in range(2)
        }
        for s in range(n)
    }


def _gathers(seconds: float, n: int = 5) -> dict[int, dict[int, float]]:
    """Rank 1 the slower by 0.1 ms in every sample, the samples scaled 1.00 ... 1.04."""
    return {s: {0: (1 + 0.01 * s) * seconds, 1: (1 + 0.01 * s) * seconds + 1e-4} for s in range(n)}


def test_the_entries_are_the_solves_median_and_spread() -> None:
    entries = reshard_host.entries_of(_samples(60e-6, 140e-6), _gathers(600e-6))
    by_kind = {FrameworkKind(e.params["kind"]): e for e in entries}
    assert set(by_kind) == set(reshard_host.RESHARD_KINDS)
    # Samples scaled 1.00 ... 1.04: the solve scales with them, the median is 1.02's.
    assert by_kind[FrameworkKind.RESHARD_PIECE].median_s == pytest.approx(1.02 * 60e-6)
    assert by_kind[FrameworkKind.RESHARD_SLOT].median_s == pytest.approx(1.02 * 140e-6)
    # The gather's: the slower rank's of each sample, their median.
    assert by_kind[FrameworkKind.ZERO3_GATHER].median_s == pytest.approx(1.02 * 600e-6 + 1e-4)
    for e in entries:
        assert e.op is Op.FRAMEWORK and e.source is Source.MEASURED and e.repeats == 5
        assert e.p10_s <= e.median_s <= e.p90_s


def test_a_host_too_busy_to_tell_them_apart_is_refused() -> None:
    with pytest.raises(MeasurementError, match="reshard_slot"):
        reshard_host.entries_of(_samples(60e-6, -10e-6), _gathers(600e-6))


def test_a_gather_no_dearer_than_the_plain_all_gather_is_refused() -> None:
    with pytest.raises(MeasurementError, match="zero3_gather"):
        reshard_host.entries_of(_samples(60e-6, 140e-6), _gathers(-300e-6))
    with pytest.raises(MeasurementError, match="zero3_gather"):
        reshard_host.entries_of(_samples(60e-6, 140e-6), {})


def test_the_probe_runs_the_executors_reshard_on_two_ranks() -> None:
    entries = reshard_host.measure_reshard_host(samples=3, calls=2)
    assert {FrameworkKind(e.params["kind"]) for e in entries} == set(reshard_host.RESHARD_KINDS)
    assert all(e.median_s > 0 and e.repeats == 3 for e in entries)


def _with_entries(piece_s: float, slot_s: float, gather_s: float | None = None) -> CostModel:
    profile = load_profile("cpu")
    extra = [
        Entry(
            op=Op.FRAMEWORK,
            params={"kind": kind.value, "num_units": 1},
            median_s=t,
            p10_s=t,
            p90_s=t,
            repeats=1,
            source=Source.MEASURED,
        )
        for kind, t in (
            (FrameworkKind.RESHARD_PIECE, piece_s),
            (FrameworkKind.RESHARD_SLOT, slot_s),
            (FrameworkKind.ZERO3_GATHER, gather_s),
        )
        if t is not None
    ]
    return CostModel.fit(dataclasses.replace(profile, entries=(*profile.entries, *extra)))


def test_the_host_work_is_priced_per_piece_per_slot_and_per_byte() -> None:
    cm = _with_entries(50e-6, 100e-6)
    work = RankWork(pieces=20, slots=10, placed_bytes=1 << 20)
    expected = 20 * 50e-6 + 10 * 100e-6 + callcosts.device_copy_s(cm, 1 << 20)
    assert callcosts.reshard_host_s(cm, work) == pytest.approx(expected)
    assert callcosts.reshard_host_s(fitted_cost_model("a100-80gb"), work) == 0.0


def test_a_gathering_reshard_adds_its_slowest_ranks_host_work() -> None:
    """colocate TP 2 to 1 of tiny-llama: both ranks do the same work (20 pieces, 10 slots,
    the whole sharded model copied), and the reshard costs that much more than where the
    profile has no such entries."""
    model = get_model("tiny-llama")
    gen = GenLayout(train=TrainLayout(t=2), tg=1)
    with_entries, without = _with_entries(50e-6, 100e-6), fitted_cost_model("cpu")
    plan = plan_reshard(TinyLlama.from_model_spec(model), gen)
    work = rank_work(plan, 0)
    assert work.pieces == 20 and work.slots == 10
    host = 20 * 50e-6 + 10 * 100e-6 + callcosts.device_copy_s(with_entries, work.placed_bytes)
    got = callcosts.reshard_cost(with_entries, model, gen, Scope.INTRA)
    base = callcosts.reshard_cost(without, model, gen, Scope.INTRA)
    assert got.detail["host_s"] == pytest.approx(host)
    assert base.detail["host_s"] == 0.0
    assert got.time_s - base.time_s == pytest.approx(host)
    assert got.busy_s == got.time_s


def test_its_entries_go_into_a_profile_and_survive_a_framework_remeasure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--add-to` puts the two entries and a note into the file, the rest kept; a full
    `profiles.framework` re-measure afterwards keeps them and says so."""
    from placeflow.profiles import framework, profiler
    from placeflow.profiles.schema import load_profile_file

    source = Path(framework.__file__).parent / "data" / "cpu.json"
    path = tmp_path / "cpu.json"
    path.write_text(source.read_text())
    before = load_profile_file(path)
    measured = reshard_host.entries_of(_samples(60e-6, 140e-6), _gathers(600e-6))
    monkeypatch.setattr(reshard_host, "measure_reshard_host", lambda: measured)
    assert reshard_host.main(["--add-to", str(path)]) == 0
    added = load_profile_file(path)
    assert len(added.entries) == len(before.entries) + 3
    assert "placeflow.profiles.reshard_host --add-to" in added.provenance.notes
    names = {k.value for k in reshard_host.RESHARD_KINDS}
    engine = [
        e
        for e in added.entries_for(Op.FRAMEWORK)
        if FrameworkKind(e.params["kind"]) in framework.ENGINE_KINDS
    ]
    monkeypatch.setattr(framework, "measure_framework", lambda **_: engine)
    monkeypatch.setattr(profiler, "cpu_busy_fraction", lambda: 0.0)
    assert framework.main(["--add-to", str(path)]) == 0
    after = load_profile_file(path)
    kept = [e for e in after.entries_for(Op.FRAMEWORK) if e.params["kind"] in names]
    assert sorted(kept, key=str) == sorted(measured, key=str)
    assert "placeflow.profiles.reshard_host" in after.provenance.notes


def test_a_missing_profile_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as exc:
        reshard_host.main(["--add-to", str(tmp_path / "nope.json")])
    assert exc.value.code == 2


# tiny-llama's tensors on one rank of TP 2 (hidden 128, 4 heads of 32, 2 KV heads, ffn
# 352, vocab 256, fp32), by hand: a layer's qkv (128 + 64 + 64 rows of 128) and gate_up
# (2 x 352 rows) split by rows, o and down by columns, its two norms whole; outside the
# layers the embedding and the head split (256 x 128 each), the final norm whole.
TP2_TENSORS = {
    128 * 128 * 4: 2 + 2,  # qkv's half a layer; the embedding's and the head's halves
    128 * 64 * 4: 2,  # o's half a layer
    352 * 128 * 4: 2,  # gate_up's half a layer
    128 * 176 * 4: 2,  # down's half a layer
    128 * 4: 2 * 2 + 1,  # the norms
}


def test_a_zero3_rank_gathers_each_tensor_of_its_tp_shard_with_its_host_work() -> None:
    """ZeRO-3 over d = 2 with TP 2: 15 tensors, each one all-gather over the 2 replicas
    plus the measured host work beyond it; nothing to gather with one replica."""
    model = get_model("tiny-llama")
    lay = TrainLayout(t=2, d=2)
    assert dict(callcosts.zero3_tensor_bytes(model, lay)) == TP2_TENSORS
    cm, without = _with_entries(50e-6, 100e-6, 700e-6), fitted_cost_model("cpu")
    gathers = sum(
        n * without.collective_s(CollectiveKind.ALL_GATHER, size, 2, Scope.INTRA)
        for size, n in TP2_TENSORS.items()
    )
    assert callcosts.zero3_gather_s(without, model, lay, Scope.INTRA) == pytest.approx(gathers)
    assert callcosts.zero3_gather_s(cm, model, lay, Scope.INTRA) == pytest.approx(
        gathers + 15 * 700e-6
    )
    assert callcosts.zero3_gather_s(cm, model, TrainLayout(t=2), Scope.INTRA) == 0.0


def test_a_zero3_actor_pays_its_gather_before_a_reshard_and_a_weight_sync() -> None:
    """The colocated reshard (TP 2 to 1 over d = 2) and the weight sync to a generator set
    each cost one `zero3_gather_s` more under ZeRO-3 than under ZeRO-1, no more."""
    model = get_model("tiny-llama")
    lay = TrainLayout(t=2, d=2)
    cm = _with_entries(50e-6, 100e-6, 700e-6)
    gather = callcosts.zero3_gather_s(cm, model, lay, Scope.INTRA)
    gen = GenLayout(train=lay, tg=1)
    z3 = callcosts.reshard_cost(cm, model, gen, Scope.INTRA, train_zero=3)
    z1 = callcosts.reshard_cost(cm, model, gen, Scope.INTRA, train_zero=1)
    assert z3.time_s - z1.time_s == pytest.approx(gather)
    assert z3.detail["zero3_gather_s"] == pytest.approx(gather)
    assert z1.detail["zero3_gather_s"] == 0.0
    s3 = callcosts.weight_sync_cost(cm, model, 1, 1, Scope.INTRA, train=lay, train_zero=3)
    s1 = callcosts.weight_sync_cost(cm, model, 1, 1, Scope.INTRA, train=lay, train_zero=1)
    assert s3.time_s - s1.time_s == pytest.approx(gather)
    assert s3.detail["zero3_gather_s"] == pytest.approx(gather)
