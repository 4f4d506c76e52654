"""The lease lifecycle (``raylane.scheduling.lifecycle``): each transition a driver applies, on a small state, with
what a user of the books would check (queue places, attained service, free GPUs, lease states). Pure: no Ray."""
from __future__ import annotations

import pytest

from raylane.scheduling import Admit, LeaseState, Resize, lifecycle

from .builders import ELASTIC, make_state, node, nodes, obj, running, team, wl


def free(st) -> dict:
    return {nid: n.free.gpu for nid, n in st.nodes.items()}


@pytest.mark.parametrize("since, now, attained, want", [
    (10.0, 110.0, 0.0, 400.0),     # 4 GPUs for 100 s
    (10.0, 110.0, 50.0, 450.0),    # plus what it had before this lease
    (10.0, 10.0, 50.0, 50.0),      # nothing yet at its start
    (10.0, 5.0, 50.0, 50.0),       # nothing for a time before its start
])
def test_attained_gpu_s_is_what_it_had_plus_its_gpus_for_the_time_since_its_start(since, now, attained, want):
    st = make_state(nodes(1), [team("nlp")], running=[running(wl("a").gpus(2).workers(2).attained(attained),
                                                              on=("n1", "n1"), since=since)])
    assert lifecycle.attained_gpu_s(st.leases["a"], now) == want


def test_admit_takes_the_workload_from_its_queue_onto_its_placement():
    st = make_state(nodes(1), [team("nlp")], pending=[wl("a").gpus(4)])
    lease = lifecycle.admit(st, Admit(obj(wl("a").gpus(4)), ("n1",)), 5.0)
    assert lease.start_time == 5.0 and not st.is_pending("a") and free(st) == {"n1": 4}


def test_begin_stop_keeps_the_gang_booked_and_is_idempotent():
    st = make_state(nodes(1), [team("nlp")], running=[running(wl("a").gpus(8), on=["n1"])])
    first = lifecycle.begin_stop(st, "a")
    assert first.state is LeaseState.TERMINATING and free(st) == {"n1": 0}
    assert lifecycle.begin_stop(st, "a") is first  # told twice: nothing changes


def test_end_and_requeue_puts_it_back_in_its_place_with_its_service():
    st = make_state(nodes(1), [team("nlp")], running=[running(wl("a").gpus(2).at(3), on=["n1"], since=10)],
                    pending=[wl("b").at(7)], ordering="fifo")
    w = lifecycle.end_and_requeue(st, "a", 110.0)
    assert w.submit_time == 3 and w.attained_gpu_s == 200 and free(st) == {"n1": 8}
    assert [x.id for x in st.snapshot().queues["nlp"]] == ["a", "b"]


def test_requeue_takes_the_attained_service_and_the_workload_the_driver_gives():
    # The simulator counts service until the stop was asked (here 60), and requeues a grown estimate.
    st = make_state(nodes(1), [team("nlp")], running=[running(wl("a").gpus(2).est(100), on=["n1"], since=10)])
    lease = lifecycle.end(st, "a", 110.0)
    back_as = obj(wl("a").gpus(2).est(130))
    w = lifecycle.requeue(st, lease, 110.0, lifecycle.attained_gpu_s(lease, 60.0), back_as)
    assert w.attained_gpu_s == 100 and w.runtime_estimate_s == 130 and st.is_pending("a")


def _elastic_state(workers: int):
    return make_state([node("n1").gpus(8)], [team("nlp", gpu=8)],
                      running=[running(wl("e").cls(ELASTIC).elastic(2, 8).workers(workers), on=("n1",) * workers,
                                       since=0)])


@pytest.mark.parametrize("to, grows", [(6, True), (2, False)])
def test_begin_resize_grows_at_once_and_a_shrink_first_stops_whole(to, grows):
    st = _elastic_state(4)
    rz = Resize(st.leases["e"].workload, 4, to, ("n1",) * to, (), "test")
    lease = lifecycle.begin_resize(st, rz, 100.0)
    if grows:
        assert lease.workload.gang.workers == 6 and lease.start_time == 100.0 and free(st) == {"n1": 2}
        assert lease.workload.attained_gpu_s == 400  # 4 GPUs for 100 s, kept across the restart
    else:
        assert lease is None and st.leases["e"].state is LeaseState.TERMINATING and free(st) == {"n1": 4}
        shrunk = lifecycle.finish_shrink(st, rz, 130.0)
        assert shrunk.workload.gang.workers == 2 and shrunk.start_time == 130.0 and free(st) == {"n1": 6}
        assert shrunk.workload.attained_gpu_s == 4 * 130.0  # booked whole until it stopped


def test_finish_shrink_after_the_lease_ended_or_a_growth_changes_nothing():
    st = _elastic_state(4)
    shrink = Resize(st.leases["e"].workload, 4, 2, ("n1",) * 2, (), "test")
    grow = Resize(st.leases["e"].workload, 4, 6, ("n1",) * 6, (), "test")
    grown = lifecycle.begin_resize(st, grow, 10.0)
    assert lifecycle.finish_shrink(st, grow, 20.0) is grown
    lifecycle.end(st, "e", 30.0)
    assert lifecycle.finish_shrink(st, shrink, 40.0) is None and free(st) == {"n1": 8}


def test_lose_node_ends_every_lease_there_for_the_driver_to_requeue():
    st = make_state(nodes(3), [team("nlp", gpu=24)],
                    running=[running(wl("a").gpus(2).workers(2), on=["n1", "n2"], since=0),
                             running(wl("b").gpus(4), on=["n2"], since=0),
                             running(wl("c").gpus(1), on=["n3"], since=0)])
    lost = lifecycle.lose_node(st, "n2", 100.0)
    assert sorted(le.id for le in lost) == ["a", "b"] and set(st.leases) == {"c"}
    for lease in lost:
        lifecycle.requeue(st, lease, 100.0, lifecycle.attained_gpu_s(lease, 100.0))
    assert sorted((w.id, w.attained_gpu_s) for w in st.pending()) == [("a", 400.0), ("b", 400.0)]
    assert lifecycle.lose_node(st, "n2", 200.0) == []  # gone already: nothing more ends
