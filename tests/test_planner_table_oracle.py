"""The cost table against its naive reference: every option priced with `role_call_costs`.

`build_cost_table` and `with_generators` price calls once per distinct layout,
skip what cannot fit before pricing it, and prune on arrays; none of that may
change the table. The reference below prices every (parallelism, KV budget)
option of every role in full with the simulator's `role_call_costs`, checks
memory, and keeps the options no other dominates (pairwise, as the table's
docstring defines them), trainer options of the actor included; the two tables
must hold the same options in the same order, with identical floats, the
same shortfalls and the same generator options. A last check runs whole
searches: every placement's row must equal the row of a search over the
reference table.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest

from placeflow.catalogue import CATALOGUE
from placeflow.cluster import ClusterSpec, PoolSpec, load_cluster
from placeflow.phases import Phase
from placeflow.planner import plan_search
from placeflow.planner import search as search_module
from placeflow.planner.costtable import (
    GENERATION_STAGE,
    KV_BUDGET_FRACTIONS,
    CostTable,
    RoleOption,
    build_cost_table,
    candidate_counts,
    stage_of,
)
from placeflow.planner.generators import GeneratorOption, generator_option, with_generators
from placeflow.planner.space import _powers_of_two, parallelism_options
from placeflow.profiles.costmodel import CostModel
from placeflow.profiles.registry import fitted_cost_model
from placeflow.simulator import callcosts, memory
from placeflow.simulator.rolecosts import (
    kv_bytes_per_seq,
    reshard_placement,
    resident_bytes,
    role_call_costs,
    rollout_sync_cost,
)
from placeflow.workload import Role, Workload, load_workload

ROOT = Path(__file__).resolve().parents[1]


def _stage_times(costs: dict[Phase, callcosts.CallCost]) -> tuple[float, float, float]:
    stages = [0.0, 0.0, 0.0]
    for phase, cost in costs.items():
        stages[stage_of(phase)] += cost.time_s
    return stages[0], stages[1], stages[2]


def _criteria(o: RoleOption | GeneratorOption) -> tuple[float, ...]:
    """What the table's fronts compare (the docstrings of costtable and generators)."""
    if isinstance(o, GeneratorOption):
        return (o.num_gpus, o.load_s, o.sync_s)
    return (*o.stage_s, o.resident_bytes, o.transient_bytes)


def _dominates(a: RoleOption | GeneratorOption, b: RoleOption | GeneratorOption) -> bool:
    mine, theirs = _criteria(a), _criteria(b)
    return all(x <= y for x, y in zip(mine, theirs, strict=True)) and mine != theirs


def pairwise_front(options: list) -> list:
    """Options no other dominates, in their given order (equal ones all kept)."""
    return [o for o in options if not any(_dominates(k, o) for k in options)]


def _actor_variants(wl: Workload, par, pool: PoolSpec, cm: CostModel):
    """(kv_seqs, costs incl. reshard, generation transient bytes) per KV budget, in full."""
    gen = par.gen_layout()
    per_seq = kv_bytes_per_seq(wl, gen)
    cap = min(math.ceil(wl.batch.num_samples / gen.num_replicas), wl.max_num_seqs)
    budgets = sorted(
        {min(cap, int(f * pool.gpu.usable_bytes // per_seq)) for f in KV_BUDGET_FRACTIONS}
    )
    actor = wl.models[Role.ACTOR]
    extra = memory.colocated_gen_extra_bytes(actor, gen, par.zero)
    # offload_params: the training shard is not resident; generation brings it back
    extra += memory.offloaded_param_bytes(actor, par, trained=True, value_head=False)[0]
    for kv_seqs in budgets:
        if kv_seqs < 1:
            continue
        costs = role_call_costs(
            wl,
            Role.ACTOR,
            par,
            cm,
            first_device=0,
            gpus_per_node=pool.gpus_per_node,
            gen=gen,
            kv_seqs=kv_seqs,
        )
        rest = {p: c for p, c in costs.items() if p not in GENERATION_STAGE}
        generation = {p: c for p, c in costs.items() if p in GENERATION_STAGE}
        # The rollout's sync: a reshard where the layouts call for one, a load always.
        scope, per_node = reshard_placement(0, pool.gpus_per_node, gen)
        generation[Phase.RESHARD] = rollout_sync_cost(
            cm, wl.models[Role.ACTOR], gen, scope, train_zero=par.zero, ranks_per_node=per_node
        )
        yield kv_seqs, {**rest, **generation}, extra + kv_seqs * per_seq / wl.gpu_memory_utilization


def reference_options(wl: Workload, role: Role, pool: PoolSpec, n: int, cm: CostModel):
    """(colocated front, trainer front, shortfall, where) of `role` on n GPUs of `pool`."""
    model, capacity = wl.models[role], pool.gpu.usable_bytes
    found, apart = [], []
    best_short, best_reason = math.inf, ""
    for par in parallelism_options(model, role, n, pool):
        resident = resident_bytes(model, role, par)
        if role is Role.ACTOR:
            variants = list(_actor_variants(wl, par, pool, cm))
            if par.tg == 1:
                rest = role_call_costs(
                    wl, role, par, cm, first_device=0, gpus_per_node=pool.gpus_per_node
                )
                transient = max((c.transient_bytes for c in rest.values()), default=0.0)
                if resident + transient <= capacity:
                    apart.append(
                        RoleOption(
                            role=role,
                            pool=pool.name,
                            num_gpus=n,
                            par=par,
                            kv_seqs=0,
                            stage_s=_stage_times(rest),
                            resident_bytes=resident,
                            transient_bytes=transient,
                            gen_apart=True,
                        )
                    )
        else:
            costs = role_call_costs(
                wl, role, par, cm, first_device=0, gpus_per_node=pool.gpus_per_node
            )
            variants = [(0, costs, 0.0)]
        for kv_seqs, costs, gen_bytes in variants:
            transient = max(
                [
                    gen_bytes,
                    *(c.transient_bytes for p, c in costs.items() if p not in GENERATION_STAGE),
                ]
            )
            short = resident + transient - capacity
            if short > 0:
                if short < best_short:
                    best_short = short
                    best_reason = (
                        f"{n} x {pool.name} with p={par.train.p} t={par.train.t} "
                        f"d={par.train.d} e={par.train.e} zero={par.zero} "
                        f"micro_batch={par.micro_batch}"
                    )
                continue
            found.append(
                RoleOption(
                    role=role,
                    pool=pool.name,
                    num_gpus=n,
                    par=par,
                    kv_seqs=kv_seqs,
                    stage_s=_stage_times(costs),
                    resident_bytes=resident,
                    transient_bytes=transient,
                )
            )
    return pairwise_front(found), pairwise_front(apart), best_short, best_reason


def reference_table(wl: Workload, cluster: ClusterSpec, cms: dict[str, CostModel]) -> CostTable:
    options: dict = {}
    apart: dict = {}
    shortfall: dict = {}
    for pool in cluster.pools:
        for n in candidate_counts(pool):
            for role in wl.roles:
                opts, tr, short, reason = reference_options(wl, role, pool, n, cms[pool.profile])
                if opts:
                    options[(role, pool.name, n)] = opts
                elif short < shortfall.get(role, (math.inf, ""))[0]:
                    shortfall[role] = (short, reason)
                if tr:
                    apart[(role, pool.name, n)] = tr
    costed = {(q, n) for (_, q, n) in options}
    trainer_pools = []
    for key, tr in apart.items():
        if key[1:] in costed:
            options.setdefault(key, []).extend(tr)
            pool = next(p for p in cluster.pools if p.name == key[1])
            if pool not in trainer_pools:
                trainer_pools.append(pool)
    generators = []
    for trainer in trainer_pools:
        for pool in cluster.pools:
            found = [
                g
                for m in candidate_counts(pool)
                if (pool.name, m) in costed
                for tg in _powers_of_two(min(m, pool.gpus_per_node))
                if m % tg == 0 and wl.models[Role.ACTOR].supports_tp(tg)
                if (
                    g := generator_option(
                        wl, (trainer, cms[trainer.profile]), pool, cms[pool.profile], m, tg
                    )
                )
                is not None
            ]
            generators.extend(pairwise_front(found))
    return CostTable(options=options, shortfall=shortfall, generators=tuple(generators))


def a100_problem(workload_file: str, model: str, num_gpus: int) -> tuple[ClusterSpec, Workload]:
    base = load_cluster(ROOT / "examples/clusters/a100x128.toml")
    cluster = dataclasses.replace(
        base, pools=(dataclasses.replace(base.pools[0], num_nodes=num_gpus // 8),)
    )
    wl = load_workload(ROOT / "examples/workloads" / workload_file)
    wl = dataclasses.replace(wl, models={r: CATALOGUE[model] for r in wl.roles})
    return cluster, wl


CASES = [
    ("ppo-llama2-7b.toml", "llama-2-7b", 16),
    ("ppo-llama2-7b.toml", "llama-2-13b", 8),
    ("ppo-llama2-7b.toml", "llama-2-70b", 8),
    ("ppo-llama2-7b-async.toml", "llama-2-7b", 8),
    ("grpo-qwen2.5-7b.toml", "qwen2.5-7b", 16),
    ("grpo-qwen2.5-7b.toml", "qwen3-30b-a3b", 8),
]


@pytest.fixture(scope="module")
def a100() -> dict[str, CostModel]:
    return {"a100-80gb": fitted_cost_model("a100-80gb")}


@pytest.mark.parametrize("case", CASES, ids=[f"{m}@{n}" for _, m, n in CASES])
def test_cost_table_equals_the_naive_reference(a100, case) -> None:
    cluster, wl = a100_problem(*case)
    got = with_generators(build_cost_table(wl, cluster, a100), wl, cluster, a100)
    want = reference_table(wl, cluster, a100)
    assert got.complete
    assert list(got.options) == list(want.options)
    for key, opts in want.options.items():
        assert got.options[key] == opts, key
    assert got.shortfall == want.shortfall
    assert got.generators == want.generators


@pytest.mark.parametrize("case", CASES[1:2] + CASES[3:5], ids=lambda c: f"{c[1]}@{c[2]}")
def test_search_rows_equal_a_search_over_the_reference_table(a100, case, monkeypatch) -> None:
    cluster, wl = a100_problem(*case)
    got = plan_search(cluster, wl, a100)
    monkeypatch.setattr(
        search_module, "build_cost_table", lambda wl, cl, cms, **_: reference_table(wl, cl, cms)
    )
    monkeypatch.setattr(search_module, "with_generators", lambda table, *_, **__: table)
    want = plan_search(cluster, wl, a100)
    assert got.status == want.status
    for a, b in zip(got.per_placement, want.per_placement, strict=True):
        assert a.placement == b.placement and a.status == b.status and a.reason == b.reason
        assert (a.best is None) == (b.best is None)
        if a.best is not None and b.best is not None:
            assert a.best.model_step_s == b.best.model_step_s
            assert a.best.plan.num_gpus == b.best.plan.num_gpus
            assert a.best.estimate.tokens_per_s == b.best.estimate.tokens_per_s
