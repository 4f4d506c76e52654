"""Hysteresis of the ``ordering`` preemption policy: a lease (re)started too recently is not stopped again by the
ordering (``SchedulerConfig.hysteresis_min_run_s`` and ``hysteresis_service_fraction``).

All cases run at ``now`` = 5000 with ``las`` ordering (queues at 1 and 10 GPU-hours), ``ordering`` preemption and
one node of 8 GPUs unless they say otherwise. A lease's *run* is ``now`` minus its ``since``; the service it had
before that start is ``attained`` (GPU-seconds), i.e. ``attained / gpus`` seconds of wall time.
"""
import pytest

from raylane.config.loader import load_policy_from_dict
from raylane.errors import ValidationError
from raylane.scheduling import WaitingForPreemption
from raylane.scheduling.preemption import settled_after
from raylane.scheduling.types import Lease, SchedulerConfig

from .builders import PRETRAIN, PROD, decide, nodes, obj, running, team, wl

NOW = 5000.0
HOUR = 3600.0
LAS = dict(ordering="las", preemption="ordering", las_thresholds=(HOUR, 10 * HOUR), backfill="easy")

# `old`: 8 GPUs since 2000 (ran 3,000 s = 24,000 GPU-s: queue 1); `new` has no service (queue 0), so LAS would
# preempt `old` for it.
OLD_SINCE = 2000.0

CASES = [
    dict(name="no hysteresis: LAS preempts a demoted job however recently it started",
         cfg={}, attained=0, preempted={"new": ("old",)}),
    dict(name="floor: not before it has run the minimum since its (re)start",
         cfg=dict(hysteresis_min_run_s=HOUR), attained=0, preempted={}),
    dict(name="floor: past the minimum it is preempted as before",
         cfg=dict(hysteresis_min_run_s=2500), attained=0, preempted={"new": ("old",)}),
    dict(name="floor: exactly at the minimum it may be preempted",
         cfg=dict(hysteresis_min_run_s=3000), attained=0, preempted={"new": ("old",)}),
    dict(name="fraction: a job that ran long before its restart keeps its GPUs longer",
         # Ran 8,000 s before (64,000 GPU-s over 8 GPUs); half of it is 4,000 s > the 3,000 s it has run now.
         cfg=dict(hysteresis_service_fraction=0.5), attained=64_000, preempted={}),
    dict(name="fraction: one that ran little before is preempted",
         # Ran 4,000 s before; half is 2,000 s < 3,000 s.
         cfg=dict(hysteresis_service_fraction=0.5), attained=32_000, preempted={"new": ("old",)}),
    dict(name="the larger of floor and fraction holds (the floor)",
         cfg=dict(hysteresis_min_run_s=HOUR, hysteresis_service_fraction=0.5), attained=32_000, preempted={}),
    dict(name="the larger of floor and fraction holds (the fraction)",
         cfg=dict(hysteresis_min_run_s=600, hysteresis_service_fraction=0.5), attained=64_000, preempted={}),
]


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_ordering_preemption_hysteresis(case):
    out = decide(nodes(1), [team("nlp")], [running(wl("old").gpus(8).at(0).attained(case["attained"]),
                                                   on=["n1"], since=OLD_SINCE)],
                 [wl("new").gpus(8).at(1000)], now=NOW, admission="none", **LAS, **case["cfg"])
    assert out.preempted == case["preempted"]
    assert out.admitted == {}
    for pre, victims in case["preempted"].items():
        assert out.pending[pre] == WaitingForPreemption(victims)


def test_a_settled_lease_is_taken_before_a_worse_ranked_unsettled_one():
    # `fresh-restart` ranks worst (most service: queue 2) but restarted 10 minutes ago; `steady` (queue 1) has run
    # for over an hour. Without hysteresis the worst-ranked goes; with it, the settled one.
    run = [running(wl("fresh-restart").gpus(4).at(0).attained(200_000), on=["n1"], since=NOW - 600),
           running(wl("steady").gpus(4).at(10), on=["n1"], since=NOW - 4000)]
    pending = [wl("new").gpus(4).at(1000)]
    plain = decide(nodes(1), [team("nlp")], run, pending, now=NOW, admission="none", **LAS)
    assert plain.preempted == {"new": ("fresh-restart",)}
    held = decide(nodes(1), [team("nlp")], run, pending, now=NOW, admission="none", **LAS,
                  hysteresis_min_run_s=HOUR)
    assert held.preempted == {"new": ("steady",)}


def test_hysteresis_leaves_class_priority_preemption_alone():
    # The default policy (a higher class preempts a lower one) is not an ordering-driven preemption.
    out = decide(nodes(1), [team("nlp", gpu=8)], [running(wl("p1").cls(PRETRAIN).gpus(8), on=["n1"], since=NOW - 60)],
                 [wl("f1").cls(PROD).gpus(8)], now=NOW, hysteresis_min_run_s=HOUR)
    assert out.preempted == {"f1": ("p1",)}


@pytest.mark.parametrize("gpus,attained,cfg,expected", [
    (8, 0.0, SchedulerConfig(), OLD_SINCE),
    (8, 0.0, SchedulerConfig(hysteresis_min_run_s=HOUR), OLD_SINCE + HOUR),
    (8, 80_000.0, SchedulerConfig(hysteresis_service_fraction=0.25), OLD_SINCE + 2500),
    (2, 80_000.0, SchedulerConfig(hysteresis_service_fraction=0.25), OLD_SINCE + 10_000),
    (0.5, 1_800.0, SchedulerConfig(hysteresis_min_run_s=60, hysteresis_service_fraction=1.0), OLD_SINCE + 3600),
    (0, 0.0, SchedulerConfig(hysteresis_min_run_s=60, hysteresis_service_fraction=1.0), OLD_SINCE + 60),
], ids=["none", "floor", "fraction-8gpu", "fraction-2gpu", "fraction-shared-gpu", "cpu-only"])
def test_settled_after(gpus, attained, cfg, expected):
    w = wl("x").gpus(gpus).cpus(1).attained(attained)
    lease = Lease(obj(w), ("n1",), OLD_SINCE)
    assert settled_after(lease, cfg) == pytest.approx(expected)


def _policy(**scheduler):
    return {
        "scheduler": {"ordering": "las", "preemption": "ordering", **scheduler},
        "classes": {"batch": {"priority": 10, "preemptible": True}},
        "teams": {"nlp": {"quotas": {"gpu": {"nominal": 8}}}},
    }


def test_policy_yaml_maps_the_hysteresis():
    cfg = load_policy_from_dict(_policy(hysteresis_min_run="1h", hysteresis_service_fraction=0.5),
                                "p").to_scheduler_config()
    assert (cfg.hysteresis_min_run_s, cfg.hysteresis_service_fraction) == (3600.0, 0.5)
    default = load_policy_from_dict(_policy(), "p").to_scheduler_config()
    assert (default.hysteresis_min_run_s, default.hysteresis_service_fraction) == (0.0, 0.0)


def test_policy_yaml_rejects_bad_hysteresis_naming_field_and_value():
    with pytest.raises(ValidationError) as exc:
        load_policy_from_dict(_policy(hysteresis_min_run="-5m", hysteresis_service_fraction=-1), "p")
    text = str(exc.value)
    assert "scheduler.hysteresis_min_run" in text and "-5m" in text
    assert "scheduler.hysteresis_service_fraction" in text and "-1" in text and ">= 0" in text
