"""One list of the executor's rules (placeflow/executable.py): the executor refuses by it,
and the planner reports by it whether `placeflow run` would take each plan it ranks."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

import placeflow
from placeflow.errors import SpecError
from placeflow.executable import check_executable, executable_problems
from placeflow.executor.loop import check_executable as executor_check
from placeflow.layout import TrainLayout
from placeflow.plan import load_plan
from placeflow.workload import LoRASpec, Role, load_workload

ROOT = Path(__file__).resolve().parents[1]


def test_the_executor_refuses_by_the_shared_rules_and_names_every_reason() -> None:
    assert executor_check is check_executable
    plan = load_plan(ROOT / "examples" / "plans" / "grpo-tiny-cpu4-colocate.toml")
    assert executable_problems(plan) == []
    check_executable(plan)
    actor = dataclasses.replace(
        plan.parallelism[Role.ACTOR], train=TrainLayout(p=2, d=2), tg=1, pg=2
    )
    workload = dataclasses.replace(plan.workload, lora=LoRASpec(rank=4))
    both = dataclasses.replace(
        plan, workload=workload, parallelism={**plan.parallelism, Role.ACTOR: actor}
    )
    problems = executable_problems(both)
    assert len(problems) == 2
    assert problems[0].startswith("[lora] (rank 4 on actor)")
    assert "generation pipeline pg > 1" in problems[1]
    with pytest.raises(SpecError, match=r"\[lora\].*; actor: generation pipeline pg > 1"):
        check_executable(both)


def test_the_planner_says_whether_placeflow_run_takes_each_plan() -> None:
    cluster = ROOT / "examples" / "clusters" / "cpu4.toml"
    workload = load_workload(ROOT / "examples" / "workloads" / "grpo-tiny-cpu.toml")
    runs = placeflow.plan(cluster, workload, time_limit_s=20)
    assert all(r.executor_problems == () for r in runs.ranked)
    adapted = dataclasses.replace(workload, lora=LoRASpec(rank=4))
    refused = placeflow.plan(cluster, adapted, time_limit_s=20)
    assert refused.ranked and all(
        len(r.executor_problems) == 1 and r.executor_problems[0].startswith("[lora]")
        for r in refused.ranked
    )
