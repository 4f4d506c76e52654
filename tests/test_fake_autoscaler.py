"""What Ray 2.60's autoscaler (v2) does with ``request_resources``, checked on its fake multi-node provider.

The facts the control plane's scale-up (issue 28) builds on, on one cluster shared by the module: a head with no
GPUs and two node types of the same shape told apart only by the ``raylane.io/node-type`` label.

- a request with a label selector adds a node of that type, and only of that type;
- the request is one constraint judged against the nodes' *total* resources: a node whose GPUs a placement group
  holds still counts as room for one bundle of its shape, so asking for "one more" adds nothing, and asking for
  two adds one node;
- clearing the request (``bundles=[]``) lets idle nodes go after the idle timeout, while a node that a placement
  group holds stays until the group is removed, and goes no sooner than the idle timeout after that.

Each test sets up the state it needs (cheaply when the test before left it so) and leaves no placement group.
"""
import time

import pytest

from tests.autoscalertest import FakeAutoscalingCluster, NodeType, request
from tests.raytest import wait_for

pytestmark = [pytest.mark.ray, pytest.mark.slow]

NODE_TYPE = "raylane.io/node-type"
A100 = {NODE_TYPE: "a100"}
H100 = {NODE_TYPE: "h100"}
GANG_BUNDLE = {"GPU": 2}
IDLE_TIMEOUT_S = 5.0
# A node of the fake provider joins 2-4 s after the autoscaler decides to add it (2 cores, a busy machine).
NODE_UP_S = 60.0


@pytest.fixture(scope="module")
def cluster():
    c = FakeAutoscalingCluster([
        # max 3: room for a third a100 node, so a request judged against free resources would show as one.
        NodeType("a100", {"CPU": 1, "GPU": 2}, A100, min_workers=0, max_workers=3),
        NodeType("h100", {"CPU": 1, "GPU": 2}, H100, min_workers=0, max_workers=1),
    ], head_cpus=1, idle_timeout_s=IDLE_TIMEOUT_S)
    with c:  # its exit fails the module if a process of the cluster outlives it
        c.connect()
        yield c


def a100_nodes(cluster) -> list:
    return cluster.alive_nodes(A100)


def gang(n: int = 1):
    """A placement group of ``n`` gang bundles on a100 nodes, ready."""
    from ray.util.placement_group import placement_group

    pg = placement_group([GANG_BUNDLE] * n, bundle_label_selector=[A100] * n)
    assert pg.wait(30), "the placement group was not placed"
    return pg


def node_of(pg) -> str:
    from ray.util.placement_group import placement_group_table

    return placement_group_table(pg)["bundles_to_node_id"][0]


def test_a_request_with_a_label_selector_adds_a_node_of_that_type(cluster):
    assert not a100_nodes(cluster) and not cluster.alive_nodes(H100)

    request([GANG_BUNDLE], [A100])

    nodes = wait_for(lambda: a100_nodes(cluster), timeout=NODE_UP_S, what="an a100 node")
    assert nodes[0]["Labels"][NODE_TYPE] == "a100"
    assert nodes[0]["Resources"]["GPU"] == 2
    # The same-shaped h100 type was not taken, and one node was enough.
    cluster.wait_for_iterations(2)
    assert len(a100_nodes(cluster)) == 1
    assert not cluster.alive_nodes(H100)


def test_c_the_request_is_judged_against_total_resources_not_free(cluster):
    request([GANG_BUNDLE], [A100])
    wait_for(lambda: a100_nodes(cluster), timeout=NODE_UP_S, what="an a100 node")
    from ray.util.placement_group import remove_placement_group

    pg = gang()
    try:
        # The autoscaler reads the cluster state the GCS reports (usage lags placement by up to a second): the
        # node must be seen as full there, or "no node added" would prove nothing.
        wait_for(lambda: cluster.status().available_resources().get("GPU", 0) == 0, timeout=30,
                 what="the autoscaler's view to show every GPU held")
        # "One more" gang bundle, while the only a100 node's GPUs are all held: no node is added.
        request([GANG_BUNDLE], [A100])
        cluster.wait_for_iterations(3)
        status = cluster.status()
        assert len(a100_nodes(cluster)) == 1
        assert not status.pending_launches and not status.pending_nodes
        # Two bundles: one node more, not two (a count of total room, the held node counted as empty).
        request([GANG_BUNDLE] * 2, [A100] * 2)
        wait_for(lambda: len(a100_nodes(cluster)) == 2, timeout=NODE_UP_S, what="a second a100 node")
        cluster.wait_for_iterations(3)
        status = cluster.status()
        assert len(a100_nodes(cluster)) == 2
        assert not status.pending_launches and not status.pending_nodes
    finally:
        remove_placement_group(pg)


def test_b_clearing_the_request_lets_idle_nodes_go_after_the_idle_timeout(cluster):
    from ray.util.placement_group import remove_placement_group

    request([GANG_BUNDLE] * 2, [A100] * 2)
    wait_for(lambda: len(a100_nodes(cluster)) == 2, timeout=NODE_UP_S, what="two a100 nodes")
    pg = gang()
    held = node_of(pg)
    try:
        request([])
        cleared = time.time()
        # The idle node goes; the one the placement group holds stays past the idle timeout.
        wait_for(lambda: len(a100_nodes(cluster)) == 1, timeout=IDLE_TIMEOUT_S + 30, what="the idle a100 node to go")
        assert [n["NodeID"] for n in a100_nodes(cluster)] == [held]
        assert cluster.status().resource_demands.cluster_constraint_demand[0].bundles_by_count == []
        wait_for(lambda: time.time() - cleared > IDLE_TIMEOUT_S, timeout=IDLE_TIMEOUT_S + 1, what="the idle timeout")
        cluster.wait_for_iterations(2)
        assert [n["NodeID"] for n in a100_nodes(cluster)] == [held]
    finally:
        remove_placement_group(pg)
    freed = time.time()
    wait_for(lambda: not a100_nodes(cluster), timeout=IDLE_TIMEOUT_S + 30, what="the freed a100 node to go")
    assert time.time() - freed >= IDLE_TIMEOUT_S
