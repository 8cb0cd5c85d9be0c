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


@pytest.mark.parametrize("columns", [None, "60", "100"])
def test_piped_tables_wrap_to_columns_and_cut_nothing(capsys, monkeypatch, columns):
    """Piped output (pytest captures it): every line within $COLUMNS when it is set, and
    no cell cut with an ellipsis; every model name and every parameter digit is there."""
    from placeflow.catalogue import CATALOGUE

    if columns is None:
        monkeypatch.delenv("COLUMNS", raising=False)
    else:
        monkeypatch.setenv("COLUMNS", columns)
    code, out, _ = run(capsys, "models")
    assert code == 0 and "…" not in out
    if columns is not None:
        assert max(len(line) for line in out.splitlines()) <= int(columns)
    # Rows from the cells: a row starts where the name cell is filled, and a folded cell
    # continues on the lines below it, in its column.
    rows: list[list[str]] = []
    for line in out.splitlines():
        if line.startswith("│"):
            cells = [c.strip() for c in line.split("│")[1:-1]]
            if cells[0]:
                rows.append(cells)
            else:
                rows[-1] = [a + b for a, b in zip(rows[-1], cells, strict=True)]
    assert [r[0] for r in rows] == list(CATALOGUE)
    llama = dict(zip(("name", "params", "layers", "hidden"), rows[0], strict=False))
    assert llama == {"name": "llama-2-7b", "params": "6.74B", "layers": "32", "hidden": "4096"}


def test_run_refuses_a_missing_logger_package(capsys, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda n, *a: None if n == "wandb" else real(n, *a)
    )
    code, _, err = run(
        capsys, "run", "examples/plans/grpo-tiny-cpu4-colocate.toml", "--logger", "wandb"
    )
    assert code == 2
    assert err.strip() == (
        "placeflow: error: --logger wandb: the 'wandb' package is not installed; "
        "pip install wandb, or leave wandb out"
    )
