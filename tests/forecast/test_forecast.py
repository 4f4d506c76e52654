"""Queue ETA (raylane.forecast): exact small cases, from tables, on the pure core (no Ray).

Each case builds a ``ClusterState`` with the scheduling tests' builders, forecasts it at ``now`` and checks each
workload's start, finish and what it waits for; the forecast must leave the state it was given as it was.
"""
from dataclasses import dataclass, field
from typing import Dict, Optional, Sequence, Tuple

import pytest

from raylane.forecast import CapacityWait, Eta, PreemptionWait, QueueWait, QuotaWait, describe, forecast
from raylane.scheduling import Admit, LeaseState

from tests.scheduling.builders import PRETRAIN, PROD, make_state, node, nodes, obj, running, team, wl

NOW = 100.0


@dataclass
class Case:
    name: str
    nodes: Sequence
    running: Sequence = ()
    pending: Sequence = ()
    teams: Sequence = (team("nlp"),)
    config: Dict = field(default_factory=dict)
    cordoned: Sequence[str] = ()
    kw: Dict = field(default_factory=dict)
    # workload id -> (start, finish); start None: no start forecast
    expect: Dict[str, Tuple[Optional[float], Optional[float]]] = field(default_factory=dict)
    # workload id -> what it waits for, in order
    waits: Dict[str, Tuple] = field(default_factory=dict)


CASES = [
    Case("behind one lease: starts when it ends, finishes an estimate later",
         nodes(1), [running(wl("a").gpus(8).est(3600), on=["n1"])], [wl("b").gpus(8).est(1800).at(10)],
         expect={"b": (3600, 5400)}, waits={"b": (CapacityWait(8, 3600, ("a",)),)}),
    Case("behind two leases on its node: starts when the later one ends",
         nodes(1), [running(wl("a").gpus(4).est(1000), on=["n1"]), running(wl("c").gpus(4).est(2000), on=["n1"])],
         [wl("b").gpus(8).est(500)],
         expect={"b": (2000, 2500)}, waits={"b": (CapacityWait(8, 2000, ("a", "c")),)}),
    Case("quota-bound: room on the cluster, none under the team's quota",
         nodes(2), [running(wl("a").gpus(4).est(1000), on=["n1"])], [wl("b").gpus(4).est(100)],
         teams=(team("nlp", gpu=4, borrow=0),),
         expect={"b": (1000, 1100)}, waits={"b": (QuotaWait("nlp", "gpu", 4, 1000, ("a",)),)}),
    Case("FIFO: the second waits for the first to run",
         nodes(1), [running(wl("a").gpus(8).est(1000), on=["n1"])],
         [wl("b").gpus(8).est(500).at(1), wl("c").gpus(8).est(300).at(2)], config=dict(ordering="fifo"),
         expect={"b": (1000, 1500), "c": (1500, 1800)}),
    Case("priority: the higher class goes first (no preemption)",
         nodes(1), [running(wl("a").gpus(8).est(1000), on=["n1"])],
         [wl("b").gpus(8).est(500).at(1), wl("c").gpus(8).est(300).at(2).cls(PROD)], config=dict(preemption="none"),
         expect={"c": (1000, 1300), "b": (1300, 1800)}),
    Case("expected arrivals: a higher class expected before the lease ends goes first",
         nodes(1), [running(wl("a").gpus(8).est(1000), on=["n1"])], [wl("b").gpus(8).est(500).at(1)],
         config=dict(preemption="none"), kw=dict(arrivals=[obj(wl("x").gpus(8).est(1000).at(500).cls(PROD))]),
         expect={"b": (2000, 2500)}),
    Case("expected arrivals after its start change nothing",
         nodes(1), [running(wl("a").gpus(8).est(1000), on=["n1"])], [wl("b").gpus(8).est(500).at(1)],
         config=dict(preemption="none"), kw=dict(arrivals=[obj(wl("x").gpus(8).est(1000).at(1500).cls(PROD))]),
         expect={"b": (1000, 1500)}),
    Case("no estimate: the lease ends after its class's runtime",
         nodes(1), [running(wl("a").gpus(8), on=["n1"])], [wl("b").gpus(8).est(60)],
         kw=dict(class_runtime_s={PRETRAIN.name: 7200}), expect={"b": (7200, 7260)}),
    Case("no estimate and no class runtime: the default runtime",
         nodes(1), [running(wl("a").gpus(8), on=["n1"])], [wl("b").gpus(8).est(60)],
         kw=dict(default_runtime_s=5000), expect={"b": (5000, 5060)}),
    Case("no estimate and nothing given: the scheduler config's default runtime",
         nodes(1), [running(wl("a").gpus(8), on=["n1"])], [wl("b").gpus(8).est(60)],
         config=dict(default_runtime_s=3000), expect={"b": (3000, 3060)}),
    Case("a pending workload with no estimate has no finish",
         nodes(1), [running(wl("a").gpus(8).est(1000), on=["n1"])], [wl("b").gpus(8)], expect={"b": (1000, None)}),
    Case("a lease past its estimate runs on a while (it has not ended)",
         nodes(1), [running(wl("a").gpus(8).est(50), on=["n1"])], [wl("b").gpus(8).est(10)],
         kw=dict(overrun=0.5, min_overrun_s=20), expect={"b": (NOW + 50, NOW + 60)}),
    Case("free room: starts now",
         nodes(1), [], [wl("b").gpus(8).est(10)], expect={"b": (NOW, NOW + 10)}, waits={"b": ()}),
    Case("preemption: waits for its victim's grace period",
         nodes(1), [running(wl("a").gpus(8).est(10_000), on=["n1"])], [wl("b").gpus(8).est(100).cls(PROD)],
         expect={"b": (NOW + PRETRAIN.grace_period_s, NOW + PRETRAIN.grace_period_s + 100)},
         waits={"b": (PreemptionWait(("a",), NOW + PRETRAIN.grace_period_s, ("a",)),)}),
    Case("a terminating lease is gone at its known deadline (and goes back to its queue)",
         nodes(1), [running(wl("a").gpus(8).est(10_000), on=["n1"], terminating=True)],
         [wl("b").gpus(8).est(5).cls(PROD)], kw=dict(stopping_ends={"a": 500}),
         expect={"b": (500, 505)}, waits={"b": (PreemptionWait(("a",), 500, ("a",)),)}),
    Case("a requeued workload keeps its place and runs what is left of its estimate",
         nodes(1), [running(wl("a").gpus(8).est(10_000), on=["n1"], terminating=True)], [wl("b").gpus(8).est(5).at(1)],
         kw=dict(stopping_ends={"a": 500}), expect={"b": (10_000, 10_005)}),
    Case("a cordoned node stays out of service",
         [node("n1"), node("n2")], [running(wl("a").gpus(8).est(1000), on=["n1"])], [wl("b").gpus(8).est(5)],
         cordoned=["n2"], expect={"b": (1000, 1005)}),
    Case("the same without the cordon: starts now",
         [node("n1"), node("n2")], [running(wl("a").gpus(8).est(1000), on=["n1"])], [wl("b").gpus(8).est(5)],
         expect={"b": (NOW, NOW + 5)}),
    Case("nothing can ever let it in: no start",
         [node("n1"), node("n2")], [running(wl("a").gpus(8).est(1000), on=["n1"])],
         [wl("b").gpus(8).workers(2).est(5)], cordoned=["n2"], expect={"b": (None, None)}),
    Case("beyond the horizon: no start",
         nodes(1), [running(wl("a").gpus(8).est(10 * 86400), on=["n1"])], [wl("b").gpus(8).est(5)],
         kw=dict(horizon_s=86400), expect={"b": (None, None)}),
    Case("EASY: a short job backfills now, a long one waits behind the head's reservation",
         nodes(1), [running(wl("a").gpus(4).est(1000), on=["n1"])],
         [wl("h").gpus(8).est(100).at(1), wl("s").gpus(4).est(500).at(2), wl("l").gpus(4).est(5000).at(3)],
         config=dict(ordering="fifo", backfill="easy", preemption="none", admission="none"),
         expect={"h": (1000, 1100), "s": (NOW, NOW + 500), "l": (1100, 6100)},
         waits={"h": (CapacityWait(8, 1000, ("s", "a")),), "s": ()}),
    Case("no preemption, no quota: work that cannot fit is left out of the cycles, and still starts in order",
         nodes(1), [running(wl("a").gpus(8).est(1000), on=["n1"])], [wl("h").gpus(8).est(100).at(1),
                                                                    wl("s").gpus(0.5).est(100).at(2)],
         config=dict(ordering="fifo", backfill="none", preemption="none", admission="none"),
         expect={"h": (1000, 1100), "s": (1100, 1200)}),
    Case("ends in one window are one step, but each start keeps the end that let it in",
         nodes(2), [running(wl("a").gpus(8).est(1000), on=["n1"]), running(wl("c").gpus(8).est(1010), on=["n2"])],
         [wl("b").gpus(8).est(5).at(1), wl("d").gpus(8).est(5).at(2)], config=dict(ordering="fifo"),
         kw=dict(min_step_s=30), expect={"b": (1000, 1005), "d": (1010, 1015)}),
]


def _r(t: Optional[float]) -> Optional[float]:
    return None if t is None else round(t, 6)


def build(case: Case):
    st = make_state(case.nodes, case.teams, case.running, case.pending, **case.config)
    for nid in case.cordoned:
        st.set_schedulable(nid, False)
    return st


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_forecast(case: Case):
    etas = forecast(build(case), NOW, **case.kw)
    assert set(etas) == {obj(p).id for p in case.pending}
    got = {wid: (_r(e.start), _r(e.finish)) for wid, e in etas.items() if wid in case.expect}
    assert got == case.expect
    for wid, waits in case.waits.items():
        assert etas[wid].waits_for == waits
    for wid, (start, _) in case.expect.items():
        assert (etas[wid].note != "") == (start is None)


def test_the_notes_say_why_there_is_no_start():
    never = next(c for c in CASES if c.name.startswith("nothing can ever"))
    later = next(c for c in CASES if c.name.startswith("beyond the horizon"))
    assert "nothing in the forecast lets it in" in forecast(build(never), NOW)["b"].note
    assert "horizon" in forecast(build(later), NOW, **later.kw)["b"].note


def test_nothing_in_the_state_changes():
    case = next(c for c in CASES if c.name.startswith("preemption"))
    st = build(case)
    st.enqueue(obj(wl("z").gpus(2).est(50).at(5)))
    before = (dict(st.leases), [w.id for w in st.pending()], dict(st.nodes), dict(st.usage), dict(st.teams),
              st.snapshot())
    etas = forecast(st, NOW)
    assert etas["b"].start == NOW + PRETRAIN.grace_period_s  # the forecast preempted a on its copy
    assert st.leases["a"].state is LeaseState.RUNNING
    after = (dict(st.leases), [w.id for w in st.pending()], dict(st.nodes), dict(st.usage), dict(st.teams),
             st.snapshot())
    assert after[:5] == before[:5]
    assert after[5].queues == before[5].queues and after[5].leases == before[5].leases


def test_only_the_workloads_asked_for():
    case = next(c for c in CASES if c.name.startswith("FIFO"))
    etas = forecast(build(case), NOW, only=["c"])
    assert list(etas) == ["c"] and etas["c"].start == 1500


def test_a_state_copy_is_independent():
    case = next(c for c in CASES if c.name.startswith("behind two"))
    st = build(case)
    cp = st.copy()
    cp.finish("a", 1000)
    cp.start(Admit(cp.pending()[0], ("n1",)), 1000)
    assert set(st.leases) == {"a", "c"} and [w.id for w in st.pending()] == ["b"]
    assert st.nodes["n1"].free.gpu == 0 and st.usage["nlp"].gpu == 8
    assert set(cp.leases) == {"b", "c"} and not cp.pending_count()


def clock(t: float, now: float) -> str:
    return f"t={t:.0f}"


@pytest.mark.parametrize("name,text", [
    ("behind one lease", "after a ends, about t=3600; starts about t=3600, ends about t=5400"),
    ("behind two leases", "after a and c end, about t=2000; starts about t=2000, ends about t=2500"),
    ("quota-bound", "4 GPUs of nlp's quota, about t=1000 (when a ends); starts about t=1000, ends about t=1100"),
    ("preemption", "a to stop (preempted for it), about t=130; starts about t=130, ends about t=230"),
    ("free room", "starts now"),
    ("nothing can ever", "room for 16 GPUs, with no end in sight; nothing in the forecast lets it in"),
])
def test_describe(name: str, text: str):
    case = next(c for c in CASES if c.name.startswith(name))
    eta = forecast(build(case), NOW, **case.kw)["b"]
    assert describe(eta, NOW, clock).startswith(text)


def test_describe_chains_the_phases_in_order():
    eta = Eta("w", 5000.0, None, (CapacityWait(8, 3000.0, ("pretrain-x",)), QuotaWait("team-b", "gpu", 2, 5000.0)))
    assert describe(eta, 0.0, clock) == ("after pretrain-x ends, about t=3000; then 2 GPUs of team-b's quota, "
                                         "about t=5000; starts about t=5000")
    behind = Eta("w", 60.0, 90.0, (QueueWait("head-1", 60.0),))
    assert describe(behind, 0.0, clock) == "its turn behind head-1, about t=60; starts about t=60, ends about t=90"


def test_bad_arguments_are_all_named():
    st = build(CASES[0])
    with pytest.raises(ValueError) as e:
        forecast(st, NOW, horizon_s=0, resolution=1.5)
    assert "horizon_s=0" in str(e.value) and "resolution=1.5" in str(e.value)


def test_a_reason_shared_by_many_is_read_once_and_each_gets_its_wait(monkeypatch):
    """A cycle hands one reason object to every workload of a shape it told the same: the forecast reads each once per
    cycle, and every one of those workloads still gets the wait, with its own start."""
    import raylane.forecast.replay as fc  # where forecast() looks up _wait_of and cycle

    st = make_state(nodes(2), (team("nlp", gpu=8, borrow=0),), [running(wl("a").gpus(8).est(1000), on=["n1"])],
                    [wl(f"b{i}").gpus(8).est(500).at(i) for i in range(4)], ordering="fifo")
    reads, cycles, real_wait, real_cycle = [], [], fc._wait_of, fc.cycle

    def wait_of(r):
        reads.append(r)
        return real_wait(r)

    def counted(*a, **kw):
        out = real_cycle(*a, **kw)
        cycles.append(([id(p.reason) for p in out.pending]))
        return out

    monkeypatch.setattr(fc, "_wait_of", wait_of)
    monkeypatch.setattr(fc, "cycle", counted)
    etas = forecast(st, NOW)
    assert [_r(etas[f"b{i}"].start) for i in range(4)] == [1000, 1500, 2000, 2500]
    assert etas["b1"].waits_for == (QuotaWait("nlp", "gpu", 8, 1500, ("a", "b0")),)
    assert etas["b3"].waits_for == (QuotaWait("nlp", "gpu", 8, 2500, ("b1", "b2")),)
    # read once per distinct reason of a cycle, not once per workload told it
    assert len(reads) == sum(len(set(ids)) for ids in cycles) < sum(len(ids) for ids in cycles)


def test_learned_runtimes_give_an_interval_and_a_basis():
    # a runs now with a learned runtime of 1,000 to 3,000 s (median 2,000); b waits for its node.
    from dataclasses import replace

    from raylane.forecast import expected_arrivals, forecast_interval
    from raylane.runtimes import Basis, RuntimeDist

    d = RuntimeDist((Basis("user-name", "alice/x", (1000.0, 1500.0, 2000.0, 2500.0, 3000.0)),))
    a = replace(obj(wl("a").gpus(8)), predicted=d)
    b = replace(obj(wl("b").gpus(8).at(1)), predicted=d)
    st = make_state(nodes(1), (team("nlp"),), [running(a, on=["n1"])], [b])
    e = forecast_interval(st, NOW)["b"]
    # a has run NOW seconds: every run is longer, so it ends at the runs' quantiles.
    assert (e.start_low, e.start, e.start_high) == pytest.approx((1200.0, 2000.0, 2800.0))
    assert e.finish == pytest.approx(4000.0)
    assert e.basis == "5 runs of alice/x: median 33m"
    assert "between" in describe(e, NOW) and "its runtime: 5 runs of alice/x" in describe(e, NOW)
    # Without learned runtimes it is the forecast as it was.
    plain = make_state(nodes(1), (team("nlp"),), [running(wl("a").gpus(8).est(1000), on=["n1"])],
                       [wl("b").gpus(8).est(10).at(1)])
    assert forecast_interval(plain, NOW) == forecast(plain, NOW)
    # The arrivals of the last hour, an hour later.
    future = expected_arrivals([obj(wl("p").at(NOW - 10)), obj(wl("q").at(NOW - 4000))], NOW, 3600)
    assert [(w.id, w.submit_time) for w in future] == [("~expected-p", NOW - 10 + 3600)]
