"""Batch: sample operations return new batches, keep tensors and metadata aligned."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from placeflow.executor.batch import Batch
from placeflow.fields import Field


def make_batch(lengths: list[int]) -> Batch:
    """Sample i: tokens 100*i + 1, ..., 100*i + len; a float per token; its id in meta."""
    tokens = [torch.arange(1, n + 1) + 100 * i for i, n in enumerate(lengths)]
    return Batch.from_sequences(
        {"input_ids": tokens, "logprobs": [t.float() / 10 for t in tokens]},
        meta={"sample_id": list(range(len(lengths))), "prompt": [f"p{i}" for i in lengths]},
    )


def sample_ids(b: Batch) -> list[int]:
    return list(b.meta["sample_id"])


def test_from_sequences_pads_right_and_unpad_inverts():
    b = make_batch([3, 1, 2])
    assert len(b) == 3
    assert b.tensors["input_ids"].tolist() == [[1, 2, 3], [101, 0, 0], [201, 202, 0]]
    assert b.tensors[Field.ATTENTION_MASK].tolist() == [
        [True] * 3,
        [True, False, False],
        [True, True, False],
    ]
    assert b.seq_lens() == [3, 1, 2]
    assert [t.tolist() for t in b.unpad("input_ids")] == [[1, 2, 3], [101], [201, 202]]


def test_select_reorder_and_chunk_keep_samples_aligned():
    b = make_batch([3, 1, 2, 4, 5])
    s = b.select([4, 0, 0])
    assert sample_ids(s) == [4, 0, 0]
    assert s.tensors["input_ids"][0, 0].item() == 401
    assert sample_ids(b.reorder([1, 0, 2, 4, 3])) == [1, 0, 2, 4, 3]
    chunks = b.chunk(2)
    assert [sample_ids(c) for c in chunks] == [[0, 1, 2], [3, 4]]
    assert [len(c) for c in b.chunk(7)] == [1, 1, 1, 1, 1, 0, 0]


def test_operations_return_new_batches_and_leave_inputs_alone():
    b = make_batch([3, 1, 2])
    before = b.tensors["input_ids"].clone()
    s = b.select([2, 1])
    s.tensors["input_ids"][0, 0] = -7  # writing into the result must not reach the input
    b.pad_to(6)
    b.trim()
    Batch.concat([b, b])
    assert torch.equal(b.tensors["input_ids"], before)
    assert b.tensors[Field.ATTENTION_MASK].shape == (3, 3)
    source = {"x": torch.zeros(2)}
    owned = Batch(tensors=source)
    source["y"] = torch.zeros(2)
    assert set(owned.tensors) == {"x"}


def test_pad_to_and_trim():
    b = make_batch([2, 1])
    wide = b.pad_to(5, pad_value=-1)
    # New positions get the pad value; existing padding stays as it was.
    assert wide.tensors["input_ids"].tolist() == [[1, 2, -1, -1, -1], [101, 0, -1, -1, -1]]
    assert wide.tensors[Field.ATTENTION_MASK].sum().item() == 3
    assert wide.seq_lens() == [2, 1]
    narrow = wide.trim()
    assert narrow.tensors["input_ids"].tolist() == [[1, 2], [101, 0]]
    with pytest.raises(ValueError, match="narrower"):
        b.pad_to(1)


def test_concat_needs_matching_fields_and_widths():
    a, b = make_batch([2, 3]), make_batch([1])
    with pytest.raises(RuntimeError):
        Batch.concat([a, b])  # widths 3 and 1: pad first
    both = Batch.concat([a, b.pad_to(3)])
    assert sample_ids(both) == [0, 1, 0]
    with pytest.raises(ValueError, match="different fields"):
        Batch.concat([a, Batch(tensors={"x": torch.zeros(1)})])
    with pytest.raises(ValueError, match="at least one"):
        Batch.concat([])


def test_validation_errors():
    with pytest.raises(ValueError, match="disagree"):
        Batch(tensors={"x": torch.zeros(2)}, meta={"id": (1, 2, 3)})
    with pytest.raises(ValueError, match="scalars"):
        Batch(tensors={"x": torch.tensor(1.0)})
    with pytest.raises(ValueError, match="attention_mask"):
        Batch(tensors={"x": torch.zeros(2, 3)}, seq_keys=("x",))
    with pytest.raises(ValueError, match="first two dimensions"):
        Batch(
            tensors={
                "x": torch.zeros(2, 4),
                Field.ATTENTION_MASK: torch.ones(2, 3, dtype=torch.bool),
            },
            seq_keys=("x",),
        )
    with pytest.raises(ValueError, match="permutation"):
        make_batch([1, 2]).reorder([0, 0])
    with pytest.raises(IndexError):
        make_batch([1, 2]).select([2])
    with pytest.raises(ValueError, match="no sequence"):
        Batch(tensors={"x": torch.zeros(2)}).seq_lens()


@settings(max_examples=50, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 6), min_size=0, max_size=12),
    num_chunks=st.integers(1, 5),
    data=st.data(),
)
def test_chunk_concat_and_permutation_round_trip(lengths, num_chunks, data):
    b = make_batch(lengths) if lengths else Batch(tensors={"x": torch.zeros(0)})
    back = Batch.concat(b.chunk(num_chunks))
    for key in b.tensors:
        assert torch.equal(back.tensors[key], b.tensors[key])
    assert back.meta == b.meta
    perm = data.draw(st.permutations(range(len(b))))
    inverse = [0] * len(perm)
    for pos, i in enumerate(perm):
        inverse[i] = pos
    again = b.reorder(perm).reorder(inverse)
    for key in b.tensors:
        assert torch.equal(again.tensors[key], b.tensors[key])


def test_only_keeps_the_named_tensors_and_the_meta():
    """What the controller sends a call (`placeflow.fields.call_inputs`)."""
    b = Batch(
        tensors={
            Field.PROMPT: torch.zeros(3, 2, dtype=torch.long),
            Field.RESPONSE: torch.ones(3, 4, dtype=torch.long),
            Field.ADVANTAGES: torch.arange(3.0),
        },
        meta={"uid": ("a", "b", "c")},
    )
    got = b.only([Field.ADVANTAGES, Field.PROMPT])
    assert list(got.tensors) == [Field.ADVANTAGES, Field.PROMPT]
    assert torch.equal(got.tensors[Field.ADVANTAGES], torch.arange(3.0))
    assert got.meta == {"uid": ("a", "b", "c")}
    assert set(b.tensors) == {Field.PROMPT, Field.RESPONSE, Field.ADVANTAGES}  # untouched
    with pytest.raises(KeyError, match="returns"):
        b.only([Field.RETURNS])
