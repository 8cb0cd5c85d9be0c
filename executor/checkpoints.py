"""Checkpoints that verify, and the lock that keeps one run per run directory.

A checkpoint directory `checkpoints/step-N/` holds one file per trained role and
rank (written by the workers), `state.json` (the step), and `manifest.json`, the
sha256 of every other file, written last and atomically. A directory is a
checkpoint only when its manifest parses and every hash matches: a truncated,
emptied or missing file, or a crash before the manifest, makes it fail
verification with a reason that names the file. `--resume` walks the
checkpoints newest first and takes the first that verifies, reporting the ones
it skipped; nothing in the run directory changes before that choice is made.

`RunLock` holds an exclusive `fcntl.flock` on `run_dir/.lock` for the whole run,
so a second run started into the same directory fails at once instead of mixing
its steps into the first one's metrics. The kernel drops the lock when the
process dies, so a killed run never leaves a stale lock behind.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from placeflow.errors import SpecError
from placeflow.fsio import atomic_write_text, fsync_dir

MANIFEST = "manifest.json"
STATE = "state.json"
_STEP_DIR = re.compile(r"^step-(\d+)$")


def read_json(path: Path) -> Any:
    """Parse a JSON file; a missing, unreadable or malformed one is a SpecError naming it."""
    try:
        return json.loads(path.read_bytes().decode("utf-8"))
    except FileNotFoundError:
        raise SpecError(f"{path}: file not found") from None
    except OSError as exc:
        raise SpecError(f"{path}: cannot read ({exc.strerror})") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SpecError(f"{path}: not valid JSON ({exc})") from None


def sha256_file(path: Path) -> str:
    """Content hash of `path`; the file is also fsynced, as the workers' writes are not."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
        os.fsync(f.fileno())
    return digest.hexdigest()


def seal(directory: Path, step: int) -> None:
    """Finish a checkpoint the workers have written: state.json, then the manifest, last."""
    atomic_write_text(directory / STATE, json.dumps({"step": step}) + "\n")
    files = sorted(p for p in directory.iterdir() if p.is_file() and p.name != MANIFEST)
    hashes = {p.name: sha256_file(p) for p in files if not p.name.startswith(".")}
    atomic_write_text(
        directory / MANIFEST, json.dumps({"step": step, "sha256": hashes}, indent=1) + "\n"
    )
    fsync_dir(directory.parent)


@dataclass(frozen=True)
class Skipped:
    """A checkpoint `--resume` did not take, and why (the reason names the file)."""

    directory: Path
    reason: str


def verify(directory: Path, step: int) -> str | None:
    """None when the checkpoint of `step` in `directory` is whole, else why it is not."""
    manifest_path = directory / MANIFEST
    if not manifest_path.is_file():
        return f"{manifest_path} is missing (the checkpoint was not finished)"
    try:
        manifest = read_json(manifest_path)
    except SpecError as exc:
        return str(exc)
    hashes = manifest.get("sha256") if isinstance(manifest, dict) else None
    if not isinstance(hashes, dict) or STATE not in hashes or len(hashes) < 2:
        return f"{manifest_path}: no file hashes (expected state.json and the rank files)"
    for name, expected in sorted(hashes.items()):
        path = directory / str(name)
        if not path.is_file():
            return f"{path} is missing"
        if sha256_file(path) != expected:
            return f"{path} does not match its hash in {MANIFEST} (truncated or changed)"
    try:
        state = read_json(directory / STATE)
        if int(state["step"]) != step:
            return f"{directory / STATE} says step {state['step']}, the folder step {step}"
    except (SpecError, TypeError, KeyError, ValueError) as exc:
        return f"{directory / STATE}: unreadable step ({exc})"
    return None


def step_dirs(run_dir: Path) -> list[tuple[int, Path]]:
    """(step, directory) of every `checkpoints/step-N` folder, newest first."""
    root = run_dir / "checkpoints"
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), d) for d in root.iterdir() if (m := _STEP_DIR.match(d.name))]
    return sorted(found, reverse=True)


def newest_verified(run_dir: Path) -> tuple[tuple[int, Path] | None, list[Skipped]]:
    """The newest checkpoint that verifies (or None), and the newer ones skipped, with why."""
    skipped: list[Skipped] = []
    for step, directory in step_dirs(run_dir):
        reason = verify(directory, step)
        if reason is None:
            return (step, directory), skipped
        skipped.append(Skipped(directory, reason))
    return None, skipped


class RunLock:
    """An exclusive lock on a run directory for as long as a run uses it."""

    def __init__(self, run_dir: Path) -> None:
        self.path = run_dir / ".lock"
        self._fd: int | None = None

    def __enter__(self) -> RunLock:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 64).decode(errors="replace").strip() or "another process"
            os.close(fd)
            raise SpecError(
                f"{self.path.parent} is in use by another run (pid {holder}); wait for it "
                "to finish or choose another --run-dir"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._fd is not None
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)
        self._fd = None
