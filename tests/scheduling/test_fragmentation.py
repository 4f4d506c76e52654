"""Stranded GPUs (``raylane.scheduling.fragmentation``) on hand-built states whose answer is known.

Each case is a cluster (nodes with their type, free GPUs and features), the running leases that make the holes,
the pending work and the teams; the expected figure is stranded GPUs per node type.
"""
from __future__ import annotations

from dataclasses import replace

import pytest

from raylane.scheduling import Gang, Resources
from raylane.scheduling.fragmentation import best_fill, fragmentation, stranded_gpus

from .builders import node, obj, running, snapshot_of, team, wl


def typed(builder, node_type: str):
    return replace(obj(builder), node_type=node_type)


def holes(n: int, free: float = 1, node_type: str = "a100", prefix: str = "n", **kw):
    """``n`` 8-GPU nodes with ``free`` GPUs each (something outside the test holds the rest)."""
    out = []
    for i in range(1, n + 1):
        b = node(f"{prefix}{i}").free(free)
        if "features" in kw:
            b.features(*kw["features"])
        if "rack" in kw:
            b.label(rack=kw["rack"][i - 1])
        out.append(typed(b, node_type))
    return out


NLP = team("nlp", gpu=64)
# Team cv holds 4 GPUs of a nominal 4 with no borrowing: it can take nothing more.
CV_FULL = team("cv", gpu=4, borrow=0)
CV_LEASE = running(wl("cv-run").team("cv").gpus(4), on=["busy"])
BUSY = typed(node("busy").gpus(4), "a100")  # holds cv's lease: no free GPU

CASES = [
    # (name, nodes, running, pending, teams, expected stranded per node type)
    ("a 1-GPU hole on 4 nodes, a 2 x 2-GPU gang waits: all 4 stranded",
     holes(4), [], [wl("g").workers(2).gpus(2)], [NLP], {"a100": 4}),
    ("the same holes, a 1-GPU job waits too: it could take any hole",
     holes(4), [], [wl("g").workers(2).gpus(2), wl("one").gpus(1)], [NLP], {"a100": 0}),
    ("the same holes, only a 1-GPU job waits: it fits, nothing blocked",
     holes(4), [], [wl("one").gpus(1)], [NLP], {"a100": 0}),
    ("nothing pending: idle is not fragmentation",
     holes(4), [], [], [NLP], {"a100": 0}),
    ("only CPU work waits: nothing GPU-bound, nothing stranded",
     holes(4), [], [wl("cpu").gpus(0).cpus(200)], [NLP], {"a100": 0}),
    ("the 1-GPU job needs a feature two of the nodes lack",
     holes(2, features=("ib",)) + holes(2, prefix="m"), [],
     [wl("g").workers(2).gpus(2), wl("one").gpus(1).features("ib")], [NLP], {"a100": 2}),
    ("the blocked gang needs a feature no node with holes has: those GPUs were never its, nothing blocked",
     holes(4), [], [wl("g").workers(2).gpus(2).features("h100")], [NLP], {"a100": 0}),
    ("quota-blocked work does not count as able to use the holes",
     holes(4) + [BUSY], [CV_LEASE], [wl("g").workers(2).gpus(2), wl("cv-one").team("cv").gpus(1)],
     [NLP, CV_FULL], {"a100": 4}),
    ("only quota-blocked work waits: it waits for quota, not for the spread",
     holes(4) + [BUSY], [CV_LEASE], [wl("cv-g").team("cv").workers(2).gpus(2)], [NLP, CV_FULL], {"a100": 0}),
    ("per node type: 2-GPU workers leave 1 of 3 free on each a100, the 4-GPU gang cannot use the t4's hole",
     holes(2, free=3) + holes(1, node_type="t4", prefix="t"), [],
     [wl("big").gpus(4), wl("two").gpus(2)], [NLP], {"a100": 2, "t4": 1}),
    ("waiting for capacity, not spread: 7 free, the gang needs 16",
     holes(1, free=7), [], [wl("g").workers(2).gpus(8)], [NLP], {"a100": 0}),
    ("a 1 x 8 gang and two nodes with 7 free each: all 14 stranded",
     holes(2, free=7), [], [wl("g").gpus(8)], [NLP], {"a100": 14}),
    ("the holes made by running leases, not by hand",
     [typed(node("n1"), "a100"), typed(node("n2"), "a100")],
     [running(wl("r1").gpus(7), on=["n1"]), running(wl("r2").gpus(6), on=["n2"])],
     [wl("g").gpus(3)], [NLP], {"a100": 3}),
    ("strict-pack: no one node holds 2 x 2, so 2 + 2 + 3 free are all stranded",
     holes(2, free=2) + holes(1, free=3, prefix="m"), [], [wl("g").workers(2).gpus(2).strategy("strict-pack")],
     [NLP], {"a100": 7}),
    ("pack: the same gang fits across nodes, nothing blocked",
     holes(2, free=2) + holes(1, free=3, prefix="m"), [], [wl("g").workers(2).gpus(2)], [NLP], {"a100": 0}),
    ("strict-spread: 3 workers, 2 nodes with room: blocked, 4 stranded",
     holes(2, free=2), [], [wl("g").workers(3).gpus(1).strategy("strict-spread")], [NLP], {"a100": 4}),
    ("group: two racks of one node each cannot hold 2 x 2: blocked",
     holes(2, free=2, rack=["r1", "r2"]), [], [wl("g").workers(2).gpus(2).group_by("rack")], [NLP], {"a100": 4}),
    ("group: one rack holds it",
     holes(2, free=2, rack=["r1", "r1"]), [], [wl("g").workers(2).gpus(2).group_by("rack")], [NLP], {"a100": 0}),
    ("group gang usable on rack r1, a blocked 1 x 4 gang: r1's GPUs used, r2's lone node stranded",
     holes(2, free=2, rack=["r1", "r1"]) + holes(1, free=3, prefix="m", rack=["r2"]), [],
     [wl("g").workers(2).gpus(2).group_by("rack"), wl("big").gpus(4)], [NLP], {"a100": 3}),
    ("mixed shapes fill a node together: 3 free = one 2-GPU worker + one 1-GPU worker",
     holes(1, free=3) + holes(2, free=1, prefix="m"), [],
     [wl("g").gpus(4), wl("two").gpus(2), wl("one").gpus(1)], [NLP], {"a100": 0}),
    ("the same mix, the 1-GPU worker needing a CPU too",
     holes(1, free=3) + holes(2, free=1, prefix="m"), [],
     [wl("g").gpus(4), wl("two").gpus(2), wl("one").gpus(1).cpus(1)], [NLP], {"a100": 0}),
    ("a GPU whose node has no CPU left for a worker is stranded too",
     [typed(node("n1").cpus(64).gpus(8), "a100")], [running(wl("hog").gpus(4).cpus(63), on=["n1"])],
     [wl("g").gpus(1).cpus(2)], [NLP], {"a100": 4}),
]


@pytest.mark.parametrize("name,nodes_,running_,pending,teams,expected", CASES, ids=[c[0] for c in CASES])
def test_stranded_gpus(name, nodes_, running_, pending, teams, expected):
    snap = snapshot_of(nodes_, teams, running_, pending)
    got = stranded_gpus(snap)
    assert dict(got.stranded) == expected
    assert got.total == sum(expected.values())


def test_cordoned_nodes_are_out_of_service_not_stranded():
    cordoned = replace(typed(node("c1"), "a100"), schedulable=False)  # 8 free, out of service
    snap = snapshot_of([cordoned] + holes(2), [NLP], [], [wl("g").gpus(2)])
    got = stranded_gpus(snap)
    assert dict(got.stranded) == {"a100": 2} and dict(got.free) == {"a100": 2}


def test_quota_admission_none_lets_every_team_use_the_holes():
    snap = snapshot_of(holes(4) + [BUSY], [NLP, CV_FULL], [CV_LEASE],
                       [wl("g").workers(2).gpus(2), wl("cv-one").team("cv").gpus(1)], admission="none")
    assert stranded_gpus(snap).total == 0


def test_describe_names_the_types_with_stranded_gpus():
    # The h100 node's 2 free GPUs take a 2-GPU worker: a type with free GPUs and none stranded.
    snap = snapshot_of(holes(2, free=3) + holes(1, node_type="t4", prefix="t") + holes(1, free=2, node_type="h100",
                                                                                      prefix="h"),
                       [NLP], [], [wl("big").gpus(4), wl("two").gpus(2)])
    got = stranded_gpus(snap)
    assert got.describe() == "3 (a100: 2, t4: 1)"
    assert dict(got.free) == {"a100": 6, "t4": 1, "h100": 2}
    assert dict(got.stranded) == {"a100": 2, "t4": 1, "h100": 0}
    assert got.waiting_shapes == 2 and got.blocked_shapes == 1


def test_untyped_nodes_are_reported_under_a_dash():
    got = fragmentation([obj(node("n1").free(1))], [Gang(1, Resources(gpu=2))])
    assert dict(got.stranded) == {"-": 0.0}  # 1 free < 2 needed: capacity, not spread
    got = fragmentation([obj(node("n1").free(1)), obj(node("n2").free(1))], [Gang(1, Resources(gpu=2))])
    assert dict(got.stranded) == {"-": 2.0}


FILLS = [
    # (free GPUs, worker GPU sizes, best fill)
    (3, [2, 1], 3),
    (3, [2], 2),
    (5, [3, 2], 5),
    (7, [4, 3], 7),
    (7, [6, 4], 6),
    (1, [2], 0),
    (8, [0.5], 8),
]


@pytest.mark.parametrize("free,sizes,expected", FILLS)
def test_best_fill(free, sizes, expected):
    assert best_fill(Resources(gpu=free), [Resources(gpu=s) for s in sizes]) == pytest.approx(expected)


def test_best_fill_is_bounded_and_keeps_what_it_found(monkeypatch):
    from raylane.scheduling import fragmentation as frag

    shapes = [Resources(gpu=g) for g in (13, 11, 9, 7, 5, 3)]
    assert best_fill(Resources(gpu=64), shapes) == 64  # 4 x 13 + 9 + 3
    # With a budget of one step the search keeps the largest-first fill it reached: 4 x 13.
    monkeypatch.setattr(frag, "FILL_STEPS", 1)
    assert best_fill(Resources(gpu=64), shapes) == 52


def test_large_cluster_and_queue():
    """1,000 nodes with a 1-GPU hole each, 10,000 pending 2 x 2-GPU gangs of 10 teams: every hole is stranded; one
    waiting 1-GPU job (of a team with room) makes them all usable."""
    nodes_ = [typed(node(f"n{i:04d}").free(1), "a100" if i % 2 else "t4") for i in range(1000)]
    teams = [team(f"t{k}", gpu=1000) for k in range(10)]
    pending = [wl(f"w{i:05d}").team(f"t{i % 10}").workers(2).gpus(2) for i in range(10_000)]
    snap = snapshot_of(nodes_, teams, [], pending)
    got = stranded_gpus(snap)
    assert dict(got.stranded) == {"a100": 500, "t4": 500}
    assert got.waiting_shapes == 1
    snap = snapshot_of(nodes_, teams, [], pending + [wl("one").team("t3").gpus(1)])
    assert stranded_gpus(snap).total == 0


def test_the_one_gpu_shortcut_agrees_with_the_full_search(monkeypatch):
    """On random states, the shortcut for a waiting single 1-GPU worker gives what the full search gives."""
    import random

    from raylane.scheduling import fragmentation as frag

    rng = random.Random(11)
    for _ in range(200):
        nodes_ = [typed(node(f"n{i}").free(rng.randint(0, 8)).features(*rng.choice([(), ("ib",)])),
                        rng.choice(["a100", "t4"])) for i in range(rng.randint(1, 6))]
        gangs = [Gang(rng.choice([1, 1, 2, 3]), Resources(gpu=rng.choice([1, 1, 2, 4, 8])),
                      rng.choice(["pack", "spread", "strict-pack", "strict-spread"]),
                      frozenset(rng.choice([(), ("ib",)])))
                 for _ in range(rng.randint(1, 4))]
        fast = fragmentation(nodes_, gangs)
        monkeypatch.setattr(frag, "takes_any_gpu", lambda g: False)
        full = fragmentation(nodes_, gangs)
        monkeypatch.undo()
        assert dict(fast.stranded) == dict(full.stranded), (nodes_, gangs)
