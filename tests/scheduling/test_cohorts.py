"""Cohort trees: lending, borrowing limits and reclaim over nested cohorts, fair share between subtrees, the ledger's
tree arithmetic and the per-cohort report (``raylane.scheduling.cohorts``).

Most cases run on one tree, ``org > dA > {a1, a2}`` and ``org > dB > {b1, b2}``, every team with a nominal of 4
GPUs unless a case says otherwise, on 3 nodes of 8 GPUs (capacity is not what limits a case) or 2 (the cluster is
full, for reclaim). Each case lists the cohorts' and teams' quotas it changes and the admitted counts per team.
"""
from __future__ import annotations

from collections import Counter
from typing import Dict, Optional

import pytest

from raylane.scheduling import (Cohort, QuotaExceeded, QuotaLedger, Resources, Team, WaitingForPreemption,
                                check_feasible)
from raylane.scheduling.cohorts import cohort_tree, cohort_usage

from .builders import CRITICAL, PRETRAIN, decide, nodes, running, wl
from raylane.scheduling.types import Quota

TREE = {"org": None, "dA": "org", "dB": "org"}
MEMBERS = {"a1": "dA", "a2": "dA", "b1": "dB", "b2": "dB"}


def org(cohorts: Optional[Dict[str, Quota]] = None, teams: Optional[Dict[str, Quota]] = None, flat: bool = False,
        weights: Optional[Dict[str, float]] = None, no_quota: bool = False):
    """The four teams of the module's tree; ``cohorts``/``teams``: quotas that differ from the defaults (cohorts:
    none; teams: nominal 4); ``flat``: the same teams without the tree; ``no_quota``: teams with no GPU quota."""
    cohorts, teams, weights = cohorts or {}, teams or {}, weights or {}
    built: Dict[str, Cohort] = {}
    for name, parent in TREE.items():  # parents first
        q = cohorts.get(name)
        built[name] = Cohort(name, {"gpu": q} if q else {}, built[parent] if parent else None,
                             weights.get(name, 1.0))
    out = []
    for name, c in MEMBERS.items():
        quotas = {} if no_quota else {"gpu": teams.get(name, Quota(4))}
        out.append(Team(name, quotas, cohort=None if flat else built[c]))
    return out


def many(team, n, gpus=1, t0=0.0):
    return [wl(f"{team}-{i}").team(team).gpus(gpus).cls(PRETRAIN).at(t0 + i) for i in range(1, n + 1)]


def exceeded(team, used, borrowable=0.0, needed=1.0, nominal=4.0):
    return QuotaExceeded(team, "gpu", used=used, nominal=nominal, borrowable=borrowable, needed=needed)


LENDING = [
    dict(name="a cohort that lends nothing keeps its idle quota for its own teams",
         cohorts={"dA": Quota(0, None, 0), "dB": Quota(0, None, 0)},
         pending=many("a1", 10), admitted={"a1": 8}, reasons={"a1-9": exceeded("a1", 8)}),
    dict(name="what a cohort may lend goes up the tree: a cousin borrows it after the sibling's",
         cohorts={"dA": Quota(0, None, 0), "dB": Quota(0, None, 2)},
         pending=many("a1", 12), admitted={"a1": 10}, reasons={"a1-11": exceeded("a1", 10)}),
    dict(name="without lending limits the whole tree is one pool",
         pending=many("a1", 17), admitted={"a1": 16}, reasons={"a1-17": exceeded("a1", 16)}),
    dict(name="a cohort's borrowing limit bounds its whole subtree",
         cohorts={"dA": Quota(0, 2)},
         pending=many("a1", 8) + many("a2", 8, t0=100), admitted={"a1": 6, "a2": 4},
         reasons={"a1-7": exceeded("a1", 6), "a2-5": exceeded("a2", 4)}),
    dict(name="a team's lending limit keeps its guaranteed part inside a cohort too",
         cohorts={"dA": Quota(0, None, 0), "dB": Quota(0, None, 0)}, teams={"a2": Quota(4, None, 1)},
         pending=many("a1", 6), admitted={"a1": 5}, reasons={"a1-6": exceeded("a1", 5)}),
    dict(name="a cohort's own nominal serves its teams",
         cohorts={"dA": Quota(2, None, 0), "dB": Quota(0, None, 0)},
         pending=many("a1", 11), admitted={"a1": 10}, reasons={"a1-11": exceeded("a1", 10)}),
    dict(name="a team borrows what its cohort keeps before what the cohort lends: a cousin still gets the latter",
         # dA keeps 6 of its 8 (lends 2). a1 holds 6: 2 of a2's, from what dA keeps, so dA's 2 are still there.
         cohorts={"dA": Quota(0, None, 2)},
         running=[running(wl("a1-r").team("a1").gpus(6), on=["n1"])],
         pending=many("b1", 12), admitted={"b1": 10}, reasons={"b1-11": exceeded("b1", 10)}),
    dict(name="a team's own borrowing limit still holds under a cohort",
         teams={"a1": Quota(4, 3)},
         pending=many("a1", 9), admitted={"a1": 7}, reasons={"a1-8": exceeded("a1", 7)}),
    dict(name="the reason's borrowable is what the tree has left for the team",
         cohorts={"dA": Quota(0, 3)},
         # dA may hold 8 + 3; a1 and a2 hold 6 + 4 of it.
         running=[running(wl("a1-r").team("a1").gpus(6), on=["n1"]), running(wl("a2-r").team("a2").gpus(4), on=["n2"])],
         pending=[wl("big").team("a1").gpus(2)], admitted={},
         reasons={"big": exceeded("a1", 6, borrowable=1, needed=2)}),
]


@pytest.mark.parametrize("case", LENDING, ids=[c["name"] for c in LENDING])
def test_lending_over_the_tree(case):
    out = decide(nodes(3, gpus=8), org(case.get("cohorts"), case.get("teams")), case.get("running", []),
                 case["pending"], now=100, backfill="greedy", preemption="none")
    got = Counter(wid.rsplit("-", 1)[0] for wid in out.admitted)
    assert dict(got) == case["admitted"]
    for wid, reason in case["reasons"].items():
        assert out.pending[wid] == reason


def fill(*groups):
    """Running 2-GPU leases ``<team>-r<i>``, one group per ``(team, count, since, class)``, filling n1 then n2;
    lease i of a group started at ``since + i``."""
    out, used = [], 0
    for team, n, since, cls in groups:
        for i in range(n):
            out.append(running(wl(f"{team}-r{i}").team(team).gpus(2).cls(cls), on=["n1" if used < 8 else "n2"],
                               since=since + i))
            used += 2
    return out


RECLAIM = [
    dict(name="the sibling's borrowing first, though the cousin's leases are cheaper",
         running=fill(("a2", 3, 0, PRETRAIN), ("b2", 5, 50, PRETRAIN)), victims=("a2-r2",), flat=("b2-r4",)),
    dict(name="a borrowing that stays inside another cohort is protected",
         # b2 borrows b1's idle quota, but dB holds no more than its nominal: a1 may not take from it.
         running=fill(("a2", 4, 0, CRITICAL), ("b2", 4, 50, PRETRAIN)), victims=None, flat=("b2-r3",)),
    dict(name="the cousin's, when its cohort borrows across the shared cohort",
         running=fill(("a2", 2, 0, PRETRAIN), ("b1", 1, 0, PRETRAIN), ("b2", 5, 50, PRETRAIN)), need=4,
         victims=("b2-r4", "b2-r3"), flat=("b2-r4", "b2-r3")),
    dict(name="never from a team within its nominal, even inside a borrowing cohort",
         # b1's leases are the cheapest, but b1 holds its nominal.
         running=fill(("a2", 2, 0, PRETRAIN), ("b1", 2, 60, PRETRAIN), ("b2", 4, 50, PRETRAIN)),
         victims=("b2-r3",), flat=("b2-r3",)),
]


@pytest.mark.parametrize("flat", [False, True], ids=["tree", "flat"])
@pytest.mark.parametrize("case", RECLAIM, ids=[c["name"] for c in RECLAIM])
def test_reclaim_over_the_tree(case, flat):
    """a1, within its nominal, wants ``need`` GPUs of a full 16-GPU cluster. Under the tree the nearest borrowers go
    first and a subtree that holds no more than its nominal is protected; the same teams without the tree (``flat``)
    take the cheapest borrower's leases, whichever cohort."""
    out = decide(nodes(2, gpus=8), org(flat=flat), case["running"],
                 [wl("want").team("a1").gpus(case.get("need", 2)).cls(PRETRAIN).at(90)], now=100)
    victims = case["flat"] if flat else case["victims"]
    if victims is None:
        assert out.preempted == {} and not isinstance(out.pending["want"], WaitingForPreemption)
    else:
        assert out.preempted == {"want": victims}


FAIR = [
    dict(name="the less used subtree first, though its team uses more than the other subtree's team",
         weights={}, first="a1"),
    dict(name="a cohort's weight divides its subtree's share", weights={"dB": 4.0}, first="b1"),
]


@pytest.mark.parametrize("case", FAIR, ids=[c["name"] for c in FAIR])
def test_fair_share_compares_subtrees_first(case):
    # dA: a1 holds 2. dB: b1 holds nothing, b2 holds 6. Flat, b1 (share 0) would go first.
    runs = [running(wl("a1-r").team("a1").gpus(2), on=["n1"]), running(wl("b2-r").team("b2").gpus(6), on=["n2"])]
    pending = [wl("a1-w").team("a1").at(0), wl("b1-w").team("b1").at(0)]
    out = decide(nodes(3), org(weights=case["weights"], no_quota=True), runs, pending, ordering="fair-share",
                 max_admissions_per_cycle=1, preemption="none")
    assert set(out.admitted) == {case["first"] + "-w"}
    flat = decide(nodes(3), org(flat=True, no_quota=True), runs, pending, ordering="fair-share",
                  max_admissions_per_cycle=1, preemption="none")
    assert set(flat.admitted) == {"b1-w"}


def test_fair_share_re_keys_the_cohort_after_an_admission():
    # Equal subtrees; a1 and b1 wait with 2 GPUs each, a2 with 1. After a1's admission dA holds more: b1 goes next,
    # before a2 (whose own share is still 0).
    pending = [wl("a1-w").team("a1").gpus(2).at(0), wl("a2-w").team("a2").at(1), wl("b1-w").team("b1").gpus(2).at(2)]
    out = decide(nodes(1), org(no_quota=True), [], pending, ordering="fair-share", preemption="none")
    order = [a.workload.id for a in out.result.admitted]
    assert order == ["a1-w", "b1-w", "a2-w"]


# ------------------------------------------------------------------------------------------------ the ledger


def test_tree_numbers():
    teams = {t.name: t for t in org({"dA": Quota(2, 3, 5), "org": Quota(0, None, None)},
                                    {"a2": Quota(4, None, 1)})}
    tree = cohort_tree(teams)
    # dA: own 2 + a1's 4 + a2's lendable 1 = 7, keeps 7 - 5 = 2; its subtree nominal is 2 + 4 + 4.
    assert tree.limits["dA"]["gpu"] == (7.0, 2.0, 3.0)
    assert tree.nominal["dA"]["gpu"] == 10.0
    # org: what dA (5) and dB (8) put in; no own quota.
    assert tree.limits["org"]["gpu"][:2] == (13.0, 0.0) and tree.nominal["org"]["gpu"] == 18.0
    assert tree.up["a1"] == ("dA", "org") and tree.path["b2"] == ("org", "dB")
    assert tree.distance("a1", "a2") == 0 and tree.distance("a1", "b1") == 1
    assert tree.below_common("b1", "a1") == ("dB",)
    assert cohort_tree({t.name: t for t in org(flat=True)}) is None


def test_ledger_under_a_tree_and_its_rollback():
    teams = {t.name: t for t in org({"dA": Quota(0, 2, 0)})}
    ledger = QuotaLedger(teams, {"a1": Resources(gpu=6)})
    # a1 borrows 2 from a2 inside dA, which keeps all of its 8: nothing reaches org or the root.
    assert ledger.cohort_used["dA"]["gpu"] == 6 and ledger.cohort_used["org"]["gpu"] == 0
    assert ledger.pool_cap["gpu"] == 8 and ledger.pool_used["gpu"] == 0  # only dB's 8 are in the root's pool
    assert ledger.headroom("a1", "gpu") == 4  # a2's 2 left + dA's borrowing limit 2
    assert ledger.headroom("b1", "gpu") == 8
    before = (dict(ledger.usage), {c: dict(u) for c, u in ledger.cohort_used.items()}, dict(ledger.pool_used))
    mark = ledger.mark()
    ledger.add("a1", Resources(gpu=4))
    ledger.add("b1", Resources(gpu=3))
    assert ledger.cohort_used["dA"]["gpu"] == 10 and ledger.cohort_used["org"]["gpu"] == 5
    assert ledger.pool_used["gpu"] == 5 and ledger.headroom("b2", "gpu") == 3  # dB's 8, less a1's 2 and b1's 3
    ledger.remove("a1", Resources(gpu=1))
    ledger.rollback(mark)
    assert (dict(ledger.usage), {c: dict(u) for c, u in ledger.cohort_used.items()}, dict(ledger.pool_used)) == before
    copy = ledger.copy()
    copy.add("b2", Resources(gpu=1))
    assert ledger.cohort_used["dB"]["gpu"] == 0 and copy.cohort_used["dB"]["gpu"] == 1


def test_check_feasible_reads_the_tree():
    teams = {t.name: t for t in org({"dA": Quota(0, 0, 0)})}
    assert check_feasible(wl("ok").team("a1").gpus(8).obj(), [n.obj() for n in nodes(2)], teams) is None
    why = check_feasible(wl("big").team("a1").gpus(9).obj(), [n.obj() for n in nodes(2)], teams)
    assert why is not None and "at most 8" in why.detail


def test_cohort_usage_report():
    teams = {t.name: t for t in org({"dB": Quota(0, None, 3)})}
    report = cohort_usage(teams, {"a1": Resources(gpu=7), "b2": Resources(gpu=2)})
    assert list(report)[0] == "org"  # top-down
    a, b, o = report["dA"], report["dB"], report["org"]
    assert (a.nominal.gpu, a.used.gpu, a.borrowed.gpu, a.idle.gpu, a.lendable.gpu) == (8, 7, 0, 1, 1)
    assert (b.nominal.gpu, b.used.gpu, b.borrowed.gpu, b.idle.gpu, b.lendable.gpu) == (8, 2, 0, 6, 3)
    assert o.parent is None and a.parent == "org" and o.teams == ("a1", "a2", "b1", "b2")
    assert (o.nominal.gpu, o.used.gpu) == (16, 9)
    assert cohort_usage({t.name: t for t in org(flat=True)}, {}) == {}
