"""Datasets, reward functions, loggers and workload-relative paths.

The oracles: rows read back equal the rows written (JSONL and parquet); every
epoch of the prompt schedule is a permutation of the rows; a bad file's error
names the file, the row and the key; a reward function's failures are counted
per sample and the rest scored; GRPO runs from a JSONL file with a
`file.py:function` reward and from a parquet file with the reward scored in Ray
tasks, and the TensorBoard event files hold the metrics.jsonl values under
verl's names.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from placeflow.errors import SpecError
from placeflow.executor.data import (
    BUILTIN_DATA_DIR,
    Example,
    PromptSchedule,
    data_of,
    load_examples,
    num_steps,
    read_rows,
    write_rows,
)
from placeflow.executor.loggers import VERL_TIMING, logged_scalars, parse_loggers
from placeflow.executor.rewards import (
    RewardInput,
    load_reward_function,
    math_reward,
    score_items,
)
from placeflow.executor.tasks import TASKS
from placeflow.phases import Phase
from placeflow.plan import Plan, load_plan
from placeflow.workload import DataSpec, Role, load_workload

ROOT = Path(__file__).resolve().parents[1]
PLANS = ROOT / "examples" / "plans"

REWARD_FILE = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    """arith's graded score; raises on responses that start with '7' (a user's bug)."""
    if solution_str.startswith("7"):
        raise ZeroDivisionError("a bug in the user's reward")
    from placeflow.executor.tasks import TASKS
    score = TASKS["arith"].score_answer(ground_truth, solution_str)
    return {"score": score, "length": len(solution_str)}
'''


def _spec(path: Path, **kw: object) -> DataSpec:
    return DataSpec(train=path, **kw)  # type: ignore[arg-type]


# --- datasets -----------------------------------------------------------------------------


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
@pytest.mark.parametrize("question", [None, "Q {prompt}"])
def test_rows_round_trip(tmp_path: Path, suffix: str, question: str | None) -> None:
    rows = TASKS["arith"].rows(20, seed=3, question=question)
    path = tmp_path / f"d{suffix}"
    write_rows(rows, path)
    assert read_rows(path) == rows
    examples = load_examples(path, _spec(path, chat_template=question is not None))
    assert [e.answer for e in examples] == [r["answer"] for r in rows]
    problem = TASKS["arith"].problems(20, seed=3)[-1].prompt
    expected = problem if question is None else [{"role": "user", "content": f"Q {problem[:-1]}"}]
    assert examples[-1].prompt == expected


def test_generator_rows_are_the_task_problems() -> None:
    rows = TASKS["arith"].rows(5, seed=11)
    problems = TASKS["arith"].problems(5, seed=11)
    assert [(r["prompt"], r["answer"]) for r in rows] == [(p.prompt, p.answer) for p in problems]
    for p in problems:  # the answer is the sum: an independent check of the generator
        a, b = p.prompt.rstrip("=").split("+")
        assert int(p.answer) == int(a) + int(b)


def _generate_script() -> Any:
    """examples/data/generate.py as a module (the examples are not a package)."""
    path = ROOT / "examples" / "data" / "generate.py"
    spec = importlib.util.spec_from_file_location("placeflow_examples_generate", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_shipped_datasets_are_the_generator_script_output(tmp_path: Path) -> None:
    """Every dataset in examples/data and executor/datasets is what `generate.py --shipped`
    writes, byte for byte, and the built-in checkers' datasets are package data where the
    executor looks for them."""
    generate = _generate_script()
    written = generate.write_shipped(tmp_path / "examples", tmp_path / "builtin")
    shipped = {
        **{p.name: p for p in (ROOT / "examples" / "data").glob("*.jsonl")},
        **{p.name: p for p in (ROOT / "executor" / "datasets").glob("*.jsonl")},
    }
    assert {p.name for p in written} == set(shipped)
    for path in written:
        assert path.read_bytes() == shipped[path.name].read_bytes(), path
    for task in TASKS:  # where the (installed or source) package looks for them
        installed = (BUILTIN_DATA_DIR / f"{task}.jsonl").read_bytes()
        assert installed == (tmp_path / "builtin" / f"{task}.jsonl").read_bytes()


def test_a_workload_without_data_reads_its_checkers_dataset() -> None:
    """No [data]: the built-in checker's shipped dataset through the same path as any
    dataset (rows validated, shuffled epochs); a reward model alone reads arith's; any other
    reward function is told to give [data]."""
    w = load_plan(PLANS / "grpo-tiny-cpu4-colocate.toml").workload
    assert w.data is None and w.reward_function == "arith"
    data = data_of(w)
    assert data == DataSpec(train=BUILTIN_DATA_DIR / "arith.jsonl")
    rows = load_examples(data.train, data)
    assert len(rows) == 2048 and all(e.data_source == "arith" for e in rows)
    for e in rows[:50]:  # the rows are arith problems with their sums
        assert isinstance(e.prompt, str)
        a, b = e.prompt.rstrip("=").split("+")
        assert int(e.answer) == int(a) + int(b)
    reverse = data_of(dataclasses.replace(w, reward_function="reverse"))
    assert reverse.train == BUILTIN_DATA_DIR / "reverse.jsonl"
    scored_by_model = dataclasses.replace(
        w, models={**w.models, Role.REWARD: w.models[Role.ACTOR]}, reward_function=None
    )
    assert data_of(scored_by_model).train == BUILTIN_DATA_DIR / "arith.jsonl"
    with pytest.raises(SpecError, match=r"reward_function 'math' needs \[data\] \(train = "):
        data_of(dataclasses.replace(w, reward_function="math"))
    val = ROOT / "examples" / "data" / "arith-val.jsonl"
    with_data = dataclasses.replace(w, data=DataSpec(train=val))
    assert data_of(with_data) is with_data.data


def test_nested_answer_key_reads_verl_rows(tmp_path: Path) -> None:
    path = tmp_path / "verl.jsonl"
    row = {
        "prompt": "1+1=",
        "reward_model": {"style": "rule", "ground_truth": 2},
        "data_source": "x",
    }
    path.write_text(json.dumps(row) + "\n")
    [ex] = load_examples(path, _spec(path, answer_key="reward_model.ground_truth"))
    assert ex == Example(prompt="1+1=", answer="2", data_source="x")


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("", "no rows"),
        ('{"prompt": "1+1="}\n', "row 1: no key 'answer'"),
        ('{"prompt": "a", "answer": "1"}\n{"answer": "2"}\n', "row 2: no key 'prompt'"),
        ('{"prompt": 5, "answer": "1"}\n', "row 1: key 'prompt': expected a non-empty string"),
        ('{"prompt": "a", "answer": [1]}\n', "row 1: key 'answer': expected a string or a number"),
        ('{"prompt": "a", "answer": "1"}\nnot json\n', "row 2: not valid JSON"),
        ("[1, 2]\n", "row 1: expected an object"),
        (
            '{"prompt": [{"role": "user", "content": "hi"}], "answer": "1"}\n',
            "row 1: key 'prompt' holds chat messages; set [data] chat_template = true",
        ),
    ],
)
def test_bad_rows_name_file_row_and_key(tmp_path: Path, content: str, expected: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    with pytest.raises(SpecError) as err:
        load_examples(path, _spec(path))
    message = str(err.value)
    assert str(path) in message and expected in message and "\n" not in message


def test_parquet_with_a_missing_column(tmp_path: Path) -> None:
    path = tmp_path / "d.parquet"
    write_rows([{"question": "1+1=", "answer": "2"}], path)
    with pytest.raises(
        SpecError, match=r"d.parquet: row 1: no key 'prompt' \(keys: answer, question\)"
    ):
        load_examples(path, _spec(path))
    [ex] = load_examples(path, _spec(path, prompt_key="question"))
    assert ex.prompt == "1+1="


def test_bad_parquet_files_name_file_row_and_key(tmp_path: Path) -> None:
    """Parquet as JSONL: an empty table, a column of the wrong type, a file that is not
    parquet; each a one-line error naming the file (and the row and key)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    empty = tmp_path / "empty.parquet"
    pq.write_table(
        pa.table({"prompt": pa.array([], pa.string()), "answer": pa.array([], pa.string())}), empty
    )
    typed = tmp_path / "typed.parquet"
    pq.write_table(pa.table({"prompt": ["1+1=", "2+2="], "answer": [[2], [4]]}), typed)
    junk = tmp_path / "junk.parquet"
    junk.write_text("not parquet")
    for path, expected in [
        (empty, "empty.parquet: no rows; give at least one row with 'prompt' and 'answer'"),
        (typed, "typed.parquet: row 1: key 'answer': expected a string or a number, got list"),
        (junk, "junk.parquet: not a readable parquet file"),
    ]:
        with pytest.raises(SpecError) as err:
            load_examples(path, _spec(path))
        assert expected in str(err.value) and "\n" not in str(err.value)


def test_schedule_epochs_are_permutations_and_reproducible() -> None:
    examples = [Example(prompt=str(i), answer=str(i)) for i in range(10)]
    sched = PromptSchedule(examples, prompts_per_step=4, seed=7)
    seen = [e.prompt for step in range(5) for e in sched.rows(step)]  # 20 rows: two epochs
    assert sorted(seen[:10]) == sorted(seen[10:]) == [str(i) for i in range(10)]
    assert seen[:10] != seen[10:]  # each epoch is shuffled with its own seed
    again = PromptSchedule(examples, prompts_per_step=4, seed=7)
    assert [e.prompt for e in again.rows(3)] == seen[12:16]  # a resumed run sees the same
    ordered = PromptSchedule(examples, prompts_per_step=4, seed=7, shuffle=False)
    assert [e.prompt for e in ordered.rows(2)] == ["8", "9", "0", "1"]
    assert sched.epoch_of(2) == 0 and sched.epoch_of(3) == 1
    assert num_steps(10, 4, epochs=2) == 5


# --- reward functions -----------------------------------------------------------------------


def test_reward_function_forms(tmp_path: Path) -> None:
    file = tmp_path / "my_reward.py"
    file.write_text(REWARD_FILE)
    fn = load_reward_function(f"{file}:compute_score")
    assert fn(data_source="a", solution_str="22\n", ground_truth="22")["score"] == 1.0
    assert load_reward_function("placeflow.executor.rewards:math_reward") is math_reward
    assert load_reward_function("math") is math_reward
    for spec, expected in [
        ("nope", "not a built-in"),
        (f"{tmp_path / 'missing.py'}:f", "file not found"),
        (f"{file}:other", "has no function 'other'"),
        ("no_such_pkg_xyz.mod:f", "cannot import 'no_such_pkg_xyz.mod'"),
    ]:
        with pytest.raises(SpecError, match=expected):
            load_reward_function(spec)


def test_failures_are_counted_per_sample(tmp_path: Path) -> None:
    file = tmp_path / "r.py"
    file.write_text(REWARD_FILE)
    fn = load_reward_function(f"{file}:compute_score")
    items = [RewardInput("arith", text, "22") for text in ("22\n", "7", "23\n", "77\n")]
    scores = score_items(fn, items)
    assert scores.values == [1.0, 0.0, pytest.approx(0.2 + 0.2 + 0.6 * 0.5), 0.0]
    assert scores.num_errors == 2 and "ZeroDivisionError" in (scores.first_error or "")
    assert scores.extras == {"length": [3.0, 3.0]}  # "22\n" and "23\n"

    def wrong_type(**kw: object) -> object:
        return "1.0"

    bad = score_items(wrong_type, items[:1])
    assert bad.values == [0.0] and bad.num_errors == 1 and "return a float" in bad.first_error


def test_math_reward_with_math_verify() -> None:
    assert math_reward("m", "The answer is $\\frac{1}{2}$.", "0.5") == 1.0
    assert math_reward("m", "So we get 42", "42") == 1.0
    assert math_reward("m", "41", "42") == 0.0


# --- paths relative to the workload ----------------------------------------------------------


def test_workload_paths_are_relative_to_its_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    base = tmp_path / "project"
    (base / "models" / "llama1b").mkdir(parents=True)
    config = {
        "model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64,
        "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 256,
    }  # fmt: skip
    (base / "models" / "llama1b" / "config.json").write_text(json.dumps(config))
    write_rows(TASKS["arith"].rows(8, seed=0), base / "data" / "train.parquet")
    (base / "rewards.py").write_text(REWARD_FILE)
    (base / "workloads").mkdir()
    (base / "workloads" / "w.toml").write_text(
        """
name = "w"
algorithm = "grpo"
reward_function = "../rewards.py:compute_score"
[models]
actor = "../models/llama1b/config.json"
[data]
train = "../data/train.parquet"
[batch]
prompts_per_step = 4
samples_per_prompt = 2
prompt_len = 8
response_len = 8
"""
    )
    monkeypatch.chdir(tmp_path)  # elsewhere: the paths must not depend on the working directory
    w = load_workload(base / "workloads" / "w.toml")
    assert w.models[next(iter(w.models))].num_layers == 2
    assert w.data is not None and w.data.train == (base / "data" / "train.parquet").resolve()
    assert w.reward_function == f"{(base / 'rewards.py').resolve()}:compute_score"
    load_reward_function(w.reward_function)
    # A plan naming the workload by a relative path reaches the same files.
    (base / "plan.toml").write_text(
        'name = "p"\nworkload = "workloads/w.toml"\ncluster = "'
        + str(ROOT / "examples/clusters/cpu4.toml")
        + '"\n[[sets]]\nroles = ["actor"]\nnum_devices = 1\n[parallelism.actor]\nd = 1\n'
    )
    plan = load_plan(base / "plan.toml")
    assert plan.workload == w
    missing = base / "workloads" / "bad.toml"
    missing.write_text(
        (base / "workloads" / "w.toml").read_text().replace("train.parquet", "x.parquet")
    )
    with pytest.raises(SpecError, match=r"\[data\] train: .*x.parquet: file not found"):
        load_workload(missing)
    no_model = base / "workloads" / "no_model.toml"
    no_model.write_text((base / "workloads" / "w.toml").read_text().replace("llama1b", "llama2b"))
    with pytest.raises(SpecError, match=r"models/llama2b/config.json not found \(a model path"):
        load_workload(no_model)
    # A checkpoint directory (one holding config.json) is named the same way.
    as_dir = base / "workloads" / "dir.toml"
    as_dir.write_text(
        (base / "workloads" / "w.toml").read_text().replace("llama1b/config.json", "llama1b")
    )
    assert load_workload(as_dir).models[next(iter(w.models))].num_layers == 2


# --- loggers ---------------------------------------------------------------------------------


def test_logged_scalars_use_verl_names() -> None:
    record = {
        "step": 3,
        "reward_mean": 0.5,
        "step_time_s": 2.0,
        "tokens_per_s": 40.0,
        "phases": {"generate": 1.0, "old_logprob": 0.25, "actor_update": 0.5, "reshard": 0.1},
        "samples": [{"prompt": "x"}],
    }
    s = logged_scalars(record, num_gpus=4)
    assert s["timing_s/gen"] == 1.0 and s["timing_s/old_log_prob"] == 0.25
    assert s["timing_s/update_actor"] == 0.5 and s["timing_s/weight_sync"] == 0.1
    assert s["perf/throughput"] == 10.0 and s["timing_s/step"] == 2.0
    assert "step" not in s and "samples" not in s
    assert set(VERL_TIMING) == set(Phase)  # every phase has a name
    assert parse_loggers("") == parse_loggers("tensorboard") == ("tensorboard",)
    with pytest.raises(SpecError, match="unknown logger 'neptune'"):
        parse_loggers("neptune")


# --- GRPO end to end -------------------------------------------------------------------------


def _data_plan(tmp_path: Path, suffix: str, reward: str, **workload: object) -> Plan:
    plan = load_plan(PLANS / "grpo-tiny-cpu4-colocate.toml")
    train, val = tmp_path / f"train{suffix}", tmp_path / f"val{suffix}"
    write_rows(TASKS["arith"].rows(48, seed=5), train)
    write_rows(TASKS["arith"].rows(8, seed=6), val)
    data = DataSpec(train=train, validation=val, validate_every=2, epochs=2)
    w = dataclasses.replace(plan.workload, data=data, reward_function=reward, **workload)
    return dataclasses.replace(plan, workload=w)


def _tensorboard_scalars(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    [events] = [p.parent for p in (run_dir / "tensorboard").glob("events.out.tfevents.*")]
    acc = EventAccumulator(str(events))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_grpo_from_jsonl_with_a_file_reward(ray_cluster: None, tmp_path: Path) -> None:
    from placeflow.executor.run import RunConfig, read_metrics, run_plan

    (tmp_path / "r.py").write_text(REWARD_FILE)
    plan = _data_plan(tmp_path, ".jsonl", f"{tmp_path / 'r.py'}:compute_score")
    steps = 3
    result = run_plan(plan, tmp_path / "run", RunConfig(steps=steps, progress=False))
    lines = read_metrics(tmp_path / "run")
    assert [m["step"] for m in lines] == list(range(steps))
    prompts = {r["prompt"] for r in read_rows(tmp_path / "train.jsonl")}
    for m in lines:
        assert m["epoch"] == 0.0 and m["reward_errors"] >= 0
        assert "reward_extra/length" in m
        assert {s["prompt"] for s in m["samples"]} <= prompts  # prompts came from the file
    # Validation: before the first step, after step 2, after the last.
    val = read_metrics(tmp_path / "run", "validation.jsonl")
    assert [v["step"] for v in val] == [0, 2, 3] and all(v["val/num_prompts"] == 8 for v in val)
    # TensorBoard holds the same numbers as metrics.jsonl, under verl's names too.
    tb = _tensorboard_scalars(tmp_path / "run")
    assert [v for _, v in tb["reward_mean"]] == pytest.approx([m["reward_mean"] for m in lines])
    assert [s for s, _ in tb["timing_s/gen"]] == list(range(steps))
    assert [v for _, v in tb["timing_s/gen"]] == pytest.approx(
        [m["phases"]["generate"] for m in lines]
    )
    assert {
        "timing_s/ref",
        "timing_s/update_actor",
        "timing_s/weight_sync",
        "perf/throughput",
    } <= set(tb)
    assert [s for s, _ in tb["val/exact_match"]] == [0, 2, 3]
    assert len(result.records) == steps
    # The run report draws the validation curve and states its first and last points.
    from placeflow.reports.run import run_report

    html = run_report(tmp_path / "run").read_text()
    first, last = val[0]["val/exact_match"], val[-1]["val/exact_match"]
    assert f"{first:.3f} after 0 steps -&gt; {last:.3f} after 3" in html or (
        f"{first:.3f} after 0 steps -> {last:.3f} after 3" in html
    )
    assert "Validation (8 held-out prompts, greedy)" in html


def test_grpo_from_parquet_scored_in_ray_tasks(ray_cluster: None, tmp_path: Path) -> None:
    from placeflow.executor.run import RunConfig, read_metrics, run_plan

    plan = _data_plan(tmp_path, ".parquet", "arith", reward_workers=2)
    run_plan(plan, tmp_path / "run", RunConfig(steps=2, progress=False))
    lines = read_metrics(tmp_path / "run")
    assert [m["step"] for m in lines] == [0, 1]
    # The Ray tasks' scores are the checker's: recompute them from the logged samples.
    for m in lines:
        for s in m["samples"]:
            answer = next(
                r["answer"]
                for r in read_rows(tmp_path / "train.parquet")
                if r["prompt"] == s["prompt"]
            )
            assert s["reward"] == pytest.approx(TASKS["arith"].score_answer(answer, s["response"]))
    assert (tmp_path / "run" / "tensorboard").is_dir()


VERL_NAMES = {
    "timing_s/gen": "generate",
    "timing_s/old_log_prob": "old_logprob",
    "timing_s/ref": "ref_logprob",
    "timing_s/update_actor": "actor_update",
    "timing_s/update_critic": "critic_update",
    "timing_s/weight_sync": "reshard",  # colocated: the reshard is verl's weight sync
}


def test_ppo_run_logs_verl_timing_names_and_tokens_per_gpu(
    ray_cluster: None, tmp_path: Path
) -> None:
    """A PPO run without [data]: prompts from the shipped arith dataset; metrics.jsonl and
    TensorBoard both hold every phase under verl's name and the throughput per GPU."""
    from placeflow.executor.run import RunConfig, read_metrics, run_plan

    plan = load_plan(PLANS / "ppo-tiny-cpu4-colocate.toml")
    assert plan.workload.data is None and plan.num_gpus == 4
    run_plan(plan, tmp_path / "run", RunConfig(steps=2, progress=False))
    lines = read_metrics(tmp_path / "run")
    shipped = {r["prompt"] for r in read_rows(BUILTIN_DATA_DIR / "arith.jsonl")}
    tb = _tensorboard_scalars(tmp_path / "run")
    for m in lines:
        for name, phase in VERL_NAMES.items():
            assert m[name] == m["phases"][phase], name
        assert m["perf/throughput"] == pytest.approx(m["tokens_per_s"] / 4)
        assert {s["prompt"] for s in m["samples"]} <= shipped
    for name in [*VERL_NAMES, "perf/throughput"]:
        assert [s for s, _ in tb[name]] == [0, 1], name
        assert [v for _, v in tb[name]] == pytest.approx([m[name] for m in lines]), name


def test_a_run_is_simulated_with_the_prompt_length_it_pads_to(tmp_path: Path) -> None:
    """`as_run`: the workload's prompt_len (a maximum) becomes its data's longest prompt
    as the byte tokenizer encodes it (a token a byte), cut at prompt_len; the shipped
    arithmetic prompts ("24+48=") are at most 6 bytes."""
    from placeflow.executor.loop import as_run, padded_prompt_len

    plan = load_plan(PLANS / "grpo-tiny-cpu4-colocate.toml")
    assert plan.workload.batch.prompt_len == 16
    assert padded_prompt_len(plan) == 6
    train = tmp_path / "train.jsonl"
    write_rows([{"prompt": "ab", "answer": "1"}, {"prompt": "x" * 11, "answer": "2"}], train)
    w = dataclasses.replace(plan.workload, data=DataSpec(train=train), reward_function="arith")
    mine = dataclasses.replace(plan, workload=w)
    assert as_run(mine).workload.batch.prompt_len == 11
    assert as_run(mine).workload.batch.response_len == w.batch.response_len
    short = dataclasses.replace(w, batch=dataclasses.replace(w.batch, prompt_len=8))
    cut = dataclasses.replace(plan, workload=short)
    assert padded_prompt_len(cut) == 8  # the 11-byte prompt is cut to its last 8
    assert as_run(cut) is cut


def test_epochs_bound_the_steps(tmp_path: Path) -> None:
    from placeflow.executor.run import preflight

    plan = _data_plan(tmp_path, ".jsonl", "arith")  # 48 rows x 2 epochs / 16 prompts = 6 steps
    preflight(plan, 6)
    with pytest.raises(SpecError, match="48 rows give 6 steps of 16 prompts in 2 epoch"):
        preflight(plan, 7)
    assert os.path.isfile(plan.workload.data.train)  # type: ignore[union-attr]


def test_wandb_and_mlflow_loggers_write_offline(tmp_path: Path) -> None:
    """With the `loggers` extra: the same scalars reach W&B's offline run and MLflow's store."""
    pytest.importorskip("wandb")
    pytest.importorskip("mlflow")
    pytest.importorskip("sqlalchemy")
    from mlflow.tracking import MlflowClient

    from placeflow.executor.loggers import Loggers, tracking_uri

    loggers = Loggers(parse_loggers("wandb,mlflow"), tmp_path, "test-run", num_gpus=1)
    for step in range(3):
        loggers.log({"step": step, "reward_mean": 0.25 * step, "phases": {"generate": 1.0}}, step)
    loggers.close()
    [offline] = (tmp_path / "wandb").glob("offline-run-*/run-*.wandb")
    assert offline.stat().st_size > 0
    client = MlflowClient(tracking_uri=tracking_uri(tmp_path))
    [run] = client.search_runs([e.experiment_id for e in client.search_experiments()])
    history = client.get_metric_history(run.info.run_id, "reward_mean")
    assert [(m.step, m.value) for m in history] == [(0, 0.0), (1, 0.25), (2, 0.5)]
    assert [m.value for m in client.get_metric_history(run.info.run_id, "timing_s/gen")] == [
        1.0
    ] * 3


@pytest.mark.slow
def test_chat_template_renders_with_the_model_tokenizer() -> None:
    """SmolLM2's own chat template (when its GGUF is cached): the message inside the
    template's user turn, a generation prompt after it; a plain prompt is left alone."""
    from placeflow.executor.data import prompt_text
    from placeflow.executor.engines import smollm2
    from placeflow.executor.engines.tokenizer import ByteTokenizer, HFTokenizer

    try:
        tok = HFTokenizer(smollm2.gguf_path(download=False))
    except smollm2.ModelUnavailableError as exc:
        pytest.skip(str(exc))
    ex = Example(prompt=[{"role": "user", "content": "What is 2+3?"}], answer="5")
    text = prompt_text(ex, tok, chat_template=True)
    assert "<|im_start|>user\nWhat is 2+3?<|im_end|>\n" in text
    assert text.endswith("<|im_start|>assistant\n")
    assert prompt_text(Example(prompt="What is 2+3?", answer="5"), tok, chat_template=True) == text
    assert prompt_text(Example(prompt="2+3=", answer="5"), tok, chat_template=False) == "2+3="
    with pytest.raises(SpecError, match="needs a model checkpoint whose tokenizer has a chat"):
        prompt_text(ex, ByteTokenizer(), chat_template=True)


def test_report_shows_chat_prompts_as_text() -> None:
    from placeflow.reports.run import sample_prompt

    assert sample_prompt("1+1=") == "1+1="
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "1+1?"}]
    assert sample_prompt(chat) == "system: Be brief.\nuser: 1+1?"


def test_rehearsal_keeps_the_workloads_data_and_reward_function(tmp_path: Path) -> None:
    """A GPU plan rehearsed on CPU reads its own dataset and scores with its own reward
    function (no substitute); chat-template prompts, which the tiny models cannot render,
    are refused with the reason."""
    from placeflow.executor.rehearsal import rehearsal_plan

    plan = load_plan(PLANS / "ppo-7b-split-h100x16.toml")
    (tmp_path / "r.py").write_text(REWARD_FILE)
    train = tmp_path / "train.jsonl"
    write_rows(TASKS["arith"].rows(8, seed=0), train)
    reward = f"{tmp_path / 'r.py'}:compute_score"
    w = dataclasses.replace(plan.workload, data=DataSpec(train=train), reward_function=reward)
    tiny = rehearsal_plan(dataclasses.replace(plan, workload=w)).workload
    assert tiny.reward_function == reward and tiny.data == w.data
    chat = dataclasses.replace(w, data=DataSpec(train=train, chat_template=True))
    with pytest.raises(SpecError, match=r"chat_template = true .* rehearsal's tiny models"):
        rehearsal_plan(dataclasses.replace(plan, workload=chat))
