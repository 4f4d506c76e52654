"""Flavors and spot nodes in the pure core (issue 28, items 3 and 4): a gang that names node types in order of
preference is placed on the first with room now; a class's ``spot`` keeps its gangs off spot nodes (``never``) or
puts them there first (``prefer``); submit-time feasibility and scale-up demand follow the same rules."""
from __future__ import annotations

from dataclasses import replace

import pytest

from raylane.scheduling import Capacity, Node, Resources, check_feasible, cycle
from raylane.scheduling.autoscale import ScaleGroup, ScaleSnapshot, compute_demand
from raylane.scheduling.placement import place, tiers
from raylane.scheduling.types import SPOT_LABEL, NoCapacity, Pending

from .builders import PRETRAIN, make_state, summarize, team, wl


def n(nid: str, node_type: str, gpus: float = 8, free=None, spot: bool = False) -> Node:
    cap = Resources(gpus, 64, 512)
    return Node(nid, cap, cap if free is None else replace(cap, gpu=free), frozenset(),
                {SPOT_LABEL: "true"} if spot else {}, node_type)


def gang(gpus: float = 8, workers: int = 1, types=(), spot="allow", strategy="pack"):
    return replace(wl("g").workers(workers).gpus(gpus).strategy(strategy).obj().gang, node_types=tuple(types),
                   spot=spot)


def where(g, nodes):
    got = place(g, Capacity(nodes))
    return None if got is None else sorted(set(got))


# node list, gang, where it goes
CASES = [
    ("first choice with room", [n("a", "a100"), n("h", "h100")], gang(types=["h100", "a100"]), ["h"]),
    ("first choice full: the second", [n("a", "a100"), n("h", "h100", free=0)], gang(types=["h100", "a100"]), ["a"]),
    ("order is the gang's, not the nodes'", [n("h", "h100"), n("a", "a100")], gang(types=["a100", "h100"]), ["a"]),
    ("none of its types has room", [n("a", "a100", free=4), n("l", "l4")], gang(types=["a100"]), None),
    ("no types: any node", [n("l", "l4", free=0), n("a", "a100")], gang(), ["a"]),
    ("a gang never spans two types", [n("a", "a100", 8, free=4), n("h", "h100", 8, free=4)],
     gang(gpus=4, workers=2, types=["a100", "h100"]), None),
    ("spot never: on-demand only", [n("s", "a100", spot=True), n("o", "a100", free=0)], gang(spot="never"), None),
    ("spot never: skips the spot node", [n("s", "a100", spot=True), n("o", "a100")], gang(spot="never"), ["o"]),
    ("spot prefer: spot first", [n("o", "a100"), n("s", "a100", spot=True)], gang(spot="prefer"), ["s"]),
    ("spot prefer: on-demand when no spot room", [n("o", "a100"), n("s", "a100", free=0, spot=True)],
     gang(spot="prefer"), ["o"]),
    ("spot prefer within the first type before the second type's spot",
     [n("as", "a100", spot=True), n("ho", "h100")], gang(types=["h100", "a100"], spot="prefer"), ["ho"]),
    ("spot allow: the strategy decides (pack: fullest first)", [n("o", "a100", free=4), n("s", "a100", spot=True)],
     gang(gpus=4), ["o"]),
]


@pytest.mark.parametrize("nodes,g,expected", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_placement_follows_flavors_and_spot(nodes, g, expected):
    assert where(g, nodes) == expected


def test_tiers_are_types_in_order_each_spot_first_when_preferred():
    got = [(t.node_types, t.spot) for t in tiers(gang(types=["h100", "a100"], spot="prefer"))]
    assert got == [(("h100",), "only"), (("h100",), "never"), (("a100",), "only"), (("a100",), "never")]
    assert tiers(gang()) == (gang(),)


def test_the_cycle_admits_on_the_second_choice_when_the_first_has_no_room():
    w = replace(wl("w").gpus(8).cls(PRETRAIN).obj(), gang=gang(types=["h100", "a100"]))
    st = make_state([n("h", "h100", free=0), n("a", "a100")], [team("nlp", gpu=32)], pending=[w])
    assert summarize(cycle(st.snapshot(), 0.0)).admitted == {"w": ("a",)}


@pytest.mark.parametrize("g,nodes,field,text", [
    (gang(types=["h100"]), [n("a", "a100")], "gang.node_types", "no node of node type h100; the node types there "
                                                                "are: a100"),
    (gang(spot="never"), [n("s", "a100", spot=True)], "class.spot", "every node is a spot node"),
])
def test_submit_refuses_what_no_node_of_the_named_kind_could_hold(g, nodes, field, text):
    w = replace(wl("w").gpus(8).obj(), gang=g)
    why = check_feasible(w, nodes, {"nlp": team("nlp", gpu=32)})
    assert why is not None and why.field == field and text in why.detail


def group(name, node_type, price, spot=False, max_=4):
    return ScaleGroup(name, Resources(8, 64, 512), 0, max_, node_type, frozenset(), {}, price, spot, 180.0)


@pytest.mark.parametrize("g,expected", [
    (gang(), "a100"),  # the cheapest
    (gang(spot="never"), "a100"),
    (gang(spot="prefer"), "h100-spot"),  # spot first, though dearer
    (gang(types=["h100s", "a100"]), "h100-spot"),  # its first node type, though dearer
    (gang(types=["a100", "h100s"], spot="prefer"), "a100"),  # the gang's order before the class's spot preference
    (gang(types=["l4"]), None),  # no group of its node type
])
def test_scale_up_asks_for_the_group_of_its_first_node_type_and_spot_preference(g, expected):
    """Spot and on-demand groups have node types of their own (a growable group's node type is its own): a gang
    that names node types takes their order; among groups it ranks alike, a class that prefers spot takes spot
    groups first, else the cheapest."""
    groups = (group("a100", "a100", 2.0), group("h100-spot", "h100s", 2.5, spot=True))
    w = replace(wl("w").obj(), gang=g)
    d = compute_demand(ScaleSnapshot((Pending(w, NoCapacity(1, g.per_worker, None, Resources(), Resources()), 0),),
                                     groups))
    assert [r.group for r in d.requests] == ([expected] if expected else [])
