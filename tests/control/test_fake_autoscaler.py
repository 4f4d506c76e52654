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

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.e2e]

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


# ------------------------------------------------------------------------------ Raylane's control plane on it
# Last in the module: the control plane asks through Ray's autoscaling coordinator, which, once it exists, sends its
# merged ask every 20 s and so overwrites the direct requests of the tests above.

# The module's node types as a cluster file's growable groups; a100 nodes are the cheaper, so a gang both types hold
# asks for an a100 node.
CLUSTER_FILE = {"name": "fake", "head": {"cpus": 1}, "nodes": [
    {"name": "a100", "min": 0, "max": 3, "gpus": 2, "cpus": 1, "memory": 1, "node_type": "a100", "price": 1.0,
     "startup": "5s"},
    {"name": "h100", "min": 0, "max": 1, "gpus": 2, "cpus": 1, "memory": 1, "node_type": "h100", "price": 5.0},
]}


def test_d_a_gang_no_node_holds_gets_a_new_node_is_admitted_on_it_and_the_node_goes_once_idle(cluster, tmp_path):
    from raylane.control.client import State, start_control, stop_control
    from raylane.control.journal import Journal, Kind
    from tests.raytest import local_policy, spec

    wait_for(lambda: not a100_nodes(cluster), timeout=IDLE_TIMEOUT_S + 30, what="no a100 node left by the tests above")
    journal = str(tmp_path / "journal.db")
    policy = local_policy()
    # A GPU-hour of these nodes costs so much that the first gang's few seconds spend team-a's budget (200).
    policy["prices"] = {"a100": 1e6, "h100": 1e6}
    ctl = start_control(policy, journal, tick_s=0.5, auth_enabled=False, cluster=CLUSTER_FILE)
    try:
        # No node of the cluster has a GPU: without growable groups this gang is refused at submit.
        wid = ctl.submit(spec("needs-a-gpu-node", "team-a", "pretrain", workers=1, gpu=2, cpu=0.5)).id
        view = wait_for(lambda: (v := ctl.status(wid)).state is State.ADMITTED
                        or "waiting for 1 new a100 node (a100)" in v.reason and v, timeout=30,
                        what="the reason to say which node it waits for")
        nodes = wait_for(lambda: a100_nodes(cluster), timeout=NODE_UP_S, what="an a100 node")
        rec = wait_for(lambda: (r := ctl.wait_admission(wid, 2.0)).ready and r, timeout=NODE_UP_S,
                       what="the gang admitted on the new node")
        assert list(rec["placement"]) == [nodes[0]["NodeID"]]
        assert view.state is State.ADMITTED or "typical start 5 s" in view.reason
        time.sleep(2.0)  # 2 GPUs for 2 s at 1e6 an hour: 1,111 spent
        ctl.release(wid, "finished")
        released = time.time()
        wait_for(lambda: not a100_nodes(cluster), timeout=IDLE_TIMEOUT_S + 30, what="the idle a100 node to go")
        assert time.time() - released >= IDLE_TIMEOUT_S - 1
        assert not cluster.alive_nodes(H100)
        # Over its budget, team-a's next gang asks for no node, and is told why.
        over = ctl.submit(spec("over-budget", "team-a", "pretrain", workers=1, gpu=2, cpu=0.5)).id
        why = wait_for(lambda: "no new node asked for: team team-a's monthly budget is" in (r := ctl.status(over).reason)
                       and r, timeout=30, what="the budget reason")
        assert why.endswith("the policy stops scale-up at 90%"), why
        cluster.wait_for_iterations(3)
        assert not a100_nodes(cluster) and not cluster.alive_nodes(H100)
        ctl.cancel(over)
    finally:
        stop_control()
    entries = [(e.kind, e.data["event"], e.data.get("reason")) for e in Journal(journal).entries_for(wid)
               if e.kind == Kind.SCALE]
    assert entries == [("scale", "requested", None), ("scale", "withdrawn", f"{wid} was admitted")]


def test_e_a_higher_class_waits_for_a_new_node_instead_of_preempting(cluster, tmp_path):
    from raylane.control.client import State, start_control, stop_control
    from tests.raytest import local_policy, spec

    wait_for(lambda: not a100_nodes(cluster), timeout=IDLE_TIMEOUT_S + 30, what="no a100 node left by the tests above")
    policy = local_policy(finetune={"wait_for_scale_up": "2m"})
    ctl = start_control(policy, str(tmp_path / "journal.db"), tick_s=0.5, auth_enabled=False, cluster=CLUSTER_FILE)
    try:
        low = ctl.submit(spec("low", "team-a", "pretrain", workers=1, gpu=2, cpu=0.5)).id
        wait_for(lambda: ctl.wait_admission(low, 2.0).ready, timeout=NODE_UP_S, what="the pretrain gang admitted")
        [first] = a100_nodes(cluster)
        time.sleep(6)  # past the pretrain class's min_runtime (5 s): from here on it may be preempted
        high = ctl.submit(spec("high", "team-a", "finetune", workers=1, gpu=2, cpu=0.5)).id
        rec = wait_for(lambda: (r := ctl.wait_admission(high, 2.0)).ready and r, timeout=NODE_UP_S,
                       what="the finetune gang admitted on a second node")
        second = [n["NodeID"] for n in a100_nodes(cluster) if n["NodeID"] != first["NodeID"]]
        assert list(rec["placement"]) == second
        assert ctl.status(low).state is State.ADMITTED  # nothing preempted
        events = " ".join(note for _, note in ctl.explain(low)["events"])
        assert "preempt" not in events, events
        for wid in (low, high):
            ctl.release(wid, "finished")
        wait_for(lambda: not a100_nodes(cluster), timeout=IDLE_TIMEOUT_S + 30, what="both idle nodes to go")
    finally:
        stop_control()
