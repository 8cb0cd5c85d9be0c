"""Build the shipped GPU profiles `h100-sxm` and `a100-80gb` from Vidur's CSVs and datasheets.

Each profile is Vidur's measurements for that GPU (`placeflow.profiles.vidur`),
completed with roofline entries for what Vidur did not measure
(`placeflow.profiles.datasheet`). One departure: Vidur's A100 inter-node
collectives are left out of `a100-80gb`. They were measured on a fabric of about
6-8 GB/s per GPU, while the profile models HybridFlow's A100 testbed (200 Gb/s,
25 GB/s between nodes); mixing the two would give one profile two networks.
The H100 inter-node send/recv (about 36 GB/s, 72 % of a 400 Gb/s NDR link) is
kept and sets the H100's inter-node efficiency.

`save_gpu_profiles` writes the files that ship in `profiles/data/`; the CLI's
`placeflow profiles import-vidur DIR` calls it.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, replace
from pathlib import Path

from placeflow.profiles import ops
from placeflow.profiles.datasheet import (
    A100_80GB_SXM,
    H100_SXM,
    DatasheetFigures,
    complete_with_datasheet,
)
from placeflow.profiles.schema import OP_PARAMS, Entry, Profile, save_profile
from placeflow.profiles.vidur import import_vidur

SHIPPED_DATA_DIR = Path(__file__).resolve().parent / "data"


@dataclass(frozen=True, kw_only=True)
class GpuProfileRecipe:
    """How one shipped profile is made: which Vidur GPU, which datasheet, which rows."""

    name: str
    vidur_gpu: str
    figures: DatasheetFigures
    inter_node: bool  # keep Vidur's inter-node collectives


RECIPES = (
    GpuProfileRecipe(name="h100-sxm", vidur_gpu="h100", figures=H100_SXM, inter_node=True),
    GpuProfileRecipe(name="a100-80gb", vidur_gpu="a100", figures=A100_80GB_SXM, inter_node=False),
)

_A100_INTER_NOTE = (
    " Vidur's A100 inter-node collectives (2-16 GPUs over 2 nodes, about 6-8 GB/s per GPU) are "
    "left out: this profile models HybridFlow's A100 testbed with 200 Gb/s between nodes."
)


def entry_sort_key(e: Entry) -> tuple[str, tuple[str, ...], float]:
    """File order: op, then series (numbers zero-padded to sort numerically), then size."""
    series = tuple(f"{v:020d}" if isinstance(v, int) else v for v in ops.series_key(e.op, e.params))
    return e.op.value, series, ops.size(e.op, e.params)


def build_profile(vidur_dir: Path, recipe: GpuProfileRecipe, *, import_date: str) -> Profile:
    imported = import_vidur(
        vidur_dir, recipe.vidur_gpu, inter_node=recipe.inter_node, import_date=import_date
    )
    if not recipe.inter_node:
        notes = imported.provenance.notes + _A100_INTER_NOTE
        imported = replace(imported, provenance=replace(imported.provenance, notes=notes))
    completed = complete_with_datasheet(imported, recipe.figures)
    missing = [op.value for op in OP_PARAMS if not completed.entries_for(op)]
    assert not missing, f"{recipe.name}: no entries for {missing}"
    return replace(
        completed, name=recipe.name, entries=tuple(sorted(completed.entries, key=entry_sort_key))
    )


def build_gpu_profiles(vidur_dir: Path, *, import_date: str | None = None) -> dict[str, Profile]:
    """{"h100-sxm": ..., "a100-80gb": ...} from Vidur's data folder (its `compute/`, `network/`)."""
    date = import_date or dt.date.today().isoformat()
    return {r.name: build_profile(vidur_dir, r, import_date=date) for r in RECIPES}


def save_gpu_profiles(vidur_dir: Path, out_dir: Path = SHIPPED_DATA_DIR) -> dict[str, Path]:
    """Build both profiles and write them as `<out_dir>/<name>.json`."""
    profiles = build_gpu_profiles(vidur_dir)
    return {name: save_profile(p, out_dir / f"{name}.json") for name, p in profiles.items()}
