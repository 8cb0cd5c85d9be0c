"""The cost model on the shipped, measured CPU profile of this machine's kind."""

import torch

from placeflow.profiles import ops
from placeflow.profiles.costmodel import CostModel
from placeflow.profiles.registry import load_profile
from placeflow.profiles.schema import Op, Source
from placeflow.profiles.timing import CpuClock, time_fn


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


def test_roofline_extrapolation_within_2x_of_a_held_out_large_gemm_measured_here():
    profile = load_profile("cpu")
    model = CostModel.fit(profile)
    gemms = profile.entries_for(Op.GEMM)
    # The series of the largest profiled GEMM, at 8x its largest token count: well beyond
    # the data, so the answer comes from the roofline anchored at the series' end.
    largest = max(gemms, key=lambda e: ops.flops(Op.GEMM, e.params))
    n, k = largest.params["n"], largest.params["k"]
    m_max = max(e.params["m"] for e in gemms if (e.params["n"], e.params["k"]) == (n, k))
    m = 8 * int(m_max)
    params = {"m": m, "n": int(n), "k": int(k)}
    assert ops.flops(Op.GEMM, params) > 2 * max(ops.flops(Op.GEMM, e.params) for e in gemms)
    a, b = torch.randn(m, int(k)), torch.randn(int(k), int(n))
    torch.set_num_threads(int(profile.provenance.host.get("torch_threads", 2)))
    measured = time_fn(lambda: a @ b, CpuClock(), warmup=2, repeats=5, budget_s=20.0).median_s
    predicted = model.gemm_s(m, int(n), int(k))
    assert 0.5 <= predicted / measured <= 2.0, (predicted, measured)
