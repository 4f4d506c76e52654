"""GPU devices: a share of a GPU (below 1) takes part of ONE device, whole GPUs take whole, fully free devices, as
Ray does (issue 14, item 3). Pure table tests of the capacity, placement, cycle and state."""
import pytest

from raylane.scheduling import Capacity, ClusterState, Gang, Resources, check_feasible, place
from raylane.scheduling.capacity import choose_devices, gpu_slots
from raylane.scheduling.types import node_devices

from .builders import PROD, SWEEP, decide, make_state, node, obj, running, team, wl


@pytest.mark.parametrize("devs,g,want", [
    # Ray's rule: a share goes to the device it fits tightest, the lowest index on ties ...
    ((1.0, 0.4, 0.7), 0.3, (1,)),
    ((1.0, 0.7, 0.7), 0.5, (1,)),
    ((0.2, 0.2), 0.5, None),
    # ... whole GPUs to the lowest-numbered fully free devices.
    ((0.5, 1.0, 1.0, 1.0), 2, (1, 2)),
    ((0.5, 1.0, 0.9, 1.0), 2, (1, 3)),
    ((0.5, 1.0, 0.9, 0.9), 2, None),
    ((0.0,), 0, ()),
])
def test_device_choice_follows_rays_rule(devs, g, want):
    assert choose_devices(devs, g) == want


@pytest.mark.parametrize("devs,g,want", [
    ((0.4, 0.4), 0.5, 0),   # 0.8 free in all, no device has 0.5
    ((1.0, 0.4), 0.5, 2),
    ((1.0, 1.0, 0.9), 1, 2),
    ((1.0, 1.0, 1.0, 0.5), 2, 1),
    ((0.3, 0.3, 0.3), 0.1, 9),
])
def test_slots_count_devices(devs, g, want):
    assert gpu_slots(devs, g) == want


def _two_devices_each_0_6_used():
    return dict(nodes=[node("n1").gpus(2)], admission="none", backfill="none",
                running=[running(wl("r1").gpus(0.6), on=("n1",)), running(wl("r2").gpus(0.6), on=("n1",))])


def test_the_issues_example_two_devices_each_0_6_used_hold_no_0_5():
    st = make_state(**_two_devices_each_0_6_used())
    n1 = st.nodes["n1"]
    assert n1.free.gpu == pytest.approx(0.8) and node_devices(n1) == (0.4, 0.4)
    out = decide(**_two_devices_each_0_6_used(), pending=[wl("half").gpus(0.5)])
    assert out.reason_type("half") == "NoCapacity"
    out = decide(**_two_devices_each_0_6_used(), pending=[wl("small").gpus(0.4)])
    assert "small" in out.admitted


def test_infeasible_on_devices_is_said_with_the_free_sum():
    out = decide(**_two_devices_each_0_6_used(), pending=[wl("half").gpus(0.5)])
    # The reason gives the node's free sum, and why it does not hold the worker: what is free on each GPU.
    assert "has 0.8 GPU" in str(out.reason("half")) and "(per GPU: 0.4, 0.4)" in str(out.reason("half"))


def test_whole_gpus_need_whole_free_devices():
    base = dict(nodes=[node("n1").gpus(4)], admission="none", backfill="none",
                running=[running(wl("r1").gpus(0.6), on=("n1",)), running(wl("r2").gpus(0.6), on=("n1",))])
    st = make_state(**base)
    assert node_devices(st.nodes["n1"]) == (0.4, 0.4, 1.0, 1.0)  # Ray's rule: 0.6 and 0.6 cannot share a device
    assert "two" in decide(**base, pending=[wl("two").gpus(2)]).admitted
    out = decide(**base, pending=[wl("three").gpus(3)])  # 2.8 free in all, but only two whole devices
    assert out.reason_type("three") == "NoCapacity"


def test_shares_fill_a_partly_used_device_before_opening_another():
    st = make_state([node("n1").gpus(2)], running=[running(wl("r1").gpus(0.5), on=("n1",))],
                    pending=[wl("a").gpus(0.25), wl("b").gpus(0.25).at(1), wl("c").gpus(0.5).at(2)])
    res = decide([node("n1").gpus(2)], running=[running(wl("r1").gpus(0.5), on=("n1",))],
                 pending=[wl("a").gpus(0.25), wl("b").gpus(0.25).at(1), wl("c").gpus(0.5).at(2)],
                 admission="none")
    admits = {a.workload.id: a.devices for a in res.result.admitted}
    assert admits == {"a": ((0,),), "b": ((0,),), "c": ((1,),)}
    assert st.nodes["n1"].devices == (0.5, 1.0)


CAP = (node("a").gpus(2), node("b").gpus(2))


@pytest.mark.parametrize("strategy,want", [
    # pack: onto the node whose device is already partly used (fewest partly used devices) ...
    ("pack", ("a",)), ("strict-pack", ("a",)),
    # ... spread: the emptiest node.
    ("spread", ("b",)), ("strict-spread", ("b",)), ("balanced", ("b",)),
])
def test_pack_and_spread_on_devices(strategy, want):
    cap = Capacity([obj(n) for n in CAP])
    cap.take("a", Resources(gpu=0.5))
    # a: 1.5 free (devices 0.5, 1.0), b: 2 free. A 0.25 share:
    assert place(Gang(1, Resources(gpu=0.25), strategy), cap) == want


def test_pack_prefers_the_tightest_device_over_the_fullest_node():
    cap = Capacity([obj(node("a").gpus(4)), obj(node("b").gpus(2))])
    cap.take("a", Resources(gpu=0.5))  # a: 3.5 free, one device half used; b: 2 free, no device used
    assert place(Gang(1, Resources(gpu=0.5), "pack"), cap) == ("a",)
    assert place(Gang(1, Resources(gpu=1), "pack"), cap) == ("b",)  # whole GPUs: best fit by free count


def test_a_gang_of_shares_counts_shares_per_device():
    cap = Capacity([obj(node("a").gpus(2))])
    cap.take("a", Resources(gpu=0.7))
    # devices 0.3 and 1.0: three workers of 0.3 fit (one on device 0, three on device 1 would be 0.9) ...
    assert place(Gang(4, Resources(gpu=0.3), "strict-pack"), cap) == ("a",) * 4
    # ... five do not, though 1.3 GPUs are free and 5 x 0.3 = 1.5 > 1.3 anyway; four of 0.33: 0.3 holds none
    assert place(Gang(4, Resources(gpu=0.33), "strict-pack"), cap) is None


def test_finish_gives_back_exactly_the_devices_taken():
    st = make_state([node("n1").gpus(2)], running=[running(wl("r1").gpus(0.6), on=("n1",)),
                                                   running(wl("r2").gpus(0.3), on=("n1",)),
                                                   running(wl("r3").gpus(0.5), on=("n1",))])
    assert {l.id: l.devices for l in st.leases.values()} == {"r1": ((0,),), "r2": ((0,),), "r3": ((1,),)}
    st.finish("r1", 10.0)
    assert st.nodes["n1"].devices == (0.7, 0.5)
    st.finish("r3", 10.0)
    st.finish("r2", 10.0)
    assert st.nodes["n1"].devices == (1.0, 1.0) and st.nodes["n1"].free.gpu == 2


def test_admit_devices_are_what_the_state_takes():
    st = make_state([node("n1").gpus(2)], pending=[wl("a").gpus(0.5).workers(3)], admission="none")
    from raylane.scheduling import cycle
    res = cycle(st.snapshot(), 0.0)
    (a,) = res.admitted
    lease = st.start(a, 0.0)
    assert lease.devices == a.devices == ((0,), (0,), (1,))
    assert st.nodes["n1"].devices == (0.0, 0.5)


def test_preemption_frees_the_devices_it_needs():
    """A whole GPU for prod on a node whose two devices each hold a 0.6 sweep share: one victim is not enough
    (its device would be free, but the other still holds 0.6) for 2 GPUs; both go, and nothing else."""
    out = decide([node("n1").gpus(2)], [team("nlp", gpu=4)],
                 running=[running(wl("s1").gpus(0.6).cls(SWEEP), on=("n1",)),
                          running(wl("s2").gpus(0.6).cls(SWEEP), on=("n1",))],
                 pending=[wl("p").gpus(2).cls(PROD)])
    assert out.preempted == {"p": ("s1", "s2")} or set(out.preempted["p"]) == {"s1", "s2"}
    out = decide([node("n1").gpus(2)], [team("nlp", gpu=4)],
                 running=[running(wl("s1").gpus(0.6).cls(SWEEP), on=("n1",)),
                          running(wl("s2").gpus(0.6).cls(SWEEP), on=("n1",))],
                 pending=[wl("p").gpus(1).cls(PROD)])
    assert len(out.preempted["p"]) == 1


def test_a_node_copied_with_a_new_free_count_gets_fresh_devices():
    st = ClusterState([obj(node("n1").gpus(2))], {})
    n = st.nodes["n1"]
    from dataclasses import replace
    st.add_node(replace(n, free=replace(n.free, gpu=1.5)))  # stale devices (1.0, 1.0) do not add up to 1.5
    assert st.nodes["n1"].devices == (1.0, 0.5)


@pytest.mark.parametrize("g,ok", [(0.5, True), (2, True), (1.5, False), (2.5, False)])
def test_check_feasible_refuses_a_share_above_one(g, ok):
    w = wl("x").gpus(g).obj()
    why = check_feasible(w, [obj(node("n1"))], {"nlp": team("nlp")}, "none")
    assert (why is None) == ok, why
    if not ok:
        assert why.field == "gang.per_worker.gpu" and "whole number" in why.detail


def test_backfill_counts_what_the_head_leaves_per_device():
    """The head needs a whole GPU, free once r1 ends (est. 100 s) on r1's device. A 0.4 share with no estimate fits
    now, and 0.4 GPU is spare in the sum at the head's start, but Ray's rule puts it on r1's device, which the head
    needs: EASY backfill refuses it."""
    base = dict(nodes=[node("n1").gpus(2)], admission="none", backfill="easy",
                running=[running(wl("r1").gpus(0.6).est(100), on=("n1",)),
                         running(wl("r2").gpus(0.6).est(1000), on=("n1",))])
    out = decide(**base, pending=[wl("head").gpus(1).at(1), wl("small").gpus(0.4).at(2)], now=10)
    assert out.reason_type("head") == "Reserved"
    assert out.reason_type("small") == "BlockedByReservation"
    # A share that ends before the head's start may use r1's device.
    out = decide(**base, pending=[wl("head").gpus(1).at(1), wl("quick").gpus(0.4).est(30).at(2)], now=10)
    assert "quick" in out.admitted


def test_stranded_gpus_are_counted_on_devices():
    """0.8 GPU free on two devices of 0.4: a waiting 0.5 worker cannot use them (blocked by where they are), so
    both are stranded; a waiting 0.4 worker could, so none is."""
    from raylane.scheduling.fragmentation import fragmentation

    st = make_state(**_two_devices_each_0_6_used())
    nodes = st.snapshot().nodes
    got = fragmentation(nodes, [Gang(1, Resources(gpu=0.5), "pack")])
    assert got.blocked_shapes == 1 and got.total == pytest.approx(0.8)
    got = fragmentation(nodes, [Gang(1, Resources(gpu=0.4), "pack")])
    assert got.blocked_shapes == 0 and got.total == 0
