"""A plan as the flags of OpenRLHF's `train_ppo_ray` (DeepSpeed training, vLLM rollout).

The flags are those of OpenRLHF 0.11 (`--<section>.<name>`; releases before 0.10
spelled them `--<section>_<name>`, e.g. `--actor_num_nodes`); tests/test_export.py
parses every export with the installed release's own argument parser.

OpenRLHF gives each model its own GPUs (`--<role>.num_nodes`,
`--<role>.num_gpus_per_node`) unless told to colocate: actor with reference
(`--train.colocate_actor_ref`), critic with reward (`--train.colocate_critic_reward`),
or everything, vLLM engines included (`--train.colocate_all`). Generation runs in
`--vllm.num_engines` engines of `--vllm.tensor_parallel_size` GPUs: on GPUs of
their own unless all models are colocated. Training is DeepSpeed ZeRO data
parallel (`--ds.zero_stage`, `--ds.adam_offload`), with DeepSpeed tensor
parallelism (`--ds.tensor_parallel_size`, one size for all models) and no pipeline;
context parallelism is its ring attention (`--ds.ring_attn_size`, one size for all
models, with `--ds.ring_attn_head_stride`).

What the flags cannot say is listed: other colocations (a reward with the
actor, say), generation on the actor's own devices unless everything is
colocated, per-role tensor sizes, pipeline parallelism, per-role micro-batches
and ZeRO stages, experts over an expert-parallel axis, per-role context
parallel sizes, Ulysses, Megatron's sequence parallelism, ReMax's greedy
baseline, Safe-RLHF's cost model.
"""

from __future__ import annotations

from placeflow.export import Export, Target
from placeflow.export.common import lora_alpha, lora_target_modules, nodes_of, set_label
from placeflow.layout import CPKind
from placeflow.models import DType
from placeflow.plan import Plan
from placeflow.workload import Algorithm, Role

COMMAND = ("python3", "-m", "openrlhf.cli.train_ppo_ray")
# OpenRLHF has no ReMax (a greedy baseline per prompt); its REINFORCE (no baseline) is the
# closest, and says so in the notes.
ADV_ESTIMATOR = {Algorithm.PPO: "gae", Algorithm.GRPO: "group_norm", Algorithm.REMAX: "reinforce"}
# The colocations OpenRLHF has a flag for, as sets of roles.
PAIRS = {
    frozenset({Role.ACTOR, Role.REF}): "--train.colocate_actor_ref",
    frozenset({Role.CRITIC, Role.REWARD}): "--train.colocate_critic_reward",
}
# OpenRLHF's model flags per role (the reference loads the actor's model).
MODEL_FLAG = {
    Role.ACTOR: "--actor.model_name_or_path",
    Role.CRITIC: "--critic.model_name_or_path",
    Role.REWARD: "--reward.model_name_or_path",
}


def export(plan: Plan) -> Export:
    w, notes = plan.workload, list[str]()
    flags: list[str] = []
    placement = [frozenset(roles) for roles in plan.placement]
    everything = len(placement) == 1
    if everything:
        flags.append("--train.colocate_all")
    for roles in placement:
        if len(roles) > 1 and not everything:
            if roles in PAIRS:
                flags.append(PAIRS[roles])
            else:
                notes.append(
                    f"{'+'.join(sorted(roles))}: OpenRLHF colocates only actor+ref, critic+reward "
                    "or all models; these roles get GPUs each (the counts below)"
                )
    for role in w.roles:
        if role is Role.COST:
            notes.append("cost: OpenRLHF has no cost model (Safe-RLHF); left out")
            continue
        i = plan.set_of(role)
        shape = nodes_of(plan, i) or (1, plan.sets[i].num_devices)
        flags += [
            f"--{role}.num_nodes",
            str(shape[0]),
            f"--{role}.num_gpus_per_node",
            str(shape[1]),
        ]
    flags += _rollout(plan, everything, notes)
    flags += _training(plan, notes)
    return Export(
        target=Target.OPENRLHF,
        plan_name=plan.name,
        plan_hash=plan.content_hash(),
        command=COMMAND,
        arguments=tuple(flags),
        unexpressed=tuple(notes),
        to_set=(
            "the --<role>.model_name_or_path flags hold placeflow's model names; point them at "
            "the checkpoints, and give --data.prompt_dataset (and --data.input_key, "
            "--data.label_key)",
        ),
    )


def _rollout(plan: Plan, everything: bool, notes: list[str]) -> list[str]:
    par = plan.parallelism[Role.ACTOR]
    gen = plan.generator_set()
    devices = plan.sets[gen if gen is not None else plan.set_of(Role.ACTOR)].num_devices
    engines = devices // (par.tg * par.pg)
    if gen is None and not everything:
        notes.append(
            f"the plan generates on the actor's devices ({set_label(plan, Role.ACTOR)}); "
            f"OpenRLHF's {engines} vLLM engines then need {devices} GPUs of their own "
            "(it shares them only with --train.colocate_all)"
        )
    if par.pg > 1:
        notes.append(f"generation pipeline pg={par.pg}: vLLM engines here are tensor parallel only")
    return ["--vllm.num_engines", str(engines), "--vllm.tensor_parallel_size", str(par.tg)]


def _training(plan: Plan, notes: list[str]) -> list[str]:
    w = plan.workload
    b, rl = w.batch, w.rl
    actor = plan.parallelism[Role.ACTOR]
    trained = [plan.parallelism[r] for r in w.roles if r in (Role.ACTOR, Role.CRITIC)]
    tps = {r: plan.parallelism[r].train.t for r in w.roles}
    if len(set(tps.values())) > 1:
        notes.append(
            "per-role tensor sizes ("
            + ", ".join(f"{r} t={t}" for r, t in tps.items())
            + "): DeepSpeed's --ds.tensor_parallel_size is one for all; the actor's is used"
        )
    if any(plan.parallelism[r].train.p > 1 for r in w.roles):
        notes.append("pipeline parallelism: OpenRLHF's DeepSpeed training has none")
    if any(plan.parallelism[r].train.e > 1 for r in w.roles):
        notes.append("expert parallelism: OpenRLHF's DeepSpeed training has none")
    if any(plan.parallelism[r].train.sequence_parallel for r in w.roles):
        notes.append(
            "sequence_parallel: OpenRLHF's DeepSpeed tensor parallelism has no Megatron "
            "sequence parallelism"
        )
    zeros = {p.zero for p in trained}
    if len(zeros) > 1:
        notes.append(f"ZeRO stages {sorted(zeros)}: --ds.zero_stage is one for all; the highest")
    # OpenRLHF: one micro-batch for the updates, one for the forward passes of experience.
    for flag, roles, forward_only in (
        ("--train.micro_batch_size", (Role.ACTOR, Role.CRITIC), False),
        ("--rollout.micro_batch_size", (Role.REF, Role.REWARD), True),
    ):
        sizes = {
            r: plan.parallelism[r].forward_mb if forward_only else plan.parallelism[r].micro_batch
            for r in roles
            if r in w.models
        }
        if len(set(sizes.values())) > 1:
            notes.append(
                f"micro-batches ({', '.join(f'{r} {m}' for r, m in sizes.items())}): {flag} "
                f"is one for {' and '.join(map(str, sizes))}; the {next(iter(sizes))}'s is used"
            )
    if rl.kl_coef == 0 and Role.REF in w.models:
        notes.append(
            "ref: with a KL coefficient of 0 OpenRLHF starts no reference model "
            "(--algo.kl.init_coef 0); the plan places one"
        )
    if w.algorithm is Algorithm.REMAX:
        notes.append("remax: OpenRLHF has no greedy baseline; exported as REINFORCE (reinforce)")
    elif w.algorithm not in ADV_ESTIMATOR:
        notes.append(f"{w.algorithm}: OpenRLHF has no such algorithm; exported as PPO (gae)")
    forward = next((r for r in (Role.REF, Role.REWARD) if r in w.models), Role.ACTOR)
    flags = [
        "--algo.advantage.estimator", ADV_ESTIMATOR.get(w.algorithm, "gae"),
        "--ds.tensor_parallel_size", str(actor.train.t),
        "--ds.zero_stage", str(max(zeros)),
        "--ds.param_dtype", _dtype(plan, notes),
        "--rollout.batch_size", str(b.prompts_per_step),
        "--rollout.n_samples_per_prompt", str(b.samples_per_prompt),
        "--train.batch_size", str(b.num_samples // b.mini_batches),
        "--train.micro_batch_size", str(actor.micro_batch),
        "--rollout.micro_batch_size", str(plan.parallelism[forward].forward_mb),
        "--train.max_epochs", str(b.ppo_epochs),
        "--data.max_len", str(b.prompt_len + b.response_len),
        "--rollout.max_new_tokens", str(b.response_len),
        "--actor.adam.lr", str(rl.lr),
        "--actor.eps_clip", str(rl.clip_ratio),
        "--algo.advantage.gamma", str(rl.gamma),
        "--algo.advantage.lambd", str(rl.lam),
        "--rollout.temperature", str(rl.temperature),
        "--rollout.top_p", str(rl.top_p),
        "--algo.kl.init_coef", str(rl.kl_coef),
    ]  # fmt: skip
    flags += _packing(plan, forward, notes)
    low = {
        key: value
        for key, value in (
            ("generation_precision", w.generation_precision.value),
            ("kv_cache_dtype", w.kv_cache_dtype.value),
            ("train_precision", w.train_precision.value),
        )
        if value == "fp8"
    }
    if low:
        notes.append(
            ", ".join(f"{k} {v}" for k, v in low.items())
            + ": OpenRLHF's train_ppo_ray has no FP8 flag (its vLLM engines and DeepSpeed "
            "train in the --ds.param_dtype)"
        )
    flags += _ring_attention(plan, "--ds.packing_samples" in flags, notes)
    if rl.entropy_coef:
        flags += ["--actor.entropy_coef", str(rl.entropy_coef)]
    if w.algorithm is not Algorithm.PPO and rl.kl_coef > 0:
        # placeflow's GRPO and ReMax put the k3 KL in the loss, as OpenRLHF's GRPO recipe
        flags += ["--algo.kl.use_loss", "--algo.kl.estimator", "k3"]
    if Role.CRITIC in w.models:
        flags += ["--critic.adam.lr", str(rl.critic_lr), "--critic.value_clip", str(rl.value_clip)]
    for role, flag in MODEL_FLAG.items():
        if role in w.models:
            flags += [flag, w.models[role].name]
    if any(p.offload_optimizer for p in trained):
        flags.append("--ds.adam_offload")
    # Frozen models' weights on the host: DeepSpeed ZeRO-3 parameter offload, which
    # fetches each layer as the forward reaches it (the same bytes, layer by layer).
    for role, flag in ((Role.REF, "--ref.offload"), (Role.REWARD, "--reward.offload")):
        if role in w.models and plan.parallelism[role].offload_params:
            flags.append(flag)
    for role in (r for r in (Role.ACTOR, Role.CRITIC) if r in w.models):
        if plan.parallelism[role].offload_params:
            notes.append(
                f"{role}: offload_params; OpenRLHF offloads a trained model's weights only "
                "through DeepSpeed's ZeRO-3 config, not a flag: its weights stay on the device"
            )
    # One switch, in the actor's section, for every model DeepSpeed trains.
    if any(p.recompute for p in trained):
        flags.append("--actor.gradient_checkpointing_enable")
    if w.asynchronous and plan.generator_set() is not None:
        flags.append("--train.async_enable")
        if w.max_staleness > 1:
            # Its rollout queue holds this many batches ahead of the trainer (default 1).
            flags += ["--train.async_queue_size", str(w.max_staleness)]
    if w.lora is not None:
        trained_roles = [r for r in (Role.ACTOR, Role.CRITIC) if r in w.models]
        if set(w.lora.roles) != set(trained_roles):
            notes.append(
                f"[lora] adapts {', '.join(w.lora.roles)} only; OpenRLHF's --ds.lora.* apply "
                f"to every model DeepSpeed trains ({', '.join(trained_roles)})"
            )
        flags += ["--ds.lora.rank", str(w.lora.rank)]
        alpha = lora_alpha(w.lora)
        if not isinstance(alpha, int):  # OpenRLHF's parser takes an integer alpha
            notes.append(f"[lora] alpha {alpha}: OpenRLHF takes an integer; {round(alpha)} given")
            alpha = round(alpha)
        flags += ["--ds.lora.alpha", str(alpha)]
        flags += ["--ds.lora.target_modules", *lora_target_modules(w.lora).split()]
    return flags


def _dtype(plan: Plan, notes: list[str]) -> str:
    dtype = plan.workload.models[Role.ACTOR].dtype
    if dtype in (DType.BF16, DType.FP16):
        return str(dtype)
    notes.append(f"{dtype} training: OpenRLHF trains in bf16 or fp16; bf16 is used")
    return str(DType.BF16)


def _ring_attention(plan: Plan, packed: bool, notes: list[str]) -> list[str]:
    """Context parallelism: OpenRLHF's ring attention, one size for every model
    (--ds.ring_attn_size, the actor's cp; it needs --ds.packing_samples, which
    train_ppo_ray turns on itself with a warning), K/V passed for one head at a time
    (--ds.ring_attn_head_stride 1, its default). Ulysses has no OpenRLHF flag."""
    w = plan.workload
    cps = {r: plan.parallelism[r].train.cp for r in w.roles if r is not Role.COST}
    cp = cps[Role.ACTOR]
    if len(set(cps.values())) > 1:
        notes.append(
            "per-role context parallel sizes ("
            + ", ".join(f"{r} cp={c}" for r, c in cps.items())
            + "): --ds.ring_attn_size is one for all; the actor's is used"
        )
    if any(
        plan.parallelism[r].train.cp > 1 and plan.parallelism[r].train.cp_kind is CPKind.ULYSSES
        for r in cps
    ):
        notes.append("Ulysses context parallelism: OpenRLHF has ring attention only (used)")
    if cp == 1:
        return []
    flags = ["--ds.ring_attn_size", str(cp), "--ds.ring_attn_head_stride", "1"]
    return flags if packed else [*flags, "--ds.packing_samples"]


def _packing(plan: Plan, forward: Role, notes: list[str]) -> list[str]:
    """Micro-batches counted in tokens: OpenRLHF's one switch for every model
    (--train.dynamic_batch_enable, which needs --ds.packing_samples), with one token
    budget for the updates and one for the forward passes of experience."""
    w = plan.workload
    train = plan.parallelism[Role.ACTOR].train_micro.tokens
    rollout = plan.parallelism[forward].forward_micro.tokens
    packed = {r: bool(plan.parallelism[r].token_budgets) for r in w.roles}
    if not any(packed.values()):
        return []
    if not train or not all(packed.values()):
        notes.append(
            "micro-batches counted in tokens for "
            + ", ".join(str(r) for r, on in packed.items() if on)
            + " only: OpenRLHF's --train.dynamic_batch_enable packs every model or none; "
            + (
                "exported with the actor's budget"
                if train
                else "left off (the actor's are in samples)"
            )
        )
        if not train:
            return []
    return [
        "--train.dynamic_batch_enable",
        "--ds.packing_samples",
        "--train.max_tokens_per_gpu", str(train),
        "--rollout.max_tokens_per_gpu", str(rollout or train),
    ]  # fmt: skip
