"""The lease orders a driver keeps (raylane.scheduling.leaseorder): ``ClusterState`` keeps its leases by static end
and by when they settle as they start, checkpoint, stop, resize and finish, and a cycle reads them instead of
sorting. Each order must give exactly what the sort gives (ties in lease-table order), at any ``now``."""
from __future__ import annotations

import random
from dataclasses import replace

import pytest

from raylane.scheduling import Admit, ClusterState, Resize, SchedulerConfig, cycle
from raylane.scheduling.backfill import expected_end
from raylane.scheduling.leaseorder import LeaseOrder, SortedLeases
from raylane.scheduling.preemption import settled_after
from raylane.scheduling.types import Lease, LeaseState

from .builders import ELASTIC, PRETRAIN, node, team, wl

CFG = SchedulerConfig(backfill="easy", preemption="ordering", ordering="las", default_runtime_s=100.0,
                      hysteresis_min_run_s=30.0, hysteresis_service_fraction=0.5, las_thresholds=(60.0, 600.0))


def busy_state(seed: int):
    """A ClusterState after a random history: starts (some on equal end times), checkpoints, stops marked,
    elastic resizes and finishes. Returns (state, the time now, this cycle's fresh leases to merge)."""
    rng = random.Random(seed)
    st = ClusterState([node(f"n{i}").gpus(8).obj() for i in range(6)], {"a": team("a", 48)}, CFG)
    now, n = 0.0, 0
    for _ in range(60):
        now += rng.choice([0.0, 0.0, 5.0, 20.0])
        op = rng.random()
        leases = list(st.leases.values())
        if op < 0.5 or not leases:
            n += 1
            b = wl(f"w{n:03d}").team("a").gpus(1).at(now).est(rng.choice([None, 0.0, 10.0, 50.0, 50.0]))
            b = b.attained(rng.choice([0.0, 0.0, 300.0])).cls(PRETRAIN)
            if rng.random() < 0.3:
                b = b.cls(ELASTIC).elastic(1, 3)
            w = b.obj()
            free = [nid for nid, nd in st.nodes.items() if nd.free.gpu >= 1]
            if not free:
                continue
            st.enqueue(w)
            st.start(Admit(w, (rng.choice(free),)), now)
        elif op < 0.65:
            st.checkpointed(rng.choice(leases).id, now)
        elif op < 0.75:
            st.mark_terminating(rng.choice(leases).id)
        elif op < 0.85:
            l = rng.choice(leases)
            g = l.workload.gang
            free = [nid for nid, nd in st.nodes.items() if nd.free.gpu >= 1]
            if g.max_workers is not None and g.workers < g.hi and free:
                st.resize(Resize(l.workload, g.workers, g.workers + 1, l.placement + (free[0],)), now)
        else:
            st.finish(rng.choice(leases).id, now)
    fresh = [Lease(wl(f"f{i}").team("a").gpus(1).at(now).est(rng.choice([None, 0.0, 10.0, 50.0])).obj(), ("n0",),
                   now) for i in range(rng.randint(0, 4))]
    return st, now, fresh


@pytest.mark.parametrize("seed", range(40))
def test_leases_in_end_order_are_what_a_stable_sort_gives(seed):
    st, now, fresh = busy_state(seed)
    snap = st.snapshot()
    stopping = [l for l in snap.leases if l.state is LeaseState.TERMINATING]
    for t in (now, now + 15.0, now - 5.0, now + 1000.0):
        want = sorted(list(snap.leases) + fresh, key=lambda l: expected_end(l, t, CFG))
        got = list(snap.lease_order.ending(t, stopping, fresh, CFG))
        assert [l.id for l in got] == [l.id for l in want], t
        assert all(a is b for a, b in zip(got, want))  # the leases as they are now (state, checkpoint)
        # Built at once from the lease table, the same order.
        built = LeaseOrder.of(snap.leases, CFG)
        assert [l.id for l in built.ending(t, stopping, fresh, CFG)] == [l.id for l in want]


@pytest.mark.parametrize("seed", range(40))
def test_settled_leases_are_those_past_their_hysteresis(seed):
    st, now, _ = busy_state(seed)
    snap = st.snapshot()
    for t in (now, now + 15.0, now + 60.0, now + 1000.0):
        got = snap.lease_order.settled(t)
        assert sorted(l.id for l in got) == sorted(l.id for l in snap.leases if t >= settled_after(l, CFG))
        assert [settled_after(l, CFG) for l in got] == sorted(settled_after(l, CFG) for l in got)


@pytest.mark.parametrize("seed", range(40))
def test_a_cycle_decides_the_same_with_or_without_the_orders(seed):
    rng = random.Random(f"cycle/{seed}")
    st, now, _ = busy_state(seed)
    for i in range(rng.randint(3, 12)):  # waiting work: gangs too large to fit now (a reservation), small ones
        st.enqueue(wl(f"q{i:02d}").team("a").workers(rng.choice([1, 2, 6])).gpus(rng.choice([1, 4, 8]))
                   .at(now - rng.choice([0.0, 50.0])).est(rng.choice([None, 5.0, 500.0])).obj())
    snap = st.snapshot()
    for cfg in (CFG, replace(CFG, ordering="srtf", hysteresis_min_run_s=0.0, hysteresis_service_fraction=0.0),
                replace(CFG, ordering="fifo", preemption="default")):
        s = replace(snap, config=cfg)
        if cfg is not CFG:  # the orders were kept for CFG's default runtime and hysteresis: built for cfg
            s = replace(s, lease_order=LeaseOrder.of(snap.leases, cfg))
        assert cycle(s, now + 7.0) == cycle(replace(s, lease_order=None), now + 7.0)


def test_sorted_leases_replace_a_lease_in_place_and_forget_it():
    a, b = (Lease(wl(x).obj(), ("n0",), 0.0) for x in ("a", "b"))
    s = SortedLeases()
    s.put(a, 5.0, 0)
    s.put(b, 5.0, 1)
    s.put(replace(a, state=LeaseState.TERMINATING), 5.0, 0)
    keys, leases = s.frozen()
    assert keys == ((5.0, 0), (5.0, 1)) and leases[0].state is LeaseState.TERMINATING
    s.remove("a")
    s.remove("nothing")
    assert s.frozen() == (((5.0, 1),), (b,))


@pytest.mark.parametrize("backfill,preemption,kept", [("easy", "default", True), ("none", "ordering", True),
                                                      ("none", "default", False), ("greedy", "none", False)])
def test_the_orders_are_kept_only_for_policies_that_read_them(backfill, preemption, kept):
    cfg = replace(CFG, backfill=backfill, preemption=preemption)
    st = ClusterState([node("n0").gpus(8).obj()], {"a": team("a", 8)}, cfg)
    w = wl("w").team("a").cls(ELASTIC).elastic(1, 2).obj()
    st.enqueue(w)
    st.start(Admit(w, ("n0",)), 0.0)
    order = st.snapshot().lease_order
    assert (order is not None) is kept
    if kept:
        assert [l.id for l in order.by_end] == [l.id for l in order.elastic] == ["w"]
