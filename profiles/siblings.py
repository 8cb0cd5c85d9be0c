"""Datasheet profiles for GPUs nobody here measured, transferred from a measured sibling.

H800, H20, A800, B200 and GB200 run published RL post-training jobs, but
placeflow has no kernel measurements of them. Each gets a profile of
`datasheet` entries (`Source.DATASHEET`), one per entry of its *sibling*, the
GPU of the same architecture (H100 for the Hopper parts, A100 for the A800) or,
for Blackwell, the newest architecture measured (H100). An entry keeps the
sibling's fixed cost and scales the rest of the sibling's time by how much
faster the new GPU's bound resource is:

    t_new = t0 + (t_sib - t0) * R_new / R_sib

R is the roofline time on the vendor figures, max(F / peak, B / HBM) for
compute ops (GEMMs, attention, elementwise, optimizer), bytes over NVLink or
over the NIC for collectives within or across nodes, bytes over the host link
for copies (a Ray call's dispatch is the host's work and is kept as it is); t0
is the smallest time of the sibling's series (one op at one setting of its other
parameters: the kernel's fixed cost, which a faster GPU
does not shrink). So every inefficiency the sibling's measurements show (slow
attention backward, launch-bound small kernels, collective floors) carries over,
and only the peaks change. The H800 is an H100 with a 400 GB/s NVLink: its
compute entries equal the H100's, its intra-node collectives take 2.25x longer.

GB200 NVL72 joins 72 GPUs in one NVLink domain; its intra-node collectives at
16, 32, 64 and 72 GPUs repeat the sibling's largest (8-GPU) series: a ring's bus
bandwidth does not fall with the world size, its floor grows with the hops,
so small messages over many GPUs are priced optimistically.

Every profile says so in its provenance. Rebuild them after the sibling
changes with `python -m placeflow.profiles.siblings` (writes
`profiles/data/<name>.json`); a test checks the shipped files against a rebuild.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from placeflow.models import DType
from placeflow.profiles import ops
from placeflow.profiles.datasheet import A100_80GB_SXM, GB, H100_SXM, DatasheetFigures
from placeflow.profiles.registry import SHIPPED_DIR, load_profile
from placeflow.profiles.schema import (
    CollectiveKind,
    Entry,
    Op,
    Profile,
    Provenance,
    Scope,
    Source,
    save_profile,
)

H800_SXM = DatasheetFigures(
    name="H800 SXM5 80GB",
    peak_bf16_flops_per_s=989e12,  # the H100's GH100 die and clocks
    hbm_bytes_per_s=3.35e12,
    nvlink_bytes_per_s=200 * GB,  # 400 GB/s bidirectional, against the H100's 900
    inter_node_bytes_per_s=50 * GB,  # 400 Gb/s NDR per GPU (DeepSeek-V3 report's H800 nodes)
    host_link_bytes_per_s=64 * GB,  # PCIe Gen5 x16
    sources="NVIDIA H800 product brief; DeepSeek-V3 technical report (arXiv 2412.19437) cluster",
    peak_fp8_flops_per_s=1979e12,  # the H100's: DeepSeek-V3 trained in FP8 on it
)

H20 = DatasheetFigures(
    name="H20 96GB",
    peak_bf16_flops_per_s=148e12,
    hbm_bytes_per_s=4.0e12,
    nvlink_bytes_per_s=450 * GB,  # NVLink 4: 900 GB/s bidirectional
    inter_node_bytes_per_s=50 * GB,  # 400 Gb/s per GPU
    host_link_bytes_per_s=64 * GB,  # PCIe Gen5 x16
    sources="NVIDIA H20 product brief (148 TFLOP/s dense FP16/BF16, 4.0 TB/s HBM3, 96 GB)",
    peak_fp8_flops_per_s=296e12,  # dense FP8, H20 product brief
)

A800_80GB_SXM = DatasheetFigures(
    name="A800 SXM4 80GB",
    peak_bf16_flops_per_s=312e12,
    hbm_bytes_per_s=2.0e12,
    nvlink_bytes_per_s=200 * GB,  # 400 GB/s bidirectional, against the A100's 600
    inter_node_bytes_per_s=25 * GB,  # 200 Gb/s HDR per GPU, as the a100-80gb profile
    host_link_bytes_per_s=32 * GB,  # PCIe Gen4 x16
    sources="NVIDIA A800 product brief",
)

B200_HGX = DatasheetFigures(
    name="B200 (HGX/DGX B200) 180GB",
    peak_bf16_flops_per_s=2.25e15,  # dense; 4.5 PFLOP/s with 2:4 sparsity
    hbm_bytes_per_s=8.0e12,  # DGX B200: 64 TB/s over 8 GPUs
    nvlink_bytes_per_s=900 * GB,  # NVLink 5: 1.8 TB/s bidirectional
    inter_node_bytes_per_s=50 * GB,  # DGX B200: one 400 Gb/s ConnectX-7 per GPU
    host_link_bytes_per_s=64 * GB,  # PCIe Gen5 x16
    sources="NVIDIA DGX B200 datasheet (1,440 GB HBM3e, 64 TB/s, 72 PFLOP/s FP8 training)",
    peak_fp8_flops_per_s=4.5e15,  # dense: 72 PFLOP/s over 8 GPUs is with 2:4 sparsity
)

GB200_NVL72 = DatasheetFigures(
    name="GB200 NVL72 (B200 at 1.2 kW) 186GB",
    peak_bf16_flops_per_s=2.5e15,  # dense; 5 PFLOP/s with 2:4 sparsity
    hbm_bytes_per_s=8.0e12,
    nvlink_bytes_per_s=900 * GB,  # NVLink 5 through the NVL72 switch trays, 72 GPUs
    inter_node_bytes_per_s=50 * GB,  # between racks: one 400 Gb/s NIC per GPU
    host_link_bytes_per_s=450 * GB,  # NVLink-C2C to Grace: 900 GB/s bidirectional
    sources="NVIDIA GB200 NVL72 datasheet (13.4 TB HBM3e per 72 GPUs, 130 TB/s NVLink)",
    peak_fp8_flops_per_s=5e15,  # dense; 720 PFLOP/s FP8 per 72 GPUs with 2:4 sparsity
)


@dataclass(frozen=True, kw_only=True)
class SiblingRecipe:
    """One datasheet profile: the GPU's figures and the measured sibling it borrows from."""

    name: str
    figures: DatasheetFigures
    sibling: str
    sibling_figures: DatasheetFigures
    nvlink_domain: int = 8  # GPUs that share one NVLink domain


RECIPES = (
    SiblingRecipe(name="h800", figures=H800_SXM, sibling="h100-sxm", sibling_figures=H100_SXM),
    SiblingRecipe(name="h20", figures=H20, sibling="h100-sxm", sibling_figures=H100_SXM),
    SiblingRecipe(
        name="a800-80gb", figures=A800_80GB_SXM, sibling="a100-80gb", sibling_figures=A100_80GB_SXM
    ),
    SiblingRecipe(name="b200", figures=B200_HGX, sibling="h100-sxm", sibling_figures=H100_SXM),
    SiblingRecipe(
        name="gb200",
        figures=GB200_NVL72,
        sibling="h100-sxm",
        sibling_figures=H100_SXM,
        nvlink_domain=72,
    ),
)

# World sizes of the NVL72 domain priced beyond the sibling's largest intra-node world.
# The vendor figures of every shipped GPU profile, by profile name: the measured and
# imported ones (H100, A100) and the datasheet siblings above.
FIGURES_BY_PROFILE: Mapping[str, DatasheetFigures] = {
    "h100-sxm": H100_SXM,
    "a100-80gb": A100_80GB_SXM,
    **{r.name: r.figures for r in RECIPES},
}

LARGE_DOMAIN_WORLDS = (16, 32, 64, 72)
# bf16 / fp16 entries; a ratio of two rooflines, so it only picks the bound
DTYPE_BYTES = DType.BF16.num_bytes


def roofline_s(op: Op, params: Mapping[str, int | str], fig: DatasheetFigures) -> float:
    """The time of `op` at `params` if it ran at the figures' peak of its bound resource."""
    if op is Op.COPY:
        return int(params["num_bytes"]) / fig.host_link_bytes_per_s
    if op is Op.COLLECTIVE:
        link = (
            fig.inter_node_bytes_per_s
            if params["scope"] == Scope.INTER.value
            else fig.nvlink_bytes_per_s
        )
        return ops.bytes_moved(op, params, DTYPE_BYTES) / link
    return max(
        ops.flops(op, params) / fig.peak_bf16_flops_per_s,
        ops.bytes_moved(op, params, DTYPE_BYTES) / fig.hbm_bytes_per_s,
    )


def _series_floors(entries: Iterable[Entry]) -> dict[tuple[Op, ops.SeriesKey], float]:
    floors: dict[tuple[Op, ops.SeriesKey], float] = {}
    for e in entries:
        key = (e.op, ops.series_key(e.op, e.params))
        floors[key] = min(floors.get(key, e.median_s), e.median_s)
    return floors


def transfer_s(
    entry: Entry, floor_s: float, sibling: DatasheetFigures, figures: DatasheetFigures
) -> float:
    """`entry`'s time on `figures`' GPU: its fixed cost plus the rest, scaled (see above).

    A Ray call's dispatch is the host's work (serialising, the object store), not
    the GPU's: it is kept as the sibling has it.
    """
    if entry.op is Op.DISPATCH:
        return entry.median_s
    ratio = roofline_s(entry.op, entry.params, figures) / roofline_s(
        entry.op, entry.params, sibling
    )
    return floor_s + (entry.median_s - floor_s) * ratio


def _large_domain_points(sibling: Profile, domain: int) -> list[Entry]:
    """The sibling's largest intra-node collective series repeated at the larger worlds."""
    intra = [
        e
        for e in sibling.entries_for(Op.COLLECTIVE)
        if e.params["scope"] == Scope.INTRA.value
        and e.params["kind"] != CollectiveKind.SEND_RECV.value  # two ranks in any domain
    ]
    largest = max(int(e.params["world_size"]) for e in intra)
    return [
        replace(e, params={**e.params, "world_size": n})
        for e in intra
        if int(e.params["world_size"]) == largest
        for n in LARGE_DOMAIN_WORLDS
        if largest < n <= domain
    ]


def build_sibling_profile(recipe: SiblingRecipe, sibling: Profile, *, date: str) -> Profile:
    """Every op and size the sibling has, transferred to the recipe's GPU (datasheet entries)."""
    floors = _series_floors(sibling.entries)
    points = [(e, floors[(e.op, ops.series_key(e.op, e.params))]) for e in sibling.entries]
    if recipe.nvlink_domain > 8:
        extra = _large_domain_points(sibling, recipe.nvlink_domain)
        extra_floors = _series_floors(extra)
        points += [(e, extra_floors[(e.op, ops.series_key(e.op, e.params))]) for e in extra]
    entries = []
    for e, floor in points:
        t = transfer_s(e, floor, recipe.sibling_figures, recipe.figures)
        entries.append(replace(e, median_s=t, p10_s=t, p90_s=t, repeats=1, source=Source.DATASHEET))
    sources = sorted({e.source.value for e in sibling.entries})
    notes = (
        f"Datasheet profile: no kernel of this GPU was measured. Each entry is the "
        f"{recipe.sibling!r} profile's entry (sources: {', '.join(sources)}) with its series' "
        f"fixed cost kept and the rest scaled by the roofline ratio of {recipe.figures.describe()} "
        f"to {recipe.sibling_figures.describe()} (placeflow.profiles.siblings)."
    )
    if recipe.nvlink_domain > 8:
        notes += (
            f" One NVLink domain of {recipe.nvlink_domain} GPUs: intra-node collectives at "
            f"{', '.join(map(str, LARGE_DOMAIN_WORLDS))} GPUs repeat the sibling's largest "
            "intra-node series (optimistic for small messages)."
        )
    return Profile(
        name=recipe.name,
        device_kind="cuda",
        provenance=Provenance(
            source=Source.DATASHEET,
            device_name=recipe.figures.name,
            torch_version="n/a (datasheet)",
            dtype="bf16",
            date=f"built {date} from {recipe.sibling} and vendor figures",
            host={"sibling": recipe.sibling, "nvlink_domain": recipe.nvlink_domain},
            notes=notes,
        ),
        entries=tuple(entries),
        grid={"sibling": recipe.sibling, **dict(sibling.grid)},
    )


def save_sibling_profiles(out_dir: Path = SHIPPED_DIR) -> dict[str, Path]:
    date = dt.date.today().isoformat()
    out = {}
    for r in RECIPES:
        profile = build_sibling_profile(r, load_profile(r.sibling), date=date)
        out[r.name] = save_profile(profile, out_dir / f"{r.name}.json")
    return out


if __name__ == "__main__":
    for name, path in save_sibling_profiles().items():
        print(f"{name}: {path}")
