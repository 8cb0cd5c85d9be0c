"""The cost model on the shipped, measured CPU profile of this machine's kind."""

from placeflow.profiles.costmodel import CostModel
from placeflow.profiles.registry import load_profile
from placeflow.profiles.schema import Op, Source


def test_shipped_cpu_profile_is_measured_and_covers_every_cpu_op():
    profile = load_profile("cpu")
    assert profile.provenance.source is Source.MEASURED
    assert all(e.source is Source.MEASURED for e in profile.entries)
    expected = {
        Op.GEMM,
        Op.ATTN_PREFILL_FWD,
        Op.ATTN_PREFILL_BWD,
        Op.ATTN_DECODE,
        Op.ELEMENTWISE,
        Op.OPTIMIZER,
        Op.COLLECTIVE,
    }
    assert expected <= {Op(op) for op in profile.coverage()}


def test_exact_at_profiled_points_of_the_measured_profile():
    profile = load_profile("cpu")
    model = CostModel.fit(profile)
    for e in profile.entries[::7]:
        assert model.time_s(e.op, e.params) == e.median_s
