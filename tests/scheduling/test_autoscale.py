"""Scale-up demand (raylane.scheduling.autoscale): which pending gangs ask for new nodes, of which group, and why the
others ask none; and what changes from one ask to the next.

Each case: pending gangs with the reason the cycle gave them, node groups, team spend; expected requests as
{workload: (group, new nodes)} and the reason of every gang that asks nothing. Pure: no Ray."""
from __future__ import annotations

import pytest

from raylane.cost import TeamBudget
from raylane.scheduling import (BehindHead, BlockedByReservation, NoCapacity, NotReached, Pending, QuotaExceeded,
                                Reserved, Resources, WaitingForPreemption)
from raylane.scheduling.autoscale import (Admitted, BudgetSpent, Demand, GroupRoom, GroupsAtMax, LeftQueue,
                                          NodeRequest, NoGroupFits, NotWaitingForCapacity, Replaced, ScaleGroup,
                                          ScaleSnapshot, TeamSpend, compute_demand, diff_requests, nodes_needed)

from .builders import obj, wl


def room(w) -> NoCapacity:
    """The reason the cycle gives a gang that finds no room (the figures do not matter to the demand)."""
    g = obj(w).gang
    return NoCapacity(g.workers, g.per_worker, None, Resources(), Resources())


def waits(w, position: int, reason=None) -> Pending:
    """``w`` pending at ``position``, for room unless ``reason`` says otherwise."""
    return Pending(obj(w), reason if reason is not None else room(w), position)


def group(name: str, gpus: float = 8, count: int = 0, max: int = 4, price=None, spot: bool = False,
          features=(), node_type=None, labels=None, cpus: float = 64, memory: float = 512) -> ScaleGroup:
    return ScaleGroup(name, Resources(gpus, cpus, memory), count, max, node_type or f"{name}-type",
                      frozenset(features), dict(labels or {}), price, spot, 180.0)


def spend(team: str, budget, spent) -> TeamSpend:
    return TeamSpend(team, budget, spent)


def demand(pending, groups, budgets=(), stop_share=0.9, previous=()) -> Demand:
    return compute_demand(ScaleSnapshot(tuple(pending), tuple(groups), tuple(budgets), stop_share, tuple(previous)))


def asked(d: Demand):
    return {r.workload: (r.group, r.nodes) for r in d.requests}


def why(d: Demand):
    return {w.workload: w.reason for w in d.withheld}


A100 = group("a100", gpus=8, max=4, price=2.0, features=("a100",))
H100 = group("h100", gpus=8, max=4, price=4.0, features=("h100",))
L4 = group("l4", gpus=4, max=8, price=0.5, features=("l4",))

big = wl("big").workers(2).gpus(8)
QUOTA = QuotaExceeded("nlp", "gpu", used=8, nominal=8, borrowable=0, needed=16)

CASES = [
    dict(name="a gang waiting for room asks for the nodes its workers fill",
         pending=[waits(big, 0)], groups=[A100],
         asked={"big": ("a100", 2)}, why={}),
    dict(name="the reserved head of the queue waits for room too",
         pending=[waits(big, 0, Reserved(500.0, room(big)))], groups=[A100],
         asked={"big": ("a100", 2)}, why={}),
    dict(name="a gang blocked by quota makes no demand",
         pending=[waits(big, 0, QUOTA)], groups=[A100],
         asked={}, why={"big": NotWaitingForCapacity(QUOTA)}),
    dict(name="waiting for preempted work, for its turn or for the scheduler makes no demand",
         pending=[waits(wl("p").gpus(8), 0, WaitingForPreemption(("v",))),
                  waits(wl("t").gpus(8), 1, BehindHead("head")),
                  waits(wl("b").gpus(8), 2, BlockedByReservation("head", 900.0)),
                  waits(wl("n").gpus(8), 3, NotReached())],
         groups=[A100], asked={},
         why={"p": NotWaitingForCapacity(WaitingForPreemption(("v",))),
              "t": NotWaitingForCapacity(BehindHead("head")),
              "b": NotWaitingForCapacity(BlockedByReservation("head", 900.0)),
              "n": NotWaitingForCapacity(NotReached())}),
    dict(name="shares of a GPU pack onto one new node",
         pending=[waits(wl("frac").workers(4).gpus(0.5), 0)], groups=[group("small", gpus=2, max=4)],
         asked={"frac": ("small", 1)}, why={}),
    dict(name="strict-spread takes one new node per worker",
         pending=[waits(wl("sp").workers(3).gpus(1).strategy("strict-spread"), 0)], groups=[A100],
         asked={"sp": ("a100", 3)}, why={}),
    dict(name="a gang needing a feature asks for the group that has it, though another is cheaper",
         pending=[waits(wl("h").gpus(8).features("h100"), 0)], groups=[A100, H100],
         asked={"h": ("h100", 1)}, why={}),
    dict(name="no group has the feature: no group can hold it",
         pending=[waits(wl("tpu").gpus(1).features("tpu"), 0)], groups=[A100, H100],
         asked={},
         why={"tpu": NoGroupFits(1, Resources(gpu=1), (("a100", "its nodes lack tpu"),
                                                       ("h100", "its nodes lack tpu")))}),
    dict(name="a worker larger than any node: no group can hold it",
         pending=[waits(wl("huge").gpus(16), 0)], groups=[A100],
         asked={},
         why={"huge": NoGroupFits(1, Resources(gpu=16), (
             ("a100", "a worker needs 16 GPU; a node has 8 GPU, 64 CPU, 512 GiB"),))}),
    dict(name="strict-pack larger than one node: no group can hold it",
         pending=[waits(wl("sp").workers(2).gpus(8).strategy("strict-pack"), 0)], groups=[A100],
         asked={},
         why={"sp": NoGroupFits(2, Resources(gpu=8), (("a100", "its nodes cannot hold the gang with placement "
                                                                "strict-pack"),))}),
    dict(name="a gang needing more nodes than a group's max can never be held by it",
         pending=[waits(wl("wide").workers(5).gpus(8), 0)], groups=[A100],
         asked={},
         why={"wide": NoGroupFits(5, Resources(gpu=8), (("a100", "needs 5 nodes, more than its max of 4"),))}),
]


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_which_gangs_make_demand(case):
    d = demand(case["pending"], case["groups"])
    assert asked(d) == case["asked"]
    assert why(d) == case["why"]


# ------------------------------------------------------------------------------------------------ which group

CHEAP_BIG = group("big8", gpus=8, max=4, price=2.0)       # 16 an hour per node
DEAR_SMALL = group("small4", gpus=4, max=8, price=3.0)    # 12 an hour per node
SPOT = group("spot8", gpus=8, max=4, price=1.0, spot=True)
ON_DEMAND = group("od8", gpus=8, max=4, price=2.0)

PREFER = [
    dict(name="cheapest per hour for the nodes it needs: one 4-GPU node beats one 8-GPU node",
         gang=wl("g").gpus(4), groups=[CHEAP_BIG, DEAR_SMALL], expect=("small4", 1)),
    dict(name="two 4-GPU nodes (24 an hour) cost more than one 8-GPU node (16)",
         gang=wl("g").workers(2).gpus(4), groups=[CHEAP_BIG, DEAR_SMALL], expect=("big8", 1)),
    dict(name="cost before node count: two 4-GPU nodes at 12 an hour beat one 8-GPU node at 16",
         gang=wl("g").workers(2).gpus(4), groups=[CHEAP_BIG, group("small4", gpus=4, price=1.5)],
         expect=("small4", 2)),
    dict(name="at an equal cost, fewer nodes (before the name)",
         gang=wl("g").workers(2).gpus(4), groups=[group("b8", gpus=8, price=1.5), group("a4", gpus=4, price=1.5)],
         expect=("b8", 1)),
    dict(name="only the group whose node holds a worker",
         gang=wl("g").gpus(8), groups=[CHEAP_BIG, DEAR_SMALL], expect=("big8", 1)),
    dict(name="spot and on-demand are both eligible: the cheaper spot group",
         gang=wl("g").gpus(8), groups=[ON_DEMAND, SPOT], expect=("spot8", 1)),
    dict(name="spot at its max: the on-demand group",
         gang=wl("g").gpus(8), groups=[ON_DEMAND, group("spot8", gpus=8, count=4, max=4, price=1.0, spot=True)],
         expect=("od8", 1)),
    dict(name="on-demand before spot at an equal price",
         gang=wl("g").gpus(8), groups=[group("s", gpus=8, price=2.0, spot=True), group("t", gpus=8, price=2.0)],
         expect=("t", 1)),
    dict(name="an unpriced group comes after the priced ones",
         gang=wl("g").gpus(8), groups=[group("free", gpus=8), group("paid", gpus=8, price=9.0)],
         expect=("paid", 1)),
    dict(name="equal groups: by name",
         gang=wl("g").gpus(8), groups=[group("b", gpus=8, price=2.0), group("a", gpus=8, price=2.0)],
         expect=("a", 1)),
    dict(name="the cheapest at its max: the next cheapest",
         gang=wl("g").gpus(4), groups=[CHEAP_BIG, group("small4", gpus=4, count=8, max=8, price=3.0)],
         expect=("big8", 1)),
]


@pytest.mark.parametrize("case", PREFER, ids=[c["name"] for c in PREFER])
def test_cheapest_eligible_group_is_preferred(case):
    d = demand([waits(case["gang"], 0)], case["groups"])
    assert asked(d) == {"g": case["expect"]}


def test_a_request_carries_bundles_nodes_cost_and_start_up():
    d = demand([waits(wl("g").team("cv").workers(3).gpus(4).cpus(2), 7)], [CHEAP_BIG])
    (r,) = d.requests
    per = Resources(gpu=4, cpu=2)
    assert r == NodeRequest("g", "cv", "big8", "big8-type", 2, (per,) * 3, (per.scale(2), per), False, 32.0, 180.0)
    assert r.position == 7
    assert d.nodes_by_group() == {"big8": 2}
    assert d.bundles_by_node_type() == {"big8-type": (per,) * 3}


def test_the_group_a_gang_had_is_kept_while_it_serves():
    """A request moved to another node type would waste the nodes already starting for it."""
    before = demand([waits(wl("g").gpus(4), 0)], [CHEAP_BIG])
    assert asked(before) == {"g": ("big8", 1)}
    # A cheaper group appears: the gang keeps big8.
    again = demand([waits(wl("g").gpus(4), 0)], [CHEAP_BIG, DEAR_SMALL], previous=before.requests)
    assert asked(again) == {"g": ("big8", 1)}
    # big8 has no headroom left: it moves to the cheapest that has.
    full = demand([waits(wl("g").gpus(4), 0)], [group("big8", gpus=8, count=4, max=4, price=2.0), DEAR_SMALL],
                  previous=before.requests)
    assert asked(full) == {"g": ("small4", 1)}


# ----------------------------------------------------------------------------------------------------- budgets

BUDGETS = [
    ("under the stop share", [spend("nlp", 1000.0, 500.0)], True, None),
    ("just under it", [spend("nlp", 1000.0, 899.0)], True, None),
    ("at the stop share", [spend("nlp", 1000.0, 900.0)], False, BudgetSpent("nlp", 900.0, 1000.0, 0.9)),
    ("over it", [spend("nlp", 1000.0, 920.0)], False, BudgetSpent("nlp", 920.0, 1000.0, 0.9)),
    ("over the whole budget", [spend("nlp", 1000.0, 1500.0)], False, BudgetSpent("nlp", 1500.0, 1000.0, 0.9)),
    ("a team with no budget", [spend("nlp", None, 1e9)], True, None),
    ("another team's budget spent", [spend("cv", 100.0, 100.0)], True, None),
    ("no spend known", [], True, None),
]


@pytest.mark.parametrize("name,budgets,makes_demand,reason", BUDGETS, ids=[b[0] for b in BUDGETS])
def test_budget_share_stops_scale_up(name, budgets, makes_demand, reason):
    d = demand([waits(wl("g").team("nlp").gpus(8), 0)], [group("g8")], budgets)
    assert (d.requests != ()) is makes_demand
    assert why(d).get("g") == reason


def test_budget_reason_gives_the_figures():
    reason = BudgetSpent("team-b", 920.0, 1000.0, 0.9)
    assert str(reason) == "team team-b's monthly budget is 92% spent (920 of 1000); the policy stops scale-up at 90%"


def test_budgets_come_from_cost_reports():
    b = TeamSpend.of(TeamBudget("nlp", 1000.0, 950.0, alert_share=0.8))
    assert b == TeamSpend("nlp", 1000.0, 950.0) and b.share == 0.95
    d = demand([waits(wl("g").team("nlp").gpus(8), 0)], [group("g8", gpus=8)], [b])
    assert why(d) == {"g": BudgetSpent("nlp", 950.0, 1000.0, 0.9)}


def test_the_stop_share_is_the_policys():
    budgets = [spend("nlp", 1000.0, 920.0)]
    assert asked(demand([waits(wl("g").gpus(8), 0)], [group("g8")], budgets, stop_share=0.95)) == {"g": ("g8", 1)}
    with pytest.raises(ValueError, match="stop_share"):
        ScaleSnapshot((), (), stop_share=0.0)


# ------------------------------------------------------------------------------------------------------ maxima


def test_requested_nodes_count_against_the_max_in_queue_order():
    g = group("g8", gpus=8, count=1, max=4)
    pending = [waits(wl("a").gpus(8), 0), waits(wl("b").workers(2).gpus(8), 1), waits(wl("c").workers(2).gpus(8), 2),
               waits(wl("d").gpus(8), 3)]
    d = demand(pending, [g])
    # a takes 1 (2 of 4), b takes 2 (4 of 4); c would need 2 more; d, though it would need only 1, finds none either.
    assert asked(d) == {"a": ("g8", 1), "b": ("g8", 2)}
    assert why(d) == {"c": GroupsAtMax((GroupRoom("g8", 1, 3, 4, 2),)),
                      "d": GroupsAtMax((GroupRoom("g8", 1, 3, 4, 1),))}


def test_a_gang_too_big_for_the_headroom_does_not_stop_a_smaller_one_behind_it():
    d = demand([waits(wl("wide").workers(3).gpus(8), 0), waits(wl("one").gpus(8), 1)], [group("g8", count=2, max=4)])
    assert asked(d) == {"one": ("g8", 1)}
    assert why(d) == {"wide": GroupsAtMax((GroupRoom("g8", 2, 0, 4, 3),))}


def test_a_fixed_group_is_at_its_max():
    fixed = group("fixed", gpus=8, count=2, max=2)
    d = demand([waits(wl("g").gpus(8), 0)], [fixed])
    assert why(d) == {"g": GroupsAtMax((GroupRoom("fixed", 2, 0, 2, 1),))}
    assert str(why(d)["g"]) == ("every node group that could hold it is at its maximum: fixed has 2 nodes and 0 "
                                "requested of max 2; this gang needs 1 more")


def test_at_max_lists_every_group_that_could_hold_it_in_preference_order():
    d = demand([waits(wl("g").gpus(8), 0)], [group("dear", count=1, max=1, price=5.0), group("cheap", count=3, max=3,
                                                                                               price=1.0)])
    assert why(d) == {"g": GroupsAtMax((GroupRoom("cheap", 3, 0, 3, 1), GroupRoom("dear", 1, 0, 1, 1)))}


# ------------------------------------------------------------------------------------------------- determinism


def test_output_order_is_queue_order_whatever_the_input_order():
    pending = [waits(wl("c").gpus(8), 2), waits(wl("a").gpus(8), 0), waits(wl("q").gpus(8), 1, QUOTA),
               waits(wl("b").gpus(8), 2)]
    groups = [group("y", price=1.0), group("x", price=1.0)]
    d = demand(pending, groups)
    assert [r.workload for r in d.requests] == ["a", "b", "c"]
    assert [w.workload for w in d.withheld] == ["q"]
    assert {r.group for r in d.requests} == {"x"}
    assert demand(list(reversed(pending)), list(reversed(groups))) == d


def test_nodes_needed_is_the_fewest_the_placement_accepts():
    g = group("g", gpus=8)
    assert nodes_needed(obj(wl("a").workers(3).gpus(4)).gang, g)[0] == 2
    assert nodes_needed(obj(wl("a").workers(4).gpus(1).strategy("strict-spread")).gang, g)[0] == 4
    # A group placement needs its label on the nodes: the group's labels are the new nodes' labels.
    grouped = obj(wl("a").workers(2).gpus(8).group_by("rack")).gang
    assert nodes_needed(grouped, g) is None
    assert nodes_needed(grouped, group("r", gpus=8, labels={"rack": "new"}))[0] == 2
    assert nodes_needed(obj(wl("a").workers(5).gpus(8)).gang, g) is None  # 5 nodes > max 4


# ------------------------------------------------------------------------------------------------- withdrawal


def _prev(*pending, groups=(CHEAP_BIG,)):
    return demand(pending, groups).requests


WITHDRAW = [
    dict(name="admitted", pending=[], admitted={"a"}, withdraw={"a": Admitted("a")}, add=set(), keep=set()),
    dict(name="cancelled: neither pending nor admitted", pending=[], admitted=set(),
         withdraw={"a": LeftQueue("a")}, add=set(), keep=set()),
    dict(name="no longer within budget", pending=[waits(wl("a").team("nlp").gpus(8), 0)], admitted=set(),
         budgets=[spend("nlp", 100.0, 95.0)],
         withdraw={"a": BudgetSpent("nlp", 95.0, 100.0, 0.9)}, add=set(), keep=set()),
    dict(name="now waits for quota", pending=[waits(wl("a").gpus(8), 0, QUOTA)], admitted=set(),
         withdraw={"a": NotWaitingForCapacity(QUOTA)}, add=set(), keep=set()),
    dict(name="the same ask is kept, though its queue position moved", pending=[waits(wl("a").gpus(8), 5)],
         admitted=set(), withdraw={}, add=set(), keep={"a"}),
    dict(name="a new gang is added", pending=[waits(wl("a").gpus(8), 0), waits(wl("b").gpus(8), 1)],
         admitted=set(), withdraw={}, add={"b"}, keep={"a"}),
]


@pytest.mark.parametrize("case", WITHDRAW, ids=[c["name"] for c in WITHDRAW])
def test_diff_withdraws_with_the_reason(case):
    previous = _prev(waits(wl("a").team("nlp").gpus(8), 0))
    current = demand(case["pending"], [CHEAP_BIG], case.get("budgets", ()), previous=previous)
    ch = diff_requests(previous, current, admitted=case["admitted"])
    assert {w.request.workload: w.reason for w in ch.withdraw} == case["withdraw"]
    assert {r.workload for r in ch.add} == case["add"]
    assert {r.workload for r in ch.keep} == case["keep"]
    assert bool(ch) is bool(case["withdraw"] or case["add"])


def test_a_changed_ask_is_withdrawn_and_added_again():
    previous = _prev(waits(wl("a").gpus(8), 0))
    current = demand([waits(wl("a").workers(2).gpus(8), 0)], [CHEAP_BIG], previous=previous)
    ch = diff_requests(previous, current)
    (w,) = ch.withdraw
    assert w.request.nodes == 1 and w.reason == Replaced(current.requests[0])
    assert [(r.workload, r.nodes) for r in ch.add] == [("a", 2)]
    assert ch.keep == ()


def test_withdrawals_are_in_queue_order():
    previous = _prev(waits(wl("b").gpus(8), 1), waits(wl("a").gpus(8), 0), waits(wl("c").gpus(8), 2))
    ch = diff_requests(tuple(reversed(previous)), demand([], [CHEAP_BIG]), admitted={"b"})
    assert [(w.request.workload, type(w.reason).__name__) for w in ch.withdraw] == [
        ("a", "LeftQueue"), ("b", "Admitted"), ("c", "LeftQueue")]
