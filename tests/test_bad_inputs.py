"""Bad inputs to every command: one `placeflow: error:` line, exit code 2, nothing written.

Table-driven: each case is a command line (with `{tmp}` for the test's folder,
`{ex}` for examples/) run in-process by `placeflow.cli.main` from inside the
test's folder, so that a default output path (runs/<plan name>) would land there
too. The oracle per case: exit code 2, exactly one line on stderr and it starts
with `placeflow: error:`, no "Traceback", and the folder's files unchanged.
Spec keys are covered by writing one bad value into an otherwise good cluster,
workload or plan file.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import tomli_w
import torch

from placeflow.cli import main
from placeflow.errors import SpecError
from placeflow.fsio import safe_name

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
LONG = "n" * 300  # longer than a file name may be
NAN, INF = float("nan"), float("inf")

CLUSTER = {"name": "c", "pools": [{"name": "h100", "gpu": "h100-sxm", "num_nodes": 2}]}
CLUSTER["pools"][0]["gpus_per_node"] = 8
WORKLOAD: dict[str, Any] = {
    "name": "w",
    "algorithm": "grpo",
    "reward_function": "arith",
    "models": {"actor": "tiny-llama", "ref": "tiny-llama"},
    "batch": {"prompts_per_step": 16, "samples_per_prompt": 4, "prompt_len": 16},
    "rl": {"lr": 2e-3, "temperature": 1.0},
}
WORKLOAD["batch"]["response_len"] = 16
PLAN: dict[str, Any] = {
    "name": "p",
    "workload": str(EXAMPLES / "workloads" / "grpo-tiny-cpu.toml"),
    "cluster": str(EXAMPLES / "clusters" / "cpu4.toml"),
    "sets": [{"roles": ["actor", "ref"], "pool": "cpu", "first_device": 0, "num_devices": 4}],
    "parallelism": {"actor": {"t": 2, "d": 2, "tg": 1, "micro_batch": 8}, "ref": {"d": 4}},
}

# --- command lines -------------------------------------------------------------------
PLAN_ARGS = ["plan", "--cluster", "{ex}/clusters/h100x16.toml", "--workload"]
PLAN_ARGS += ["{ex}/workloads/ppo-llama2-7b.toml"]
RUN_ARGS = ["run", "{ex}/plans/grpo-tiny-cpu4-colocate.toml"]
VAL_ARGS = ["validate", "{ex}/plans/grpo-tiny-cpu4-colocate.toml", "--profile", "cpu"]
SIM_ARGS = ["simulate", "{ex}/plans/grpo-tiny-cpu4-colocate.toml"]

NUMBER_FLAGS: dict[str, tuple[list[str], list[str]]] = {
    "plan --time-limit": (PLAN_ARGS, ["0", "-5", "nan", "inf", "abc", "", "1e9"]),
    "plan --top": (PLAN_ARGS, ["0", "-3", "1.5", "x", "100000"]),
    "plan --target-tokens-per-s": (PLAN_ARGS, ["0", "-1", "nan", "inf", "x"]),
    "plan --objective": (PLAN_ARGS, ["fastest", ""]),
    "run --steps": (RUN_ARGS, ["0", "-5", "1e3", "x", "99999999999"]),
    "run --checkpoint-every": (RUN_ARGS, ["-1", "x", "2.5"]),
    "run --threads": (RUN_ARGS, ["0", "-1", "5000", "x"]),
    "run --num-cpus": (RUN_ARGS, ["0", "-2", "x"]),
    "run --timeout": (RUN_ARGS, ["0", "-1", "nan", "inf", "1e12"]),
    "run --seed": (RUN_ARGS, ["-1", "x", str(2**64)]),
    "run --tp-backend": (RUN_ARGS, ["cuda"]),
    "validate --steps": (VAL_ARGS, ["1", "0", "-3"]),
    "validate --threads": (VAL_ARGS, ["0"]),
    "validate --seed": (VAL_ARGS, ["-7"]),
    "profile --threads": (["profile", "--device", "cpu"], ["0", "-1", "x"]),
    "profile --device": (["profile"], ["gpu", "tpu", ""]),
}

PATH_CASES: dict[str, list[str]] = {
    "simulate missing file": ["simulate", "{tmp}/nope.toml"],
    "simulate binary file": ["simulate", "{tmp}/binary.toml"],
    "simulate latin-1 file": ["simulate", "{tmp}/latin1.toml"],
    "simulate empty file": ["simulate", "{tmp}/empty.toml"],
    "simulate garbage TOML": ["simulate", "{tmp}/garbage.toml"],
    "simulate a directory": ["simulate", "{tmp}/adir"],
    "simulate empty path": ["simulate", ""],
    "simulate name too long": ["simulate", f"{{tmp}}/{LONG}.toml"],
    "simulate --report under a file": [*SIM_ARGS, "--report", "{tmp}/afile/r.html"],
    "simulate --report a directory": [*SIM_ARGS, "--report", "{tmp}/adir"],
    "simulate --report name too long": [*SIM_ARGS, "--report", f"{{tmp}}/{LONG}.html"],
    "simulate --report empty": [*SIM_ARGS, "--report", ""],
    "simulate unknown --profile": [*SIM_ARGS, "--profile", "no-such-profile"],
    "plan binary cluster": ["plan", "--cluster", "{tmp}/binary.toml", "--workload", "x.toml"],
    "plan missing workload": ["plan", "--cluster", "{ex}/clusters/h100x16.toml", "--workload", ""],
    "plan cluster is a directory": ["plan", "--cluster", "{tmp}", "--workload", "x.toml"],
    "plan --out under a file": [*PLAN_ARGS, "--out", "{tmp}/afile/best.toml"],
    "plan --out a directory": [*PLAN_ARGS, "--out", "{tmp}/adir"],
    "plan --out name too long": [*PLAN_ARGS, "--out", f"{{tmp}}/{LONG}.toml"],
    "plan --report under a file": [*PLAN_ARGS, "--report", "{tmp}/afile/x/r.html"],
    "plan --out read-only dir": [*PLAN_ARGS, "--out", "{tmp}/readonly/best.toml"],
    "run --run-dir is a file": [*RUN_ARGS, "--run-dir", "{tmp}/afile"],
    "run --run-dir under a file": [*RUN_ARGS, "--run-dir", "{tmp}/afile/run"],
    "run --run-dir name too long": [*RUN_ARGS, "--run-dir", f"{{tmp}}/{LONG}"],
    "run --run-dir read-only": [*RUN_ARGS, "--run-dir", "{tmp}/readonly/run"],
    "run --run-dir empty": [*RUN_ARGS, "--run-dir", ""],
    "run --resume without a run": [*RUN_ARGS, "--run-dir", "{tmp}/adir", "--resume"],
    "run binary plan": ["run", "{tmp}/binary.toml"],
    "run plan 5000-char name": ["run", "{tmp}/longname.toml"],
    "run plan name of dots": ["run", "{tmp}/dotsname.toml"],
    "run unknown reward_function": ["run", "{tmp}/badreward.toml"],
    "run reward file missing": ["run", "{tmp}/rewardfile.toml"],
    "run reward file fails to load": ["run", "{tmp}/brokenreward.toml"],
    "run data row without answer": ["run", "{tmp}/baddata.toml"],
    "run data empty file": ["run", "{tmp}/emptydata.toml"],
    "run data more steps than epochs": [*RUN_ARGS[:1], "{tmp}/epochs.toml", "--steps", "99"],
    "run chat template with byte tokenizer": ["run", "{tmp}/chat.toml"],
    "run unknown --logger": [*RUN_ARGS, "--logger", "neptune"],
    "export unknown target": ["export", "{ex}/plans/ppo-7b-split-h100x16.toml", "--to", "trl"],
    "export missing plan": ["export", "{tmp}/nope.toml", "--to", "verl"],
    "export --out under a file": [
        *["export", "{ex}/plans/ppo-7b-split-h100x16.toml", "--to", "verl"],
        *["--out", "{tmp}/afile/x.sh"],
    ],
    "validate --run-dir is a file": [*VAL_ARGS, "--run-dir", "{tmp}/afile"],
    "validate --report under a file": [*VAL_ARGS, "--report", "{tmp}/afile/r.html"],
    "validate missing --profile": ["validate", "{ex}/plans/grpo-tiny-cpu4-colocate.toml"],
    "profile --out under a file": ["profile", "--device", "cpu", "--out", "{tmp}/afile/p.json"],
    "profile --out a directory": ["profile", "--device", "cpu", "--out", "{tmp}/adir"],
    "profile --out name too long": ["profile", "--device", "cpu", "--out", f"{{tmp}}/{LONG}"],
    "profile --out read-only": ["profile", "--device", "cpu", "--out", "{tmp}/readonly/p.json"],
    "profile --name empty": ["profile", "--device", "cpu", "--name", ""],
    "profile --name too long": ["profile", "--device", "cpu", "--name", "x" * 5000],
    "profiles check unknown": ["profiles", "check", "no-such-profile"],
    "profiles check binary": ["profiles", "check", "{tmp}/binary.json"],
    "profiles import-vidur missing": ["profiles", "import-vidur", "{tmp}/nope"],
    "profiles import-vidur file": ["profiles", "import-vidur", "{tmp}/afile"],
    "profiles import-vidur --out-dir file": [
        *["profiles", "import-vidur", "{tmp}/adir", "--out-dir", "{tmp}/afile"]
    ],
    "profiles no subcommand": ["profiles"],
    "report missing dir": ["report", "{tmp}/nope"],
    "report a file": ["report", "{tmp}/afile"],
    "report --out under a file": ["report", "{tmp}/adir", "--out", "{tmp}/afile/r.html"],
    "models unknown flag": ["models", "--bogus"],
    "no command": [],
    "unknown command": ["deploy"],
}

# --- spec keys: one bad value in a good file ---------------------------------------------
CLUSTER_CASES: dict[str, tuple[str, Any]] = {
    "num_nodes 0": ("num_nodes", 0),
    "num_nodes -1": ("num_nodes", -1),
    "num_nodes 1e9": ("num_nodes", 10**9),
    "num_nodes 2e8 (typo)": ("num_nodes", 200_000_000),
    "num_nodes float": ("num_nodes", 1.5),
    "num_nodes string": ("num_nodes", "8"),
    "num_nodes nan": ("num_nodes", NAN),
    "num_nodes bool": ("num_nodes", True),
    "gpus_per_node 0": ("gpus_per_node", 0),
    "gpus_per_node -8": ("gpus_per_node", -8),
    "gpus_per_node huge": ("gpus_per_node", 10**7),
    "price -1": ("price_per_gpu_hour", -1.0),
    "price nan": ("price_per_gpu_hour", NAN),
    "price inf": ("price_per_gpu_hour", INF),
    "price string": ("price_per_gpu_hour", "cheap"),
    "memory_gib 0": ("memory_gib", 0),
    "memory_gib nan": ("memory_gib", NAN),
    "memory_gib inf": ("memory_gib", INF),
    "memory_gib -80": ("memory_gib", -80),
    "gpu unknown": ("gpu", "h900"),
    "gpu empty": ("gpu", ""),
    "gpu int": ("gpu", 100),
    "unknown key": ("num_gpus", 16),
    "cores_per_node on a GPU pool": ("cores_per_node", 4),
}

WORKLOAD_CASES: dict[str, tuple[tuple[str, ...], Any]] = {
    "temperature nan": (("rl", "temperature"), NAN),
    "temperature inf": (("rl", "temperature"), INF),
    "temperature -inf": (("rl", "temperature"), -INF),
    "lr nan": (("rl", "lr"), NAN),
    "lr string": (("rl", "lr"), "fast"),
    "kl_coef inf": (("rl", "kl_coef"), INF),
    "rl unknown key": (("rl", "learning_rate"), 0.1),
    "prompts_per_step 0": (("batch", "prompts_per_step"), 0),
    "prompts_per_step -1": (("batch", "prompts_per_step"), -1),
    "prompts_per_step float": (("batch", "prompts_per_step"), 2.5),
    "prompts_per_step nan": (("batch", "prompts_per_step"), NAN),
    "samples_per_prompt 0": (("batch", "samples_per_prompt"), 0),
    "prompt_len 0": (("batch", "prompt_len"), 0),
    "response_len -16": (("batch", "response_len"), -16),
    "response_len string": (("batch", "response_len"), "long"),
    "response_len_sigma nan": (("batch", "response_len_sigma"), NAN),
    "ppo_epochs 0": (("batch", "ppo_epochs"), 0),
    "mini_batches 0": (("batch", "mini_batches"), 0),
    "batch unknown key": (("batch", "tokens"), 5),
    "algorithm unknown": (("algorithm",), "dpo"),
    "algorithm empty": (("algorithm",), ""),
    "algorithm int": (("algorithm",), 3),
    "actor model unknown": (("models", "actor"), "gpt-5"),
    "unknown role": (("models", "judge"), "tiny-llama"),
    "models not a table": (("models",), "tiny-llama"),
    "batch not a table": (("batch",), 16),
    "async not a bool": (("async_one_step_off",), "yes"),
    "data train missing": (("data", "train"), "nope.jsonl"),
    "data train wrong suffix": (("data", "train"), "afile"),
    "data unknown key": (("data", "path"), "x.jsonl"),
    "data epochs 0": (("data", "epochs"), 0),
    "reward_workers -1": (("reward_workers",), -1),
    "model path missing": (("models", "actor"), "models/none/config.json"),
    "unknown top-level key": (("steps",), 3),
}

PLAN_CASES: dict[str, tuple[tuple[str | int, ...], Any]] = {
    "num_devices 0": (("sets", 0, "num_devices"), 0),
    "num_devices -4": (("sets", 0, "num_devices"), -4),
    "num_devices 1e6": (("sets", 0, "num_devices"), 10**6),
    "first_device -1": (("sets", 0, "first_device"), -1),
    "pool unknown": (("sets", 0, "pool"), "tpu"),
    "roles unknown": (("sets", 0, "roles"), ["actor", "judge"]),
    "roles empty": (("sets", 0, "roles"), []),
    "sets empty": (("sets",), []),
    "t 0": (("parallelism", "actor", "t"), 0),
    "t 3": (("parallelism", "actor", "t"), 3),
    "d -2": (("parallelism", "actor", "d"), -2),
    "micro_batch 0": (("parallelism", "actor", "micro_batch"), 0),
    "micro_batch nan": (("parallelism", "actor", "micro_batch"), NAN),
    "parallelism unknown key": (("parallelism", "actor", "sp"), 2),
    "workload missing file": (("workload",), "nope.toml"),
    "cluster missing file": (("cluster",), "nope.toml"),
    "name not a string": (("name",), 5),
}


AS_ROOT = pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")


def _with(base: dict[str, Any], path: tuple[str | int, ...], value: Any) -> dict[str, Any]:
    import copy

    doc = copy.deepcopy(base)
    node: Any = doc
    for key in path[:-1]:
        node = node.setdefault(key, {}) if isinstance(key, str) else node[key]
    node[path[-1]] = value
    return doc


def _cases() -> list[Any]:
    cases = []
    for name, (base, values) in NUMBER_FLAGS.items():
        flag = name.split()[1]
        for v in values:
            cases.append(pytest.param([*base, flag, v], None, id=f"{name} {v!r}"))
    for name, argv in PATH_CASES.items():
        marks = [AS_ROOT] if "read-only" in name else []
        cases.append(pytest.param(argv, None, id=name, marks=marks))
    for name, (key, value) in CLUSTER_CASES.items():
        doc = _with(CLUSTER, ("pools", 0, key), value)
        argv = ["plan", "--cluster", "{tmp}/spec.toml", "--workload"]
        argv.append("{ex}/workloads/ppo-llama2-7b.toml")
        cases.append(pytest.param(argv, doc, id=f"cluster {name}"))
    cases.append(pytest.param(argv, {"name": "c", "pools": []}, id="cluster no pools"))
    for name, (path, value) in WORKLOAD_CASES.items():
        doc = _with(WORKLOAD, path, value)
        argv = ["plan", "--cluster", "{ex}/clusters/h100x16.toml", "--workload", "{tmp}/spec.toml"]
        cases.append(pytest.param(argv, doc, id=f"workload {name}"))
    for name, (path, value) in PLAN_CASES.items():
        doc = _with(PLAN, path, value)
        cases.append(pytest.param(["simulate", "{tmp}/spec.toml"], doc, id=f"plan {name}"))
    return cases


def _data_plan(train: str, **data: Any) -> dict[str, Any]:
    """A plan whose inline workload reads `train` (relative to the plan's folder)."""
    return {**PLAN, "workload": {**WORKLOAD, "data": {"train": train, **data}}}


def _snapshot(root: Path) -> dict[str, tuple[int, int]]:
    return {
        str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in sorted(root.rglob("*"))
    }


@pytest.fixture
def workspace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder with the files the cases name, as the current directory."""
    (tmp_path / "afile").write_text("a file, not a folder\n")
    (tmp_path / "adir").mkdir()
    (tmp_path / "binary.toml").write_bytes(bytes(range(256)))
    (tmp_path / "binary.json").write_bytes(bytes(range(256)))
    (tmp_path / "latin1.toml").write_bytes('name = "caf\xe9"\n'.encode("latin-1"))
    (tmp_path / "empty.toml").write_text("")
    (tmp_path / "garbage.toml").write_text("[[[ = nope\n")
    for name, doc in {
        "longname.toml": {**PLAN, "name": "x" * 5000},
        "dotsname.toml": {**PLAN, "name": "../.."},
        "badreward.toml": {**PLAN, "workload": {**WORKLOAD, "reward_function": "nope"}},
        "rewardfile.toml": {**PLAN, "workload": {**WORKLOAD, "reward_function": "no.py:f"}},
        "brokenreward.toml": {**PLAN, "workload": {**WORKLOAD, "reward_function": "broken.py:f"}},
        "baddata.toml": _data_plan("bad.jsonl"),
        "emptydata.toml": _data_plan("empty.jsonl"),
        "epochs.toml": _data_plan("good.jsonl", epochs=1),
        "chat.toml": _data_plan("good.jsonl", chat_template=True),
    }.items():
        (tmp_path / name).write_text(tomli_w.dumps(doc))
    (tmp_path / "broken.py").write_text("def f(:\n")
    (tmp_path / "bad.jsonl").write_text('{"prompt": "1+1="}\n')
    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "good.jsonl").write_text('{"prompt": "1+1=", "answer": "2"}\n' * 20)
    readonly = tmp_path / "readonly"
    readonly.mkdir()
    readonly.chmod(0o555)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PLACEFLOW_PROFILE_DIR", str(tmp_path / "profiles"))
    return tmp_path


@pytest.mark.parametrize(("argv", "spec"), _cases())
def test_bad_input_is_one_line_exit_2_nothing_written(
    workspace: Path, capsys: pytest.CaptureFixture[str], argv: list[str], spec: Any
) -> None:
    if spec is not None:
        (workspace / "spec.toml").write_text(tomli_w.dumps(spec))
    argv = [a.replace("{tmp}", str(workspace)).replace("{ex}", str(EXAMPLES)) for a in argv]
    before = _snapshot(workspace)
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("placeflow: error:"), err
    assert _snapshot(workspace) == before


def test_there_are_at_least_100_cases() -> None:
    assert len(_cases()) >= 100


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has GPUs")
def test_gpu_plan_on_a_cpu_machine_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", str(EXAMPLES / "plans" / "ppo-7b-split-h100x16.toml")]) == 2
    err = capsys.readouterr().err
    assert "needs 16 h100-sxm devices; this machine has none; use --rehearse" in err


@pytest.mark.parametrize(
    ("name", "expected"),
    [("../../../tmp/x", "tmp-x"), ("a/b", "a-b"), ("ppo 7b", "ppo-7b"), ("ok-1.2", "ok-1.2")],
)
def test_names_used_as_paths_stay_one_component(name: str, expected: str) -> None:
    assert safe_name(name) == expected


@pytest.mark.parametrize("name", ["", "..", "/", "x" * 5000])
def test_unusable_names_are_rejected(name: str) -> None:
    with pytest.raises(SpecError):
        safe_name(name)
