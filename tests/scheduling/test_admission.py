"""Admission: team quotas with borrowing, lending limits and reclaim (Kueue's cohort model), and ``none``.

Each case: a cluster, teams, what runs, what waits; expected admitted set, which admissions borrow, and the
pending reasons with their numbers."""
import pytest

from raylane.scheduling import ADMISSIONS, QuotaExceeded, QuotaLedger, Resources, WaitingForPreemption

from .builders import PRETRAIN, decide, nodes, running, team, wl


def many(team_name, n, gpus=1, t0=0.0, prefix=None, cls=PRETRAIN):
    prefix = prefix or team_name
    return [wl(f"{prefix}{i}").team(team_name).gpus(gpus).cls(cls).at(t0 + i) for i in range(1, n + 1)]


CASES = [
    dict(
        name="quota: a team stops at its nominal when it may not borrow",
        teams=[team("nlp", gpu=4, borrow=0), team("cv", gpu=4)],
        pending=many("nlp", 5),
        admitted={"nlp1", "nlp2", "nlp3", "nlp4"}, borrowing=set(),
        reasons={"nlp5": QuotaExceeded("nlp", "gpu", used=4, nominal=4, borrowable=0, needed=1)},
    ),
    dict(
        name="quota: borrowing up to the borrowing limit, flagged as borrowing",
        teams=[team("nlp", gpu=4, borrow=2), team("cv", gpu=4)],
        pending=many("nlp", 8),
        admitted={f"nlp{i}" for i in range(1, 7)}, borrowing={"nlp5", "nlp6"},
        reasons={"nlp7": QuotaExceeded("nlp", "gpu", used=6, nominal=4, borrowable=0, needed=1),
                 "nlp8": QuotaExceeded("nlp", "gpu", used=6, nominal=4, borrowable=0, needed=1)},
    ),
    dict(
        name="quota: unlimited borrowing is limited by what others leave unused",
        teams=[team("nlp", gpu=4), team("cv", gpu=4)],
        running=[running(wl("cv-r").team("cv").gpus(3), on=["n1"])],
        pending=many("nlp", 8),
        admitted={f"nlp{i}" for i in range(1, 6)}, borrowing={"nlp5"},
        reasons={"nlp6": QuotaExceeded("nlp", "gpu", used=5, nominal=4, borrowable=0, needed=1)},
    ),
    dict(
        name="quota: the reason says how much may still be borrowed",
        teams=[team("nlp", gpu=4, borrow=2), team("cv", gpu=4)],
        running=[running(wl("nlp-r").team("nlp").gpus(5), on=["n1"])],
        pending=[wl("big").team("nlp").gpus(2)],
        admitted=set(), borrowing=set(),
        reasons={"big": QuotaExceeded("nlp", "gpu", used=5, nominal=4, borrowable=1, needed=2)},
    ),
    dict(
        name="quota: the lending limit keeps the guaranteed part for its owner",
        # cv lends at most 1 of its 4: nlp gets 4 + 1, and cv can still start 3 at once.
        teams=[team("nlp", gpu=4), team("cv", gpu=4, lend=1)],
        pending=many("nlp", 7) + many("cv", 3, t0=100),
        admitted={f"nlp{i}" for i in range(1, 6)} | {"cv1", "cv2", "cv3"}, borrowing={"nlp5"},
        reasons={"nlp6": QuotaExceeded("nlp", "gpu", used=5, nominal=4, borrowable=0, needed=1)},
    ),
    dict(
        name="quota: a team with no quota entry for a resource is not limited by it",
        teams=[team("nlp"), team("cv", gpu=4)],
        pending=many("nlp", 8),
        admitted={f"nlp{i}" for i in range(1, 9)}, borrowing=set(), reasons={},
    ),
    dict(
        name="quota: an unknown team holds nothing",
        teams=[team("cv", gpu=8)],
        pending=[wl("ghost").team("ghost")],
        admitted=set(), borrowing=set(),
        reasons={"ghost": QuotaExceeded("ghost", "gpu", used=0, nominal=0, borrowable=0, needed=1)},
    ),
    dict(
        name="none: capacity is the only limit",
        admission="none",
        teams=[team("nlp", gpu=4, borrow=0), team("cv", gpu=4)],
        pending=many("nlp", 8),
        admitted={f"nlp{i}" for i in range(1, 9)}, borrowing=set(), reasons={},
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_admission(case):
    out = decide(nodes(1, gpus=8), case["teams"], case.get("running", []), case["pending"], now=100,
                 admission=case.get("admission", "quota"), backfill="greedy", preemption="none")
    assert set(out.admitted) == case["admitted"]
    assert {a.workload.id for a in out.result.admitted if a.borrowing} == case["borrowing"]
    for wid, reason in case["reasons"].items():
        assert out.pending[wid] == reason


def test_reason_text_has_the_numbers():
    r = QuotaExceeded("nlp", "gpu", used=6, nominal=6, borrowable=2, needed=4)
    assert str(r) == "team nlp uses 6 of 6 GPU nominal + 2 borrowable; this gang needs 4"


def test_reclaim_preempts_only_the_borrowed_part():
    """cv is under its nominal; nlp borrows 4 of cv's GPUs. cv's gang takes back exactly what it needs."""
    runs = [running(wl(f"nlp-r{i}").team("nlp").gpus(2), on=["n1"], since=i) for i in range(4)]
    out = decide(nodes(1, gpus=8), [team("nlp", gpu=4), team("cv", gpu=4)], runs,
                 [wl("cv1").team("cv").gpus(4).cls(PRETRAIN).at(10)], now=100, preemption="default")
    assert out.admitted == {}
    # Two 2-GPU leases; the most recently started (least progress at risk) go first.
    assert out.preempted == {"cv1": ("nlp-r3", "nlp-r2")}
    assert out.pending["cv1"] == WaitingForPreemption(("nlp-r3", "nlp-r2"))


def test_ledger_pool_and_headroom():
    teams = {"a": team("a", gpu=4, lend=1), "b": team("b", gpu=4), "c": team("c", gpu=2, borrow=1)}
    ledger = QuotaLedger(teams, {"b": Resources(gpu=6)})
    # Lendable pool: 1 (a) + 4 (b) + 2 (c) = 7; b holds 6 of it.
    assert ledger.pool_cap["gpu"] == 7 and ledger.pool_used["gpu"] == 6
    assert ledger.headroom("a", "gpu") == 4  # its guaranteed 3, plus 1 from the pool
    assert ledger.headroom("c", "gpu") == 1  # the pool has 1 left; c could borrow 1 but holds 0
    assert ledger.borrowing("b") and not ledger.borrowing("a")
    ledger.remove("b", Resources(gpu=6))
    assert ledger.pool_used["gpu"] == 0 and ledger.headroom("c", "gpu") == 3


@pytest.mark.parametrize("name", ADMISSIONS.names())
def test_every_admission_lets_an_empty_cluster_take_an_in_quota_gang(name):
    out = decide(nodes(1), [team("nlp", gpu=8)], [], [wl("a").gpus(4)], admission=name)
    assert set(out.admitted) == {"a"}


def test_borrowers_go_after_work_within_nominal_and_may_not_be_reached():
    # FIFO puts nlp's borrower first; cv's in-quota gang is examined first for admission all the same. With a budget
    # of one admission, the borrower is examined (it keeps its queue position) but not reached.
    from raylane.scheduling import NotReached

    out = decide(nodes(1), [team("nlp", gpu=2), team("cv", gpu=6)],
                 [running(wl("r").gpus(2), on=["n1"])],
                 [wl("b").gpus(2).at(0), wl("c").team("cv").gpus(2).at(1)], now=100, ordering="fifo",
                 max_admissions_per_cycle=1)
    assert set(out.admitted) == {"c"}
    assert out.pending["b"] == NotReached() and out.positions["b"] == 1
