"""The figures' definitions on hand-made replays: percentiles, time-weighted utilization, fairness, partial runs."""
from __future__ import annotations

import math

import pytest

from raylane.scheduling.types import Quota, Team
from raylane.sim.metrics import binned, percentile, summarize
from tests.sim.builders import job, replay, trace


def test_percentile_interpolates():
    assert percentile([1, 2, 3, 4], 50) == 2.5
    assert percentile([5], 99) == 5
    assert math.isnan(percentile([], 50))


def test_binned_is_time_weighted():
    assert binned([0, 1, 2, 3], [1, 2, 3, 4], 0, 4, 4) == ([0.5, 1.5, 2.5, 3.5], [1.0, 2.0, 3.0, 4.0])
    # One sample spanning several bins fills each of them.
    assert binned([0.0], [4.0], 0.0, 1.0, 3)[1] == pytest.approx([4.0, 4.0, 4.0])


def test_figures_of_a_small_fifo_replay():
    # One 8-GPU node: a (8 GPUs, 0..100), b (1 GPU, waits 90 s, 100..150).
    r = replay(trace(job("a").gpus(8).at(0).runs(100).team("x"), job("b").at(10).runs(50).team("y")))
    s = summarize(r)
    assert s["jct"]["mean"] == pytest.approx((100 + 140) / 2)
    assert s["queueing"]["p50"] == pytest.approx(45.0) and s["queueing"]["max"] == 90.0
    assert s["makespan_s"] == 150.0
    assert s["utilization"]["mean"] == pytest.approx((8 * 100 + 1 * 50) / (8 * 150))
    teams = s["fairness"]["teams"]
    assert teams["x"]["gpu_s"] == 800 and teams["y"]["gpu_s"] == 50
    assert teams["x"]["entitlement"] == 0.5  # equal weights, no quotas
    assert teams["y"]["ftf"] == pytest.approx(140 / 50) and teams["x"]["ftf"] == 1.0
    assert s["fairness"]["ftf_spread"] == pytest.approx(2.8)
    assert s["preemptions"]["per_job"] == 0 and not s["partial"]


def test_entitlement_follows_nominal_gpu_quota():
    teams = {"x": Team("x", {"gpu": Quota(6)}), "y": Team("y", {"gpu": Quota(2)})}
    r = replay(trace(job("a").at(0).team("x"), job("b").at(0).team("y")), teams=teams)
    t = summarize(r)["fairness"]["teams"]
    assert (t["x"]["entitlement"], t["y"]["entitlement"]) == (0.75, 0.25)
    assert t["x"]["share_over_entitlement"] == pytest.approx(0.5 / 0.75)
