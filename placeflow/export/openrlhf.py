"""A plan as the flags of OpenRLHF's `train_ppo_ray` (DeepSpeed training, vLLM rollout).

OpenRLHF gives each model its own GPUs (`--<role>_num_nodes`,
`--<role>_num_gpus_per_node`) unless told to colocate: actor with reference
(`--colocate_actor_ref`), critic with reward (`--colocate_critic_reward`), or
everything, vLLM engines included (`--colocate_all_models`). Generation runs in
`--vllm_num_engines` engines of `--vllm_tensor_parallel_size` GPUs: on GPUs of
their own unless all models are colocated. Training is DeepSpeed ZeRO data
parallel (`--zero_stage`, `--adam_offload`), with DeepSpeed tensor parallelism
(`--ds_tensor_parallel_size`, one size for all models) and no pipeline.

What the flags cannot say is listed: other colocations (a reward with the
actor, say), generation on the actor's own devices unless everything is
colocated, per-role tensor sizes, pipeline parallelism, Safe-RLHF's cost model.
"""

from __future__ import annotations

from placeflow.export import Export, Target
from placeflow.export.common import nodes_of, set_label
from placeflow.plan import Plan
from placeflow.workload import Algorithm, Role

COMMAND = ("python3", "-m", "openrlhf.cli.train_ppo_ray")
ADV_ESTIMATOR = {Algorithm.PPO: "gae", Algorithm.GRPO: "group_norm", Algorithm.REMAX: "reinforce"}
# The colocations OpenRLHF has a flag for, as sets of roles.
PAIRS = {
    frozenset({Role.ACTOR, Role.REF}): "--colocate_actor_ref",
    frozenset({Role.CRITIC, Role.REWARD}): "--colocate_critic_reward",
}


def export(plan: Plan) -> Export:
    w, notes = plan.workload, list[str]()
    flags: list[str] = []
    placement = [frozenset(roles) for roles in plan.placement]
    everything = len(placement) == 1
    if everything:
        flags.append("--colocate_all_models")
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
            f"--{role}_num_nodes",
            str(shape[0]),
            f"--{role}_num_gpus_per_node",
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
            "--pretrain, --reward_pretrain and --critic_pretrain hold placeflow's model names; "
            "point them at the checkpoints, and give --prompt_data",
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
            "(it shares them only with --colocate_all_models)"
        )
    if par.pg > 1:
        notes.append(f"generation pipeline pg={par.pg}: vLLM engines here are tensor parallel only")
    return ["--vllm_num_engines", str(engines), "--vllm_tensor_parallel_size", str(par.tg)]


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
            + "): DeepSpeed's --ds_tensor_parallel_size is one for all; the actor's is used"
        )
    if any(plan.parallelism[r].train.p > 1 for r in w.roles):
        notes.append("pipeline parallelism: OpenRLHF's DeepSpeed training has none")
    if w.algorithm not in ADV_ESTIMATOR:
        notes.append(f"{w.algorithm}: OpenRLHF has no such algorithm; exported as PPO (gae)")
    flags = [
        "--advantage_estimator", ADV_ESTIMATOR.get(w.algorithm, "gae"),
        "--ds_tensor_parallel_size", str(actor.train.t),
        "--zero_stage", str(max(p.zero for p in trained)),
        "--rollout_batch_size", str(b.prompts_per_step),
        "--n_samples_per_prompt", str(b.samples_per_prompt),
        "--train_batch_size", str(b.num_samples // b.mini_batches),
        "--micro_train_batch_size", str(actor.micro_batch),
        "--micro_rollout_batch_size", str(plan.parallelism[Role.REF].micro_batch
                                          if Role.REF in w.models else actor.micro_batch),
        "--max_epochs", str(b.ppo_epochs),
        "--prompt_max_len", str(b.prompt_len),
        "--generate_max_len", str(b.response_len),
        "--actor_learning_rate", str(rl.lr),
        "--critic_learning_rate", str(rl.critic_lr),
        "--eps_clip", str(rl.clip_ratio),
        "--value_clip", str(rl.value_clip),
        "--gamma", str(rl.gamma),
        "--lambd", str(rl.lam),
        "--temperature", str(rl.temperature),
        "--top_p", str(rl.top_p),
        "--init_kl_coef", str(rl.kl_coef),
        "--pretrain", w.models[Role.ACTOR].name,
    ]  # fmt: skip
    if Role.REWARD in w.models:
        flags += ["--reward_pretrain", w.models[Role.REWARD].name]
    if Role.CRITIC in w.models:
        flags += ["--critic_pretrain", w.models[Role.CRITIC].name]
    if any(p.offload_optimizer for p in trained):
        flags.append("--adam_offload")
    if any(p.recompute for p in trained):
        flags.append("--gradient_checkpointing")
    return flags
