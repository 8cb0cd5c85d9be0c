"""The Vidur importer, the datasheet completion and the shipped GPU profiles.

Oracles: rows of Vidur's CSVs read here with the csv module, hand-written
roofline formulas, and the published H100 figures quoted in DESIGN.md. Tests
that read Vidur's data skip when its folder is absent; the shipped-file tests
need only `profiles/data/`.
"""

from __future__ import annotations

import csv
import os
import statistics
from pathlib import Path

import pytest

from placeflow.errors import SpecError
from placeflow.profiles import ops
from placeflow.profiles.build_gpu_profiles import (
    RECIPES,
    MeasuredSet,
    build_gpu_profiles,
    build_profile,
    measured_from_files,
    overlay_measured,
)
from placeflow.profiles.datasheet import (
    H100_SXM,
    DatasheetFigures,
    NetworkEfficiencies,
    derive_efficiencies,
    inter_node_s,
)
from placeflow.profiles.schema import (
    REQUIRED_OPS,
    CollectiveKind,
    Entry,
    Op,
    Profile,
    Provenance,
    Scope,
    Source,
    load_profile_file,
    save_profile,
)
from placeflow.profiles.vidur import geometric_subset, import_vidur

REPO = Path(__file__).resolve().parents[1]
VIDUR_DIR = Path(os.environ.get("PLACEFLOW_VIDUR_DIR", REPO.parent / "shared" / "vidur-profiles"))
SHIPPED = {name: REPO / "profiles" / "data" / f"{name}.json" for name in ("h100-sxm", "a100-80gb")}
H100_MEASURED_DIR = Path(
    os.environ.get("PLACEFLOW_H100_MEASURED_DIR", REPO.parent / "shared" / "h100-measured")
)
H100_MEASURED = [H100_MEASURED_DIR / f"h100-{p}.json" for p in ("full-a", "full-b", "quick")]

needs_vidur = pytest.mark.skipif(
    not (VIDUR_DIR / "compute").is_dir(), reason=f"Vidur's CSVs not found at {VIDUR_DIR}"
)


@pytest.fixture(scope="module")
def h100() -> Profile:
    return import_vidur(VIDUR_DIR, "h100")


@pytest.fixture(scope="module")
def built() -> dict[str, Profile]:
    return build_gpu_profiles(VIDUR_DIR, import_date="2026-01-01")


@pytest.fixture(scope="module")
def h100_imported() -> Profile:
    """The H100 profile as Vidur and the datasheet give it, before measured entries."""
    return build_profile(VIDUR_DIR, RECIPES[0], import_date="2026-01-01")


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def _find(profile: Profile, op: Op, **params: int | str) -> list:
    return [e for e in profile.entries_for(op) if dict(e.params) == params]


def test_geometric_subset_keeps_one_point_per_octave_and_the_ends() -> None:
    assert geometric_subset(range(1, 65), 1) == {1, 2, 4, 8, 16, 32, 64}
    assert geometric_subset([3, 5, 100], 1) == {3, 5, 100}
    assert geometric_subset([2048, 10240, 18432, 67108864], 4) >= {2048, 67108864}


@needs_vidur
def test_import_gives_imported_gemm_and_all_reduce_entries(h100: Profile) -> None:
    assert h100.device_kind == "cuda" and h100.provenance.dtype == "fp16"
    assert {e.source for e in h100.entries} == {Source.IMPORTED}
    assert len(h100.entries_for(Op.GEMM)) > 1000
    kinds = {e.params["kind"] for e in h100.entries_for(Op.COLLECTIVE)}
    assert kinds == {"all_reduce", "send_recv"}
    assert all(e.p10_s <= e.median_s <= e.p90_s for e in h100.entries)


@needs_vidur
def test_imported_gemm_is_the_csv_median_of_its_rows(h100: Profile) -> None:
    # Llama-2-7B at TP 2, 4096 tokens: mlp_down_proj is C[4096, 4096] = A[4096, 5504] B.
    rows = _rows(VIDUR_DIR / "compute/h100/meta-llama/Llama-2-7b-hf/mlp.csv")
    picked = [
        r for r in rows if r["num_tokens"] == "4096" and r["num_tensor_parallel_workers"] == "2"
    ]
    assert picked and picked[0]["n_expanded_embd"] == "11008"
    expected_s = statistics.median(float(r["time_stats.mlp_down_proj.median"]) for r in picked)
    [entry] = _find(h100, Op.GEMM, m=4096, n=4096, k=11008 // 2)
    assert entry.median_s == pytest.approx(expected_s * 1e-3, rel=1e-12)
    assert entry.repeats == 20 * len(picked)


@needs_vidur
def test_imported_all_reduce_is_the_csv_median(h100: Profile) -> None:
    rows = _rows(VIDUR_DIR / "network/h100_dgx/all_reduce.csv")
    picked = [r for r in rows if r["num_workers"] == "8" and r["size"] == "67108864"]
    expected_s = statistics.median(float(r["time_stats.all_reduce.median"]) for r in picked)
    [entry] = _find(
        h100, Op.COLLECTIVE, kind="all_reduce", world_size=8, scope="intra", num_bytes=67108864
    )
    assert entry.median_s == pytest.approx(expected_s * 1e-3, rel=1e-12)


@needs_vidur
def test_send_recv_across_nodes_is_scoped_inter(h100: Profile) -> None:
    scopes = {e.params["scope"] for e in h100.entries_for(Op.COLLECTIVE)}
    assert scopes == {"intra", "inter"}
    inter = [e for e in h100.entries_for(Op.COLLECTIVE) if e.params["scope"] == "inter"]
    assert {(e.params["kind"], e.params["world_size"]) for e in inter} == {("send_recv", 2)}
    without = import_vidur(VIDUR_DIR, "a100", inter_node=False)
    assert all(e.params["scope"] == "intra" for e in without.entries_for(Op.COLLECTIVE))


@needs_vidur
def test_unknown_gpu_and_wrong_folder_are_user_errors(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="a40"):
        import_vidur(VIDUR_DIR, "a40")
    with pytest.raises(SpecError, match=r"mlp\.csv"):
        import_vidur(tmp_path, "h100")


@needs_vidur
def test_h100_efficiencies_match_published_figures(h100: Profile) -> None:
    eff = derive_efficiencies(h100, H100_SXM)
    assert 0.65 <= eff.compute_fraction <= 0.85  # published: large GEMMs 69-82 % of peak
    lo, hi = eff.decode_hbm_fraction_range
    assert 0.65 <= lo <= hi <= 0.95  # published: decode GEMMs 81-90 % of HBM bandwidth
    assert 0.8 <= eff.hbm_fraction <= 0.95
    assert 20e-6 <= eff.network.allreduce_floor_s[8] <= 50e-6  # published ~35 us
    [at_16mib] = _find(
        h100, Op.COLLECTIVE, kind="all_reduce", world_size=8, scope="intra", num_bytes=16 << 20
    )
    bus_bytes_per_s = ops.bytes_moved(Op.COLLECTIVE, at_16mib.params, 2) / at_16mib.median_s
    assert bus_bytes_per_s == pytest.approx(255e9, rel=0.1)  # published ~255 GB/s


@needs_vidur
def test_completed_profiles_cover_every_op(
    built: dict[str, Profile], h100_imported: Profile
) -> None:
    assert set(built) == {r.name for r in RECIPES}
    unmeasured = (Op.ATTN_PREFILL_FWD, Op.ATTN_PREFILL_BWD, Op.ATTN_DECODE, Op.OPTIMIZER, Op.COPY)
    for profile in (built["a100-80gb"], h100_imported):
        for op in unmeasured:
            assert {e.source for e in profile.entries_for(op)} == {Source.DATASHEET}
    for name, profile in built.items():
        assert profile.name == name and profile.provenance.source is Source.MIXED
        assert set(profile.coverage()) == {op.value for op in REQUIRED_OPS}
    # The H100 was measured on one GPU: every kernel op but the collectives is measured.
    # Ray call dispatch is host work, imported from the cpu profile's host.
    expected = {Op.COLLECTIVE: {Source.IMPORTED, Source.DATASHEET}, Op.DISPATCH: {Source.IMPORTED}}
    for op in REQUIRED_OPS:
        sources = {e.source for e in built["h100-sxm"].entries_for(op)}
        assert sources == expected.get(op, {Source.MEASURED})


@needs_vidur
def test_imported_entries_survive_completion_and_series_never_mix(
    built: dict[str, Profile], h100: Profile, h100_imported: Profile
) -> None:
    assert set(h100.entries) <= set(h100_imported.entries)
    for completed in (h100_imported, built["h100-sxm"]):
        sources: dict[tuple, set[Source]] = {}
        for e in completed.entries:
            sources.setdefault((e.op, ops.series_key(e.op, e.params)), set()).add(e.source)
        assert all(len(s) == 1 for s in sources.values())


def test_inter_node_collectives_follow_nccls_ring_and_tree() -> None:
    """Hand-computed: 40 us over 2 nodes, 10 us per further network step, a 1 GB/s link."""
    fig = DatasheetFigures(
        name="oracle",
        peak_bf16_flops_per_s=1e15,
        hbm_bytes_per_s=1e12,
        nvlink_bytes_per_s=1e11,
        inter_node_bytes_per_s=1e9,
        host_link_bytes_per_s=1e10,
        sources="test",
    )
    net = NetworkEfficiencies(
        allreduce_floor_s={8: 5e-6},
        allreduce_bus_bytes_per_s={8: 1e11},
        p2p_floor_s=5e-6,
        p2p_fraction=1.0,
        inter_latency_s=40e-6,
        inter_hop_s=10e-6,
        inter_fraction=1.0,
        inter_from="test",
    )
    ar, ag = CollectiveKind.ALL_REDUCE, CollectiveKind.ALL_GATHER
    # 1 KiB over 8 nodes: ring 40 + 2·6·10 us + 1.75 KiB / 1 GB/s = 161.792 us; tree
    # 40 + 2·2·10 us + 1 KiB / 0.45 GB/s = 82.2756 us: the tree.
    assert inter_node_s(ar, 1024, 8, fig, net) == pytest.approx(80e-6 + 1024 / 0.45e9)
    # 1 GiB over 8 nodes: ring 160 us + 1.879 s against tree 80 us + 2.386 s: the ring.
    assert inter_node_s(ar, 1 << 30, 8, fig, net) == pytest.approx(160e-6 + 1.75 * (1 << 30) / 1e9)
    # Over 2 nodes nothing is added to the 2-node latency.
    assert inter_node_s(ar, 1024, 2, fig, net) == pytest.approx(40e-6 + 1024 / 1e9)
    # An all-gather is a ring only, 7 network steps over 8 nodes (6 beyond 2 nodes').
    assert inter_node_s(ag, 1024, 8, fig, net) == pytest.approx(100e-6 + 7 / 8 * 1024 / 1e9)
    # A send/recv is one step whatever the group.
    sr = CollectiveKind.SEND_RECV
    assert inter_node_s(sr, 1024, 2, fig, net) == pytest.approx(40e-6 + 1024 / 1e9)
    with pytest.raises(SpecError, match="at least 2 nodes"):
        inter_node_s(ar, 1024, 1, fig, net)


@needs_vidur
def test_datasheet_entries_follow_the_roofline(h100_imported: Profile, h100: Profile) -> None:
    eff = derive_efficiencies(h100, H100_SXM)
    profile = h100_imported
    # Llama-3.1-8B LM head at TP 1, 4096 tokens: compute-bound.
    [lm_head] = _find(profile, Op.GEMM, m=4096, n=128256, k=4096)
    flops = 2 * 4096 * 128256 * 4096
    assert lm_head.source is Source.DATASHEET
    assert lm_head.median_s == pytest.approx(
        eff.fixed_s + flops / (989e12 * eff.compute_fraction), rel=1e-9
    )
    # 64-GPU all-reduce across 64 nodes, NCCL's two algorithms over a 50 GB/s NIC: a ring
    # of 2 (n - 1) / n bytes per GPU and 2·63 network steps (2·62 more than over 2 nodes),
    # or a tree of 2·log2(64) steps (2·5 more) at 0.9 · 0.5 of the link; the faster.
    size = 1 << 26
    [inter] = _find(
        profile, Op.COLLECTIVE, kind="all_reduce", world_size=64, scope="inter", num_bytes=size
    )
    net = eff.network
    link = 50e9 * net.inter_fraction
    ring = net.inter_latency_s + 2 * 62 * net.inter_hop_s + 2 * 63 / 64 * size / link
    tree = net.inter_latency_s + 2 * 5 * net.inter_hop_s + size / (0.45 * link)
    assert inter.median_s == pytest.approx(min(ring, tree), rel=1e-9)
    assert inter.p10_s == inter.median_s == inter.p90_s
    # The hop is the imported inter-node send/recv's floor; over 2 nodes both algorithms
    # pay the 2-node latency and the ring's bandwidth wins.
    [pair] = _find(
        profile, Op.COLLECTIVE, kind="all_reduce", world_size=2, scope="inter", num_bytes=size
    )
    assert pair.median_s == pytest.approx(net.inter_latency_s + size / link, rel=1e-9)
    # An all-gather is a ring only: 63 network steps over 64 nodes, 62 more than over 2.
    [gather] = _find(
        profile, Op.COLLECTIVE, kind="all_gather", world_size=64, scope="inter", num_bytes=size
    )
    expected = net.inter_latency_s + 62 * net.inter_hop_s + 63 / 64 * size / link
    assert gather.median_s == pytest.approx(expected, rel=1e-9)


@needs_vidur
def test_shipped_files_are_what_the_build_gives(built: dict[str, Profile]) -> None:
    for name, path in SHIPPED.items():
        shipped = load_profile_file(path)
        assert [e.to_json() for e in shipped.entries] == [e.to_json() for e in built[name].entries]


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_shipped_gpu_profile_loads_with_provenance(name: str) -> None:
    path = SHIPPED[name]
    profile = load_profile_file(path)
    assert profile.name == name and profile.device_kind == "cuda"
    assert profile.provenance.source is Source.MIXED
    assert "microsoft/vidur" in profile.provenance.notes and "MIT" in profile.provenance.notes
    assert set(profile.coverage()) == {op.value for op in REQUIRED_OPS}
    measured = {"measured"} if name == "h100-sxm" else set()
    assert set(profile.sources()) == {"imported", "datasheet"} | measured
    assert any(e.params.get("scope") == Scope.INTER.value for e in profile.entries)
    # Datasheet entries cover every catalogue model's shapes; the bound keeps the
    # shipped files a download, not a dataset (about 2 MB with the Qwen3 family).
    assert path.stat().st_size < 3_000_000
    if measured:
        # The measurement's own provenance travels with the file.
        record = profile.grid["measured"]
        assert record["device_name"] == "NVIDIA H100 80GB HBM3" and record["dtype"] == "bf16"
        assert profile.provenance.dtype == "bf16"


def _entry(op: Op, source: Source, median_s: float, **params: int | str) -> Entry:
    return Entry(
        op=op, params=params, median_s=median_s, p10_s=median_s, p90_s=median_s, repeats=1,
        source=source,
    )  # fmt: skip


def _profile(name: str, *entries: Entry, kind: str = "cuda") -> Profile:
    prov = Provenance(
        source=Source.MIXED, device_name="gpu", torch_version="t", dtype="bf16", date="d"
    )
    return Profile(name=name, device_kind=kind, provenance=prov, entries=entries)


def test_overlay_keeps_other_sources_only_where_nothing_was_measured() -> None:
    gemm_imported = _entry(Op.GEMM, Source.IMPORTED, 1e-5, m=8, n=64, k=64)
    add_imported = _entry(Op.ELEMENTWISE, Source.IMPORTED, 2e-6, kind="add", num_bytes=1024)
    norm_imported = _entry(Op.ELEMENTWISE, Source.IMPORTED, 3e-6, kind="rmsnorm", num_bytes=1024)
    ar = dict(kind="all_reduce", world_size=8, scope="intra", num_bytes=1 << 20)
    ar_imported = _entry(Op.COLLECTIVE, Source.IMPORTED, 5e-5, **ar)
    base = _profile("base", gemm_imported, add_imported, norm_imported, ar_imported)
    gemm_measured = _entry(Op.GEMM, Source.MEASURED, 2e-5, m=16, n=128, k=64)
    add_measured = _entry(Op.ELEMENTWISE, Source.MEASURED, 9e-6, kind="add", num_bytes=4096)
    measured = MeasuredSet(entries=(gemm_measured, add_measured), provenance={"files": ["x"]})
    out = overlay_measured(base, measured)
    # GEMMs and the add were measured: their imported entries go, even at other shapes;
    # the RMSNorm and the all-reduce were not: theirs stay.
    assert set(out.entries) == {gemm_measured, add_measured, norm_imported, ar_imported}
    assert out.grid["measured"] == {"files": ["x"]}
    assert "replace the 2 imported or datasheet entries" in out.provenance.notes


def test_measured_files_are_deduplicated_first_file_first(tmp_path: Path) -> None:
    a = _entry(Op.GEMM, Source.MEASURED, 1e-5, m=8, n=64, k=64)
    a_again = _entry(Op.GEMM, Source.MEASURED, 7e-5, m=8, n=64, k=64)
    b = _entry(Op.GEMM, Source.MEASURED, 2e-5, m=16, n=64, k=64)
    first = save_profile(_profile("one", a), tmp_path / "one.json")
    second = save_profile(_profile("two", a_again, b), tmp_path / "two.json")
    got = measured_from_files([first, second])
    assert got.entries == (a, b)
    assert got.provenance["files"] == ["one.json", "two.json"]
    cpu = save_profile(_profile("cpu", a, kind="cpu"), tmp_path / "cpu.json")
    with pytest.raises(ValueError, match="a cpu profile; GPU profiles need cuda"):
        measured_from_files([cpu])


@pytest.mark.skipif(
    not all(p.exists() for p in H100_MEASURED), reason=f"no H100 files in {H100_MEASURED_DIR}"
)
def test_shipped_h100_measured_entries_are_the_measured_files() -> None:
    shipped = load_profile_file(SHIPPED["h100-sxm"])
    expected = measured_from_files(H100_MEASURED)
    got = {e for e in shipped.entries if e.source is Source.MEASURED}
    assert got == set(expected.entries)
