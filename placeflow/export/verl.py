"""A plan as verl hydra overrides of its Megatron PPO trainer (`ppo_megatron_trainer`).

verl (0.9) runs the actor, its rollout, the reference and the critic in one
global resource pool (`trainer.nnodes` x `trainer.n_gpus_per_node`), the
rollout colocated with the actor (hybrid engine); a reward model either shares
that pool or gets a pool of its own (`reward.reward_model.enable_resource_pool`).
Per role it takes Megatron tensor and pipeline sizes, data parallelism being the
rest of the pool, and a micro-batch per GPU; the rollout takes its own tensor
size (placeflow's tg). The mapping:

  plan                          verl override
  actor's set size              trainer.nnodes, trainer.n_gpus_per_node
  actor / ref / critic t, p     <role>.megatron.tensor_model_parallel_size, pipeline_...
  actor tg, pg                  actor_rollout_ref.rollout.tensor_model_parallel_size, pipeline_...
  micro_batch                   ppo_micro_batch_size_per_gpu
  forward_micro_batch           log_prob_micro_batch_size_per_gpu (actor, ref)
  generation_precision fp8      actor_rollout_ref.rollout.quantization
  kv_cache_dtype fp8            +actor_rollout_ref.rollout.engine_kwargs.vllm.kv_cache_dtype
  micro_batch_tokens            use_dynamic_bsz, ppo_max_token_len_per_gpu (actor, critic)
  forward_micro_batch_tokens    log_prob_use_dynamic_bsz, log_prob_max_token_len_per_gpu
                                  (actor's rollout, ref); critic.forward_max_token_len_per_gpu
  e (experts over DP)           <role>.megatron.expert_model_parallel_size
  cp (ring)                     <role>.megatron.context_parallel_size
  sequence_parallel             <role>.megatron.sequence_parallel (always given: verl's
                                  default is true, placeflow's false)
  zero >= 1                     megatron.use_distributed_optimizer
  recompute                     <model>.enable_gradient_checkpointing
  offload_params                <role>.megatron.param_offload
  offload_optimizer (step on    megatron.optimizer_offload
    the device)
  offload_optimizer, step on    +<role>.optim.override_optimizer_config.optimizer_cpu_offload
    the host                      (Megatron-core's CPU optimizer), optimizer_offload_fraction=1
  reward set of its own         reward.reward_model.enable_resource_pool, nnodes, n_gpus_per_node
  prompts, samples, lengths     data.train_batch_size, rollout.n, data.max_*_length
  mini_batches, ppo_epochs      actor.ppo_mini_batch_size (prompts), actor.ppo_epochs

What verl's config cannot say is listed: a critic or reference apart from the
actor (verl's examples/split_placement does it by changing the trainer's code),
a generator set of its own, a pool that is not whole nodes, ZeRO-2/3 (Megatron's
distributed optimizer is ZeRO-1), Safe-RLHF's cost model, Ulysses context
parallelism (verl's `ulysses_sequence_parallel_size` is a setting of its FSDP
trainer, not of this Megatron one: exported as Megatron's ring CP of the same
size), a reward model's context parallelism.
"""

from __future__ import annotations

from placeflow.export import Export, Target
from placeflow.export.common import lora_alpha, lora_target_modules, nodes_of, set_label
from placeflow.layout import CPKind
from placeflow.plan import Plan, RoleParallelism
from placeflow.workload import Algorithm, KVCacheDType, LoRASpec, Precision, Role

CONFIG_NAME = "ppo_megatron_trainer"
COMMAND = ("python3", "-m", "verl.trainer.main_ppo", f"--config-name={CONFIG_NAME}")
ADV_ESTIMATOR = {Algorithm.PPO: "gae", Algorithm.GRPO: "grpo", Algorithm.REMAX: "remax"}
# Where each trained or scoring role's Megatron settings live in verl's config.
MEGATRON_KEY = {
    Role.ACTOR: "actor_rollout_ref.actor.megatron",
    Role.REF: "actor_rollout_ref.ref.megatron",
    Role.CRITIC: "critic.megatron",
}
# Where the trained roles' optimizer settings live.
OPTIM_KEY = {Role.ACTOR: "actor_rollout_ref.actor.optim", Role.CRITIC: "critic.optim"}


def export(plan: Plan) -> Export:
    w, notes = plan.workload, list[str]()
    out: dict[str, object] = {}
    actor_set = plan.set_of(Role.ACTOR)
    out |= _pool("trainer", plan, actor_set, notes, "the actor's set")
    for role in (Role.REF, Role.CRITIC):
        if role in w.models and plan.set_of(role) != actor_set:
            notes.append(
                f"{role}: the plan runs it apart ({set_label(plan, role)}); verl's config puts "
                f"the {role} in the global pool with the actor ({set_label(plan, Role.ACTOR)})"
            )
    if plan.generator_set() is not None:
        notes.append(
            "the plan generates on a set of its own; verl's hybrid engine generates on the "
            "actor's devices"
        )
        if w.asynchronous:
            notes.append(
                f"max_staleness {w.max_staleness}: verl's main trainer is synchronous; its "
                "asynchronous trainers are the separate recipes verl.experimental."
                "one_step_off_policy (staleness 1) and fully_async_policy "
                "(async_training.staleness_threshold, a fraction of a batch, not a count of "
                "updates)"
            )
    out |= _batch(plan, notes)
    for role, key in MEGATRON_KEY.items():
        if role in w.models:
            out |= _megatron(plan, role, key)
            lay = plan.parallelism[role].train
            if lay.cp > 1 and lay.cp_kind is CPKind.ULYSSES:
                notes.append(
                    f"{role}: Ulysses context parallel cp={lay.cp}; verl's "
                    "ulysses_sequence_parallel_size belongs to its FSDP trainer, this Megatron "
                    f"export uses ring context parallelism (context_parallel_size={lay.cp})"
                )
            if role is not Role.REF and plan.parallelism[role].zero >= 2:
                notes.append(
                    f"{role}: ZeRO-{plan.parallelism[role].zero}; Megatron's distributed "
                    "optimizer shards the optimizer state only (ZeRO-1)"
                )
    # Activation recomputation is per model in verl: the actor's (shared with the ref).
    out["actor_rollout_ref.model.enable_gradient_checkpointing"] = par_of(
        plan, Role.ACTOR
    ).recompute
    if Role.CRITIC in w.models:
        out["critic.model.enable_gradient_checkpointing"] = par_of(plan, Role.CRITIC).recompute
    par = plan.parallelism[Role.ACTOR]
    out |= {
        "actor_rollout_ref.rollout.name": "vllm",
        "actor_rollout_ref.rollout.tensor_model_parallel_size": par.tg,
        "actor_rollout_ref.rollout.pipeline_model_parallel_size": par.pg,
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": par.micro_batch,
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": par.forward_mb,
        "actor_rollout_ref.model.path": w.models[Role.ACTOR].name,
    }
    out |= _dynamic_bsz(
        "actor_rollout_ref.actor", par.train_micro.tokens, "ppo_max_token_len_per_gpu"
    )
    packs = bool(par.train_micro.tokens)  # verl's log-prob calls inherit the actor's switch
    out |= _dynamic_bsz(
        "actor_rollout_ref.rollout",
        par.forward_micro.tokens,
        "log_prob_max_token_len_per_gpu",
        inherited=packs,
    )
    if Role.REF in w.models:
        ref = plan.parallelism[Role.REF]
        out["actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu"] = ref.forward_mb
        out |= _dynamic_bsz(
            "actor_rollout_ref.ref",
            ref.forward_micro.tokens,
            "log_prob_max_token_len_per_gpu",
            inherited=packs,
        )
    if Role.CRITIC in w.models:
        critic = plan.parallelism[Role.CRITIC]
        out["critic.ppo_micro_batch_size_per_gpu"] = critic.micro_batch
        out |= _dynamic_bsz(
            "critic", critic.train_micro.tokens, "ppo_max_token_len_per_gpu", inherited=packs
        )
        if critic.train_micro.tokens:
            out["critic.forward_max_token_len_per_gpu"] = critic.forward_micro.tokens
        elif critic.forward_micro.tokens:
            notes.append(
                f"critic: forward_micro_batch_tokens {critic.forward_micro.tokens} with "
                "training micro-batches counted in samples; verl's critic packs both or neither "
                "(critic.use_dynamic_bsz)"
            )
        elif critic.forward_mb != critic.micro_batch:
            notes.append(
                f"critic: forward_micro_batch {critic.forward_mb}; verl's Megatron critic "
                f"computes values with its ppo micro-batch ({critic.micro_batch})"
            )
        out["critic.model.path"] = w.models[Role.CRITIC].name
    if Role.REWARD in w.models:
        out |= _reward(plan, notes)
    if w.lora is not None:
        out |= _lora(w.lora)
    out |= _precision(plan, notes)
    if Role.COST in w.models:
        notes.append("cost: verl has no cost model (Safe-RLHF's); left out")
    return Export(
        target=Target.VERL,
        plan_name=plan.name,
        plan_hash=plan.content_hash(),
        command=COMMAND,
        arguments=tuple(f"{k}={_value(v)}" for k, v in out.items()),
        unexpressed=tuple(notes),
        to_set=(
            "the model paths hold placeflow's model names; point them at the checkpoints "
            "(actor_rollout_ref.model.path, critic.model.path, reward.reward_model.model_path), "
            "and give the data files (data.train_files, data.val_files)",
        ),
    )


def _precision(plan: Plan, notes: list[str]) -> dict[str, object]:
    """FP8 generation is vLLM's online quantisation (`rollout.quantization`), an fp8 KV
    cache a vLLM engine argument (`rollout.engine_kwargs.vllm`, passed to vLLM as
    given); FP8 training has no key in verl 0.9's config."""
    w = plan.workload
    out: dict[str, object] = {}
    if w.kv_cache_dtype is not KVCacheDType.AUTO:
        out["+actor_rollout_ref.rollout.engine_kwargs.vllm.kv_cache_dtype"] = w.kv_cache_dtype.value
    if w.train_precision is not Precision.BF16:
        notes.append(
            f"train_precision {w.train_precision}: verl's Megatron trainer has no FP8 key in its "
            "config (TransformerEngine's recipe would be set in its transformer config)"
        )
    if w.generation_precision is not Precision.BF16:
        out["actor_rollout_ref.rollout.quantization"] = w.generation_precision.value
    return out


def _dynamic_bsz(
    prefix: str, tokens: int, length_key: str, *, inherited: bool = False
) -> dict[str, object]:
    """verl's sequence packing of one call: micro-batches of at most `tokens` tokens
    (`use_dynamic_bsz`), or counted in samples (tokens = 0: nothing to say, unless the
    switch is `inherited` on from the actor's, as verl's log-prob calls inherit it)."""
    if not tokens and not inherited:
        return {}
    switch = (
        "use_dynamic_bsz"
        if length_key == "ppo_max_token_len_per_gpu"
        else ("log_prob_use_dynamic_bsz")
    )
    out: dict[str, object] = {f"{prefix}.{switch}": bool(tokens)}
    if tokens:
        out[f"{prefix}.{length_key}"] = tokens
    return out


# verl's model config of each role that can train adapters (actor_rollout_ref.model /
# critic.model: lora_rank, lora_alpha, target_modules, passed to PEFT's LoraConfig).
LORA_PREFIX = {Role.ACTOR: "actor_rollout_ref.model", Role.CRITIC: "critic.model"}


def _lora(lora: LoRASpec) -> dict[str, object]:
    out: dict[str, object] = {}
    for role in lora.roles:
        prefix = LORA_PREFIX[role]
        out[f"{prefix}.lora_rank"] = lora.rank
        out[f"{prefix}.lora_alpha"] = lora_alpha(lora)
        out[f"{prefix}.target_modules"] = lora_target_modules(lora, verl_list=True)
    return out


def par_of(plan: Plan, role: Role) -> RoleParallelism:
    return plan.parallelism[role]


def _value(v: object) -> str:
    return str(v).lower() if isinstance(v, bool) else str(v)


def _pool(prefix: str, plan: Plan, set_index: int, notes: list[str], what: str) -> dict[str, int]:
    shape = nodes_of(plan, set_index)
    s = plan.sets[set_index]
    if shape is None:
        notes.append(
            f"{what} ({s.num_devices} devices from {s.first_device}) is not whole nodes; verl "
            "sizes pools as nodes x GPUs per node: rounded up to whole nodes"
        )
        per_node = plan.pool_of(set_index).gpus_per_node
        shape = (-(-s.num_devices // per_node), per_node)
    return {f"{prefix}.nnodes": shape[0], f"{prefix}.n_gpus_per_node": shape[1]}


def _batch(plan: Plan, notes: list[str]) -> dict[str, object]:
    w = plan.workload
    b, rl = w.batch, w.rl
    if w.algorithm not in ADV_ESTIMATOR:
        notes.append(f"{w.algorithm}: verl has no such algorithm; exported as PPO (gae)")
    if b.prompts_per_step % b.mini_batches:
        notes.append(
            f"verl counts a mini-batch in prompts: {b.prompts_per_step} prompts do not split "
            f"into {b.mini_batches} mini-batches; rounded down"
        )
    out: dict[str, object] = {
        "algorithm.adv_estimator": ADV_ESTIMATOR.get(w.algorithm, "gae"),
        "algorithm.gamma": rl.gamma,
        "algorithm.lam": rl.lam,
        "data.train_batch_size": b.prompts_per_step,
        "data.max_prompt_length": b.prompt_len,
        "data.max_response_length": b.response_len,
        "actor_rollout_ref.rollout.n": b.samples_per_prompt,
        "actor_rollout_ref.rollout.temperature": rl.temperature,
        "actor_rollout_ref.rollout.top_p": rl.top_p,
        "actor_rollout_ref.actor.ppo_mini_batch_size": max(1, b.prompts_per_step // b.mini_batches),
        "actor_rollout_ref.actor.ppo_epochs": b.ppo_epochs,
        "actor_rollout_ref.actor.optim.lr": rl.lr,
        "actor_rollout_ref.actor.clip_ratio": rl.clip_ratio,
        "actor_rollout_ref.actor.entropy_coeff": rl.entropy_coef,
    }
    if w.algorithm is Algorithm.PPO:
        out |= {
            "algorithm.use_kl_in_reward": rl.kl_coef > 0,
            "algorithm.kl_ctrl.kl_coef": rl.kl_coef,
            "critic.optim.lr": rl.critic_lr,
            "critic.cliprange_value": rl.value_clip,
        }
    else:  # GRPO, ReMax: the k3 KL in the loss, as placeflow's GRPO has it
        out |= {
            "actor_rollout_ref.actor.use_kl_loss": rl.kl_coef > 0,
            "actor_rollout_ref.actor.kl_loss_coef": rl.kl_coef,
            "actor_rollout_ref.actor.kl_loss_type": "low_var_kl",
        }
    return out


def _megatron(plan: Plan, role: Role, key: str) -> dict[str, object]:
    par = plan.parallelism[role]
    out: dict[str, object] = {
        f"{key}.tensor_model_parallel_size": par.train.t,
        f"{key}.pipeline_model_parallel_size": par.train.p,
        # e is carved out of d, expert TP = t: Megatron's defaults for the other sizes
        f"{key}.expert_model_parallel_size": par.train.e,
        f"{key}.context_parallel_size": par.train.cp,
        f"{key}.sequence_parallel": par.train.sequence_parallel,
        # weights in host memory between the role's calls (gradient buffers released)
        f"{key}.param_offload": par.offload_params,
    }
    if role is not Role.REF:  # the trained roles' optimizer
        out[f"{key}.use_distributed_optimizer"] = par.zero >= 1
        # verl's optimizer offload: the Adam state leaves the device between updates and
        # comes back for the step (placeflow's offload with the step on the device).
        out[f"{key}.optimizer_offload"] = par.offload_optimizer and not par.host_optimizer_step
        if par.host_optimizer_step:
            # The step on the CPU: Megatron-core's CPU optimizer, through verl's pass-through
            # of Megatron optimizer settings (a key the default config lacks: "+").
            optim = OPTIM_KEY[role]
            out[f"+{optim}.override_optimizer_config.optimizer_cpu_offload"] = True
            out[f"+{optim}.override_optimizer_config.optimizer_offload_fraction"] = 1.0
    return out


def _reward(plan: Plan, notes: list[str]) -> dict[str, object]:
    """The reward model: in the global pool with the actor, or in a pool of its own."""
    par = plan.parallelism[Role.REWARD]
    if par.train.cp > 1:
        notes.append(
            f"reward: context parallel cp={par.train.cp}; verl's reward model takes a tensor "
            "size only: it scores whole sequences per rank"
        )
    if par.offload_params:
        notes.append(
            "reward: offload_params; verl's reward model runs in its own rollout engine, "
            "which has no parameter offload: its weights stay on the device"
        )
    out: dict[str, object] = {
        "reward.reward_model.enable": True,
        "reward.reward_model.model_path": plan.workload.models[Role.REWARD].name,
        "reward.reward_model.rollout.tensor_model_parallel_size": par.train.t,
    }
    reward_set = plan.set_of(Role.REWARD)
    if reward_set == plan.set_of(Role.ACTOR):
        return out | {"reward.reward_model.enable_resource_pool": False}
    if plan.sets[reward_set].roles != (Role.REWARD,):
        notes.append(
            f"reward: the plan shares its devices with other roles "
            f"({set_label(plan, Role.REWARD)}); verl gives a reward model the actor's pool or "
            "one of its own: its own is used"
        )
    return (
        out
        | {"reward.reward_model.enable_resource_pool": True}
        | _pool("reward.reward_model", plan, reward_set, notes, "the reward model's set")
    )
