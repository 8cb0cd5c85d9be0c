"""The library API: the README's example runs as written, and the verbs return typed results."""

import re
from pathlib import Path

import pytest

import placeflow
from placeflow.errors import SpecError
from placeflow.plan import Plan, load_plan

ROOT = Path(__file__).resolve().parent.parent


def _readme_example() -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    block = re.search(
        r"<!-- api-example -->\s*```python\n(.*?)```\s*<!-- /api-example -->", text, re.S
    )
    assert block, "README.md lost its <!-- api-example --> block"
    return block.group(1)


def test_readme_api_example_runs(ray_cluster, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    for folder in ("examples",):
        (tmp_path / folder).symlink_to(ROOT / folder)
    namespace: dict = {}
    exec(compile(_readme_example(), "README.md:api-example", "exec"), namespace)
    out = capsys.readouterr().out
    assert namespace["result"].status.value in ("optimal", "feasible")
    assert isinstance(namespace["result"].best.plan, Plan)
    assert len(namespace["run"].records) == 2
    assert (tmp_path / "runs" / "api-example" / "metrics.jsonl").is_file()
    assert "generate" in out


def test_plan_module_is_callable_and_still_the_spec_module():
    from placeflow.plan import Plan as SpecPlan

    assert callable(placeflow.plan) and placeflow.plan.Plan is SpecPlan
    with pytest.raises(SpecError, match="unknown objective 'fastest'"):
        placeflow.plan(
            ROOT / "examples/clusters/cpu8.toml",
            ROOT / "examples/workloads/grpo-tiny-cpu.toml",
            objective="fastest",
        )


def test_simulate_takes_a_spec_or_a_path():
    path = ROOT / "examples/plans/ppo-7b-colocate-h100x16.toml"
    by_path = placeflow.simulate(path)
    by_spec = placeflow.simulate(load_plan(path))
    assert by_path.iteration_s == by_spec.iteration_s > 0


def test_rehearse_keeps_the_layout_on_cpu_workers():
    plan = load_plan(ROOT / "examples/plans/ppo-7b-colocate-h100x16.toml")
    rehearsal = placeflow.rehearse(plan)
    assert rehearsal.num_gpus == plan.num_gpus
    assert [(s.roles, s.num_devices) for s in rehearsal.sets] == [
        (s.roles, s.num_devices) for s in plan.sets
    ]
    for role, par in plan.parallelism.items():
        got = rehearsal.parallelism[role]
        assert (got.train, got.tg, got.pg) == (par.train, par.tg, par.pg)


def test_export_is_callable_and_still_the_exporters_package():
    from placeflow.export import Export, Target

    out = placeflow.export(ROOT / "examples/plans/ppo-7b-colocate-h100x16.toml", "openrlhf")
    assert isinstance(out, Export) and out.target is Target.OPENRLHF
    with pytest.raises(SpecError, match="unknown export target 'nemo'"):
        placeflow.export(ROOT / "examples/plans/ppo-7b-colocate-h100x16.toml", "nemo")
