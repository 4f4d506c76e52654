"""Ordering policies: who is considered first. Each case fills a cluster of free 1-GPU slots and checks who got in
and in which order the rest wait."""
import pytest

from raylane.scheduling import ORDERINGS
from raylane.scheduling.ordering._fair_share import team_share
from raylane.scheduling.types import SchedulerConfig

from .builders import PRETRAIN, PROD, SWEEP, decide, node, running, team, wl

TEAMS = [team("x"), team("y"), team("z"), team("nlp")]  # no quotas: ordering alone decides


def waiting_order(out):
    return [wid for wid, _ in sorted(out.positions.items(), key=lambda kv: kv[1])]


CASES = [
    dict(
        name="fifo: submit time across teams, priority ignored",
        ordering="fifo", slots=2,
        pending=[wl("a").team("x").cls(PROD).at(3), wl("b").team("y").cls(SWEEP).at(1),
                 wl("c").team("z").cls(PRETRAIN).at(2)],
        admitted={"b", "c"}, waiting=["a"],
    ),
    dict(
        name="priority: higher class first, FIFO among equals",
        ordering="priority", slots=2,
        pending=[wl("a").team("x").cls(PROD).at(3), wl("b").team("y").cls(SWEEP).at(1),
                 wl("c").team("z").cls(PRETRAIN).at(2), wl("d").team("x").cls(PRETRAIN).at(1.5)],
        admitted={"a", "d"}, waiting=["c", "b"],
    ),
    dict(
        name="fair-share: team holding less goes first, re-keyed after each admission",
        ordering="fair-share", slots=2,
        running=[running(wl("r1").team("y").gpus(4), on=["elsewhere"], since=0)],
        pending=[wl("y1").team("y").at(0), wl("x1").team("x").at(1), wl("x2").team("x").at(2),
                 wl("y2").team("y").at(3)],
        admitted={"x1", "x2"}, waiting=["y1", "y2"],
    ),
    dict(
        name="fair-share: decayed past usage counts",
        ordering="fair-share", slots=1,
        teams=[team("x", decayed=1e9), team("y", decayed=0.0)],
        pending=[wl("x1").team("x").at(0), wl("y1").team("y").at(5)],
        admitted={"y1"}, waiting=["x1"],
    ),
    dict(
        name="fair-share: usage is divided by weight",
        ordering="fair-share", slots=1,
        teams=[team("x", weight=4.0), team("y", weight=1.0)],
        running=[running(wl("rx").team("x").gpus(4), on=["elsewhere"]), running(wl("ry").team("y").gpus(2), on=["elsewhere"])],
        pending=[wl("y1").team("y").at(0), wl("x1").team("x").at(5)],
        admitted={"x1"}, waiting=["y1"],
    ),
    dict(
        name="fair-share: inside a team, priority then submit time",
        ordering="fair-share", slots=1,
        pending=[wl("x1").team("x").cls(SWEEP).at(0), wl("x2").team("x").cls(PROD).at(5)],
        admitted={"x2"}, waiting=["x1"],
    ),
    dict(
        name="las: least attained queue first; FIFO inside a queue, not least attained",
        ordering="las", slots=2,
        pending=[wl("c").attained(4000).at(0), wl("a").attained(3500).at(1), wl("b").attained(0).at(2),
                 wl("d").attained(40000).at(-5)],
        admitted={"a", "b"}, waiting=["c", "d"],
    ),
    dict(
        name="srtf: shortest remaining estimate first; attained service shortens it; no estimate last",
        ordering="srtf", slots=2,
        pending=[wl("a").est(100).at(0), wl("b").est(50).at(1), wl("c").at(-1),
                 wl("d").est(1000).attained(980).at(2), wl("e").est(100).at(3)],
        admitted={"d", "b"}, waiting=["a", "e", "c"],
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_ordering(case):
    # One node with `slots` free GPUs. Running leases sit on a node outside the cluster: they set team usage only.
    nodes = [node("n1").gpus(case["slots"])]
    runs = case.get("running", [])
    out = decide(nodes, case.get("teams", TEAMS), runs, case["pending"], now=100,
                 ordering=case["ordering"], backfill="greedy", preemption="none")
    assert set(out.admitted) == case["admitted"]
    assert all(pl == ("n1",) for pl in out.admitted.values())
    assert waiting_order(out) == case["waiting"]


def test_fair_share_share_formula():
    cfg = SchedulerConfig(fair_share_half_life_s=3600.0)

    class View:
        pass

    from raylane.scheduling import Resources
    from math import log
    t = team("x", weight=2.0, decayed=3600.0 / log(2) * 4)
    # 4 GPUs held now + 4 GPUs' worth of decayed past usage, over weight 2.
    assert team_share(t, Resources(gpu=4), cfg) == pytest.approx(4.0)


@pytest.mark.parametrize("name", ORDERINGS.names())
def test_keys_are_total_and_stable(name):
    """Keys end in the workload id, so two workloads never compare equal and sorting is deterministic."""
    pol = ORDERINGS.get(name)
    cfg = SchedulerConfig()
    a, b = wl("a").obj(), wl("b").obj()
    assert pol.queue_key(a, cfg) != pol.queue_key(b, cfg)
    assert pol.rank(a, 0.0, cfg) != pol.rank(b, 0.0, cfg)
