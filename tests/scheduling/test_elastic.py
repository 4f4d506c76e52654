"""Elastic gangs in the core (issue 15): admission at a size in [min, max], growth into free capacity, shrinking as
a preemption option chosen by the same victim search under the same rules. Pure table tests."""
from dataclasses import replace

from raylane.scheduling import WorkloadClass, cycle

from .builders import (ELASTIC, PRETRAIN, PROD, SWEEP, decide, make_state, node, running, team, wl)

FAR = 10_000.0  # "now" long after every running lease started: past any minimum runtime and resize interval


def _resized(out):
    return {r.workload.id: (r.from_workers, r.to_workers) for r in out.result.resized}


def _size(out, wid):
    return len(out.admitted[wid])


def test_alone_on_an_idle_cluster_it_is_admitted_at_its_maximum():
    out = decide([node("n1").gpus(8)], [team("nlp", gpu=8)], pending=[wl("e").cls(ELASTIC).elastic(2, 6)])
    assert _size(out, "e") == 6
    assert out.result.admitted[0].workload.gang.workers == 6  # the Admit carries the size it holds


def test_at_its_minimum_while_others_wait_then_grows_into_what_is_left():
    # e (2..8) first in the queue, then f (4 GPUs). e starts at 2 so that f fits; nothing waits after f, so e takes
    # the 2 GPUs left: 4 in all, never f's.
    out = decide([node("n1").gpus(8)], [team("nlp", gpu=8)],
                 pending=[wl("e").cls(ELASTIC).elastic(2, 8).at(0), wl("f").cls(ELASTIC).gpus(1).workers(4).at(1)])
    assert _size(out, "f") == 4
    assert _size(out, "e") == 4


def test_no_growth_while_work_of_its_priority_or_higher_waits():
    # h (prod) waits: its team cv runs 2 GPUs of its 4 and may not borrow. e must stay at its minimum rather than
    # take what h may get once cv's own work ends.
    nodes = [node("n1").gpus(8), node("n2").gpus(2)]
    teams = [team("nlp", gpu=8), team("cv", gpu=4, borrow=0)]
    run = [running(wl("c").team("cv").cls(PROD).workers(2), on=("n2", "n2"))]
    pend = [wl("e").cls(ELASTIC).elastic(2, 8).at(0), wl("h").team("cv").cls(PROD).workers(4).at(1)]
    out = decide(nodes, teams, running=run, pending=pend)
    assert out.reason_type("h") == "QuotaExceeded"
    assert _size(out, "e") == 2
    # Lower-priority work waiting does not hold it back.
    pend = [wl("e").cls(ELASTIC).elastic(2, 8).at(0), wl("s").team("cv").cls(SWEEP).workers(4).at(1)]
    out = decide(nodes, teams, running=run, pending=pend)
    assert out.reason_type("s") == "QuotaExceeded"
    assert _size(out, "e") == 8


def test_admitted_within_quota_at_the_size_quota_allows():
    out = decide([node("n1").gpus(8)], [team("nlp", gpu=3)], pending=[wl("e").cls(ELASTIC).elastic(2, 8)])
    assert _size(out, "e") == 3


def test_a_running_gang_grows_when_capacity_frees_after_its_resize_interval():
    run = [running(wl("e").cls(ELASTIC).elastic(2, 8).workers(2), on=("n1", "n1"), since=0)]
    out = decide([node("n1").gpus(8)], [team("nlp", gpu=8)], running=run, now=FAR)
    assert _resized(out) == {"e": (2, 8)}
    rz = out.result.resized[0]
    assert rz.placement == ("n1",) * 8 and len(rz.devices) == 8
    assert "grows from 2 to 8" in rz.reason
    # Not within the interval of its last (re)start (default 600 s): no restart for a few more GPUs.
    out = decide([node("n1").gpus(8)], [team("nlp", gpu=8)], running=run, now=300)
    assert _resized(out) == {}


def test_a_higher_class_shrinks_an_elastic_gang_instead_of_stopping_it():
    # e runs at 8 (min 2); p (prod) needs 4. e shrinks to 4, the largest size that lets p fit; nothing stops.
    run = [running(wl("e").cls(ELASTIC).elastic(2, 8).workers(8), on=("n1",) * 8, since=0)]
    out = decide([node("n1").gpus(8)], [team("nlp", gpu=8)], running=run,
                 pending=[wl("p").cls(PROD).workers(4).at(FAR - 1)], now=FAR)
    assert out.preempted == {}
    assert _resized(out) == {"e": (8, 4)}
    rz = out.result.resized[0]
    assert rz.placement == ("n1",) * 4
    assert "shrinks from 8 to 4" in rz.reason and "p (nlp/prod" in rz.reason
    assert out.reason_type("p") == "WaitingForPreemption" and out.reason("p").victims == ("e",)


def test_shrinking_is_applied_by_the_state_and_the_preemptor_then_starts():
    st = make_state([node("n1").gpus(8)], [team("nlp", gpu=8)],
                    running=[running(wl("e").cls(ELASTIC).elastic(2, 8).workers(8), on=("n1",) * 8, since=0)],
                    pending=[wl("p").cls(PROD).workers(4).at(FAR - 1)])
    res = cycle(st.snapshot(), FAR)
    lease = st.resize(res.resized[0], FAR)
    assert lease.workload.gang.workers == 4 and st.usage["nlp"].gpu == 4 and st.nodes["n1"].free.gpu == 4
    assert lease.start_time == FAR and lease.workload.attained_gpu_s == 8 * FAR
    res = cycle(st.snapshot(), FAR)
    assert [a.workload.id for a in res.admitted] == ["p"] and not res.resized and not res.preempted


def test_never_below_its_minimum_a_gang_that_must_give_more_stops_whole():
    run = [running(wl("e").cls(ELASTIC).elastic(3, 4).workers(4), on=("n1",) * 4, since=0)]
    out = decide([node("n1").gpus(4)], [team("nlp", gpu=4)], running=run,
                 pending=[wl("p").cls(PROD).workers(2).at(FAR - 1)], now=FAR)
    # Shrinking to 3 frees 1 GPU, p needs 2: e is stopped, not shrunk below 3.
    assert out.preempted == {"p": ("e",)} and _resized(out) == {}


def test_shrink_keeps_the_rules_minimum_runtime_and_other_teams_in_quota_work():
    slow = WorkloadClass("slow-elastic", priority=20, preemptible=True, min_runtime_s=600, resizable=True)
    run = [running(wl("e").cls(slow).elastic(2, 8).workers(8), on=("n1",) * 8, since=FAR - 100)]
    out = decide([node("n1").gpus(8)], [team("nlp", gpu=8)], running=run,
                 pending=[wl("p").cls(PROD).workers(4).at(FAR - 1)], now=FAR)
    assert _resized(out) == {} and out.preempted == {}
    # cv's gang is within cv's nominal quota: nlp's prod work may not shrink it.
    run = [running(wl("e").team("cv").cls(ELASTIC).elastic(2, 8).workers(8), on=("n1",) * 8, since=0)]
    out = decide([node("n1").gpus(8)], [team("nlp", gpu=4), team("cv", gpu=8)], running=run,
                 pending=[wl("p").cls(PROD).workers(4).at(FAR - 1)], now=FAR)
    assert _resized(out) == {} and out.preempted == {}
    # ... but when cv borrows (nominal 4, holds 8), the borrowed part is reclaimed by shrinking.
    out = decide([node("n1").gpus(8)], [team("nlp", gpu=4), team("cv", gpu=4, borrow=4)], running=run,
                 pending=[wl("p").cls(PROD).workers(4).at(FAR - 1)], now=FAR)
    assert _resized(out) == {"e": (8, 4)} and out.preempted == {}


def test_a_class_that_is_not_resizable_is_stopped_not_shrunk():
    fixed = replace(ELASTIC, name="fixed", resizable=False)
    run = [running(wl("e").cls(fixed).elastic(2, 8).workers(8), on=("n1",) * 8, since=0)]
    out = decide([node("n1").gpus(8)], [team("nlp", gpu=8)], running=run,
                 pending=[wl("p").cls(PROD).workers(4).at(FAR - 1)], now=FAR)
    assert out.preempted == {"p": ("e",)} and _resized(out) == {}


def test_a_lower_class_is_stopped_before_a_higher_one_shrinks():
    # s (sweep, 4 GPUs) is cheaper than any part of e (elastic, priority 20): the cost order is class first.
    run = [running(wl("e").cls(ELASTIC).elastic(2, 4).workers(4), on=("n1",) * 4, since=0),
           running(wl("s").cls(SWEEP).workers(4), on=("n2",) * 4, since=0)]
    out = decide([node("n1").gpus(4), node("n2").gpus(4)], [team("nlp", gpu=8)], running=run,
                 pending=[wl("p").cls(PROD).workers(2).at(FAR - 1)], now=FAR)
    assert out.preempted == {"p": ("s",)} and _resized(out) == {}


def test_shrinking_two_gangs_before_stopping_one_of_the_same_class():
    # Two elastic gangs of 4 (min 2) and a fixed pretrain gang of 4, all priority 20; p needs 4: each elastic gang
    # gives 2, nothing stops.
    run = [running(wl("e1").cls(ELASTIC).elastic(2, 4).workers(4), on=("n1",) * 4, since=0),
           running(wl("e2").cls(ELASTIC).elastic(2, 4).workers(4), on=("n2",) * 4, since=0),
           running(wl("f").cls(PRETRAIN).workers(4), on=("n3",) * 4, since=0)]
    out = decide([node("n1").gpus(4), node("n2").gpus(4), node("n3").gpus(4)], [team("nlp", gpu=12)],
                 running=run, pending=[wl("p").cls(PROD).workers(4).strategy("spread").at(FAR - 1)], now=FAR)
    assert out.preempted == {} and _resized(out) == {"e1": (4, 2), "e2": (4, 2)}


def test_a_driver_that_cannot_resize_running_gangs_gets_no_resize():
    # resize_running off (the live actor until it carries resizes out): admission still sizes the gang, but a
    # running one neither grows nor shrinks; a preemptor stops it whole.
    run = [running(wl("e").cls(ELASTIC).elastic(2, 8).workers(4), on=("n1",) * 4, since=0)]
    out = decide([node("n1").gpus(8)], [team("nlp", gpu=8)], running=run, now=FAR, resize_running=False)
    assert _resized(out) == {}
    out = decide([node("n1").gpus(8)], [team("nlp", gpu=8)], running=run, now=FAR, resize_running=False,
                 pending=[wl("p").cls(PROD).workers(6).at(FAR - 1)])
    assert out.preempted == {"p": ("e",)} and _resized(out) == {}
    out = decide([node("n1").gpus(8)], [team("nlp", gpu=8)], resize_running=False,
                 pending=[wl("e2").cls(ELASTIC).elastic(2, 8)])
    assert _size(out, "e2") == 8


# -- equal priority takes back an elastic gang's growth (issue 15, part 4) --------------------------------------------

def test_equal_priority_work_of_the_team_takes_back_a_grown_gang_by_shrinking_it():
    # e (elastic, priority 20) grew to 8 while nothing waited; p (pretrain, also priority 20) arrives later and
    # needs 4. Equal priority never stops e, but what e grew into is given back: e shrinks to 4.
    st = make_state([node("n1").gpus(8)], [team("nlp", gpu=8)],
                    running=[running(wl("e").cls(ELASTIC).elastic(2, 8).workers(8), on=("n1",) * 8, since=0)],
                    pending=[wl("p").cls(PRETRAIN).workers(4).at(FAR - 1)])
    res = cycle(st.snapshot(), FAR)
    assert not res.preempted and not res.admitted
    assert [(r.workload.id, r.from_workers, r.to_workers) for r in res.resized] == [("e", 8, 4)]
    assert "shrinks from 8 to 4" in res.resized[0].reason and "p (nlp/pretrain, priority 20)" in res.resized[0].reason
    (wait,) = res.pending
    assert type(wait.reason).__name__ == "WaitingForPreemption" and wait.reason.victims == ("e",)
    st.resize(res.resized[0], FAR)
    res = cycle(st.snapshot(), FAR)
    assert [a.workload.id for a in res.admitted] == ["p"] and not res.resized and not res.preempted
    # A lower class of the team does not: it waits, e keeps its 8.
    out = decide([node("n1").gpus(8)], [team("nlp", gpu=8)],
                 running=[running(wl("e").cls(ELASTIC).elastic(2, 8).workers(8), on=("n1",) * 8, since=0)],
                 pending=[wl("s").cls(SWEEP).workers(4).at(FAR - 1)], now=FAR)
    assert _resized(out) == {} and out.preempted == {} and "s" not in out.admitted


def test_equal_priority_never_stops_a_gang_whole_it_waits_when_the_minimum_is_not_enough():
    # e (3..4) can give 1 GPU; p needs 2. A higher class would stop e whole; equal priority only waits.
    run = [running(wl("e").cls(ELASTIC).elastic(3, 4).workers(4), on=("n1",) * 4, since=0)]
    out = decide([node("n1").gpus(4)], [team("nlp", gpu=4)], running=run,
                 pending=[wl("p").cls(PRETRAIN).workers(2).at(FAR - 1)], now=FAR)
    assert out.preempted == {} and _resized(out) == {} and "p" not in out.admitted
    assert out.reason_type("p") != "WaitingForPreemption"
    # Nor is a fixed gang of its priority stopped to make up the difference (both are in the team's class 20).
    run2 = run + [running(wl("f").cls(PRETRAIN).workers(2), on=("n2",) * 2, since=0)]
    out = decide([node("n1").gpus(4), node("n2").gpus(2)], [team("nlp", gpu=6)], running=run2,
                 pending=[wl("p").cls(PRETRAIN).workers(2).at(FAR - 1)], now=FAR)
    assert out.preempted == {} and _resized(out) == {}
    out = decide([node("n1").gpus(4)], [team("nlp", gpu=4)], running=run,
                 pending=[wl("p").cls(PROD).workers(2).at(FAR - 1)], now=FAR)
    assert out.preempted == {"p": ("e",)}


def test_another_teams_equal_priority_work_takes_growth_only_by_reclaim():
    # cv's e holds 8, within cv's nominal quota: nlp's equal-priority p may not shrink it (in-quota work is
    # protected), though p would be within nlp's own nominal quota.
    run = [running(wl("e").team("cv").cls(ELASTIC).elastic(2, 8).workers(8), on=("n1",) * 8, since=0)]
    p = wl("p").cls(PRETRAIN).workers(4).at(FAR - 1)
    out = decide([node("n1").gpus(8)], [team("nlp", gpu=4), team("cv", gpu=8)], running=run, pending=[p], now=FAR)
    assert _resized(out) == {} and out.preempted == {}
    # cv borrows (nominal 4, holds 8) but p would take nlp past its own nominal quota (2): no reclaim, nothing.
    out = decide([node("n1").gpus(8)], [team("nlp", gpu=2, borrow=4), team("cv", gpu=4, borrow=4)], running=run,
                 pending=[p], now=FAR)
    assert _resized(out) == {} and out.preempted == {}
    # Reclaiming within its nominal quota, nlp shrinks the borrowed part, as for any priority.
    out = decide([node("n1").gpus(8)], [team("nlp", gpu=4), team("cv", gpu=4, borrow=4)], running=run,
                 pending=[p], now=FAR)
    assert _resized(out) == {"e": (8, 4)} and out.preempted == {}


def test_equal_priority_shrink_waits_for_the_minimum_runtime():
    slow = WorkloadClass("slow-elastic", priority=20, preemptible=True, min_runtime_s=600, resizable=True)
    p = wl("p").cls(PRETRAIN).workers(4).at(FAR - 1)
    run = [running(wl("e").cls(slow).elastic(2, 8).workers(8), on=("n1",) * 8, since=FAR - 100)]
    out = decide([node("n1").gpus(8)], [team("nlp", gpu=8)], running=run, pending=[p], now=FAR)
    assert _resized(out) == {} and out.preempted == {}
    run = [running(wl("e").cls(slow).elastic(2, 8).workers(8), on=("n1",) * 8, since=FAR - 600)]
    out = decide([node("n1").gpus(8)], [team("nlp", gpu=8)], running=run, pending=[p], now=FAR)
    assert _resized(out) == {"e": (8, 4)} and out.preempted == {}
