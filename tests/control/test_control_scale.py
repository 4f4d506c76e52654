"""Scale-up in the control plane, without Ray (``raylane.control.state_scale``): a ``ControlState`` with a cluster
file whose node group ``big`` (node type ``a100``, 8 GPUs a node) may grow from 0 to ``max`` nodes, driven by a fake
clock and host (``tests/controltest.py``). The nodes that exist are the Ray tests' two nodes of 2 GPUs (node type
``local``); a gang of 4 GPUs a worker fits none of them and only a new ``big`` node can hold it.

What is checked: such a gang is accepted at submit only where a group can grow for it; the request is journaled
before the ask goes out, with whole-node bundles selecting the node type; the pending reason says which node it
waits for, or why none is asked for (budget, maxima); the request is withdrawn, and the ask emptied, when the gang is
admitted on the new node or cancelled; the ask is renewed while it stands; a restart rebuilds the requests from the
journal and asks nothing twice.
"""
from __future__ import annotations

import time

import pytest

from raylane.control import effects as fx
from raylane.control.journal import Journal, Kind
from raylane.control.records import State
from raylane.control.state import ControlState
from raylane.control.state_nodes import NODE_TYPE_LABEL
from raylane.control.state_scale import EXPIRE_S, RENEW_S
from raylane.errors import InfeasibleError
from tests.controltest import Harness
from tests.raytest import local_policy, spec

NODES = (("gpu-a", {"gpus": 2, "features": ["gpu-sim", "nvlink"], "node_type": "local"}),
         ("gpu-b", {"gpus": 2, "features": ["gpu-sim", "ssd"], "node_type": "local"}))


def cluster(max_nodes: int = 2, startup: str = "3m") -> dict:
    return {"name": "scale-test", "nodes": [
        {"name": "gpu-a", "count": 1, "gpus": 2, "cpus": 4, "features": ["gpu-sim", "nvlink"], "node_type": "local"},
        {"name": "gpu-b", "count": 1, "gpus": 2, "cpus": 4, "features": ["gpu-sim", "ssd"], "node_type": "local"},
        {"name": "big", "min": 0, "max": max_nodes, "gpus": 8, "cpus": 16, "memory": 64, "features": ["gpu-sim"],
         "node_type": "a100", "price": 3.0, "startup": startup},
    ]}


def policy(**team_a) -> dict:
    p = local_policy()
    for t in ("team-a", "team-b"):
        p["teams"][t]["quotas"]["gpu"] = {"nominal": 16, "borrowing_limit": 0}
    p["teams"]["team-a"].update(team_a)
    p["prices"] = {"local": 2.5, "a100": 3.0}
    return p


class ScaleHarness(Harness):
    def __init__(self, path, policy, cluster, **kw):
        self.cluster = cluster
        super().__init__(path, policy, nodes=NODES, **kw)

    def _start(self) -> None:
        self.cs = ControlState(self.policy, Journal(self.path, batched=True), self.host, self.clock, 1.0, self.auth,
                               cluster=self.cluster)
        self.settle()


@pytest.fixture
def make(tmp_path):
    made = []

    def make_(pol=None, clu="default", **kw):
        h = ScaleHarness(str(tmp_path / f"journal-{len(made)}.db"), pol or policy(),
                         cluster() if clu == "default" else clu, **kw)
        made.append(h)
        return h

    yield make_
    for h in made:
        h.close()


def big(name: str, team: str = "team-a", workers: int = 1) -> dict:
    return spec(name, team, "pretrain", workers=workers, gpu=4, cpu=1)


def submit(h, s) -> str:
    return h.call("submit", spec=s)["id"]


def scale_entries(h, wid):
    return [d for k, d in h.journal(wid) if k == Kind.SCALE]


def asks(h):
    return h.take(fx.RequestNodes)


def test_a_gang_only_a_new_node_can_hold_is_refused_without_a_growable_group_and_accepted_with_one(make):
    fixed = make(clu=None)
    with pytest.raises(InfeasibleError, match="largest matching node"):
        submit(fixed, big("too-big"))
    h = make()
    wid = submit(h, big("waits-for-a100"))
    assert h.record(wid).state is State.PENDING


def test_the_request_is_journaled_and_asked_for_with_whole_node_bundles_selecting_the_node_type(make):
    h = make()
    wid = submit(h, big("two-workers", workers=3))  # 3 x 4 GPUs: two 8-GPU nodes (pack)
    asks(h)
    h.tick()
    [req] = scale_entries(h, wid)
    assert (req["event"], req["group"], req["node_type"], req["nodes"]) == ("requested", "big", "a100", 2)
    assert req["hourly_cost"] == pytest.approx(2 * 8 * 3.0)
    [ask] = asks(h)
    assert ask.bundles == ({"CPU": 16.0, "GPU": 8.0},) * 2
    assert ask.selectors == ({NODE_TYPE_LABEL: "a100"},) * 2 and ask.expire_s == EXPIRE_S
    at = time.strftime("%H:%M", time.localtime(h.clock()))
    reason = h.record(wid).reason
    assert reason.endswith(f"; waiting for 2 new big nodes (a100): requested {at}, typical start 3 min"), reason
    assert h.record(wid).reason_data["scale"].startswith("waiting for 2 new big nodes")


def test_the_ask_is_sent_again_only_when_it_changes_or_its_renewal_is_due(make):
    h = make()
    submit(h, big("one"))
    h.tick()
    assert len(asks(h)) == 1
    h.clock.advance(RENEW_S / 2)
    h.tick()
    assert asks(h) == []
    h.clock.advance(RENEW_S / 2)
    h.tick()
    [again] = asks(h)
    assert again.bundles == ({"CPU": 16.0, "GPU": 8.0},)
    submit(h, big("two"))
    h.tick()
    [more] = asks(h)
    assert more.bundles == ({"CPU": 16.0, "GPU": 8.0},) * 2


def test_admitted_on_the_new_node_the_request_is_withdrawn_and_the_ask_emptied(make):
    h = make()
    wid = submit(h, big("lands"))
    h.tick()
    asks(h)
    new = h.host.add_node("big-0", gpus=8, cpus=16, memory_gib=64, features=["gpu-sim"], node_type="a100")
    h.tick()
    rec = h.record(wid)
    assert rec.state is State.ADMITTED and rec.placement == (new,)
    assert [(d["event"], d.get("reason")) for d in scale_entries(h, wid)] == [
        ("requested", None), ("withdrawn", f"{wid} was admitted")]
    [ask] = asks(h)
    assert ask.bundles == () and ask.selectors == ()
    h.tick()
    assert asks(h) == []  # nothing to renew


def test_a_cancelled_gang_withdraws_its_request(make):
    h = make()
    wid = submit(h, big("changes-mind"))
    h.tick()
    asks(h)
    h.call("cancel", workload_id=wid)
    h.tick()
    assert scale_entries(h, wid)[-1]["reason"] == f"{wid} left the queue (cancelled)"
    assert asks(h)[0].bundles == ()


def test_a_group_at_its_maximum_asks_for_no_more_and_the_reason_says_so(make):
    h = make(clu=cluster(max_nodes=1))
    first = submit(h, big("first"))
    second = submit(h, big("second"))
    h.tick()
    assert [d["event"] for d in scale_entries(h, first)] == ["requested"]
    assert scale_entries(h, second) == []
    assert "no new node asked for: every node group that could hold it is at its maximum: big has 0 nodes and " \
           "1 requested of max 1; this gang needs 1 more" in h.record(second).reason
    [ask] = asks(h)
    assert len(ask.bundles) == 1


def test_a_team_past_its_budget_stop_share_gets_no_node_and_is_told_why(make):
    # team-a's budget is 200; 2 GPUs of node type local at 2.5 an hour for 36 h: 180 spent, 90%.
    h = make(pol=policy(budget=200))
    small = submit(h, spec("spends", "team-a", "pretrain", gpu=2, cpu=1))
    h.tick()
    h.call("report", workload_id=small, kind="running")
    h.clock.advance(36 * 3600)
    h.call("release", workload_id=small, outcome="finished", state="SUCCEEDED")
    wid = submit(h, big("over-budget"))
    h.tick()
    assert scale_entries(h, wid) == []
    assert h.record(wid).reason.endswith(
        "; no new node asked for: team team-a's monthly budget is 90% spent (180 of 200); the policy stops "
        "scale-up at 90%"), h.record(wid).reason
    # team-b has spent nothing: its gang asks.
    other = submit(h, big("in-budget", team="team-b"))
    h.tick()
    assert [d["event"] for d in scale_entries(h, other)] == ["requested"]


def test_a_restart_rebuilds_the_requests_from_the_journal_and_asks_nothing_twice(make):
    h = make()
    wid = submit(h, big("survives"))
    h.tick()
    asks(h)
    at = time.strftime("%H:%M", time.localtime(h.clock()))
    h.clock.advance(300)
    h.restart()
    assert set(h.cs.scale.requests) == {wid}
    h.tick()
    assert [d["event"] for d in scale_entries(h, wid)] == ["requested"]
    assert f"requested {at}" in h.record(wid).reason
    [ask] = asks(h)  # the new actor has sent nothing yet: it asks once
    assert ask.bundles == ({"CPU": 16.0, "GPU": 8.0},)


def test_a_gang_that_waits_for_quota_asks_for_nothing(make):
    pol = policy()
    pol["teams"]["team-a"]["quotas"]["gpu"] = {"nominal": 2, "borrowing_limit": 0}
    h = make(pol=pol)
    first = submit(h, spec("a-first", "team-a", "pretrain", gpu=2, cpu=1))
    h.tick()
    second = submit(h, spec("a-second", "team-a", "pretrain", gpu=2, cpu=1))  # room on gpu-b, none in the quota
    h.tick()
    assert h.record(first).state is State.ADMITTED and h.record(second).state is State.PENDING
    assert scale_entries(h, second) == [] and "scale" not in (h.record(second).reason_data or {})
    assert "new node" not in h.record(second).reason
    assert [a.bundles for a in asks(h)] == [()]  # an empty ask: nothing was ever asked for


@pytest.mark.parametrize("value", [0, -0.5, 11, "most"])
def test_a_bad_budget_stop_share_is_refused_naming_the_field_and_what_is_allowed(value):
    from raylane.config.loader import load_policy_from_dict
    from raylane.errors import ValidationError

    with pytest.raises(ValidationError) as info:
        load_policy_from_dict({**policy(), "budget_stop_share": value}, "policy")
    assert "budget_stop_share" in str(info.value) and "like 0.9" in str(info.value)


def test_a_bad_cluster_file_is_refused_when_the_control_plane_starts(tmp_path):
    from raylane.errors import ValidationError

    bad = cluster()
    bad["nodes"][2]["max"] = -1
    with pytest.raises(ValidationError, match=r"nodes\[2\]\.max: got -1"):
        ScaleHarness(str(tmp_path / "j.db"), policy(), bad)


# ---------------------------------------------------------------------------------------- wait_for_scale_up

def waiting_policy(wait: str = "5m") -> dict:
    p = policy()
    p["classes"]["finetune"]["wait_for_scale_up"] = wait
    return p


def fill_local_nodes(h):
    """Two pretrain gangs of team-a on the two local nodes; a finetune gang (a higher class) could preempt either."""
    low = [submit(h, spec(f"low-{i}", "team-a", "pretrain", gpu=2, cpu=1)) for i in range(2)]
    h.tick()
    h.clock.advance(60)  # past the pretrain class's min_runtime
    assert all(h.record(w).state is State.ADMITTED for w in low)
    return low


def test_a_higher_class_waits_for_a_new_node_and_is_admitted_on_it_with_nothing_preempted(make):
    h = make(pol=waiting_policy("5m"))
    low = fill_local_nodes(h)
    high = submit(h, spec("high", "team-a", "finetune", gpu=2, cpu=1))
    h.tick()
    assert [d["event"] for d in scale_entries(h, high)] == ["requested"]
    until = time.strftime("%H:%M:%S", time.localtime(h.clock() + 300))
    assert h.record(high).reason.endswith(f"; it preempts nobody before {until} (its class waits 5 min for scale-up)")
    for _ in range(4):
        h.clock.advance(60)
        h.tick()
        h.tick(full=False)
    assert h.record(high).state is State.PENDING
    assert all(h.record(w).state is State.ADMITTED for w in low)
    new = h.host.add_node("big-0", gpus=8, cpus=16, memory_gib=64, features=["gpu-sim"], node_type="a100")
    h.tick()
    assert h.record(high).state is State.ADMITTED and h.record(high).placement == (new,)
    assert all(h.record(w).state is State.ADMITTED for w in low)


def test_when_no_node_comes_in_time_the_higher_class_preempts_and_its_request_is_withdrawn(make):
    h = make(pol=waiting_policy("2m"))
    low = fill_local_nodes(h)
    high = submit(h, spec("high", "team-a", "finetune", gpu=2, cpu=1))
    h.tick(full=False)  # a cycle right after the submission: it waits already (no demand computed yet)
    assert all(h.record(w).state is State.ADMITTED for w in low)
    h.tick()
    h.clock.advance(121)
    h.tick()
    assert sum(h.record(w).state is not State.ADMITTED for w in low) == 1  # preempted (back in the queue)
    h.tick()
    last = scale_entries(h, high)[-1]
    assert last["event"] == "withdrawn" and "waits for preempted work to stop, not for capacity" in last["reason"]


def test_without_a_wait_the_higher_class_preempts_at_once_and_asks_for_nothing(make):
    h = make()
    low = fill_local_nodes(h)
    high = submit(h, spec("high", "team-a", "finetune", gpu=2, cpu=1))
    h.tick()
    assert sum(h.record(w).state is not State.ADMITTED for w in low) == 1  # preempted (back in the queue)
    assert scale_entries(h, high) == []


# ------------------------------------------------------------------------------------------ flavors and spot

def flavored(name, types, **kw) -> dict:
    s = spec(name, "team-a", "pretrain", gpu=2, cpu=1, **kw)
    s["gang"]["node_types"] = list(types)
    return s


def test_a_gang_naming_node_types_is_admitted_on_the_first_with_room_and_the_choice_is_journaled(make):
    h = make()
    first = submit(h, flavored("prefers-a100", ["a100", "local"]))
    h.tick()
    rec = h.record(first)
    assert rec.state is State.ADMITTED  # no a100 node yet: on its second choice, now
    [admitted] = [d for k, d in h.journal(first) if k == Kind.ADMITTED]
    assert (admitted["node_type"], admitted["spot"]) == ("local", False)
    assert admitted["note"].endswith(": on on-demand local nodes, choice 2 of a100, local (no room on a100 now)")
    assert any("choice 2 of a100, local" in note for _, note in h.call("explain", workload_id=first)["events"])
    h.host.add_node("big-0", gpus=8, cpus=16, memory_gib=64, features=["gpu-sim"], node_type="a100")
    h.tick()
    second = submit(h, flavored("now-a100", ["a100", "local"]))
    h.tick()
    [admitted] = [d for k, d in h.journal(second) if k == Kind.ADMITTED]
    assert admitted["node_type"] == "a100" and "its first choice of a100, local" in admitted["note"]


def test_a_gang_naming_only_node_types_no_node_or_group_has_is_refused_at_submit(make):
    h = make()
    with pytest.raises(InfeasibleError, match="no node of node type h100; the node types there are: a100, local"):
        submit(h, flavored("wants-h100", ["h100"]))


@pytest.mark.parametrize("bad,field,text", [
    ({"gang": {"node_types": ["a100", "a100"]}}, "gang.node_types", "named twice: a100"),
    ({"gang": {"node_types": ["A 100"]}}, "gang.node_types[0]: got 'A 100'", "lowercase letters"),
])
def test_bad_node_types_are_refused_naming_the_field(bad, field, text):
    from raylane.config.loader import load_spec_from_dict
    from raylane.config.loader import load_policy_from_dict
    from raylane.errors import ValidationError

    s = spec("x", "team-a", "pretrain", gpu=2)
    s["gang"].update(bad["gang"])
    with pytest.raises(ValidationError) as info:
        load_spec_from_dict(s, "spec", policy=load_policy_from_dict(policy(), "policy"))
    assert field in str(info.value) and text in str(info.value)


def test_a_bad_class_spot_value_is_refused_naming_the_field():
    from raylane.config.loader import load_policy_from_dict
    from raylane.errors import ValidationError

    p = policy()
    p["classes"]["sweep"]["spot"] = "sometimes"
    with pytest.raises(ValidationError) as info:
        load_policy_from_dict(p, "policy")
    assert "classes.sweep.spot" in str(info.value) and "'never', 'allow' or 'prefer'" in str(info.value)


def test_a_reclaimed_spot_nodes_gang_is_requeued_and_a_node_is_asked_for_it_again(make):
    """A spot node the cloud takes back: Ray's drain notice stops its gang (it yields with a checkpoint), the node
    goes, and the gang, waiting for capacity again, gets a new node of the group asked for."""
    clu = cluster()
    clu["nodes"][2]["spot"] = True
    h = make(pol=policy(), clu=clu)
    spot = h.host.add_node("big-0", gpus=8, cpus=16, memory_gib=64, features=["gpu-sim"], node_type="a100")
    h.host.ray_nodes[spot]["Labels"]["raylane.io/spot"] = "true"
    wid = submit(h, big("on-spot"))
    h.tick()
    assert h.record(wid).placement == (spot,)
    joined = [e.data for e in h.cs.journal.entries_for("@nodes") if e.data["node"] == spot][0]
    assert joined["spot"] is True
    h.call("report", workload_id=wid, kind="running")
    asks(h)
    h.host.drains[spot] = int((h.clock() + 120) * 1000)  # the cloud's two minutes' notice
    h.tick()
    assert h.record(wid).state is State.PREEMPTING
    h.call("release", workload_id=wid, outcome="yielded", step=42)
    h.host.kill_node("big-0")
    h.tick()
    assert h.record(wid).state is State.PENDING
    assert [d["event"] for d in scale_entries(h, wid)] == ["requested"]
    [ask] = [a for a in asks(h) if a.bundles]
    assert ask.bundles == ({"CPU": 16.0, "GPU": 8.0},) and ask.selectors == ({NODE_TYPE_LABEL: "a100"},)
    assert "waiting for 1 new big spot node (a100)" in h.record(wid).reason
