"""Faults in a run directory: damaged checkpoints and manifests, two runs in one directory.

Oracles: `verify` names the damaged file for each kind of damage (no Ray needed);
a run whose newest checkpoint is damaged resumes from the previous good one and
ends with the same metrics as a run that never stopped (nothing lost, nothing
doubled); a garbage run manifest is a one-line SpecError that leaves the metrics
as they were; of two runs started into one directory, exactly one proceeds.
"""

from __future__ import annotations

import json
import shutil
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from placeflow.errors import SpecError
from placeflow.executor.checkpoints import RunLock, newest_verified, seal, verify
from placeflow.fsio import atomic_write_text
from placeflow.plan import load_plan

PLANS = Path(__file__).resolve().parents[1] / "examples" / "plans"
TIMING = ("step_time_s", "tokens_per_s")
CLOCKED_PREFIXES = ("timing_s/", "perf/")  # verl's phase seconds, throughput per GPU


def _fake_checkpoint(run_dir: Path, step: int) -> Path:
    d = run_dir / "checkpoints" / f"step-{step:06d}"
    d.mkdir(parents=True)
    for r in range(2):
        (d / f"actor-rank{r}.pt").write_bytes(bytes([step, r]) * 1000)
    seal(d, step)
    return d


def _truncate(d: Path) -> str:
    p = d / "actor-rank0.pt"
    p.write_bytes(p.read_bytes()[:100])
    return "actor-rank0.pt"


def _empty(d: Path) -> str:
    (d / "actor-rank1.pt").write_bytes(b"")
    return "actor-rank1.pt"


def _delete(d: Path) -> str:
    (d / "actor-rank1.pt").unlink()
    return "actor-rank1.pt"


def _garbage_manifest(d: Path) -> str:
    (d / "manifest.json").write_bytes(b"\x00\xff{not json")
    return "manifest.json"


def _no_manifest(d: Path) -> str:
    (d / "manifest.json").unlink()
    return "manifest.json"


def _garbage_state(d: Path) -> str:
    (d / "state.json").write_text("{{{")
    return "state.json"


def _manifest_without_hashes(d: Path) -> str:
    (d / "manifest.json").write_text('{"step": 2, "sha256": {}}')
    return "manifest.json"


FAULTS: dict[str, Callable[[Path], str]] = {
    "truncated": _truncate,
    "empty": _empty,
    "missing": _delete,
    "garbage-manifest": _garbage_manifest,
    "no-manifest": _no_manifest,
    "garbage-state": _garbage_state,
    "manifest-without-hashes": _manifest_without_hashes,
}


def test_a_sealed_checkpoint_verifies(tmp_path: Path) -> None:
    d = _fake_checkpoint(tmp_path, 3)
    assert verify(d, 3) is None
    assert json.loads((d / "manifest.json").read_text())["step"] == 3
    assert verify(d, 4) is not None  # the folder's step is checked against state.json


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_a_damaged_newest_checkpoint_is_skipped_naming_the_file(tmp_path: Path, fault: str) -> None:
    _fake_checkpoint(tmp_path, 1)
    newest = _fake_checkpoint(tmp_path, 2)
    damaged = FAULTS[fault](newest)
    chosen, skipped = newest_verified(tmp_path)
    assert chosen is not None and chosen[0] == 1
    assert [s.directory for s in skipped] == [newest]
    assert damaged in skipped[0].reason


def test_no_checkpoint_verifies(tmp_path: Path) -> None:
    _truncate(_fake_checkpoint(tmp_path, 0))
    (tmp_path / "checkpoints" / "step-junk").mkdir()  # not a checkpoint folder: ignored
    chosen, skipped = newest_verified(tmp_path)
    assert chosen is None and len(skipped) == 1


def test_atomic_write_leaves_no_temporary_file(tmp_path: Path) -> None:
    atomic_write_text(tmp_path / "a.json", "1")
    atomic_write_text(tmp_path / "a.json", "2")
    assert [p.name for p in tmp_path.iterdir()] == ["a.json"]
    assert (tmp_path / "a.json").read_text() == "2"


def test_the_run_lock_admits_one_holder(tmp_path: Path) -> None:
    with (
        RunLock(tmp_path),
        pytest.raises(SpecError, match="in use by another run"),
        RunLock(tmp_path),
    ):
        pass
    with RunLock(tmp_path):  # released: the next run may take it
        pass


# --- with Ray: a real run, damaged, resumed ------------------------------------------


def _deterministic(metrics: list[dict]) -> list[dict]:
    """Metrics without the wall-clock fields (times, phase seconds under placeflow's and
    verl's names, throughput, the step's timeline)."""
    clocked = (*TIMING, "phases", "timeline")
    return [
        {k: v for k, v in m.items() if k not in clocked and not k.startswith(CLOCKED_PREFIXES)}
        for m in metrics
    ]


@pytest.fixture(scope="module")
def three_step_run(ray_session: None, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 3-step run with a checkpoint after every step (steps 0, 1, 2)."""
    from placeflow.executor.run import RunConfig, run_plan

    run_dir = tmp_path_factory.mktemp("faults") / "run"
    plan = load_plan(PLANS / "grpo-tiny-cpu4-colocate.toml")
    run_plan(plan, run_dir, RunConfig(steps=3, checkpoint_every=1, progress=False))
    return run_dir


def test_damaged_newest_checkpoint_resumes_from_the_previous_one(
    ray_cluster: None, three_step_run: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from placeflow.executor.run import RunConfig, read_metrics, run_plan

    run_dir = tmp_path / "run"
    shutil.copytree(three_step_run, run_dir)
    _truncate(run_dir / "checkpoints" / "step-000002")
    plan = load_plan(run_dir / "plan.toml")
    result = run_plan(plan, run_dir, RunConfig(steps=3, resume=True, progress=False))
    assert result.first_step == 2
    assert [s.directory.name for s in result.skipped] == ["step-000002"]
    assert "actor-rank0.pt" in caplog.text
    assert _deterministic(read_metrics(run_dir)) == _deterministic(read_metrics(three_step_run))


def test_garbage_run_manifest_is_one_line_and_keeps_metrics(
    ray_cluster: None, three_step_run: Path, tmp_path: Path
) -> None:
    from placeflow.executor.run import RunConfig, run_plan

    run_dir = tmp_path / "run"
    shutil.copytree(three_step_run, run_dir)
    (run_dir / "manifest.json").write_bytes(b"\x89PNG garbage")
    before = (run_dir / "metrics.jsonl").read_bytes()
    plan = load_plan(run_dir / "plan.toml")
    with pytest.raises(SpecError, match=r"manifest\.json: not valid JSON") as err:
        run_plan(plan, run_dir, RunConfig(steps=3, resume=True, progress=False))
    assert "\n" not in str(err.value)
    assert (run_dir / "metrics.jsonl").read_bytes() == before


def test_two_runs_into_one_directory_exactly_one_proceeds(
    ray_cluster: None, tmp_path: Path
) -> None:
    from placeflow.executor.loop import RLLoop, StepRecord
    from placeflow.executor.run import RunConfig, read_metrics, run_plan

    plan = load_plan(PLANS / "grpo-tiny-cpu4-colocate.toml")
    running, second_done = threading.Event(), threading.Event()
    outcome: dict[str, object] = {}

    def wait_for_second(loop: RLLoop, rec: StepRecord) -> None:
        running.set()
        assert second_done.wait(timeout=120)

    def first() -> None:
        cfg = RunConfig(steps=1, progress=False)
        outcome["first"] = run_plan(plan, tmp_path, cfg, after_step=wait_for_second)

    thread = threading.Thread(target=first)
    thread.start()
    try:
        assert running.wait(timeout=300)
        with pytest.raises(SpecError, match="in use by another run"):
            run_plan(plan, tmp_path, RunConfig(steps=1, progress=False))
        with pytest.raises(SpecError, match="in use by another run"):
            run_plan(plan, tmp_path, RunConfig(steps=2, resume=True, progress=False))
    finally:
        second_done.set()
        thread.join()
    assert "first" in outcome
    assert [m["step"] for m in read_metrics(tmp_path)] == [0]
