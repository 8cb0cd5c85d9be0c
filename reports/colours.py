"""Colours and units shared by every report figure.

A role keeps one colour on every page (timeline bars, legends), so a reader who
learnt "actor is blue" on one figure can read the next without its legend.
Controller-side phases have no role and are drawn grey.
"""

from __future__ import annotations

from placeflow.phases import Phase
from placeflow.planner.space import PlacementKind
from placeflow.workload import Role

GIB = 1024**3

ROLE_COLOURS: dict[Role, str] = {
    Role.ACTOR: "#1f77b4",
    Role.CRITIC: "#ff7f0e",
    Role.REF: "#2ca02c",
    Role.REWARD: "#d62728",
    Role.COST: "#9467bd",
}
CONTROLLER_COLOUR = "#9e9e9e"

# Memory bars are grouped by phase, so phases (not roles) need distinct colours.
PHASE_COLOURS: dict[Phase, str] = {
    Phase.GENERATE: "#1f77b4",
    Phase.GENERATE_BASELINE: "#aec7e8",
    Phase.RESHARD: "#17becf",
    Phase.WEIGHT_SYNC: "#9edae5",
    Phase.REF_LOGPROB: "#2ca02c",
    Phase.OLD_LOGPROB: "#98df8a",
    Phase.VALUES: "#ff7f0e",
    Phase.COST_VALUES: "#ffbb78",
    Phase.REWARD: "#d62728",
    Phase.COST: "#9467bd",
    Phase.ADVANTAGE: CONTROLLER_COLOUR,
    Phase.ACTOR_UPDATE: "#393b79",
    Phase.CRITIC_UPDATE: "#8c564b",
}
RESIDENT_COLOUR = "#c7c7c7"

KIND_COLOURS: dict[PlacementKind, str] = {
    PlacementKind.COLOCATE: "#1f77b4",
    PlacementKind.STANDALONE: "#ff7f0e",
    PlacementKind.SPLIT: "#2ca02c",
    PlacementKind.HYBRID: "#9467bd",
}


def phase_colour(name: str) -> str:
    """Colour of a `memory_by_phase` key: a Phase value or "resident"."""
    try:
        return PHASE_COLOURS[Phase(name)]
    except ValueError:
        return RESIDENT_COLOUR
