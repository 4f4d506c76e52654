"""Fairness between the users of one team (``raylane.scheduling.users``): order with and without the rule, decayed
per-user usage, a user's cap with its reason, work of no known user. Each case fills one node of ``slots`` free GPUs
and checks who got in and in which order the rest wait."""
import math

import pytest

from raylane.scheduling import check_feasible
from raylane.scheduling.types import UserRule, UserShareExceeded
from raylane.scheduling.users import order_by_user, per_user_head
from raylane.scheduling.types import SchedulerConfig

from .builders import PROD, SWEEP, decide, make_state, node, running, team, wl

FAIR = UserRule(fair=True)
HALF_LIFE = 3600.0
MEAN_LIFE = HALF_LIFE / math.log(2)


def waiting_order(out):
    return [wid for wid, _ in sorted(out.positions.items(), key=lambda kv: kv[1])]


def sweep(user, n, t0=0.0):
    """``n`` single-GPU workloads of ``user``, submitted a second apart from ``t0 + 1``."""
    return [wl(f"{user}{i}").user(user).at(t0 + i) for i in range(1, n + 1)]


CASES = [
    dict(
        name="rule off: one user's sweep goes first, in submit order",
        teams=[team("nlp")], slots=2,
        pending=sweep("a", 3) + [wl("b1").user("b").at(10)],
        admitted={"a1", "a2"}, waiting=["a3", "b1"],
    ),
    dict(
        name="fair: a teammate's single run goes behind the sweep's first, not its last",
        teams=[team("nlp", users=FAIR)], slots=2,
        pending=sweep("a", 3) + [wl("b1").user("b").at(10)],
        admitted={"a1", "b1"}, waiting=["a2", "a3"],
    ),
    dict(
        name="fair: what a user holds now counts",
        teams=[team("nlp", users=FAIR)], slots=1,
        running=[running(wl("ra").user("a").gpus(2), on=["elsewhere"])],
        pending=[wl("a1").user("a").at(0), wl("b1").user("b").at(5)],
        admitted={"b1"}, waiting=["a1"],
    ),
    dict(
        name="fair: decayed past usage counts",
        teams=[team("nlp", users=FAIR, user_usage={"a": 3 * MEAN_LIFE})], slots=2,
        pending=sweep("a", 2) + sweep("b", 3, t0=10),
        admitted={"b1", "b2"}, waiting=["b3", "a1", "a2"],
    ),
    dict(
        name="fair: class priority still comes first",
        teams=[team("nlp", users=FAIR, user_usage={"a": 10 * MEAN_LIFE})], slots=1,
        pending=[wl("b1").user("b").cls(SWEEP).at(0), wl("a1").user("a").cls(PROD).at(5)],
        admitted={"a1"}, waiting=["b1"],
    ),
    dict(
        name="fair: work of no known user is one anonymous user",
        teams=[team("nlp", users=FAIR)], slots=2,
        pending=[wl("n1").at(0), wl("n2").at(1), wl("n3").at(2), wl("b1").user("b").at(3)],
        admitted={"n1", "b1"}, waiting=["n2", "n3"],
    ),
    dict(
        name="fair: other teams keep their own order",
        teams=[team("nlp", users=FAIR), team("cv")], slots=3,
        pending=[wl("c1").team("cv").user("c").at(0.5), wl("c2").team("cv").user("c").at(0.6),
                 wl("d1").team("cv").user("d").at(9)] + sweep("a", 2) + [wl("b1").user("b").at(10)],
        # priority ordering merges the heads by submit time: a1 (1), then c1, c2 ...; nlp's queue is a1, b1, a2.
        admitted={"c1", "c2", "a1"}, waiting=["d1", "b1", "a2"],
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_user_order(case):
    out = decide([node("n1").gpus(case["slots"])], case["teams"], case.get("running", []), case["pending"], now=100,
                 backfill="greedy", preemption="none", fair_share_half_life_s=HALF_LIFE)
    assert set(out.admitted) == case["admitted"]
    assert waiting_order(out) == case["waiting"]


CAP_CASES = [
    dict(
        name="a user at its cap waits with UserShareExceeded; a teammate takes the room",
        rule=UserRule(fair=False, max_share=0.5), nominal=4, slots=4,
        running=[running(wl("ra").user("a").gpus(2), on=["elsewhere"])],
        pending=sweep("a", 2) + [wl("b1").user("b").at(10)],
        admitted={"b1"}, capped={"a1": ("a", 2.0, 2.0, 1.0), "a2": ("a", 2.0, 2.0, 1.0)},
    ),
    dict(
        name="the cap counts this cycle's admissions",
        rule=UserRule(fair=False, max_share=0.5), nominal=4, slots=4,
        pending=sweep("a", 3),
        admitted={"a1", "a2"}, capped={"a3": ("a", 2.0, 2.0, 1.0)},
    ),
    dict(
        name="no cap: the whole sweep runs",
        rule=UserRule(fair=False), nominal=4, slots=4,
        pending=sweep("a", 3),
        admitted={"a1", "a2", "a3"}, capped={},
    ),
    dict(
        name="the anonymous user is capped too",
        rule=UserRule(fair=True, max_share=0.25), nominal=4, slots=4,
        pending=[wl("n1").at(0), wl("n2").at(1)],
        admitted={"n1"}, capped={"n2": (None, 1.0, 1.0, 1.0)},
    ),
    dict(
        name="borrowing does not raise a user's cap",
        rule=UserRule(fair=False, max_share=0.5), nominal=2, borrow=None, slots=4,
        pending=sweep("a", 2) + [wl("b1").user("b").at(10), wl("c1").user("c").at(11)],
        # the team borrows a third GPU (c1), but a's second still waits at its cap of 0.5 x 2
        admitted={"a1", "b1", "c1"}, capped={"a2": ("a", 1.0, 1.0, 1.0)},
    ),
]


@pytest.mark.parametrize("case", CAP_CASES, ids=[c["name"] for c in CAP_CASES])
def test_user_cap(case):
    teams = [team("nlp", gpu=case["nominal"], borrow=case.get("borrow", 0), users=case["rule"]),
             team("idle", gpu=8)]  # lends what nlp borrows
    out = decide([node("n1").gpus(case["slots"])], teams, case.get("running", []), case["pending"], now=100,
                 backfill="greedy", preemption="none")
    assert set(out.admitted) == case["admitted"]
    got = {wid: r for wid, r in out.pending.items() if isinstance(r, UserShareExceeded)}
    assert {wid: (r.user, r.held, r.cap, r.needed) for wid, r in got.items()} == case["capped"]
    for r in got.values():
        assert f"a user may hold at most {r.cap:g}" in str(r) and "nlp" in str(r)


def test_a_gang_above_the_cap_is_infeasible():
    t = team("nlp", gpu=8, users=UserRule(max_share=0.25))
    why = check_feasible(wl("big").gpus(3).user("a").obj(), [node("n1").obj()], {"nlp": t})
    assert why is not None and "at most 2" in why.detail
    assert check_feasible(wl("ok").gpus(2).user("a").obj(), [node("n1").obj()], {"nlp": t}) is None


def test_decayed_user_usage_is_charged_and_decays():
    st = make_state([node("n1")], [team("nlp", users=FAIR), team("cv")],
                    running=[running(wl("a1").user("a").gpus(2), on=["n1", "n1"], since=0),
                             running(wl("c1").team("cv").user("c"), on=["n1"], since=0)],
                    fair_share_half_life_s=HALF_LIFE)
    st.finish("a1", 100.0)
    st.finish("c1", 100.0)
    assert st.teams["nlp"].user_usage == {"a": pytest.approx(200.0)}
    assert st.teams["cv"].user_usage == {}  # no rule: no per-user books
    st.decay(100.0 + HALF_LIFE)
    assert st.teams["nlp"].user_usage["a"] == pytest.approx(100.0)
    assert st.teams["nlp"].decayed_usage == pytest.approx(100.0)


def test_snapshot_keeps_each_users_head():
    """With a limit, one user's long sweep does not push a teammate's run out of the snapshot."""
    pending = sweep("a", 5) + [wl("b1").user("b").at(10)]
    on = make_state([node("n1")], [team("nlp", users=FAIR)], pending=pending).snapshot(limit=2)
    off = make_state([node("n1")], [team("nlp")], pending=pending).snapshot(limit=2)
    assert [w.id for w in on.queues["nlp"]] == ["a1", "a2", "b1"]
    assert [w.id for w in off.queues["nlp"]] == ["a1", "a2"]


def test_order_by_user_equal_usage_interleaves_and_weighs_gpus():
    cfg = SchedulerConfig()
    t = team("nlp", users=FAIR)
    q = tuple(w.obj() for w in [wl("a1").user("a").gpus(4).at(0), wl("a2").user("a").at(1),
                                wl("b1").user("b").at(2), wl("b2").user("b").at(3), wl("b3").user("b").at(4)])
    # a1 takes 4 GPUs: b's three single GPUs come before a's second workload.
    assert [w.id for w in order_by_user(q, t, {}, cfg)] == ["a1", "b1", "b2", "b3", "a2"]
    one_user = q[:2]
    assert order_by_user(one_user, t, {}, cfg) is one_user
    assert [w.id for w in per_user_head(q, 1)] == ["a1", "b1"]
