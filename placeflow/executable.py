"""Which plans placeflow's executor runs: the one list of its rules.

A plan can be sound (its specs validate, it fits in memory) and still be one
the executor does not run here: latent attention, LoRA, generation pipelines,
some mixture-of-experts layouts, context and sequence parallelism. These rules
are facts about the executor's engines, written once here so that the executor
refuses such a plan before any worker starts (`executor/loop.py`,
`executor/run.py`) and the planner says of every plan it ranks whether
`placeflow run` would take it (`planner/search.py`,
`RankedPlan.executor_problems`). The module reads specs
only; it imports nothing of the executor, so the planner stays free of torch
and Ray.
"""

from __future__ import annotations

from placeflow.errors import SpecError
from placeflow.models import Feature
from placeflow.plan import Plan, RoleParallelism
from placeflow.workload import KVCacheDType, Precision, Role

# What the engines run of a model: Llama/Qwen2/Qwen3 layers and mixtures of experts.
# Latent attention is refused by name, not run as a different model.
ENGINE_FEATURES = frozenset({Feature.MOE, Feature.QK_NORM, Feature.HEAD_DIM})


def executable_problems(plan: Plan) -> list[str]:
    """Why the executor would refuse `plan`, one reason each; empty when it runs it."""
    w = plan.workload
    problems: list[str] = []
    if w.reward_function is None and Role.REWARD not in w.models:
        problems.append("the workload needs a reward_function or a reward model")
    if w.lora is not None:
        problems.append(
            f"[lora] (rank {w.lora.rank} on {', '.join(w.lora.roles)}) is simulated, planned "
            "and exported (verl, OpenRLHF), but the executor's engines train full weights; "
            "remove [lora] to run the plan here"
        )
    fp8 = [
        f"{key} = {value}"
        for key, value, default in (
            ("generation_precision", w.generation_precision, Precision.BF16),
            ("kv_cache_dtype", w.kv_cache_dtype, KVCacheDType.AUTO),
            ("train_precision", w.train_precision, Precision.BF16),
        )
        if value != default
    ]
    if fp8:
        problems.append(
            f"{', '.join(fp8)} is simulated, planned and exported, but the executor's "
            "engines compute in bf16/fp32 (no FP8 kernels on its CPU workers); use bf16 "
            "and auto to run the plan here"
        )
    for role, spec in w.models.items():
        try:
            spec.require_features(ENGINE_FEATURES, f"the executor's engines (role {role})")
        except SpecError as exc:
            problems.append(str(exc))
        if spec.moe is not None:
            problems.extend(_moe_problems(role, plan.parallelism[role]))
    n = w.batch.num_samples
    for role in w.roles:
        par = plan.parallelism[role]
        if par.pg > 1:
            problems.append(
                f"{role}: generation pipeline pg > 1 is not executed: the planner emits pg = 1 "
                f"(one decode pass over all layers per generation replica); the plan has "
                f"pg={par.pg}. Use pg = 1 (such plans can be simulated)"
            )
        if par.train.cp > 1:
            problems.append(
                f"{role}: context parallel cp={par.train.cp} ({par.train.cp_kind}) is simulated, "
                "planned and exported (verl, OpenRLHF, Megatron), but the executor's engines "
                "run whole sequences per rank (no ring or Ulysses attention); use cp = 1 to run "
                "the plan here"
            )
        if par.train.sequence_parallel:
            problems.append(
                f"{role}: sequence_parallel is simulated and exported, but the executor's "
                "tensor-parallel layers all-reduce whole activations; set "
                "sequence_parallel = false to run the plan here"
            )
        d = par.train.d
        if role.trained and n < d * w.batch.mini_batches:
            problems.append(
                f"{role}: {n} samples per step are fewer than d={d} replicas x "
                f"{w.batch.mini_batches} mini-batches (every DP rank needs a sample in every "
                "mini-batch); raise prompts_per_step or samples_per_prompt, or lower "
                "mini_batches"
            )
    return problems


def check_executable(plan: Plan) -> None:
    """Raise SpecError, with every reason, for a plan the executor cannot run."""
    problems = executable_problems(plan)
    if problems:
        raise SpecError("; ".join(problems))


def _moe_problems(role: Role, par: RoleParallelism) -> list[str]:
    """What the engines run of a mixture of experts: EP over data parallelism, no expert TP."""
    train = par.train
    problems = []
    if train.t > 1 or (role is Role.ACTOR and par.tg > 1):
        problems.append(
            f"{role}: a mixture of experts with tensor parallelism (t={train.t}, "
            f"tg={par.tg}) is not executed (expert TP); use t = 1 and tg = 1, and e for experts"
        )
    if train.p > 1:
        problems.append(
            f"{role}: a mixture of experts with pipeline parallelism p={train.p} is not executed "
            "(the load-balancing loss spans the stages); use p = 1"
        )
    trained = role.trained
    if trained and train.e > 1 and par.zero > 0 and train.d > 1:
        problems.append(
            f"{role}: ZeRO stage {par.zero} with expert parallel e={train.e} is not executed "
            "(the optimizer would shard weights across ranks holding different experts); "
            "use zero = 0"
        )
    return problems
