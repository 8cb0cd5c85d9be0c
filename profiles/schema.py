"""Profile files: versioned, provenance-carrying kernel timings (schema version 1).

A profile is one JSON file per hardware:

```json
{
  "schema": "placeflow-profile",
  "schema_version": 1,
  "name": "cpu",
  "device_kind": "cpu",                  // "cpu" or "cuda"
  "provenance": {
    "source": "measured",                // measured | imported | datasheet | mixed
    "device_name": "...", "torch_version": "2.13.0+cpu", "dtype": "fp32",
    "date": "2026-11-22T10:00:00+00:00", "host": {...}, "notes": "..."
  },
  "grid": {...},                         // the profiler's grid, as run
  "entries": [
    {"op": "gemm", "params": {"m": 128, "n": 384, "k": 128},
     "median_s": 1.2e-5, "p10_s": 1.1e-5, "p90_s": 1.4e-5, "repeats": 20,
     "source": "measured"}
  ]
}
```

Each entry records its own `source` because one file may mix measured,
imported and datasheet entries (GPU profiles imported from Vidur are completed
from datasheets); the file-level `source` is then `mixed`. The parameters of
each op are listed in `OP_PARAMS`; their meaning is in `placeflow.profiles.ops`.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from placeflow.errors import ProfileSchemaError
from placeflow.frozen import FrozenMap

SCHEMA = "placeflow-profile"
SCHEMA_VERSION = 1


class Op(StrEnum):
    """Timed operations. Parameters per op are in `OP_PARAMS`."""

    GEMM = "gemm"
    ATTN_PREFILL_FWD = "attn_prefill_fwd"
    ATTN_PREFILL_BWD = "attn_prefill_bwd"
    ATTN_DECODE = "attn_decode"
    ELEMENTWISE = "elementwise"
    OPTIMIZER = "optimizer"
    COLLECTIVE = "collective"
    COPY = "copy"
    DISPATCH = "dispatch"
    FRAMEWORK = "framework"


# Ops a profile holds only where they were measured through placeflow's own engine on
# that device (`profiles/framework.py`): absent, the simulator prices the engine's
# extra ops instead (`simulator/compute.py`). Every other op is in every profile.
OPTIONAL_OPS = frozenset({Op.FRAMEWORK})
REQUIRED_OPS = tuple(op for op in Op if op not in OPTIONAL_OPS)


class Source(StrEnum):
    MEASURED = "measured"
    IMPORTED = "imported"
    DATASHEET = "datasheet"
    MIXED = "mixed"


class ElementwiseKind(StrEnum):
    RMSNORM = "rmsnorm"
    SILU_MUL = "silu_mul"
    SOFTMAX = "softmax"
    ADD = "add"


class CollectiveKind(StrEnum):
    ALL_REDUCE = "all_reduce"
    ALL_GATHER = "all_gather"
    REDUCE_SCATTER = "reduce_scatter"
    BROADCAST = "broadcast"
    SEND_RECV = "send_recv"
    ALL_TO_ALL = "all_to_all"


class Scope(StrEnum):
    """Where a collective's ranks are: all in one node, or spread over nodes."""

    INTRA = "intra"
    INTER = "inter"


class DispatchKind(StrEnum):
    """Host-side work around a model call (measured by `placeflow.profiles.ray_roundtrip`)."""

    RAY_CALL = "ray_call"  # one Ray actor call and its result, carrying num_bytes of tensors
    # The driver's own serial share of a call to many ranks: pickling and submitting one
    # rank's arguments of num_bytes (`.remote()` until it returns), and unpickling one
    # rank's result of num_bytes once it is ready (`ray.get`).
    RAY_LAUNCH = "ray_launch"
    RAY_GET = "ray_get"
    # What one more tensor adds to each of the three (the entries above carry two, as a
    # Batch of token ids and a mask pickles): a call's arguments or result are a dict of
    # tensors, each pickled and moved on its own. Timed at num_bytes per tensor.
    RAY_CALL_TENSOR = "ray_call_tensor"
    RAY_LAUNCH_TENSOR = "ray_launch_tensor"
    RAY_GET_TENSOR = "ray_get_tensor"


# Tensors in the payload of a `ray_call`, `ray_launch` or `ray_get` entry.
DISPATCH_ENTRY_TENSORS = 2
# Per-tensor kinds: what each one prices a tensor of.
PER_TENSOR = {
    DispatchKind.RAY_CALL: DispatchKind.RAY_CALL_TENSOR,
    DispatchKind.RAY_LAUNCH: DispatchKind.RAY_LAUNCH_TENSOR,
    DispatchKind.RAY_GET: DispatchKind.RAY_GET_TENSOR,
}


class FrameworkKind(StrEnum):
    """Host work of placeflow's engine per piece, timed through the engine's own code at
    a size where kernels are negligible (measured by `placeflow.profiles.framework`)."""

    LAYER_FORWARD = "layer_forward"  # one decoder layer's forward
    LAYER_BACKWARD = "layer_backward"  # one decoder layer's backward
    LAYER_DECODE = "layer_decode"  # one decoder layer in a decode step with the KV cache
    CALL_FORWARD = "call_forward"  # per forward: embedding, positions, mask, final norm, head
    CALL_BACKWARD = "call_backward"  # per backward: the same ops' gradients and the loss
    DECODE_STEP = "decode_step"  # per decode step outside the layers: head, sampling, stops
    OPTIMIZER_LAYER = "optimizer_layer"  # the optimizer step and clipping, per layer's tensors
    OPTIMIZER_CALL = "optimizer_call"  # the same for the tensors outside the layers
    # The part of the optimizer step that AdamW's own loop takes (`optimizer.step()`
    # alone, no clipping), which a ZeRO-1/2 rank runs over its partition only:
    ADAMW_LAYER = "adamw_layer"  # per layer's tensors
    ADAMW_CALL = "adamw_call"  # per step: the tensors outside the layers
    # The actor's load of its generation weights into its rollout engine where no reshard
    # moves them (the reshard plan's per-tensor bookkeeping and copies, `load_shards`):
    LOAD_LAYER = "load_layer"  # per decoder layer's tensors
    LOAD_CALL = "load_call"  # per load: the tensors outside the layers and the call's own
    # A generator set's weight sync (`executor.weight_sync.sync_disjoint`) beyond its
    # message: the trainer's packing of its slices and the generator's allocation of its
    # shard and copy of each slice into it (the plan's per-tensor bookkeeping, the copies):
    SYNC_LAYER = "sync_layer"  # per decoder layer's tensors
    SYNC_CALL = "sync_call"  # per sync: the tensors outside the layers and the call's own
    # What ZeRO-3's FSDP2 (`fully_shard` on each decoder layer and on the root) adds to a
    # rank's host work per unit, beyond the same pieces unwrapped, timed on a group of one
    # rank (the bytes its all-gathers and reduce-scatters move between ranks are the
    # collective entries'): in a forward the unit's unshard (its hooks, the copy of the
    # shard into the all-gather buffer and of the gathered buffer into the parameters)
    # and reshard; in a backward the unshard again and the gradients' reduce-scatter
    # (their copy in and the shard's copy out).
    FSDP_LAYER_FORWARD = "fsdp_layer_forward"  # per decoder layer's unit, per forward
    FSDP_CALL_FORWARD = "fsdp_call_forward"  # the root's unit, per forward
    FSDP_LAYER_BACKWARD = "fsdp_layer_backward"  # per decoder layer's unit, per backward
    FSDP_CALL_BACKWARD = "fsdp_call_backward"  # the root's unit, per backward
    # Not the engine's: the wall time one collective adds to each rank of a host that
    # runs two busy ranks per core (measured by `placeflow.profiles.shared_cores`).
    SHARED_COLLECTIVE = "shared_collective"
    # Not the engine's either: the same with every rank in two pairs of different ranks
    # (as a tensor-parallel pair and a data-parallel pair), its all-reduces alternating
    # between them, so that all ranks wait on one another in turn (`shared_cores`).
    COUPLED_COLLECTIVE = "coupled_collective"
    # Not the engine's either: the slowest rank's wall time of one reference forward with
    # num_units busy ranks on the profiling host (`shared_cores`; its cores: provenance).
    SHARED_COMPUTE = "shared_compute"
    # Not the engine's either: the same with one reference decode (the engine's sampler
    # generating a few tokens for a few sequences) and with one reference training step
    # (forward and backward) in place of the forward: a generation's and an update's
    # ranks pay time slices by their own work's cache and dispatch pattern (`shared_cores`).
    SHARED_DECODE = "shared_decode"
    SHARED_TRAIN = "shared_train"
    # Not the engine's either: the fixed time of a driver's call to num_units Ray actor
    # ranks on the profiling host, beyond their forwards (`shared_cores`).
    SHARED_CALL = "shared_call"
    # Not the engine's either: the wall time of a driver's call to num_units Ray actor
    # ranks on the profiling host whose method does nothing, from its last launch to its
    # last result, the ranks idle a few ms before it (a weight transition's call without
    # its copies); measured by `shared_cores`.
    EMPTY_CALL = "empty_call"
    # Not the engine's either: what the same empty call to one Ray actor rank per core costs
    # beyond it when its ranks idled num_units ms before it, not the empty call's own few
    # ms (a transition's ranks sleep through the phases and the driver's work before it:
    # their wake-up, a call that walks no model); measured by `shared_cores`.
    EMPTY_WAKE = "empty_wake"
    # Not the engine's either: what one reference forward costs beyond the same forward
    # run back to back when its rank slept num_units milliseconds before it (its core
    # idle or running others' work), the cold caches' refill; measured by `shared_cores`.
    WAKE_CALL = "wake_call"
    # Not the engine's either: what one pass of GEMMs of num_units rows over the weights of
    # `shared_cores.COLD_MODEL` costs beyond the same GEMMs each timed back to back (its
    # weights hot in the core's private cache, as the profile's GEMM entries are): the
    # weights read from the shared last-level cache; measured by `shared_cores`.
    COLD_WEIGHTS = "cold_weights"
    # Not the engine's either: the wall time one small all-reduce within a pair of ranks
    # adds per iteration where each rank computes num_units µs between them, one busy
    # rank per core: a collective as a tensor-parallel layer meets it, its partner
    # blocked until the data arrives; measured by `shared_cores`.
    PAIRED_COLLECTIVE = "paired_collective"
    # Not the engine's either, and not a time: the host's cores kept busy by everything but
    # the ranks' and the driver's own threads (Ray's daemons, the Ray threads of the
    # workers and the driver, the kernel's) while num_units Ray actor ranks compute in a
    # call, in CPU seconds per second; measured by `shared_cores`.
    RAY_BACKGROUND = "ray_background"
    # A colocated reshard's host work beyond its all-gathers, per piece copied into the
    # generation tensors and per slot (its buffers), as `executor.reshard` runs it on two
    # gloo ranks (measured by `placeflow.profiles.reshard_host`).
    RESHARD_PIECE = "reshard_piece"
    RESHARD_SLOT = "reshard_slot"
    # A ZeRO-3 rank's gather of one of its FSDP2 parameters over its data-parallel group
    # before a reshard or a weight sync (`DTensor.full_tensor`, `TrainEngine.tp_shards`)
    # beyond the all-gather of the same shard the collective entries time: DTensor's
    # dispatch, the buffers' allocation, the unpadding; per tensor, on two gloo ranks
    # (measured by `placeflow.profiles.reshard_host`).
    ZERO3_GATHER = "zero3_gather"
    # Not the engine's pieces but its whole calls: what each of a rank's calls (a
    # forward, an update, a generation) costs beyond the same call back to back when the
    # rank ran its other calls in turn, sleeping num_units ms before each, as an actor
    # rank of a run does; on the framework profiler's reference model and, `_large`, on
    # `grid.COLD_MODEL` (measured by `placeflow.profiles.wake_calls`).
    WAKE_FORWARD = "wake_forward"
    WAKE_UPDATE = "wake_update"
    WAKE_GENERATE = "wake_generate"
    WAKE_FORWARD_LARGE = "wake_forward_large"
    WAKE_UPDATE_LARGE = "wake_update_large"
    WAKE_GENERATE_LARGE = "wake_generate_large"
    # Not the engine's either: the controller's own serial work of a step on the driver,
    # through the executor's own functions (measured by `placeflow.profiles.controller_work`).
    # The rule-based reward: num_units responses of CONTROLLER_RESPONSE_LEN tokens decoded
    # (`loop.decode_responses`) and scored by the built-in `arith` checker (`score_items`).
    RULE_REWARD = "rule_reward"
    # The advantages of one algorithm (`loop.step_advantages`) on CONTROLLER_SAMPLES
    # responses of num_units tokens (PPO's and Safe-RLHF's GAE loops over the tokens).
    ADVANTAGE_PPO = "advantage_ppo"
    ADVANTAGE_GRPO = "advantage_grpo"
    ADVANTAGE_REMAX = "advantage_remax"
    ADVANTAGE_SAFE_RLHF = "advantage_safe_rlhf"


class CopyDirection(StrEnum):
    H2D = "h2d"
    D2H = "d2h"


# Parameter names per op (positive ints except kind, scope and direction).
#   gemm: C[m, n] = A[m, k] @ B[k, n]
#   attn_*: causal self-attention (torch SDPA) with grouped-query heads
#   attn_decode: one query token per sequence against kv_len cached tokens
#   elementwise: num_bytes of the input tensor
#   optimizer: one AdamW step over num_params fp32 parameters
#   collective: num_bytes of the full logical tensor (nccl-tests convention:
#     the all-gather output, the reduce-scatter input, the all-reduce buffer)
#   copy: num_bytes host<->device (pinned host memory)
#   dispatch: one controller -> worker call carrying num_bytes of tensors, round trip
#   framework: the engine's host time of num_units pieces of one kind (FrameworkKind)
OP_PARAMS: dict[Op, tuple[str, ...]] = {
    Op.GEMM: ("m", "n", "k"),
    Op.ATTN_PREFILL_FWD: ("batch", "seq", "num_heads", "num_kv_heads", "head_dim"),
    Op.ATTN_PREFILL_BWD: ("batch", "seq", "num_heads", "num_kv_heads", "head_dim"),
    Op.ATTN_DECODE: ("batch", "kv_len", "num_heads", "num_kv_heads", "head_dim"),
    Op.ELEMENTWISE: ("kind", "num_bytes"),
    Op.OPTIMIZER: ("num_params",),
    Op.COLLECTIVE: ("kind", "world_size", "scope", "num_bytes"),
    Op.COPY: ("direction", "num_bytes"),
    Op.DISPATCH: ("kind", "num_bytes"),
    Op.FRAMEWORK: ("kind", "num_units"),
}


def _str_param_enum(op: Op, key: str) -> type[StrEnum] | None:
    """The enum a string parameter must belong to, or None for integer parameters."""
    if key == "kind":
        return {
            Op.ELEMENTWISE: ElementwiseKind,
            Op.DISPATCH: DispatchKind,
            Op.FRAMEWORK: FrameworkKind,
        }.get(op, CollectiveKind)
    return {"scope": Scope, "direction": CopyDirection}.get(key)


Params = Mapping[str, int | str]


def _check_params(op: Op, params: Mapping[str, Any], where: str) -> dict[str, int | str]:
    expected = OP_PARAMS[op]
    if set(params) != set(expected):
        raise ProfileSchemaError(
            f"{where}: op {op} needs params {list(expected)}, got {sorted(params)}"
        )
    out: dict[str, int | str] = {}
    for key in expected:
        value = params[key]
        enum = _str_param_enum(op, key)
        if enum is not None:
            try:
                out[key] = enum(value).value
            except ValueError:
                known = ", ".join(e.value for e in enum)
                raise ProfileSchemaError(
                    f"{where}: {op} {key}={value!r} unknown; known: {known}"
                ) from None
        else:
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ProfileSchemaError(
                    f"{where}: {op} {key} must be a positive integer, got {value!r}"
                )
            out[key] = value
    return out


@dataclass(frozen=True, kw_only=True)
class Entry:
    """One timed point: an op at one parameter setting. Times in seconds."""

    op: Op
    params: Mapping[str, int | str] = field(hash=False)
    median_s: float
    p10_s: float
    p90_s: float
    repeats: int
    source: Source

    def __post_init__(self) -> None:
        params: FrozenMap[str, int | str] = FrozenMap(_check_params(self.op, self.params, "entry"))
        object.__setattr__(self, "params", params)
        if not (self.median_s > 0 and self.p10_s > 0 and self.p90_s > 0):
            raise ProfileSchemaError(
                f"entry {self.op} {dict(self.params)}: times must be positive, got median "
                f"{self.median_s}, p10 {self.p10_s}, p90 {self.p90_s}"
            )
        if self.source is Source.MIXED:
            raise ProfileSchemaError(
                "an entry's source is measured, imported or datasheet, not mixed"
            )

    def key(self) -> tuple[Op, tuple[tuple[str, int | str], ...]]:
        return self.op, tuple(sorted(self.params.items()))

    def to_json(self) -> dict[str, Any]:
        return {
            "op": self.op.value,
            "params": dict(self.params),
            "median_s": self.median_s,
            "p10_s": self.p10_s,
            "p90_s": self.p90_s,
            "repeats": self.repeats,
            "source": self.source.value,
        }


@dataclass(frozen=True, kw_only=True)
class Provenance:
    """Where a profile's numbers come from."""

    source: Source
    device_name: str
    torch_version: str
    dtype: str
    date: str
    host: Mapping[str, Any] = field(default_factory=dict, hash=False)
    notes: str = ""


@dataclass(frozen=True, kw_only=True)
class Profile:
    name: str
    device_kind: str
    provenance: Provenance
    entries: tuple[Entry, ...]
    grid: Mapping[str, Any] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        if self.device_kind not in ("cpu", "cuda"):
            raise ProfileSchemaError(
                f"profile {self.name!r}: device_kind must be 'cpu' or 'cuda', "
                f"got {self.device_kind!r}"
            )
        seen: set[Any] = set()
        for e in self.entries:
            k = e.key()
            if k in seen:
                raise ProfileSchemaError(
                    f"profile {self.name!r}: duplicate entry {e.op} {dict(e.params)}"
                )
            seen.add(k)

    def entries_for(self, op: Op) -> tuple[Entry, ...]:
        return tuple(e for e in self.entries if e.op is op)

    def coverage(self) -> dict[str, int]:
        """Number of entries per op (ops with none are omitted)."""
        counts: dict[str, int] = {}
        for e in self.entries:
            counts[e.op.value] = counts.get(e.op.value, 0) + 1
        return counts

    def sources(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for e in self.entries:
            counts[e.source.value] = counts.get(e.source.value, 0) + 1
        return counts

    def to_json(self) -> dict[str, Any]:
        p = self.provenance
        return {
            "schema": SCHEMA,
            "schema_version": SCHEMA_VERSION,
            "name": self.name,
            "device_kind": self.device_kind,
            "provenance": {
                "source": p.source.value,
                "device_name": p.device_name,
                "torch_version": p.torch_version,
                "dtype": p.dtype,
                "date": p.date,
                "host": dict(p.host),
                "notes": p.notes,
            },
            "grid": dict(self.grid),
            "entries": [e.to_json() for e in self.entries],
        }


def op_note(op: Op, text: str) -> str:
    """A provenance note about one op's entries, in the form `with_op_entries` finds."""
    return f" {op.value.capitalize()} entries (op {op.value}{text}"


# Where one op's note ends: at the next op's marker (`op_note`) or the end of the notes.
_NOTE_END = r"(?= \w+ entries \(op |\Z)"


def op_note_text(notes: str, op: Op) -> str | None:
    """The text of `op`'s note in `notes` after its marker (`op_note(op, "")`), up to
    the next op's note; None where `notes` has no note about `op`."""
    found = re.search(rf"{re.escape(op_note(op, ''))}(.*?){_NOTE_END}", notes, re.S)
    return found.group(1) if found else None


def with_some_kinds(
    profile: Profile, op: Op, entries: Sequence[Entry], kinds: Sequence[str], text: str
) -> Profile:
    """`profile` with its entries of `op` of `kinds` replaced by `entries` (a measurement
    of those kinds only, described by `text`: "measured DATE by ..."); the op's entries
    of other kinds kept, and what the file's note said of them."""
    kept = [e for e in profile.entries if e.op is op and str(e.params["kind"]) not in kinds]
    note = op_note(op, f", kind {', '.join(kinds)}): {text}")
    if kept:
        kept_kinds = sorted({str(e.params["kind"]) for e in kept})
        said = op_note_text(profile.provenance.notes, op)
        if said is None:
            note += f" Kinds {', '.join(kept_kinds)}: kept from before (no note)."
        else:
            note += f" Kept from before (op {op.value}{said}"
    return with_op_entries(profile, op, [*kept, *entries], note)


def add_kinds_command(
    argv: Sequence[str] | None,
    description: str,
    kinds: Sequence[FrameworkKind],
    measure: Callable[[], list[Entry]],
    note_text: Callable[[str, Path], str],
) -> list[Entry]:
    """The `--add-to PROFILE` command of a module that measures framework `kinds` of a
    CPU host: parses `argv`, refuses a missing, malformed or non-CPU profile with a usage
    error, runs `measure` and replaces the file's entries of those kinds by its entries
    (the others kept, `with_some_kinds`), described by `note_text(date, path)`. Returns
    the entries, for the module to print."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--add-to", type=Path, required=True, help="a CPU profile JSON file")
    args = parser.parse_args(argv)
    try:
        profile = load_profile_file(args.add_to)
    except ProfileSchemaError as exc:
        parser.error(str(exc))
    if profile.device_kind != "cpu":
        parser.error(f"{args.add_to} is a {profile.device_kind} profile; this measures a CPU host")
    entries = measure()
    date = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    names = [k.value for k in kinds]
    save_profile(
        with_some_kinds(profile, Op.FRAMEWORK, entries, names, note_text(date, args.add_to)),
        args.add_to,
    )
    return entries


def with_op_entries(profile: Profile, op: Op, entries: Sequence[Entry], note: str) -> Profile:
    """`profile` with its entries of `op` replaced by `entries` and the provenance note
    about them (`op_note`) replaced by `note`; the other ops' entries and notes kept."""
    kept = tuple(e for e in profile.entries if e.op is not op)
    marker = re.escape(op_note(op, ""))
    others = re.sub(rf"{marker}.*?{_NOTE_END}", "", profile.provenance.notes)
    return dataclasses.replace(
        profile,
        entries=(*kept, *entries),
        provenance=dataclasses.replace(profile.provenance, notes=others + note),
    )


def save_profile(profile: Profile, path: str | Path) -> Path:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(profile.to_json(), indent=1) + "\n", encoding="utf-8")
    return p


def profile_from_json(data: Any, where: str) -> Profile:
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise ProfileSchemaError(f'{where}: not a placeflow profile (missing "schema": "{SCHEMA}")')
    version = data.get("schema_version")
    if version != SCHEMA_VERSION:
        raise ProfileSchemaError(
            f"{where}: profile schema version {version!r}, this placeflow reads version "
            f"{SCHEMA_VERSION}; re-run `placeflow profile` or convert the file"
        )
    try:
        prov = data["provenance"]
        provenance = Provenance(
            source=Source(prov["source"]),
            device_name=str(prov["device_name"]),
            torch_version=str(prov["torch_version"]),
            dtype=str(prov["dtype"]),
            date=str(prov["date"]),
            host=dict(prov.get("host", {})),
            notes=str(prov.get("notes", "")),
        )
        entries = []
        for i, e in enumerate(data["entries"]):
            try:
                op = Op(e["op"])
                source = Source(e["source"])
            except ValueError as exc:
                raise ProfileSchemaError(f"{where}: entry #{i}: {exc}") from None
            entries.append(
                Entry(
                    op=op,
                    params=_check_params(op, e["params"], f"{where}: entry #{i}"),
                    median_s=float(e["median_s"]),
                    p10_s=float(e["p10_s"]),
                    p90_s=float(e["p90_s"]),
                    repeats=int(e["repeats"]),
                    source=source,
                )
            )
        return Profile(
            name=str(data["name"]),
            device_kind=str(data["device_kind"]),
            provenance=provenance,
            entries=tuple(entries),
            grid=dict(data.get("grid", {})),
        )
    except KeyError as exc:
        raise ProfileSchemaError(f"{where}: missing key {exc.args[0]!r}") from None
    except (TypeError, ValueError) as exc:
        if isinstance(exc, ProfileSchemaError):
            raise
        raise ProfileSchemaError(f"{where}: {exc}") from None


def load_profile_file(path: str | Path) -> Profile:
    p = Path(path)
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ProfileSchemaError(f"{p}: profile file not found") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ProfileSchemaError(f"{p}: malformed JSON: {exc}") from None
    except OSError as exc:
        raise ProfileSchemaError(f"{p}: cannot read ({exc.strerror})") from None
    return profile_from_json(data, str(p))
