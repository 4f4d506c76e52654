"""Per-flavor quotas in the pure core (issue 28, item 3): a team's quota of GPUs on each node type, pooled per
node type between the teams that have one (Kueue's resource flavors). The ledger keeps them, the cycle places a
gang only on types whose quota has room (and says which quota is full), preemption reclaims a lent flavor, submit
refuses a gang no flavor quota could ever hold, and scale-up asks only for nodes the team may use."""
from __future__ import annotations

from dataclasses import replace

from raylane.scheduling import Resources, check_feasible, cycle
from raylane.scheduling.admission import QuotaLedger
from raylane.scheduling.autoscale import FlavorQuotaFull, ScaleGroup, ScaleSnapshot, compute_demand
from raylane.scheduling.flavors import flavor_errors, flavor_usage, placed_gpus, restrict
from raylane.scheduling.types import NoCapacity, Pending, Quota, QuotaExceeded

from .builders import PRETRAIN, PROD, make_state, running, summarize, team, wl
from .test_flavors import n


def fteam(name, gpu=None, **flavors):
    """A team with flavor quotas: ``a100=8`` or ``a100=(nominal, borrowing_limit, lending_limit)``."""
    q = {t: Quota(*(v if isinstance(v, tuple) else (v,))) for t, v in flavors.items()}
    return replace(team(name, gpu=gpu), flavors=q)


def job(wid, gpus=8, t="a", types=(), cls=PRETRAIN, at=0.0, workers=1):
    w = wl(wid).team(t).gpus(gpus).workers(workers).cls(cls).at(at).obj()
    return replace(w, gang=replace(w.gang, node_types=tuple(types)))


NODES = [n("a1", "a100"), n("a2", "a100"), n("h1", "h100"), n("h2", "h100")]


# -- the ledger ---------------------------------------------------------------------------------------------------

def test_flavor_room_pools_what_teams_lend_per_node_type_and_rolls_back():
    teams = {"a": fteam("a", h100=(8, 8)), "b": fteam("b", h100=(8, None, 8)), "c": team("c")}
    led = QuotaLedger(teams, {}, {"a": {"h100": 8.0}})
    # a holds its 8; b lends all 8 of its nominal, and a may borrow up to 8: 8 more.
    assert led.flavor_room("a", "h100") == 8.0
    assert led.flavor_room("b", "h100") == 16.0 - 8.0  # b's own 8 (a borrows nothing yet)
    assert led.flavor_room("a", "a100") is None and led.flavor_room("c", "h100") is None  # not limited
    mark = led.mark()
    led.add("a", Resources(gpu=8), (("h100", 8.0),))
    assert led.flavor_used("a", "h100") == 16.0
    assert led.flavor_room("a", "h100") == 0.0 and led.flavor_room("b", "h100") == 0.0  # b's 8 are lent out
    led.rollback(mark)
    assert led.flavor_used("a", "h100") == 8.0 and led.flavor_room("b", "h100") == 8.0
    # A copy is independent; a team without flavor quotas is not counted per type.
    c = led.copy()
    c.add("a", Resources(gpu=4), (("h100", 4.0),))
    c.add("c", Resources(gpu=4), (("h100", 4.0),))
    assert led.flavor_used("a", "h100") == 8.0 and c.flavor_used("a", "h100") == 12.0
    assert c.flavor_used("c", "h100") == 0.0


def test_a_gang_spanning_types_counts_on_each_and_usage_is_read_from_leases():
    assert placed_gpus(2.0, ("a1", "a1", "h1"), {"a1": "a100", "h1": "h100"}.get) == (("a100", 4.0), ("h100", 2.0))
    st = make_state(NODES, [fteam("a", a100=16)], running=[running(job("r", gpus=4, workers=2), ["a1", "h1"])])
    snap = st.snapshot()
    assert flavor_usage(snap.leases, snap.nodes, snap.teams) == {"a": {"a100": 4.0, "h100": 4.0}}


# -- the cycle ----------------------------------------------------------------------------------------------------

def test_a_full_flavor_sends_the_gang_to_its_next_type_and_then_waits_naming_the_quota():
    """team a: 8 a100 and 8 h100 GPUs. Its second h100-first gang goes to a100 though h100 nodes are free; its
    third waits, told which quota is full; team b (no flavors) takes the free h100 node."""
    teams = [fteam("a", gpu=64, h100=8, a100=8), team("b", gpu=64)]
    pend = [job("a1", types=["h100", "a100"], at=1), job("a2", types=["h100", "a100"], at=2),
            job("a3", types=["h100", "a100"], at=3), job("b1", t="b", types=["h100"], at=4)]
    out = summarize(cycle(make_state(NODES, teams, pending=pend).snapshot(), 10.0))
    assert out.admitted["a1"][0].startswith("h") and out.admitted["a2"][0].startswith("a")
    assert out.admitted["b1"][0].startswith("h")
    why = out.reason("a3")
    assert isinstance(why, QuotaExceeded) and why.flavor == "h100" and why.also == ("a100",)
    assert "on node type h100" in str(why) and "a100 is full for it too" in str(why)


def test_a_gang_naming_no_type_avoids_the_types_whose_quota_is_full():
    teams = [fteam("a", gpu=64, h100=0)]
    st = make_state([n("h1", "h100"), n("a1", "a100", free=4)], teams, pending=[job("w", gpus=4)])
    # pack would choose the fullest node that fits (a1 has 4 free, h1 8), but h100 is barred either way: a1.
    assert summarize(cycle(st.snapshot(), 0.0)).admitted == {"w": ("a1",)}
    st = make_state([n("h1", "h100"), n("a1", "a100", free=0)], teams, pending=[job("w", gpus=4)])
    out = summarize(cycle(st.snapshot(), 0.0))
    assert out.admitted == {} and isinstance(out.reason("w"), NoCapacity)  # a100 is full; h1 is not for it
    # Every type of the cluster limited and full: its quota is what it waits for, not capacity.
    teams = [fteam("a", gpu=64, h100=0, a100=(4, 0))]
    st = make_state([n("h1", "h100"), n("a1", "a100")], teams, pending=[job("w", gpus=8)])
    why = summarize(cycle(st.snapshot(), 0.0)).reason("w")
    assert isinstance(why, QuotaExceeded) and why.flavor == "a100" and why.also == ("h100",)


def test_flavor_quotas_off_decide_as_before():
    pend = [job("a1", types=["h100", "a100"], at=1), job("a2", types=["h100", "a100"], at=2)]
    out = summarize(cycle(make_state(NODES, [team("a", gpu=64)], pending=pend).snapshot(), 10.0))
    assert {p[0][0] for p in out.admitted.values()} == {"h"}  # both on h100: nothing limits the type


def test_within_a_team_a_higher_class_preempts_on_the_full_flavor_only():
    teams = [fteam("a", gpu=64, h100=8)]
    runs = [running(job("low-h", types=["h100"]), ["h1"]), running(job("low-a", types=["a100"]), ["a1"])]
    out = summarize(cycle(make_state(NODES, teams, runs, pending=[job("hi", types=["h100"], cls=PROD)]).snapshot(),
                          1000.0))
    assert out.preempted == {"hi": ("low-h",)}  # the a100 gang frees nothing of the h100 quota


def test_a_team_reclaims_the_flavor_quota_it_lent():
    """b lends its 8 h100 GPUs; a (within its team quota of 64) borrows them on h100. When b submits, a's h100
    borrowing is reclaimed though a is within its team quota: a holds more than its h100 nominal."""
    teams = [fteam("a", gpu=64, h100=(8, 8)), fteam("b", gpu=64, h100=8)]
    runs = [running(job("a-own", types=["h100"]), ["h1"], since=0), running(job("a-lent", types=["h100"]), ["h2"],
                                                                             since=1)]
    st = make_state(NODES, teams, runs, pending=[job("b1", t="b", types=["h100"], at=5)])
    out = summarize(cycle(st.snapshot(), 1000.0))
    assert len(out.preempted.get("b1", ())) == 1
    # b's own quota could not be reclaimed the other way: a's gang waits.
    runs_b = [running(job("b-own", t="b", types=["h100"]), ["h1"]), running(job("x", t="b", types=["a100"]), ["a1"])]
    st = make_state(NODES, teams, runs_b, pending=[job("a1", types=["h100"], at=5)])
    out = summarize(cycle(st.snapshot(), 1000.0))
    assert out.admitted == {"a1": ("h2",)} and out.preempted == {}


# -- submit and policy check --------------------------------------------------------------------------------------

def test_submit_refuses_a_gang_no_flavor_quota_could_hold():
    teams = {"a": fteam("a", gpu=64, h100=(8, 0), a100=(4, 0))}
    why = check_feasible(job("w", gpus=16, types=["h100", "a100"]), NODES + [n("h3", "h100", 16)], teams)
    assert why is not None and why.field == "gang.node_types" and "flavor quotas" in why.detail
    assert check_feasible(job("w", gpus=8, types=["h100", "a100"]), NODES, teams) is None
    # With no types named, an unlimited type is somewhere to go.
    assert check_feasible(job("w", gpus=8, workers=2), NODES + [n("l1", "l4", 16)], teams) is None
    why = check_feasible(job("w", gpus=8, workers=2), NODES, teams)
    assert why is not None and why.field == "gang" and "a100, h100" in why.detail


def test_restrict_keeps_the_preference_order_of_the_types_left():
    led = QuotaLedger({"a": fteam("a", h100=(0, 0))}, {})
    w, why = restrict((led,), job("w", types=["h100", "l4", "a100"]), 8.0, ())
    assert why is None and w.gang.node_types == ("l4", "a100")
    w, why = restrict((led,), job("w"), 8.0, ("a100", "h100"))
    assert why is None and w.gang.avoid_types == frozenset({"h100"})


def test_flavor_errors_name_each_unknown_node_type():
    bad = flavor_errors({"a": fteam("a", h200=8, a100=8)}, {"a100", "l4", ""})
    assert bad == (("a", "h200", "a node type of the cluster: a100, l4"),)


# -- scale-up demand ----------------------------------------------------------------------------------------------

def _group(name, node_type, price):
    return ScaleGroup(name, Resources(8, 64, 512), 0, 4, node_type, frozenset(), {}, price, False, 180.0)


def _wait(w, pos=0):
    return Pending(w, NoCapacity(1, w.gang.per_worker, None, Resources(), Resources()), pos)


def test_scale_up_asks_only_for_node_types_the_flavor_quota_has_room_for():
    groups = (_group("a100", "a100", 2.0), _group("h100", "h100", 3.0))
    pend = tuple(_wait(job(f"w{i}"), i) for i in range(3))
    # a may take 8 more a100 GPUs and 8 h100: the cheapest type first, then the other, then nothing.
    d = compute_demand(ScaleSnapshot(pend, groups, flavor_room=(("a", "a100", 8.0), ("a", "h100", 8.0))))
    assert [r.group for r in d.requests] == ["a100", "h100"]
    why = d.reason("w2")
    assert isinstance(why, FlavorQuotaFull) and dict(why.room) == {"a100": 0.0, "h100": 0.0}
    assert "flavor quotas have no room" in str(why)
    # Without flavor quotas: all three get nodes.
    assert len(compute_demand(ScaleSnapshot(pend, groups)).requests) == 3


def test_a_type_scale_up_could_add_keeps_a_gang_waiting_for_capacity_not_quota():
    """Every node that exists is of a type whose quota is full; a growable group could add h100 nodes, which the
    team's flavors do not limit: the gang waits for capacity (so scale-up asks for a node), not for quota."""
    st = make_state([n("a1", "a100")], [fteam("a", gpu=64, a100=(0, 0))], pending=[job("w")])
    assert isinstance(summarize(cycle(st.snapshot(), 0.0)).reason("w"), QuotaExceeded)
    snap = replace(st.snapshot(), growable_types=frozenset({"h100"}))
    assert isinstance(summarize(cycle(snap, 0.0)).reason("w"), NoCapacity)


def test_the_forecast_has_a_gang_whose_flavor_is_full_start_when_that_flavor_frees():
    """team a: 8 h100 GPUs. Its h100 gang runs until 1,000 s, an a100 one until 3,000 s; a pending h100 gang starts
    when the h100 one ends (its quota frees), though the other h100 node is free now."""
    from raylane.forecast import forecast

    teams = [fteam("a", gpu=64, h100=(8, 0))]
    runs = [running(replace(job("h", types=["h100"]), runtime_estimate_s=1000.0), ["h1"]),
            running(replace(job("x", types=["a100"]), runtime_estimate_s=3000.0), ["a1"])]
    st = make_state(NODES, teams, runs, pending=[job("w", types=["h100"], at=1)])
    eta = forecast(st, 0.0)["w"]
    assert eta.start == 1000.0
