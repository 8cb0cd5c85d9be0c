"""Pipeline parallelism in the engines: p > 1 stages against one process holding every layer.

Oracles: the same engines at p = t = d = 1 in this process (same seed, same
batch) for losses, grad norms, updated weights and forward outputs; the
training shards themselves, re-assembled, for the rollout weights after a
colocated reshard (bit for bit); and Megatron's 1F1B order written out by hand
for the schedule. Each world of gloo processes runs all its cases in turn
(spawning costs seconds), through `Worker.setup_role` and `Worker.build_engine`
as the executor does.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import pytest
import torch

from placeflow.executor.batch import Batch
from placeflow.executor.engines.offload import OffloadMode
from placeflow.executor.engines.pipeline import SINGLE_STAGE, PPGroup, StageIO, train_1f1b
from placeflow.executor.engines.roles import (
    ActorEngine,
    CriticEngine,
    EngineSetup,
    RoleGroups,
    ScoringEngine,
    UpdateConfig,
    WeightSource,
)
from placeflow.executor.engines.tp import SINGLE
from placeflow.executor.engines.trainer import OptimConfig
from placeflow.executor.engines.transformer import Arch
from placeflow.fields import Field
from placeflow.layout import GenLayout, TrainLayout
from placeflow.procs import free_port, report_rank, run_ranks
from placeflow.reshard_plan import Sharding, TinyLlama, split_ranges
from placeflow.workload import Role

WEIGHTS = TinyLlama(num_layers=4, hidden=64, num_heads=4, num_kv_heads=2, ffn=96, vocab=128)
CFG = UpdateConfig(entropy_coef=0.01)
ATOL = 2e-5


@dataclass(frozen=True, kw_only=True)
class Case:
    name: str
    train: TrainLayout
    role: Role  # actor / critic: forward, update; ref: logprobs; reward: scores
    tied: bool = False
    zero: int = 0
    tg: int | None = None  # actor only: a colocated rollout at this tg, resharded after the update
    resume: bool = False  # checkpoint this rank, update twice more, resume, update: same weights
    offload: OffloadMode = OffloadMode.NONE  # where the Adam state lives between updates
    forward_micro_batch: int = 0  # forward-only calls' micro-batch (0: micro_batch)
    micro_batch_tokens: int = 0  # > 0: micro-batches packed to at most this many tokens

    @property
    def arch(self) -> Arch:
        return Arch(weights=dataclasses.replace(WEIGHTS, tied_embeddings=self.tied))

    @property
    def setup(self) -> EngineSetup:
        trained = self.role in (Role.ACTOR, Role.CRITIC)
        return EngineSetup(
            arch=self.arch,
            weights=WeightSource(seed=5),
            critic=self.role in (Role.CRITIC, Role.REWARD),
            optim=OptimConfig(lr=1e-3, grad_clip=0.5) if trained else None,
            zero=self.zero,
            offload=self.offload,
            micro_batch=2,
            forward_micro_batch=self.forward_micro_batch,
            micro_batch_tokens=self.micro_batch_tokens,
        )


P2 = TrainLayout(p=2)
P2T2, P2D2, P4 = TrainLayout(p=2, t=2), TrainLayout(p=2, d=2), TrainLayout(p=4)
# Uneven stages (Megatron's first/last stage layer counts): 3 + 1 and 1 + 3 layers.
P2_FIRST3 = TrainLayout(p=2, first_stage_layers=3)
P2T2_LAST3 = TrainLayout(p=2, t=2, last_stage_layers=3)
CASES = (
    Case(name="actor p2", train=P2, role=Role.ACTOR, tg=1),
    Case(name="actor p2 tied", train=P2, role=Role.ACTOR, tied=True, tg=1, resume=True),
    Case(name="critic p2", train=P2, role=Role.CRITIC),
    Case(name="ref p2", train=P2, role=Role.REF),
    Case(name="reward p2", train=P2, role=Role.REWARD),
    Case(name="actor p2 t2 to tg1", train=P2T2, role=Role.ACTOR, tg=1),
    Case(name="actor p2 t2 tied to tg2", train=P2T2, role=Role.ACTOR, tied=True, tg=2),
    Case(name="critic p2 t2", train=P2T2, role=Role.CRITIC),
    Case(name="actor p2 d2 zero3", train=P2D2, role=Role.ACTOR, zero=3, tg=1, resume=True),
    Case(name="critic p2 d2 zero3", train=P2D2, role=Role.CRITIC, zero=3),
    Case(name="actor p2 d2 zero1 tied", train=P2D2, role=Role.ACTOR, zero=1, tied=True),
    Case(name="critic p2 d2 zero1", train=P2D2, role=Role.CRITIC, zero=1, resume=True),
    Case(
        name="actor p2 d2 zero1 host step",
        train=P2D2,
        role=Role.ACTOR,
        zero=1,
        resume=True,
        offload=OffloadMode.HOST_STEP,
    ),
    Case(
        name="critic p2 d2 zero3 device step",
        train=P2D2,
        role=Role.CRITIC,
        zero=3,
        resume=True,
        offload=OffloadMode.DEVICE_STEP,
    ),
    Case(name="actor p4", train=P4, role=Role.ACTOR, tied=True),
    Case(name="reward p4", train=P4, role=Role.REWARD),
    Case(name="actor p2 uneven 3+1 to tg1", train=P2_FIRST3, role=Role.ACTOR, tg=1),
    Case(name="ref p2 forward mb 3", train=P2, role=Role.REF, forward_micro_batch=3),
    Case(name="critic p2 d2 forward mb 3", train=P2D2, role=Role.CRITIC, forward_micro_batch=3),
    Case(name="critic p2 t2 uneven 1+3", train=P2T2_LAST3, role=Role.CRITIC, resume=True),
    Case(name="actor p2 t2 uneven tied to tg2", train=P2T2_LAST3, role=Role.ACTOR, tied=True, tg=2),
    # Packed micro-batches (samples of 2 to 11 tokens, 12 per micro-batch): every stage
    # packs alike, and ranks of a DP group agree on the count.
    Case(
        name="actor p2 d2 zero3 packed", train=P2D2, role=Role.ACTOR, zero=3, micro_batch_tokens=12
    ),
    Case(name="ref p2 packed", train=P2, role=Role.REF, micro_batch_tokens=12),
)


def _batch() -> Batch:
    """8 samples: left-padded prompts, right-padded responses, and what the losses read."""
    gen = torch.Generator().manual_seed(21)
    n, width_p, width_r = 8, 5, 6
    p_len = torch.randint(1, width_p + 1, (n,), generator=gen)
    r_len = torch.randint(1, width_r + 1, (n,), generator=gen)
    p_mask = torch.arange(width_p)[None] >= (width_p - p_len)[:, None]
    r_mask = torch.arange(width_r)[None] < r_len[:, None]
    ids = lambda w: torch.randint(1, WEIGHTS.vocab, (n, w), generator=gen)  # noqa: E731
    return Batch(
        tensors={
            Field.PROMPT: ids(width_p) * p_mask,
            Field.PROMPT_MASK: p_mask,
            Field.RESPONSE: ids(width_r) * r_mask,
            Field.RESPONSE_MASK: r_mask,
            "rollout_logprobs": torch.zeros(n, width_r),
            "advantages": torch.randn(n, generator=gen),
            "values": 0.1 * torch.randn(n, width_r, generator=gen),
            "returns": torch.randn(n, width_r, generator=gen),
        }
    )


def _shard(batch: Batch, train: TrainLayout, dp: int) -> Batch:
    return batch.chunk(train.d)[dp]


def _run(engine: Any, case: Case, batch: Batch) -> dict[str, Any]:
    """What a case computes on one rank (or on the single-process oracle)."""
    out: dict[str, Any] = {}
    if isinstance(engine, ScoringEngine):
        key = "scores" if case.setup.critic else "logprobs"
        res = engine.scores(batch) if case.setup.critic else engine.logprobs(batch, 1.0)
        out["forward"] = res.tensors[key]
        return out
    if isinstance(engine, ActorEngine):
        out["forward"] = engine.logprobs(batch, 1.0).tensors["logprobs"]
    else:
        out["forward"] = engine.values(batch).tensors["values"]
    out["metrics"] = engine.update(batch, CFG)
    out["weights"] = {k: v.clone() for k, v in engine.trainer.tp_shards().items()}
    if case.tg is not None:
        engine.sync_rollout()
        out["rollout"] = dict(engine.rollout.model.named_parameters())
    return out


def _numpy(out: dict[str, Any]) -> dict[str, Any]:
    # numpy, not tensors: a tensor in a queue is shared memory that dies with its process
    def conv(v: Any) -> Any:
        if isinstance(v, dict):
            return {k: conv(x) for k, x in v.items()}
        return v.detach().clone().numpy() if isinstance(v, torch.Tensor) else v

    return {k: conv(v) for k, v in out.items()}


@dataclass(frozen=True)
class Job:
    port: int
    tmp: str
    world: int
    cases: tuple[Case, ...]


def pipeline_rank(rank: int, job: Job, results: Any) -> None:
    """One rank: every case of its world size through a Worker, results to the parent."""
    from placeflow.executor.groups import RoleLayout
    from placeflow.executor.worker import Worker, WorkerSpec
    from placeflow.hardware import DeviceKind

    def body() -> None:
        spec = WorkerSpec(set_index=0, device_index=rank, num_devices=job.world,
                          roles=tuple(Role), device_kind=DeviceKind.CPU)  # fmt: skip
        Worker(spec).init_distributed(host="127.0.0.1", port=job.port, timeout_s=60)
        for case in job.cases:
            worker = Worker(spec)
            gen = None if case.tg is None else GenLayout(train=case.train, tg=case.tg)
            info = worker.setup_role(case.role, RoleLayout(train=case.train, gen=gen))
            worker.build_engine(case.role, case.setup)
            batch = _shard(_batch(), case.train, info.dp)
            out = _run(worker.engines[case.role], case, batch)
            if case.resume:
                out["resumed"] = _resumed(worker, case.role, batch, f"{job.tmp}/{rank}.pt")
            results.put(("result", case.name, rank, _numpy(out)))
        if job.world == 4:
            results.put(("order", rank, _schedule_order(worker)))
        else:
            results.put(("pg", rank, _pg2_refusal(spec)))

    report_rank(rank, results, body)


def _pg2_refusal(spec: Any) -> str:
    """The message Worker.build_engine gives a generation layout with pg = 2."""
    from placeflow.errors import SpecError
    from placeflow.executor.groups import RoleLayout
    from placeflow.executor.worker import Worker

    worker = Worker(spec)
    worker.setup_role(Role.ACTOR, RoleLayout(train=P2, gen=GenLayout(train=P2, pg=2)))
    try:
        worker.build_engine(Role.ACTOR, CASES[0].setup)
    except SpecError as e:
        return str(e)
    return "built"


def _resumed(worker: Any, role: Role, batch: Batch, path: str) -> bool:
    """Save this rank's stage-local state, update, reload, update again: bit-identical?"""
    engine = worker.engines[role]
    worker.save_state(role, path)
    worker.update(role, batch, CFG)
    once = {k: v.clone() for k, v in engine.trainer.tp_shards().items()}
    worker.load_state(role, path)
    worker.update(role, batch, CFG)
    again = engine.trainer.tp_shards()
    return once.keys() == again.keys() and all(torch.equal(once[k], again[k]) for k in once)


def _schedule_order(worker: Any) -> list[str]:
    """The 1F1B schedule of a toy stage (y = 2x) over p = 4, M = 6: events in order."""
    import torch.distributed as dist

    group, _ = dist.new_subgroups_by_enumeration([[0, 1, 2, 3]])
    pp = PPGroup(group=group, size=4, rank=dist.get_rank())
    events: list[str] = []
    weight = torch.ones(3, requires_grad=True)

    def forward(i: int, x: torch.Tensor | None) -> torch.Tensor:
        events.append(f"F{i}")
        y = weight * (torch.ones(3) if x is None else x)
        y.register_hook(lambda g, i=i: events.append(f"B{i}"))
        return y.sum() if pp.is_last else y

    io = StageIO(shape=lambda i: (3,), dtype=torch.float32, device=torch.device("cpu"))
    train_1f1b(pp, 6, forward, io, set_gradient_sync=lambda on: events.append(f"sync {on}"))
    assert weight.grad is not None and torch.equal(weight.grad, torch.full((3,), 6.0))
    return events


@pytest.fixture(scope="module", params=[2, 4], ids=lambda w: f"world{w}")
def world(request: pytest.FixtureRequest) -> tuple[Job, dict[Any, Any]]:
    cases = tuple(c for c in CASES if c.train.world_size == request.param)
    tmp = request.getfixturevalue("tmp_path_factory").mktemp("ckpt")
    job = Job(port=free_port(), tmp=str(tmp), world=request.param, cases=cases)
    got: dict[Any, Any] = {}

    def on_message(msg: tuple[Any, ...]) -> None:
        if msg[0] in ("order", "pg"):
            got[msg[0], msg[1]] = msg[2]
        else:
            got[msg[1], msg[2]] = msg[3]

    run_ranks(pipeline_rank, job, job.world, label="pipeline test", error=RuntimeError,
              on_message=on_message, stall_timeout_s=120.0)  # fmt: skip
    return job, got


def _oracle(case: Case) -> dict[str, Any]:
    groups = RoleGroups(tp=SINGLE, pp=SINGLE_STAGE)
    cpu = torch.device("cpu")
    # One process, forward micro-batches as large as the training ones: outputs do not
    # depend on how a forward-only call is cut into micro-batches.
    # Likewise packing: the oracle cuts micro-batches in samples.
    setup = dataclasses.replace(case.setup, forward_micro_batch=0, micro_batch_tokens=0)
    engine = None
    if case.role is Role.ACTOR:
        engine = ActorEngine(setup, groups, cpu, gen=None, rank=0, reshard_plan=None)
    elif case.role is Role.CRITIC:
        engine = CriticEngine(setup, groups, cpu)
    else:
        engine = ScoringEngine(setup, groups, cpu)
    return _run(engine, dataclasses.replace(case, tg=None), _batch())


def _slice(full: torch.Tensor, name: str, degree: int, index: int) -> torch.Tensor:
    spec = {p.name: p for p in WEIGHTS.params()}.get(name)
    if spec is None or spec.sharding is Sharding.REPLICATED:
        return full
    ranges = split_ranges(spec, degree, index)
    return torch.cat([full.narrow(spec.dim, r.start, r.length) for r in ranges], spec.dim)


def _assemble(case: Case, got: dict[Any, Any]) -> dict[str, torch.Tensor]:
    """Full weights put together from DP replica 0's training shards, stage by stage."""
    t, full = case.train.t, {}
    for p in WEIGHTS.params():
        if p.name == "lm_head" and case.tied:
            continue
        stage = p.stage(case.train.stage_layers(WEIGHTS.num_layers))
        shards = [got[case.name, case.train.rank(pp=stage, tp=i, dp=0)]["weights"][p.name]
                  for i in range(t)]  # fmt: skip
        if p.sharding is Sharding.REPLICATED:
            full[p.name] = torch.from_numpy(shards[0])
            continue
        whole = torch.empty(p.shape)
        for i, shard in enumerate(shards):
            offset = 0
            for r in split_ranges(p, t, i):
                piece = torch.from_numpy(shard).narrow(p.dim, offset, r.length)
                whole.narrow(p.dim, r.start, r.length).copy_(piece)
                offset += r.length
        full[p.name] = whole
    return full


def test_stages_match_one_process(world: tuple[Job, dict[Any, Any]]) -> None:
    """Forward outputs, losses, grad norms and updated weights of every stage/TP/DP rank."""
    job, got = world
    batch = _batch()
    for case in job.cases:
        ref = _oracle(case)
        train = case.train
        for rank in range(train.world_size):
            pp, tp, dp = train.coords(rank)
            out = got[case.name, rank]
            if pp == train.p - 1:  # outputs and losses live on the last stage
                rows = torch.arange(len(batch)).chunk(train.d)[dp]
                fwd, want = torch.from_numpy(out["forward"]), ref["forward"][rows]
                if case.micro_batch_tokens and fwd.dim() >= 2:
                    # Packed micro-batches compute no outputs at response padding (zeros there).
                    real = batch.tensors[Field.RESPONSE_MASK][rows]
                    fwd, want = fwd[real], want[real]
                torch.testing.assert_close(fwd, want, atol=ATOL, rtol=0, msg=case.name)
                if train.d == 1 and "metrics" in ref:
                    for k, v in ref["metrics"].items():
                        assert out["metrics"][k] == pytest.approx(v, rel=1e-4, abs=1e-6), k
            else:
                assert out["forward"].shape == (0,)
            if "metrics" not in ref:
                continue
            assert out["metrics"]["grad_norm"] == pytest.approx(ref["metrics"]["grad_norm"], 1e-4)
            weights = {k: torch.from_numpy(v) for k, v in out["weights"].items()}
            assert weights, case.name
            for name, w in weights.items():
                expected = _slice(ref["weights"][name], name, train.t, tp)
                torch.testing.assert_close(w, expected, atol=ATOL, rtol=0, msg=f"{case} {name}")


def test_stage_holds_its_layers_only(world: tuple[Job, dict[Any, Any]]) -> None:
    job, got = world
    for case in job.cases:
        if "weights" not in got[case.name, 0]:
            continue
        for rank in range(case.train.world_size):
            pp = case.train.coords(rank)[0]
            names = set(got[case.name, rank]["weights"])
            w, n = case.arch.weights, WEIGHTS.num_layers
            held = {p.name for p in w.params() if p.stage(case.train.stage_layers(n)) == pp}
            if pp == case.train.p - 1 and case.role is Role.CRITIC:
                held = held - {"lm_head"} | {"value_head"}
            if pp == case.train.p - 1 and case.role is Role.ACTOR and case.tied:
                held.add("embed")  # the last stage's copy for its head
            assert names == held, (case.name, rank)


def test_resume_from_stage_local_checkpoints(world: tuple[Job, dict[Any, Any]]) -> None:
    job, got = world
    resumed = [(c, r) for c in job.cases if c.resume for r in range(c.train.world_size)]
    assert resumed and all(got[c.name, r]["resumed"] for c, r in resumed)


def test_reshard_from_stages_is_bit_exact(world: tuple[Job, dict[Any, Any]]) -> None:
    """Rollout weights after an update == the trained stage shards, gathered and re-split."""
    job, got = world
    resharded = [c for c in job.cases if c.tg is not None]
    assert resharded
    for case in resharded:
        assert case.tg is not None
        full = _assemble(case, got)
        gen = GenLayout(train=case.train, tg=case.tg)
        for rank in range(case.train.world_size):
            _, _, gtp = gen.coords(rank)
            rollout = got[case.name, rank]["rollout"]
            assert set(rollout) == set(full), case.name
            for name, w in rollout.items():
                expected = _slice(full[name], name, case.tg, gtp)
                assert torch.equal(torch.from_numpy(w), expected), (case.name, rank, name)


def test_generation_pipeline_is_refused(world: tuple[Job, dict[Any, Any]]) -> None:
    job, got = world
    if job.world != 2:
        pytest.skip("checked in the 2-rank world")
    for rank in range(2):
        assert (
            "generation pipeline pg > 1 is not executed: the planner emits pg = 1"
            in got["pg", rank]
        )


def test_1f1b_order_with_more_micro_batches_than_stages(world: tuple[Job, dict[Any, Any]]) -> None:
    """p = 4, M = 6: stage s runs 3 − s warm-up forwards, then alternates, then drains."""
    job, got = world
    if job.world != 4:
        pytest.skip("the schedule check runs in the 4-rank world")
    num_micro = 6
    for stage in range(4):
        warmup = 3 - stage
        order = [f"F{i}" for i in range(warmup)]
        for i in range(warmup, num_micro):
            order += [f"F{i}", f"B{i - warmup}"]
        order += [f"B{i}" for i in range(num_micro - warmup, num_micro)]
        # gradient sync off for the step, on just before the last backward
        order.insert(0, "sync False")
        order.insert(order.index(f"B{num_micro - 1}"), "sync True")
        assert got["order", stage] == order, stage
