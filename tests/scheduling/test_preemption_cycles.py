"""Preemption over several cycles, and the cases where one cycle's decisions must not undo another's.

Each of these was a livelock or a wrong victim in the first version of the core (see the commit that added them):
the room a preemption makes must go to its preemptor, and nothing may be admitted only to be stopped next cycle.
"""
from raylane.scheduling import Displaced, QuotaExceeded, WaitingForPreemption, cycle

from .builders import CRITICAL, PRETRAIN, PROD, SWEEP, decide, make_state, node, nodes, obj, running, team, wl
from .driver import Driver


def test_a_borrower_admitted_in_the_cycle_does_not_expose_its_teams_in_quota_work():
    # nlp runs o1 within its nominal 4. Its borrower b (earlier in FIFO) would take the last 2 GPUs; then cv, under
    # its nominal, would reclaim from nlp, now "borrowing", by stopping o1. Work within nominal goes first instead.
    out = decide(
        [node("n1").gpus(4), node("n2").gpus(4)], [team("nlp", gpu=4), team("cv", gpu=4)],
        [running(wl("o1").gpus(4), on=["n1"]), running(wl("x").team("cv").gpus(2), on=["n2"])],
        [wl("b").gpus(2).at(0), wl("c").team("cv").gpus(2).at(1)], now=100, ordering="fifo")
    assert out.preempted == {}
    assert set(out.admitted) == {"c"}
    assert out.pending["b"] == QuotaExceeded("nlp", "gpu", used=4, nominal=4, borrowable=0, needed=2)
    assert out.positions["b"] == 1  # still first in queue order


def test_a_workload_admitted_earlier_in_the_cycle_is_displaced_not_preempted():
    out = decide(nodes(1, gpus=4), [team("nlp")], [],
                 [wl("v").cls(SWEEP).gpus(4).at(0), wl("p").cls(CRITICAL).gpus(4).at(1)], ordering="fifo")
    assert out.admitted == {"p": ("n1",)}
    assert out.preempted == {}
    assert out.pending["v"] == Displaced("p") and out.positions["v"] == 1
    assert "gave its place to p" in str(out.pending["v"])


def test_the_preemptor_gets_the_room_its_victims_free_under_fifo():
    # FIFO puts the victim (submitted first) ahead of its preemptor once requeued: it used to be admitted again,
    # preempted again, and so on forever. Now it is displaced in that cycle and the preemptor starts.
    st = make_state(nodes(1, gpus=4), [team("nlp")], running=[running(wl("v").cls(SWEEP).gpus(4).at(0), on=["n1"])],
                    ordering="fifo")
    d = Driver(st, [obj(wl("p").cls(CRITICAL).gpus(4).at(1))], {"v": 1000.0, "p": 10.0}, grace=5.0)
    d.now = 1.0
    r1 = d.step()
    assert {p.preemptor.id: p.victims for p in r1.preempted} == {"p": ("v",)}
    d.advance()                      # v stops at t=6 and is requeued ahead of p
    r2 = d.step()
    assert [a.workload.id for a in r2.admitted] == ["p"]
    d.run()
    assert d.preemptions == 1 and sorted(d.finished) == ["p", "v"]


def test_admission_does_not_take_what_a_waiting_preemptor_claimed():
    # p waits for v (terminating) and needs the whole node, including the 4 GPUs free now. x fits in those 4 now,
    # but starting it would make p preempt again once v is gone.
    out = decide(nodes(1), [team("nlp")], [running(wl("v").cls(SWEEP).gpus(4), on=["n1"], terminating=True)],
                 [wl("p").cls(PROD).gpus(8).at(0), wl("x").cls(SWEEP).gpus(1).at(1)])
    assert out.admitted == {}
    assert out.pending["p"] == WaitingForPreemption(("v",))
    assert "x" in out.pending


def test_work_that_fits_beside_a_claim_still_starts():
    # p claims n1 (4 free now + v's 4 once gone). x would best-fit into n1's 4 free GPUs, but those are claimed:
    # it goes to n2 instead, which nobody claimed.
    out = decide(nodes(2), [team("nlp")],
                 [running(wl("v").cls(SWEEP).gpus(4), on=["n1"], terminating=True),
                  running(wl("o").cls(CRITICAL).gpus(2), on=["n2"])],
                 [wl("p").cls(PROD).gpus(8).strategy("strict-pack").at(0), wl("x").cls(SWEEP).gpus(1).at(1)])
    assert out.pending["p"] == WaitingForPreemption(("v",))
    assert out.admitted == {"x": ("n2",)}


def test_two_preemptors_in_one_cycle_each_choose_their_own_victims():
    out = decide(nodes(1), [team("nlp")],
                 [running(wl("a").cls(SWEEP).gpus(4), on=["n1"]), running(wl("b").cls(SWEEP).gpus(4), on=["n1"])],
                 [wl("p1").cls(PROD).gpus(4).at(0), wl("p2").cls(PROD).gpus(4).at(1)])
    assert len(out.preempted) == 2
    assert out.victims == {"a", "b"}


def test_reclaim_happens_once_and_the_reclaiming_team_gets_the_room():
    # nlp fills the cluster with 8 long 1-GPU jobs (4 borrowed from cv). cv's 4-GPU gang reclaims 4 of them; the
    # requeued nlp jobs come first in FIFO but would borrow again, so cv's gang starts and nothing is preempted twice.
    cfg = dict(ordering="fifo", backfill="easy", preemption="default")
    st = make_state(nodes(1), [team("nlp", gpu=4), team("cv", gpu=4)], **cfg)
    work = [obj(wl(f"n{i}").gpus(1).cls(PRETRAIN).at(0)) for i in range(12)]
    gang = obj(wl("g").team("cv").gpus(4).cls(PRETRAIN).at(10))
    durations = {w.id: 500.0 for w in work} | {"g": 50.0}
    d = Driver(st, work + [gang], durations, grace=5.0)
    d.run()
    assert d.preemptions == 4
    assert sorted(d.finished) == sorted([w.id for w in work] + ["g"])
    assert d.finished.index("g") < 6  # g ran long before the nlp queue drained


def test_no_ping_pong_between_two_teams_under_their_nominal():
    # Quotas larger than the cluster: both teams are under nominal. Neither may reclaim from the other (neither
    # borrows), whatever the admission policy.
    for admission in ("quota", "none"):
        st = make_state(nodes(1), [team("nlp", gpu=8), team("cv", gpu=8)], admission=admission, ordering="fifo")
        work = [obj(wl(f"{t}{i}").team(t).gpus(2).at(i)) for i in range(4) for t in ("nlp", "cv")]
        d = Driver(st, work, {w.id: 100.0 for w in work}).run()
        assert d.preemptions == 0, admission


def test_no_admission_is_given_back_for_a_preemptor_that_a_reservation_would_block():
    # a starts; h (head, rl) cannot fit and holds a strict reservation (backfill none); p (nlp) is over its quota
    # ceiling unless a gives its place back, but p would then wait behind h anyway. Giving a's place back left
    # all three waiting on an idle cluster, cycle after cycle.
    cfg = dict(ordering="fifo", backfill="none", preemption="default")
    teams = [team("nlp", gpu=1, borrow=2), team("rl", gpu=4)]
    pend = [wl("a").cls(SWEEP).gpus(1).at(0), wl("h").team("rl").cls(PROD).gpus(4).at(1),
            wl("p").cls(PROD).gpus(3).at(2)]
    out = decide(nodes(1, gpus=4), teams, [], pend, **cfg)
    assert set(out.admitted) == {"a"}
    assert out.reason_type("h") == "NoCapacity"
    assert out.pending["p"] == QuotaExceeded("nlp", "gpu", used=1, nominal=1, borrowable=2, needed=3)
    d = Driver(make_state(nodes(1, gpus=4), teams, **cfg), [obj(w) for w in pend], {"a": 10, "h": 10, "p": 10}).run()
    assert d.finished == ["a", "h", "p"]


def test_a_failed_preemption_search_is_not_repeated_while_nothing_changes(monkeypatch):
    import importlib

    from .test_conformance import no_memo

    cycle_mod = importlib.import_module("raylane.scheduling.cycle")
    calls = []
    real = cycle_mod.find_victims

    def counting(*a, **kw):
        calls.append(a[0].id)
        return real(*a, **kw)

    monkeypatch.setattr(cycle_mod, "find_victims", counting)
    # nlp is at its ceiling with prod work; ten finetunes wait. Each could only take lower classes: there are none
    # left after the one sweep goes to f0. The search for f1 fails; f2..f9 are the same kind: not searched again.
    # Then a cv admission changes nothing for nlp (other team, no reclaim), so still no search.
    teams = [team("nlp", gpu=4, borrow=0), team("cv", gpu=4)]
    runs = [running(wl("p").cls(PROD).gpus(3), on=["n1"]), running(wl("s").cls(SWEEP).gpus(1), on=["n1"])]
    pend = [wl(f"f{i}").cls(PRETRAIN).gpus(1).at(i) for i in range(10)] + [wl("c").team("cv").gpus(1).at(20)]
    out = decide(nodes(1), teams, runs, pend, ordering="fifo")
    assert out.preempted == {"f0": ("s",)}
    assert set(out.admitted) == {"c"}
    assert calls == ["f0", "f1"]
    with no_memo():
        calls.clear()
        again = decide(nodes(1), teams, runs, pend, ordering="fifo")
    assert again.result == out.result and len(calls) == 10


def test_no_preemption_for_a_workload_the_reservation_would_not_let_start():
    # h (head) waits for the only h100 node; with no backfill everything behind it waits. c, behind it and over its
    # team's ceiling, could stop s: s (ahead of h in the queue) would then start again and be stopped again, forever.
    cfg = dict(ordering="fifo", backfill="none", preemption="default")
    teams = [team("nlp", gpu=4, borrow=0), team("rl", gpu=8)]
    runs = [running(wl("r").team("rl").cls(CRITICAL).gpus(4).features("h100").at(-9), on=["n1"]),
            running(wl("s").cls(SWEEP).gpus(2).at(-5), on=["n2"])]
    pend = [wl("h").team("rl").cls(PROD).gpus(4).features("h100").at(1), wl("c").cls(CRITICAL).gpus(4).at(2)]
    ns = [node("n1").gpus(4).features("h100"), node("n2")]
    out = decide(ns, teams, runs, pend, **cfg)
    assert out.preempted == {}
    assert out.reason_type("h") == "NoCapacity" and out.reason_type("c") == "QuotaExceeded"
    # Under EASY a short job behind the head may start, so it may also preempt for it.
    out = decide(ns, teams, runs, [pend[0], wl("c").cls(CRITICAL).gpus(4).at(2).est(60)], ordering="fifo",
                 backfill="easy", preemption="default")
    assert out.preempted == {"c": ("s",)}


def test_in_quota_work_past_the_window_takes_the_place_of_a_borrower_in_it():
    # nlp borrows 1 of cv's GPUs; 1 GPU is free. nlp's borrowers b1, b2 fill a window of 2; cv's c, within cv's
    # nominal, comes after. Admitting b1 let c into the next cycle's window, where c reclaimed b1; b1, requeued ahead
    # of c, pushed it out again: a livelock at one instant (Philly, the priority preset under quotas). Now c takes
    # the place of the window's last borrower, b2, which is not reached (at most ``max_examined`` are examined).
    run = [running(wl(f"r{i}").gpus(1), on=["n1"]) for i in range(3)]
    queue = [wl("b1").gpus(1).at(1), wl("b2").gpus(1).at(2), wl("c").team("cv").gpus(1).at(3)]
    out = decide(nodes(1, gpus=4), [team("nlp", gpu=2), team("cv", gpu=2)], run, queue, max_examined=2,
                 ordering="fifo")
    assert out.admitted == {"c": ("n1",)} and out.preempted == {}
    assert out.positions == {"b1": 1} and "b2" not in out.pending
    assert out.pending["b1"] == QuotaExceeded("nlp", "gpu", used=3, nominal=2, borrowable=0, needed=1)


def test_a_cycle_that_may_not_stop_running_leases_only_gives_back_its_own_admissions():
    """``cycle(..., stops=False)``: the control plane's cycles between full ticks. A preemptor gets no running victim
    there (the full tick decides what a stop loses), but a workload admitted earlier in that cycle still gives its
    place back to it (nothing is lost)."""
    st = make_state(nodes(1, gpus=2), [team("a")],
                    running=[running(wl("low").team("a").gpus(2).cls(SWEEP), on=["n1"])],
                    pending=[wl("high").team("a").gpus(2).cls(CRITICAL).at(1)])
    assert [p.victims for p in cycle(st.snapshot(), 10.0).preempted] == [("low",)]
    short = cycle(st.snapshot(), 10.0, stops=False)
    assert short.preempted == () and short.admitted == ()
    # room for one of two: the first in queue order is admitted, then the higher class takes its place (Displaced)
    st = make_state(nodes(1, gpus=2), [team("a")], running=[running(wl("low").team("a").gpus(1).cls(SWEEP), on=["n1"])],
                    pending=[wl("early").team("a").gpus(1).cls(SWEEP).at(1),
                             wl("later").team("a").gpus(1).cls(PROD).at(2)], ordering="fifo")
    short = cycle(st.snapshot(), 10.0, stops=False)
    assert [a.workload.id for a in short.admitted] == ["later"] and short.preempted == (), short
    assert [(p.workload.id, p.reason) for p in short.pending] == [("early", Displaced("later"))]
