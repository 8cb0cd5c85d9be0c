"""Datasheet profiles for GPUs nobody here measured, from a measured sibling.

H800, H20, A800, B200 and GB200 run published RL post-training jobs, but
placeflow has no kernel measurements of them. Each gets a profile whose every
entry is a `datasheet` entry (`Source.DATASHEET`): the roofline time of the op
(`placeflow.profiles.datasheet.datasheet_time_s`) on the GPU's own vendor
figures, with the achieved fractions (compute and HBM efficiency, fixed
per-kernel cost, collective floors) that its *sibling's* imported measurements
show (`derive_efficiencies`). The sibling is the GPU of the same architecture
(H100 for the Hopper parts, A100 for the A800) or, for Blackwell, the newest
architecture measured (H100): the fractions carry over, the peaks do not.

Intra-node collective bandwidths were measured in absolute GB/s on the
sibling's NVLink; they are scaled by the ratio of the two NVLink figures (the
H800's and A800's 400 GB/s links halve the H100's and A100's collective
bandwidth). GB200 NVL72 joins 72 GPUs in one NVLink domain; its all-reduce
series beyond the sibling's 8 GPUs keep the 8-GPU floor and bus bandwidth (a
ring's bus bandwidth does not fall with the world size; its floor grows with
the hops, so a large-world, small-message all-reduce is priced optimistically).

Every profile says so in its provenance. Rebuild them with
`python -m placeflow.profiles.siblings` (writes `profiles/data/<name>.json`).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, replace
from pathlib import Path

from placeflow.profiles.datasheet import (
    A100_80GB_SXM,
    GB,
    H100_SXM,
    DatasheetFigures,
    Efficiencies,
    datasheet_time_s,
    derive_efficiencies,
)
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

TB = 1e12

H800_SXM = DatasheetFigures(
    name="H800 SXM5 80GB",
    peak_bf16_flops_per_s=989e12,  # the H100's GH100 die and clocks
    hbm_bytes_per_s=3.35e12,
    nvlink_bytes_per_s=200 * GB,  # 400 GB/s bidirectional, against the H100's 900
    inter_node_bytes_per_s=50 * GB,  # 400 Gb/s NDR per GPU (DeepSeek-V3 report's H800 nodes)
    host_link_bytes_per_s=64 * GB,  # PCIe Gen5 x16
    sources="NVIDIA H800 product brief; DeepSeek-V3 technical report (arXiv 2412.19437) cluster",
)

H20 = DatasheetFigures(
    name="H20 96GB",
    peak_bf16_flops_per_s=148e12,
    hbm_bytes_per_s=4.0e12,
    nvlink_bytes_per_s=450 * GB,  # NVLink 4: 900 GB/s bidirectional
    inter_node_bytes_per_s=50 * GB,  # 400 Gb/s per GPU
    host_link_bytes_per_s=64 * GB,  # PCIe Gen5 x16
    sources="NVIDIA H20 product brief (148 TFLOP/s dense FP16/BF16, 4.0 TB/s HBM3, 96 GB)",
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
)

GB200_NVL72 = DatasheetFigures(
    name="GB200 NVL72 (B200 at 1.2 kW) 186GB",
    peak_bf16_flops_per_s=2.5e15,  # dense; 5 PFLOP/s with 2:4 sparsity
    hbm_bytes_per_s=8.0e12,
    nvlink_bytes_per_s=900 * GB,  # NVLink 5 through the NVL72 switch trays, 72 GPUs
    inter_node_bytes_per_s=50 * GB,  # between racks: one 400 Gb/s NIC per GPU
    host_link_bytes_per_s=450 * GB,  # NVLink-C2C to Grace: 900 GB/s bidirectional
    sources="NVIDIA GB200 NVL72 datasheet (13.4 TB HBM3e per 72 GPUs, 130 TB/s NVLink)",
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

# World sizes of the NVL72 domain priced beyond the sibling's largest measured world.
LARGE_DOMAIN_WORLDS = (16, 32, 64, 72)


def transferred_efficiencies(
    sibling: Profile, sibling_figures: DatasheetFigures, figures: DatasheetFigures
) -> Efficiencies:
    """The sibling's achieved fractions, with its intra-node bandwidths scaled to `figures`'
    NVLink (they were measured in absolute bytes/s)."""
    eff = derive_efficiencies(sibling, sibling_figures)
    scale = figures.nvlink_bytes_per_s / sibling_figures.nvlink_bytes_per_s
    net = eff.network
    bus = {n: b * scale for n, b in net.allreduce_bus_bytes_per_s.items()}
    return replace(eff, network=replace(net, allreduce_bus_bytes_per_s=bus))


def _large_domain(eff: Efficiencies, domain: int) -> Efficiencies:
    """All-reduce floors and bandwidths for worlds up to `domain`, from the largest measured."""
    net = eff.network
    largest = max(net.allreduce_floor_s)
    floors, bus = dict(net.allreduce_floor_s), dict(net.allreduce_bus_bytes_per_s)
    for n in LARGE_DOMAIN_WORLDS:
        if largest < n <= domain:
            floors[n], bus[n] = floors[largest], bus[largest]
    return replace(
        eff, network=replace(net, allreduce_floor_s=floors, allreduce_bus_bytes_per_s=bus)
    )


def _domain_entries(sibling: Profile, domain: int) -> list[Entry]:
    """The sibling's intra-node collective points repeated at the larger world sizes."""
    largest = max(
        int(e.params["world_size"])
        for e in sibling.entries_for(Op.COLLECTIVE)
        if e.params["scope"] == Scope.INTRA.value
    )
    out = []
    for e in sibling.entries_for(Op.COLLECTIVE):
        if e.params["scope"] != Scope.INTRA.value or int(e.params["world_size"]) != largest:
            continue
        if e.params["kind"] == CollectiveKind.SEND_RECV.value:
            continue  # point to point: two ranks whatever the domain
        for n in LARGE_DOMAIN_WORLDS:
            if largest < n <= domain:
                out.append(replace(e, params={**e.params, "world_size": n}))
    return out


def build_sibling_profile(recipe: SiblingRecipe, sibling: Profile, *, date: str) -> Profile:
    """Every op and size the sibling has, priced on the recipe's GPU (all datasheet entries)."""
    eff = transferred_efficiencies(sibling, recipe.sibling_figures, recipe.figures)
    points = list(sibling.entries)
    if recipe.nvlink_domain > 8:
        eff = _large_domain(eff, recipe.nvlink_domain)
        points += _domain_entries(sibling, recipe.nvlink_domain)
    entries = []
    for e in points:
        t = datasheet_time_s(e.op, e.params, recipe.figures, eff)
        entries.append(
            Entry(
                op=e.op,
                params=e.params,
                median_s=t,
                p10_s=t,
                p90_s=t,
                repeats=1,
                source=Source.DATASHEET,
            )
        )
    notes = (
        f"Datasheet profile: no kernel of this GPU was measured. Every entry is the roofline "
        f"time on {recipe.figures.describe()}, with the achieved fractions that the "
        f"{recipe.sibling!r} profile's imported measurements show ({eff.describe()}); intra-node "
        f"collective bandwidths scaled by the NVLink ratio "
        f"{recipe.figures.nvlink_bytes_per_s / recipe.sibling_figures.nvlink_bytes_per_s:g}. "
        f"Same op grid as {recipe.sibling!r}."
    )
    if recipe.nvlink_domain > 8:
        notes += (
            f" One NVLink domain of {recipe.nvlink_domain} GPUs: all-reduce, all-gather and "
            f"reduce-scatter at {', '.join(map(str, LARGE_DOMAIN_WORLDS))} GPUs keep the 8-GPU "
            "floor and bus bandwidth (optimistic for small messages)."
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
