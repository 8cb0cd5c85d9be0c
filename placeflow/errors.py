"""Project exceptions: errors a user can cause and fix.

Every error a user controls (a name, a file, a number) is a `SpecError`, a
`ValueError` whose message says what is wrong and what would be right. The CLI
turns these into one line on stderr and a non-zero exit, never a traceback.
"""


class SpecError(ValueError):
    """A user-supplied spec, name or file is invalid; the message says how to fix it."""


class UnknownNameError(SpecError):
    """A name (model, profile, hardware) is not known; the message lists the known ones."""

    def __init__(self, kind: str, name: str, known: list[str] | tuple[str, ...]) -> None:
        self.kind = kind
        self.name = name
        self.known = tuple(sorted(known))
        super().__init__(f"unknown {kind} {name!r}; known {kind}s: {', '.join(self.known)}")


class ProfileSchemaError(SpecError):
    """A profile file is malformed or of a schema version this placeflow cannot read."""


class MeasurementError(RuntimeError):
    """A measurement this machine could not make: a rank that failed or hung, or timings
    too noisy to give a positive cost. The message says what failed and how to retry."""
