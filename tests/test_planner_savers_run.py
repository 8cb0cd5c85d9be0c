"""The planner's memory savers run: a plan whose best choice offloads the Adam state
(and turns recomputation off where memory allows) is rehearsed end to end on CPU
workers with the layout and savers it was planned with (issue 21's last item)."""

from __future__ import annotations

import math
from pathlib import Path

from test_planner import PPO_ROLES, cluster, workload
from test_planner_savers import best

from placeflow.catalogue import CATALOGUE
from placeflow.executor.rehearsal import rehearsal_plan
from placeflow.executor.run import RunConfig, run_plan
from placeflow.planner.costtable import build_cost_table
from placeflow.planner.solution import solution_to_plan
from placeflow.profiles.registry import fitted_cost_model


def test_planned_offload_plan_rehearses(ray_cluster: None, tmp_path: Path) -> None:
    # Four 13B models on 8 x 40 GiB: the Adam state does not fit beside the rest, so
    # the planner's best plan offloads it (tests/test_planner_savers.py).
    wl = workload({r: CATALOGUE["llama-2-13b"] for r in PPO_ROLES})
    cl = cluster(1, 8, memory_gib=40.0)
    h100 = {"h100-sxm": fitted_cost_model("h100-sxm")}
    plan = solution_to_plan(best(build_cost_table(wl, cl, h100), cl, wl), wl, cl)
    offloaded = [r for r, p in plan.parallelism.items() if p.offload_optimizer]
    assert offloaded, plan.parallelism
    tiny = rehearsal_plan(plan)
    for role in plan.parallelism:  # the rehearsal keeps the layout and the savers
        got, want = tiny.parallelism[role], plan.parallelism[role]
        assert (got.train, got.offload_optimizer, got.optimizer_step, got.recompute) == (
            want.train,
            want.offload_optimizer,
            want.optimizer_step,
            want.recompute,
        )
    result = run_plan(tiny, tmp_path / "run", RunConfig(steps=2, progress=False))
    assert [r.step for r in result.records] == [0, 1]
    for rec in result.records:
        for key in ("pg_loss", "value_loss", "grad_norm"):
            assert math.isfinite(rec.metrics[key]), (key, rec.metrics)
