"""Frozen specs hold read-only mappings: no item assignment, hashable, picklable."""

import copy
import pickle
from pathlib import Path

import pytest
from ray import cloudpickle

from placeflow.frozen import FrozenMap
from placeflow.plan import load_plan
from placeflow.workload import Role

PLAN = Path(__file__).resolve().parents[1] / "examples" / "plans" / "ppo-7b-colocate-h100x16.toml"


def test_frozen_map_is_read_only_hashable_and_equal_to_a_dict():
    m = FrozenMap({"a": 1, "b": 2})
    with pytest.raises(TypeError):
        m["a"] = 3  # type: ignore[index]
    with pytest.raises(AttributeError):
        m._data = {}  # type: ignore[misc]
    assert m == {"b": 2, "a": 1} and m != {"a": 1}
    assert hash(m) == hash(FrozenMap({"b": 2, "a": 1}))
    for clone in (
        pickle.loads(pickle.dumps(m)),
        copy.deepcopy(m),
        cloudpickle.loads(cloudpickle.dumps(m)),
    ):
        assert clone == m and isinstance(clone, FrozenMap)


def test_specs_cannot_be_changed_through_their_mappings():
    plan = load_plan(PLAN)
    for mapping, key in ((plan.parallelism, Role.ACTOR), (plan.workload.models, Role.ACTOR)):
        assert isinstance(mapping, FrozenMap)
        with pytest.raises(TypeError):
            mapping[key] = mapping[key]  # type: ignore[index]
    assert pickle.loads(pickle.dumps(plan)).content_hash() == plan.content_hash()
