"""CostModel against oracles: synthetic profiles generated from a known roofline."""

import dataclasses
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from placeflow.errors import ProfileSchemaError, SpecError
from placeflow.profiles import ops
from placeflow.profiles.costmodel import (
    CostModel,
    ProfileCoverageError,
    fit_roofline,
    leave_one_out,
)
from placeflow.profiles.schema import (
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

OVERHEAD_S, PEAK_FLOPS, PEAK_BW = 5e-6, 1e11, 2e10  # the oracle's truth


def oracle_gemm_s(m, n, k):
    return OVERHEAD_S + max(2 * m * n * k / PEAK_FLOPS, 4 * (m * k + k * n + m * n) / PEAK_BW)


def entry(op, params, t, source=Source.MEASURED):
    return Entry(
        op=op, params=params, median_s=t, p10_s=t * 0.95, p90_s=t * 1.05, repeats=5, source=source
    )


def synthetic_profile(ms=(1, 4, 16, 64, 256, 1024), nks=((512, 512), (1024, 256)), noise=None):
    rng = np.random.default_rng(0)
    entries = []
    for n, k in nks:
        for m in ms:
            t = oracle_gemm_s(m, n, k)
            if noise:
                t *= float(np.exp(rng.normal(0, noise)))
            entries.append(entry(Op.GEMM, {"m": m, "n": n, "k": k}, t))
    for size in (1 << 12, 1 << 16, 1 << 20, 1 << 24):
        for world in (2, 4):
            t = 20e-6 + size * 2 * (world - 1) / world / 5e9
            entries.append(
                entry(
                    Op.COLLECTIVE,
                    {
                        "kind": "all_reduce",
                        "world_size": world,
                        "scope": "intra",
                        "num_bytes": size,
                    },
                    t,
                )
            )
    prov = Provenance(
        source=Source.MEASURED,
        device_name="oracle",
        torch_version="n/a",
        dtype="fp32",
        date="2026-11-22",
    )
    return Profile(name="oracle", device_kind="cpu", provenance=prov, entries=tuple(entries))


def test_exact_at_profiled_points():
    profile = synthetic_profile(noise=0.1)
    model = CostModel.fit(profile)
    for e in profile.entries:
        assert model.time_s(e.op, e.params) == pytest.approx(e.median_s, rel=1e-12)


@settings(max_examples=200, deadline=None)
@given(a=st.integers(1, 1023), b=st.integers(1, 1023))
def test_monotone_between_points(a, b):
    model = CostModel.fit(synthetic_profile())
    lo, hi = sorted((a, b))
    assert model.gemm_s(lo, 512, 512) <= model.gemm_s(hi, 512, 512) * (1 + 1e-12)


def test_interpolation_close_to_truth_between_points():
    model = CostModel.fit(synthetic_profile())
    for m in (2, 10, 100, 700):
        assert model.gemm_s(m, 512, 512) == pytest.approx(oracle_gemm_s(m, 512, 512), rel=0.35)


def test_roofline_fit_recovers_the_oracle():
    # Small shapes expose the overhead, large ones the peaks.
    shapes = [(m, nk, nk) for nk in (64, 1024) for m in (1, 2, 8, 32, 128, 512, 2048, 8192)]
    m, n, k = (np.array(x, dtype=float) for x in zip(*shapes, strict=True))
    times = np.array([oracle_gemm_s(*s) for s in shapes])
    flops = 2 * m * n * k
    nbytes = 4 * (m * k + k * n + m * n)
    roof = fit_roofline(flops, nbytes, times)
    assert roof.flops_per_s == pytest.approx(PEAK_FLOPS, rel=0.1)
    assert roof.bytes_per_s == pytest.approx(PEAK_BW, rel=0.1)
    assert roof.overhead_s == pytest.approx(OVERHEAD_S, rel=0.3)


def test_extrapolation_beyond_the_series_follows_the_roofline():
    model = CostModel.fit(synthetic_profile())
    for m in (4096, 65536):
        assert model.gemm_s(m, 512, 512) == pytest.approx(oracle_gemm_s(m, 512, 512), rel=0.1)


def test_unprofiled_series_uses_the_nearest_one():
    model = CostModel.fit(synthetic_profile())
    assert model.gemm_s(256, 2048, 2048) == pytest.approx(oracle_gemm_s(256, 2048, 2048), rel=0.15)


def test_collectives_by_bus_bandwidth():
    model = CostModel.fit(synthetic_profile())
    # All-gather was never profiled: it borrows the all-reduce's bus bandwidth (half the bus bytes).
    ar = model.collective_s(CollectiveKind.ALL_REDUCE, 1 << 24, 2, Scope.INTRA)
    ag = model.collective_s(CollectiveKind.ALL_GATHER, 1 << 24, 2, Scope.INTRA)
    assert ag < ar and ag == pytest.approx(ar / 2, rel=0.2)
    # An unprofiled world size falls back to the fitted roofline.
    t8 = model.collective_s(CollectiveKind.ALL_REDUCE, 1 << 24, 8, Scope.INTRA)
    assert t8 == pytest.approx(20e-6 + (1 << 24) * 2 * 7 / 8 / 5e9, rel=0.15)
    assert model.collective_s(CollectiveKind.ALL_REDUCE, 1 << 20, 1, Scope.INTRA) == 0.0


def test_missing_coverage_is_a_clear_error():
    model = CostModel.fit(synthetic_profile())
    with pytest.raises(ProfileCoverageError, match="no entries for attn_decode"):
        model.time_s(
            Op.ATTN_DECODE,
            {"batch": 1, "kv_len": 8, "num_heads": 4, "num_kv_heads": 4, "head_dim": 32},
        )
    # A GPU profile without inter-node entries cannot price a collective across nodes.
    gpu = CostModel.fit(dataclasses.replace(synthetic_profile(), device_kind="cuda"))
    with pytest.raises(ProfileCoverageError, match="inter"):
        gpu.collective_s(CollectiveKind.ALL_REDUCE, 1 << 20, 16, Scope.INTER)


def test_cpu_nodes_share_the_host_loopback():
    # A CPU profile's nodes are groups of logical workers on the host it measured:
    # across them a collective costs what it costs within one.
    model = CostModel.fit(synthetic_profile())
    inter = model.collective_s(CollectiveKind.ALL_REDUCE, 1 << 20, 4, Scope.INTER)
    assert inter == model.collective_s(CollectiveKind.ALL_REDUCE, 1 << 20, 4, Scope.INTRA)


def test_leave_one_out_on_a_noiseless_profile_is_small():
    report = leave_one_out(synthetic_profile())
    assert report.num_points == len(synthetic_profile().entries)
    assert report.median_rel_err < 0.1


def test_profile_round_trip_and_schema_version(tmp_path):
    profile = synthetic_profile()
    path = save_profile(profile, tmp_path / "p.json")
    assert load_profile_file(path) == profile
    data = json.loads(path.read_text())
    data["schema_version"] = 99
    path.write_text(json.dumps(data))
    with pytest.raises(ProfileSchemaError, match="schema version 99"):
        load_profile_file(path)
    path.write_text('{"hello": 1}')
    with pytest.raises(ProfileSchemaError, match="not a placeflow profile"):
        load_profile_file(path)


def _collective_profile() -> Profile:
    """Collectives following t = a + bus bytes / W exactly: a NIC of 1e9 B/s per GPU
    across nodes, 4e9 B/s of bus bandwidth within one."""
    entries = []
    for size in (1 << b for b in range(10, 31, 2)):
        for kind in ("all_reduce", "all_gather", "all_to_all", "send_recv"):
            for world in (2, 4, 8, 16):
                for scope, lat, bw in (("intra", 5e-6, 4e9), ("inter", 20e-6, 1e9)):
                    if (scope == "intra" and world > 8) or (kind == "send_recv" and world != 2):
                        continue
                    bus = size * ops.collective_bus_factor(kind, world)
                    params = {"kind": kind, "world_size": world, "scope": scope, "num_bytes": size}
                    entries.append(entry(Op.COLLECTIVE, params, lat + bus / bw))
    prov = Provenance(
        source=Source.MEASURED, device_name="oracle", torch_version="n/a", dtype="bf16",
        date="2026-11-23",
    )  # fmt: skip
    return Profile(name="oracle-net", device_kind="cuda", provenance=prov, entries=tuple(entries))


def _growing_latency_model() -> CostModel:
    """All-reduces whose inter-node latency grows by 10 us per node (a ring's network
    steps), 1e9 B/s per NIC; within a node 5 us and 4e9 B/s."""
    entries = []
    for size in (1 << b for b in range(10, 31, 2)):
        for world in (2, 4, 8, 16):
            for scope, lat, bw in (("intra", 5e-6, 4e9), ("inter", 10e-6 * world, 1e9)):
                if scope == "intra" and world > 8:
                    continue
                bus = size * ops.collective_bus_factor("all_reduce", world)
                params = {"kind": "all_reduce", "world_size": world, "scope": scope}
                entries.append(entry(Op.COLLECTIVE, {**params, "num_bytes": size}, lat + bus / bw))
    return CostModel.fit(dataclasses.replace(_collective_profile(), entries=tuple(entries)))


def test_an_unprofiled_node_count_lies_between_its_profiled_neighbours():
    """12 nodes, between the oracle's 8 and 16: linear in the node count at the same
    bytes, which for a ring's latency (10 us per node) is exact; the bus factor
    2 (N - 1) / N is not linear in N, so the bandwidth term is 1.1 % short of the
    oracle's own formula at 12 nodes."""
    model = _growing_latency_model()
    size = 1 << 20
    t8 = 80e-6 + size * 2 * 7 / 8 / 1e9
    t16 = 160e-6 + size * 2 * 15 / 16 / 1e9
    got = model.collective_s(CollectiveKind.ALL_REDUCE, size, 12, Scope.INTER)
    assert got == pytest.approx((t8 + t16) / 2, rel=1e-9)
    assert got == pytest.approx(120e-6 + size * 2 * 11 / 12 / 1e9, rel=1.5e-2)
    # Beyond the largest profiled count there is no neighbour: the fitted roofline answers.
    assert model.collective_s(CollectiveKind.ALL_REDUCE, size, 24, Scope.INTER) > 0


def test_a_ring_across_nodes_pays_the_latency_of_its_nodes_not_of_its_ranks():
    """16 ranks, 4 on each of 4 nodes: the ring's network steps are those of 4 nodes, so
    the latency is the 4-node entry's, not the 16-node one's."""
    model = _growing_latency_model()
    size = 1 << 12  # latency-bound
    got = model.collective_s(CollectiveKind.ALL_REDUCE, size, 16, Scope.INTER, ranks_per_node=4)
    # The 4-node entry at a quarter of the 16-rank ring's bus bytes (per NIC), expressed in
    # the 4-node ring's bytes: 2·15/16 · size / 4 bus bytes = 1.5 · x, x = size · 5/16.
    per_nic_bytes = size * 2 * 15 / 16 / 4 / 1.5
    expected = 40e-6 + per_nic_bytes * 1.5 / 1e9
    # 1280 bytes lie between the oracle's 1 and 4 KiB points: log-log interpolation of a
    # latency-plus-bandwidth line, within 1 %.
    assert got == pytest.approx(expected, rel=1e-2)
    assert got < 160e-6  # not the 16-node entry's latency


def test_collectives_across_nodes_use_one_nic_per_rank_of_the_node():
    """NCCL's rings over g ranks per node use g NICs: hand-computed from the oracle."""
    model = CostModel.fit(_collective_profile())
    ar, ag, a2a = CollectiveKind.ALL_REDUCE, CollectiveKind.ALL_GATHER, CollectiveKind.ALL_TO_ALL
    size = 1 << 26
    # One rank per node: the flat inter-node entry (16 ranks, 2·15/16 bus factor, one NIC).
    flat = 20e-6 + size * 2 * 15 / 16 / 1e9
    assert model.collective_s(ar, size, 16, Scope.INTER) == pytest.approx(flat, rel=1e-9)
    # 4 ranks on each of 4 nodes: 4 NICs carry the ring's bytes, priced on the 4-node
    # entry (a size between profiled points: log-log interpolation, hence 1e-3).
    four = 20e-6 + size / 4 * 2 * 15 / 16 / 1e9
    got = model.collective_s(ar, size, 16, Scope.INTER, ranks_per_node=4)
    assert got == pytest.approx(four, rel=1e-3)
    # 8 ranks on each of 2 nodes, all-gather: 8 NICs are faster than the NVLink hops
    # (4e9 B/s), so the NVLink bound decides: bus bytes 15/16 of the size over 4e9 B/s
    # (a size between profiled points: log-log interpolation, hence 1e-3).
    nvlink = 5e-6 + size * 15 / 16 / 4e9
    got = model.collective_s(ag, size, 16, Scope.INTER, ranks_per_node=8)
    assert got == pytest.approx(nvlink, rel=1e-3)
    assert got >= 20e-6 + size / 8 * 15 / 16 / 1e9
    # All-to-all: each rank's own NIC carries the share that leaves its node, 12 of 16.
    leaving = 20e-6 + size * 12 / 15 * 15 / 16 / 1e9
    got = model.collective_s(a2a, size, 16, Scope.INTER, ranks_per_node=4)
    assert got == pytest.approx(leaving, rel=1e-3)
    # Send/recv is one pair: the group's shape does not matter.
    sr = CollectiveKind.SEND_RECV
    assert model.collective_s(sr, size, 2, Scope.INTER) == pytest.approx(20e-6 + size / 1e9)
    with pytest.raises(SpecError, match="has 1 to 15 of them per node; got ranks_per_node=16"):
        model.collective_s(ar, size, 16, Scope.INTER, ranks_per_node=16)


def test_a_copy_from_memory_streams_at_the_largest_copys_bandwidth():
    """Copies whose small sizes stay in cache: 1 MiB in 10 us (100 GB/s), 256 MiB in
    25.6 ms (10 GB/s from memory). Streamed from memory 1 MiB takes 1/256 of 25.6 ms =
    100 us; a size whose own entry is slower keeps it."""
    mib = 1 << 20
    entries = [
        entry(Op.COPY, {"direction": "h2d", "num_bytes": mib}, 10e-6),
        entry(Op.COPY, {"direction": "h2d", "num_bytes": 64 * mib}, 12.8e-3),  # 5 GB/s
        entry(Op.COPY, {"direction": "h2d", "num_bytes": 256 * mib}, 25.6e-3),
    ]
    prov = Provenance(
        source=Source.MEASURED, device_name="oracle", torch_version="n/a", dtype="fp32",
        date="2026-11-26",
    )  # fmt: skip
    model = CostModel.fit(
        Profile(name="oracle-copy", device_kind="cpu", provenance=prov, entries=tuple(entries))
    )
    assert model.copy_s("h2d", mib) == pytest.approx(10e-6)
    assert model.stream_copy_s("h2d", mib) == pytest.approx(100e-6)
    assert model.stream_copy_s("h2d", 64 * mib) == pytest.approx(12.8e-3)
    assert model.stream_copy_s("h2d", 0) == 0.0
