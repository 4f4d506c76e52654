"""Carrying out a cycle's result (``raylane.scheduling.apply``): the order, the stops and their deadlines, resizes,
requeues and the cycle-again rules every driver shares. Pure: no Ray."""
from __future__ import annotations

import pytest

from raylane.scheduling import Admit, CycleResult, LeaseState, Preempt, Resize, cycle
from raylane.scheduling.apply import LIVE, SETTLE, Applier, cycle_again, nominees
from raylane.scheduling.types import BehindHead, NotReached, Pending, WaitingForPreemption, WorkloadClass

from .builders import ELASTIC, FINETUNE, PRETRAIN, make_state, nodes, obj, running, summarize, team, wl


class Rec:
    """A driver that records every hook, stopping at once the leases listed in ``at_once``."""

    def __init__(self, at_once=(), resizes_at_once=False):
        self.log, self.at_once, self.resizes_at_once = [], set(at_once), resizes_at_once

    def admitted(self, a, lease, now):
        self.log.append(("admitted", a.workload.id, now))

    def resizing(self, rz, grown, stop, now):
        self.log.append(("resizing", rz.workload.id, grown is not None, None if stop is None else stop.deadline))

    def stopping(self, stop, lease, now):
        self.log.append(("stopping", stop.workload_id, stop.deadline))
        return stop.workload_id in self.at_once

    def requeued(self, lease, w, stop, now, attained):
        self.log.append(("requeued", w.id, now, attained))

    def resized(self, rz, lease, stop, now):
        self.log.append(("resized", lease.id, lease.workload.gang.workers, now))


def result(admitted=(), preempted=(), resized=(), pending=()):
    return CycleResult(tuple(admitted), tuple(preempted), tuple(pending), tuple(resized))


def test_admissions_then_resizes_then_victims_and_those_stopped_at_once_last():
    g = grace = PRETRAIN.grace_period_s
    st = make_state(nodes(2), [team("nlp")], running=[running(wl("v1").gpus(4), on=["n1"], since=0),
                                                       running(wl("v2").gpus(4), on=["n1"], since=0)],
                    pending=[wl("a").gpus(8).cls(FINETUNE)])
    d = Rec(at_once={"v2"})
    ap = Applier(st, d)
    p = Preempt(obj(wl("a").gpus(8).cls(FINETUNE)), ("v1", "v2"), "for a")
    again = ap.apply(result(admitted=[Admit(obj(wl("a").gpus(8).cls(FINETUNE)), ("n2",))], preempted=[p]), 100.0)
    assert [e[0] for e in d.log] == ["admitted", "stopping", "stopping", "requeued"]
    assert d.log[1] == ("stopping", "v1", 100.0 + grace) and d.log[3][:2] == ("requeued", "v2")
    assert d.log[3][3] == 4 * 100.0  # its service until it stopped
    assert again  # a victim stopped at once freed room: cycle again (the live plane's poke)
    assert st.leases["v1"].state is LeaseState.TERMINATING and "v2" not in st.leases and st.is_pending("v2")
    assert set(ap.stops) == {"v1"} and g >= 0


def test_a_victim_told_twice_is_asked_once_and_stopped_when_its_gang_stops():
    st = make_state(nodes(1), [team("nlp")], running=[running(wl("v").gpus(8), on=["n1"], since=0)])
    d = Rec()
    ap = Applier(st, d)
    assert not ap.stop("v", 10.0, "preemption")
    assert not ap.stop("v", 20.0, "drain")  # stopping already
    assert [e[0] for e in d.log] == ["stopping"]
    assert ap.overdue(10.0 + PRETRAIN.grace_period_s - 1) == [] and ap.overdue(10.0 + PRETRAIN.grace_period_s) == ["v"]
    ap.stopped("v", 50.0)
    assert st.is_pending("v") and not ap.stops and d.log[-1] == ("requeued", "v", 50.0, 8 * 50.0)


def test_a_shrink_keeps_the_gang_booked_until_it_stops_and_a_preemption_then_keeps_its_deadline():
    st = make_state(nodes(1), [team("nlp")], running=[running(wl("e").gpus(2).workers(4).cls(ELASTIC).elastic(1, 4),
                                                              on=["n1"] * 4, since=0)])
    d = Rec()
    ap = Applier(st, d)
    lease = st.leases["e"]
    rz = Resize(lease.workload, 4, 2, ("n1", "n1"), (), "shrink")
    assert ap.apply(result(resized=[rz]), 10.0) is False  # the LIVE rule: a resize alone does not cycle again
    assert d.log[-1] == ("resizing", "e", False, 10.0 + ELASTIC.grace_period_s)
    assert st.leases["e"].state is LeaseState.TERMINATING and st.nodes["n1"].free.gpu == 0
    ap.stop("e", 20.0, "preemption")  # stopping for its resize, it now stops for good
    assert ap.stops["e"].deadline == 10.0 + ELASTIC.grace_period_s and ap.stops["e"].resize is None
    ap.stopped("e", 25.0)
    assert st.is_pending("e") and st.nodes["n1"].free.gpu == 8


def test_a_shrink_goes_on_at_its_size_once_its_gang_stops():
    st = make_state(nodes(1), [team("nlp")], running=[running(wl("e").gpus(2).workers(4).cls(ELASTIC).elastic(1, 4),
                                                              on=["n1"] * 4, since=0)])
    d = Rec()
    ap = Applier(st, d)
    lease = st.leases["e"]
    ap.apply(result(resized=[Resize(lease.workload, 4, 2, ("n1", "n1"), (), "shrink")]), 10.0)
    got = ap.stopped("e", 12.0)
    assert got.workload.gang.workers == 2 and st.nodes["n1"].free.gpu == 4 and d.log[-1] == ("resized", "e", 2, 12.0)
    assert st.leases["e"].state is LeaseState.RUNNING and not ap.stops


def test_a_driver_that_models_no_resize_stop_takes_the_size_at_once():
    st = make_state(nodes(1), [team("nlp")], running=[running(wl("e").gpus(2).workers(2).cls(ELASTIC).elastic(1, 4),
                                                              on=["n1"] * 2, since=0)])
    d = Rec(resizes_at_once=True)
    ap = Applier(st, d, rule=SETTLE)
    lease = st.leases["e"]
    assert ap.apply(result(resized=[Resize(lease.workload, 2, 4, ("n1",) * 4, (), "grow")]), 5.0)
    assert st.leases["e"].workload.gang.workers == 4 and not ap.stops and d.log[-1] == ("resizing", "e", True, None)


@pytest.mark.parametrize("rule, admitted, pending, resized, budget, examined, want", [
    (LIVE, 64, 0, 0, 64, 500, False),      # the live plane: only a release asks for another cycle
    (SETTLE, 64, 0, 0, 64, 500, True),     # its whole admission budget: more may be admitted now
    (SETTLE, 3, 497, 0, 64, 500, True),    # admitted and ran out of workloads to examine
    (SETTLE, 3, 10, 0, 64, 500, False),
    (SETTLE, 0, 10, 1, 64, 500, True),     # a resize
    (LIVE, 0, 10, 1, 64, 500, False),
])
def test_cycle_again_rules(rule, admitted, pending, resized, budget, examined, want):
    w = obj(wl("x"))
    r = result(admitted=[Admit(w, ("n1",))] * admitted, resized=[None] * resized,
               pending=[None] * pending)
    assert cycle_again(r, 0, rule, budget, examined) is want
    assert cycle_again(r, 1, rule, budget, examined) is True


def test_an_unknown_rule_is_refused_by_name():
    with pytest.raises(ValueError, match="allowed: live, settle"):
        Applier(make_state(nodes(1), [team("nlp")]), Rec(), rule="eager")



# -- nominated preemptors ---------------------------------------------------------------------------------------

EVAL = WorkloadClass("eval", priority=150, preemptible=True, min_runtime_s=0)
WIDE = WorkloadClass("wide", priority=100, preemptible=True)
LOW = WorkloadClass("low", priority=5, preemptible=True)
PINNED = WorkloadClass("pinned", priority=300, preemptible=False)
BIG = WorkloadClass("big", priority=200, preemptible=True)


def test_a_preemptor_is_nominated_while_it_waits_for_its_victims_and_until_a_cycle_examines_it_again():
    p, q = wl("p").obj(), wl("q").obj()
    waiting = result(preempted=[Preempt(p, ("v",), "r")], pending=[Pending(p, WaitingForPreemption(("v",)), 3)])
    assert nominees(waiting, {}) == ["p"]
    # not reached by a cycle: it stays; examined and waiting for something else now: it goes
    assert nominees(result(pending=[Pending(p, NotReached(), 9)]), {"p": None}) == ["p"]
    assert nominees(result(pending=[Pending(p, BehindHead("x"), 1), Pending(q, WaitingForPreemption(("w",)), 2)]),
                    {"p": None}) == ["q"]
    assert nominees(result(admitted=[Admit(p, ("n1",))]), {"p": None}) == []


def window_state():
    """One node of 2 GPUs: team a runs a pinned GPU and queues an eval gang that would borrow the other; team b (its
    nominal 1 GPU free) queues three 2-GPU gangs (borrowers that cannot start) ahead of its 1-GPU ``b-low``."""
    return make_state(nodes(1, gpus=2), [team("a", gpu=1, borrow=1), team("b", gpu=1, borrow=1)],
                      running=[running(wl("a-hold").team("a").gpus(1).cls(PINNED), on=["n1"])],
                      pending=[wl("a-eval").team("a").gpus(1).cls(EVAL).at(3)]
                      + [wl(f"b-wide-{i}").team("b").gpus(2).cls(WIDE).at(1 + i) for i in range(3)]
                      + [wl("b-low").team("b").gpus(1).cls(LOW).at(2)])


def test_a_cycle_examines_a_nominated_workload_past_its_window():
    # A window of 2 reaches a-eval and b-wide-0 only: b-low (within its team's nominal quota, past its team's
    # first 2) is never looked at, and a-eval takes the free GPU by borrowing.
    st = window_state()
    short = summarize(cycle(st.snapshot(limit=2), 10.0, max_examined=2))
    assert set(short.admitted) == {"a-eval"} and "b-low" not in short.pending
    # Nominated (it preempted a-eval at a full cycle, and a-eval, not started, was released at once), b-low is
    # examined by the short cycle too: within its nominal quota it goes first, and a-eval waits.
    st = window_state()
    st.nominate(["b-low"])
    short = summarize(cycle(st.snapshot(limit=2), 10.0, max_examined=2))
    assert set(short.admitted) == {"b-low"}, short
    assert short.reason_type("a-eval") != "NotReached"


def test_a_gang_released_before_it_started_is_not_readmitted_in_the_room_freed_for_its_preemptor():
    """Full cycles and short ones in turn, as the control plane runs them: a-eval is admitted once (by a short
    cycle), preempted once by b-low at the next full one, and b-low is admitted into what it freed."""
    st = window_state()
    log = Rec(at_once={"a-eval"})  # not started: released at once
    apply = Applier(st, log)
    for t in range(10):
        full = t % 2 == 1
        res = cycle(st.snapshot(), float(t)) if full else cycle(st.snapshot(limit=2), float(t), max_examined=2)
        again = apply.apply(res, float(t))
        while again:
            again = apply.apply(cycle(st.snapshot(limit=2), float(t), max_examined=2), float(t))
    admitted = [wid for kind, wid, *_ in log.log if kind == "admitted"]
    assert admitted.count("a-eval") == 1 and "b-low" in st.leases, log.log


def test_a_nominated_workload_is_not_deferred_behind_in_quota_work_while_its_victim_still_counts():
    """Team p (nominal 4) holds 2 running GPUs and a 1-GPU gang stopping for ``p-big`` (2 GPUs). Counted now, p-big
    would borrow: it waits for the borrowers' pass, and a window of 2 full of work (its team's requeued eval gang,
    within the quota now, admitted) gives its place in that pass to team q's in-quota work past the window, so
    p-big is not reached and the eval gang takes the quota it waits for (the loop: preempted again at the next
    full cycle). Nominated, p-big is decided in its place and claims the quota first."""
    def state():
        return make_state(nodes(1, gpus=8), [team("p", gpu=4, borrow=0), team("q", gpu=4, borrow=0)],
                          running=[running(wl("p-run").team("p").gpus(2).cls(PINNED), on=["n1"]),
                                   running(wl("p-stop").team("p").gpus(1).cls(LOW), on=["n1"], terminating=True)],
                          pending=[wl("p-big").team("p").gpus(2).cls(BIG).at(1),
                                   wl("p-eval").team("p").gpus(1).cls(EVAL).at(2),
                                   wl("q-low").team("q").gpus(1).cls(LOW).at(3)])
    plain = summarize(cycle(state().snapshot(limit=2), 10.0, max_examined=2, stops=False))
    assert "p-eval" in plain.admitted and "p-big" not in plain.pending, plain
    st = state()
    st.nominate(["p-big"])
    out = summarize(cycle(st.snapshot(limit=2), 10.0, max_examined=2, stops=False))
    assert "p-eval" not in out.admitted and out.reason_type("p-big") == "WaitingForPreemption", out
