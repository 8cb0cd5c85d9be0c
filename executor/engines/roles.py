"""Role engines: what a worker runs for the actor, critic, reference and reward roles.

Each engine holds one rank's shard of a `Transformer` and answers the calls of
the RL loop on a `Batch` of samples in the sequence layout below. The worker
builds them from an `EngineSetup` (plain data the controller sends) and its
role's process groups; nothing here knows about Ray.

A batch is in the sequence layout of `placeflow/fields.py` (left-padded
prompts, right-padded responses), whose names the engines read and write.

Calls that run the trainer's forward (FSDP all-gathers inside) must be made by
every DP rank with the same number of micro-batches: the controller gives every
DP replica the same number of samples (`RLLoop` checks the plan for it).

Pipeline parallelism: every stage of a DP replica receives the same Batch, runs
its layers in the schedules of `pipeline.py` (1F1B for updates, one forward
pass for logprobs, values and scores), and only the last stage, where outputs
appear, computes losses and returns results; the other stages return an empty
Batch (the controller reads the last stage's, `dispatch.DispatchLayout`) and
update metrics holding the grad norm only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from placeflow.errors import SpecError
from placeflow.executor import rl
from placeflow.executor.balance import token_micro_batches
from placeflow.executor.batch import Batch
from placeflow.executor.engines import pipeline
from placeflow.executor.engines.hf import load_checkpoint
from placeflow.executor.engines.moe import SINGLE_EP, EPGroup
from placeflow.executor.engines.offload import OffloadMode
from placeflow.executor.engines.pipeline import SINGLE_STAGE, PPGroup, StageIO
from placeflow.executor.engines.sampler import (
    Completion,
    Sampler,
    SamplingParams,
    left_pad,
    policy_logprobs,
)
from placeflow.executor.engines.tp import TPGroup, TPImpl
from placeflow.executor.engines.trainer import OptimConfig, TrainEngine
from placeflow.executor.engines.transformer import Arch, Transformer, random_full
from placeflow.executor.reshard import MemoryMeter, reshard_colocated
from placeflow.fields import PER_TOKEN, ROLLOUT, Field
from placeflow.layout import GenLayout
from placeflow.metrics import Metric, accumulate, averaged
from placeflow.plan import MicroBatching, micro_batching
from placeflow.reshard_plan import ReshardPlan


@dataclass(frozen=True, kw_only=True)
class WeightSource:
    """Initial weights: a seeded random model, or a local checkpoint (dir or .gguf)."""

    seed: int = 0
    checkpoint: str | None = None
    value_head_std: float = 0.0  # > 0: a random value head (a random-init reward/cost model)

    def full(self, arch: Arch, *, critic: bool, num_values: int = 1) -> dict[str, torch.Tensor]:
        if self.checkpoint is None:
            return random_full(
                arch, self.seed, critic=critic, num_values=num_values, head_std=self.value_head_std
            )
        _, weights = load_checkpoint(self.checkpoint)
        if critic:  # a critic starts from the policy's trunk with a zero head
            weights.pop("lm_head", None)
            weights["value_head"] = torch.zeros(num_values, arch.weights.hidden)
        return weights


@dataclass(frozen=True, kw_only=True)
class EngineSetup:
    arch: Arch
    weights: WeightSource
    critic: bool = False  # value head instead of lm_head (critic, reward model)
    num_values: int = 1  # outputs of the value head: 2 for Safe-RLHF's critic (value, cost)
    optim: OptimConfig | None = None  # None: frozen (reference, reward model)
    zero: int = 0
    offload: OffloadMode = OffloadMode.NONE  # where the Adam state lives between phases
    offload_params: bool = False  # weights in host memory between calls (ParamOffload)
    micro_batch: int = 8
    forward_micro_batch: int = 0  # forward-only calls' micro-batch; 0: micro_batch
    micro_batch_tokens: int = 0  # > 0: micro-batches of at most this many tokens, packed
    forward_micro_batch_tokens: int = 0  # ... of forward-only calls (plan.micro_batching)
    pad_id: int = 0
    tp_impl: TPImpl = TPImpl.NATIVE  # native or megatron-core TP layers (tp.py)

    def micro(self, *, forward: bool) -> MicroBatching:
        """How a training (or forward-only) call cuts this rank's samples: the plan's rule."""
        return micro_batching(self, forward=forward)


@dataclass(frozen=True, kw_only=True)
class UpdateConfig:
    """What an update needs besides the batch (from the workload's [batch] and [rl])."""

    ppo_epochs: int = 1
    mini_batches: int = 1
    clip_ratio: float = 0.2
    value_clip: float = 0.2
    kl_coef: float = 0.0
    entropy_coef: float = 0.0
    temperature: float = 1.0


@dataclass(frozen=True, kw_only=True)
class RoleGroups:
    """The process groups an engine uses (None where the axis has one rank)."""

    tp: TPGroup
    pp: PPGroup = SINGLE_STAGE
    dp_group: Any = None
    dp_size: int = 1
    gen_tp: TPGroup | None = None
    micro_dp: Any = None
    ep: EPGroup = SINGLE_EP  # routed experts split over it (a mixture of experts, e > 1)
    expert_dp: Any = None  # ranks holding the same experts (None: one rank, d = e)
    expert_gather: Any = None  # the reshard's expert all-gather (None: the micro-DP group)


def sequence(batch: Batch) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(ids, mask, prompt width) of prompts followed by responses."""
    t = batch.tensors
    ids = torch.cat([t[Field.PROMPT], t[Field.RESPONSE]], dim=1)
    mask = torch.cat([t[Field.PROMPT_MASK], t[Field.RESPONSE_MASK]], dim=1)
    return ids, mask, t[Field.PROMPT].shape[1]


def response_outputs(
    call: Callable[..., torch.Tensor], batch: Batch, *, hidden: torch.Tensor | None = None
) -> torch.Tensor:
    """The model's outputs where each response token is predicted: (B, R, ...).

    The head runs on those positions only (from the last prompt token on), not
    on the prompt: with a large vocabulary that is most of the head's cost.
    `hidden`: the previous pipeline stage's output, when this is a later stage.
    """
    ids, mask, width = sequence(batch)
    r = batch.tensors[Field.RESPONSE].shape[1]
    kwargs = {} if hidden is None else {"hidden": hidden}
    return call(ids, mask, head_from=width - 1, **kwargs)[:, :r]


def response_logp(
    logits: torch.Tensor, batch: Batch, temperature: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(logprobs of the response tokens (B, R), full log-distributions there (B, R, V)).

    `logits` are aligned with the response tokens (`response_outputs`).
    """
    logp = policy_logprobs(logits, temperature)
    return logp.gather(-1, batch.tensors[Field.RESPONSE][..., None]).squeeze(-1), logp


def completions_batch(
    prompts: list[list[int]], completions: list[Completion], pad_id: int
) -> Batch:
    """A Batch of prompts and their completions in the sequence layout."""
    p_ids, p_mask = left_pad(prompts, pad_id)
    width = max(1, max(len(c.token_ids) for c in completions))
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.bool)
    logp = torch.zeros((len(prompts), width))
    for i, c in enumerate(completions):
        n = len(c.token_ids)
        ids[i, :n] = torch.tensor(c.token_ids, dtype=torch.long)
        mask[i, :n] = True
        logp[i, :n] = torch.tensor(c.logprobs)
    return Batch(tensors=dict(zip(ROLLOUT, (p_ids, p_mask, ids, mask, logp), strict=True)))


@dataclass(frozen=True)
class _Micros:
    """One call's micro-batches: the real ones first, then padding ones (below)."""

    batches: list[Batch]
    real: int
    # Samples of the real micro-batches in turn, when packing reordered them (None: in
    # order, as contiguous chunks are).
    order: tuple[int, ...] | None = None

    def gather(self, outs: list[torch.Tensor], width: int) -> torch.Tensor:
        """The real micro-batches' outputs as one tensor in the call's sample order;
        per-token outputs of packed micro-batches padded back to `width` responses with
        zeros (no output is computed at a response padding position)."""
        outs = outs[: self.real]
        if self.order is None:
            return torch.cat(outs)
        full = [
            torch.nn.functional.pad(o, (0, 0) * (o.dim() - 2) + (0, width - o.shape[1]))
            if o.dim() >= 2
            else o
            for o in outs
        ]
        packed = torch.cat(full)
        out = torch.empty_like(packed)
        out[torch.as_tensor(self.order, device=packed.device)] = packed
        return out


def sample_tokens(batch: Batch) -> list[int]:
    """Real tokens of each sample: its prompt's and its response's."""
    t = batch.tensors
    n = t[Field.PROMPT_MASK].sum(1) + t[Field.RESPONSE_MASK].sum(1)
    return [int(x) for x in n.tolist()]


def _packed(batch: Batch) -> Batch:
    """`batch` without the padding its own samples do not need: the prompt columns no
    sample uses (prompts are left-padded) and the response columns after its longest
    response, in every per-token tensor (`fields.PER_TOKEN`). Positions come from the
    masks, so every sample's outputs are those it has in the wider batch."""
    t = dict(batch.tensors)
    used = t[Field.PROMPT_MASK].any(0).nonzero()
    start = int(used[0]) if len(used) else t[Field.PROMPT_MASK].shape[1]
    width = max(1, int(t[Field.RESPONSE_MASK].sum(1).max()))
    for key in (Field.PROMPT, Field.PROMPT_MASK):
        t[key] = t[key][:, start:]
    for key in PER_TOKEN & t.keys():
        if t[key].dim() >= 2:  # advantages are per sample, (B,), in GRPO and ReMax
            t[key] = t[key][:, :width]
    return Batch(tensors=t, meta=batch.meta, seq_keys=batch.seq_keys)


def _micro_batches(batch: Batch, micro: MicroBatching, count: int | None = None) -> _Micros:
    """`count` micro-batches (default: as many as `micro` needs) of `batch`.

    Counted in samples, they are contiguous chunks. Counted in tokens, the samples are
    packed into micro-batches of at most `micro.tokens` real tokens
    (`balance.token_micro_batches`), each cut to the padding it needs (`_packed`).
    With more micro-batches than samples (a DP rank with fewer samples than its
    peers, whose FSDP collectives need the same number of forwards and backwards
    everywhere), the last ones are padding: one sample with no response token,
    which adds nothing to a loss or to the gradients. Real ones come first.
    """
    order: tuple[int, ...] | None = None
    if micro.tokens:
        bins = token_micro_batches(sample_tokens(batch), micro.tokens, count or 0)
        real = [_packed(batch.select(b)) for b in bins]
        order = tuple(i for b in bins for i in b)
    else:
        count = count or max(1, -(-len(batch) // micro.samples))
        real = batch.chunk(min(count, len(batch)))
    count = max(count or 0, len(real))
    if count <= len(real):
        return _Micros(real, len(real), order)
    first = batch.select([0])
    pad = Batch(
        tensors={
            **first.tensors,
            Field.RESPONSE_MASK: torch.zeros_like(first.tensors[Field.RESPONSE_MASK]),
        },
        meta=first.meta,
    )
    if micro.tokens:
        pad = _packed(pad)
    return _Micros(real + [pad] * (count - len(real)), len(real), order)


def _build(
    setup: EngineSetup, groups: RoleGroups, device: torch.device, *, frozen: bool = False
) -> Transformer:
    """This rank's model: fp32 master weights when trained, the compute dtype when `frozen`."""
    model = Transformer(
        setup.arch,
        tp=groups.tp,
        pp=groups.pp,
        ep=groups.ep,
        value_head=setup.critic,
        num_values=setup.num_values,
        dtype=setup.arch.compute_dtype if frozen else torch.float32,
    )
    full = setup.weights.full(setup.arch, critic=setup.critic, num_values=setup.num_values)
    model.to(device).load_full(full)
    pipeline.connect(groups.pp, device)
    return model


def _stage_io(model: Transformer, micros: list[Batch], device: torch.device) -> StageIO:
    """Hidden states between stages: (samples, prompt + response width, hidden)."""

    def shape(i: int) -> tuple[int, ...]:
        t = micros[i].tensors
        width = t[Field.PROMPT].shape[1] + t[Field.RESPONSE].shape[1]
        return (len(micros[i]), width, model.arch.weights.hidden)

    return StageIO(shape=shape, dtype=model.dtype, device=device)


def stage_outputs(
    call: Callable[..., torch.Tensor], batch: Batch, hidden: torch.Tensor | None, last: bool
) -> torch.Tensor:
    """`response_outputs` on the last stage; a stage's hidden states (all positions) before it."""
    if last:
        return response_outputs(call, batch, hidden=hidden)
    ids, mask, _ = sequence(batch)
    return call(ids, mask, hidden=hidden)


def _forward_stages(
    model: Transformer,
    batch: Batch,
    micro: MicroBatching,
    fn: Callable[[Batch, torch.Tensor | None], torch.Tensor],
    count: int | None = None,
) -> torch.Tensor:
    """`fn(micro-batch, stage input)` on every micro-batch through the stages; the last
    stage's outputs in the batch's sample order (padding micro-batches dropped), an
    empty tensor on the other stages."""
    micros = _micro_batches(batch, micro, count)
    parts = micros.batches
    io = _stage_io(model, parts, next(model.parameters()).device)
    outs = pipeline.forward_only(model.pp, len(parts), lambda i, x: fn(parts[i], x), io)
    if not model.pp.is_last:
        return torch.empty(0, device=io.device)
    return micros.gather(outs, batch.tensors[Field.RESPONSE].shape[1])


class ScoringEngine:
    """A frozen model: the reference policy's logprobs, or a reward model's scores."""

    def __init__(self, setup: EngineSetup, groups: RoleGroups, device: torch.device) -> None:
        self.setup = setup
        self.model = _build(setup, groups, device, frozen=True).eval()
        self.model.requires_grad_(False)

    @torch.no_grad()
    def logprobs(self, batch: Batch, temperature: float) -> Batch:
        last = self.model.pp.is_last

        def fn(mb: Batch, x: torch.Tensor | None) -> torch.Tensor:
            out = stage_outputs(self.model, mb, x, last)
            return response_logp(out, mb, temperature)[0] if last else out

        lp = _forward_stages(self.model, batch, self.setup.micro(forward=True), fn)
        return Batch(tensors={Field.LOGPROBS: lp})

    @torch.no_grad()
    def scores(self, batch: Batch) -> Batch:
        """The value head at each response's last token."""
        last = self.model.pp.is_last

        def fn(mb: Batch, x: torch.Tensor | None) -> torch.Tensor:
            ids, mask, width = sequence(mb)
            values = self.model(ids, mask, hidden=x)
            if not last:
                return values  # this stage's hidden states
            end = width + mb.tensors[Field.RESPONSE_MASK].long().sum(1).clamp(min=1) - 1
            return values[torch.arange(len(mb), device=values.device), end]

        scores = _forward_stages(self.model, batch, self.setup.micro(forward=True), fn)
        return Batch(tensors={Field.SCORES: scores})


LossFn = Callable[[Batch, torch.Tensor, int], tuple[torch.Tensor, dict[str, float]]]


class _Trainable:
    """Shared by actor and critic: epochs x mini-batches x micro-batches of one loss."""

    def __init__(self, setup: EngineSetup, groups: RoleGroups, device: torch.device) -> None:
        if setup.optim is None:
            raise SpecError("a trained role needs optimizer settings")
        self.setup, self.groups, self.device = setup, groups, device
        self.model = _build(setup, groups, device)
        self.trainer = TrainEngine(
            self.model,
            optim=setup.optim,
            zero=setup.zero,
            dp_group=groups.dp_group,
            dp_size=groups.dp_size,
            offload=setup.offload,
            expert_dp_group=groups.expert_dp,
        )

    def _global_tokens(self, mask: torch.Tensor) -> int:
        n = mask.sum().to(torch.float64).reshape(1)
        if self.groups.dp_size > 1:
            dist.all_reduce(n, group=self.groups.dp_group)
        return max(1, int(n.item()))

    def _train(self, batch: Batch, cfg: UpdateConfig, loss_fn: LossFn) -> dict[str, float]:
        sums: dict[str, float] = {}
        count = 0
        self.model.train()
        for _ in range(cfg.ppo_epochs):
            for mini in batch.chunk(cfg.mini_batches):
                num_micro = self._train_mini_batch(mini, loss_fn, sums)
                count += num_micro
                norm = self.trainer.step()
                sums[Metric.GRAD_NORM] = sums.get(Metric.GRAD_NORM, 0.0) + norm * num_micro
        return averaged(sums, count)

    def _micro_count(self, batch: Batch, micro: MicroBatching) -> int:
        """Micro-batches every DP rank runs for its share `batch`: the most any rank needs
        (uneven shards differ by a sample, packed ones by their lengths; FSDP needs the
        same count on every rank)."""
        if micro.tokens:
            need = len(token_micro_batches(sample_tokens(batch), micro.tokens))
        else:
            need = -(-len(batch) // micro.samples)
        count = torch.tensor([max(1, need)], device=self.device)
        if self.groups.dp_size > 1:
            dist.all_reduce(count, op=dist.ReduceOp.MAX, group=self.groups.dp_group)
        return int(count.item())

    def _train_mini_batch(self, mini: Batch, loss_fn: LossFn, sums: dict[str, float]) -> int:
        """Forwards and backwards of one mini-batch (1F1B over the stages); its real
        micro-batches (padding ones, see `_micro_batches`, add no metrics)."""
        num_tokens = self._global_tokens(mini.tensors[Field.RESPONSE_MASK])
        micro = self.setup.micro(forward=False)
        packs = _micro_batches(mini, micro, self._micro_count(mini, micro))
        micros, real = packs.batches, packs.real
        last = self.model.pp.is_last

        def forward(i: int, x: torch.Tensor | None) -> torch.Tensor:
            out = stage_outputs(self.trainer, micros[i], x, last)
            if not last:
                return out
            loss, metrics = loss_fn(micros[i], out, num_tokens)
            aux = self.model.aux_loss()
            if aux is not None and i < real:
                # Mixture of experts: the load-balancing loss, a mean over micro-batches
                # (and over DP ranks by the gradient average), as HF adds it per batch.
                coef = self.model.arch.router_aux_loss_coef
                loss = loss + coef * aux / real
                metrics = {**metrics, Metric.AUX_LOSS: float(aux.detach())}
            if i < real:
                accumulate(sums, metrics)
            return loss

        pipeline.train_1f1b(
            self.model.pp,
            len(micros),
            forward,
            _stage_io(self.model, micros, self.device),
            set_gradient_sync=self.trainer.set_gradient_sync,
        )
        return real

    @torch.no_grad()
    def _forward_all(
        self, batch: Batch, fn: Callable[[Batch, torch.Tensor], torch.Tensor]
    ) -> torch.Tensor:
        """`fn(micro-batch, outputs)` on the last stage (other stages: an empty tensor)."""
        self.model.eval()
        last = self.model.pp.is_last

        def stage(mb: Batch, x: torch.Tensor | None) -> torch.Tensor:
            out = stage_outputs(self.trainer, mb, x, last)
            return fn(mb, out) if last else out

        micro = self.setup.micro(forward=True)
        count = self._micro_count(batch, micro)
        return _forward_stages(self.model, batch, micro, stage, count)

    def state(self) -> dict[str, Any]:
        return self.trainer.state()

    def load_state(self, state: dict[str, Any]) -> None:
        self.trainer.load_state(state)


class ActorEngine(_Trainable):
    """The policy: trains in the p-t-d layout, generates in the tg layout after `sync_rollout`."""

    def __init__(
        self,
        setup: EngineSetup,
        groups: RoleGroups,
        device: torch.device,
        *,
        gen: GenLayout | None,
        rank: int,
        reshard_plan: ReshardPlan | None,
    ) -> None:
        super().__init__(setup, groups, device)
        self.gen, self.rank, self.plan = gen, rank, reshard_plan
        self.rollout: Sampler | None = None
        if gen is not None:
            assert groups.gen_tp is not None
            rollout_model = Transformer(
                setup.arch, tp=groups.gen_tp, dtype=setup.arch.compute_dtype
            ).to(device)
            rollout_model.eval()
            rollout_model.requires_grad_(False)
            self.rollout = Sampler(rollout_model, pad_id=setup.pad_id)
        self.last_reshard_bytes = 0
        self.last_reshard_peak = 0

    def sync_rollout(self) -> int:
        """Training layout -> generation layout (HybridFlow micro-DP all-gather); bytes in."""
        if self.rollout is None or self.plan is None:
            raise SpecError("this actor rank has no colocated rollout engine")
        shards = self.trainer.tp_shards()
        meter = MemoryMeter()
        experts = self.groups.expert_gather or self.groups.micro_dp
        weights, received = reshard_colocated(
            self.plan, self.rank, shards, self.groups.micro_dp, meter, experts
        )
        self.rollout.model.load_shards(weights)
        self.last_reshard_bytes, self.last_reshard_peak = received, meter.peak_bytes
        return received

    def load_rollout(self, weights: dict[str, torch.Tensor]) -> None:
        """Generation shards from elsewhere (a trainer on other devices)."""
        assert self.rollout is not None
        self.rollout.model.load_shards(weights)

    def generate(self, prompts: list[list[int]], params: SamplingParams, seed: int) -> Batch:
        if self.rollout is None:
            raise SpecError("this actor rank has no rollout engine")
        return completions_batch(
            prompts, self.rollout.generate(prompts, params, seed), self.setup.pad_id
        )

    def logprobs(self, batch: Batch, temperature: float) -> Batch:
        lp = self._forward_all(batch, lambda mb, logits: response_logp(logits, mb, temperature)[0])
        return Batch(tensors={Field.LOGPROBS: lp})

    def update(self, batch: Batch, cfg: UpdateConfig) -> dict[str, float]:
        dp = self.groups.dp_size

        def loss_fn(
            mb: Batch, logits: torch.Tensor, num_tokens: int
        ) -> tuple[torch.Tensor, dict[str, float]]:
            t = mb.tensors
            logp, dists = response_logp(logits, mb, cfg.temperature)
            mask = t[Field.RESPONSE_MASK]
            extra: dict[str, float] = {}
            old = t.get(Field.OLD_LOGPROBS)
            if old is None:
                # On-policy single step (Workload.recomputes_old_logprobs): this forward is
                # the old policy; the rollout's logprobs are checked against it here.
                old = logp.detach()
                diff = (old - t[Field.ROLLOUT_LOGPROBS]).abs() * mask
                extra[Metric.LOGPROB_DIFF_MAX] = float(diff.max())
            terms = rl.policy_loss(
                logp,
                old,
                t[Field.ADVANTAGES],
                t[Field.RESPONSE_MASK],
                clip=cfg.clip_ratio,
                num_tokens=num_tokens,
                dp_size=dp,
                ref_logprobs=t.get(Field.REF_LOGPROBS_IN_LOSS),
                kl_coef=cfg.kl_coef,
            )
            if cfg.entropy_coef:
                ent = rl.entropy(dists)
            else:  # a metric only: no graph through the full vocabulary
                with torch.no_grad():
                    ent = rl.entropy(dists)
            loss = terms.loss
            if cfg.entropy_coef:
                loss = loss - cfg.entropy_coef * rl.masked_sum(ent, t[Field.RESPONSE_MASK]) * (
                    dp / num_tokens
                )
            return loss, {
                Metric.PG_LOSS: terms.pg_loss,
                Metric.KL: terms.kl,
                Metric.CLIP_FRACTION: terms.clip_fraction,
                Metric.APPROX_KL: terms.approx_kl,
                Metric.ENTROPY: float(rl.masked_mean(ent.detach(), t[Field.RESPONSE_MASK])),
                **extra,
            }

        return self._train(batch, cfg, loss_fn)


class CriticEngine(_Trainable):
    def values(self, batch: Batch) -> Batch:
        # V(s_t) for response token t is read where token t is predicted.
        return Batch(tensors={Field.VALUES: self._forward_all(batch, lambda mb, out: out)})

    def update(self, batch: Batch, cfg: UpdateConfig) -> dict[str, float]:
        dp = self.groups.dp_size

        # One head per (metric, old values, returns); Safe-RLHF's critic has a cost head too.
        heads = [(Metric.VALUE_LOSS, Field.VALUES, Field.RETURNS)]
        if self.setup.num_values == 2:
            heads.append((Metric.COST_VALUE_LOSS, Field.COST_VALUES, Field.COST_RETURNS))

        def loss_fn(
            mb: Batch, out: torch.Tensor, num_tokens: int
        ) -> tuple[torch.Tensor, dict[str, float]]:
            t = mb.tensors
            total, metrics = out.new_zeros(()), dict[str, float]()
            for i, (metric, old, returns) in enumerate(heads):
                loss, mean = rl.value_loss(
                    out if len(heads) == 1 else out[..., i],
                    t[old],
                    t[returns],
                    t[Field.RESPONSE_MASK],
                    clip=cfg.value_clip,
                    num_tokens=num_tokens,
                    dp_size=dp,
                )
                total, metrics[metric] = total + loss, mean
            return total, metrics

        return self._train(batch, cfg, loss_fn)
