"""Tokenizers: text <-> token ids, for building prompts and reading responses.

Only the task side uses text (prompts in, a checker reads responses); between
rollout and training everything stays token ids. `ByteTokenizer` is built in
code for the random-init models (vocabulary 256: one id per byte, so no file is
needed); `HFTokenizer` wraps a transformers tokenizer loaded from a checkpoint.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol


class Tokenizer(Protocol):
    eos_id: int  # generation stops after it
    pad_id: int  # fills the batch; masked out everywhere

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...


class ByteTokenizer:
    """UTF-8 bytes as ids 0..255; newline ends a response, NUL pads."""

    vocab_size = 256

    def __init__(self, *, eos: str = "\n") -> None:
        (self.eos_id,) = eos.encode()
        self.pad_id = 0

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> str:
        return bytes(i for i in ids if 0 < i < 256).decode("utf-8", errors="replace")


class HFTokenizer:
    """A transformers tokenizer from a checkpoint directory or GGUF file."""

    def __init__(self, path: str | Path) -> None:
        from transformers import AutoTokenizer  # heavy import, only for real checkpoints

        p = Path(path)
        tok: Any
        if p.suffix == ".gguf":
            tok = AutoTokenizer.from_pretrained(str(p.parent), gguf_file=p.name)
        else:
            tok = AutoTokenizer.from_pretrained(str(p))
        self._tok = tok
        self.eos_id = int(tok.eos_token_id)
        self.pad_id = int(tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id)

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False))

    def decode(self, ids: list[int]) -> str:
        return str(self._tok.decode(ids, skip_special_tokens=True))
