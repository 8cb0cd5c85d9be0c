"""Finding profiles: the shipped ones in `data/`, the user's own, or a file path.

Shipped profiles live beside this module (`data/<name>.json`). Profiles a user
measures with `placeflow profile` go to the user profile directory
(`$PLACEFLOW_PROFILE_DIR`, else `~/.local/share/placeflow/profiles`), so that
`placeflow profiles list` shows them beside the shipped ones and clusters can
name them. A name that is a path to a `.json` file loads that file.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path

from placeflow.errors import ProfileSchemaError, UnknownNameError
from placeflow.profiles.costmodel import CostModel
from placeflow.profiles.schema import Profile, load_profile_file

SHIPPED_DIR = Path(__file__).resolve().parent / "data"
# The profile that prices host-side work of a GPU profile (the host optimizer step):
# measured on this project's development host, the only host profiled.
HOST_PROFILE = "cpu"


def user_profile_dir() -> Path:
    env = os.environ.get("PLACEFLOW_PROFILE_DIR")
    return Path(env) if env else Path.home() / ".local" / "share" / "placeflow" / "profiles"


@dataclass(frozen=True, kw_only=True)
class ProfileRef:
    """Where a profile file is and whether it shipped with placeflow."""

    name: str
    path: Path
    shipped: bool


def available_profiles() -> dict[str, ProfileRef]:
    """Profiles by name; a user profile of the same name as a shipped one wins."""
    refs: dict[str, ProfileRef] = {}
    for directory, shipped in ((SHIPPED_DIR, True), (user_profile_dir(), False)):
        if directory.is_dir():
            for path in sorted(directory.glob("*.json")):
                refs[path.stem] = ProfileRef(name=path.stem, path=path, shipped=shipped)
    return refs


def load_profile(name_or_path: str) -> Profile:
    """A profile by name (shipped or user) or by path to its JSON file."""
    refs = available_profiles()
    if name_or_path in refs:
        return load_profile_file(refs[name_or_path].path)
    path = Path(name_or_path)
    if path.suffix == ".json":
        if not path.exists():
            raise ProfileSchemaError(f"{path}: profile file not found")
        return load_profile_file(path)
    raise UnknownNameError("profile", name_or_path, list(refs) + ["<path to a profile .json>"])


def fitted_cost_model(name_or_path: str) -> CostModel:
    """Load and fit a profile once per process; later calls share the fit and its memo.

    Fitting takes about a second for a GPU profile, and the planner and the CLI
    ask for the same few profiles many times.
    """
    key = str(Path(name_or_path).resolve()) if name_or_path.endswith(".json") else name_or_path
    if key not in _FITTED:
        fitted = CostModel.fit(load_profile(name_or_path))
        if fitted.device_kind != "cpu":
            fitted = dataclasses.replace(fitted, host=fitted_cost_model(HOST_PROFILE))
        # Imported here: the sibling profiles' module builds on this registry.
        from placeflow.profiles.siblings import FIGURES_BY_PROFILE

        figures = FIGURES_BY_PROFILE.get(fitted.profile_name)
        if figures is not None:
            fitted = dataclasses.replace(fitted, fp8_gemm_speedup=figures.fp8_gemm_speedup)
        _FITTED[key] = fitted
    return _FITTED[key]


_FITTED: dict[str, CostModel] = {}
