"""Optimizer and parameter offload: where a role's state lives between phases.

The plan's `offload_optimizer` and `optimizer_step` (placeflow.plan) pick one of
three modes, as the simulator prices them (placeflow.simulator.callcosts):

- NONE: the state stays in the optimizer, on the device.
- DEVICE_STEP (verl's optimizer offload): after each update the state tensors
  are copied to host memory (pinned on CUDA) and dropped from the optimizer;
  before the next optimizer step they are copied back. Between phases the
  optimizer holds nothing on the device.
- HOST_STEP (DeepSpeed ZeRO-Offload, OpenRLHF's --adam_offload): AdamW runs on
  the host over fp32 host copies of the rank's parameters (the master weights);
  each step copies the gradients down and the updated weights back up. The
  device optimizer never holds state.

The host step runs AdamW over the rank's whole local shard (its TP shard, or
its FSDP shard under zero = 3). Under zero 1 or 2 with d > 1 that is every
parameter of the rank, not torch's ZeroRedundancyOptimizer partition: the
gradients are already averaged over d, so every rank computes the same update
(the weights stay equal across d without a broadcast), at the price of a host
copy of the state per rank instead of one per partition.

Parameter offload (`ParamOffload`, the plan's `offload_params`, verl's
`param_offload`): outside the role's own calls its weights are in host memory
(pinned on CUDA) and their device storage is freed; the worker brings them back
before each call and frees them after, copying them to the host first only when
the call changed them (an update). Gradients are already dropped after every
optimizer step, so nothing else stays. The storages are resized in place (as
FSDP frees its unsharded parameters), so every view of a weight, the tied
embedding's, a DTensor's local shard, sees it come back.

Ordering invariants: `step` leaves the device optimizer without state in both
offloaded modes; `resident()` brings the state back for a checkpoint and
offloads it again after, so a checkpoint is the same with and without offload.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from enum import StrEnum

import torch
from torch.distributed.tensor import DTensor

HOST = torch.device("cpu")


class OffloadMode(StrEnum):
    NONE = "none"
    DEVICE_STEP = "device_step"
    HOST_STEP = "host_step"

    @staticmethod
    def of(offload_optimizer: bool, host_step: bool) -> OffloadMode:
        """The mode of a role: `RoleParallelism.offload_optimizer`, `.host_optimizer_step`."""
        if not offload_optimizer:
            return OffloadMode.NONE
        return OffloadMode.HOST_STEP if host_step else OffloadMode.DEVICE_STEP


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


def _to_host(t: torch.Tensor, pin: bool) -> torch.Tensor:
    """A host copy with its own storage (never a view of the device tensor)."""
    out = torch.empty(t.shape, dtype=t.dtype, device=HOST, pin_memory=pin)
    out.copy_(t)
    return out


class OptimizerOffload:
    """Keeps the Adam state where `mode` says between optimizer steps.

    `trainer_optimizer` is the optimizer the trainer built (its param groups hold
    every parameter of the rank); `optimizer` is the one whose `state` holds the
    tensors (ZeroRedundancyOptimizer's inner optimizer for zero 1/2, else the same).
    """

    def __init__(
        self,
        mode: OffloadMode,
        trainer_optimizer: torch.optim.Optimizer,
        optimizer: torch.optim.Optimizer,
        device: torch.device,
    ) -> None:
        self.mode, self.optimizer, self.device = mode, optimizer, device
        self.pin = device.type == "cuda"
        # Host copies of the state, by parameter: {param: {key: host tensor}}.
        self.host_state: dict[torch.Tensor, dict[str, torch.Tensor]] = {}
        self.host_optimizer: torch.optim.Optimizer | None = None
        self._masters: list[tuple[torch.Tensor, torch.Tensor]] = []  # (device param, host fp32)
        if mode is OffloadMode.HOST_STEP:
            self._build_host_optimizer(trainer_optimizer)

    # --- host step ------------------------------------------------------------
    def _build_host_optimizer(self, trainer_optimizer: torch.optim.Optimizer) -> None:
        groups = []
        for group in trainer_optimizer.param_groups:
            masters = []
            for p in group["params"]:
                master = _to_host(_local(p).detach(), self.pin).float().requires_grad_(True)
                self._masters.append((p, master))
                masters.append(master)
            settings = {k: v for k, v in group.items() if k not in ("params", "fused", "foreach")}
            groups.append({"params": masters, **settings})
        # torch's default (for-each) CPU AdamW; the fused kernel is for CUDA.
        self.host_optimizer = torch.optim.AdamW(groups)

    @torch.no_grad()
    def _host_step(self) -> None:
        assert self.host_optimizer is not None
        for p, master in self._masters:
            master.grad = None if p.grad is None else _to_host(_local(p.grad), False).float()
        self.host_optimizer.step()
        for p, master in self._masters:
            if p.grad is not None:
                _local(p).copy_(master)  # up: the updated weights, in the parameter's dtype

    # --- device step ----------------------------------------------------------
    @torch.no_grad()
    def offload(self) -> None:
        """Copy the state to host memory and drop it from the optimizer."""
        for p, state in list(self.optimizer.state.items()):
            if not state:
                continue
            self.host_state[p] = {
                k: _to_host(_local(v), self.pin) if torch.is_tensor(v) else v
                for k, v in state.items()
            }
            del self.optimizer.state[p]

    @torch.no_grad()
    def reload(self) -> None:
        """Put the host copies back into the optimizer, on the device."""
        for p, state in self.host_state.items():
            self.optimizer.state[p] = {
                k: _like(p, v.to(self.device)) if torch.is_tensor(v) else v
                for k, v in state.items()
            }
        self.host_state = {}

    def step_with(self, optimizer: torch.optim.Optimizer) -> None:
        """One optimizer step where the mode says (`optimizer` is the trainer's)."""
        if self.mode is OffloadMode.HOST_STEP:
            self._host_step()
            return
        if self.mode is OffloadMode.DEVICE_STEP:
            self.reload()
        optimizer.step()
        if self.mode is OffloadMode.DEVICE_STEP:
            self.offload()

    @contextmanager
    def resident(self) -> Iterator[torch.optim.Optimizer]:
        """The optimizer whose state a checkpoint reads or writes, with its state in it."""
        if self.mode is OffloadMode.HOST_STEP:
            assert self.host_optimizer is not None
            try:
                yield self.host_optimizer
            finally:
                # A loaded checkpoint wrote the device weights: the masters follow them.
                with torch.no_grad():
                    for p, master in self._masters:
                        master.copy_(_local(p))
            return
        if self.mode is OffloadMode.DEVICE_STEP:
            self.reload()
        try:
            yield self.optimizer
        finally:
            if self.mode is OffloadMode.DEVICE_STEP:
                self.offload()


def _like(param: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """A state tensor for `param`: a DTensor alike when the parameter is one (with its
    global shape given: FSDP's last shard may be shorter, even empty)."""
    if isinstance(param, DTensor) and value.dim() > 0:
        return DTensor.from_local(
            value, param.device_mesh, param.placements, shape=param.shape, stride=param.stride()
        )
    return value


class ParamOffload:
    """Keeps `module`'s parameters in host memory between its calls (`offload_params`).

    Built with the weights on the device; `offload()` copies them to the host and
    frees their device storage, `reload()` allocates it again and copies them back.
    `offload(changed=False)` skips the copy: the host copy is still current.
    """

    def __init__(self, module: torch.nn.Module, device: torch.device) -> None:
        pin = device.type == "cuda"
        seen: dict[int, torch.UntypedStorage] = {}
        for p in module.parameters():
            storage = _local(p.data).untyped_storage()
            seen.setdefault(storage.data_ptr(), storage)
        self.device = device
        # (device storage, its size in bytes, host copy), one per distinct storage
        self.storages = [
            (st, st.nbytes(), torch.empty(st.nbytes(), dtype=torch.uint8, pin_memory=pin))
            for st in seen.values()
        ]
        self.on_device = True

    @property
    def num_bytes(self) -> int:
        """Bytes the weights take (on the device when there, on the host always)."""
        return sum(n for _, n, _ in self.storages)

    def _bytes(self, storage: torch.UntypedStorage) -> torch.Tensor:
        return torch.empty(0, dtype=torch.uint8, device=self.device).set_(storage)

    @torch.no_grad()
    def offload(self, *, changed: bool = True) -> None:
        """Free the device copy, writing it to the host first if it `changed`."""
        if not self.on_device:
            return
        for storage, _, host in self.storages:
            if changed:
                host.copy_(self._bytes(storage))
            storage.resize_(0)
        self.on_device = False

    @torch.no_grad()
    def reload(self) -> None:
        """Allocate the device copy again and fill it from the host."""
        if self.on_device:
            return
        for storage, nbytes, host in self.storages:
            storage.resize_(nbytes)
            self._bytes(storage).copy_(host, non_blocking=False)
        self.on_device = True

    @contextmanager
    def loaded(self, *, changes: bool = False) -> Iterator[None]:
        """The weights on the device for one call; offloaded again after (written back if
        the call `changes` them)."""
        self.reload()
        try:
            yield
        finally:
            self.offload(changed=changes)
