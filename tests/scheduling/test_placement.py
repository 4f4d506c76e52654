"""Placement strategies: which nodes a gang's workers go to, all or nothing, honouring required features."""
import pytest

from raylane.scheduling import PLACEMENTS, Capacity, Gang, Resources

from .builders import decide, node, nodes, obj, running, team, wl


def cap_of(*builders):
    return Capacity([obj(b) for b in builders])


def gang(workers, gpus, strategy, features=(), group_by="rack"):
    return Gang(workers, Resources(gpu=gpus), strategy, frozenset(features), group_by)


# n1 has 2 free, n2 8, n3 4.
UNEVEN = (node("n1").free(2), node("n2"), node("n3").free(4))

CASES = [
    # (name, strategy, workers, gpus per worker, nodes, expected placement or None)
    ("pack: best-fit single node", "pack", 1, 3, UNEVEN, ("n3",)),
    ("pack: whole gang on one node when one holds it", "pack", 2, 4, UNEVEN, ("n2", "n2")),
    ("pack: else fewest nodes, emptiest first", "pack", 3, 4, UNEVEN, ("n2", "n2", "n3")),
    ("pack: does not fit at all", "pack", 4, 4, UNEVEN, None),
    ("strict-pack: one node", "strict-pack", 2, 4, UNEVEN, ("n2", "n2")),
    ("strict-pack: never split", "strict-pack", 3, 4, UNEVEN, None),
    ("spread: one per node, emptiest first", "spread", 3, 1, UNEVEN, ("n2", "n3", "n1")),
    ("spread: soft, doubles up when nodes run out", "spread", 4, 2, UNEVEN, ("n2", "n2", "n3", "n1")),
    ("spread: still spans every node with room", "spread", 5, 1, (node("a").free(1), node("b").free(4)),
     ("b", "b", "b", "b", "a")),
    ("strict-spread: distinct nodes", "strict-spread", 3, 2, UNEVEN, ("n2", "n3", "n1")),
    ("strict-spread: never doubles up", "strict-spread", 4, 1, UNEVEN, None),
    ("balanced: to the node with most free each time", "balanced", 3, 2, UNEVEN, ("n2", "n2", "n2")),
    ("balanced: ties go to the first node id", "balanced", 3, 1, (node("b").free(2), node("a").free(2)),
     ("a", "b", "a")),
    ("balanced: single worker to the emptiest", "balanced", 1, 1, UNEVEN, ("n2",)),
]


@pytest.mark.parametrize("name,strategy,workers,gpus,nodes_,expected", CASES, ids=[c[0] for c in CASES])
def test_strategy(name, strategy, workers, gpus, nodes_, expected):
    cap = cap_of(*nodes_)
    before = dict(cap.free)
    got = PLACEMENTS.get(strategy).place(gang(workers, gpus, strategy), cap)
    assert got == expected
    assert cap.free == before, "a placement policy must not change the capacity"


def test_balanced_leaves_free_gpus_even():
    cap = cap_of(node("a"), node("b").free(6), node("c").free(3))
    got = PLACEMENTS.get("balanced").place(gang(5, 1, "balanced"), cap)
    left = {nid: cap.free[nid].gpu - got.count(nid) for nid in ("a", "b", "c")}
    assert left["a"] - left["b"] <= 1 and left["c"] == 3  # a and b brought level with each other, c untouched


RACKS = (
    node("n1").label(rack="r1"), node("n2").label(rack="r1"),
    node("n3").label(rack="r2"), node("n4").label(rack="r2").free(2),
    node("n5"),  # no rack label: never used by the group strategy
)


@pytest.mark.parametrize("workers,gpus,expected", [
    (2, 6, ("n1", "n2")),        # only r1 has two nodes with 6 free
    (1, 8, ("n3",)),             # both racks fit; r2 is fuller (less spare), so r2
    (3, 8, None),                # no rack has 24 free; the unlabelled n5 does not count
    (5, 2, ("n3", "n3", "n3", "n3", "n4")),  # r2 has exactly 5 slots of 2: the fullest group that fits
])
def test_group_by_label(workers, gpus, expected):
    got = PLACEMENTS.get("group").place(gang(workers, gpus, "group"), cap_of(*RACKS))
    assert got == expected
    if got:
        racks = {obj(n).labels.get("rack") for n in RACKS if obj(n).id in got}
        assert len(racks) == 1 and None not in racks


def test_group_by_other_label():
    ns = (node("a").label(nvlink="d1"), node("b").label(nvlink="d2"), node("c").label(nvlink="d2"))
    got = PLACEMENTS.get("group").place(gang(2, 8, "group", group_by="nvlink"), cap_of(*ns))
    assert got == ("b", "c")


def test_data_locality_prefers_nodes_with_the_data():
    ns = (node("n1"), node("n2").datasets("c4"), node("n3").datasets("c4").free(2))
    pol = PLACEMENTS.get("data-locality")
    assert pol.place(gang(1, 2, "data-locality"), cap_of(*ns), "c4") == ("n3",)   # best fit among local
    assert pol.place(gang(1, 4, "data-locality"), cap_of(*ns), "c4") == ("n2",)
    assert pol.place(gang(2, 5, "data-locality"), cap_of(*ns), "c4") == ("n1", "n2")  # local cannot: pack anywhere
    assert pol.place(gang(1, 4, "data-locality"), cap_of(*ns), None) == ("n1",)  # no data named: plain pack


def test_data_locality_spans_local_nodes_before_going_remote():
    ns = (node("n1"), node("n2").datasets("c4").free(4), node("n3").datasets("c4").free(4))
    got = PLACEMENTS.get("data-locality").place(gang(2, 4, "data-locality"), cap_of(*ns), "c4")
    assert sorted(got) == ["n2", "n3"]


@pytest.mark.parametrize("strategy", PLACEMENTS.names())
def test_required_features_are_honoured_by_every_strategy(strategy):
    ns = (node("plain1").label(rack="r1").datasets("c4"), node("plain2").label(rack="r1"),
          node("h1").features("h100", "ib").label(rack="r2").free(4),
          node("h2").features("h100", "ib").label(rack="r2").free(4))
    cap = cap_of(*ns)
    g = gang(2, 4, strategy, features=("h100",))
    got = PLACEMENTS.get(strategy).place(g, cap, "c4")
    if strategy == "strict-pack":
        assert got is None  # no single h100 node has 8 free
    else:
        assert got is not None and set(got) <= {"h1", "h2"}
    assert PLACEMENTS.get(strategy).place(gang(1, 1, strategy, features=("tpu",)), cap, "c4") is None


@pytest.mark.parametrize("strategy", PLACEMENTS.names())
def test_no_partial_gangs(strategy):
    """Two gangs that each need the whole cluster: exactly one runs, whole; the other holds nothing."""
    ns = [n.label(rack="r1") for n in nodes(2)]
    pend = [wl("g1").gpus(8).workers(2).strategy(strategy).at(0),
            wl("g2").gpus(8).workers(2).strategy(strategy).at(1)]
    if strategy == "strict-pack":
        pend = [wl("g1").gpus(4).workers(2).strategy(strategy).at(0),
                wl("g2").gpus(4).workers(4).strategy(strategy).at(1)]
    out = decide(ns, [team("nlp")], [], pend, backfill="greedy", preemption="none")
    assert set(out.admitted) == {"g1"}
    assert len(out.admitted["g1"]) == obj(pend[0]).gang.workers
    assert "g2" in out.pending and out.reason_type("g2") == "NoCapacity"


def test_cycle_places_every_worker_and_never_overcommits():
    ns = nodes(3)
    pend = [wl(f"w{i}").gpus(3).workers(2).strategy(s).at(i)
            for i, s in enumerate(["pack", "spread", "balanced", "strict-spread", "pack"])]
    out = decide(ns, [team("nlp")], [running(wl("r").gpus(2), on=["n1"])], pend, backfill="greedy",
                 preemption="none")
    used = {"n1": 2}
    for wid, pl in out.admitted.items():
        assert len(pl) == 2
        for nid in pl:
            used[nid] = used.get(nid, 0) + 3
    assert all(v <= 8 for v in used.values())
    assert len(out.admitted) == 3  # 22 free GPUs, 6 per gang, and 3-GPU slots: 2+2+2 per node at most


@pytest.mark.parametrize("prefer,features,expected", [
    (("n1",), (), ("n1", "n1")),            # the planned node, though pack's best fit would be n3
    (("n9", "n3"), (), ("n3", "n3")),        # an unknown node is skipped; the next preference is taken
    (("n1",), ("ssd",), ("n2", "n2")),       # a preferred node lacking a required feature is never used
    (("n3",), (), ("n3", "n3")),
])
def test_a_preferred_node_is_taken_first_when_it_holds_the_whole_gang(prefer, features, expected):
    from dataclasses import replace

    from raylane.scheduling.placement import place

    cap = cap_of(node("n1").free(2), node("n2").features("ssd"), node("n3").free(4))
    g = replace(gang(2, 1, "pack", features), prefer=prefer)
    assert place(g, cap) == expected


def test_a_preferred_node_without_room_falls_back_to_the_strategy():
    from dataclasses import replace

    from raylane.scheduling.placement import place

    cap = cap_of(node("n1").free(1), node("n2"), node("n3").free(4))
    assert place(replace(gang(2, 1, "pack"), prefer=("n1",)), cap) == place(gang(2, 1, "pack"), cap) == ("n3", "n3")
