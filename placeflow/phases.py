"""Phase names: the one vocabulary shared by the simulator and the executor.

A run's measured phase times and a simulation's estimate are compared phase by
phase, so both sides name phases with this enum and nothing else.
"""

from enum import StrEnum


class Phase(StrEnum):
    GENERATE = "generate"  # actor rollout: prefill + decode
    GENERATE_BASELINE = "generate_baseline"  # ReMax's greedy baseline rollout
    RESHARD = "reshard"  # colocated actor: training -> generation layout (micro-DP all-gather)
    WEIGHT_SYNC = "weight_sync"  # actor weights to a generator on other devices
    REF_LOGPROB = "ref_logprob"
    OLD_LOGPROB = "old_logprob"
    VALUES = "values"
    COST_VALUES = "cost_values"  # Safe-RLHF: the critic's cost-value head
    REWARD = "reward"
    COST = "cost"  # Safe-RLHF's cost model
    ADVANTAGE = "advantage"  # controller-side (GAE or group normalisation)
    ACTOR_UPDATE = "actor_update"
    CRITIC_UPDATE = "critic_update"
