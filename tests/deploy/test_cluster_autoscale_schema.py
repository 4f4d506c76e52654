"""Cluster files with growable node groups (raylane.config.cluster): min, max, count, price, spot, startup. A group
without min and max stays fixed at count, as before; every bad value is reported with its field path, the value and
what is allowed, all errors of a file at once. Pure: no Ray."""
from __future__ import annotations

from pathlib import Path

import pytest

from raylane.config.cluster import EMBEDDED, ClusterFile, load_cluster
from raylane.config.loader import validate_document
from raylane.errors import ValidationError
from raylane.scheduling.autoscale import ScaleGroup
from raylane.scheduling.types import Resources

REPO = Path(__file__).resolve().parents[2]


def load(*groups: dict) -> ClusterFile:
    return validate_document(ClusterFile, {"name": "t", "nodes": list(groups)}, "cluster.yaml")


def errors(*groups: dict):
    with pytest.raises(ValidationError) as info:
        load(*groups)
    return info.value.errors


A100 = {"name": "a100", "gpus": 8, "cpus": 96, "node_type": "a100-8x"}


@pytest.mark.parametrize("path", ["deploy/local/cluster.yaml", "deploy/local/three-node.yaml"])
def test_existing_cluster_files_load_as_fixed_groups(path):
    c = load_cluster(REPO / path)
    for g in c.nodes:
        assert (g.growable, g.lo, g.hi, g.min, g.max) == (False, g.count, g.count, None, None)
        assert (g.price, g.spot, g.startup) == (None, False, None)
        assert g.scale_group().max == g.count
    assert load_cluster(None) == validate_document(ClusterFile, EMBEDDED, "embedded")


GOOD = [
    ("fixed, as before", {"count": 3}, dict(count=3, lo=3, hi=3, growable=False)),
    ("max only: from 0, starting with none", {"max": 4}, dict(count=0, lo=0, hi=4, growable=True)),
    ("min and max: starts at min", {"min": 2, "max": 6}, dict(count=2, lo=2, hi=6, growable=True)),
    ("count within min and max", {"min": 1, "max": 6, "count": 4}, dict(count=4, lo=1, hi=6, growable=True)),
    ("min equal to max", {"min": 2, "max": 2}, dict(count=2, lo=2, hi=2, growable=True)),
]


@pytest.mark.parametrize("name,fields,expect", GOOD, ids=[g[0] for g in GOOD])
def test_sizes(name, fields, expect):
    (g,) = load({**A100, **fields}).nodes
    assert {k: getattr(g, k) for k in expect} == expect


def test_price_spot_and_startup():
    (g,) = load({**A100, "max": 4, "price": 2.5, "spot": True, "startup": "3m"}).nodes
    assert (g.price, g.spot, g.startup) == (2.5, True, 180.0)
    assert g.scale_group(count=1) == ScaleGroup("a100", Resources(8, 96, 32), 1, 4, "a100-8x", frozenset(), {},
                                                2.5, True, 180.0)
    assert g.scale_group(count=1).node_hour_price == 20.0  # per GPU-hour, as the policy's prices


def test_scale_groups_take_the_counts_now():
    c = load({**A100, "max": 4}, {"name": "cpu", "count": 2, "node_type": "cpu"})
    assert [(s.name, s.count, s.max) for s in c.scale_groups({"a100": 3})] == [("a100", 3, 4), ("cpu", 2, 2)]


BAD = [
    ("min above max", {"min": 3, "max": 2}, [("nodes[0].max", 2, "an integer >= min (3)")]),
    ("max 0 with min above 0", {"min": 2, "max": 0}, [("nodes[0].max", 0, "an integer >= min (2)")]),
    ("max 0", {"max": 0}, [("nodes[0].max", 0, "an integer >= 1: the most nodes the group may grow to")]),
    ("min without max", {"min": 1},
     [("nodes[0].max", None, "required when min is given: the most nodes the group may grow to, an integer >= 1")]),
    ("count above max", {"max": 4, "count": 6},
     [("nodes[0].count", 6, "an integer from min (0) to max (4): the nodes the group starts with")]),
    ("count below min", {"min": 2, "max": 4, "count": 1},
     [("nodes[0].count", 1, "an integer from min (2) to max (4): the nodes the group starts with")]),
    ("a fixed group of no nodes", {"count": 0},
     [("nodes[0].count", 0, "an integer >= 1: the group's size (a group with min and max may start with 0 nodes)")]),
    ("negative min", {"min": -1, "max": 4}, [("nodes[0].min", -1, "an integer from 0 to 100000 or null")]),
    ("max beyond the limit", {"max": 100_001}, [("nodes[0].max", 100_001, "an integer from 0 to 100000 or null")]),
    ("a growable group with no node type", {"max": 4, "node_type": ""},
     [("nodes[0].node_type", "", "a node type name: required for a group with max (scale-up requests select "
                                 "nodes by it)")]),
    ("negative price", {"price": -1.0},
     [("nodes[0].price", -1.0, "a number >= 0: the price of one GPU-hour of a node of this group (of one node-hour "
                               "for a node with no GPUs), in the currency of the policy's prices or null")]),
    ("spot not a boolean", {"spot": "sometimes"}, [("nodes[0].spot", "sometimes", "true or false")]),
    ("startup not a duration", {"startup": "soon"},
     [("nodes[0].startup", "soon", "a duration: seconds as a number >= 0, or a string like 90s, 10m, 2h, 1d or "
                                   "1h30m")]),
    ("an unknown field", {"maximum": 4},
     [("nodes[0].maximum", 4, "unknown field; allowed fields: name, count, gpus, cpus, memory, features, node_type, "
                              "labels, datasets, min, max, price, spot, startup (did you mean max?)")]),
]


@pytest.mark.parametrize("name,fields,expect", BAD, ids=[b[0] for b in BAD])
def test_bad_values_name_field_value_and_allowed(name, fields, expect):
    assert errors({**A100, **fields}) == expect


def test_every_error_of_a_file_at_once():
    got = errors({**A100, "min": 3, "max": 2, "price": -2.0, "spot": "x"},
                 {"name": "b", "max": 4, "count": 9, "node_type": "b"})
    assert [path for path, _, _ in got] == ["nodes[0].price", "nodes[0].spot", "nodes[1].count"]
    # The cross-field check of a group runs once its fields are valid, so it reports too, once those are fixed.
    assert [path for path, _, _ in errors({**A100, "min": 3, "max": 2},
                                          {"name": "b", "max": 4, "count": 9, "node_type": "b"})] == [
        "nodes[0].max", "nodes[1].count"]


def test_two_growable_groups_may_not_share_a_node_type():
    got = errors({**A100, "max": 4}, {**A100, "name": "a100-spot", "max": 8, "spot": True})
    assert got == [("nodes[1].node_type", "a100-8x", "a node type no other group with max has (group a100 has it): "
                                                     "scale-up requests select nodes by node type")]
    # Fixed groups may share one, as the embedded cluster's do.
    assert len(load({**A100, "count": 1}, {**A100, "name": "more", "count": 2}, {**A100, "name": "g", "max": 2})
               .nodes) == 3
