"""ClusterState: the driver's state between cycles keeps usage, free capacity and queue order consistent."""
import pytest

from raylane.errors import NotFoundError
from raylane.scheduling import Admit, ClusterState, LeaseState, Resources, SchedulerConfig

from .builders import PROD, make_state, node, nodes, obj, running, team, wl


def free_gpus(st):
    return {nid: n.free.gpu for nid, n in st.nodes.items()}


def test_start_and_finish_keep_usage_and_free_capacity():
    st = make_state(nodes(2), [team("nlp", gpu=16)], pending=[wl("a").gpus(4).workers(2), wl("b").gpus(1)])
    a = st.start(Admit(st.pending()[0], ("n1", "n2")), now=10)
    assert a.start_time == 10 and a.state is LeaseState.RUNNING
    assert free_gpus(st) == {"n1": 4, "n2": 4}
    assert st.usage["nlp"].gpu == 8
    assert [w.id for w in st.pending()] == ["b"] and not st.is_pending("a")
    snap = st.snapshot()
    assert [l.id for l in snap.leases] == ["a"] and snap.usage["nlp"].gpu == 8
    assert {n.id: n.free.gpu for n in snap.nodes} == {"n1": 4, "n2": 4}
    st.finish("a", now=20)
    assert free_gpus(st) == {"n1": 8, "n2": 8} and st.usage["nlp"].gpu == 0 and not st.leases
    with pytest.raises(NotFoundError):
        st.finish("a", now=21)


def test_snapshot_is_a_stable_copy():
    st = make_state(nodes(1), [team("nlp")], pending=[wl("a"), wl("b").at(1)])
    snap = st.snapshot()
    st.start(Admit(obj(wl("a")), ("n1",)), now=0)
    assert [w.id for w in snap.queues["nlp"]] == ["a", "b"] and snap.leases == ()
    assert snap.nodes[0].free.gpu == 8 and snap.usage == {}


@pytest.mark.parametrize("ordering,expected", [
    ("fifo", ["c", "a", "b"]),
    ("priority", ["b", "c", "a"]),
    ("srtf", ["a", "c", "b"]),
])
def test_queue_is_kept_in_the_orderings_queue_order(ordering, expected):
    st = ClusterState([obj(n) for n in nodes(1)], {"nlp": team("nlp")}, SchedulerConfig(ordering=ordering))
    for w in [wl("a").at(5).est(10), wl("b").at(9).cls(PROD), wl("c").at(1).est(50)]:
        st.enqueue(obj(w))
    assert [w.id for w in st.snapshot().queues["nlp"]] == expected


def test_enqueue_twice_and_dequeue_unknown_fail():
    st = make_state(nodes(1), [team("nlp")], pending=[wl("a")])
    with pytest.raises(ValueError):
        st.enqueue(obj(wl("a")))
    with pytest.raises(NotFoundError):
        st.dequeue("zzz")
    assert st.dequeue("a").id == "a" and st.pending_count() == 0


def test_dequeue_finds_its_workload_among_equal_queue_keys():
    # Dequeue bisects to a workload's queue key; an ordering whose keys tie (here every key is the same) still
    # takes out the workload asked for, and only it.
    class Ties:
        def queue_key(self, w, cfg):
            return (0,)

    st = make_state(nodes(1), [team("nlp")])
    st._order = Ties()
    for name in "abcde":
        st.enqueue(obj(wl(name)))
    assert st.dequeue("c").id == "c" and st.dequeue("e").id == "e"
    assert [w.id for w in st.pending()] == ["a", "b", "d"]
    with pytest.raises(NotFoundError):
        st.dequeue("c")


def test_requeue_keeps_submit_time_and_adds_attained_service():
    st = make_state(nodes(1), [team("nlp")], pending=[wl("a").gpus(2).at(3), wl("b").at(7)],
                    ordering="fifo")
    st.start(Admit(obj(wl("a").gpus(2).at(3)), ("n1", )), now=10)
    lease = st.finish("a", now=110)
    w = st.requeue(lease, now=110)
    assert w.submit_time == 3 and w.attained_gpu_s == 200
    assert [x.id for x in st.snapshot().queues["nlp"]] == ["a", "b"]  # back in its original place


def test_terminating_lease_still_holds_its_resources():
    st = make_state(nodes(1), [team("nlp")], running=[running(wl("a").gpus(8), on=["n1"])])
    st.mark_terminating("a")
    snap = st.snapshot()
    assert snap.leases[0].state is LeaseState.TERMINATING
    assert snap.nodes[0].free.gpu == 0 and snap.usage["nlp"].gpu == 8


def test_checkpoint_is_recorded_on_the_lease():
    st = make_state(nodes(1), [team("nlp")], running=[running(wl("a"), on=["n1"], since=0)])
    st.checkpointed("a", now=50)
    assert st.snapshot().leases[0].progress_at_risk_s(80) == 30


def test_decay_halves_usage_after_one_half_life():
    st = make_state(nodes(1), [team("nlp", decayed=1000.0), team("cv", decayed=64.0)], fair_share_half_life_s=100.0)
    st.decay(0.0)
    st.decay(100.0)
    assert st.teams["nlp"].decayed_usage == pytest.approx(500.0)
    st.decay(300.0)
    assert st.teams["nlp"].decayed_usage == pytest.approx(125.0)
    assert st.teams["cv"].decayed_usage == pytest.approx(8.0)


def test_finish_charges_gpu_seconds_and_decays_the_charged_team_too():
    # nlp had 1000 decayed GPU-s at t=0; a 2-GPU lease runs from 0 to 100 (200 GPU-s) with a 100 s half-life.
    st = make_state(nodes(1), [team("nlp", decayed=1000.0), team("cv", decayed=1000.0)],
                    running=[running(wl("a").gpus(2), on=["n1"], since=0)], fair_share_half_life_s=100.0)
    st.decay(0.0)
    st.finish("a", now=100.0)
    assert st.teams["cv"].decayed_usage == pytest.approx(500.0)
    assert st.teams["nlp"].decayed_usage == pytest.approx(500.0 + 200.0)


def test_snapshot_omits_empty_queues_and_reflects_node_changes():
    st = make_state(nodes(1), [team("nlp")], pending=[wl("a")])
    st.dequeue("a")
    assert st.snapshot().queues == {}
    st.add_node(obj(node("n9").gpus(4)))
    assert {n.id for n in st.snapshot().nodes} == {"n1", "n9"}
    assert st.remove_node("n9", now=5) == []
    assert {n.id for n in st.snapshot().nodes} == {"n1"}


def test_removing_a_node_ends_every_lease_with_a_worker_there():
    # gang a spans n1 and n2; b sits on n2 alone; c on n3 is untouched.
    st = make_state(nodes(3), [team("nlp", gpu=24)],
                    running=[running(wl("a").gpus(2).workers(2), on=["n1", "n2"], since=0),
                             running(wl("b").gpus(4), on=["n2"], since=0),
                             running(wl("c").gpus(1), on=["n3"], since=0)])
    lost = st.remove_node("n2", now=100)
    assert sorted(l.id for l in lost) == ["a", "b"]
    assert set(st.leases) == {"c"}
    # n1 gets a's share back; n2 is gone with what it held; usage counts only c.
    assert free_gpus(st) == {"n1": 8, "n3": 7} and st.usage["nlp"].gpu == 1
    # fair share is charged for the time the lost leases ran (2 x 2 GPUs x 100 s + 4 GPUs x 100 s).
    assert st.teams["nlp"].decayed_usage == pytest.approx(800.0)
    for lease in lost:  # the driver requeues them at their original place
        st.requeue(lease, now=100)
    assert sorted(w.id for w in st.pending()) == ["a", "b"]


def test_cordoned_node_keeps_its_leases_and_gets_nothing_new():
    from raylane.scheduling import cycle

    st = make_state(nodes(2, gpus=4), [team("nlp", gpu=8)],
                    running=[running(wl("r").gpus(2), on=["n1"], since=0)], pending=[wl("p").gpus(2)])
    st.set_schedulable("n2", False)
    st.set_schedulable("n1", False)
    res = cycle(st.snapshot(), now=10)
    assert not res.admitted and set(st.leases) == {"r"}
    st.set_schedulable("n2", True)
    res = cycle(st.snapshot(), now=11)
    assert [(a.workload.id, a.placement) for a in res.admitted] == [("p", ("n2",))]
    with pytest.raises(NotFoundError):
        st.set_schedulable("n9", False)


def test_many_random_operations_keep_the_books_balanced():
    import random
    rng = random.Random(5)
    st = make_state(nodes(3), [team("nlp"), team("cv")], ordering="fifo")
    t = 0.0
    ids = iter(range(10**6))
    for _ in range(400):
        t += 1
        op = rng.random()
        pend = st.pending()
        if op < 0.4 or not (pend or st.leases):
            w = wl(f"w{next(ids)}").team(rng.choice(["nlp", "cv"])).gpus(rng.choice([1, 2])).at(t)
            st.enqueue(obj(w.cls(PROD) if rng.random() < 0.3 else w))
        elif op < 0.5 and pend:
            st.dequeue(rng.choice(pend).id)
        elif op < 0.7 and pend:
            w = rng.choice(pend)
            fits = [nid for nid, n in st.nodes.items() if n.free.gpu >= w.gang.per_worker.gpu]
            if fits:
                st.start(Admit(w, (rng.choice(fits),)), t)
        elif st.leases:
            wid = rng.choice(sorted(st.leases))
            lease = st.finish(wid, t)
            if rng.random() < 0.5:
                st.requeue(lease, t)
        held = {}
        for l in st.leases.values():
            held[l.team] = held.get(l.team, 0) + l.workload.gang.total.gpu
        for team_name in ("nlp", "cv"):
            assert st.usage.get(team_name, Resources()).gpu == pytest.approx(held.get(team_name, 0))
        for nid, n in st.nodes.items():
            on = sum(l.workload.gang.per_worker.gpu * l.placement.count(nid) for l in st.leases.values())
            assert n.free.gpu == pytest.approx(8 - on)
        snap = st.snapshot()
        assert {t: sorted(l.id for l in ls) for t, ls in snap.leases_by_team.items()} == {
            t: sorted(l.id for l in snap.leases if l.team == t) for t in {l.team for l in snap.leases}}
        q = [w.submit_time for ws in st.snapshot().queues.values() for w in ws]
        for ws in st.snapshot().queues.values():
            assert [w.submit_time for w in ws] == sorted(w.submit_time for w in ws)
        assert st.pending_count() == len(st.pending()) == len(q)
        counts = {}
        for w in st.pending():
            counts[(w.team, w.cls.name)] = counts.get((w.team, w.cls.name), 0) + 1
        assert st.pending_counts() == counts
