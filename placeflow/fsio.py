"""Files a user names and files placeflow writes: checked early, written atomically.

Three habits, one place:
- `atomic_write_text` / `atomic_write_bytes`: write a temporary name in the same
  directory, fsync, rename over the target, fsync the directory. A reader sees the
  old file or the new one, never half of one, even after a crash or power loss.
- `check_output_path` / `check_output_dir`: an output path is checked before the
  work that produces it (a parent that is a file, a folder that is not writable, a
  name too long), so that a 76-second profile is not lost to a typo.
- `safe_name`: a name from a spec (a plan name) used as one path component cannot
  climb out of its folder (`../../tmp/x`) or exceed the file system's name limit.
"""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
from pathlib import Path

from placeflow.errors import SpecError

NAME_MAX_BYTES = 255  # one path component on ext4, xfs, btrfs, APFS
_UNSAFE = re.compile(r"[^A-Za-z0-9._+-]+")


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_bytes(path: str | Path, data: bytes) -> Path:
    """Write `data` to `path` atomically (temporary name, fsync, rename, fsync the folder)."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name[:64]}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)
    return path


def atomic_write_text(path: str | Path, text: str) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"))


def safe_name(name: str, *, what: str = "name") -> str:
    """`name` as one path component: separators and other unsafe characters become '-'.

    A name that is empty after that, or longer than NAME_MAX_BYTES, is a SpecError.
    """
    cleaned = _UNSAFE.sub("-", name).strip(".-")
    if not cleaned:
        raise SpecError(f"{what} {name!r} has no characters usable in a file name; use letters")
    if len(cleaned.encode()) > NAME_MAX_BYTES - 16:  # room for suffixes such as `.toml`
        raise SpecError(
            f"{what} is {len(cleaned)} characters long; at most {NAME_MAX_BYTES - 16} "
            "fit in a file name"
        )
    return cleaned


def _check_components(path: Path, flag: str) -> None:
    for part in path.parts:
        if len(part.encode()) > NAME_MAX_BYTES:
            raise SpecError(
                f"{flag} {str(path)[:60]}...: a path component is {len(part.encode())} bytes; "
                f"at most {NAME_MAX_BYTES} are allowed"
            )


def _existing_ancestor(path: Path) -> Path:
    """The nearest ancestor of `path` that exists; a file among them is a SpecError."""
    parent = path.parent if str(path.parent) else Path(".")
    for ancestor in (parent, *parent.parents):
        if ancestor.exists():
            return ancestor
    return Path(".")


def check_output_path(path: str | Path, flag: str) -> Path:
    """Check, before any work, that a file can be written at `path` (its folders may be made).

    Raises SpecError naming `flag` when the path is a folder, a parent is a file, a
    folder on the way is not writable, or a name is too long.
    """
    path = Path(path)
    _check_components(path, flag)
    if path.is_dir():
        raise SpecError(f"{flag} {path}: is a directory; give a file path")
    ancestor = _existing_ancestor(path)
    if not ancestor.is_dir():
        raise SpecError(f"{flag} {path}: {ancestor} is a file, not a directory")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise SpecError(f"{flag} {path}: directory {ancestor} is not writable")
    if path.exists() and not os.access(path, os.W_OK):
        raise SpecError(f"{flag} {path}: file exists and is not writable")
    return path


def check_output_dir(path: str | Path, flag: str) -> Path:
    """Check, before any work, that `path` is or can become a writable directory."""
    path = Path(path)
    _check_components(path, flag)
    if path.exists() and not path.is_dir():
        raise SpecError(f"{flag} {path}: is a file; give a directory (it is made if missing)")
    target = path if path.is_dir() else _existing_ancestor(path)
    if not target.is_dir():
        raise SpecError(f"{flag} {path}: {target} is a file, not a directory")
    if not os.access(target, os.W_OK | os.X_OK):
        raise SpecError(f"{flag} {path}: directory {target} is not writable")
    return path


def fallback_path(path: Path) -> Path:
    """Where to write when `path` failed at the end: the system temp folder, same name."""
    return Path(tempfile.gettempdir()) / f"placeflow-{os.getpid()}-{path.name[:100]}"
