"""The victim cost: among victims that free enough, which are chosen (``raylane.scheduling.preemption.VICTIM_COSTS``).

``lost_work`` (the default) prices a running lease by its class priority, then the GPU-seconds a stop loses (since
its last checkpoint, or since its start when it has none), then the most recently started; ``recency`` (Kueue's
order) by class priority, then the most recently started. Each case runs the whole cycle at ``now`` = 1000 under
both and names the victims each chooses."""
import pytest

from raylane.config.loader import load_policy_from_dict
from raylane.errors import UnknownNameError, ValidationError
from raylane.scheduling import SchedulerConfig, WaitingForPreemption
from raylane.scheduling.preemption import VICTIM_COSTS

from .builders import PRETRAIN, PROD, SWEEP, decide, nodes, running, team, wl

NOW = 1000.0

CASES = [
    dict(
        name="the lease that just checkpointed is the cheap one; recency takes the last started",
        running=[running(wl("ckpt").cls(PRETRAIN).gpus(4), on=["n1"], since=0, ckpt=990),    # loses 10 s x 4
                 running(wl("young").cls(PRETRAIN).gpus(4), on=["n1"], since=500)],          # loses 500 s x 4
        pending=[wl("f").cls(PROD).gpus(4)],
        lost_work=("ckpt",), recency=("young",),
    ),
    dict(
        name="a lease with no checkpoint loses what it did since its start, no more",
        # If no checkpoint counted as everything lost (or as never), `new` would not be the cheap one.
        running=[running(wl("new").cls(PRETRAIN).gpus(4), on=["n1"], since=800),            # loses 200 s x 4
                 running(wl("old").cls(PRETRAIN).gpus(4), on=["n1"], since=0, ckpt=700)],    # loses 300 s x 4
        pending=[wl("f").cls(PROD).gpus(4)],
        lost_work=("new",), recency=("new",),
    ),
    dict(
        name="a checkpoint older than the lease's start (an earlier attempt's) counts from the start",
        running=[running(wl("restarted").cls(PRETRAIN).gpus(4), on=["n1"], since=900, ckpt=100),  # loses 100 s
                 running(wl("steady").cls(PRETRAIN).gpus(4), on=["n1"], since=0, ckpt=850)],       # loses 150 s
        pending=[wl("f").cls(PROD).gpus(4)],
        lost_work=("restarted",), recency=("restarted",),
    ),
    dict(
        name="lost work is GPU-seconds: a 2-GPU job that lost 250 s before a gang of 4 that lost 150 s",
        running=[running(wl("gang").cls(PRETRAIN).gpus(4), on=["n1"], since=0, ckpt=850),    # 600 GPU-s
                 running(wl("small").cls(PRETRAIN).gpus(2), on=["n1"], since=0, ckpt=750),   # 500 GPU-s
                 running(wl("other").cls(PRETRAIN).gpus(2), on=["n1"], since=200, ckpt=600)],  # 800 GPU-s
        pending=[wl("f").cls(PROD).gpus(2)],
        lost_work=("small",), recency=("other",),
    ),
    dict(
        name="class priority dominates: the lower class goes first whatever either has lost",
        running=[running(wl("pre").cls(PRETRAIN).gpus(4), on=["n1"], since=0, ckpt=999),
                 running(wl("sweep").cls(SWEEP).gpus(4), on=["n1"], since=0)],
        pending=[wl("f").cls(PROD).gpus(4)],
        lost_work=("sweep",), recency=("sweep",),
    ),
    dict(
        name="the victims not needed are given back most expensive first (ordering: nominated by rank)",
        # SRTF nominates a, b, then c (longest remaining first); 6 GPUs are needed: c, and one of a and b.
        ordering="srtf", preemption="ordering",
        running=[running(wl("a").gpus(2).est(100_000), on=["n1"], since=500),           # loses 500 s x 2
                 running(wl("b").gpus(2).est(90_000), on=["n1"], since=0, ckpt=950),    # loses 50 s x 2
                 running(wl("c").gpus(4).est(80_000), on=["n1"], since=0)],
        pending=[wl("short").gpus(6).est(60)],
        lost_work=("b", "c"), recency=("a", "c"),
    ),
]


@pytest.mark.parametrize("cost", ["lost_work", "recency"])
@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_victims_chosen(case, cost):
    out = decide(nodes(1), [team("nlp", gpu=8)], case["running"], case["pending"], now=NOW,
                 ordering=case.get("ordering", "priority"), preemption=case.get("preemption", "default"),
                 backfill="easy", victim_cost=cost)
    (pre,) = [w for w in out.preempted]
    assert out.preempted == {pre: case[cost]}
    assert out.pending[pre] == WaitingForPreemption(case[cost])


def test_the_default_is_lost_work():
    assert SchedulerConfig().victim_cost == VICTIM_COSTS.default == "lost_work"
    assert VICTIM_COSTS.names() == ["lost_work", "recency", "remaining"]


def test_an_unknown_victim_cost_names_the_value_and_the_known_ones():
    with pytest.raises(UnknownNameError) as exc:
        VICTIM_COSTS.get("cheapest")
    assert "cheapest" in str(exc.value) and "lost_work" in str(exc.value) and "recency" in str(exc.value)


def _policy(**scheduler):
    return {"scheduler": {**scheduler}, "classes": {"batch": {"priority": 10, "preemptible": True}},
            "teams": {"nlp": {"quotas": {"gpu": {"nominal": 8}}}}}


@pytest.mark.parametrize("given, expected", [({}, "lost_work"), ({"victim_cost": "recency"}, "recency"),
                                             ({"victim_cost": "lost_work"}, "lost_work")])
def test_policy_file_maps_the_victim_cost(given, expected):
    assert load_policy_from_dict(_policy(**given), "p").to_scheduler_config().victim_cost == expected


def test_policy_file_rejects_an_unknown_victim_cost_naming_field_value_and_allowed():
    with pytest.raises(ValidationError) as exc:
        load_policy_from_dict(_policy(victim_cost="newest", preemption="often"), "p")
    text = str(exc.value)
    assert "scheduler.victim_cost" in text and "newest" in text and "one of lost_work, recency, remaining" in text
    assert "scheduler.preemption" in text  # every error of the file at once


def test_remaining_stops_what_is_predicted_to_end_last():
    # Two pretrain leases: one started at 500 and is predicted to end 18 minutes from now, the other started at 0
    # and has 5 hours to go: under `remaining` the long one goes (the short one ends soon anyway); under lost_work
    # the one that loses less (the later start).
    from dataclasses import replace

    from raylane.runtimes import Basis, RuntimeDist

    def learned(b, runtime):
        return replace(b.obj(), predicted=RuntimeDist((Basis("user-name", "k", (runtime,) * 3),)))

    soon = learned(wl("soon").cls(PRETRAIN).gpus(4), 1600.0)
    late = learned(wl("late").cls(PRETRAIN).gpus(4), 19000.0)
    unknown = wl("unknown").cls(PRETRAIN).gpus(4)
    for cost, expected in (("remaining", ("late",)), ("lost_work", ("soon",))):
        out = decide(nodes(1), [team("nlp", gpu=8)],
                     [running(late, on=["n1"], since=0), running(soon, on=["n1"], since=500)],
                     [wl("f").cls(PROD).gpus(4)], now=NOW, ordering="priority", preemption="default",
                     backfill="easy", victim_cost=cost)
        (pre,) = list(out.preempted)
        assert out.preempted[pre] == expected, cost
    # A lease with no prediction goes after the predicted ones of its class.
    out = decide(nodes(1), [team("nlp", gpu=8)],
                 [running(unknown, on=["n1"], since=0), running(soon, on=["n1"], since=500)],
                 [wl("f").cls(PROD).gpus(4)], now=NOW, ordering="priority", preemption="default", backfill="easy",
                 victim_cost="remaining")
    assert list(out.preempted.values()) == [("soon",)]
