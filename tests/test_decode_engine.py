"""Decode as the rollout engine runs it: host dispatch and device time as two resources.

Oracle: a cost model whose every kernel costs a round number, so that each
decode step's time is computed by hand from the module docstring's rules of
`placeflow.simulator.compute`.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from placeflow.catalogue import get_model
from placeflow.errors import SpecError
from placeflow.profiles.costmodel import CostModel
from placeflow.profiles.schema import CollectiveKind, Scope
from placeflow.simulator import compute
from placeflow.workload import RolloutEngine, load_workload, workload_from_dict, workload_to_dict

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
EAGER_OPS = L * (10 + 56) + 2 + 68  # every launched op of an eager step
EXTRA_OPS = L * 56 + 68  # the framework ops alone


@pytest.mark.parametrize("engine", list(RolloutEngine))
def test_cpu_decode_adds_the_framework_ops_to_the_kernels(engine: RolloutEngine) -> None:
    cm = _costs("cpu", 2e-6)
    got = compute.decode_step_s(cm, MODEL, 1, 1, 8, 100, engine=engine)
    assert got == pytest.approx(DEVICE_S + EXTRA_OPS * 2e-6)  # no graphs on CPU


def test_gpu_eager_decode_costs_the_larger_of_host_and_device() -> None:
    slow_host, fast_host = 14e-6, 0.1e-6
    host_bound = compute.decode_step_s(_costs("cuda", slow_host), MODEL, 1, 1, 8, 100)
    assert EAGER_OPS * slow_host > DEVICE_S
    assert host_bound == pytest.approx(EAGER_OPS * slow_host)
    device_bound = compute.decode_step_s(_costs("cuda", fast_host), MODEL, 1, 1, 8, 100)
    assert EAGER_OPS * fast_host < DEVICE_S
    assert device_bound == pytest.approx(DEVICE_S)


def test_gpu_graph_replay_removes_the_layer_launches() -> None:
    cm = _costs("cuda", 14e-6)
    got = compute.decode_step_s(cm, MODEL, 1, 1, 8, 100, engine=RolloutEngine.VLLM)
    # One graph launch plus the step's own ops: 69 · 14 µs = 0.966 ms against the kernels.
    assert got == pytest.approx(max(DEVICE_S, 69 * 14e-6))
    eager = compute.decode_step_s(cm, MODEL, 1, 1, 8, 100, engine=RolloutEngine.BUILTIN)
    assert got < eager


def test_tensor_parallel_decode_launches_two_all_reduces_per_layer() -> None:
    cm = _costs("cuda", 14e-6)
    got = compute.decode_step_s(cm, MODEL, 2, 1, 8, 100)
    assert got == pytest.approx((EAGER_OPS + 2 * L) * 14e-6)


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
