"""Build the shipped GPU profiles `h100-sxm` and `a100-80gb` from Vidur's CSVs and datasheets.

Each profile is Vidur's measurements for that GPU (`placeflow.profiles.vidur`),
completed with roofline entries for what Vidur did not measure
(`placeflow.profiles.datasheet`). One departure: Vidur's A100 inter-node
collectives are left out of `a100-80gb`. They were measured on a fabric of about
6-8 GB/s per GPU, while the profile models HybridFlow's A100 testbed (200 Gb/s,
25 GB/s between nodes); mixing the two would give one profile two networks.
The H100 inter-node send/recv (about 36 GB/s, 72 % of a 400 Gb/s NDR link) is
kept and sets the H100's inter-node efficiency.

Measured entries come first. A profile measured on the GPU itself with
`placeflow profile --device cuda` (the H100 files of issue 20) is laid over
the imported one (`overlay_measured`): where an op (an elementwise kind, a copy
direction, a collective series) has measured entries, its imported and
datasheet entries are dropped, so one series never mixes sources and the
roofline of an op is fitted to one machine's numbers. Imported and datasheet
entries remain only where nothing was measured (on one GPU: the collectives).
The measurement's provenance is kept in the profile's `grid["measured"]`, and a
rebuild without new measured files keeps the measured entries the shipped file
already has, so `placeflow profiles import-vidur` never drops a measurement.

`save_gpu_profiles` writes the files that ship in `profiles/data/`; the CLI's
`placeflow profiles import-vidur DIR` calls `build_gpu_profiles`. Shipping new
measured files: `python -m placeflow.profiles.build_gpu_profiles VIDUR_DIR
--measured h100-sxm=FILE [--measured h100-sxm=FILE ...]`.
"""

from __future__ import annotations

import argparse
import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from placeflow.profiles import ops
from placeflow.profiles.datasheet import (
    A100_80GB_SXM,
    H100_SXM,
    DatasheetFigures,
    complete_with_datasheet,
)
from placeflow.profiles.schema import (
    REQUIRED_OPS,
    DispatchKind,
    Entry,
    Op,
    Profile,
    Source,
    load_profile_file,
    save_profile,
)
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


@dataclass(frozen=True, kw_only=True)
class MeasuredSet:
    """Entries measured on the GPU itself, deduplicated, and where they were measured.

    `provenance` is a JSON-ready record: the files, device, torch version,
    dtype, dates, host and the profiler's notes.
    """

    entries: tuple[Entry, ...]
    provenance: Mapping[str, Any] = field(hash=False)


def measured_from_files(paths: Sequence[Path]) -> MeasuredSet:
    """The measured entries of `placeflow profile` files; a point in several files is kept
    once, from the first file that has it (the files are the same grid's runs)."""
    profiles = [load_profile_file(p) for p in paths]
    entries: dict[object, Entry] = {}
    for path, profile in zip(paths, profiles, strict=True):
        if profile.device_kind != "cuda":
            raise ValueError(f"{path}: a {profile.device_kind} profile; GPU profiles need cuda")
        for e in profile.entries:
            if e.source is Source.MEASURED:
                entries.setdefault(e.key(), e)
    if not entries:
        raise ValueError(f"{', '.join(map(str, paths))}: no measured entries")
    first = profiles[0].provenance
    return MeasuredSet(
        entries=tuple(entries.values()),
        provenance={
            "files": [Path(p).name for p in paths],
            "device_name": first.device_name,
            "torch_version": first.torch_version,
            "dtype": first.dtype,
            "dates": [p.provenance.date for p in profiles],
            "host": dict(first.host),
            "notes": first.notes,
        },
    )


def measured_from_shipped(profile: Profile) -> MeasuredSet | None:
    """The measured entries a shipped profile already has (None if it has none)."""
    entries = tuple(e for e in profile.entries if e.source is Source.MEASURED)
    if not entries:
        return None
    return MeasuredSet(entries=entries, provenance=dict(profile.grid.get("measured", {})))


def _coverage(e: Entry) -> tuple[object, ...]:
    """What one measured entry stands for: a collective series, else its op and kind."""
    if e.op is Op.COLLECTIVE:
        return (e.op, ops.series_key(e.op, e.params))
    return (e.op, e.params.get("kind", e.params.get("direction")))


def overlay_measured(base: Profile, measured: MeasuredSet) -> Profile:
    """`base` with `measured` laid over it: measured wins wherever it has entries.

    An imported or datasheet entry is kept only if no measured entry covers it
    (same op and kind or direction; for collectives the same series).
    """
    covered = {_coverage(e) for e in measured.entries}
    kept = [e for e in base.entries if _coverage(e) not in covered]
    entries = sorted((*measured.entries, *kept), key=entry_sort_key)
    mp = measured.provenance
    dropped = len(base.entries) - len(kept)
    notes = (
        f"Measured entries ({len(measured.entries)}, source=measured) from "
        f"{', '.join(mp.get('files', []))} on {mp.get('device_name', '?')} "
        f"(torch {mp.get('torch_version', '?')}, {mp.get('dtype', '?')}, "
        f"{', '.join(mp.get('dates', []))}); they replace the {dropped} imported or "
        "datasheet entries of the ops they cover, which remain only where nothing was measured. "
        + base.provenance.notes
    )
    prov = replace(
        base.provenance,
        source=Source.MIXED,
        device_name=f"{mp.get('device_name', '?')} (measured) + {base.provenance.device_name}",
        torch_version=str(mp.get("torch_version", base.provenance.torch_version)),
        dtype=str(mp.get("dtype", base.provenance.dtype)),
        notes=notes,
    )
    return replace(
        base,
        provenance=prov,
        entries=tuple(entries),
        grid={**dict(base.grid), "measured": dict(mp)},
    )


def with_host_dispatch(profile: Profile, host: Profile) -> Profile:
    """`profile` plus `host`'s per-call dispatch entries (Ray round trips), as imported.

    A Ray call is host work: neither Vidur nor a datasheet has it, and the GPU
    hosts were not measured, so the `cpu` profile's measurement stands in for one
    call's round trip (kind `ray_call`). The driver's serial share of a call to many
    ranks (kinds `ray_launch`, `ray_get`) is not imported: it grows with the ranks, and
    a GPU cluster's head node, whose CPU runs the driver, was never measured here, so
    GPU estimates leave it out rather than price 1,024 launches at this CPU's speed.
    """
    dispatch = tuple(
        replace(e, source=Source.IMPORTED)
        for e in host.entries
        if e.op is Op.DISPATCH and e.params["kind"] == DispatchKind.RAY_CALL.value
    )
    assert dispatch, f"profile {host.name!r} has no dispatch entries to import"
    note = (
        f" Dispatch entries (Ray call round trips, {len(dispatch)}) imported from the "
        f"{host.name!r} profile, measured on its host ({host.provenance.device_name}): "
        "the GPU hosts' own were not measured."
    )
    return replace(
        profile,
        entries=(*profile.entries, *dispatch),
        provenance=replace(profile.provenance, notes=profile.provenance.notes + note),
    )


def build_profile(
    vidur_dir: Path,
    recipe: GpuProfileRecipe,
    *,
    import_date: str,
    measured: MeasuredSet | None = None,
) -> Profile:
    imported = import_vidur(
        vidur_dir, recipe.vidur_gpu, inter_node=recipe.inter_node, import_date=import_date
    )
    if not recipe.inter_node:
        notes = imported.provenance.notes + _A100_INTER_NOTE
        imported = replace(imported, provenance=replace(imported.provenance, notes=notes))
    completed = complete_with_datasheet(imported, recipe.figures)
    completed = with_host_dispatch(completed, load_profile_file(SHIPPED_DATA_DIR / "cpu.json"))
    missing = [op.value for op in REQUIRED_OPS if not completed.entries_for(op)]
    assert not missing, f"{recipe.name}: no entries for {missing}"
    built = replace(
        completed, name=recipe.name, entries=tuple(sorted(completed.entries, key=entry_sort_key))
    )
    return built if measured is None else overlay_measured(built, measured)


def shipped_measured(name: str) -> MeasuredSet | None:
    """The measured entries of the shipped profile `name` (None if none or no file)."""
    path = SHIPPED_DATA_DIR / f"{name}.json"
    return measured_from_shipped(load_profile_file(path)) if path.exists() else None


def build_gpu_profiles(
    vidur_dir: Path,
    *,
    import_date: str | None = None,
    measured: Mapping[str, MeasuredSet] | None = None,
) -> dict[str, Profile]:
    """{"h100-sxm": ..., "a100-80gb": ...} from Vidur's data folder (its `compute/`, `network/`).

    `measured` by profile name; a name it lacks keeps the shipped file's measured entries.
    """
    date = import_date or dt.date.today().isoformat()
    given = measured or {}
    return {
        r.name: build_profile(
            vidur_dir, r, import_date=date, measured=given.get(r.name) or shipped_measured(r.name)
        )
        for r in RECIPES
    }


def save_gpu_profiles(
    vidur_dir: Path,
    out_dir: Path = SHIPPED_DATA_DIR,
    *,
    import_date: str | None = None,
    measured: Mapping[str, MeasuredSet] | None = None,
) -> dict[str, Path]:
    """Build both profiles and write them as `<out_dir>/<name>.json`."""
    profiles = build_gpu_profiles(vidur_dir, import_date=import_date, measured=measured)
    return {name: save_profile(p, out_dir / f"{name}.json") for name, p in profiles.items()}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("vidur_dir", type=Path, help="Vidur's data folder (compute/, network/)")
    parser.add_argument(
        "--measured",
        action="append",
        default=[],
        metavar="NAME=FILE",
        help="a `placeflow profile --device cuda` file for the shipped profile NAME (repeatable)",
    )
    parser.add_argument("--import-date", default=None, help="date recorded for the import")
    parser.add_argument("--out-dir", type=Path, default=SHIPPED_DATA_DIR)
    args = parser.parse_args(argv)
    files: dict[str, list[Path]] = {}
    names = {r.name for r in RECIPES}
    for item in args.measured:
        name, sep, path = item.partition("=")
        if not sep or name not in names:
            parser.error(f"--measured {item!r}: give NAME=FILE with NAME one of {sorted(names)}")
        files.setdefault(name, []).append(Path(path))
    measured = {name: measured_from_files(paths) for name, paths in files.items()}
    written = save_gpu_profiles(
        args.vidur_dir, args.out_dir, import_date=args.import_date, measured=measured
    )
    for name, path in written.items():
        print(f"wrote {name} to {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
