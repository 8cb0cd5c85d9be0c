"""Decode as the rollout engine runs it: host dispatch and device time as two resources.

Oracle: a cost model whose every kernel costs a round number, so that each
decode step's time is computed by hand from the module docstring's rules of
`placeflow.simulator.compute`.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from pathlib import Path

import pytest

from placeflow.catalogue import get_model
from placeflow.errors import SpecError
from placeflow.layout import GenLayout, TrainLayout
from placeflow.profiles.costmodel import CostModel
from placeflow.profiles.schema import CollectiveKind, Scope
from placeflow.simulator import callcosts, compute
from placeflow.simulator.lengths import LengthModel
from placeflow.workload import (
    GRAPH_WARMUP_RUNS,
    RolloutEngine,
    decode_graphed,
    load_workload,
    workload_from_dict,
    workload_to_dict,
)

GEMM_S, ATTN_S, ELEM_S = 10e-6, 20e-6, 4e-6

WORKLOADS = Path(__file__).resolve().parents[1] / "examples" / "workloads"


@dataclasses.dataclass(frozen=True, kw_only=True)
class RoundCosts(CostModel):
    """Every GEMM 10 µs, decode attention 20 µs, elementwise 4 µs, the 1 KiB add `op_s`."""

    op_s: float = 1e-6

    def gemm_s(self, m: int, n: int, k: int) -> float:
        return GEMM_S

    def attn_decode_s(self, batch: int, kv_len: int, *args: int) -> float:
        return ATTN_S

    def elementwise_s(self, kind: str, num_bytes: int) -> float:
        return self.op_s if num_bytes == compute.OP_OVERHEAD_BYTES else ELEM_S

    def collective_s(
        self,
        kind: CollectiveKind,
        num_bytes: int,
        world_size: int,
        scope: Scope,
        *,
        ranks_per_node: int = 1,
        after_s: float | None = None,
    ) -> float:
        return 0.0 if world_size <= 1 else 30e-6


def _costs(device_kind: str, op_s: float) -> RoundCosts:
    return RoundCosts(
        profile_name="round", dtype_bytes=2, rooflines={}, series={}, device_kind=device_kind,
        op_s=op_s,
    )  # fmt: skip


MODEL = get_model("tiny-llama")
L = MODEL.num_layers
# Per layer: 4 GEMMs, attention, 2 norms + 2 adds + SwiGLU; head: LM GEMM + log-softmax.
DEVICE_S = L * (4 * GEMM_S + ATTN_S + 5 * ELEM_S) + (GEMM_S + ELEM_S)
EAGER_OPS = L * (10 + 56) + 2 + 67  # every launched op of an eager step
EXTRA_OPS = L * 56 + 67  # the framework ops alone


@pytest.mark.parametrize("engine", list(RolloutEngine))
def test_cpu_decode_adds_the_framework_ops_to_the_kernels(engine: RolloutEngine) -> None:
    cm = _costs("cpu", 2e-6)
    got = compute.decode_step_s(cm, MODEL, 1, 1, 8, 100, engine=engine)
    assert got == pytest.approx(DEVICE_S + EXTRA_OPS * 2e-6)  # no graphs on CPU


def test_gpu_eager_decode_costs_the_larger_of_host_and_device() -> None:
    # The built-in engine decodes eagerly under tensor parallelism (tg = 2): every op
    # launched, two all-reduces per layer among them and, outside the layers, the
    # embedding's all-reduce and the logits' gather (30 µs each on the device).
    ops, device = EAGER_OPS + 2 * L + 2, DEVICE_S + (2 * L + 2) * 30e-6
    slow_host, fast_host = 14e-6, 0.1e-6
    host_bound = compute.decode_step_s(_costs("cuda", slow_host), MODEL, 2, 1, 8, 100)
    assert ops * slow_host > device
    assert host_bound == pytest.approx(ops * slow_host)
    device_bound = compute.decode_step_s(_costs("cuda", fast_host), MODEL, 2, 1, 8, 100)
    assert ops * fast_host < device
    assert device_bound == pytest.approx(device)


@pytest.mark.parametrize("engine", list(RolloutEngine))
def test_gpu_graph_replay_removes_the_layer_launches(engine: RolloutEngine) -> None:
    cm = _costs("cuda", 14e-6)
    got = compute.decode_step_s(cm, MODEL, 1, 1, 8, 100, engine=engine)
    # One graph launch plus the step's own ops: 68 · 14 µs = 0.952 ms against the kernels.
    assert got == pytest.approx(max(DEVICE_S, 68 * 14e-6))


def test_which_decode_replays_graphs() -> None:
    """vLLM on CUDA at any tg; the built-in engine on CUDA with whole-model ranks only
    (the sampler's `default_decode` asks the same function); nothing on CPU."""
    assert decode_graphed(RolloutEngine.VLLM, "cuda", 4)
    assert decode_graphed(RolloutEngine.BUILTIN, "cuda", 1)
    assert not decode_graphed(RolloutEngine.BUILTIN, "cuda", 2)
    assert not decode_graphed(RolloutEngine.VLLM, "cpu", 1)
    assert not decode_graphed(RolloutEngine.BUILTIN, "cpu", 1)


def test_graph_capture_is_three_eager_steps() -> None:
    # Two warm-up runs and the captured run, each launching an eager step's ops
    # (host-bound here: 1,000 ops x 14 µs against 0.2 ms of kernels).
    cm = _costs("cuda", 14e-6)
    assert GRAPH_WARMUP_RUNS == 2
    assert compute.graph_capture_s(cm, MODEL, 8, 100) == pytest.approx(3 * EAGER_OPS * 14e-6)


@dataclasses.dataclass(frozen=True, kw_only=True)
class KvCosts(RoundCosts):
    """RoundCosts with decode attention 1 µs per cached token (prefill attention 20 µs)."""

    def attn_prefill_s(self, *args: object, **kwargs: object) -> float:
        return ATTN_S

    def attn_decode_s(self, batch: int, kv_len: int, *args: int) -> float:
        return kv_len * 1e-6


def _generation(engine: RolloutEngine, tg: int) -> callcosts.CallCost:
    cm = KvCosts(
        profile_name="kv", dtype_bytes=2, rooflines={}, series={}, device_kind="cuda", op_s=0.1e-6
    )
    gen = GenLayout(train=TrainLayout(d=1, t=tg), tg=tg)
    shape = callcosts.GenerationShape(
        num_seqs=8, prompt_len=10, lengths=LengthModel(4), kv_capacity_seqs=8, engine=engine
    )
    return callcosts.generation_cost(cm, MODEL, gen, shape)


def test_builtin_graphed_decode_attends_over_its_whole_cache_and_captures_once() -> None:
    """Four response tokens after a 10-token prompt: steps at KV 11..14 for vLLM, at the
    cache's capacity 14 for the built-in engine, whose generation also pays one capture
    (3 eager steps at capacity). Device-bound steps (0.1 µs per launch): per step
    DEVICE_S less the 20 µs attention, plus kv µs per layer."""
    base = DEVICE_S - L * ATTN_S

    def steps(kvs: list[int]) -> float:
        # _decode_sum_s: trapezoid over steps 1..4 plus half of each end value.
        values = [base + L * kv * 1e-6 for kv in kvs]
        inner = sum((a + b) / 2 for a, b in itertools.pairwise(values))
        return inner + (values[0] + values[-1]) / 2

    vllm = _generation(RolloutEngine.VLLM, 1)
    assert vllm.detail["decode_s"] == pytest.approx(steps([11, 12, 13, 14]))
    assert vllm.detail["graph_capture_s"] == 0.0
    builtin = _generation(RolloutEngine.BUILTIN, 1)
    assert builtin.detail["decode_s"] == pytest.approx(steps([14, 14, 14, 14]))
    eager_ops = EAGER_OPS * 0.1e-6
    assert eager_ops < base + L * 14e-6  # the eager step is device-bound too
    assert builtin.detail["graph_capture_s"] == pytest.approx(3 * (base + L * 14e-6))
    assert builtin.time_s == pytest.approx(
        builtin.detail["prefill_s"] + builtin.detail["decode_s"] + 3 * (base + L * 14e-6)
    )
    tp = _generation(RolloutEngine.BUILTIN, 2)  # eager: the growing cache, no capture
    assert tp.detail["graph_capture_s"] == 0.0


@dataclasses.dataclass(frozen=True, kw_only=True)
class RowCosts(KvCosts):
    """KvCosts with decode attention 0.1 µs per cached token of each sequence."""

    def attn_decode_s(self, batch: int, kv_len: int, *args: int) -> float:
        return batch * kv_len * 0.1e-6


def test_finished_sequences_leave_the_decode_batch_unless_the_shapes_are_fixed() -> None:
    """Log-normal lengths (max 6 after a 10-token prompt): vLLM's step s runs the
    sequences still going at s (ceil(8 · P(length >= s))) over KV 10 + s; the built-in
    engine's graphed step keeps all 8 rows over the whole cache (KV 16) to the last
    step. Device-bound steps as above, attention 0.1 µs per token per sequence."""
    # Running 8, 8, 7, 5, 4, 3: never 2 rows, whose 1 KiB activations RoundCosts would
    # price as the op overhead.
    lengths = LengthModel(6, median=4, sigma=0.5)
    base = DEVICE_S - L * ATTN_S
    cm = RowCosts(
        profile_name="rows", dtype_bytes=2, rooflines={}, series={}, device_kind="cuda", op_s=0.1e-6
    )
    gen = GenLayout(train=TrainLayout(), tg=1)

    def decode_s(engine: RolloutEngine) -> float:
        shape = callcosts.GenerationShape(
            num_seqs=8, prompt_len=10, lengths=lengths, kv_capacity_seqs=8, engine=engine
        )
        return callcosts.generation_cost(cm, MODEL, gen, shape).detail["decode_s"]

    last = lengths.last_step(8)
    running = [max(1, math.ceil(8 * lengths.survival(s))) for s in range(1, last + 1)]
    assert running[0] == 8 and running[-1] < 8  # sequences do finish before the last step
    vllm = [base + L * r * (10 + s) * 0.1e-6 for s, r in enumerate(running, start=1)]
    trapezoid = sum((a + b) / 2 for a, b in itertools.pairwise(vllm)) + (vllm[0] + vllm[-1]) / 2
    assert decode_s(RolloutEngine.VLLM) == pytest.approx(trapezoid)
    assert decode_s(RolloutEngine.BUILTIN) == pytest.approx(last * (base + L * 8 * 16 * 0.1e-6))


def test_workload_names_its_rollout_engine() -> None:
    wl = load_workload(WORKLOADS / "grpo-tiny-cpu.toml")
    assert wl.rollout_engine is RolloutEngine.BUILTIN
    data = workload_to_dict(wl)
    assert "rollout_engine" not in data  # the default is left out: plans keep their hash
    data["rollout_engine"] = "vllm"
    assert workload_from_dict(data).rollout_engine is RolloutEngine.VLLM
    data["rollout_engine"] = "sglang"
    with pytest.raises(SpecError, match="unknown rollout_engine 'sglang'; known: builtin, vllm"):
        workload_from_dict(data)
