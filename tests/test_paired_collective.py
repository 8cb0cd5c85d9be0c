"""A collective after compute: measured, priced as a floor, not slowed by a crowd.

Oracles: the curve of hand-made `paired_collective` entries by the microseconds of
compute before a collective, read between and beyond its points by hand; a collective
within a CPU host after a known compute costs the larger of its back-to-back entry and
that curve, divided by a shared view's stretch (a blocked rank leaves its core to
others), and nothing more where no compute is named, for a point-to-point send, for a
group larger than the profiling host's cores, or on a GPU profile; a tensor-parallel
layer's two collectives (forward, backward and decode step) each priced at the curve
at half the layer's other work, kernels and host time worked out by hand; outside
the layers, the embedding's all-reduce (and an LM head's input gradient's, and a
decode step's logits gather) after the head's kernels, by hand; a crowded
host slows a call but for its blocked time, end times by hand; a call's blocked time
holds the blocked share of its collectives' latency-sized entries, counted by hand
from a tensor-parallel layout; the probe spawns real gloo ranks.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from handmade import with_framework

from placeflow.catalogue import get_model
from placeflow.phases import Phase
from placeflow.plan import load_plan
from placeflow.profiles.costmodel import sliced
from placeflow.profiles.registry import fitted_cost_model
from placeflow.profiles.schema import (
    CollectiveKind,
    ElementwiseKind,
    FrameworkKind,
    Op,
    Scope,
    Source,
)
from placeflow.profiles.shared_cores import measure_paired_collective
from placeflow.simulator import compute
from placeflow.simulator.schedule import Work, schedule
from placeflow.simulator.simulate import cost_models_for, latency_on
from placeflow.workload import Role

PAIRED = FrameworkKind.PAIRED_COLLECTIVE
AR = CollectiveKind.ALL_REDUCE
PLANS = Path(__file__).resolve().parents[1] / "examples" / "plans"
# Entries by hand: 2 ms after 100 µs of compute, 3 ms after 1 ms, 5 ms after 10 ms.
HAND = {100: 2e-3, 1000: 3e-3, 10000: 5e-3}


def test_the_curve_is_the_entries_by_measured_compute_held_at_its_ends() -> None:
    cm = with_framework(fitted_cost_model("cpu"), PAIRED, HAND)
    assert cm.paired_collective_s(550e-6) == pytest.approx(2.5e-3)  # halfway 100..1000 µs
    assert cm.paired_collective_s(5500e-6) == pytest.approx(4e-3)
    assert cm.paired_collective_s(50e-6) == pytest.approx(2e-3)  # held below the first
    assert cm.paired_collective_s(1.0) == pytest.approx(5e-3)  # and beyond the last
    assert with_framework(cm, PAIRED, None).paired_collective_s(1e-3) == 0.0
    # The shipped CPU profile measured its own (this VM, one rank per core).
    shipped = fitted_cost_model("cpu")
    assert 1e-4 < shipped.paired_collective_s(1e-3) < 1e-2


def test_a_collective_after_compute_costs_at_least_the_curve_by_hand() -> None:
    cm = with_framework(fitted_cost_model("cpu"), PAIRED, HAND)
    base = cm.without_paired()
    assert base is not cm and base.paired_collective_s(1e-3) == 0.0
    assert base.without_paired() is base
    floor = 2.5e-3  # after 550 µs
    seen = set()
    for size in (4096, 180224, 64 << 20):
        flat = base.collective_s(AR, size, 2, Scope.INTRA)
        seen.add(flat > floor)
        after = cm.collective_s(AR, size, 2, Scope.INTRA, after_s=550e-6)
        assert after == pytest.approx(max(flat, floor))
        # No compute named (collectives back to back, as the entries were timed): flat.
        assert cm.collective_s(AR, size, 2, Scope.INTRA) == flat
    assert seen == {True, False}  # the floor decides the small ones, bandwidth the large
    # A pipeline's send after compute is floored too: gloo's sender waits for its
    # receiver (`benchmarks/p2p_rendezvous.py`), so the pair meets as a collective's ranks
    # do. A group of more ranks than the profiling host had cores (its entry holds their
    # waits already) is not.
    send = base.collective_s(CollectiveKind.SEND_RECV, 4096, 2, Scope.INTRA)
    assert send < floor
    got = cm.collective_s(CollectiveKind.SEND_RECV, 4096, 2, Scope.INTRA, after_s=550e-6)
    assert got == pytest.approx(floor)
    assert cm.collective_s(CollectiveKind.SEND_RECV, 4096, 2, Scope.INTRA) == send
    flat = base.collective_s(AR, 4096, 4, Scope.INTRA)
    assert cm.collective_s(AR, 4096, 4, Scope.INTRA, after_s=550e-6) == flat
    # Ranks sharing their cores: the view divides the curve by its stretch, which the
    # simulator multiplies the call by afterwards (the blocked time is not stretched).
    view = cm.shared_cores(2.5)
    flat = view.without_paired().collective_s(AR, 4096, 2, Scope.INTRA) - view.shared_wait_s
    got = view.collective_s(AR, 4096, 2, Scope.INTRA, after_s=550e-6)
    assert got == pytest.approx(max(flat, floor / 2.5) + view.shared_wait_s)
    gpu = fitted_cost_model("h100-sxm")
    assert gpu.collective_s(AR, 4096, 2, Scope.INTRA, after_s=550e-6) == gpu.collective_s(
        AR, 4096, 2, Scope.INTRA
    )


def test_ranks_on_cores_of_their_own_keep_their_blocked_time_by_hand() -> None:
    # A set with a core per rank that the host's curve stretches 1.3x all the same (what
    # busy ranks on the other cores cost it): the view divides what the ranks wait blocked
    # (the entry's blocked part, the curve's latency) by 1.3, which the simulator
    # multiplies the call by afterwards, and adds no partner wait.
    cm = with_framework(fitted_cost_model("cpu"), PAIRED, HAND)
    # A shared-collective probe between all work and all waiting: part of every small
    # collective's entry is blocked time (`blocked_collective_share`).
    probe = cm.collective_s(AR, 4096, 2, Scope.INTRA)
    stretched = probe * sliced(2.0, cm.slicing())
    cm = with_framework(cm, FrameworkKind.SHARED_COLLECTIVE, {1: (probe + stretched) / 2})
    assert 0.0 < cm.blocked_collective_share() < 1.0
    assert cm.own_cores(1.0) is cm
    view = cm.own_cores(1.3)
    assert view.shared_wait_s == 0.0 and not view.shared and view.shared_stretch == 1.3
    base = cm.without_paired()
    floor = 2.5e-3  # after 550 µs
    for size in (4096, 64 << 20):
        flat = base.collective_s(AR, size, 2, Scope.INTRA)
        worked = base.without_blocked_collectives().collective_s(AR, size, 2, Scope.INTRA)
        assert 0.0 < worked < flat
        own = worked + (flat - worked) / 1.3
        assert view.without_paired().collective_s(AR, size, 2, Scope.INTRA) == pytest.approx(own)
        got = view.collective_s(AR, size, 2, Scope.INTRA, after_s=550e-6)
        assert got == pytest.approx(max(own, floor / 1.3))
    gpu = fitted_cost_model("h100-sxm")
    assert gpu.own_cores(1.3) is gpu


# A steep curve, so that where on it a layer's collectives land shows: 2 ms after
# 100 µs of compute, 12 ms after 100 ms.
STEEP = {100: 2e-3, 100_000: 12e-3}


def _steep_s(after_s: float) -> float:
    return 2e-3 + 10e-3 * (after_s * 1e6 - 100) / (100_000 - 100)


@pytest.mark.parametrize("backward", [False, True])
def test_a_tensor_parallel_layer_s_collectives_follow_its_work_by_hand(backward: bool) -> None:
    cm = with_framework(fitted_cost_model("cpu"), PAIRED, STEEP)
    base = cm.without_paired()
    model = get_model("tiny-llama-m")
    t, batch, seq = 2, 8, 22
    act = batch * seq * model.hidden_size * model.dtype.num_bytes
    flat = base.collective_s(AR, act, t, Scope.INTRA)
    if backward:
        kind, ops = FrameworkKind.LAYER_BACKWARD, compute.EXTRA_OPS_LAYER_BACKWARD
        kernels, layer = compute.layer_backward_kernels_s, compute.layer_backward_s
    else:
        kind, ops = FrameworkKind.LAYER_FORWARD, compute.EXTRA_OPS_LAYER_FORWARD
        kernels, layer = compute.layer_forward_kernels_s, compute.layer_forward_s
    host = compute.cpu_host_s(cm, ops, kind, compute.host_scale(model, kind, batch * seq))
    other = kernels(base, model, t, batch, seq) - 2 * flat  # the layer's kernels but them
    assert host > 0 and other > 0
    floor = _steep_s((other + host) / 2)  # each follows half of the layer's other work
    assert floor > flat
    got = layer(cm, model, t, batch, seq) - layer(base, model, t, batch, seq)
    assert got == pytest.approx(2 * (floor - flat))
    # No tensor parallelism, no collective: the curve changes nothing.
    assert layer(cm, model, 1, batch, seq) == layer(base, model, 1, batch, seq)


def test_a_tensor_parallel_decode_step_s_collectives_follow_the_layer_by_hand() -> None:
    cm = with_framework(fitted_cost_model("cpu"), PAIRED, STEEP)
    base = cm.without_paired()
    model = get_model("tiny-llama-m")
    batch, kv = 16, 32
    flat = base.collective_s(AR, batch * model.hidden_size * model.dtype.num_bytes, 2, Scope.INTRA)
    kind = FrameworkKind.LAYER_DECODE
    host = compute.cpu_host_s(
        cm, compute.EXTRA_OPS_LAYER_DECODE, kind, compute.host_scale(model, kind, batch)
    )
    other = compute.layer_forward_kernels_s(base, model, 2, batch, 1, decode_kv_len=kv) - 2 * flat
    floor = _steep_s((other + host) / 2)
    assert floor > flat
    # Outside the layers: the embedding's all-reduce after the head's kernels (the LM
    # head over half the vocabulary, its log-softmax), then the logits' gather after both.
    vocab = model.vocab_size // 2
    head = base.gemm_s(batch, vocab, model.hidden_size) + base.elementwise_s(
        ElementwiseKind.SOFTMAX, batch * vocab * 4
    )
    assert head < 100e-6  # before the curve's first point, where it is held: 2 ms
    embed = max(flat, 2e-3)
    gather_flat = base.collective_s(
        CollectiveKind.ALL_GATHER, batch * model.vocab_size * model.dtype.num_bytes, 2, Scope.INTRA
    )
    gather = max(gather_flat, _steep_s(head + embed))
    assert embed > flat and gather > gather_flat
    got = compute.decode_step_s(cm, model, 2, 1, batch, kv) - compute.decode_step_s(
        base, model, 2, 1, batch, kv
    )
    layers = model.num_layers * 2 * (floor - flat)
    assert got == pytest.approx(layers + embed - flat + gather - gather_flat)


def test_a_crowded_host_slows_a_call_but_for_its_blocked_time_by_hand() -> None:
    # Two 2-worker calls start together on a 2-core host, 10 ms each alone; 4 ms of A's
    # are its ranks blocked in collectives. Together each gets half a core: B runs at 1/2;
    # A's other 6 ms stretch to 12 and its blocked 4 do not, so it runs at 10/16 and ends
    # at 16 ms. B has done 8 ms by then and runs its last 2 alone: ends at 18 ms.
    host = ("cpu", 0)
    a = Work(id="a", sets=(0,), duration_s=0.010, hosts=((host, 2.0),), latency_s=0.004)
    b = Work(id="b", sets=(1,), duration_s=0.010, hosts=((host, 2.0),))
    spans = schedule([a, b], {host: 2})
    assert spans["a"].end_s == pytest.approx(0.016)
    assert spans["b"].end_s == pytest.approx(0.018)
    # Alone on its host, nothing changes.
    assert schedule([a], {host: 2})["a"].end_s == pytest.approx(0.010)


def test_latency_on_is_the_blocked_time_of_a_tensor_parallel_call_only() -> None:
    # PPO split: the critic (t = 2) on its own 2 workers makes tensor-parallel
    # collectives after compute; the reference (d = 2, no TP, frozen) none at all: its
    # ranks do not agree on a micro-batch count (the actor's would, back to back).
    plan = load_plan(PLANS / "ppo-tiny-cpu4-split.toml")
    cms = cost_models_for(plan, "cpu")
    critic = latency_on(plan, cms, Role.CRITIC, plan.set_of(Role.CRITIC), None, 0)
    assert critic[Phase.VALUES] > 0 and critic[Phase.CRITIC_UPDATE] > critic[Phase.VALUES]
    ref = latency_on(plan, cms, Role.REF, plan.set_of(Role.REF), None, 0)
    assert ref == {Phase.REF_LOGPROB: 0.0}
    bare = {"*": cms["*"].without_paired()}
    assert latency_on(plan, bare, Role.CRITIC, plan.set_of(Role.CRITIC), None, 0) == {}


def test_latency_on_holds_the_blocked_share_of_the_collectives_entries_by_hand() -> None:
    # PPO split's critic (t = 2) on its own 2 workers: its values call makes 20
    # all-reduces of a micro-batch's activations on a rank's path (4 micro-batches of 8
    # samples: two a layer in 2 layers, and the embedding's). With a `shared_collective`
    # entry halfway between the probe's entry stretched and not (at 2 ranks per core),
    # half of each all-reduce's latency-sized part (its entry, at most the 4 KiB probe's)
    # is blocked as well. Each all-reduce follows compute, so the paired curve's floor
    # decides its whole time, which the set's view leaves unstretched
    # (`CostModel.own_cores`); what is blocked of it is that floor less the work, and
    # half the entry less of it is work now, work the set's stretch at a rank per core
    # would have slowed: the latency grows by 20 x half that x the stretch. With the
    # entry at the stretched end, by nothing.
    plan = load_plan(PLANS / "ppo-tiny-cpu4-split.toml")
    cm = cost_models_for(plan, "cpu")["*"]
    own = cm.collective_s(CollectiveKind.ALL_REDUCE, 4096, 2, Scope.INTRA)
    s2 = sliced(2.0, cm.slicing())
    kind = FrameworkKind.SHARED_COLLECTIVE
    half = with_framework(cm, kind, {1: own * (1.0 + s2) / 2.0})
    none = with_framework(cm, kind, {1: own * s2})
    assert half.blocked_collective_share() == pytest.approx(0.5)
    assert none.blocked_collective_share() == pytest.approx(0.0)
    critic = plan.set_of(Role.CRITIC)
    with_half = latency_on(plan, {"*": half}, Role.CRITIC, critic, None, 0)
    with_none = latency_on(plan, {"*": none}, Role.CRITIC, critic, None, 0)
    batch = plan.workload.batch
    tokens = plan.parallelism[Role.CRITIC].micro_batch * (batch.prompt_len + batch.response_len)
    act = tokens * plan.workload.models[Role.CRITIC].hidden_size * 4  # fp32
    entry = cm.collective_s(CollectiveKind.ALL_REDUCE, act, 2, Scope.INTRA)
    expected = 20 * 0.5 * min(entry, own) * sliced(1.0, cm.slicing())
    assert with_half[Phase.VALUES] - with_none[Phase.VALUES] == pytest.approx(expected)
    # The actor's old logprobs (d = 2, no TP) make one scalar all-reduce, the ranks'
    # micro-batch count (no compute named: no floor), half of it blocked now, and that
    # half left as measured by the stretch; the frozen reference beside it agrees on no
    # count and makes none.
    actor = latency_on(plan, {"*": half}, Role.ACTOR, plan.set_of(Role.ACTOR), None, 0)
    scalar = cm.collective_s(CollectiveKind.ALL_REDUCE, 8, 2, Scope.INTRA)
    assert actor[Phase.OLD_LOGPROB] == pytest.approx(0.5 * scalar)
    ref = latency_on(plan, {"*": half}, Role.REF, plan.set_of(Role.REF), None, 0)
    assert ref[Phase.REF_LOGPROB] == 0.0


def test_measure_paired_collective_spawns_a_rank_per_core() -> None:
    entries = measure_paired_collective(cores=2, chunks=(10, 40), repeats=2)
    assert [e.params["kind"] for e in entries] == ["paired_collective"] * 2
    first, second = (int(e.params["num_units"]) for e in entries)
    assert 0 < first < second  # the chunks' own time, µs: four times the matmuls, longer
    for e in entries:
        assert e.op is Op.FRAMEWORK and e.source is Source.MEASURED and e.repeats == 2
        assert 0 < e.median_s < 1.0
    assert measure_paired_collective(cores=1) == []  # no pair with a core per rank


@pytest.mark.parametrize("value_head", [False, True])
def test_a_tensor_parallel_head_s_embedding_and_gradient_all_reduces_by_hand(
    value_head: bool,
) -> None:
    # Outside the layers a TP forward all-reduces the vocabulary-parallel embedding's
    # output (every model, critics too) after the head's other work; an LM head's
    # backward all-reduces its input's gradient (a value head is whole on every rank).
    cm = with_framework(fitted_cost_model("cpu"), PAIRED, STEEP)
    model = get_model("tiny-llama-m")
    tokens, h = 8 * 22, model.hidden_size
    act = tokens * h * model.dtype.num_bytes
    if value_head:
        fwd = cm.gemm_s(tokens, 1, h)
        bwd = cm.gemm_s(tokens, h, 1) + cm.gemm_s(h, 1, tokens)
    else:
        vocab = model.vocab_size // 2
        softmax = cm.elementwise_s(ElementwiseKind.SOFTMAX, tokens * vocab * 4)
        fwd = cm.gemm_s(tokens, vocab, h) + softmax
        bwd = cm.gemm_s(tokens, h, vocab) + cm.gemm_s(h, vocab, tokens) + softmax
    flat = cm.without_paired().collective_s(AR, act, 2, Scope.INTRA)

    def edge(after_s: float) -> float:  # the curve by hand, held below 100 µs
        return max(flat, _steep_s(max(after_s, 100e-6)))

    got_fwd = compute._head_forward_kernels_s(cm, model, 2, tokens, value_head=value_head)
    got_bwd = compute._head_backward_kernels_s(cm, model, 2, tokens, value_head=value_head)
    assert got_fwd == pytest.approx(fwd + edge(fwd))
    assert got_bwd == pytest.approx(bwd if value_head else bwd + edge(bwd))
    # Without tensor parallelism there is nothing to reduce.
    whole = compute._head_forward_kernels_s(cm, model, 1, tokens, value_head=value_head)
    if value_head:
        assert whole == pytest.approx(fwd)
    else:
        assert whole == pytest.approx(
            cm.gemm_s(tokens, model.vocab_size, h)
            + cm.elementwise_s(ElementwiseKind.SOFTMAX, tokens * model.vocab_size * 4)
        )
