"""`profiles.hostcheck`: a CPU profile's identity and kernels against this host."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from pathlib import Path

import pytest

from placeflow.errors import SpecError
from placeflow.profiles.hostcheck import (
    check_host,
    drift_points,
    host_identity,
    identity_differences,
    retime,
    speeds_apart,
)
from placeflow.profiles.profiler import _host
from placeflow.profiles.schema import Entry, Op, Profile, Provenance, Source


def _gemm(m: int, n: int, k: int, median_s: float, source: Source = Source.MEASURED) -> Entry:
    return Entry(
        op=Op.GEMM, params={"m": m, "n": n, "k": k}, median_s=median_s, p10_s=median_s,
        p90_s=median_s, repeats=3, source=source,
    )  # fmt: skip


def _profile(*entries: Entry, host: dict[str, object] | None = None, kind: str = "cpu") -> Profile:
    prov = Provenance(
        source=Source.MEASURED, device_name="cpu", torch_version="t", dtype="fp32", date="d",
        host=host or {},
    )  # fmt: skip
    return Profile(name="p", device_kind=kind, provenance=prov, entries=entries)


CPUINFO = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 25
model\t\t: 1
model name\t: AMD EPYC
stepping\t: 1

processor\t: 1
vendor_id\t: AuthenticAMD
cpu family\t: 26
model\t\t: 17
model name\t: Other
stepping\t: 0
"""


def test_the_identity_is_the_first_processors_family_model_and_stepping(tmp_path: Path) -> None:
    path = tmp_path / "cpuinfo"
    path.write_text(CPUINFO)
    here = host_identity(path)
    assert here["cpu_model"] == "AMD EPYC"
    assert (here["cpu_family"], here["cpu_model_number"], here["cpu_stepping"]) == ("25", "1", "1")
    assert isinstance(here["cpu_isa"], str) and here["cpu_count"]
    # A host without /proc/cpuinfo still has its ISA and core count.
    bare = host_identity(tmp_path / "absent")
    assert "cpu_family" not in bare and "cpu_isa" in bare


def test_a_new_profile_records_the_identity() -> None:
    host = _host("cpu")
    assert {"cpu_isa", "cpu_count", "cpu_model"} <= host.keys()


def test_a_new_profile_records_the_caches_its_cold_weights_are_priced_by(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import placeflow.profiles.profiler as profiler

    monkeypatch.setattr(profiler, "level2_cache_bytes", lambda: 1 << 20)
    monkeypatch.setattr(profiler, "last_level_cache_bytes", lambda: 32 << 20)
    host = _host("cpu")
    assert (host["l2_bytes"], host["llc_bytes"]) == (1 << 20, 32 << 20)


def test_only_fields_recorded_on_both_sides_can_differ() -> None:
    recorded = {"cpu_model": "AMD EPYC", "cpu_family": "25", "cpu_isa": "AVX512", "hostname": "a"}
    here = {"cpu_model": "AMD EPYC", "cpu_family": "25", "cpu_model_number": "1", "cpu_isa": "AVX2"}
    assert identity_differences(recorded, here) == ["cpu_isa: 'AVX512' in the profile, 'AVX2' here"]
    # An old profile records only the name: nothing else is known to differ.
    assert identity_differences({"cpu_model": "AMD EPYC"}, here) == []
    # Values compare as text: a count read back from JSON as a number is the same count.
    assert identity_differences({"cpu_count": 2}, {"cpu_count": "2"}) == []


def test_the_gemms_retimed_span_the_profiles_range_of_flops() -> None:
    # Eleven GEMMs in range (m = 1..11, flops growing with m), one too fast, one too slow,
    # one imported: four points are the 1st, 4th, 8th and 11th in order of flops
    # (indices round(i * 10 / 3) = 0, 3, 7, 10).
    inside = [_gemm(m, 64, 64, 1e-3) for m in range(1, 12)]
    others = [
        _gemm(100, 64, 64, 1e-6),
        _gemm(200, 64, 64, 1.0),
        _gemm(300, 64, 64, 1e-3, Source.IMPORTED),
    ]
    profile = _profile(*others, *reversed(inside))
    assert [e.params["m"] for e in drift_points(profile, 4)] == [1, 4, 8, 11]
    assert [e.params["m"] for e in drift_points(profile, 20)] == list(range(1, 12))
    assert drift_points(_profile(*others), 4) == ()


def _scaled(factors: Sequence[float]):  # type: ignore[no-untyped-def]
    def timer(profile: Profile, entries: Sequence[Entry]) -> list[float]:
        return [e.median_s * f for e, f in zip(entries, factors, strict=True)]

    return timer


def test_the_ratio_is_the_median_of_this_hosts_time_over_the_profiles() -> None:
    profile = _profile(
        _gemm(8, 64, 64, 1e-3), _gemm(16, 64, 64, 2e-3), _gemm(32, 64, 64, 4e-3),
        host={"cpu_model": "AMD EPYC", "cpu_isa": "AVX512"},
    )  # fmt: skip
    here = {"cpu_model": "AMD EPYC", "cpu_isa": "AVX2"}
    # Times of 1.5, 2.0 and 3.0 the profile's: median 2.0, outside 50 % either way.
    slow = check_host(profile, timer=_scaled([1.5, 2.0, 3.0]), here=here)
    assert slow.ratio == pytest.approx(2.0) and not slow.ok
    assert slow.differences == ("cpu_isa: 'AVX512' in the profile, 'AVX2' here",)
    text = slow.summary()
    assert "2.00x" in text and "placeflow profile --device cpu" in text and "AVX2" in text

    # Twice as fast is as far off as twice as slow (the tolerance is a ratio either way):
    # with 25 %, 1/1.25 = 0.8 is the edge below.
    def at(f: float, tolerance: float = 0.25) -> bool:
        return check_host(profile, timer=_scaled([f] * 3), here=here, tolerance=tolerance).ok

    assert not at(0.5, 0.5) and at(0.67, 0.5) and at(1.5, 0.5) and not at(1.51, 0.5)
    assert at(0.81) and not at(0.79) and at(1.24) and not at(1.26)
    near = check_host(profile, timer=_scaled([0.9, 1.1, 1.24]), here=here, tolerance=0.25)
    assert near.ratio == pytest.approx(1.1) and near.ok and "within 25%" in near.summary()
    # A point that could not be timed is left out of the median.
    gap = check_host(profile, timer=_scaled([math.nan, 1.0, 3.0]), here=here)
    assert gap.ratio == pytest.approx(2.0)
    row = gap.to_json()
    assert row["ok"] is False and len(row["gemms"]) == 3  # type: ignore[arg-type]


def test_nothing_to_retime_is_taken_as_this_host_and_gpu_profiles_are_refused() -> None:
    empty = check_host(_profile(), timer=_scaled([]), here={})
    assert empty.ratio is None and empty.ok and "no measured GEMM" in empty.summary()
    with pytest.raises(ValueError, match="cuda profile"):
        check_host(_profile(kind="cuda"), timer=_scaled([]), here={})


def test_retime_times_each_entry_here() -> None:
    # Real kernels: every entry gets a positive, finite time of its own shape.
    entries = (_gemm(16, 64, 64, 1e-3), _gemm(64, 128, 128, 1e-3))
    times = retime(_profile(*entries), entries)
    assert len(times) == 2 and all(math.isfinite(t) and t > 0 for t in times)


def test_the_host_command_prints_the_check_and_refuses_gpu_profiles(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from placeflow.cli import main
    from placeflow.profiles import hostcheck

    monkeypatch.setattr(hostcheck, "retime", _scaled([2.0] * hostcheck.DEFAULT_POINTS))
    assert main(["profiles", "host", "cpu"]) == 1
    out = capsys.readouterr().out
    assert "profile 'cpu': this host runs its GEMMs at 2.00x" in out
    assert main(["profiles", "host", "h100-sxm"]) == 2
    assert "only a CPU profile" in capsys.readouterr().err


def test_a_profile_at_host_speed_has_every_time_scaled_and_says_so() -> None:
    from placeflow.profiles.hostcheck import at_host_speed

    profile = _profile(_gemm(64, 64, 64, 2e-4), _gemm(512, 512, 512, 4e-3))
    slower = at_host_speed(profile, 1.5, checked="2026-11-27 05:00 UTC")
    assert [(e.median_s, e.p10_s, e.p90_s) for e in slower.entries] == [
        pytest.approx((3e-4, 3e-4, 3e-4)),
        pytest.approx((6e-3, 6e-3, 6e-3)),
    ]
    assert [e.params for e in slower.entries] == [e.params for e in profile.entries]
    assert "x1.500" in slower.provenance.notes and "2026-11-27 05:00 UTC" in slower.provenance.notes
    assert slower.name == profile.name and profile.entries[0].median_s == 2e-4  # a copy
    for bad in (0.0, -1.0, math.nan, math.inf):
        with pytest.raises(SpecError, match="positive"):
            at_host_speed(profile, bad, checked="now")


def _piece(kind: str, median_s: float, num_units: int = 1) -> Entry:
    return Entry(
        op=Op.FRAMEWORK, params={"kind": kind, "num_units": num_units}, median_s=median_s,
        p10_s=median_s, p90_s=median_s, repeats=3, source=Source.MEASURED,
    )  # fmt: skip


def test_the_framework_check_is_the_median_of_the_layers_pieces_by_hand() -> None:
    from placeflow.profiles.hostcheck import check_framework

    profile = _profile(
        _gemm(64, 64, 64, 2e-4),
        _piece("layer_forward", 4e-4),
        _piece("call_forward", 2e-4),
        _piece("layer_backward", 1e-3),
        _piece("call_backward", 1e-3),
        _piece("layer_forward", 9e-4, num_units=64),  # another size: not re-timed
        _piece("wake_call", 1e-3),  # not one of the checked kinds
    )
    # Re-timed here: the layer's forward 0.6x and backward 0.7x of the profile's, the
    # median 0.65; the call pieces (0.9x, 0.1x) are not the check's kinds, a size the
    # profile lacks is left out.
    timed = [
        _piece("layer_forward", 2.4e-4),
        _piece("call_forward", 1.8e-4),
        _piece("layer_backward", 7e-4),
        _piece("call_backward", 1e-4),
        _piece("layer_forward", 1e-3, num_units=256),
    ]
    assert check_framework(profile, timer=lambda: timed) == pytest.approx(0.65)
    calls_only = _profile(_piece("call_forward", 2e-4), _piece("call_backward", 1e-3))
    assert check_framework(calls_only, timer=lambda: timed) is None
    assert check_framework(_profile(_gemm(64, 64, 64, 2e-4)), timer=lambda: timed) is None
    with pytest.raises(SpecError, match="only a CPU"):
        check_framework(_profile(kind="cuda"), timer=lambda: timed)


def test_host_work_entries_take_their_own_ratio_at_host_speed_by_hand() -> None:
    from placeflow.profiles.hostcheck import at_host_speed

    launch = Entry(
        op=Op.DISPATCH, params={"kind": "ray_launch", "num_bytes": 64}, median_s=1e-3,
        p10_s=8e-4, p90_s=2e-3, repeats=3, source=Source.MEASURED,
    )  # fmt: skip
    profile = _profile(
        _gemm(64, 64, 64, 2e-4), _piece("layer_forward", 4e-4), launch, _piece("wake_call", 1e-3)
    )
    both = at_host_speed(profile, 1.5, checked="now", host_work_ratio=0.5)
    assert [(e.median_s, e.p10_s, e.p90_s) for e in both.entries] == [
        pytest.approx((3e-4, 3e-4, 3e-4)),  # a kernel: the GEMMs' ratio
        pytest.approx((2e-4, 2e-4, 2e-4)),  # the engine's piece: its own
        pytest.approx((1.5e-3, 1.2e-3, 3e-3)),  # Ray's call: not the engine's, the GEMMs'
        pytest.approx((1.5e-3, 1.5e-3, 1.5e-3)),  # a shared-cores probe: the GEMMs'
    ]
    assert "x0.500" in both.provenance.notes
    one = at_host_speed(profile, 1.5, checked="now")  # no framework check: one ratio
    assert [e.median_s for e in one.entries] == pytest.approx([3e-4, 6e-4, 1.5e-3, 1.5e-3])
    with pytest.raises(SpecError, match="positive"):
        at_host_speed(profile, 1.5, checked="now", host_work_ratio=0.0)


def test_the_framework_check_re_times_the_engine_s_pieces_here() -> None:
    # The shipped profile's pieces re-timed through the engine at the smallest size:
    # a positive ratio (its size moves with the host's load; only that it is measured).
    from placeflow.profiles.framework import measure_framework
    from placeflow.profiles.hostcheck import FRAMEWORK_CHECK_KINDS, check_framework
    from placeflow.profiles.registry import load_profile

    timed = measure_framework(repeats=2, kinds=FRAMEWORK_CHECK_KINDS, sizes=(0,))
    assert sorted(e.params["kind"] for e in timed) == sorted(k.value for k in FRAMEWORK_CHECK_KINDS)
    assert all(e.params["num_units"] == 1 and e.median_s > 0 for e in timed)
    ratio = check_framework(load_profile("cpu"), timer=lambda: timed)
    assert ratio is not None and math.isfinite(ratio) and ratio > 0


def test_two_speeds_far_apart_say_the_profile_is_of_another_kind_of_host() -> None:
    # This round's VM against the family-25 profile: GEMMs 0.70x, the engine's 0.235x.
    why = speeds_apart(0.70, 0.235)
    assert why is not None
    assert "3.0x apart (more than 2x)" in why and "placeflow profile --device cpu" in why
    # Either way round, and at the bound itself it still describes the host.
    assert speeds_apart(0.235, 0.70) is not None
    assert speeds_apart(1.0, 0.5) is None
    assert speeds_apart(0.9, 0.7) is None
    assert speeds_apart(1.0, 0.5, limit=1.5) is not None
    # Unknown or unusable speeds say nothing.
    assert speeds_apart(None, 0.2) is None
    assert speeds_apart(0.7, None) is None
    assert speeds_apart(0.0, 0.5) is None


def test_a_piece_timed_at_several_sizes_takes_the_work_ratio_in_its_smallest_part_by_hand() -> None:
    from placeflow.profiles.hostcheck import at_host_speed, sized_piece_s

    # The layer's forward: 0.2 ms at its smallest size, 1.2 ms at 64 units. At a host
    # whose GEMMs run at 0.9x and whose smallest pieces at 0.5x: 0.2 x 0.5 + 1.0 x 0.9.
    assert sized_piece_s(1.2e-3, 2e-4, 0.9, 0.5) == pytest.approx(1e-4 + 9e-4)
    # A size that reads faster than the smallest is all dispatch.
    assert sized_piece_s(1.5e-4, 2e-4, 0.9, 0.5) == pytest.approx(7.5e-5)
    small, large = _piece("layer_forward", 2e-4), _piece("layer_forward", 1.2e-3, num_units=64)
    large = dataclasses.replace(large, p10_s=6e-4, p90_s=2.4e-3)
    once = _piece("load_call", 4e-4)  # one size only: all at the work ratio
    at = at_host_speed(_profile(small, large, once), 0.9, checked="now", host_work_ratio=0.5)
    # The larger size's spread keeps its shape: x (1.0 / 1.2) each.
    assert [(e.median_s, e.p10_s, e.p90_s) for e in at.entries] == [
        pytest.approx((1e-4, 1e-4, 1e-4)),
        pytest.approx((1e-3, 5e-4, 2e-3)),
        pytest.approx((2e-4, 2e-4, 2e-4)),
    ]
    # Without the pieces' check every entry takes the GEMMs' ratio, whatever its sizes.
    one = at_host_speed(_profile(small, large), 0.9, checked="now")
    assert [e.median_s for e in one.entries] == pytest.approx([1.8e-4, 1.08e-3])


def test_the_controllers_sized_work_keeps_the_work_ratio_whole() -> None:
    from placeflow.profiles.hostcheck import at_host_speed

    # `rule_reward` at 8 and 32 responses is Python per response, not kernels.
    few, many = _piece("rule_reward", 1e-3, num_units=8), _piece("rule_reward", 4e-3, num_units=32)
    at = at_host_speed(_profile(few, many), 0.9, checked="now", host_work_ratio=0.5)
    assert [e.median_s for e in at.entries] == pytest.approx([5e-4, 2e-3])
