"""The controller's own work of a step on the driver, measured through the executor's code.

Between the model calls the executor's driver works alone, one thread: it decodes the
step's responses and scores them with the rule-based reward function (while the
forward calls it has just launched run, before it collects them: `RLLoop._forwards`),
and it computes the advantages once the forwards' results are in, before it launches
the updates (`RLLoop._train`). Both delay what waits for the driver: a forward's end
is stamped only when the driver gets to its results, and the updates start only after
the advantages. On this 2-core VM the `arith` reward took about 0.8-0.9 ms for 32
responses with the host otherwise idle and 3-4 ms while the forwards' ranks ran
beside it; PPO's GAE about 0.7 ms and Safe-RLHF's two about 1.3 ms (2026-11-29, ad
hoc, the timings that led to these entries).

`measure_rule_reward` times the executor's own path on this host: the responses
decoded by the built-in byte tokenizer (`loop.decode_responses`) and scored by the
built-in `arith` checker (`rewards.score_items`), for num_units responses of
`CONTROLLER_RESPONSE_LEN` tokens; `measure_advantages` times `loop.step_advantages`
of each algorithm on a batch of `CONTROLLER_SAMPLES` responses of num_units tokens,
with the fields the algorithm's forwards fill. Both are `framework` entries (kinds
`CONTROLLER_KINDS`, source measured), each the median of `repeats` timed runs after
warm-up, with the host otherwise idle, each run after the thread slept
`CONTROLLER_PAUSE_S`: the driver comes to this work from waiting for the forwards'
results (the advantages) or from pickling its launches (the scoring), not from the
same work, and timed back to back the work runs hot. On this VM (2026-11-30 01:40
UTC, ad hoc) GRPO's advantages on 32 responses of 16 tokens took 0.10 ms back to
back and 0.28, 0.56, 0.60 and 0.65 ms after sleeps of 3, 10, 30 and 100 ms (PPO's
0.86 ms and 1.6-2.0), where the fidelity run of 00:41 UTC measured the advantage
phase of the GRPO plans at 0.3-0.6 ms and of PPO's at 1.7-1.9. The simulator makes
them tasks of the driver in its schedule (`simulator.simulate`), where a crowded host
stretches them as it does the driver's launches and gets (`simulator.schedule`).

What the entries leave out: a reward function other than `arith` (a user's, or
math-verify's) is priced as `arith`'s decode and score, and the simulator says so in
its notes; the advantage's cost by the batch's size is the one at
`CONTROLLER_SAMPLES` (its per-token loops are Python-bound at these sizes, and
priced by the response's length alone); reward scoring in Ray tasks
(`reward_workers`) is not priced.

    python -m placeflow.profiles.controller_work --add-to PROFILE.json
"""

from __future__ import annotations

import argparse
import datetime
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from placeflow.cliargs import add_kinds_option
from placeflow.profiles.schema import (
    Entry,
    FrameworkKind,
    Op,
    load_profile_file,
    save_profile,
    with_some_kinds,
)
from placeflow.workload import Algorithm

if TYPE_CHECKING:
    import torch

    from placeflow.executor.batch import Batch
    from placeflow.workload import Workload

CONTROLLER_KINDS = (
    FrameworkKind.RULE_REWARD,
    FrameworkKind.ADVANTAGE_PPO,
    FrameworkKind.ADVANTAGE_GRPO,
    FrameworkKind.ADVANTAGE_REMAX,
    FrameworkKind.ADVANTAGE_SAFE_RLHF,
)
ADVANTAGE_KIND = {
    Algorithm.PPO: FrameworkKind.ADVANTAGE_PPO,
    Algorithm.GRPO: FrameworkKind.ADVANTAGE_GRPO,
    Algorithm.REMAX: FrameworkKind.ADVANTAGE_REMAX,
    Algorithm.SAFE_RLHF: FrameworkKind.ADVANTAGE_SAFE_RLHF,
}
REWARD_RESPONSES = (8, 32, 128, 512)  # num_units of `rule_reward`
CONTROLLER_RESPONSE_LEN = 16  # tokens per response scored
ADVANTAGE_LENS = (16, 64, 256, 1024)  # num_units of the advantage kinds: response tokens
CONTROLLER_SAMPLES = 32  # responses per advantage batch
SAMPLES_PER_PROMPT = 4  # GRPO's and the others' groups (ReMax: one response per prompt)
# The driver's thread sleeps before each run, as it waits for the calls' results before
# the advantages and launches calls before it scores: its caches come to the work cold.
CONTROLLER_PAUSE_S = 0.01


def _timed(
    fn: Callable[[], object], repeats: int, warmup: int, pause_s: float = CONTROLLER_PAUSE_S
) -> list[float]:
    """`repeats` wall times of `fn`, each after the thread slept `pause_s` (module
    docstring: the driver comes to this work cold)."""
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(repeats):
        time.sleep(pause_s)
        start = time.perf_counter()
        fn()
        out.append(time.perf_counter() - start)
    return out


def _digits(rows: int, cols: int, seed: int) -> torch.Tensor:
    """Token ids of ASCII digits under the byte tokenizer (an arithmetic answer's text)."""
    import torch

    from placeflow.executor.engines.tokenizer import ByteTokenizer

    g = torch.Generator().manual_seed(seed)
    zero = ByteTokenizer().encode("0")[-1]
    return torch.randint(zero, zero + 10, (rows, cols), generator=g)


def measure_rule_reward(
    responses: Sequence[int] = REWARD_RESPONSES, *, repeats: int = 40, warmup: int = 5
) -> list[Entry]:
    """`rule_reward` entries: the executor's decode and `arith` scoring of n responses."""
    import torch

    from placeflow.executor.batch import Batch
    from placeflow.executor.engines.tokenizer import ByteTokenizer
    from placeflow.executor.loop import decode_responses
    from placeflow.executor.rewards import RewardInput, load_reward_function, score_items
    from placeflow.fields import Field
    from placeflow.profiles.shared_cores import framework_entry

    tok, fn = ByteTokenizer(), load_reward_function("arith")
    entries = []
    for n in responses:
        ids = _digits(n, CONTROLLER_RESPONSE_LEN, seed=n)
        batch = Batch(
            tensors={
                Field.RESPONSE: ids,
                Field.RESPONSE_MASK: torch.ones_like(ids),
            }
        )

        def score(batch: Batch = batch) -> object:
            items = [
                RewardInput(data_source="arith", solution_str=text, ground_truth="12")
                for text in decode_responses(tok, batch)
            ]
            return torch.tensor(score_items(fn, items).values)

        entries.append(
            framework_entry(FrameworkKind.RULE_REWARD, n, _timed(score, repeats, warmup))
        )
    return entries


def measure_advantages(
    algorithms: Sequence[Algorithm] = tuple(ADVANTAGE_KIND),
    lengths: Sequence[int] = ADVANTAGE_LENS,
    *,
    repeats: int = 40,
    warmup: int = 5,
) -> list[Entry]:
    """The advantage entries: `loop.step_advantages` of each algorithm on
    `CONTROLLER_SAMPLES` responses of each length."""
    from placeflow.executor.loop import step_advantages
    from placeflow.profiles.shared_cores import framework_entry

    entries = []
    for algorithm in algorithms:
        for r in lengths:
            w, batch = advantage_probe(algorithm, r)

            def run(w: Workload = w, batch: Batch = batch) -> object:
                return step_advantages(w, batch, 1.0)

            entries.append(
                framework_entry(ADVANTAGE_KIND[algorithm], r, _timed(run, repeats, warmup))
            )
    return entries


def advantage_probe(algorithm: Algorithm, response_len: int) -> tuple[Workload, Batch]:
    """(workload, batch) as `step_advantages` meets them for `algorithm`: a tiny
    random-init workload of its roles with a reference model, and `CONTROLLER_SAMPLES`
    scored responses of `response_len` tokens with what its forwards return."""
    import torch

    from placeflow.catalogue import CATALOGUE
    from placeflow.executor.batch import Batch
    from placeflow.fields import Field
    from placeflow.workload import ROLES, BatchSpec, Role, Workload

    spp = 1 if algorithm is Algorithm.REMAX else SAMPLES_PER_PROMPT
    required, _ = ROLES[algorithm]
    model = CATALOGUE["tiny-llama"]
    w = Workload(
        name=f"controller-probe-{algorithm.value}",
        algorithm=algorithm,
        models={role: model for role in required | {Role.REF}},
        batch=BatchSpec(
            prompts_per_step=CONTROLLER_SAMPLES // spp,
            samples_per_prompt=spp,
            prompt_len=CONTROLLER_RESPONSE_LEN,
            response_len=response_len,
        ),
        reward_function=None if Role.REWARD in required else "arith",
    )
    b, g = CONTROLLER_SAMPLES, torch.Generator().manual_seed(response_len)

    def logprobs() -> torch.Tensor:
        return -torch.rand(b, response_len, generator=g)

    tensors: dict[str, torch.Tensor] = {
        Field.PROMPT: _digits(b, CONTROLLER_RESPONSE_LEN, seed=1),
        Field.PROMPT_MASK: torch.ones(b, CONTROLLER_RESPONSE_LEN, dtype=torch.long),
        Field.RESPONSE: _digits(b, response_len, seed=2),
        Field.RESPONSE_MASK: torch.ones(b, response_len, dtype=torch.long),
        Field.ROLLOUT_LOGPROBS: logprobs(),
        Field.OLD_LOGPROBS: logprobs(),
        Field.REF_LOGPROBS: logprobs(),
        Field.SCORES: torch.rand(b, generator=g),
    }
    if algorithm in (Algorithm.PPO, Algorithm.SAFE_RLHF):
        tensors[Field.VALUES] = torch.randn(b, response_len, generator=g)
    if algorithm is Algorithm.REMAX:
        tensors[Field.BASELINE_SCORES] = torch.rand(b, generator=g)
    if algorithm is Algorithm.SAFE_RLHF:
        tensors[Field.COST_VALUES] = torch.randn(b, response_len, generator=g)
        tensors[Field.COSTS] = torch.rand(b, generator=g)
    return w, Batch(tensors=tensors)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--add-to", type=Path, required=True, help="a CPU profile JSON file")
    parser.add_argument("--repeats", type=int, default=40)
    add_kinds_option(parser, [k.value for k in CONTROLLER_KINDS])
    args = parser.parse_args(argv)
    kinds = [FrameworkKind(k) for k in args.kinds]
    profile = load_profile_file(args.add_to)
    entries: list[Entry] = []
    if FrameworkKind.RULE_REWARD in kinds:
        entries += measure_rule_reward(repeats=args.repeats)
    algorithms = [a for a, k in ADVANTAGE_KIND.items() if k in kinds]
    entries += measure_advantages(algorithms, repeats=args.repeats)
    date = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    names = [k.value for k in kinds]
    text = (
        f"measured {date} by `python -m placeflow.profiles.controller_work --add-to "
        f"{args.add_to} --kinds {' '.join(names)}` (the controller's work, torch's default "
        "threads as the driver's: rule_reward, num_units responses of "
        f"{CONTROLLER_RESPONSE_LEN} tokens decoded by the byte tokenizer and scored by "
        "`arith`; advantage_*, "
        f"`loop.step_advantages` on {CONTROLLER_SAMPLES} responses of num_units tokens; "
        f"medians of {args.repeats} runs, each after the thread slept "
        f"{CONTROLLER_PAUSE_S * 1e3:g} ms)."
    )
    save_profile(with_some_kinds(profile, Op.FRAMEWORK, entries, names, text), args.add_to)
    for e in entries:
        print(
            f"{e.params['kind']} at {e.params['num_units']}: {e.median_s * 1e3:.3f} ms "
            f"(p10 {e.p10_s * 1e3:.3f}, p90 {e.p90_s * 1e3:.3f})"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
