"""Run-time failures of the executor.

A `SpecError` (placeflow.errors) is a mistake in what the user wrote; the errors
here happen while running: a worker raised, its process died, a call did not
answer in time, or Ray could not place the workers. They are not ValueErrors.
"""

from __future__ import annotations

from enum import StrEnum

from placeflow.errors import SpecError


class ExecutorError(RuntimeError):
    """Something failed while the executor ran a plan."""


class FailureKind(StrEnum):
    RAISED = "raised"  # the remote method raised; the worker is still alive
    DIED = "died"  # the worker process exited or was killed
    TIMEOUT = "timeout"  # no answer within the call's time limit
    RAY = "ray"  # Ray failed otherwise (object lost, node gone)


class WorkerError(ExecutorError):
    """A worker failed a call: which role and rank, in which call, and why."""

    def __init__(self, *, role: str, rank: int, call: str, kind: FailureKind, cause: str) -> None:
        self.role = role
        self.rank = rank
        self.call = call
        self.kind = kind
        self.cause = cause
        super().__init__(f"{role} rank {rank} failed in {call}: {kind}: {cause}")


class PlacementTimeoutError(ExecutorError):
    """Ray did not place a plan's placement groups in time (devices held by someone else)."""


class InsufficientResourcesError(SpecError):
    """The plan needs more devices than the Ray cluster has: fix the plan or the cluster."""
