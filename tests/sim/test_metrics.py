"""The figures' definitions on hand-made replays: percentiles, time-weighted utilization, fairness, partial runs."""
from __future__ import annotations

import math

import pytest

from raylane.scheduling.types import Quota, Team, WorkloadClass
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


def test_the_replay_times_each_cycle_and_counts_what_was_pending_at_it():
    # One 8-GPU node: a takes it at 0; b and c (1 GPU each) arrive at 10 and wait together until a ends at 100.
    r = replay(trace(job("a").gpus(8).at(0).runs(100), job("b").at(10).runs(5), job("c").at(10).runs(5)))
    rep = summarize(r)["replay"]
    assert len(r.cycle_wall) == len(r.cycle_pending) == r.cycles == rep["cycles"] > 0
    assert max(r.cycle_pending) == rep["pending_max"] == 2 and r.cycle_pending[0] == 1
    ms = rep["cycle_ms"]
    assert 0 < ms["p50"] <= ms["p99"] <= ms["max"] == pytest.approx(max(r.cycle_wall) * 1000.0)


def test_entitlement_follows_nominal_gpu_quota():
    teams = {"x": Team("x", {"gpu": Quota(6)}), "y": Team("y", {"gpu": Quota(2)})}
    r = replay(trace(job("a").at(0).team("x"), job("b").at(0).team("y")), teams=teams)
    t = summarize(r)["fairness"]["teams"]
    assert (t["x"]["entitlement"], t["y"]["entitlement"]) == (0.75, 0.25)
    assert t["x"]["share_over_entitlement"] == pytest.approx(0.5 / 0.75)


def _las_pair(**config):
    # a: 8 GPUs for 1,000 s; b (1 GPU, 50 s) arrives at 30 while a is in LAS queue 1 (past 100 GPU-s).
    ckpt = WorkloadClass("train", priority=100, preemptible=True, checkpoint_interval_s=60.0, grace_period_s=0.0)
    return replay(trace(job("a").gpus(8).at(0).runs(1000), job("b").at(30).runs(50)), default_class=ckpt,
                  config=dict(ordering="las", preemption="ordering", las_thresholds=(100.0,), **config))


def test_preemptions_per_hour_of_runtime():
    s = summarize(_las_pair())["preemptions"]
    # a is preempted once at 30 s, before its first checkpoint: it runs 30 + 1,000 s in all.
    rate = 1 / (1030 / 3600)
    assert s["per_hour"]["max"] == pytest.approx(rate)
    assert s["per_hour"]["mean"] == pytest.approx(rate / 2)  # b: never preempted
    assert s["per_hour"]["over_one"] == 1
    assert s["per_hour"]["worst"] == {"id": "a", "preemptions": 1, "runtime_h": pytest.approx(1030 / 3600)}


def test_hysteresis_removes_the_thrash_figure():
    r = _las_pair(hysteresis_min_run_s=3600.0)
    s = summarize(r)["preemptions"]
    assert s["total"] == 0 and s["per_hour"]["max"] == 0 and s["per_hour"]["worst"] is None
    assert r.finish == [1000.0, 1050.0]  # b waits for a instead of stopping it
