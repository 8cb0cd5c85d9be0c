"""LoRA: the workload's [lora] table, adapter parameter counts against PEFT's, and what
adapters change in the simulator's memory, update time and weight sync (oracles by hand)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from placeflow.catalogue import CATALOGUE
from placeflow.errors import SpecError
from placeflow.layout import TrainLayout
from placeflow.lora import LoRATargets, adapter_params_per_layer
from placeflow.models import ModelSpec
from placeflow.plan import RoleParallelism
from placeflow.profiles.schema import CollectiveKind, Scope
from placeflow.simulator import callcosts, memory
from placeflow.workload import LoRASpec, Role, load_workload, workload_from_dict, workload_to_dict

ROOT = Path(__file__).resolve().parents[1]
TINY = ModelSpec(
    name="tiny-dense", num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=2,
    ffn_hidden_size=128, vocab_size=256,
)  # fmt: skip


def test_adapter_count_matches_peft_for_llama_2_7b() -> None:
    """PEFT's print_trainable_parameters for Llama-2-7B, r = 8 on q, k, v, o, gate, up,
    down: 'trainable params: 19,988,480'."""
    llama = CATALOGUE["llama-2-7b"]
    assert LoRASpec(rank=8).params(llama) == 19_988_480
    # Attention only: 4 projections of 4096 -> 4096, r (in + out) each, 32 layers.
    assert adapter_params_per_layer(llama, 8, LoRATargets.ATTENTION) == 4 * 8 * 8192


def test_lora_table_round_trips_and_bad_tables_are_refused() -> None:
    base = workload_to_dict(load_workload(ROOT / "examples" / "workloads" / "ppo-llama2-7b.toml"))
    data = base | {"lora": {"rank": 16, "targets": "attention", "roles": ["actor", "critic"]}}
    w = workload_from_dict(data)
    both = (Role.ACTOR, Role.CRITIC)
    assert w.lora == LoRASpec(rank=16, targets=LoRATargets.ATTENTION, roles=both)
    assert w.lora_of(Role.CRITIC) is w.lora and w.lora_of(Role.REF) is None
    assert workload_from_dict(workload_to_dict(w)) == w
    bad = {
        "rank must be a positive integer": {"rank": 0},
        "ref are not trained": {"rank": 8, "roles": ["ref"]},
        "unknown targets": {"rank": 8, "targets": "mlp"},
        "must be below": {"rank": 4096},
    }
    for message, table in bad.items():
        with pytest.raises(SpecError, match=message):
            workload_from_dict(base | {"lora": table})
    moe = base | {"models": {**base["models"], "actor": "qwen3-30b-a3b"}, "lora": {"rank": 8}}
    with pytest.raises(SpecError, match="mixture-of-experts or latent-attention"):
        workload_from_dict(moe)


def test_lora_memory_is_a_frozen_base_and_adapter_state() -> None:
    """Rank of t 2, d 4, ZeRO-1: base bf16 weights / t, and per adapter parameter 2 (weight)
    + 2 (gradient) + 12 / d (fp32 master and moments), the adapters / t."""
    llama = CATALOGUE["llama-2-7b"]
    lora = LoRASpec(rank=8)
    par = RoleParallelism(train=TrainLayout(t=2, d=4), zero=1)
    got = memory.trained_resident_bytes_per_gpu(llama, par, value_head=False, lora=lora)
    base = llama.num_params(value_head=False) * 2 / 2
    adapters = 19_988_480 / 2
    assert got == pytest.approx(base + adapters * (2 + 2 + 12 / 4))
    full = memory.trained_resident_bytes_per_gpu(llama, par, value_head=False)
    assert got < full / 3
    offloaded = dataclasses.replace(par, offload_optimizer=True)
    got_off = memory.trained_resident_bytes_per_gpu(llama, offloaded, value_head=False, lora=lora)
    assert got_off == pytest.approx(base + adapters * 4)


class FlopCostModel:
    """GEMM time = FLOPs / 1 PFLOP/s; everything else free; collectives recorded."""

    device_kind = "cuda"
    host_local = False

    def __init__(self) -> None:
        self.memo: dict = {}
        self.collectives: list[tuple[CollectiveKind, int, int]] = []

    def remember(self, key, compute):  # type: ignore[no-untyped-def]
        if key not in self.memo:
            self.memo[key] = compute()
        return self.memo[key]

    def gemm_s(self, m: int, n: int, k: int) -> float:
        return 2.0 * m * n * k / 1e15

    def collective_s(self, kind, num_bytes, world_size, scope, *, ranks_per_node=1, after_s=None):  # type: ignore[no-untyped-def]
        if world_size > 1 and num_bytes > 0:
            self.collectives.append((kind, int(num_bytes), world_size))
        return 0.0

    def attn_prefill_s(self, *args, **kwargs) -> float:  # type: ignore[no-untyped-def]
        return 0.0

    def elementwise_s(self, kind, num_bytes) -> float:  # type: ignore[no-untyped-def]
        return 0.0

    def optimizer_s(self, num_params: int) -> float:
        return 0.0

    def framework_s(self, kind: object, num_units: int = 1) -> None:
        return None  # no framework entries: kernel times only

    def framework_units(self, kind: object) -> tuple[int, ...]:
        return ()  # (no framework entries)

    def copy_s(self, direction: str, num_bytes: int) -> float:
        return 0.0


def _update(cm: FlopCostModel, par: RoleParallelism, lora: LoRASpec | None) -> float:
    cost = callcosts.train_cost(
        cm,
        TINY,
        par,
        8,
        16,
        1,
        1,
        Scope.INTRA,
        value_head=False,
        lora=lora,  # type: ignore[arg-type]
    )
    return cost.time_s


def test_lora_update_skips_the_base_weight_gradients_and_adds_the_adapters() -> None:
    """Per layer the base GEMMs' weight gradients (the forward's FLOPs, 2m x 36,864) are
    skipped, the adapters' GEMMs added (forward 2m x 4 x 1,024, backward twice that);
    the LM head's weight gradient (2m x 64 x 256) is skipped too."""
    par = RoleParallelism(train=TrainLayout(), micro_batch=8, zero=0, recompute=False)
    m = 8 * 16
    full = _update(FlopCostModel(), par, None)
    lora = _update(FlopCostModel(), par, LoRASpec(rank=4))
    per_layer = 36_864 - 4 * 1_024 - 2 * 4 * 1_024
    assert full - lora == pytest.approx(2 * m * (2 * per_layer + 64 * 256) / 1e15, rel=1e-9)


def test_lora_reduces_adapter_gradients_and_syncs_adapters_only() -> None:
    par = RoleParallelism(train=TrainLayout(d=4), micro_batch=2, zero=0, recompute=False)
    lora = LoRASpec(rank=4)
    cm = FlopCostModel()
    _update(cm, par, lora)
    adapter_bytes = lora.params(TINY) * 2
    # Besides the engine's scalar all-reduces (`callcosts.control_syncs_s`).
    control = (CollectiveKind.ALL_REDUCE, callcosts.CONTROL_BYTES, 4)
    assert [c for c in cm.collectives if c != control] == [
        (CollectiveKind.ALL_REDUCE, adapter_bytes, 4)
    ]
    full = callcosts.weight_sync_cost(FlopCostModel(), TINY, 2, 1, Scope.INTRA)  # type: ignore[arg-type]
    sync = callcosts.weight_sync_cost(FlopCostModel(), TINY, 2, 1, Scope.INTRA, lora=lora)  # type: ignore[arg-type]
    assert sync.detail["bytes_per_gen_rank"] == adapter_bytes // 2
    assert full.detail["bytes_per_gen_rank"] > 10 * sync.detail["bytes_per_gen_rank"]
