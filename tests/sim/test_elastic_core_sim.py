"""The real core's elastic sizing replayed by the simulator (issue 15): an elastic gang starts at the size that
fits, grows when GPUs free, shrinks when a higher class arrives (which then runs) and grows back when it leaves;
its work is kept across every resize."""
from dataclasses import replace

import pytest

from raylane.scheduling.types import WorkloadClass
from tests.sim.builders import job, replay, trace

PROD = WorkloadClass("prod", priority=200, preemptible=False)


def elastic(b, lo, hi):
    return replace(b.obj(), min_workers=lo, max_workers=hi)


def test_grows_shrinks_for_a_higher_class_and_grows_back():
    tr = trace(job("b").gpus(2).workers(2).runs(700).at(0),
               elastic(job("e").gpus(2).workers(2).runs(4000).at(1), 2, 4),
               job("h").gpus(2).workers(2).cls("prod").runs(100).at(1500))
    r = replay(tr, nodes=1, gpus=4, classes={"prod": PROD}, resize_overhead_s=0.0,
               config=dict(preemption="default", resize_interval_s=0.0))
    k = {j.id: i for i, j in enumerate(r.jobs)}
    # e: at 2 from t=1 (b holds the other 2), 4 from 700 (b done), 2 from 1500 (h), 4 again from 1600.
    assert r.resizes[k["e"]] == 3
    assert r.preemptions[k["e"]] == 0  # shrunk, never stopped
    assert r.first_start[k["h"]] == pytest.approx(1500.0) and r.finish[k["h"]] == pytest.approx(1600.0)
    # Work at the requested 2 workers: 699 s, then 800 s at twice the rate (1600), 100 s at 2 (100): 2399 of 4000 by
    # t=1600; the last 1601 at twice the rate take 800.5 s.
    assert r.finish[k["e"]] == pytest.approx(2400.5)


def test_the_same_trace_with_fixed_gangs_waits_instead():
    tr = trace(job("b").gpus(2).workers(2).runs(700).at(0),
               job("e").gpus(2).workers(2).runs(4000).at(1),
               job("h").gpus(2).workers(2).cls("prod").runs(100).at(1500))
    r = replay(tr, nodes=1, gpus=4, classes={"prod": PROD}, config=dict(preemption="default"))
    k = {j.id: i for i, j in enumerate(r.jobs)}
    assert r.resizes[k["e"]] == 0 and r.finish[k["e"]] == pytest.approx(4001.0)
