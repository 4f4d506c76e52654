"""The event loop, case by case: each case is a tiny trace on a tiny cluster with the exact starts, finishes and
preemptions the replay must produce. Pure: no Ray."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Tuple

import pytest

from raylane.scheduling.types import WorkloadClass
from raylane.sim import DEFAULT_CLASS, SimOptions, summarize
from raylane.sim.engine import SimulationError, gang_for
from tests.sim.builders import job, outcome, replay, trace

CKPT_60 = WorkloadClass("train", priority=100, preemptible=True, checkpoint_interval_s=60.0, grace_period_s=0.0)
LAS_100 = dict(ordering="las", preemption="ordering", las_thresholds=(100.0,))


@dataclass
class Case:
    name: str
    jobs: List[Any]
    # job id -> (first start, finish, preemptions)
    want: Dict[str, Tuple[float, float, int]]
    nodes: int = 1
    config: Dict[str, Any] = field(default_factory=dict)
    options: Dict[str, Any] = field(default_factory=dict)
    default_class: WorkloadClass = DEFAULT_CLASS


CASES = [
    Case("a job runs for its duration", [job("a").at(0).runs(100)], {"a": (0, 100, 0)}),
    Case("fifo: waits for capacity",
         [job("a").gpus(8).at(0).runs(100), job("b").at(10).runs(50)],
         {"a": (0, 100, 0), "b": (100, 150, 0)}),
    Case("arrivals at one instant start together",
         [job(x).gpus(2).at(5).runs(10) for x in "abc"],
         {x: (5, 15, 0) for x in "abc"}),
    Case("a used-up admission budget repeats the cycle at the same instant",
         [job(x).at(0).runs(10) for x in "abcdef"], {x: (0, 10, 0) for x in "abcdef"},
         config=dict(max_admissions_per_cycle=2)),
    Case("a cycle that ran out of examined workloads repeats at the same instant",
         [job(x).at(0).runs(10) for x in "abcdef"], {x: (0, 10, 0) for x in "abcdef"},
         options=dict(max_examined=1)),
    Case("a 16-GPU gang spans two 8-GPU nodes", [job("a").gpus(16).at(0).runs(10)], {"a": (0, 10, 0)}, nodes=2),
    Case("strict fifo: a small job waits behind a blocked gang",
         [job("a").gpus(4).at(0).runs(100), job("b").gpus(8).at(1).runs(10), job("c").at(2).runs(10)],
         {"a": (0, 100, 0), "b": (100, 110, 0), "c": (110, 120, 0)}),
    Case("greedy backfill: the small job goes around the blocked gang",
         [job("a").gpus(4).at(0).runs(100), job("b").gpus(8).at(1).runs(10), job("c").at(2).runs(10)],
         {"a": (0, 100, 0), "b": (100, 110, 0), "c": (2, 12, 0)}, config=dict(backfill="greedy")),
    Case("las: a demoted lease is preempted and loses the work since its start (no checkpoint yet)",
         [job("a").gpus(8).at(0).runs(1000), job("b").at(30).runs(50)],
         {"a": (0, 1080, 1), "b": (30, 80, 0)}, config=LAS_100, default_class=CKPT_60),
    Case("las: a preempted lease keeps the work up to its last checkpoint",
         [job("a").gpus(8).at(0).runs(1000), job("b").at(130).runs(50)],
         {"a": (0, 180 + 880, 1), "b": (130, 180, 0)}, config=LAS_100, default_class=CKPT_60),
    Case("a stop delay holds the victim's GPUs before the preemptor starts",
         [job("a").gpus(8).at(0).runs(1000), job("b").at(30).runs(50)],
         {"a": (0, 85 + 1000, 1), "b": (35, 85, 0)}, config=LAS_100, default_class=CKPT_60,
         options=dict(stop_delay_s=5.0)),
    Case("ticks re-evaluate a lease demoted with no event",
         # b stays under the threshold (8 GPUs x 10 s < 100 GPU-s), so a does not take its GPUs back early.
         [job("a").gpus(8).at(0).runs(1000), job("b").gpus(8).at(5).runs(10)],
         {"a": (0, 30 + 1000, 1), "b": (20, 30, 0)}, config=LAS_100, default_class=CKPT_60,
         options=dict(tick_s=10.0)),
    Case("srtf oracle: a requeued job's remaining time counts the work it lost",
         # a loses its first 100 s; at 160 its true remaining is 990 > 950, so c preempts it.
         [job("a").gpus(8).at(0).runs(1000), job("b").gpus(8).at(100).runs(50), job("c").gpus(8).at(160).runs(950)],
         {"b": (100, 150, 0), "c": (160, 1110, 0), "a": (0, 1110 + 1000, 2)},
         config=dict(ordering="srtf", preemption="ordering"), options=dict(estimates="exact")),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_event_loop(case: Case):
    r = replay(trace(*case.jobs), nodes=case.nodes, config=case.config, default_class=case.default_class,
               **case.options)
    assert not r.partial
    got = outcome(r)
    assert {k: got[k] for k in case.want} == {k: tuple(float(x) if i < 2 else x for i, x in enumerate(v))
                                               for k, v in case.want.items()}


def test_lost_work_and_busy_time_are_accounted():
    r = replay(trace(job("a").gpus(8).at(0).runs(1000), job("b").at(130).runs(50)), config=LAS_100,
               default_class=CKPT_60)
    a = [j.id for j in r.jobs].index("a")
    assert r.lost_work[a] == pytest.approx(10.0)
    s = summarize(r)
    # a holds 8 GPUs for 130 s (10 of them lost), b 1 GPU for 50 s, then a 8 GPUs for its last 880 s.
    assert s["utilization"]["gpu_s_used"] == pytest.approx(8 * 130 + 50 + 8 * 880)
    assert s["utilization"]["gpu_s_lost"] == pytest.approx(80.0)


def test_a_job_that_fits_no_node_set_is_rejected_with_the_reason():
    r = replay(trace(job("big").gpus(16).at(0), job("ok").at(0)), nodes=1)
    assert [j.id for j in r.jobs] == ["ok"]
    (rejected, why), = r.rejected
    assert rejected.id == "big" and "fits no set of nodes" in why


def test_should_stop_ends_the_replay_with_partial_figures():
    jobs = [job(f"j{i}").gpus(8).at(i).runs(10) for i in range(50)]
    seen = []

    def stop():
        seen.append(1)
        return len(seen) >= 30

    r = replay(trace(*jobs), should_stop=stop)
    assert r.partial
    s = summarize(r)
    assert s["partial"] and 0 < s["jobs"]["finished"] < 50 and s["jobs"]["unfinished"] > 0


def test_keyboard_interrupt_in_progress_keeps_a_partial_result():
    def progress(now, done, total):
        raise KeyboardInterrupt

    r = replay(trace(job("a").runs(10)), progress=progress)
    assert r.partial and r.finish == [-1.0]


@pytest.mark.parametrize("mode,check", [
    ("none", lambda est, dur: est is None),
    ("exact", lambda est, dur: est == dur),
    ("noisy", lambda est, dur: est is not None and est > 0 and est != dur),
    ("declared", lambda est, dur: est == 42.0),
])
def test_estimates_the_policy_sees(mode, check):
    from raylane.sim import Simulator, cluster_from_flags
    from raylane.scheduling.types import SchedulerConfig

    tr = trace(job("a").runs(100).estimate(42))
    sim = Simulator(tr, cluster_from_flags(1, 8).nodes(), {}, SchedulerConfig(), options=SimOptions(estimates=mode))
    assert check(sim.workloads[0].runtime_estimate_s, 100.0)


def test_noisy_estimates_repeat_with_the_seed():
    from raylane.sim import Simulator, cluster_from_flags
    from raylane.scheduling.types import SchedulerConfig

    tr = trace(*[job(f"j{i}").runs(100) for i in range(5)])
    ests = [[w.runtime_estimate_s for w in Simulator(tr, cluster_from_flags(1, 8).nodes(), {}, SchedulerConfig(),
                                                     options=SimOptions(estimates="noisy", seed=s)).workloads]
            for s in (1, 1, 2)]
    assert ests[0] == ests[1] != ests[2]


@pytest.mark.parametrize("gpus,workers,node,want", [
    (4, None, 8, (1, 4.0)),
    (16, None, 8, (2, 8.0)),
    (12, None, 8, (2, 6.0)),
    (128, None, 8, (16, 8.0)),
    (8, 4, 8, (4, 2.0)),
    (0.5, None, 8, (1, 0.5)),
    (2, 4, 8, (4, 0.5)),
    (16.0, None, 8, (2, 8.0)),
])
def test_gang_shape(gpus, workers, node, want):
    b = job("a").gpus(gpus)
    if workers:
        b = b.workers(workers)
    g = gang_for(b.obj(), node)
    assert (g.workers, g.per_worker.gpu) == want
    assert isinstance(g.workers, int)


@pytest.mark.parametrize("gpus,workers,says", [
    (1.5, None, "gpus 1.5 with no worker count"),
    (6, 4, "1.5 per worker"),
])
def test_gang_shape_refuses_what_ray_would(gpus, workers, says):
    b = job("a").gpus(gpus)
    if workers:
        b = b.workers(workers)
    with pytest.raises(SimulationError, match=says):
        gang_for(b.obj(), 8)


def test_a_fractional_trace_replays_on_devices():
    """Two 0.6 GPU jobs on a 2-GPU node leave 0.8 GPU free but no device with 0.5: the 0.5 job waits until one
    ends, while a 0.4 job behind it fits at once (greedy backfill); every device is whole again at the end."""
    tr = trace(job("a").at(0).runs(100).gpus(0.6), job("b").at(0).runs(200).gpus(0.6),
               job("c").at(1).runs(10).gpus(0.5), job("d").at(2).runs(10).gpus(0.4),
               job("e").at(3).runs(10).gpus(2).workers(4))
    r = replay(tr, nodes=1, gpus=2, config=dict(backfill="greedy"))
    got = outcome(r)
    assert got["a"][0] == 0 and got["b"][0] == 0
    assert got["d"][0] == 2  # 0.4 fits next to a 0.6 share
    assert got["c"][0] == 100  # 0.5 waits for a device with room: a's, at t=100
    # e: four workers of 0.5, two per device: both devices must be empty first (b ends at 200)
    assert got["e"][0] == 200 and r.rejected == []


def test_a_checkpoint_due_at_an_instant_whose_float_sum_falls_short_is_taken_once():
    """a starts at 3518.4; its checkpoints (every 300 s) are due at 3518.4 + 300 + 300 + 300 = 4418.4, where
    (4418.4 - 3518.4) / 300 is 2.9999999999999987 in floats. b arrives then and preempts it (LAS): the replay must
    go on (it used to queue that checkpoint again at the same instant forever) and a keeps all 900 s of work."""
    tr = trace(job("a").gpus(8).at(3518.4).runs(5000), job("b").gpus(8).at(4418.4).runs(10))
    r = replay(tr, nodes=1, config=LAS_100)
    got = outcome(r)
    assert got["a"] == (3518.4, pytest.approx(4428.4 + 4100), 1) and got["b"] == (4418.4, 4428.4, 0)
    assert r.lost_work == [0.0, 0.0]
