"""Cluster and workload specs: the shipped examples load; bad files give clear errors."""

from pathlib import Path

import pytest

from placeflow.cluster import load_cluster
from placeflow.errors import SpecError
from placeflow.workload import Algorithm, Role, load_workload

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


@pytest.mark.parametrize(
    "path", sorted((EXAMPLES / "clusters").glob("*.toml")), ids=lambda p: p.stem
)
def test_example_clusters_load(path):
    cluster = load_cluster(path)
    assert cluster.num_gpus > 0


@pytest.mark.parametrize(
    "path", sorted((EXAMPLES / "workloads").glob("*.toml")), ids=lambda p: p.stem
)
def test_example_workloads_load(path):
    workload = load_workload(path)
    assert Role.ACTOR in workload.roles


def test_example_contents():
    c = load_cluster(EXAMPLES / "clusters" / "h100x16.toml")
    assert (c.pools[0].num_nodes, c.pools[0].gpus_per_node, c.pools[0].profile) == (
        2,
        8,
        "h100-sxm",
    )
    w = load_workload(EXAMPLES / "workloads" / "ppo-llama2-7b.toml")
    assert w.algorithm is Algorithm.PPO and len(w.roles) == 4
    assert (w.batch.prompts_per_step, w.batch.prompt_len, w.batch.response_len) == (
        1024,
        1024,
        1024,
    )
    safe = load_workload(EXAMPLES / "workloads" / "safe-rlhf-llama2-7b.toml")
    assert len(safe.roles) == 5


def write(tmp_path, text, name="x.toml"):
    p = tmp_path / name
    p.write_text(text)
    return p


CLUSTER_OK = '[[pools]]\ngpu = "h100-sxm"\nnum_nodes = 1\ngpus_per_node = 8\n'
WORKLOAD_OK = """algorithm = "ppo"
[models]
actor = "llama-2-7b"
critic = "llama-2-7b"
reward = "llama-2-7b"
[batch]
prompts_per_step = 8
prompt_len = 16
response_len = 16
"""


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[[pools]\n", "malformed TOML"),
        (
            CLUSTER_OK.replace("num_nodes = 1", 'num_nodes = "one"'),
            "num_nodes.*expected an integer",
        ),
        (CLUSTER_OK.replace("num_nodes = 1", "num_nodes = 0"), "num_nodes must be at least 1"),
        (CLUSTER_OK.replace("h100-sxm", "h200"), "unknown gpu 'h200'.*a100-80gb"),
        (CLUSTER_OK + "colour = 1\n", "unknown key.*colour"),
        ('name = "x"\n', "missing key 'pools'"),
    ],
)
def test_bad_cluster_files(tmp_path, text, message):
    path = write(tmp_path, text)
    with pytest.raises(SpecError, match=message) as info:
        load_cluster(path)
    assert str(path) in str(info.value)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (WORKLOAD_OK.replace('"ppo"', '"dpo"'), "unknown algorithm 'dpo'"),
        (WORKLOAD_OK.replace('critic = "llama-2-7b"\n', ""), "needs model.*critic"),
        (WORKLOAD_OK.replace('actor = "llama-2-7b"', 'actor = "gpt-5"'), "unknown model 'gpt-5'"),
        (WORKLOAD_OK.replace("[models]", '[models]\njudge = "llama-2-7b"'), "unknown role 'judge'"),
        (
            WORKLOAD_OK.replace("prompt_len = 16", "prompt_len = -1"),
            "prompt_len must be a positive",
        ),
        (WORKLOAD_OK + "mini_batches = 3\n", "must divide"),
        (
            WORKLOAD_OK.replace('"ppo"', '"grpo"').replace('critic = "llama-2-7b"\n', ""),
            "samples_per_prompt must be at least 2",
        ),
    ],
)
def test_bad_workload_files(tmp_path, text, message):
    with pytest.raises(SpecError, match=message):
        load_workload(write(tmp_path, text))


def test_missing_file(tmp_path):
    with pytest.raises(SpecError, match="file not found"):
        load_cluster(tmp_path / "nope.toml")
