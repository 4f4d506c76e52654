"""Preemption: who may be stopped to make room, and which victims are chosen (fewest, cheapest).

All cases run at ``now`` = 1000 with ``priority`` ordering and ``default`` preemption unless they say otherwise."""
import pytest

from raylane.scheduling import PREEMPTIONS, QuotaExceeded, WaitingForPreemption

from .builders import CRITICAL, PRETRAIN, PROD, SLOW_START, SWEEP, decide, node, nodes, running, team, wl

NOW = 1000.0

CASES = [
    dict(
        name="within a team a higher class preempts a lower preemptible one",
        teams=[team("nlp", gpu=8)],
        running=[running(wl("p1").cls(PRETRAIN).gpus(8), on=["n1"])],
        pending=[wl("f1").cls(PROD).gpus(8)],
        preempted={"f1": ("p1",)},
    ),
    dict(
        name="equal class does not preempt",
        teams=[team("nlp", gpu=8)],
        running=[running(wl("p1").cls(PRETRAIN).gpus(8), on=["n1"])],
        pending=[wl("p2").cls(PRETRAIN).gpus(8)],
        preempted={},
    ),
    dict(
        name="non-preemptible work is never a victim",
        teams=[team("nlp", gpu=8)],
        running=[running(wl("c1").cls(CRITICAL).gpus(8), on=["n1"])],
        pending=[wl("c2").cls(CRITICAL).gpus(8), wl("f1").cls(PROD).gpus(8)],
        preempted={},
    ),
    dict(
        name="a higher class of another team does not preempt in-quota work",
        teams=[team("nlp", gpu=4), team("cv", gpu=4)],
        running=[running(wl("n-sweep").cls(SWEEP).gpus(4), on=["n1"]),
                 running(wl("cv-p").team("cv").cls(PROD).gpus(4), on=["n1"])],
        pending=[wl("cv-prod").team("cv").cls(PROD).gpus(4)],
        preempted={},
    ),
    dict(
        name="a team under nominal reclaims borrowed capacity, never another team's in-quota work",
        teams=[team("nlp", gpu=4), team("cv", gpu=4), team("research", gpu=0)],
        running=[running(wl("n-sweep").cls(SWEEP).gpus(4), on=["n1"]),          # nlp: in quota, cheapest class
                 running(wl("r1").team("research").cls(PRETRAIN).gpus(2), on=["n1"], since=10),
                 running(wl("r2").team("research").cls(PRETRAIN).gpus(2), on=["n1"], since=20)],
        pending=[wl("cv1").team("cv").cls(SWEEP).gpus(4)],
        preempted={"cv1": ("r2", "r1")},
    ),
    dict(
        name="a borrowing team does not reclaim from others",
        teams=[team("nlp", gpu=2), team("cv", gpu=6)],
        running=[running(wl("nlp-r").cls(PROD).gpus(2), on=["n1"]),
                 running(wl("cv-r").team("cv").cls(SWEEP).gpus(6), on=["n1"])],
        pending=[wl("nlp-w").cls(PROD).gpus(2)],
        preempted={},
    ),
    dict(
        name="work younger than its class's minimum runtime is not preempted",
        teams=[team("nlp", gpu=8)],
        running=[running(wl("young").cls(SLOW_START).gpus(4), on=["n1"], since=NOW - 100),
                 running(wl("old").cls(SLOW_START).gpus(4), on=["n1"], since=NOW - 700)],
        pending=[wl("f1").cls(PROD).gpus(4)],
        preempted={"f1": ("old",)},
    ),
    dict(
        name="only-young victims: no preemption",
        teams=[team("nlp", gpu=8)],
        running=[running(wl("young").cls(SLOW_START).gpus(8), on=["n1"], since=NOW - 599)],
        pending=[wl("f1").cls(PROD).gpus(4)],
        preempted={},
    ),
    dict(
        name="cheapest victim: least progress lost since its last checkpoint",
        teams=[team("nlp", gpu=8)],
        running=[running(wl("stale").cls(PRETRAIN).gpus(4), on=["n1"], since=0, ckpt=100),
                 running(wl("fresh").cls(PRETRAIN).gpus(4), on=["n1"], since=0, ckpt=990)],
        pending=[wl("f1").cls(PROD).gpus(4)],
        preempted={"f1": ("fresh",)},
    ),
    dict(
        name="cheapest victim: lowest class first, whatever its progress",
        teams=[team("nlp", gpu=8)],
        running=[running(wl("pre").cls(PRETRAIN).gpus(4), on=["n1"], since=0, ckpt=999),
                 running(wl("sweep").cls(SWEEP).gpus(4), on=["n1"], since=0)],
        pending=[wl("f1").cls(PROD).gpus(4)],
        preempted={"f1": ("sweep",)},
    ),
    dict(
        name="fewest victims: candidates the preemptor does not need are given back",
        # The 2-GPU sweep on n1 is cheapest and tried first, but the gang needs a whole node: n2's lease alone does.
        teams=[team("nlp", gpu=16)],
        running=[running(wl("s").cls(SWEEP).gpus(2), on=["n1"]),
                 running(wl("p-n1").cls(PRETRAIN).gpus(6), on=["n1"], since=0, ckpt=0),
                 running(wl("p-n2").cls(PRETRAIN).gpus(8), on=["n2"], since=0, ckpt=900)],
        pending=[wl("f1").cls(PROD).gpus(8).strategy("strict-pack")],
        nodes=2,
        preempted={"f1": ("p-n2",)},
    ),
    dict(
        name="no preemption unless the preemptor then fits",
        # f1 needs an h100 node; the only one runs critical work. Stopping the sweep on n1 would not help.
        teams=[team("nlp", gpu=16)],
        nodes_=[node("n1"), node("h1").features("h100")],
        running=[running(wl("s").cls(SWEEP).gpus(8), on=["n1"]),
                 running(wl("c").cls(CRITICAL).gpus(8), on=["h1"])],
        pending=[wl("f1").cls(PROD).gpus(8).features("h100")],
        preempted={},
    ),
    dict(
        name="while victims are terminating, no more are chosen",
        teams=[team("nlp", gpu=8)],
        running=[running(wl("p1").cls(PRETRAIN).gpus(4), on=["n1"], terminating=True),
                 running(wl("p2").cls(PRETRAIN).gpus(4), on=["n1"])],
        pending=[wl("f1").cls(PROD).gpus(4)],
        preempted={},
        reasons={"f1": WaitingForPreemption(("p1",))},
    ),
    dict(
        name="victims already chosen in this cycle are not chosen twice",
        teams=[team("nlp", gpu=8)],
        running=[running(wl("p1").cls(PRETRAIN).gpus(4), on=["n1"]),
                 running(wl("p2").cls(PRETRAIN).gpus(4), on=["n1"], since=5)],
        pending=[wl("f1").cls(PROD).gpus(4).at(0), wl("f2").cls(PROD).gpus(4).at(1),
                 wl("f3").cls(PROD).gpus(4).at(2)],
        preempted={"f1": ("p2",), "f2": ("p1",)},
        reasons={"f3": QuotaExceeded("nlp", "gpu", used=8, nominal=8, borrowable=0, needed=4)},
    ),
    dict(
        name="none: never preempts",
        preemption="none",
        teams=[team("nlp", gpu=8)],
        running=[running(wl("p1").cls(SWEEP).gpus(8), on=["n1"])],
        pending=[wl("f1").cls(PROD).gpus(8)],
        preempted={},
    ),
    dict(
        name="ordering/las: a waiting job in a lower queue preempts one demoted to a higher queue",
        ordering="las", preemption="ordering",
        teams=[team("nlp", gpu=8)],
        # `old` ran 8 GPUs x 900 s = 7,200 GPU-s: queue 1. `new` has none: queue 0.
        running=[running(wl("old").gpus(8).at(0), on=["n1"], since=100)],
        pending=[wl("new").gpus(8).at(50)],
        preempted={"new": ("old",)},
    ),
    dict(
        name="ordering/las: no preemption inside the same queue for a later submission",
        ordering="las", preemption="ordering",
        teams=[team("nlp", gpu=8)],
        running=[running(wl("old").gpus(1).at(0), on=["n1"], since=900), running(wl("x").gpus(7), on=["n1"])],
        pending=[wl("new").gpus(8).at(50)],
        preempted={},
    ),
    dict(
        name="ordering/srtf: shorter remaining time preempts the longest remaining first",
        ordering="srtf", preemption="ordering",
        teams=[team("nlp", gpu=8)],
        running=[running(wl("long").gpus(4).est(100_000), on=["n1"], since=0),
                 running(wl("mid").gpus(4).est(5000), on=["n1"], since=0)],
        pending=[wl("short").gpus(4).est(60).at(500)],
        preempted={"short": ("long",)},
    ),
    dict(
        name="ordering/srtf: a job nearly done is not preempted by a longer one",
        ordering="srtf", preemption="ordering",
        teams=[team("nlp", gpu=8)],
        running=[running(wl("near").gpus(8).est(1100), on=["n1"], since=0)],
        pending=[wl("short").gpus(8).est(600).at(500)],
        preempted={},
    ),
    dict(
        name="ordering: another team's in-quota work stays protected under quota admission",
        ordering="srtf", preemption="ordering",
        teams=[team("nlp", gpu=4), team("cv", gpu=4)],
        running=[running(wl("cv-long").team("cv").gpus(4).est(100_000), on=["n1"]),
                 running(wl("n-long").gpus(4).est(100_000), on=["n1"])],
        pending=[wl("short").gpus(4).est(60)],
        preempted={"short": ("n-long",)},
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_preemption(case):
    ns = case.get("nodes_") or nodes(case.get("nodes", 1))
    out = decide(ns, case["teams"], case["running"], case["pending"], now=NOW,
                 ordering=case.get("ordering", "priority"), preemption=case.get("preemption", "default"),
                 backfill="easy")
    assert out.preempted == case["preempted"]
    assert out.admitted == {}
    for pre, victims in case["preempted"].items():
        assert out.pending[pre] == WaitingForPreemption(victims)
    for wid, reason in case.get("reasons", {}).items():
        assert out.pending[wid] == reason


def test_preempt_reason_names_who_and_why():
    out = decide(nodes(1), [team("nlp", gpu=8)], [running(wl("p1").cls(PRETRAIN).gpus(8), on=["n1"])],
                 [wl("f1").cls(PROD).gpus(8)], now=NOW)
    (p,) = out.result.preempted
    assert "f1 (nlp/prod, priority 50) needs 8 GPU" in p.reason and "p1 (nlp/pretrain)" in p.reason


@pytest.mark.parametrize("name", PREEMPTIONS.names())
def test_every_policy_spares_non_preemptible_and_young_work(name):
    runs = [running(wl("c").cls(CRITICAL).gpus(4), on=["n1"]),
            running(wl("y").cls(SLOW_START).gpus(4), on=["n1"], since=NOW - 1)]
    out = decide(nodes(1), [team("nlp", gpu=8)], runs, [wl("f").cls(PROD).gpus(4).est(1)], now=NOW,
                 ordering="srtf", preemption=name)
    assert out.preempted == {}
