"""Outages in a replay (node failures, drains, failures drawn from an MTBF) and the stranded-GPU figure, case by
case on tiny clusters with exact expected starts, finishes and costs. Pure: no Ray."""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Dict, List, Optional, Tuple

import pytest

from raylane.errors import FatalError, NotFoundError, ValidationError
from raylane.scheduling.types import WorkloadClass
from raylane.sim import summarize
from raylane.sim.metrics import time_weighted_quantile
from raylane.sim.outages import NodeDrain, NodeFailure, Outages, load_node_events, parse_outage
from tests.sim.builders import job, outcome, replay, trace

# Checkpoints every 60 s of run time: a lease stopped at 130 s keeps 120 s of work and loses 10.
CKPT_60 = WorkloadClass("train", priority=100, preemptible=True, checkpoint_interval_s=60.0, grace_period_s=0.0)
A, B = "node-000", "node-001"


@dataclass
class Case:
    name: str
    jobs: List[Any]
    outages: Outages
    # job id -> (first start, finish, scheduler preemptions)
    want: Dict[str, Tuple[float, float, int]]
    nodes: int = 2
    # requeues by cause, GPU-seconds lost by cause, drains (node, start, drained at), GPU-seconds down
    requeues: Dict[str, int] = field(default_factory=dict)
    lost: Dict[str, float] = field(default_factory=dict)
    drains: Optional[List[Tuple[str, float, Optional[float]]]] = None
    down_gpu_s: Optional[float] = None
    options: Dict[str, Any] = field(default_factory=dict)


CASES = [
    Case("a failure requeues the lease; it resumes from its last checkpoint once the node is back",
         [job("a").gpus(8).at(0).runs(1000)], Outages(failures=(NodeFailure(A, 130, 70),)),
         {"a": (0, 200 + 880, 0)}, nodes=1,
         requeues={"failure": 1}, lost={"failure": 8 * 10}, down_gpu_s=8 * 70),
    Case("a requeued lease resumes at once on the capacity left, keeping its place",
         [job("a").gpus(8).at(0).runs(1000), job("b").gpus(8).at(50).runs(100)],
         Outages(failures=(NodeFailure(A, 130, None),)),
         # a (on node-000) keeps 120 s; b (on node-001 since 50) runs on; a resumes on node-001 when b ends.
         {"a": (0, 150 + 880, 0), "b": (50, 150, 0)},
         requeues={"failure": 1}, lost={"failure": 80}),
    Case("a gang that spans the failed node loses both workers; it waits for the node to come back",
         [job("a").gpus(16).at(0).runs(500)], Outages(failures=(NodeFailure(B, 100, 50),)),
         # no checkpoint in 100 s of DEFAULT_CLASS (every 300 s): all 100 s lost, on 16 GPUs.
         {"a": (0, 150 + 500, 0)}, requeues={"failure": 1}, lost={"failure": 1600}, down_gpu_s=400,
         options=dict(default_class=None)),
    Case("a node that never comes back leaves a gang it was needed for unfinished",
         [job("a").gpus(16).at(0).runs(500)], Outages(failures=(NodeFailure(B, 100, None),)),
         {"a": (0, -1, 0)}, requeues={"failure": 1}, options=dict(default_class=None)),
    Case("a drain preempts at once; the lease resumes on the other node from its checkpoint",
         [job("a").gpus(8).at(0).runs(1000)], Outages(drains=(NodeDrain(A, 130, None),)),
         {"a": (0, 130 + 880, 0)}, requeues={"drain": 1}, lost={"drain": 80}, drains=[(A, 130, 130)]),
    Case("a drain deadline lets the lease run on, then preempts it",
         [job("a").gpus(8).at(0).runs(1000)], Outages(drains=(NodeDrain(A, 130, None),), drain_deadline_s=100),
         # stopped at 230: keeps 180 s (checkpoints at 60, 120, 180), loses 50.
         {"a": (0, 230 + 820, 0)}, requeues={"drain": 1}, lost={"drain": 400}, drains=[(A, 130, 230)]),
    Case("a drain with no deadline waits for the lease to end: no work lost, a long drain",
         [job("a").gpus(8).at(0).runs(1000)], Outages(drains=(NodeDrain(A, 130, None),), drain_deadline_s=None),
         {"a": (0, 1000, 0)}, requeues={"drain": 0}, lost={"drain": 0}, drains=[(A, 130, 1000)]),
    Case("a stop delay holds the drained lease's GPUs: the drain time is the delay",
         [job("a").gpus(8).at(0).runs(1000)], Outages(drains=(NodeDrain(A, 130, None),)),
         {"a": (0, 150 + 880, 0)}, requeues={"drain": 1}, drains=[(A, 130, 150)],
         options=dict(stop_delay_s=20.0)),
    Case("a draining node gets no new lease; the drain ends and it takes work again",
         [job("a").gpus(8).at(10).runs(100), job("b").gpus(8).at(10).runs(100)],
         Outages(drains=(NodeDrain(A, 0, 50),)),
         {"a": (10, 110, 0), "b": (50, 150, 0)}, drains=[(A, 0, 0)]),
    Case("a node failing while its lease stops for a drain: the lease is lost to the failure",
         [job("a").gpus(8).at(0).runs(1000)],
         Outages(failures=(NodeFailure(A, 140, None),), drains=(NodeDrain(A, 130, None),)),
         # told to stop at 130 (work up to 130 counts), gone at 140 with the node: keeps 120 s.
         {"a": (0, 140 + 880, 0)}, requeues={"failure": 1, "drain": 0}, lost={"failure": 80},
         drains=[(A, 130, 140)], options=dict(stop_delay_s=20.0)),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_outages(case: Case):
    opts = dict(case.options)
    default_class = opts.pop("default_class", CKPT_60)
    r = replay(trace(*case.jobs), nodes=case.nodes, default_class=default_class, outages=case.outages, **opts)
    got = outcome(r)
    assert {k: got[k] for k in case.want} == {k: (float(v[0]), float(v[1]), v[2]) for k, v in case.want.items()}
    for cause, n in case.requeues.items():
        assert r.requeues[cause] == n, cause
    for cause, gpu_s in case.lost.items():
        assert r.lost_gpu_s[cause] == pytest.approx(gpu_s), cause
    if case.drains is not None:
        assert r.drains == [tuple(float(x) if isinstance(x, (int, float)) else x for x in d) for d in case.drains]
    if case.down_gpu_s is not None:
        assert r.down_gpu_s == pytest.approx(case.down_gpu_s)


def test_outage_figures_in_the_summary():
    r = replay(trace(job("a").gpus(8).at(0).runs(1000)), nodes=2, default_class=CKPT_60,
               outages=Outages(failures=(NodeFailure(B, 10, 100),), drains=(NodeDrain(A, 130, None),),
                               drain_deadline_s=100))
    o = summarize(r)["outages"]
    assert o["failures"] == 1 and o["drains"] == 1 and o["drains_unfinished"] == 0
    assert o["requeues"] == {"preemption": 0, "drain": 1, "failure": 0}
    assert o["lost_gpu_hours"]["drain"] == pytest.approx(400 / 3600)
    assert o["drain_time"] == {"mean": 100.0, "max": 100.0}
    assert o["down_gpu_hours"] == pytest.approx(800 / 3600)


def test_mtbf_failures_repeat_with_the_seed_and_are_the_same_under_every_policy():
    jobs = [job(f"j{i}").gpus(4).at(i * 50).runs(600) for i in range(40)]
    out = Outages(mtbf_s=3000.0, repair_s=300.0)

    def run(seed, **config):
        return replay(trace(*jobs), nodes=4, default_class=CKPT_60, outages=out, seed=seed, config=config)

    fifo, las = run(1), run(1, ordering="las", preemption="ordering", las_thresholds=(1000.0,))
    other = run(2)
    assert fifo.failures and fifo.requeues["failure"] > 0
    # Same seed: the same failures while both replays ran (they end at different times).
    horizon = min(fifo.end_time, las.end_time)
    assert [f for f in fifo.failures if f[1] <= horizon] == [f for f in las.failures if f[1] <= horizon]
    assert fifo.failures != other.failures
    # Every job finished (failed nodes are repaired), and a node fails again only after its repair.
    assert all(f >= 0 for f in fifo.finish)
    by_node: Dict[str, List[float]] = {}
    for nid, t in fifo.failures:
        by_node.setdefault(nid, []).append(t)
    assert all(b - a >= 300.0 for ts in by_node.values() for a, b in zip(ts, ts[1:]))


def test_stranded_gpus_compare_placements():
    """Two 4-GPU jobs spread over both 8-GPU nodes leave 4 + 4 free that the waiting 8-GPU job cannot use:
    8 stranded for 100 s of 200. Packed on one node, the 8-GPU job runs at once: nothing stranded."""
    def run(placement):
        jobs = [replace(job(x).gpus(4).at(0).runs(100).obj(), placement=placement) for x in "ab"]
        return replay(trace(*jobs, job("c").gpus(8).at(0).runs(100)), nodes=2)

    spread, pack = run("spread"), run("pack")
    fs = summarize(spread)["fragmentation"]
    assert outcome(spread)["c"][:2] == (100.0, 200.0)
    assert fs["stranded_mean"] == pytest.approx(4.0) and fs["stranded_p95"] == 8.0 and fs["stranded_max"] == 8.0
    assert fs["stranded_share"] == pytest.approx(4.0 / 16)
    fp = summarize(pack)["fragmentation"]
    assert outcome(pack)["c"][:2] == (0.0, 100.0)
    assert fp["stranded_mean"] == 0.0 and fp["stranded_p95"] == 0.0


def test_the_default_placement_applies_to_jobs_whose_trace_names_none():
    jobs = [job(x).gpus(4).at(0).runs(100) for x in "ab"] + [job("c").gpus(8).at(0).runs(100)]
    spread = replay(trace(*jobs), nodes=2, placement="spread")
    assert outcome(spread)["c"][:2] == (100.0, 200.0) and max(spread.stranded) == 8.0
    with pytest.raises(FatalError, match="placement 'scatter': allowed: balanced"):
        replay(trace(*jobs), nodes=2, placement="scatter")


@pytest.mark.parametrize("values,q,want", [
    ([0, 8], 50, 0),       # 0 for 100 s, 8 for 100 s
    ([0, 8], 95, 8),
    ([8, 0, 0, 0], 75, 0),  # 8 for 25% of the time
    ([8, 0, 0, 0], 80, 8),
    ([8, 0, 0, 0], 95, 8),
])
def test_time_weighted_quantile(values, q, want):
    times = [100.0 * k for k in range(len(values))]
    # over [0, 100 * len], the last value holding to the end
    assert time_weighted_quantile(times, values, 0.0, 100.0 * len(values), q) == want


def test_outage_flags_and_files(tmp_path):
    assert parse_outage("fail", "node-003@2h+30m") == NodeFailure("node-003", 7200.0, 1800.0)
    assert parse_outage("drain", "n1@90") == NodeDrain("n1", 90.0, None)
    with pytest.raises(ValidationError, match="NODE@TIME"):
        parse_outage("fail", "node-003")
    with pytest.raises(ValidationError, match="'soon'"):
        parse_outage("drain", "n1@soon")
    f = tmp_path / "events.csv"
    f.write_text("time,node,event,duration\n1h,node-001,fail,30m\n7200,node-002,drain,\n")
    assert load_node_events(f) == ([NodeFailure("node-001", 3600.0, 1800.0)], [NodeDrain("node-002", 7200.0, None)])
    f.write_text("time,node,event,duration\nlater,node-001,explode,30m\n60,,fail,x\n")
    with pytest.raises(ValidationError) as e:
        load_node_events(f)
    text = str(e.value)
    for part in ("row 2, column time: got 'later'", "row 2, column event: got 'explode'; one of fail, drain",
                 "row 3, column node", "row 3, column duration: got 'x'"):
        assert part in text
    with pytest.raises(NotFoundError):
        load_node_events(tmp_path / "missing.csv")
    with pytest.raises(ValidationError, match="node-009"):
        Outages(failures=(NodeFailure("node-009", 1.0),)).check_nodes(["node-000", "node-001"])
    with pytest.raises(ValidationError, match="mtbf"):
        Outages(mtbf_s=0)
