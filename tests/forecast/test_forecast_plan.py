"""Queue ETA by reservation plan (raylane.forecast.plan, ``forecast(method="plan")``): exact small cases, from
tables, on the pure core (no Ray).

Each case builds a ``ClusterState`` with the scheduling tests' builders, plans it at ``now`` and checks each
workload's start, finish and what it waits for. Each workload gets the earliest start at which its gang fits on
nodes in service (a share of a GPU on one device) and its team's quota holds it for its whole runtime, given the
leases' expected ends and the reservations made before it: under EASY backfill (up to ``EASY_MAX_PENDING``
pending) only the head's reservation binds later work, otherwise (conservative backfill) every earlier one does.
It plans no preemption.
"""
import bisect

import pytest

from raylane.forecast import CapacityWait, QuotaWait, describe, forecast
from raylane.forecast.plan import plan
from raylane.scheduling import LeaseState

from tests.scheduling.builders import PRETRAIN, PROD, node, nodes, obj, running, team, wl
from tests.forecast.test_forecast import CASES as REPLAY_CASES
from tests.forecast.test_forecast import Case, _r, build

NOW = 100.0
FIFO = dict(ordering="fifo", backfill="easy", preemption="none", admission="none")


CASES = [
    Case("backfill: later work uses the holes before the head's reservation, and only those it fits in",
         nodes(1), [running(wl("a").gpus(4).est(1000), on=["n1"])],
         [wl("h").gpus(8).est(100).at(1), wl("s").gpus(4).est(500).at(2), wl("l").gpus(4).est(5000).at(3),
          wl("x").gpus(4).est(300).at(4)], config=FIFO,
         # h holds the node from 1000; s fits before it now; l is too long for any hole; x fits after s, before h
         expect={"h": (1000, 1100), "s": (NOW, 600), "l": (1100, 6100), "x": (600, 900)},
         waits={"h": (CapacityWait(8, 1000, ("a",)),), "s": (), "x": (CapacityWait(4, 600, ("s",)),)}),
    Case("a gang needs whole nodes: 16 GPUs free now in all, but one node of 8",
         nodes(3), [running(wl("a").gpus(4).est(1000), on=["n1"]), running(wl("b").gpus(4).est(2000), on=["n2"])],
         [wl("g").gpus(8).workers(2).est(100)], config=FIFO,
         expect={"g": (1000, 1100)}, waits={"g": (CapacityWait(16, 1000, ("a",)),)}),
    Case("a gang of shares packs onto one node",
         [node("n1").free(1)], [], [wl("g").gpus(0.5).workers(2).est(100)], config=FIFO,
         expect={"g": (NOW, NOW + 100)}),
    Case("strict-spread: one worker a node",
         nodes(2), [running(wl("a").gpus(4).est(1000), on=["n1"])],
         [wl("g").gpus(1).workers(2).strategy("strict-spread").est(10)], config=FIFO,
         expect={"g": (NOW, NOW + 10)}),
    Case("quota-bound: room on the cluster, none under the team's quota until its lease ends",
         nodes(2), [running(wl("a").gpus(4).est(1000), on=["n1"])], [wl("b").gpus(4).est(100)],
         teams=(team("nlp", gpu=4, borrow=0),),
         expect={"b": (1000, 1100)}, waits={"b": (QuotaWait("nlp", "gpu", 4, 1000, ("a",)),)}),
    Case("borrowing another team's unused quota, within the limit, starts now",
         nodes(2), [running(wl("a").gpus(4).est(1000), on=["n1"])], [wl("b").gpus(4).est(100)],
         teams=(team("nlp", gpu=4, borrow=4), team("cv", gpu=4)), expect={"b": (NOW, NOW + 100)}),
    Case("the lending pool: a team borrows only what the others leave unused",
         nodes(2), [running(wl("c").team("cv").gpus(4).est(1000), on=["n1"])], [wl("b").gpus(8).est(100)],
         teams=(team("nlp", gpu=4), team("cv", gpu=4)),
         expect={"b": (1000, 1100)}, waits={"b": (QuotaWait("nlp", "gpu", 4, 1000, ("c",)),)}),
    Case("quota and room: waits for room, then for its quota",
         nodes(2), [running(wl("a").gpus(8).est(1000), on=["n1"]), running(wl("c").gpus(4).est(3000), on=["n2"])],
         [wl("b").gpus(8).est(100)], teams=(team("nlp", gpu=8, borrow=0),),
         expect={"b": (3000, 3100)},
         waits={"b": (CapacityWait(8, 1000, ("a",)), QuotaWait("nlp", "gpu", 4, 3000, ("c",)))}),
    Case("a terminating lease is gone at its known deadline; work of a higher class goes first",
         nodes(1), [running(wl("a").gpus(8).est(10_000), on=["n1"], terminating=True)],
         [wl("b").gpus(8).est(5).cls(PROD)], kw=dict(stopping_ends={"a": 500}),
         expect={"b": (500, 505)}, waits={"b": (CapacityWait(8, 500, ("a",)),)}),
    Case("a requeued workload keeps its place and runs what is left of its estimate",
         nodes(1), [running(wl("a").gpus(8).est(10_000), on=["n1"], terminating=True)], [wl("b").gpus(8).est(5).at(1)],
         kw=dict(stopping_ends={"a": 500}), expect={"b": (10_000, 10_005)}),
    Case("a terminating lease with no deadline known is gone a grace period from now",
         nodes(1), [running(wl("a").gpus(8).est(10_000), on=["n1"], terminating=True)],
         [wl("b").gpus(8).est(5).cls(PROD)],
         expect={"b": (NOW + PRETRAIN.grace_period_s, NOW + PRETRAIN.grace_period_s + 5)}),
    Case("no preemption planned: a higher class waits for the lease to end",
         nodes(1), [running(wl("a").gpus(8).est(10_000), on=["n1"])], [wl("b").gpus(8).est(100).cls(PROD)],
         expect={"b": (10_000, 10_100)}),
    Case("a cordoned node stays out of service",
         [node("n1"), node("n2")], [running(wl("a").gpus(8).est(1000), on=["n1"])], [wl("b").gpus(8).est(5)],
         cordoned=["n2"], expect={"b": (1000, 1005)}),
    Case("the same without the cordon: starts now",
         [node("n1"), node("n2")], [running(wl("a").gpus(8).est(1000), on=["n1"])], [wl("b").gpus(8).est(5)],
         expect={"b": (NOW, NOW + 5)}, waits={"b": ()}),
    Case("never fits the nodes in service: no start",
         [node("n1"), node("n2")], [running(wl("a").gpus(8).est(1000), on=["n1"])],
         [wl("b").gpus(8).workers(2).est(5), wl("c").gpus(8).est(5).at(1)], cordoned=["n2"],
         expect={"b": (None, None), "c": (1000, 1005)}, waits={"b": (CapacityWait(16, float("inf")),)}),
    Case("a quota that can never hold it: no start",
         nodes(2), [], [wl("b").gpus(8).est(5)], teams=(team("nlp", gpu=4, borrow=2),),
         expect={"b": (None, None)}, waits={"b": (QuotaWait("nlp", "gpu", 4, float("inf")),)}),
    Case("beyond the horizon: no start",
         nodes(1), [running(wl("a").gpus(8).est(10 * 86400), on=["n1"])], [wl("b").gpus(8).est(5)],
         kw=dict(horizon_s=86400), expect={"b": (None, None)}),
    Case("no estimate: the lease ends after its class's runtime; the pending one has no finish",
         nodes(1), [running(wl("a").gpus(8), on=["n1"])], [wl("b").gpus(8)],
         kw=dict(class_runtime_s={PRETRAIN.name: 7200}), expect={"b": (7200, None)}),
    Case("a lease past its estimate runs on a while",
         nodes(1), [running(wl("a").gpus(8).est(50), on=["n1"])], [wl("b").gpus(8).est(10)],
         kw=dict(overrun=0.5, min_overrun_s=20), expect={"b": (NOW + 50, NOW + 60)}),
    Case("EASY: only the head holds its room; a later gang that fits now runs, one that needs room freed later waits",
         nodes(1), [running(wl("a").gpus(4).est(1000), on=["n1"]), running(wl("b").gpus(2).est(500), on=["n1"])],
         [wl("h").gpus(8).est(100).at(1), wl("m").gpus(4).est(300).at(2), wl("s").gpus(2).est(900).at(3)],
         config=FIFO,
         # h is the head: the node from 1000. s fits now and ends by then; the 2 GPUs b frees at 500 do not make
         # room for m while s runs, and nothing holds them for m: m starts after h
         expect={"h": (1000, 1100), "s": (NOW, 1000), "m": (1100, 1400)}),
    Case("a share of a GPU fits on one device: two quarters free on two devices hold no half",
         [node("n1").gpus(2)],
         [running(wl("x").gpus(0.75).est(1000), on=["n1"]), running(wl("y").gpus(0.75).est(2000), on=["n1"])],
         [wl("p").gpus(0.5).est(10)], config=FIFO, expect={"p": (1000, 1010)}),
    Case("node features: only the nodes that have them",
         [node("n1").features("a100"), node("n2")], [running(wl("a").gpus(8).est(1000), on=["n1"])],
         [wl("b").gpus(8).features("a100").est(5)], config=FIFO, expect={"b": (1000, 1005)}),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_plan(case: Case):
    etas = forecast(build(case), NOW, method="plan", **case.kw)
    assert set(etas) == {obj(p).id for p in case.pending}
    got = {wid: (_r(e.start), _r(e.finish)) for wid, e in etas.items() if wid in case.expect}
    assert got == case.expect
    for wid, waits in case.waits.items():
        assert etas[wid].waits_for == waits
    for wid, (start, _) in case.expect.items():
        assert (etas[wid].note != "") == (start is None)


# The replay's cases where the two methods must agree: no preemption decides them, and no two ends fall in one of
# the replay's steps.
SAME = ["behind one lease", "behind two leases", "quota-bound", "FIFO", "priority", "no estimate", "a pending",
        "a lease past", "free room", "a requeued", "a cordoned", "the same without", "nothing can ever",
        "beyond the horizon", "EASY", "no preemption, no quota"]


@pytest.mark.parametrize("case", [c for c in REPLAY_CASES if any(c.name.startswith(s) for s in SAME)],
                         ids=lambda c: c.name)
def test_the_plan_agrees_with_the_replay_where_no_preemption_decides(case):
    kw = {k: v for k, v in case.kw.items() if k not in ("resolution", "min_step_s")}
    replayed = forecast(build(case), NOW, **kw)
    planned = forecast(build(case), NOW, method="plan", **kw)
    assert {k: (e.start, e.finish) for k, e in planned.items()} == {k: (e.start, e.finish) for k, e in replayed.items()}


def test_past_the_easy_limit_the_plan_is_conservative(monkeypatch):
    # The EASY case again, planned conservatively: m holds the room b frees at 500, and s, which would run into it,
    # goes after the head.
    import raylane.forecast.plan as forecast_plan

    monkeypatch.setattr(forecast_plan, "EASY_MAX_PENDING", 2)
    case = next(c for c in CASES if c.name.startswith("EASY:"))
    etas = forecast(build(case), NOW, method="plan")
    assert {k: (e.start, e.finish) for k, e in etas.items()} == {"h": (1000, 1100), "m": (500, 800),
                                                                "s": (1100, 2000)}


def test_the_notes_say_why_there_is_no_start():
    def note(name):
        case = next(c for c in CASES if c.name.startswith(name))
        return forecast(build(case), NOW, method="plan", **case.kw)["b"].note

    assert "does not fit the nodes in service" in note("never fits")
    assert "team nlp's quota can never hold it" in note("a quota that can never")
    assert "horizon" in note("beyond the horizon")


def test_nothing_in_the_state_changes():
    case = next(c for c in CASES if c.name.startswith("a terminating lease is gone"))
    st = build(case)
    st.enqueue(obj(wl("z").gpus(2).est(50).at(5)))
    before = (dict(st.leases), [w.id for w in st.pending()], dict(st.nodes), dict(st.usage), dict(st.teams),
              st.snapshot())
    etas = plan(st, NOW, stopping_ends={"a": 500})
    assert etas["b"].start == 500  # the plan requeued a at its deadline
    assert st.leases["a"].state is LeaseState.TERMINATING
    after = (dict(st.leases), [w.id for w in st.pending()], dict(st.nodes), dict(st.usage), dict(st.teams),
             st.snapshot())
    assert after[:5] == before[:5]
    assert after[5].queues == before[5].queues and after[5].leases == before[5].leases


def test_only_the_workloads_asked_for():
    case = CASES[0]
    etas = plan(build(case), NOW, only=["x"])
    assert list(etas) == ["x"] and etas["x"].start == 600  # h, s and l before it were planned all the same


def clock(t: float, now: float) -> str:
    return f"t={t:.0f}"


@pytest.mark.parametrize("name,wid,text", [
    ("backfill", "h", "after a ends, about t=1000; starts about t=1000, ends about t=1100"),
    ("backfill", "s", "starts now"),
    ("quota and room", "b", "after a ends, about t=1000; then 4 GPUs of nlp's quota, about t=3000 (when c ends); "
                            "starts about t=3000, ends about t=3100"),
    ("never fits", "b", "room for 16 GPUs, with no end in sight; nothing in the plan lets it in"),
])
def test_describe_reads_the_plan(name: str, wid: str, text: str):
    case = next(c for c in CASES if c.name.startswith(name))
    eta = forecast(build(case), NOW, method="plan", **case.kw)[wid]
    assert describe(eta, NOW, clock).startswith(text)


def test_bad_arguments_are_all_named():
    st = build(CASES[0])
    with pytest.raises(ValueError) as e:
        forecast(st, NOW, method="guess", horizon_s=0)
    assert "method='guess'" in str(e.value) and "'replay', 'plan'" in str(e.value) and "horizon_s=0" in str(e.value)
    with pytest.raises(ValueError) as e:
        plan(st, float("nan"), horizon_s=-1, overrun=-0.5, default_runtime_s=-3)
    msg = str(e.value)
    assert all(s in msg for s in ("now=nan", "horizon_s=-1", "overrun=-0.5", "default_runtime_s=-3", "allowed"))


# A mixed queue on a few nodes: gangs of whole GPUs of every size, and (with shares) quarter and half GPUs, so that
# reservations cross every level in single and several segments.
MIXED = [wl(f"m{i}").gpus(g).workers(k).est(300 + 700 * (i % 7)).at(i)
         for i, (g, k) in enumerate([(1, 1), (2, 1), (8, 2), (4, 1), (1, 3), (8, 1), (2, 2), (4, 2), (1, 1)] * 4)]
SHARED = MIXED + [wl(f"q{i}").gpus(0.25 * (1 + i % 2)).est(500 + 300 * i).at(100 + i) for i in range(8)]


@pytest.mark.parametrize("pending", [MIXED, SHARED], ids=["whole GPUs", "with shares"])
@pytest.mark.parametrize("easy_max", [0, 1000], ids=["conservative", "EASY"])
def test_the_holes_kept_as_reservations_are_made_are_those_of_the_profiles(pending, easy_max, monkeypatch):
    # The plan cuts holes as it books (``_cut``) instead of working them out again: after a whole plan, every unit's
    # holes at every level, and the length classes, must be what its profile gives from scratch.
    import raylane.forecast.plan as fp

    monkeypatch.setattr(fp, "EASY_MAX_PENDING", easy_max)
    st = build(Case("mixed", nodes(4), [running(wl("a").gpus(4).est(1000), on=["n1"]),
                                        running(wl("b").gpus(2).est(2500), on=["n2"])], pending, config=FIFO))
    p = fp._Plan(st, NOW, st.config.default_runtime_s, {}, {}, 0.25, 300.0)
    p.run(None, fp.DEFAULT_HORIZON_S)
    assert len(p.node_holes) >= 4
    for level, per_unit in p.node_holes.items():
        units = p._units(level)
        for u, holes in per_unit.items():
            assert holes == _holes_of(units[u], level), (level, u)
        kept = [(c, h) for c, hs in enumerate(p.holes[level]) for h in hs]
        assert all(c == bisect.bisect_right(fp._CLASSES, en - start) - 1 for c, (start, en, _) in kept)
        assert sorted(h for _, h in kept) == sorted((a, b, u) for u, hs in per_unit.items() for a, b in hs)


def _holes_of(p, level):
    """The maximal intervals in which profile ``p`` has ``level`` free, segment by segment (what ``_find_holes``
    gives, worked out the plain way)."""
    out, start = [], None
    for t, v in zip(p.times, p.vals):
        if v >= level - 1e-9:
            start = t if start is None else start
        elif start is not None:
            out.append((start, t))
            start = None
    return out + [(start, float("inf"))] if start is not None else out


