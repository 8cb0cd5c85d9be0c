"""Benchmark: where a CPU fidelity plan's phase time goes, piece by piece, against the model.

For one GRPO plan of `benchmarks/fidelity_cpu.py` (default colocate-tiny-llama-8p)
it times, in this one process (one torch thread, no Ray, no other worker; thread
CPU time, so that other processes' load does not count), what one rank of each
phase runs through the engine's real code — the rollout
(`Sampler.generate` of the rank's sequences), a scoring call
(`ScoringEngine.logprobs`), the actor's forward (`ActorEngine.logprobs`) and
its update (`ActorEngine.update`: forwards, backwards and optimizer steps, the
optimizer step timed apart) — and, in a Ray actor, an empty round trip of the
rank's Batch (wall clock). Beside them it prints what the simulator prices:
each phase as simulated (dispatch and core sharing included) with its parts
(prefill, decode, pipeline, gradient reduction, optimizer, dispatch), one
optimizer step's kernel and host time, and the measured phase from an executor
run of the plan (`--run`: 4 steps, the first a warm-up, the median of the
others). The measured phase less the alone-engine time, the round trip and
the core-sharing stretch is what is left for collectives and waiting.

    python benchmarks/fidelity_breakdown.py [--plan colocate-tiny-llama-8p] [--run]
        [--profile cpu]

(`--profile`: the profile the simulator prices with, a name or a file; default the
shipped `cpu`, which describes the host that measured it.)

Writes benchmarks/results/fidelity_breakdown.json (with the command, the load
and the date).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from placeflow.executor.batch import Batch
from placeflow.executor.engines.roles import (
    ActorEngine,
    EngineSetup,
    RoleGroups,
    ScoringEngine,
    UpdateConfig,
    WeightSource,
    completions_batch,
)
from placeflow.executor.engines.sampler import Sampler, SamplingParams
from placeflow.executor.engines.tp import SINGLE
from placeflow.executor.engines.trainer import OptimConfig
from placeflow.executor.engines.transformer import Arch, Transformer
from placeflow.fields import Field
from placeflow.plan import Plan
from placeflow.profiles.schema import DispatchKind
from placeflow.simulator import compute, simulate
from placeflow.simulator.simulate import cost_models_for
from placeflow.workload import Role

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fidelity_cpu import plans

ROOT = Path(__file__).resolve().parents[1]


def _median_s(
    fn: Callable[[], Any], repeats: int, clock: Callable[[], float] = time.thread_time
) -> float:
    """Median CPU time of this thread per call (`time.thread_time`: the engine's own work,
    without the time a loaded machine keeps it off a core; see profiles/framework.py)."""
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = clock()
        fn()
        times.append(clock() - t0)
    return statistics.median(times)


def rollout_prompts(n: int, prompt: int) -> list[list[int]]:
    """`n` distinct prompts of `prompt` token ids each (below 203, past the specials)."""
    return [[(7 * i + j) % 200 + 3 for j in range(prompt)] for i in range(n)]


def _rollout(model: Transformer, n: int, prompt: int, response: int) -> Batch:
    prompts = rollout_prompts(n, prompt)
    params = SamplingParams(max_tokens=response, ignore_stop=True)
    return completions_batch(prompts, Sampler(model, pad_id=0).generate(prompts, params, 0), 0)


def engine_pieces(plan: Plan, repeats: int) -> dict[str, float]:
    """Seconds of one rank's work per phase, measured alone in this process."""
    torch.set_num_threads(1)
    wl = plan.workload
    actor_par = plan.parallelism[Role.ACTOR]
    arch = Arch.of(wl.models[Role.ACTOR])
    samples = wl.batch.prompts_per_step * wl.batch.samples_per_prompt
    gen_n = math.ceil(samples / (actor_par.train.d * actor_par.train.t * actor_par.train.p))
    model = Transformer(arch, tp=SINGLE, dtype=arch.compute_dtype)
    model.load_full(WeightSource().full(arch, critic=False))
    model.eval().requires_grad_(False)
    prompt, response = wl.batch.prompt_len, wl.batch.response_len
    out: dict[str, float] = {}
    out["generate"] = _median_s(lambda: _rollout(model, gen_n, prompt, response), repeats)
    if Role.REF in plan.parallelism:  # (a GRPO without a KL term has no reference)
        ref_par = plan.parallelism[Role.REF]
        ref_n = math.ceil(samples / ref_par.train.d)
        ref = ScoringEngine(
            EngineSetup(arch=arch, weights=WeightSource(), micro_batch=ref_par.micro_batch),
            RoleGroups(tp=SINGLE),
            torch.device("cpu"),
        )
        batch = _rollout(model, ref_n, prompt, response)
        out["ref_logprob"] = _median_s(lambda: ref.logprobs(batch, 1.0), repeats)
    actor = ActorEngine(
        EngineSetup(
            arch=arch,
            weights=WeightSource(),
            optim=OptimConfig(lr=1e-6),
            micro_batch=actor_par.micro_batch,
        ),
        RoleGroups(tp=SINGLE),
        torch.device("cpu"),
        gen=None,
        rank=0,
        reshard_plan=None,
    )
    act_n = math.ceil(samples / actor_par.train.d)
    abatch = _rollout(model, act_n, prompt, response)
    out["old_logprob"] = _median_s(lambda: actor.logprobs(abatch, 1.0), repeats)
    lp = actor.logprobs(abatch, 1.0).tensors[Field.LOGPROBS]
    tensors = dict(abatch.tensors)
    tensors[Field.OLD_LOGPROBS] = lp
    tensors[Field.ADVANTAGES] = torch.randn(lp.shape)
    tensors[Field.REF_LOGPROBS_IN_LOSS] = lp.clone()
    ubatch = Batch(tensors=tensors)
    cfg = UpdateConfig(mini_batches=wl.batch.mini_batches, kl_coef=0.001)
    out["actor_update"] = _median_s(lambda: actor.update(ubatch, cfg), repeats)
    params = list(actor.model.parameters())

    def step() -> None:
        for p in params:
            p.grad = torch.zeros_like(p)
        actor.trainer.step()

    out["optimizer_step"] = _median_s(step, repeats)
    return out


def ray_round_trips(plan: Plan, repeats: int) -> dict[str, float]:
    """An empty Ray actor call carrying each phase's Batch shard (as `_Worker.take`)."""
    import ray

    from placeflow.profiles.ray_roundtrip import _payload, _Worker

    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        worker: Any = ray.remote(num_cpus=0)(_Worker).remote()
        ray.get(worker.take.remote({}))
        out = {}
        for name, nbytes in _payloads(plan).items():
            payload = _payload(nbytes)
            out[name] = _median_s(
                lambda p=payload: ray.get(worker.take.remote(p)), repeats, time.perf_counter
            )
        return out
    finally:
        ray.shutdown()


def _payloads(plan: Plan) -> dict[str, int]:
    from placeflow.dataflow import dataflow_calls
    from placeflow.simulator.rolecosts import call_payload

    wl = plan.workload
    samples = wl.batch.prompts_per_step * wl.batch.samples_per_prompt
    d = plan.parallelism[Role.ACTOR].train.d
    calls = {c.phase.value: c for c, _ in dataflow_calls(wl)}
    return {
        name: call_payload(wl, calls[name], samples // d).num_bytes
        for name in ("generate", "ref_logprob", "actor_update")
    }


def simulated_pieces(plan: Plan, profile: str = "cpu") -> dict[str, Any]:
    """The simulator's price with `profile`: each phase of the first step with its parts,
    and one optimizer step (its kernel, and its host time where the profile has it)."""
    cms = cost_models_for(plan, profile)
    estimate = simulate(plan, cms)
    cm = next(iter(cms.values())) if isinstance(cms, dict) else cms
    phases = {}
    for p in estimate.phases:
        if p.step == 0:
            phases[p.name.value] = {
                "simulated_s": p.duration_s,
                "dispatch_s": p.detail.get("dispatch_s"),
                **{k: v for k, v in p.detail.items() if k.endswith("_s")},
            }
    actor = plan.workload.models[Role.ACTOR]
    phases["optimizer_step"] = {
        "simulated_s": cm.optimizer_s(actor.num_params(value_head=False)),
        "host_s": compute.optimizer_host_s(cm, actor, actor.num_layers),
    }
    phases["op_overhead_s"] = {"simulated_s": compute.op_overhead_s(cm)}
    phases["dispatch_1KiB"] = {"simulated_s": cm.dispatch_s(DispatchKind.RAY_CALL, 1024)}
    return phases


def measured_phases(plan: Plan, steps: int) -> dict[str, float]:
    import ray

    from placeflow.executor.run import RunConfig, read_metrics, run_plan

    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            run_plan(plan, Path(tmp) / "run", RunConfig(steps=steps, progress=False))
            metrics = read_metrics(Path(tmp) / "run")
    finally:
        ray.shutdown()
    out: dict[str, list[float]] = {}
    for rec in metrics[1:]:
        for name, sec in rec["phases"].items():
            out.setdefault(name, []).append(sec)
        out.setdefault("step", []).append(rec["step_time_s"])
    return {k: statistics.median(v) for k, v in out.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plan", default="colocate-tiny-llama-8p")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--run", action="store_true", help="also run the plan (4 steps)")
    parser.add_argument("--profile", default="cpu", help="the profile the simulator prices with")
    args = parser.parse_args()
    plan = next(p for _, p in plans() if p.name == args.plan)
    load = os.getloadavg()[0]
    report: dict[str, Any] = {
        "command": "python " + " ".join(["benchmarks/fidelity_breakdown.py", *sys.argv[1:]]),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "plan": plan.name,
        "load_1min_before": load,
        "engine_alone_s": engine_pieces(plan, args.repeats),
        "ray_round_trip_s": ray_round_trips(plan, args.repeats),
        "profile": args.profile,
        "simulated": simulated_pieces(plan, args.profile),
    }
    if args.run:
        report["measured_phase_s"] = measured_phases(plan, 4)
    report["load_1min_after"] = os.getloadavg()[0]
    out = ROOT / "benchmarks/results/fidelity_breakdown.json"
    out.write_text(json.dumps(report, indent=1, default=str) + "\n")
    print(json.dumps(report, indent=1, default=str))


if __name__ == "__main__":
    main()
