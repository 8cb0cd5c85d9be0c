"""The CLI: one-line errors with a non-zero exit for bad input; listings work."""

import json

import pytest

from placeflow.cli import main


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_models_json_lists_the_catalogue(capsys):
    code, out, _ = run(capsys, "models", "--json")
    assert code == 0
    names = {row["name"] for row in json.loads(out)}
    assert {"llama-2-7b", "qwen2.5-72b", "smollm2-135m"} <= names


def test_profiles_list_shows_shipped_profiles(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("PLACEFLOW_PROFILE_DIR", str(tmp_path))
    code, out, _ = run(capsys, "profiles", "list", "--json")
    assert code == 0
    rows = {row["name"]: row for row in json.loads(out)}
    assert {"cpu", "h100-sxm", "a100-80gb"} <= set(rows)
    assert rows["cpu"]["source"] == "measured" and rows["cpu"]["shipped"]
    assert rows["h100-sxm"]["source"] == "mixed"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("profiles", "check", "no-such-profile"), "unknown profile 'no-such-profile'; known"),
        (("profiles", "check", "/nonexistent/p.json"), "profile file not found"),
        (("profiles", "import-vidur", "/nonexistent"), "not a directory"),
    ],
)
def test_bad_input_is_one_line_and_nonzero(capsys, argv, message):
    code, _, err = run(capsys, *argv)
    assert code == 2
    assert message in err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_profile_of_another_schema_version(capsys, tmp_path):
    bad = tmp_path / "old.json"
    bad.write_text(json.dumps({"schema": "placeflow-profile", "schema_version": 0}))
    code, _, err = run(capsys, "profiles", "check", str(bad))
    assert code == 2 and "schema version 0" in err


def test_simulate_writes_a_report(capsys, tmp_path):
    out = tmp_path / "r.html"
    code, _, err = run(
        capsys, "simulate", "examples/plans/grpo-tiny-cpu4-split.toml", "--report", str(out)
    )
    assert code == 0 and out.exists() and "wrote report" in err
    assert "grpo-tiny-cpu4-split" in out.read_text()
