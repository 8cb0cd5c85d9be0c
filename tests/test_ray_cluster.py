"""`placeflow run --address`: a plan on an existing multi-node Ray cluster.

`ray.cluster_utils.Cluster` starts a head (no CPUs) and two nodes of two CPU
slots on this machine; `placeflow run --address` attaches to it from a fresh
process (this test process keeps its own session Ray apart). The oracle is
workers.json: each device set's workers ran on the Ray node that the plan's
node index maps to, the two sets on different nodes.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import tomli_w

from placeflow.executor.errors import InsufficientResourcesError
from placeflow.executor.pools import assign_nodes
from placeflow.plan import load_plan

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
CLI = "import sys; from placeflow.cli import main; sys.exit(main(sys.argv[1:]))"


def _split_plan(path: Path) -> Path:
    """PPO split over two nodes of two CPU workers: actor+ref on node 0, critic on node 1."""
    plan = {
        "name": "ppo-tiny-two-nodes",
        "workload": str(EXAMPLES / "workloads" / "ppo-tiny-cpu.toml"),
        "cluster": {
            "name": "two-nodes",
            "pools": [{"name": "cpu", "gpu": "cpu", "num_nodes": 2, "gpus_per_node": 2}],
        },
        "sets": [
            {"roles": ["actor", "ref"], "pool": "cpu", "first_device": 0, "num_devices": 2},
            {"roles": ["critic"], "pool": "cpu", "first_device": 2, "num_devices": 2},
        ],
        "parallelism": {
            "actor": {"d": 2, "micro_batch": 8},
            "ref": {"d": 2, "micro_batch": 16},
            "critic": {"d": 2, "micro_batch": 8},
        },
    }
    path.write_bytes(tomli_w.dumps(plan).encode())
    return path


def test_split_plan_runs_across_nodes_of_an_existing_cluster(tmp_path: Path) -> None:
    cluster_utils = pytest.importorskip("ray.cluster_utils")
    cluster = cluster_utils.Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    try:
        nodes = [cluster.add_node(num_cpus=2) for _ in range(2)]
        cluster.wait_for_nodes()
        plan_path = _split_plan(tmp_path / "plan.toml")
        run_dir = tmp_path / "run"
        args = ["run", str(plan_path), "--address", cluster.address, "--steps", "2"]
        proc = subprocess.run(
            [sys.executable, "-c", CLI, *args, "--run-dir", str(run_dir), "--no-progress"],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        workers = json.loads((run_dir / "workers.json").read_text())
        node_ids = {n.node_id for n in nodes}
        by_set = {s: {w["node_id"] for w in workers if w["set"] == s} for s in (0, 1)}
        assert all(len(ids) == 1 for ids in by_set.values()), by_set  # a set on one node
        assert by_set[0] | by_set[1] == node_ids  # the two sets on the two nodes
        lines = (run_dir / "metrics.jsonl").read_text().splitlines()
        assert len(lines) == 2
    finally:
        cluster.shutdown()


def test_a_plan_node_no_ray_node_holds_is_named(tmp_path: Path) -> None:
    plan = load_plan(_split_plan(tmp_path / "plan.toml"))
    nodes = [
        {"NodeID": "a" * 56, "Alive": True, "Resources": {"CPU": 2.0}},
        {"NodeID": "b" * 56, "Alive": True, "Resources": {"CPU": 1.0}},
    ]
    with pytest.raises(InsufficientResourcesError, match=r"node 1 of pool 'cpu' needs 2 CPU"):
        assign_nodes(plan, nodes)
    nodes[1]["Resources"] = {"CPU": 4.0}
    assert assign_nodes(plan, nodes) == {("cpu", 0): "a" * 56, ("cpu", 1): "b" * 56}
    # One machine with room for both logical nodes holds them both.
    assert set(assign_nodes(plan, [{"NodeID": "c", "Resources": {"CPU": 16.0}}]).values()) == {"c"}
