"""Export a plan to the trainer configuration of another RL framework.

`export_plan(plan, Target.VERL)` gives verl's hydra overrides (its Megatron
PPO trainer config), `Target.OPENRLHF` the flags of OpenRLHF's
`train_ppo_ray`. Each export realises what the target can express of the plan
(device counts per pool or role, colocation, per-role parallelism and
micro-batches, batch shape, offload) and lists, as `unexpressed`, what the plan
says that the target cannot (a colocation it has no option for, a parallelism
it does not run): the command is the closest configuration, and the notes say
how it differs.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

from placeflow.modcall import answer_calls
from placeflow.plan import Plan


class Target(StrEnum):
    VERL = "verl"
    OPENRLHF = "openrlhf"


@dataclass(frozen=True, kw_only=True)
class Export:
    """A plan as another framework's launch: `command` then `arguments`, with notes."""

    target: Target
    plan_name: str
    plan_hash: str
    command: tuple[str, ...]  # the launcher, e.g. python3 -m verl.trainer.main_ppo
    arguments: tuple[str, ...]  # hydra overrides (key=value) or command-line flags
    unexpressed: tuple[str, ...]  # what the plan says that the target cannot
    to_set: tuple[str, ...] = ()  # what a plan does not hold and the user must give

    def text(self) -> str:
        """A shell script: notes as comments, then the command, one argument (or flag
        and its value) a line."""
        lines = [f"# placeflow plan {self.plan_name!r} (hash {self.plan_hash}) for {self.target}"]
        if self.unexpressed:
            lines.append(f"# What {self.target} cannot express of this plan (the closest is used):")
            lines += [f"#   - {note}" for note in self.unexpressed]
        else:
            lines.append(f"# {self.target} expresses every placement and parallelism of the plan.")
        lines += [f"# To set: {note}" for note in self.to_set]
        return "\n".join(lines) + "\n" + " \\\n    ".join(self._lines()) + "\n"

    def _lines(self) -> list[str]:
        out, args = [shlex.join(self.command)], list(self.arguments)
        while args:
            arg = args.pop(0)
            if arg.startswith("--") and args and not args[0].startswith("--"):
                out.append(f"{arg} {shlex.quote(args.pop(0))}")
            else:
                out.append(shlex.quote(arg))
        return out


def export_plan(plan: Plan, target: Target) -> Export:
    from placeflow.export import openrlhf, verl

    exporters: dict[Target, Callable[[Plan], Export]] = {
        Target.VERL: verl.export,
        Target.OPENRLHF: openrlhf.export,
    }
    return exporters[target](plan)


answer_calls(__name__, "export")  # `placeflow.export(plan, "verl")` is the API's export
