"""The mixture-of-experts MLP: its routing against a per-token oracle, and expert
parallelism over gloo (EP = 2) against the single-device layer, forward and backward."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from placeflow.executor.engines.moe import EPGroup, MoEMLP
from placeflow.procs import free_port, report_rank, run_ranks

H, FFN, E, K, SHARED = 16, 12, 8, 2, 10


def _full(seed: int = 0, shared: int = SHARED) -> MoEMLP:
    torch.manual_seed(seed)
    layer = MoEMLP(H, FFN, E, K, shared_ffn=shared)
    for p in layer.parameters():
        torch.nn.init.normal_(p, std=0.3)
    return layer


def _naive(layer: MoEMLP, x: torch.Tensor) -> torch.Tensor:
    """Token by token: the k best experts' SwiGLU outputs weighted by renormalised softmax."""
    out = torch.zeros_like(x)
    for i, row in enumerate(x):
        probs = torch.softmax(row @ layer.router.t(), dim=-1)
        top = probs.topk(K)
        for w, e in zip(top.values / top.values.sum(), top.indices, strict=True):
            expert = layer.experts[str(int(e))]
            gate, up = (row @ expert.gate_up.t()).split(FFN)
            out[i] += w * ((F.silu(gate) * up) @ expert.down.t())
        if layer.shared_gate_up is not None and layer.shared_down is not None:
            sg, su = (row @ layer.shared_gate_up.t()).split(layer.shared_ffn)
            out[i] += (F.silu(sg) * su) @ layer.shared_down.t()
    return out


@pytest.mark.parametrize("shared", [0, SHARED])
def test_single_device_moe_matches_the_per_token_oracle(shared):
    layer = _full(shared=shared)
    x = torch.randn(2, 7, H)
    got = layer(x)
    want = _naive(layer, x.reshape(-1, H)).reshape(2, 7, H)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_bad_expert_layouts_are_refused():
    with pytest.raises(ValueError, match="must divide"):
        MoEMLP(H, FFN, 6, K, ep=EPGroup(rank=0, size=4))
    with pytest.raises(ValueError, match="top_k"):
        MoEMLP(H, FFN, E, 0)


@dataclass(frozen=True)
class Job:
    port: int
    world: int


def _inputs(rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 + rank)
    # Ranks route different numbers of tokens: the split sizes are uneven.
    tokens = 9 + 4 * rank
    return torch.randn(tokens, H, generator=g), torch.randn(tokens, H, generator=g)


def moe_rank(rank: int, job: Job, results: Any) -> None:
    import torch.distributed as dist

    def body() -> None:
        dist.init_process_group(
            "gloo", init_method=f"tcp://127.0.0.1:{job.port}", rank=rank, world_size=job.world
        )
        full = _full()
        layer = MoEMLP(H, FFN, E, K, shared_ffn=SHARED, ep=EPGroup(rank=rank, size=job.world))
        assert [int(j) for j in layer.experts] == list(layer.expert_block())
        with torch.no_grad():
            layer.router.copy_(full.router)
            for j, expert in layer.experts.items():
                expert.load_state_dict(full.experts[j].state_dict())
            assert full.shared_gate_up is not None and full.shared_down is not None
            assert layer.shared_gate_up is not None and layer.shared_down is not None
            layer.shared_gate_up.copy_(full.shared_gate_up)
            layer.shared_down.copy_(full.shared_down)
        x, probe = _inputs(rank)
        out = layer(x)
        (out * probe).sum().backward()
        grads = {n: p.grad.numpy() for n, p in layer.named_parameters() if p.grad is not None}
        results.put(("result", rank, out.detach().numpy(), grads))
        dist.destroy_process_group()

    report_rank(rank, results, body)


def test_expert_parallel_matches_the_single_device_layer():
    world = 2
    got: dict[int, Any] = {}
    run_ranks(moe_rank, Job(port=free_port(), world=world), world, label="moe test",
              error=RuntimeError, on_message=lambda m: got.__setitem__(m[1], m[2:]),
              stall_timeout_s=120.0)  # fmt: skip
    full = _full()
    loss = 0.0
    outs = []
    for rank in range(world):
        x, probe = _inputs(rank)
        out = full(x)
        outs.append(out.detach().numpy())
        loss = loss + (out * probe).sum()
    loss.backward()
    local = E // world
    for rank in range(world):
        out, grads = got[rank]
        np.testing.assert_allclose(out, outs[rank], rtol=1e-5, atol=1e-5)
        held = {n.split(".")[1] for n in grads if n.startswith("experts.")}
        assert held == {str(j) for j in range(rank * local, (rank + 1) * local)}
        # Each expert's gradient gathers every rank's tokens routed to it.
        for j in held:
            for w in ("gate_up", "down"):
                want = getattr(full.experts[j], w).grad.numpy()
                np.testing.assert_allclose(grads[f"experts.{j}.{w}"], want, rtol=1e-4, atol=1e-5)
    # Replicated weights: each rank's gradient covers its own tokens; their sum is the whole.
    for name in ("router", "shared_gate_up", "shared_down"):
        total = sum(got[r][1][name] for r in range(world))
        np.testing.assert_allclose(total, getattr(full, name).grad.numpy(), rtol=1e-4, atol=1e-5)
