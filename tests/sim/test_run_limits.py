"""Run limits in the simulator: a class's ``max_runtime`` applied in simulated time by the rule the control plane
applies (``raylane.scheduling.runlimit``), and counted in the result and the report.

One node of 8 GPUs, FIFO, no preemption; jobs of class ``capped`` (checkpoint every 30 s, a limit of 100 s) hold the
whole node, so each attempt is easy to follow: an attempt stopped at 100 s keeps 90 s of work and loses 10.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Dict, List, Tuple

import pytest

from raylane.scheduling.types import WorkloadClass
from raylane.sim.metrics import summarize
from raylane.sim.outages import NodeFailure, Outages
from tests.sim.builders import job, outcome, replay, trace

REQUEUE = WorkloadClass("capped", priority=100, preemptible=True, checkpoint_interval_s=30.0, grace_period_s=0.0,
                        max_runtime_s=100.0, on_max_runtime="requeue")
STOP = replace(REQUEUE, on_max_runtime="stop")
CLASSES = {"capped": REQUEUE}


@dataclass
class Case:
    name: str
    jobs: List[Any]
    cls: WorkloadClass
    # job id -> (first start, finish, scheduler preemptions); finish -1: it never finished
    want: Dict[str, Tuple[float, float, int]]
    requeues: int = 0
    stops: int = 0
    lost_gpu_s: float = 0.0
    options: Dict[str, Any] = field(default_factory=dict)


CASES = [
    Case("requeue: every attempt gets a fresh limit, keeps its checkpointed work and goes on",
         [job("a").gpus(8).cls("capped").runs(250)], REQUEUE,
         # 0-100 keeps 90 s, 100-200 keeps 90 s, 200-270 does the last 70 s.
         {"a": (0, 270, 0)}, requeues=2, lost_gpu_s=2 * 10 * 8),
    Case("requeue: back at its original place, so under FIFO it goes on before later work",
         [job("a").gpus(8).cls("capped").runs(150), job("b").gpus(8).at(10).runs(20)], REQUEUE,
         {"a": (0, 160, 0), "b": (160, 180, 0)}, requeues=1, lost_gpu_s=10 * 8),
    Case("work that ends as its limit falls due finishes",
         [job("a").gpus(8).cls("capped").runs(100)], REQUEUE, {"a": (0, 100, 0)}),
    Case("stop: it ends unfinished at its limit and the next job starts",
         [job("a").gpus(8).cls("capped").runs(250), job("b").gpus(8).at(10).runs(20)], STOP,
         {"a": (0, -1, 0), "b": (100, 120, 0)}, stops=1),
    Case("stop: the limit counts every attempt (60 s before a node failure, 40 s after its repair)",
         [job("a").gpus(8).cls("capped").runs(250)], STOP, {"a": (0, -1, 0)}, stops=1,
         options={"outages": Outages(failures=(NodeFailure("node-000", 60, 10),))}),
    Case("a limit the job never reaches changes nothing",
         [job("a").gpus(8).cls("capped").runs(90)], replace(REQUEUE, max_runtime_s=1000.0), {"a": (0, 90, 0)}),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_run_limits(case: Case):
    r = replay(trace(*case.jobs), nodes=1, classes={"capped": case.cls}, **case.options)
    assert outcome(r) == case.want
    s = summarize(r)
    assert s["run_limits"] == {"requeues": case.requeues, "stops": case.stops,
                               "lost_gpu_hours": pytest.approx(case.lost_gpu_s / 3600.0)}
    assert s["outages"]["requeues"]["run_limit"] == case.requeues
    assert s["jobs"]["finished"] == sum(1 for _, end, _ in case.want.values() if end >= 0)


def test_a_stopped_job_ran_its_limit_across_attempts():
    case = CASES[4]
    r = replay(trace(*case.jobs), nodes=1, classes={"capped": STOP}, **case.options)
    # It held the node 0-60 and 70-110: 100 s in all, the limit.
    assert r.team_gpu_s["default"] == pytest.approx(8 * 100)
    assert r.requeues["failure"] == 1 and r.end_time == 110


def test_a_replay_without_limits_reports_no_run_limit_figures():
    unlimited = replace(REQUEUE, max_runtime_s=None)
    r = replay(trace(job("a").gpus(8).cls("capped").runs(250)), nodes=1, classes={"capped": unlimited})
    s = summarize(r)
    assert "run_limits" not in s and "run_limit" not in s["outages"]["requeues"]
    assert r.run_limit_stops is None and outcome(r) == {"a": (0, 250, 0)}


def test_a_limit_no_job_reaches_changes_no_figure_of_a_real_trace():
    from tests.sim.builders import TIRESIAS
    from raylane.sim import load_trace
    from raylane.sim.types import DEFAULT_CLASS

    tr = load_trace(TIRESIAS)
    base = replay(tr, nodes=1, preset="las")
    far = replay(tr, nodes=1, preset="las", default_class=replace(DEFAULT_CLASS, max_runtime_s=1e9))
    assert outcome(far) == outcome(base) and far.lost_work == base.lost_work
    s, t = summarize(base), summarize(far)
    assert t.pop("run_limits") == {"requeues": 0, "stops": 0, "lost_gpu_hours": 0.0}
    assert t["outages"]["requeues"].pop("run_limit") == 0 and t["outages"]["lost_gpu_hours"].pop("run_limit") == 0
    for k in ("jct", "queueing", "wait", "makespan_s", "utilization", "preemptions", "fairness", "outages"):
        assert t[k] == s[k], k


def test_a_run_limit_stop_is_a_measured_stop_delay_of_a_journal():
    from raylane.control.journal import Entry
    from raylane.sim.journal import stop_delays

    entries = [Entry(1, 10.0, "run_limit", "w", {}), Entry(2, 13.5, "requeued", "w", {}),
               Entry(3, 20.0, "run_limit", "v", {}), Entry(4, 21.0, "finished", "v", {})]
    assert stop_delays(entries) == [3.5, 1.0]
