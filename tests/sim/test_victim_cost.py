"""The victim cost in the simulator: checkpoints reach the core's leases, and the figure a cheaper choice lowers
(GPU-hours lost to preemption) is in the report. Pure: no Ray."""
from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from raylane.scheduling.types import WorkloadClass
from raylane.cli.sim import app
from raylane.sim.metrics import summarize

from tests.sim.builders import job, replay, trace

LOW = WorkloadClass("low", priority=10, preemptible=True, checkpoint_interval_s=300.0, grace_period_s=0.0)
HIGH = WorkloadClass("high", priority=100, preemptible=True, checkpoint_interval_s=300.0, grace_period_s=0.0)


@pytest.mark.parametrize("cost, victim, lost_gpu_s", [
    # At 1,000 s: a (from 0) checkpointed at 900, b (from 200) at 800. a loses 100 s x 4 GPUs, b 200 s x 4.
    ("lost_work", "a", 400.0),
    ("recency", "b", 800.0),  # the most recently started, whatever its checkpoints
])
def test_the_replay_stops_the_lease_that_loses_least(cost, victim, lost_gpu_s):
    tr = trace(job("a").cls("low").gpus(4).at(0).runs(10_000), job("b").cls("low").gpus(4).at(200).runs(10_000),
               job("c").cls("high").gpus(4).at(1000).runs(100))
    r = replay(tr, classes={"low": LOW, "high": HIGH},
               config=dict(ordering="priority", preemption="default", victim_cost=cost))
    assert {j.id: r.preemptions[k] for k, j in enumerate(r.jobs)} == {"a": int(victim == "a"),
                                                                     "b": int(victim == "b"), "c": 0}
    s = summarize(r)
    assert s["outages"]["lost_gpu_hours"]["preemption"] == pytest.approx(lost_gpu_s / 3600)
    assert s["policy"]["victim_cost"] == cost


def test_victim_cost_flag_reaches_the_report_and_the_table_shows_lost_gpu_hours(tmp_path):
    tr = tmp_path / "pair.csv"
    tr.write_text("id,submit_time,duration,gpus\na,0,1000,8\nb,30,50,1\n")
    base = [str(tr), "--nodes", "1", "--preset", "las", "--las-thresholds", "100", "--hysteresis-min-run", "0",
            "--no-plots"]
    res = CliRunner().invoke(app, base + ["--victim-cost", "recency", "--json"])
    assert res.exit_code == 0, res.output
    run = json.loads(res.stdout)["runs"]["las"]
    assert run["policy"]["victim_cost"] == "recency"
    # a ran 30 s with no checkpoint when b preempted it: 30 s x 8 GPUs lost.
    assert run["outages"]["lost_gpu_hours"]["preemption"] == pytest.approx(240 / 3600)
    res = CliRunner().invoke(app, base)
    assert res.exit_code == 0, res.output
    assert "lost GPU-h (preempt)" in res.stdout


def test_an_unknown_victim_cost_flag_names_the_value_and_what_is_allowed():
    res = CliRunner().invoke(app, ["--generate", "heavy-tail", "--nodes", "2", "--victim-cost", "newest",
                                   "--hysteresis-fraction", "-1"])
    assert res.exit_code == 1
    assert "--victim-cost: got 'newest'; one of lost_work, recency" in res.stderr
    assert "--hysteresis-fraction: got -1.0" in res.stderr  # every bad flag at once
