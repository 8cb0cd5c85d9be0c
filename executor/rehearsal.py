"""Rehearsal: a plan's exact layout on logical CPU workers, with tiny models of its shapes.

`placeflow run PLAN --rehearse` checks the wiring of a GPU plan on a laptop
before anyone books GPUs: every device set with its device count and node
layout, every role's p-t-d, ZeRO stage and micro-batching, the actor's
generation layout (tg, and a generator set when the plan has one), the
dispatch and the transitions (reshard or weight sync) all run as the plan says.
What changes:

- every pool becomes a CPU pool of the same nodes x devices per node (one
  logical CPU worker per GPU, one Ray CPU slot each);
- every model becomes a tiny random-init model of the same family (Llama, or
  Qwen2 with q/k/v bias and tied embeddings as the original, Qwen3's QK-norm;
  a mixture of experts stays one: top-2 of at least 4 experts, a number every
  expert-parallel degree e of the plan divides, with a shared expert and a
  dense first layer where the original has them), whose layer
  count is divisible by every pipeline degree it is split by (p, pg) and
  whose heads and KV heads by every tensor degree (t, tg); roles that share a
  model keep sharing one (the reference starts from the policy);
  vocabulary: the built-in byte tokenizer's;
- the batch shrinks to a few samples per DP rank (the same number of
  mini-batches up to 4, and a sample count that splits over every role's
  replicas and the generation replicas), prompts and responses of 16 tokens;
- the data and the reward function stay the workload's own: the rehearsal reads
  the real dataset files and scores with the real function (where the run would,
  on the driver or in Ray tasks), so that a missing file, a bad row or a reward
  function that does not load shows before GPUs are booked. (Prompts rendered
  with the model's chat template cannot be: the tiny models' byte tokenizer has
  none, and such a plan's rehearsal is refused, saying so.)

The rehearsed plan is named `<plan>-rehearsal` and its run manifest records
which plan it rehearses, so that no figure from it is taken for the GPU run's.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

from placeflow.cluster import ClusterSpec
from placeflow.errors import SpecError
from placeflow.executor.engines.tokenizer import ByteTokenizer
from placeflow.hardware import DeviceKind, get_hardware
from placeflow.models import DType, Feature, ModelSpec, MoESpec
from placeflow.plan import Plan, RoleParallelism
from placeflow.workload import BatchSpec, Role, Workload

HEAD_DIM = 16
SEQ_TOKENS = 16  # prompt and response length of a rehearsal step
MAX_MINI_BATCHES = 4
MIN_SAMPLES = 16
# Resident memory of one worker process (Ray actor with torch, gloo and a tiny model),
# measured here with `ps -eo rss` during `placeflow run PLAN --rehearse` of a 16-worker
# PPO plan: 330-420 MB per worker; rounded up.
WORKER_BYTES = 450 << 20


def rehearsal_plan(plan: Plan) -> Plan:
    """The plan's layout on CPU workers with tiny models and a tiny batch (see module doc)."""
    w = plan.workload
    if w.data is not None and w.data.chat_template:
        raise SpecError(
            f"plan {plan.name!r}: [data] chat_template = true renders prompts with the model's "
            "chat template, which the rehearsal's tiny models (byte tokenizer) do not have; "
            "rehearse with a workload whose prompts are strings and chat_template = false"
        )
    models = _tiny_models(plan)
    workload = dataclasses.replace(
        w,
        name=f"{w.name}-rehearsal",
        models={role: models[spec.name] for role, spec in w.models.items()},
        batch=_tiny_batch(plan),
    )
    parallelism = {
        role: dataclasses.replace(
            par,
            micro_batch=min(par.micro_batch, 4),
            forward_micro_batch=min(par.forward_micro_batch, 8),
            # Packed micro-batches of the tiny samples, as many per call as above.
            micro_batch_tokens=min(par.micro_batch_tokens, 4 * 2 * SEQ_TOKENS),
            forward_micro_batch_tokens=min(par.forward_micro_batch_tokens, 8 * 2 * SEQ_TOKENS),
        )
        for role, par in plan.parallelism.items()
    }
    return Plan(
        name=f"{plan.name}-rehearsal",
        workload=workload,
        cluster=_cpu_cluster(plan.cluster),
        sets=plan.sets,
        parallelism=parallelism,
    )


def _cpu_cluster(cluster: ClusterSpec) -> ClusterSpec:
    cpu = get_hardware("cpu")
    pools = tuple(
        dataclasses.replace(p, gpu=cpu, profile=cpu.profile, price_per_gpu_hour=None)
        for p in cluster.pools
    )
    return dataclasses.replace(cluster, name=f"{cluster.name}-rehearsal", pools=pools)


def _degrees(plan: Plan, role: Role) -> tuple[list[int], list[int], int]:
    """(pipeline degrees, tensor degrees, expert-parallel degree) that split `role`'s model."""
    par: RoleParallelism = plan.parallelism[role]
    pipe, tensor = [par.train.p], [par.train.t]
    if role is Role.ACTOR:
        pipe.append(par.pg)
        tensor.append(par.tg)
    return pipe, tensor, par.train.e


def _tiny_models(plan: Plan) -> dict[str, ModelSpec]:
    """One tiny model per distinct model of the workload, by the original's name."""
    pipe: dict[str, list[int]] = {}
    tensor: dict[str, list[int]] = {}
    experts: dict[str, list[int]] = {}
    originals: dict[str, ModelSpec] = {}
    for role, spec in plan.workload.models.items():
        p, t, e = _degrees(plan, role)
        pipe.setdefault(spec.name, []).extend(p)
        tensor.setdefault(spec.name, []).extend(t)
        experts.setdefault(spec.name, []).append(e)
        originals[spec.name] = spec
    return {
        name: _tiny_model(
            spec,
            layers=math.lcm(2, *pipe[name]),
            tp=math.lcm(*tensor[name]),
            ep=math.lcm(*experts[name]),
        )
        for name, spec in originals.items()
    }


def _tiny_moe(spec: ModelSpec, *, hidden: int, ep: int) -> MoESpec | None:
    if spec.moe is None:
        return None
    return MoESpec(
        num_experts=math.lcm(4, ep),
        experts_per_token=min(2, spec.moe.experts_per_token),
        expert_ffn_hidden_size=hidden,
        shared_ffn_hidden_size=hidden if spec.moe.shared_ffn_hidden_size else 0,
        dense_layers=1 if spec.moe.dense_layers else 0,
        router_aux_loss_coef=spec.moe.router_aux_loss_coef,
        norm_topk_prob=spec.moe.norm_topk_prob,
    )


def _tiny_model(spec: ModelSpec, *, layers: int, tp: int, ep: int = 1) -> ModelSpec:
    # A tiny stand-in keeps the head and layer rules of Qwen3's wider heads, its
    # QK-norm and a mixture of experts; latent attention has a layout it cannot stand in for.
    spec.require_features(
        frozenset({Feature.QK_NORM, Feature.HEAD_DIM, Feature.MOE}),
        "rehearsal (executor/rehearsal.py)",
    )
    vocab = ByteTokenizer.vocab_size
    if vocab % tp:
        raise SpecError(
            f"rehearsal of {spec.name}: tensor parallel degree {tp} does not divide the byte "
            f"vocabulary of {vocab}; rehearse plans with power-of-two t and tg"
        )
    kv = max(2, tp)
    heads = kv if spec.num_kv_heads == spec.num_heads else 2 * kv  # MHA stays MHA
    hidden = heads * HEAD_DIM
    return ModelSpec(
        name=f"tiny-{Path(spec.name).name}-l{layers}-h{hidden}",
        num_layers=layers,
        hidden_size=hidden,
        num_heads=heads,
        num_kv_heads=kv,
        ffn_hidden_size=3 * hidden,
        vocab_size=vocab,
        tied_embeddings=spec.tied_embeddings,
        qkv_bias=spec.qkv_bias,
        qk_norm=spec.qk_norm,
        moe=_tiny_moe(spec, hidden=hidden, ep=ep),
        dtype=DType.FP32,
        max_seq_len=4 * SEQ_TOKENS,
        rope_theta=spec.rope_theta,
        norm_eps=spec.norm_eps,
    )


def _tiny_batch(plan: Plan) -> BatchSpec:
    """A batch whose samples split evenly over every role's DP replicas x mini-batches
    and over the generation replicas, at least MIN_SAMPLES of them."""
    w: Workload = plan.workload
    b = w.batch
    mini = min(b.mini_batches, MAX_MINI_BATCHES)
    samples_per_prompt = min(b.samples_per_prompt, 4)
    counts = [samples_per_prompt]
    for role, par in plan.parallelism.items():
        trained = role.trained
        counts.append(par.train.d * (mini if trained else 1))
    actor = plan.parallelism[Role.ACTOR]
    gen_set = plan.generator_set()
    gen_devices = plan.sets[gen_set].num_devices if gen_set is not None else None
    counts.append(actor.gen_layout(gen_devices).num_replicas)
    unit = math.lcm(*counts)
    samples = unit * math.ceil(MIN_SAMPLES / unit)
    return dataclasses.replace(
        b,
        prompts_per_step=samples // samples_per_prompt,
        samples_per_prompt=samples_per_prompt,
        prompt_len=SEQ_TOKENS,
        response_len=SEQ_TOKENS,
        ppo_epochs=min(b.ppo_epochs, 2),
        mini_batches=mini,
        response_len_dist="fixed",
    )


def check_host_memory(plan: Plan, available_bytes: int | None = None) -> None:
    """Refuse a CPU run whose worker processes do not fit in this machine's free memory."""
    workers = plan.num_gpus
    if any(plan.pool_of(i).gpu.kind is not DeviceKind.CPU for i in range(len(plan.sets))):
        return
    free = _available_bytes() if available_bytes is None else available_bytes
    needed = workers * WORKER_BYTES
    if needed > free:
        raise SpecError(
            f"plan {plan.name!r} runs {workers} worker processes, about "
            f"{needed / 2**30:.1f} GiB ({WORKER_BYTES >> 20} MiB each); this machine has "
            f"{free / 2**30:.1f} GiB free. Free memory or rehearse a plan with fewer devices"
        )


def _available_bytes() -> int:
    """MemAvailable from /proc/meminfo (Linux); elsewhere, no limit is known."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 1 << 62
