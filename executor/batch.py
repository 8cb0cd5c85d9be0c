"""Batch: the one data type that travels between the controller and the workers.

A Batch is named tensors whose first dimension is the sample, plus per-sample
metadata (a tuple per key, one entry per sample: prompt ids, group ids, text);
tensor names are declared in `placeflow/fields.py`. Every operation returns a
new Batch and leaves its inputs alone; tensors are shared where no copy is
needed (`select` and `chunk` copy, `concat` copies), so treat a Batch's
tensors as read-only.

Sequence layout. Tensors named in `seq_keys` are laid out [sample, position,
...] and right-padded; the boolean tensor `attention_mask` [sample, position]
marks real tokens. `from_sequences` pads variable-length sequences into this
layout, `unpad` gives them back, `pad_to` widens the padding and `trim` drops
the positions no sample uses.

Devices. A Batch's tensors may live on any device (the controller's are on
CPU, a worker's on its GPU); `to` moves them all. What a Batch builds itself
(a selection index, a mask) is made on the device of the tensors it meets, so
a Batch on a GPU never mixes in a CPU tensor.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from placeflow.fields import Field

_MASK = Field.ATTENTION_MASK  # the sequence layout's mask (a StrEnum, formats as its name)


@dataclass(frozen=True, eq=False)  # tensors have no boolean ==; a Batch is a value by content
class Batch:
    tensors: Mapping[str, torch.Tensor]
    meta: Mapping[str, tuple[Any, ...]] = field(default_factory=dict)
    seq_keys: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        # Own copies of the mappings, so a caller's later edits cannot change this value.
        object.__setattr__(self, "tensors", dict(self.tensors))
        object.__setattr__(self, "meta", {k: tuple(v) for k, v in self.meta.items()})
        object.__setattr__(self, "seq_keys", tuple(self.seq_keys))
        sizes = {k: int(t.shape[0]) for k, t in self.tensors.items() if t.dim() > 0}
        sizes |= {k: len(v) for k, v in self.meta.items()}
        scalars = [k for k, t in self.tensors.items() if t.dim() == 0]
        if scalars:
            raise ValueError(f"batch tensors need a sample dimension; {scalars} are scalars")
        if len(set(sizes.values())) > 1:
            raise ValueError(f"batch fields disagree on the number of samples: {sizes}")
        if self.seq_keys:
            self._check_seq_layout()

    def _check_seq_layout(self) -> None:
        if _MASK not in self.tensors:
            raise ValueError(f"seq_keys {self.seq_keys} need an '{_MASK}' tensor")
        mask = self.tensors[_MASK]
        if mask.dim() != 2 or mask.dtype != torch.bool:
            raise ValueError(f"{_MASK} must be a bool [sample, position] tensor, got {mask.shape}")
        for key in self.seq_keys:
            if key not in self.tensors:
                raise ValueError(f"seq_keys names {key!r}, which is not a tensor of the batch")
            if self.tensors[key].shape[:2] != mask.shape:
                raise ValueError(
                    f"sequence tensor {key!r} of shape {tuple(self.tensors[key].shape)} does not "
                    f"match {_MASK} {tuple(mask.shape)} in its first two dimensions"
                )

    def __len__(self) -> int:
        for t in self.tensors.values():
            return int(t.shape[0])
        for v in self.meta.values():
            return len(v)
        return 0

    def to(self, device: torch.device | str) -> Batch:
        """The same samples with every tensor on `device` (tensors already there are shared)."""
        return Batch(
            tensors={k: t.to(device) for k, t in self.tensors.items()},
            meta=self.meta,
            seq_keys=self.seq_keys,
        )

    # --- samples --------------------------------------------------------------
    def only(self, keys: Sequence[str]) -> Batch:
        """This batch with the tensors `keys` alone (in that order), its meta kept; a
        KeyError names the keys it lacks."""
        missing = [k for k in keys if k not in self.tensors]
        if missing:
            raise KeyError(f"batch has no {missing}; it has {sorted(self.tensors)}")
        kept = set(keys)
        seq_keys = tuple(k for k in self.seq_keys if k in kept) if _MASK in kept else ()
        return Batch(tensors={k: self.tensors[k] for k in keys}, meta=self.meta, seq_keys=seq_keys)

    def select(self, indices: Sequence[int]) -> Batch:
        """The samples at `indices`, in that order (repeats allowed)."""
        n = len(self)
        bad = [i for i in indices if not 0 <= i < n]
        if bad:
            raise IndexError(f"sample indices {bad[:5]} out of range for a batch of {n}")
        index = {
            t.device: torch.as_tensor(list(indices), dtype=torch.long, device=t.device)
            for t in self.tensors.values()
        }
        return Batch(
            tensors={k: t.index_select(0, index[t.device]) for k, t in self.tensors.items()},
            meta={k: tuple(v[i] for i in indices) for k, v in self.meta.items()},
            seq_keys=self.seq_keys,
        )

    def reorder(self, order: Sequence[int]) -> Batch:
        """Sample i of the result is sample order[i] of this batch; `order` is a permutation."""
        if sorted(order) != list(range(len(self))):
            raise ValueError(f"reorder needs a permutation of range({len(self)})")
        return self.select(order)

    def chunk(self, num_chunks: int) -> list[Batch]:
        """Contiguous chunks; the first len % num_chunks get one sample more."""
        if num_chunks <= 0:
            raise ValueError(f"num_chunks must be positive, got {num_chunks}")
        base, extra = divmod(len(self), num_chunks)
        chunks, start = [], 0
        for c in range(num_chunks):
            stop = start + base + (1 if c < extra else 0)
            chunks.append(self.select(range(start, stop)))
            start = stop
        return chunks

    @staticmethod
    def concat(batches: Sequence[Batch]) -> Batch:
        """Samples of all batches in order. Keys and sequence widths must agree (see pad_to)."""
        if not batches:
            raise ValueError("concat needs at least one batch")
        first = batches[0]
        for b in batches[1:]:
            if b.tensors.keys() != first.tensors.keys() or b.meta.keys() != first.meta.keys():
                raise ValueError(
                    f"concat: batches have different fields: {sorted(first.tensors)} + "
                    f"{sorted(first.meta)} vs {sorted(b.tensors)} + {sorted(b.meta)}"
                )
            if b.seq_keys != first.seq_keys:
                raise ValueError(f"concat: seq_keys differ: {first.seq_keys} vs {b.seq_keys}")
        return Batch(
            tensors={k: torch.cat([b.tensors[k] for b in batches]) for k in first.tensors},
            meta={k: tuple(x for b in batches for x in b.meta[k]) for k in first.meta},
            seq_keys=first.seq_keys,
        )

    # --- sequences ------------------------------------------------------------
    @staticmethod
    def from_sequences(
        sequences: Mapping[str, Sequence[torch.Tensor]],
        meta: Mapping[str, Sequence[Any]] | None = None,
        *,
        pad_value: float = 0,
    ) -> Batch:
        """Right-pad per-sample sequences [len, ...] into [sample, max_len, ...] and a mask."""
        lengths: list[int] | None = None
        for key, seqs in sequences.items():
            lens = [int(s.shape[0]) for s in seqs]
            if lengths is not None and lens != lengths:
                raise ValueError(f"sequence {key!r} has lengths {lens}, others have {lengths}")
            lengths = lens
        if lengths is None:
            raise ValueError("from_sequences needs at least one named sequence")
        width = max(lengths, default=0)
        firsts = [seqs[0] for seqs in sequences.values() if len(seqs)]
        device = firsts[0].device if firsts else torch.device("cpu")
        len_t = torch.tensor(lengths, dtype=torch.long, device=device)
        mask = torch.arange(width, device=device)[None, :] < len_t[:, None]
        tensors = {k: _pad_stack(seqs, width, pad_value) for k, seqs in sequences.items()}
        tensors[_MASK] = mask
        return Batch(
            tensors=tensors,
            meta={k: tuple(v) for k, v in (meta or {}).items()},
            seq_keys=tuple(sequences),
        )

    def _mask(self) -> torch.Tensor:
        if not self.seq_keys:
            raise ValueError(f"this batch has no sequence tensors (seq_keys) and no {_MASK}")
        return self.tensors[_MASK]

    def seq_lens(self) -> list[int]:
        """Real tokens per sample."""
        return [int(n) for n in self._mask().sum(dim=1).tolist()]

    def unpad(self, key: str) -> list[torch.Tensor]:
        """The real tokens of sequence tensor `key`, one tensor per sample."""
        if key not in self.seq_keys:
            raise ValueError(f"{key!r} is not a sequence tensor; seq_keys: {self.seq_keys}")
        mask, values = self._mask(), self.tensors[key]
        return [values[i][mask[i]] for i in range(len(self))]

    def pad_to(self, width: int, *, pad_value: float = 0) -> Batch:
        """Right-pad the sequence tensors (and the mask, with False) to `width` positions."""
        current = self._mask().shape[1]
        if width < current:
            raise ValueError(f"pad_to({width}) is narrower than the current {current} positions")
        tensors = dict(self.tensors)
        for key in (*self.seq_keys, _MASK):
            t = tensors[key]
            fill = False if key == _MASK else pad_value
            pad = t.new_full((t.shape[0], width - current, *t.shape[2:]), fill)
            tensors[key] = torch.cat([t, pad], dim=1)
        return Batch(tensors=tensors, meta=self.meta, seq_keys=self.seq_keys)

    def trim(self) -> Batch:
        """Drop trailing positions that no sample uses (the narrowest right-padded form)."""
        width = max(self.seq_lens(), default=0)
        tensors = dict(self.tensors)
        for key in (*self.seq_keys, _MASK):
            tensors[key] = tensors[key][:, :width]
        return Batch(tensors=tensors, meta=self.meta, seq_keys=self.seq_keys)


def _pad_stack(seqs: Sequence[torch.Tensor], width: int, pad_value: float) -> torch.Tensor:
    if not seqs:
        return torch.zeros((0, width))
    first = seqs[0]
    out = first.new_full((len(seqs), width, *first.shape[1:]), pad_value)
    for i, s in enumerate(seqs):
        out[i, : s.shape[0]] = s
    return out
