"""Metric loggers: TensorBoard always, W&B and MLflow when installed and asked.

Every logger is fed the same records as metrics.jsonl (`logged_scalars` flattens
one), under the names users of other RL frameworks already read: per-phase
seconds as verl's `timing_s/gen`, `timing_s/old_log_prob`, `timing_s/ref`,
`timing_s/update_actor`, `timing_s/update_critic`, `timing_s/weight_sync`
(placeflow's colocated `reshard` is verl's weight sync too), and throughput
in tokens/s per GPU (NeMo-RL's and verl's `perf/throughput`). Validation
scores arrive as `val/...` at the step they were taken.

W&B runs in offline mode (files under RUN_DIR/wandb, `wandb sync` uploads them
later) and MLflow logs to a SQLite store, RUN_DIR/mlflow.db (`mlflow ui
--backend-store-uri sqlite:///RUN_DIR/mlflow.db`; MLflow's file store is
deprecated), so no logger needs a network or an account.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from enum import StrEnum
from pathlib import Path
from typing import Any, Protocol

from placeflow.errors import SpecError
from placeflow.metrics import VERL_TIMING, Metric, RecordKey
from placeflow.phases import Phase


class LoggerKind(StrEnum):
    TENSORBOARD = "tensorboard"
    WANDB = "wandb"
    MLFLOW = "mlflow"


# metrics.jsonl name -> the name users read elsewhere (kept under both).
RENAMED: dict[str, str] = {Metric.STEP_TIME_S: Metric.TIMING_STEP}


def named_metrics(record: Mapping[str, Any], num_gpus: int) -> dict[str, float]:
    """A step record's figures under the names users read elsewhere: verl's `timing_s/*`
    per phase (summed where two phases share one) and the step, and the throughput per
    device of the plan (`perf/throughput`, tokens/s/GPU). metrics.jsonl holds them beside
    placeflow's own `phases` and `tokens_per_s`."""
    out: dict[str, float] = {}
    for key, name in RENAMED.items():
        if key in record:
            out[name] = float(record[key])
    if Metric.TOKENS_PER_S in record:  # NeMo-RL's and verl's throughput: per device of the plan
        out[Metric.PERF_THROUGHPUT] = float(record[Metric.TOKENS_PER_S]) / num_gpus
    for phase, seconds in record.get(RecordKey.PHASES, {}).items():
        name = VERL_TIMING[Phase(phase)]
        out[name] = out.get(name, 0.0) + float(seconds)
    return out


def logged_scalars(record: Mapping[str, Any], num_gpus: int) -> dict[str, float]:
    """The numbers of one metrics.jsonl record (or validation record) to log, by name;
    `num_gpus`: the plan's devices, for the throughput per GPU."""
    out: dict[str, float] = {}
    for key, value in record.items():
        if key == RecordKey.STEP or isinstance(value, bool) or not isinstance(value, int | float):
            continue
        if math.isfinite(value):
            out[key] = float(value)
    return out | named_metrics(record, num_gpus)


class MetricLogger(Protocol):
    def log(self, scalars: Mapping[str, float], step: int) -> None: ...

    def close(self) -> None: ...


class TensorBoardLogger:
    """Event files under RUN_DIR/tensorboard (`tensorboard --logdir RUN_DIR/tensorboard`)."""

    def __init__(self, run_dir: Path, name: str) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(run_dir / "tensorboard"))

    def log(self, scalars: Mapping[str, float], step: int) -> None:
        for key, value in scalars.items():
            self.writer.add_scalar(key, value, global_step=step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandbLogger:
    """W&B in offline mode: RUN_DIR/wandb."""

    def __init__(self, run_dir: Path, name: str) -> None:
        import wandb

        self.run = wandb.init(
            project="placeflow", name=name, dir=str(run_dir), mode="offline", reinit=True
        )

    def log(self, scalars: Mapping[str, float], step: int) -> None:
        self.run.log(dict(scalars), step=step)

    def close(self) -> None:
        self.run.finish()


class MlflowLogger:
    """MLflow to a local SQLite store: RUN_DIR/mlflow.db."""

    def __init__(self, run_dir: Path, name: str) -> None:
        import mlflow

        self.mlflow = mlflow
        mlflow.set_tracking_uri(tracking_uri(run_dir))
        self.run = mlflow.start_run(run_name=name)

    def log(self, scalars: Mapping[str, float], step: int) -> None:
        # MLflow metric names allow letters, digits, _ - . space and /.
        self.mlflow.log_metrics(dict(scalars), step=step)

    def close(self) -> None:
        self.mlflow.end_run()


def tracking_uri(run_dir: Path) -> str:
    return f"sqlite:///{(run_dir / 'mlflow.db').resolve()}"


LOGGERS: dict[LoggerKind, type[TensorBoardLogger | WandbLogger | MlflowLogger]] = {
    LoggerKind.TENSORBOARD: TensorBoardLogger,
    LoggerKind.WANDB: WandbLogger,
    LoggerKind.MLFLOW: MlflowLogger,
}
# The package each logger needs, for the error when it is missing.
PACKAGES = {
    LoggerKind.TENSORBOARD: "tensorboard",
    LoggerKind.WANDB: "wandb",
    LoggerKind.MLFLOW: "mlflow",
}


def parse_loggers(text: str) -> tuple[LoggerKind, ...]:
    """`--logger tensorboard,wandb`: the kinds, TensorBoard always among them."""
    kinds = [LoggerKind.TENSORBOARD]
    for part in filter(None, (p.strip() for p in text.split(","))):
        try:
            kind = LoggerKind(part)
        except ValueError:
            known = ", ".join(k.value for k in LoggerKind)
            raise SpecError(f"unknown logger {part!r}; known: {known}") from None
        if kind not in kinds:
            kinds.append(kind)
    return tuple(kinds)


def check_loggers(kinds: Sequence[LoggerKind]) -> None:
    """A SpecError naming the package to install when a logger's package is missing."""
    import importlib.util

    for kind in kinds:
        if importlib.util.find_spec(PACKAGES[kind]) is None:
            raise SpecError(
                f"--logger {kind}: the {PACKAGES[kind]!r} package is not installed; "
                f"pip install {PACKAGES[kind]}, or leave {kind} out"
            )


class Loggers:
    """All the run's loggers, fed together."""

    def __init__(
        self, kinds: Sequence[LoggerKind], run_dir: Path, name: str, *, num_gpus: int
    ) -> None:
        check_loggers(kinds)
        self.num_gpus = num_gpus
        self.loggers: list[MetricLogger] = [LOGGERS[k](run_dir, name) for k in kinds]

    def log(self, record: Mapping[str, Any], step: int) -> None:
        scalars = logged_scalars(record, self.num_gpus)
        for logger in self.loggers:
            logger.log(scalars, step)

    def close(self) -> None:
        for logger in self.loggers:
            logger.close()
