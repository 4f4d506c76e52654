"""The queue walk (``raylane.scheduling.queuewalk``): the order in which a cycle, and the forecast's plan, examine
pending workloads. Named cases give team queues, what each team holds and which workloads start as they are
reached (``took``), and the order expected; then the walk's own contract for every registered ordering."""
import random

import pytest

from raylane.scheduling import ORDERINGS, QuotaLedger, Quota, Resources, SchedulerConfig, Team
from raylane.scheduling.queuewalk import QueueWalk
from raylane.scheduling.types import Cohort, UserRule

from .builders import PRETRAIN, PROD, SWEEP, make_state, node, team, wl

C = Cohort("c")
D = Cohort("d")


def _team(name, cohort=None, **kw):
    """A team of 8 nominal GPUs (borrowing without limit), optionally under ``cohort``."""
    return Team(name, {"gpu": Quota(8, None, None)}, cohort=cohort, **kw)


def _walk(ordering, teams, pending, usage=None, requeued=(), held=None, cohorts=True):
    """A walk over ``pending`` (each team queue in its queue order, as drivers keep it) and its ledger."""
    cfg = SchedulerConfig(ordering=ordering)
    order = ORDERINGS.get(ordering)
    teams = {t.name: t for t in teams}
    ledger = QuotaLedger(teams, {t: Resources(gpu=g) for t, g in (usage or {}).items()})
    queues = {}
    for w in sorted((b.obj() for b in pending), key=lambda w: order.queue_key(w, cfg)):
        queues.setdefault(w.team, []).append(w)
    walk = QueueWalk(queues, teams, ledger, order, cfg, requeued=[b.obj() for b in requeued], held=held,
                     cohorts=cohorts)
    return walk, ledger


def _stepped(walk, ledger, took=()):
    """The ids in the order ``next`` gives them; a workload in ``took`` starts as it is reached (the cycle's way)."""
    out = []
    while walk:
        team, w = walk.next()
        out.append(w.id)
        if w.id in took:
            ledger.add(team, w.gang.total)
            walk.took(team)
    assert walk.next() is None
    return out


def _iterated(walk, ledger, took=()):
    """The same, iterating the walk whole (the plan's way)."""
    out = []
    for w in walk:
        out.append(w.id)
        if w.id in took:
            ledger.add(w.team, w.gang.total)
            walk.took(w.team)
    return out


CASES = [
    dict(
        name="fifo: submit time across teams, priority ignored",
        ordering="fifo", teams=[team("x", gpu=4), team("y", gpu=4), team("z", gpu=4)],
        pending=[wl("a").team("x").cls(PROD).at(3), wl("b").team("y").cls(SWEEP).at(1),
                 wl("c").team("z").cls(PRETRAIN).at(2), wl("d").team("x").cls(SWEEP).at(0)],
        order=["d", "b", "c", "a"],
    ),
    dict(
        name="priority: higher class first across teams, FIFO among equals",
        ordering="priority", teams=[team("x", gpu=4), team("y", gpu=4), team("z", gpu=4)],
        pending=[wl("a").team("x").cls(PROD).at(3), wl("b").team("y").cls(SWEEP).at(1),
                 wl("c").team("z").cls(PRETRAIN).at(2), wl("d").team("x").cls(PRETRAIN).at(1.5)],
        order=["a", "d", "c", "b"],
    ),
    dict(
        name="priority: what a team holds changes nothing",
        ordering="priority", teams=[team("x", gpu=4), team("y", gpu=4)], usage={"x": 4},
        pending=[wl("x1").team("x").at(0), wl("y1").team("y").at(1), wl("x2").team("x").at(2)],
        took={"x1", "y1"},
        order=["x1", "y1", "x2"],
    ),
    dict(
        name="fair-share: the team holding less goes first; nothing starts, nothing is re-keyed",
        ordering="fair-share", teams=[team("x", gpu=4), team("y", gpu=4)], usage={"y": 2},
        pending=[wl("y1").team("y").at(0), wl("x1").team("x").gpus(2).at(1), wl("x2").team("x").at(2),
                 wl("y2").team("y").at(3)],
        order=["x1", "x2", "y1", "y2"],
    ),
    dict(
        name="fair-share: a team is re-keyed after its workload starts (equal shares: priority, then submit time)",
        ordering="fair-share", teams=[team("x", gpu=4), team("y", gpu=4)], usage={"y": 2},
        pending=[wl("y1").team("y").at(0), wl("x1").team("x").gpus(2).at(1), wl("x2").team("x").at(2),
                 wl("y2").team("y").at(3)],
        took={"x1", "y1"},
        order=["x1", "y1", "x2", "y2"],
    ),
    dict(
        name="fair-share: usage over weight, quotas aside",
        ordering="fair-share", teams=[team("x", gpu=2, weight=4.0), team("y", gpu=8, weight=1.0)],
        usage={"x": 4, "y": 2},
        pending=[wl("y1").team("y").at(0), wl("x1").team("x").at(5)],
        order=["x1", "y1"],
    ),
    dict(
        name="las: least attained service first, FIFO inside a queue",
        ordering="las", teams=[team("x", gpu=4), team("y", gpu=4)],
        pending=[wl("a").team("x").at(5), wl("b").team("y").attained(5000).at(0), wl("c").team("x").at(6),
                 wl("d").team("y").at(7)],
        took={"a"},
        order=["a", "c", "d", "b"],
    ),
    dict(
        name="requeued: put back at its place by the queue key, with the service it had",
        ordering="las", teams=[team("x", gpu=4)],
        pending=[wl("x1").team("x").at(0), wl("x2").team("x").at(5), wl("x3").team("x").attained(5000).at(1)],
        requeued=[wl("r1").team("x").at(2), wl("r2").team("x").attained(1e6).at(0)],
        order=["x1", "r1", "x2", "x3", "r2"],
    ),
    dict(
        name="users: a fair team's queue by its users' shares, inside its class priority",
        ordering="priority", teams=[team("x", gpu=8, users=UserRule(True)), team("y", gpu=8)],
        held=lambda t: {"u1": 8.0} if t == "x" else {},
        pending=[wl("a").team("x").user("u1").at(0), wl("b").team("x").user("u1").at(1),
                 wl("c").team("x").user("u2").at(2), wl("p").team("x").user("u1").cls(PROD).at(3),
                 wl("y1").team("y").at(1.5)],
        order=["p", "y1", "c", "a", "b"],
    ),
    dict(
        name="cohort tree: a start re-keys every team, since a cohort's share changed",
        ordering="fair-share", teams=[_team("a", C), _team("b", C), _team("e", D)], usage={"e": 2},
        pending=[wl("a1").team("a").gpus(4).at(0), wl("a2").team("a").at(1), wl("b1").team("b").at(2),
                 wl("e1").team("e").at(3)],
        took={"a1"},
        order=["a1", "e1", "b1", "a2"],
    ),
    dict(
        name="cohort tree, cohorts=False: only the team that took is re-keyed (the forecast's plan)",
        ordering="fair-share", teams=[_team("a", C), _team("b", C), _team("e", D)], usage={"e": 2},
        pending=[wl("a1").team("a").gpus(4).at(0), wl("a2").team("a").at(1), wl("b1").team("b").at(2),
                 wl("e1").team("e").at(3)],
        took={"a1"}, cohorts=False,
        order=["a1", "b1", "e1", "a2"],
    ),
    dict(
        name="cohort tree: a team under the root goes before a cohort of equal share",
        ordering="fair-share", teams=[_team("a", C), _team("r")],
        pending=[wl("a1").team("a").at(0), wl("r1").team("r").at(1)],
        order=["r1", "a1"],
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_merged_order(case):
    def walk():
        return _walk(case["ordering"], case["teams"], case["pending"], case.get("usage"), case.get("requeued", ()),
                     case.get("held"), case.get("cohorts", True))

    took = case.get("took", ())
    assert _stepped(*walk(), took) == case["order"]
    assert _iterated(*walk(), took) == case["order"]


def test_the_walk_leaves_the_queues_it_is_given_as_they_were():
    cfg = SchedulerConfig(ordering="fifo")
    q = (wl("x1").team("x").at(0).obj(), wl("x2").team("x").at(5).obj())
    queues = {"x": q}
    walk = QueueWalk(queues, {}, QuotaLedger({}, {}), ORDERINGS.get("fifo"), cfg,
                     requeued=[wl("r").team("x").at(1).obj(), wl("s").team("y").at(2).obj()])
    assert [w.id for w in walk] == ["x1", "r", "s", "x2"]
    assert queues == {"x": q}


def test_stepping_by_hand():
    # next(limit), skip_to, drop and rest: what the cycle's in-quota step past its window uses.
    walk, _ = _walk("fifo", [team("x"), team("y")],
                    [wl(f"x{i}").team("x").at(2 * i) for i in range(5)]
                    + [wl(f"y{i}").team("y").at(2 * i + 1) for i in range(3)])
    assert walk.next() == ("x", walk.queues["x"][0])
    assert walk.head() == "y"
    walk.skip_to(2)  # y0 and y1 passed over: y is keyed by y2 (at 5)
    assert [walk.next()[1].id for _ in range(2)] == ["x1", "x2"]  # (at 2, 4)
    assert walk.head() == "y"
    assert walk.next(limit=3)[1].id == "y2"  # y's queue ends there: y leaves the walk
    assert walk.head() == "x" and walk.next(limit=4)[1].id == "x3"
    assert walk.head() is None and not walk
    assert [w.id for w in walk.rest()] == ["x4"]  # passed-over ones are not in the rest
    walk, _ = _walk("fifo", [team("x"), team("y")], [wl("x0").team("x").at(0), wl("y0").team("y").at(1)])
    walk.drop()
    assert [walk.next()[1].id] == ["y0"] and [w.id for w in walk.rest()] == ["x0"]


def _scene(rng, n=300, users=False):
    teams = [team(f"t{i}", gpu=8, weight=1 + i % 3, decayed=rng.uniform(0, 1e5),
                  users=UserRule(True) if users and i % 2 == 0 else None) for i in range(4)]
    pending = [wl(f"w{k}").team(f"t{rng.randrange(4)}").cls(rng.choice((PROD, PRETRAIN, SWEEP)))
               .gpus(rng.choice((1, 2, 4))).attained(rng.choice((0.0, rng.uniform(0, 1e6))))
               .user(rng.choice(("u1", "u2", None))).at(rng.uniform(0, 1e4)) for k in range(n)]
    requeued = [wl(f"r{k}").team(f"t{rng.randrange(4)}").cls(PRETRAIN).attained(rng.uniform(0, 1e5))
                .at(rng.uniform(0, 1e4)) for k in range(5)]
    usage = {f"t{i}": rng.choice((0, 4, 8, 12)) for i in range(4)}
    took = {f"w{k}" for k in range(n) if rng.random() < 0.2}
    return teams, pending, requeued, usage, took


@pytest.mark.parametrize("ordering", ORDERINGS.names())
@pytest.mark.parametrize("users", [False, True])
def test_every_ordering_walks_whole_as_it_steps(ordering, users):
    # Conformance: iterating (the plan; a merge of the queues where the head key is the queue key) gives the order
    # stepping gives (the cycle), starts and all; every workload once; each team's in its team queue's order.
    rng = random.Random(f"{ordering}/{users}")
    teams, pending, requeued, usage, took = _scene(rng, users=users)
    held = (lambda t: {"u1": 6.0}) if users else None
    walk, ledger = _walk(ordering, teams, pending, usage, requeued, held)
    queues = {t: [w.id for w in q] for t, q in walk.queues.items()}
    stepped = _stepped(walk, ledger, took)
    iterated = _iterated(*_walk(ordering, teams, pending, usage, requeued, held), took)
    assert stepped == iterated
    assert sorted(stepped) == sorted([b.obj().id for b in pending] + [b.obj().id for b in requeued])
    position = {wid: i for i, wid in enumerate(stepped)}
    for ids in queues.values():
        assert [position[i] for i in ids] == sorted(position[i] for i in ids)


@pytest.mark.parametrize("ordering", ORDERINGS.names())
def test_the_cycle_and_the_plan_walk_the_queues_in_one_order(ordering):
    # On a cluster with nothing free every pending workload is examined and none starts: the cycle's positions are
    # the walk's order, and the forecast's plan walks the same (users reordered by their shares included).
    from raylane.forecast.plan import _Plan
    from raylane.scheduling import cycle

    rng = random.Random(ordering)
    teams, pending, _, _, _ = _scene(rng, n=120, users=True)
    st = make_state([node("n1").free(0)], teams, pending=pending, ordering=ordering, admission="none")
    res = cycle(st.snapshot(), 1e4, max_examined=1000)
    assert not res.admitted and len(res.pending) == 120
    examined = [p.workload.id for p in sorted(res.pending, key=lambda p: p.position)]
    planned = _Plan(st, 1e4, st.config.default_runtime_s, {}, {}, 0.25, 300.0)._walk()
    assert [w.id for w in planned] == examined
