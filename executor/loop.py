"""The RL loop on a running Controller: one GRPO, ReMax, PPO or Safe-RLHF step.

The controller (this process) holds the loop, as in HybridFlow's single
controller; every remote call is written out where it is made. The calls are
those of the algorithm's dataflow (`placeflow.dataflow`, the graph the
simulator costs), named by `placeflow.phases.Phase`:

  reshard / weight_sync  the actor's weights into its rollout engine (colocated
                         reshard, or the sync to a generator set of its own)
  generate               prompts split over the generation replicas; ReMax adds
                         generate_baseline (greedy, one per prompt) behind it
  forward calls          ref_logprob, old_logprob, values, cost_values, reward,
                         cost: all launched at once, so that calls on disjoint
                         device sets run in parallel and calls on one set in
                         dataflow order; a rule-based reward function scores
                         the responses meanwhile, here or in Ray tasks
                         (`executor/rewards.py`)
  advantage              here: group normalisation, ReMax's baseline, GAE, and
                         Safe-RLHF's cost GAE and Lagrange multiplier
  actor_update, critic_update  launched together

Prompts come from the workload's dataset (`executor/data.py`); `evaluate`
scores the validation split with greedy responses, between steps, without
training. Each call's interval is measured on the driver (`executor.timeline`) and the
step's timeline goes to metrics.jsonl. With one-step-off asynchrony and a
generator set, step k+1's rollout runs on the generator while step k trains,
and the update's weights follow it there.

Samples of the training phases are split over DP replicas by the token-aware
balancer with counts that differ by at most one (samples need not divide
evenly); the engines give every DP rank the same number of micro-batches, the
last ones padding where a rank has fewer samples (FSDP's collectives need it),
and scale losses by the global token count.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from placeflow.dataflow import CallKind, dataflow_calls
from placeflow.errors import SpecError
from placeflow.executable import check_executable
from placeflow.executor import rl
from placeflow.executor.balance import Partition, WorkModel, balanced_partition
from placeflow.executor.batch import Batch
from placeflow.executor.controller import Controller
from placeflow.executor.data import Example, PromptSchedule, data_of, load_examples, prompt_text
from placeflow.executor.dispatch import DispatchLayout, collect, split_by_dp
from placeflow.executor.engines.offload import OffloadMode
from placeflow.executor.engines.roles import EngineSetup, UpdateConfig, WeightSource
from placeflow.executor.engines.sampler import SamplingParams
from placeflow.executor.engines.tokenizer import ByteTokenizer, HFTokenizer, Tokenizer
from placeflow.executor.engines.tp import TPImpl
from placeflow.executor.engines.trainer import OptimConfig
from placeflow.executor.engines.transformer import Arch
from placeflow.executor.groups import WorkerGroup
from placeflow.executor.rewards import (
    RewardInput,
    Scores,
    collect_scoring,
    launch_scoring,
    load_reward_function,
    log_errors,
    score_items,
)
from placeflow.executor.timeline import Launched, StepClock
from placeflow.executor.worker import Worker, WorkerMethod
from placeflow.fields import Field, call_inputs
from placeflow.metrics import Metric, RecordKey, over_ranks, reward_extra
from placeflow.phases import Phase
from placeflow.plan import Plan
from placeflow.workload import Algorithm, Role, Workload

CONTROLLER_STATE = "controller.json"  # in each checkpoint directory
# Value-head init of a random-init reward or cost model: N(0, 0.02) like its other weights,
# so that its scores vary (about 0.02 * sqrt(hidden) after the final norm).
SCORER_HEAD_STD = 0.02


def derived_seed(*parts: int | str) -> int:
    """A 63-bit seed from the run seed and a position (step, replica): stable across runs."""
    digest = hashlib.sha256("/".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def encode_prompts(
    tok: Tokenizer, examples: Sequence[Example], chat_template: bool, prompt_len: int
) -> list[list[int]]:
    """Each example's prompt as `tok` encodes it (rendered with the chat template where
    the data asks), cut to its last `prompt_len` tokens."""
    return [tok.encode(prompt_text(ex, tok, chat_template))[-prompt_len:] for ex in examples]


def padded_prompt_len(plan: Plan) -> int:
    """The prompt length a run of `plan` pads its steps' prompts to at most: the longest
    prompt of its training data as the actor's tokenizer encodes it, cut at the workload's
    `prompt_len`. A step's batch is padded to its longest prompt, so a dataset of short
    prompts runs shorter sequences than `prompt_len` (the shipped arithmetic data: 4 to 6
    tokens, most of them 6, under the examples' prompt_len of 16)."""
    w = plan.workload
    data = data_of(w)
    tok = tokenizer_for(plan)
    prompts = encode_prompts(
        tok, load_examples(data.train, data), data.chat_template, w.batch.prompt_len
    )
    return max(len(p) for p in prompts)


def as_run(plan: Plan) -> Plan:
    """`plan` with the prompt length its run pads to (`padded_prompt_len`): the workload the
    simulator should price to compare with a run of `plan`, which prices every prompt at
    `prompt_len` tokens."""
    n = padded_prompt_len(plan)
    w = plan.workload
    if n == w.batch.prompt_len:
        return plan
    batch = dataclasses.replace(w.batch, prompt_len=n)
    return dataclasses.replace(plan, workload=dataclasses.replace(w, batch=batch))


def tokenizer_for(plan: Plan) -> Tokenizer:
    spec = plan.workload.models[Role.ACTOR]
    if _checkpoint(spec.name) is not None:
        return HFTokenizer(spec.name)
    if spec.vocab_size != ByteTokenizer.vocab_size:
        raise SpecError(
            f"model {spec.name!r} has a vocabulary of {spec.vocab_size}; random-init runs use the "
            f"built-in byte tokenizer (vocabulary {ByteTokenizer.vocab_size}). Use a tiny-* "
            "catalogue model or a local checkpoint directory as the model"
        )
    return ByteTokenizer()


def _checkpoint(name: str) -> str | None:
    p = Path(name)
    return name if (p.is_dir() or p.suffix == ".gguf") and p.exists() else None


@dataclass
class StepRecord:
    step: int
    metrics: dict[str, float] = field(default_factory=dict)
    phases: dict[str, float] = field(default_factory=dict)  # Phase value -> seconds
    samples: list[dict[str, Any]] = field(default_factory=list)  # a few decoded examples
    timeline: list[dict[str, Any]] = field(default_factory=list)  # executor/timeline.py


class RLLoop:
    """GRPO, ReMax, PPO or Safe-RLHF on `controller`'s workers; `build()` once, then `step(k)`."""

    def __init__(
        self,
        controller: Controller,
        *,
        seed: int,
        tokenizer: Tokenizer,
        tp_impl: TPImpl = TPImpl.NATIVE,
        overlap: bool = True,
    ) -> None:
        self.c = controller
        # False: every call completes before the next is launched (no overlap between sets;
        # the same results, for comparison and debugging).
        self.overlap = overlap
        self.plan = controller.plan
        self.w = self.plan.workload
        check_executable(self.plan)
        # Asynchrony needs a generator set apart (on shared devices the two phases could
        # not overlap). One-step-off: step k+1's rollout runs while step k trains, and
        # the update's weights follow it with a blocking sync. k-step-off (staleness
        # k >= 2): rollouts k+1..k+k are in flight on the generator, and the trainer
        # posts its weights without waiting (`_step_k_off`).
        apart = self.plan.generator_set() is not None
        self.staleness = self.w.max_staleness if apart else 0
        self.one_step_off = self.staleness == 1
        self.prefetched: tuple[int, Batch, Batch | None] | None = None
        self.in_flight: dict[int, _Rollout] = {}  # k-step-off: rollouts launched, by step
        self.receives: list[Launched] = []  # k-step-off: weight receives not yet collected
        self.version = 0  # k-step-off: updates in the weights last sent to the generator
        # The run's step count, when known (`executor.run` sets it): no rollout is
        # launched for a step past it.
        self.steps: int | None = None
        self.seed = seed
        self.tok = tokenizer
        self.tp_impl = tp_impl
        self.reward_fn = (
            load_reward_function(self.w.reward_function) if self.w.reward_function else None
        )
        # [data], or the shipped dataset of a built-in checker (executor/data.py).
        self.data = data = data_of(self.w)
        self.schedule = PromptSchedule(
            load_examples(data.train, data),
            self.w.batch.prompts_per_step,
            seed=derived_seed(self.seed, "data") % 2**31,
            shuffle=data.shuffle,
        )
        self.validation: list[Example] = (
            load_examples(data.validation, data)[: data.validation_size]
            if data.validation is not None
            else []
        )
        self.multiplier = self.w.rl.lambda_init  # Safe-RLHF's Lagrange multiplier (a state)
        rl_cfg = self.w.rl
        self.sampling = SamplingParams(
            temperature=rl_cfg.temperature,
            top_p=rl_cfg.top_p,
            max_tokens=self.w.batch.response_len,
            stop_ids=(self.tok.eos_id,),
            ignore_stop=rl_cfg.ignore_stop,
        )
        self.update_cfg = UpdateConfig(
            ppo_epochs=self.w.batch.ppo_epochs,
            mini_batches=self.w.batch.mini_batches,
            clip_ratio=rl_cfg.clip_ratio,
            value_clip=rl_cfg.value_clip,
            kl_coef=rl_cfg.kl_coef,
            entropy_coef=rl_cfg.entropy_coef,
            temperature=rl_cfg.temperature,
        )

    # --- set-up ------------------------------------------------------------
    def setup_of(self, role: Role) -> EngineSetup:
        spec = self.w.models[role]
        rl_cfg, par = self.w.rl, self.plan.parallelism[role]
        critic = role.has_value_head
        safe = self.w.algorithm is Algorithm.SAFE_RLHF
        optim = None
        if role.trained:
            optim = OptimConfig(
                lr=rl_cfg.lr if role is Role.ACTOR else rl_cfg.critic_lr,
                weight_decay=rl_cfg.weight_decay,
                grad_clip=rl_cfg.grad_clip,
            )
        # The reference and the critic start from the policy; a reward or cost model from
        # its own seed, with a random value head so that its scores vary.
        scorer = role in (Role.REWARD, Role.COST)
        seed = derived_seed(self.seed, str(role)) if scorer else self.seed
        return EngineSetup(
            arch=Arch.of(spec),
            weights=WeightSource(
                seed=seed,
                checkpoint=_checkpoint(spec.name),
                value_head_std=SCORER_HEAD_STD if scorer else 0.0,
            ),
            critic=critic,
            num_values=2 if role is Role.CRITIC and safe else 1,
            optim=optim,
            zero=par.zero,
            offload=OffloadMode.of(par.offload_optimizer, par.host_optimizer_step),
            offload_params=par.offload_params,
            micro_batch=par.micro_batch,
            forward_micro_batch=par.forward_micro_batch,
            micro_batch_tokens=par.micro_batch_tokens,
            forward_micro_batch_tokens=par.forward_micro_batch_tokens,
            pad_id=self.tok.pad_id,
            tp_impl=self.tp_impl,
        )

    def build(self) -> None:
        for group in self.c.groups:
            setup = self.setup_of(group.role)
            refs = [w.build_engine.remote(group.role, setup) for w in group.workers]
            self.c.gather(group, refs, Worker.build_engine)

    # --- one step ----------------------------------------------------------
    def examples(self, step: int) -> list[Example]:
        """Step `step`'s prompts and ground truths."""
        return self.schedule.rows(step)

    def encode(self, examples: Sequence[Example]) -> list[list[int]]:
        """Prompt token ids, cut to the workload's prompt length (from the left)."""
        return encode_prompts(self.tok, examples, self.data.chat_template, self.w.batch.prompt_len)

    def step(self, step: int) -> StepRecord:
        if self.staleness >= 2:
            return self._step_k_off(step)
        rec, clock = StepRecord(step=step), StepClock(serial=not self.overlap)
        baseline: Batch | _Baseline | None
        if self.one_step_off and self.prefetched is not None and self.prefetched[0] == step:
            _, batch, baseline = self.prefetched  # generated during the last step
            rec.metrics[Metric.STALENESS] = 1.0  # by the policy before the last update
        else:  # synchronous, or the first step of a one-step-off run
            rollout = self._sync_rollout(rec, clock)
            sampled, *greedy = self._launch_rollout(rollout, step, clock)
            (batch, _), _ = self._collect_rollout(rollout, [sampled], clock)
            # ReMax: the forward calls on other sets need only the sampled batch; the
            # greedy baseline is taken once they are launched (`_forwards`).
            baseline = _Baseline(rollout, greedy[0]) if greedy else None
            rec.metrics[Metric.STALENESS] = 0.0
        if self.one_step_off:  # the next step's rollout, while this one trains
            generator = self.c.group(Role.ACTOR, generator=True)
            next_rollout = self._launch_rollout(generator, step + 1, clock)
            # Stamped as it ends while this step's calls are collected: it is collected
            # only after the update, and its end is not that moment.
            clock.watch.extend(call for call, _ in next_rollout)
        batch = self._train(step, batch, baseline, rec, clock)
        if self.one_step_off:
            # The update's weights to the generator: its receive queues behind the next
            # rollout, which is collected here, ready for the next step.
            self.prefetched = (step + 1, *self._sync_and_collect(next_rollout, rec, clock))

        return self._finish(rec, clock, batch)

    def _step_k_off(self, step: int) -> StepRecord:
        """A k-step-off step (staleness k >= 2, a generator set apart).

        The generator's worker runs its calls in launch order, so a rollout gets the
        weights of the last receive launched before it: rollout j, launched in step
        j−k after the weights of update j−k−1 were posted, is k updates old when step
        j trains on it. The trainer posts its weights after each update and goes on
        (`Worker.post_weights`, at most k−1 snapshots in flight); the generator
        receives them between rollouts. The first step (and the first after a
        resume) generates on-policy.
        """
        rec, clock = StepRecord(step=step), StepClock(serial=not self.overlap)
        generator = self.c.group(Role.ACTOR, generator=True)
        # Calls in flight for later steps: stamped in this step's timeline as they end.
        clock.watch = [call for r in self.in_flight.values() for call, _ in r.calls]
        clock.watch += [call for r in self.in_flight.values() for call in r.receives]
        clock.watch += self.receives
        if step in self.in_flight:
            ahead = self.in_flight.pop(step)
            (batch, baseline), received = self._collect_rollout(
                generator, ahead.calls, clock, also=ahead.receives
            )
            for got in received:
                rec.metrics[Metric.WEIGHT_SYNC_BYTES_MAX] = float(max(m[0] for m in got))
                rec.metrics[Metric.WEIGHT_SYNC_PEAK_BYTES_MAX] = float(max(m[1] for m in got))
            rec.metrics[Metric.STALENESS] = float(step - ahead.version)
        else:  # the first step: the current weights, then an on-policy rollout
            rollout = self._sync_rollout(rec, clock)
            (batch, baseline), _ = self._collect_rollout(
                rollout, self._launch_rollout(rollout, step, clock), clock
            )
            self.version = step
            rec.metrics[Metric.STALENESS] = 0.0
        last = step + self.staleness
        if self.steps is not None:
            last = min(last, self.steps - 1)
        for ahead_step in range(step + 1, last + 1):
            if ahead_step not in self.in_flight:
                calls = self._launch_rollout(generator, ahead_step, clock)
                self.in_flight[ahead_step] = _Rollout(
                    calls=calls, version=self.version, receives=self.receives
                )
                self.receives = []
                clock.watch.extend(call for call, _ in calls)
        batch = self._train(step, batch, baseline, rec, clock)
        if self.steps is None or step + 1 + self.staleness < self.steps:
            self._post_weights(rec, clock)  # (else no rollout is left to use them)
        return self._finish(rec, clock, batch)

    def _train(
        self,
        step: int,
        batch: Batch,
        baseline: Batch | _Baseline | None,
        rec: StepRecord,
        clock: StepClock,
    ) -> Batch:
        """The step's forward calls, advantages and updates on `batch`; the batch as
        trained on. An asynchronous batch's ratio is against its rollout's policy."""
        partitions: dict[int, Partition] = {}
        batch = self._forwards(batch, baseline, self.examples(step), partitions, rec, clock)
        if self.staleness:
            batch = self._behaviour_policy(batch, rec)
        with clock.span(Phase.ADVANTAGE):
            batch = self._advantages(batch, rec)
        updates = [
            self._launch(role, phase, batch, partitions, clock)
            for role, phase in _UPDATES
            if role in self.w.models
        ]
        for metrics in self._collect(updates, clock):
            rec.metrics |= over_ranks(metrics)
        return batch

    def drain(self) -> None:
        """k-step-off: wait for what is still in flight (rollouts past the last step run,
        weight receives, posted snapshots), so that no worker is left mid-call."""
        if self.staleness < 2:
            return
        clock = StepClock()
        pending = [call for r in self.in_flight.values() for call, _ in r.calls]
        pending += [call for r in self.in_flight.values() for call in r.receives]
        clock.collect(self.c, pending + self.receives)
        self.in_flight, self.receives = {}, []
        actor = self.c.group(Role.ACTOR)
        refs = [w.drain_posted_weights.remote() for w in actor.workers]
        self.c.gather(actor, refs, Worker.drain_posted_weights)

    def _post_weights(self, rec: StepRecord, clock: StepClock) -> None:
        """k-step-off: the trainer posts this update's weights and returns; the generator's
        receive queues behind its rollouts in flight and is collected with the next
        rollout launched (which is the first to use them)."""
        actor = self.c.group(Role.ACTOR)
        generator = self.c.group(Role.ACTOR, generator=True)
        keep = self.staleness - 1
        posts = [w.post_weights.remote(keep) for w in actor.workers]
        receives = [w.receive_weights.remote() for w in generator.workers]
        sent_call = clock.launch(Phase.WEIGHT_SYNC, actor, posts, Worker.post_weights)
        received = clock.launch(Phase.WEIGHT_SYNC, generator, receives, Worker.receive_weights)
        self.receives.append(received)
        clock.watch.append(received)
        [sent] = clock.collect(self.c, [sent_call])
        rec.metrics[Metric.WEIGHT_SYNC_BYTES_SENT_MAX] = float(max(m[0] for m in sent))
        rec.metrics[Metric.WEIGHT_SNAPSHOT_BYTES_MAX] = float(max(m[1] for m in sent))
        self.version += 1

    def _finish(self, rec: StepRecord, clock: StepClock, batch: Batch) -> StepRecord:
        """The step's timeline and throughput metrics."""
        wall = clock.now()
        rec.phases, rec.timeline = clock.phase_seconds(), [r.as_json() for r in clock.records]
        mask = batch.tensors[Field.RESPONSE_MASK]
        tokens = int(batch.tensors[Field.PROMPT_MASK].sum() + mask.sum())
        rec.metrics |= {
            Metric.STEP_TIME_S: wall,
            Metric.TOKENS_PER_S: tokens / wall,
            Metric.RESPONSE_LEN_MEAN: float(mask.sum(1).float().mean()),
        }
        rec.metrics[Metric.EPOCH] = float(self.schedule.epoch_of(rec.step))
        if Field.OLD_LOGPROBS in batch.tensors and not self.staleness:
            # (else the update measured it on its own forward, or the policy lag did)
            diff = (batch.tensors[Field.ROLLOUT_LOGPROBS] - batch.tensors[Field.OLD_LOGPROBS]).abs()
            rec.metrics[Metric.LOGPROB_DIFF_MAX] = float((diff * mask).max())
        return rec

    # --- launching and collecting calls ---------------------------------------
    def _launch(
        self,
        role: Role,
        phase: Phase,
        batch: Batch,
        partitions: dict[int, Partition],
        clock: StepClock,
    ) -> _Pending:
        """Send `phase`'s call of `role` to its group, one DP shard per replica of the
        fields the call reads (`call_inputs`)."""
        group = self.c.group(role)
        part = self._partition(role, batch, partitions)
        inputs = batch.only(call_inputs(self.w, phase, off_policy=bool(self.staleness)))
        shards = split_by_dp(inputs, group.dispatch, part)
        pairs = list(zip(group.workers, shards, strict=True))
        method: WorkerMethod
        if phase in (Phase.REF_LOGPROB, Phase.OLD_LOGPROB):
            t = self.sampling.temperature
            refs, method = [w.logprobs.remote(role, s, t) for w, s in pairs], Worker.logprobs
        elif phase in (Phase.VALUES, Phase.COST_VALUES):
            refs, method = [w.values.remote(role, s) for w, s in pairs], Worker.values
        elif phase in (Phase.REWARD, Phase.COST):
            refs, method = [w.scores.remote(role, s) for w, s in pairs], Worker.scores
        else:
            refs = [w.update.remote(role, s, self.update_cfg) for w, s in pairs]
            method = Worker.update
        return _Pending(call=clock.launch(phase, group, refs, method), part=part)

    def _collect(self, pending: Sequence[_Pending], clock: StepClock) -> list[Any]:
        """Results of launched calls, waited for together (or one by one without overlap):
        a Batch per forward call, the result holders' metrics per update."""
        results = clock.collect(self.c, [p.call for p in pending])
        return [
            [res[r] for r in p.call.group.dispatch.result_ranks]
            if p.call.phase in _UPDATE_PHASES
            else collect(p.call.group.dispatch, res, p.part)
            for p, res in zip(pending, results, strict=True)
        ]

    # --- phases --------------------------------------------------------------
    def _forwards(
        self,
        batch: Batch,
        baseline: Batch | _Baseline | None,
        examples: list[Example],
        partitions: dict[int, Partition],
        rec: StepRecord,
        clock: StepClock,
    ) -> Batch:
        """Every forward call of the dataflow, launched at once (calls on disjoint sets run
        in parallel, calls on one set in dataflow order); rule-based rewards are computed
        here meanwhile. Their outputs join the batch."""
        spp = self.w.batch.samples_per_prompt
        launched: list[tuple[Phase, _Pending]] = []
        for call, _ in dataflow_calls(self.w):
            if call.kind != CallKind.FORWARD or call.role is None:
                continue
            # A reward or cost model splits by its own work model; the rest share one split.
            cache = {} if call.role in (Role.REWARD, Role.COST) else partitions
            launched.append((call.phase, self._launch(call.role, call.phase, batch, cache, clock)))
        if isinstance(baseline, _Baseline):
            # The rollout set generates the baseline while the calls above run elsewhere;
            # their ends are stamped as they come while this waits.
            clock.watch.extend(p.call for _, p in launched)
            (baseline, _), _ = self._collect_rollout(baseline.rollout, [baseline.call], clock)
        if baseline is not None and Role.REWARD in self.w.models:
            # ReMax: the reward model also scores the greedy baseline (its own split).
            baseline_call = self._launch(Role.REWARD, Phase.REWARD, baseline, {}, clock)
            launched.append((Phase.REWARD, baseline_call))
        if self.reward_fn is not None:  # rule-based: here or in Ray tasks, while they run
            with clock.span(Phase.REWARD):
                scores = self._rule_scores(batch, examples, spp, rec)
                batch = _with(batch, {Field.SCORES: scores})
                if baseline is not None:
                    base = self._rule_scores(baseline, examples, 1, None)
                    batch = _with(batch, {Field.BASELINE_SCORES: base.repeat_interleave(spp)})
        outputs = self._collect([p for _, p in launched], clock)
        seen_reward = False
        for (phase, _), out in zip(launched, outputs, strict=True):
            key, value = _FORWARD_OUTPUTS[phase]
            tensor = out.tensors[value]
            if phase is Phase.REWARD and seen_reward:  # ReMax's greedy baseline, per prompt
                batch = _with(batch, {Field.BASELINE_SCORES: tensor.float().repeat_interleave(spp)})
                continue
            seen_reward |= phase is Phase.REWARD
            if self.w.algorithm is Algorithm.SAFE_RLHF and value is Field.VALUES:
                tensor = tensor[..., 0 if phase is Phase.VALUES else 1]  # the call's own head
            batch = _with(batch, {key: tensor.float() if value is Field.SCORES else tensor})
        return self._score_metrics(batch, rec)

    def _behaviour_policy(self, batch: Batch, rec: StepRecord) -> Batch:
        """One-step-off: the importance ratio of the update is taken against the policy
        that generated the batch (its rollout logprobs), one update behind the trainer.
        A recomputed old-policy logprob (PPO) is kept as a measure of that lag."""
        t = batch.tensors
        if Field.OLD_LOGPROBS in t:
            lag = (t[Field.OLD_LOGPROBS] - t[Field.ROLLOUT_LOGPROBS]).abs() * t[Field.RESPONSE_MASK]
            rec.metrics[Metric.POLICY_LAG_LOGPROB_DIFF_MAX] = float(lag.max())
        return _with(batch, {Field.OLD_LOGPROBS: t[Field.ROLLOUT_LOGPROBS]})

    def _score_metrics(self, batch: Batch, rec: StepRecord) -> Batch:
        t = batch.tensors
        rec.metrics[Metric.REWARD_MEAN] = float(t[Field.SCORES].mean())
        rec.metrics[Metric.REWARD_STD] = float(t[Field.SCORES].std()) if len(batch) > 1 else 0.0
        if Field.BASELINE_SCORES in t:
            rec.metrics[Metric.BASELINE_REWARD_MEAN] = float(t[Field.BASELINE_SCORES].mean())
        if Field.COSTS in t:
            rec.metrics[Metric.COST_MEAN] = float(t[Field.COSTS].mean())
        return batch

    def _sync_rollout(self, rec: StepRecord, clock: StepClock) -> WorkerGroup:
        """The actor's current weights into its rollout engine; the group that generates.

        Colocated: HybridFlow's reshard on the actor's own workers. With a generator
        set: the trainer ranks send and the generator ranks receive, at the same time.
        """
        actor = self.c.group(Role.ACTOR)
        if self.plan.generator_set() is None:
            refs = [w.sync_rollout.remote() for w in actor.workers]
            reshard = clock.launch(Phase.RESHARD, actor, refs, Worker.sync_rollout)
            [moved] = clock.collect(self.c, [reshard])
            rec.metrics[Metric.RESHARD_BYTES_MAX] = float(max(m[0] for m in moved))
            rec.metrics[Metric.RESHARD_PEAK_BYTES_MAX] = float(max(m[1] for m in moved))
            return actor
        sent, received = clock.collect(self.c, self._launch_weight_sync(clock))
        _sync_metrics(rec, sent, received)
        return self.c.group(Role.ACTOR, generator=True)

    def _launch_weight_sync(self, clock: StepClock) -> list[Launched]:
        """The trainer ranks send, the generator ranks receive: launched together."""
        actor = self.c.group(Role.ACTOR)
        generator = self.c.group(Role.ACTOR, generator=True)
        sends = [w.send_weights.remote() for w in actor.workers]
        receives = [w.receive_weights.remote() for w in generator.workers]
        return [
            clock.launch(Phase.WEIGHT_SYNC, actor, sends, Worker.send_weights),
            clock.launch(Phase.WEIGHT_SYNC, generator, receives, Worker.receive_weights),
        ]

    def _launch_rollout(
        self, rollout: WorkerGroup, step: int, clock: StepClock
    ) -> list[tuple[Launched, Partition]]:
        """Step `step`'s rollout on `rollout`, and ReMax's greedy baseline (one per prompt)
        queued behind it."""
        b = self.w.batch
        prompts = [p for p in self.encode(self.examples(step)) for _ in range(b.samples_per_prompt)]
        calls = [
            self._launch_generate(rollout, prompts, step, self.sampling, Phase.GENERATE, clock)
        ]
        if self.w.algorithm is Algorithm.REMAX:
            greedy = dataclasses.replace(self.sampling, temperature=0.0)
            firsts = prompts[:: b.samples_per_prompt]
            phase = Phase.GENERATE_BASELINE
            calls.append(self._launch_generate(rollout, firsts, step, greedy, phase, clock))
        return calls

    def _collect_rollout(
        self,
        rollout: WorkerGroup,
        calls: list[tuple[Launched, Partition]],
        clock: StepClock,
        also: Sequence[Launched] = (),
    ) -> tuple[tuple[Batch, Batch | None], list[Any]]:
        """The sampled batch and the baseline batch (ReMax) of launched rollout calls,
        and the results of `also`, collected with them."""
        results = clock.collect(self.c, [call for call, _ in calls] + list(also))
        batches = [
            collect(rollout.gen_dispatch, align(res, self.tok.pad_id), part)
            for (_, part), res in zip(calls, results, strict=False)
        ]
        return (batches[0], batches[1] if len(batches) > 1 else None), results[len(calls) :]

    def _sync_and_collect(
        self, rollout: list[tuple[Launched, Partition]], rec: StepRecord, clock: StepClock
    ) -> tuple[Batch, Batch | None]:
        """One-step-off: this step's weights to the generator, launched behind the next
        step's rollout on it, and that rollout's batches."""
        generator = self.c.group(Role.ACTOR, generator=True)
        batches, (sent, received) = self._collect_rollout(
            generator, rollout, clock, also=self._launch_weight_sync(clock)
        )
        _sync_metrics(rec, sent, received)
        return batches

    def _launch_generate(
        self,
        rollout: WorkerGroup,
        prompts: list[list[int]],
        step: int,
        params: SamplingParams,
        phase: Phase,
        clock: StepClock,
    ) -> tuple[Launched, Partition]:
        layout = rollout.gen_dispatch
        part = balanced_partition(
            [float(len(p)) for p in prompts], layout.num_dp, equal_counts=True
        )
        per_replica = [[prompts[i] for i in ix] for ix in part.indices]
        refs = [
            w.generate.remote(
                per_replica[layout.dp_rank[r]],
                params,
                derived_seed(self.seed, step, "replica", layout.dp_rank[r]),
            )
            for r, w in enumerate(rollout.workers)
        ]
        return clock.launch(phase, rollout, refs, Worker.generate), part

    def responses(self, batch: Batch) -> list[str]:
        """The responses as text, decoded without special tokens (as verl hands them to
        reward functions)."""
        return decode_responses(self.tok, batch)

    def score(self, texts: Sequence[str], examples: Sequence[Example], spp: int) -> Scores:
        """The reward function on `texts` (`spp` responses per example, in order): on the
        driver, or in the workload's Ray tasks."""
        items = [
            RewardInput(
                data_source=ex.data_source,
                solution_str=text,
                ground_truth=ex.answer,
                extra_info=ex.extra_info,
            )
            for text, ex in zip(texts, (e for e in examples for _ in range(spp)), strict=True)
        ]
        assert self.reward_fn is not None and self.w.reward_function is not None
        if self.w.reward_workers:
            refs = launch_scoring(self.w.reward_function, items, self.w.reward_workers)
            return collect_scoring(refs, self.c.timeout_s)
        return score_items(self.reward_fn, items)

    def _rule_scores(
        self, batch: Batch, examples: list[Example], spp: int, rec: StepRecord | None
    ) -> torch.Tensor:
        """The reward function on `batch`; with `rec`, the exact-answer rate (score 1),
        the failures, the dict entries and a few decoded samples go into it."""
        texts = self.responses(batch)
        scores = self.score(texts, examples, spp)
        if rec is not None:
            log_errors(scores, f"step {rec.step}")
            rec.metrics[Metric.EXACT_MATCH] = sum(v >= 1.0 for v in scores.values) / len(batch)
            rec.metrics[Metric.REWARD_ERRORS] = float(scores.num_errors)
            for key, values in scores.extras.items():
                rec.metrics[reward_extra(key)] = sum(values) / len(values)
            rec.samples.extend(
                {"prompt": examples[i // spp].prompt, "response": texts[i], "reward": v}
                for i, v in list(enumerate(scores.values))[::spp][:4]
            )
        return torch.tensor(scores.values)

    def evaluate(self, step: int) -> dict[str, Any]:
        """The validation split, one greedy response per prompt from the current policy,
        scored by the reward function; no training. `step`: the updates done so far."""
        rec, clock = StepRecord(step=step), StepClock(serial=not self.overlap)
        rollout = self._sync_rollout(rec, clock)
        if self.staleness >= 2:  # rollouts launched from now on have these weights
            self.version = step
        greedy = dataclasses.replace(self.sampling, temperature=0.0)
        call, part = self._launch_generate(
            rollout, self.encode(self.validation), -1, greedy, Phase.GENERATE, clock
        )
        [results] = clock.collect(self.c, [call])
        batch = collect(rollout.gen_dispatch, align(results, self.tok.pad_id), part)
        texts = self.responses(batch)
        scores = self.score(texts, self.validation, 1)
        log_errors(scores, f"validation at step {step}")
        n = len(scores.values)
        return {
            RecordKey.STEP: step,
            Metric.VAL_REWARD_MEAN: sum(scores.values) / n,
            Metric.VAL_EXACT_MATCH: sum(v >= 1.0 for v in scores.values) / n,
            Metric.VAL_REWARD_ERRORS: scores.num_errors,
            Metric.VAL_NUM_PROMPTS: n,
            Metric.VAL_GENERATE_S: clock.phase_seconds().get(Phase.GENERATE.value, 0.0),
            RecordKey.SAMPLES: [
                {"prompt": ex.prompt, "response": text, "reward": v}
                for ex, text, v in list(zip(self.validation, texts, scores.values, strict=True))[:4]
            ],
        }

    def _partition(self, role: Role, batch: Batch, cache: dict[int, Partition]) -> Partition:
        """The token-aware split over `role`'s DP replicas (one per DP size)."""
        d = self.plan.parallelism[role].train.d
        if d not in cache:
            lens = (
                batch.tensors[Field.PROMPT_MASK].sum(1) + batch.tensors[Field.RESPONSE_MASK].sum(1)
            ).tolist()
            works = WorkModel.for_model(self.w.models[role]).works([int(x) for x in lens])
            cache[d] = balanced_partition(works, d, equal_counts=True)
        return cache[d]

    def _advantages(self, batch: Batch, rec: StepRecord) -> Batch:
        out, metrics, self.multiplier = step_advantages(self.w, batch, self.multiplier)
        rec.metrics |= metrics
        return out

    # --- checkpoints -----------------------------------------------------------
    def save(self, directory: str) -> None:
        # The controller's own state (Safe-RLHF's multiplier) beside the workers' files.
        state = {"lagrange_multiplier": self.multiplier}
        (Path(directory) / CONTROLLER_STATE).write_text(json.dumps(state) + "\n")
        for group in self._trained():
            refs = [
                w.save_state.remote(group.role, f"{directory}/{group.role}-rank{r}.pt")
                for r, w in enumerate(group.workers)
            ]
            self.c.gather(group, refs, Worker.save_state)

    def load(self, directory: str) -> None:
        state = json.loads((Path(directory) / CONTROLLER_STATE).read_text())
        self.multiplier = float(state["lagrange_multiplier"])
        for group in self._trained():
            refs = [
                w.load_state.remote(group.role, f"{directory}/{group.role}-rank{r}.pt")
                for r, w in enumerate(group.workers)
            ]
            self.c.gather(group, refs, Worker.load_state)

    def _trained(self) -> list[WorkerGroup]:
        return [g for g in self.c.groups if g.role.trained and not g.spec.generator]


@dataclass(frozen=True, kw_only=True)
class _Rollout:
    """A k-step-off rollout in flight: its calls, the updates in the weights it
    generates with, and the weight receives queued on the generator before it."""

    calls: list[tuple[Launched, Partition]]
    version: int
    receives: list[Launched]


@dataclass(frozen=True)
class _Baseline:
    """ReMax's greedy baseline rollout, launched on `rollout` and not yet collected."""

    rollout: WorkerGroup
    call: tuple[Launched, Partition]


@dataclass(frozen=True, kw_only=True)
class _Pending:
    """A launched call and the DP partition its shards came from (to collect in order)."""

    call: Launched
    part: Partition


# The trained roles' update calls, launched together at the end of a step.
_UPDATES = ((Role.ACTOR, Phase.ACTOR_UPDATE), (Role.CRITIC, Phase.CRITIC_UPDATE))
_UPDATE_PHASES = frozenset(phase for _, phase in _UPDATES)

# Where a forward call's output goes: (key in the step's Batch, key in the call's result).
_FORWARD_OUTPUTS: dict[Phase, tuple[Field, Field]] = {
    Phase.REF_LOGPROB: (Field.REF_LOGPROBS, Field.LOGPROBS),
    Phase.OLD_LOGPROB: (Field.OLD_LOGPROBS, Field.LOGPROBS),
    Phase.VALUES: (Field.VALUES, Field.VALUES),
    Phase.COST_VALUES: (Field.COST_VALUES, Field.VALUES),
    Phase.REWARD: (Field.SCORES, Field.SCORES),
    Phase.COST: (Field.COSTS, Field.SCORES),
}


def _sync_metrics(rec: StepRecord, sent: list[Any], received: list[Any]) -> None:
    """A weight sync's bytes: sent per trainer rank, received and peak per generator rank."""
    rec.metrics[Metric.WEIGHT_SYNC_BYTES_SENT_MAX] = float(max(m[0] for m in sent))
    rec.metrics[Metric.WEIGHT_SYNC_BYTES_MAX] = float(max(m[0] for m in received))
    rec.metrics[Metric.WEIGHT_SYNC_PEAK_BYTES_MAX] = float(max(m[1] for m in received))


def decode_responses(tok: Tokenizer, batch: Batch) -> list[str]:
    """`batch`'s responses as text, each cut at its mask's length and decoded by `tok`
    without special tokens (as verl hands them to reward functions)."""
    t = batch.tensors
    return [
        tok.decode(t[Field.RESPONSE][i, : int(t[Field.RESPONSE_MASK][i].sum())].tolist())
        for i in range(len(batch))
    ]


def step_advantages(
    w: Workload, batch: Batch, multiplier: float
) -> tuple[Batch, dict[str, float], float]:
    """The controller's advantage work on a step's scored `batch`: (the batch with its
    advantages and returns, the step's metrics of it, Safe-RLHF's multiplier after its
    dual step; `multiplier` unchanged otherwise). Also what the profiler times as the
    controller's advantage entries (`profiles.controller_work`)."""
    t, rl_cfg = batch.tensors, w.rl
    metrics: dict[str, float] = {}
    mask = t[Field.RESPONSE_MASK]
    ref = t.get(Field.REF_LOGPROBS)
    # Without a re-scoring phase the rollout's logprobs stand for the old policy's.
    old = t[Field.OLD_LOGPROBS] if Field.OLD_LOGPROBS in t else t[Field.ROLLOUT_LOGPROBS]
    if ref is not None:
        d = ref - old
        metrics[Metric.KL_REF] = float(rl.masked_mean(d.exp() - d - 1, mask))
    if w.algorithm is Algorithm.GRPO:
        adv = rl.group_advantages(t[Field.SCORES], w.batch.samples_per_prompt)
        out = _with(batch, {Field.ADVANTAGES: adv})
    elif w.algorithm is Algorithm.REMAX:
        out = _with(
            batch,
            {Field.ADVANTAGES: rl.remax_advantages(t[Field.SCORES], t[Field.BASELINE_SCORES])},
        )
    else:
        rewards = rl.token_rewards(t[Field.SCORES], old, ref, mask, rl_cfg.kl_coef)
        adv, returns = rl.gae(rewards, t[Field.VALUES], mask, rl_cfg.gamma, rl_cfg.lam)
        out = _with(batch, {Field.ADVANTAGES: adv, Field.RETURNS: returns})
        if w.algorithm is Algorithm.SAFE_RLHF:
            out, multiplier = _cost_advantages(w, out, adv, multiplier)
            metrics[Metric.LAGRANGE_MULTIPLIER] = multiplier
    if w.kl_in_loss:
        assert ref is not None, "a workload with a KL loss has a reference model"
        out = _with(out, {Field.REF_LOGPROBS_IN_LOSS: ref})
    return out, metrics, multiplier


def _cost_advantages(
    w: Workload, batch: Batch, reward_adv: torch.Tensor, multiplier: float
) -> tuple[Batch, float]:
    """Safe-RLHF: GAE of the costs over the cost values, the multiplier's dual step on
    this batch's mean cost, then the combined advantage with the updated multiplier."""
    t, rl_cfg = batch.tensors, w.rl
    mask = t[Field.RESPONSE_MASK]
    costs = rl.token_rewards(t[Field.COSTS], t[Field.ROLLOUT_LOGPROBS], None, mask, 0.0)
    cost_adv, cost_returns = rl.gae(costs, t[Field.COST_VALUES], mask, rl_cfg.gamma, rl_cfg.lam)
    multiplier = rl.lagrange_step(
        multiplier, float(t[Field.COSTS].mean()), rl_cfg.cost_limit, rl_cfg.lambda_lr
    )
    out = _with(
        batch,
        {
            Field.ADVANTAGES: rl.safe_advantages(reward_adv, cost_adv, multiplier),
            Field.COST_RETURNS: cost_returns,
        },
    )
    return out, multiplier


def _with(batch: Batch, tensors: Mapping[Field, torch.Tensor]) -> Batch:
    """`batch` with `tensors` added (or replaced), by name."""
    merged = dict(batch.tensors)
    for name, t in tensors.items():
        merged[name] = t
    return Batch(tensors=merged, meta=batch.meta)


def align(batches: Sequence[Batch], pad_id: int) -> list[Batch]:
    """Batches of one sequence layout: prompts left-padded, responses right-padded to the widest."""
    p = max(b.tensors[Field.PROMPT].shape[1] for b in batches)
    r = max(b.tensors[Field.RESPONSE].shape[1] for b in batches)
    out = []
    for b in batches:
        t = dict(b.tensors)
        dp = p - t[Field.PROMPT].shape[1]
        dr = r - t[Field.RESPONSE].shape[1]
        t[Field.PROMPT] = torch.nn.functional.pad(t[Field.PROMPT], (dp, 0), value=pad_id)
        t[Field.PROMPT_MASK] = torch.nn.functional.pad(t[Field.PROMPT_MASK], (dp, 0), value=False)
        for key in t:
            if key not in (Field.PROMPT, Field.PROMPT_MASK) and t[key].dim() == 2:
                fill: Any = pad_id if key == Field.RESPONSE else 0
                t[key] = torch.nn.functional.pad(t[key], (0, dr), value=fill)
        out.append(Batch(tensors=t, meta=b.meta))
    return out


__all__ = ["DispatchLayout", "RLLoop", "StepRecord", "align", "check_executable", "derived_seed"]
