"""Property: random TOML documents fed to the spec loaders give a spec or a SpecError, never
anything else (a KeyError, TypeError, ZeroDivisionError ... would be a traceback for the user).

The documents mix the loaders' real keys (so that they get past the first checks
and reach the deeper ones) with random keys and values of every TOML type,
including NaN, infinities, huge integers and nested tables. A second property
feeds random bytes to the file readers. No exception is swallowed: anything but
SpecError fails the test with its traceback.
"""

from __future__ import annotations

import contextlib
import copy
from pathlib import Path
from typing import Any

import tomli_w
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from placeflow.cluster import cluster_from_dict, load_cluster
from placeflow.errors import SpecError
from placeflow.plan import load_plan, plan_from_dict
from placeflow.workload import load_workload, workload_from_dict

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
KEYS = [
    *("name", "pools", "gpu", "num_nodes", "gpus_per_node", "price_per_gpu_hour", "memory_gib"),
    *("profile", "cores_per_node", "algorithm", "models", "batch", "reward_function", "rl"),
    *("actor", "critic", "ref", "reward", "cost", "prompts_per_step", "samples_per_prompt"),
    *("prompt_len", "response_len", "ppo_epochs", "mini_batches", "response_len_dist"),
    *("temperature", "lr", "kl_coef", "workload", "cluster", "sets", "roles", "pool"),
    *("first_device", "num_devices", "parallelism", "t", "d", "p", "tg", "micro_batch", "zero"),
]
STRINGS = ["h100-sxm", "cpu", "tiny-llama", "grpo", "ppo", "actor", "ref", "arith", "", "../x"]

scalars = st.one_of(
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.sampled_from([0, 1, 2, 4, 8, -1, 2**40]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.sampled_from(STRINGS),
    st.text(max_size=8),
)
keys = st.one_of(st.sampled_from(KEYS), st.text(min_size=1, max_size=6))
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(keys, inner, max_size=5),
    max_leaves=20,
)
documents = st.dictionaries(keys, values, max_size=8)

GOOD = {
    "cluster": {"name": "c", "pools": [{"gpu": "h100-sxm", "num_nodes": 2, "gpus_per_node": 8}]},
    "workload": {
        "algorithm": "grpo",
        "models": {"actor": "tiny-llama", "ref": "tiny-llama"},
        "batch": {"prompts_per_step": 4, "prompt_len": 8, "response_len": 8},
    },
}


def _mutated(base: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """`base` with `patch` merged in at the top and inside its first table of each kind."""
    doc = copy.deepcopy(base)
    doc.update(patch)
    for value in list(doc.values()):
        if isinstance(value, dict):
            value.update(patch)
        elif isinstance(value, list) and value and isinstance(value[0], dict):
            value[0].update(patch)
    return doc


def _load_or_spec_error(load: Any, *args: Any) -> None:
    with contextlib.suppress(SpecError):  # anything else propagates and fails the test
        load(*args)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(doc=documents, patch=documents)
def test_random_documents_give_a_spec_or_a_spec_error(
    doc: dict[str, Any], patch: dict[str, Any]
) -> None:
    for loader, base in (
        (cluster_from_dict, GOOD["cluster"]),
        (workload_from_dict, GOOD["workload"]),
    ):
        _load_or_spec_error(loader, doc, "fuzz")
        _load_or_spec_error(loader, _mutated(base, patch), "fuzz")
    plan = {
        "workload": GOOD["workload"],
        "cluster": GOOD["cluster"],
        "sets": [{"roles": ["actor", "ref"], "pool": "pool0", "num_devices": 8}],
        "parallelism": {"actor": {"t": 2}, "ref": {}},
    }
    _load_or_spec_error(plan_from_dict, doc, "fuzz", EXAMPLES / "plans")
    _load_or_spec_error(plan_from_dict, _mutated(plan, patch), "fuzz", EXAMPLES / "plans")


@settings(max_examples=60, deadline=None)
@given(doc=documents)
def test_random_toml_files_give_a_spec_or_a_spec_error(doc: dict[str, Any]) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "spec.toml"
        path.write_text(tomli_w.dumps(doc))
        for load in (load_cluster, load_workload, load_plan):
            _load_or_spec_error(load, path)


@settings(max_examples=60, deadline=None)
@given(data=st.binary(max_size=200))
def test_random_bytes_give_a_spec_error(data: bytes) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "spec.toml"
        path.write_bytes(data)
        for load in (load_cluster, load_workload, load_plan):
            _load_or_spec_error(load, path)
