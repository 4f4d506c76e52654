"""Ties between equally good nodes are broken by node id, never by history (issue 14, item 6).

A replay's figures must depend only on the trace, the cluster and the policy: the same free capacity must give the
same placement whatever the order the nodes were added in, and whatever was taken and given back before.
"""
import itertools

import pytest

from raylane.scheduling import Capacity, Gang, Resources, place

from .builders import node, obj

STRATEGIES = ("pack", "spread", "strict-spread", "balanced", "strict-pack")


def _gang(workers, gpus, strategy):
    return Gang(workers, Resources(gpu=gpus), strategy)


def _nodes():
    # Three equally full nodes and two equally empty ones: every strategy has a tie to break.
    return [obj(node(i).free(f)) for i, f in (("c", 4), ("a", 4), ("e", 8), ("b", 4), ("d", 8))]


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_insertion_order_does_not_change_the_placement(strategy):
    got = {place(_gang(2, 2, strategy), Capacity(order))
           for order in itertools.permutations(_nodes())}
    assert len(got) == 1, f"{strategy}: placements depend on node order: {sorted(got)}"


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_free_history_does_not_change_the_placement(strategy):
    fresh = Capacity(_nodes())
    # Same free capacity in the end, reached by taking and giving back on the nodes in another order.
    churned = Capacity(_nodes())
    for nid in ("a", "b", "c", "e", "d"):
        churned.take(nid, Resources(gpu=1))
    for nid in ("d", "c", "b", "e", "a"):
        churned.give(nid, Resources(gpu=1))
    assert churned.free == fresh.free
    for workers, gpus in ((1, 1), (2, 2), (3, 4)):
        g = _gang(workers, gpus, strategy)
        assert place(g, churned) == place(g, fresh), (strategy, workers, gpus)


def test_ties_go_to_the_lowest_node_id():
    cap = Capacity(_nodes())
    assert place(_gang(1, 1, "pack"), cap) == ("a",)  # best fit: a, b, c all have 4 free
    assert place(_gang(1, 1, "spread"), cap) == ("d",)  # worst fit: d and e have 8 free
