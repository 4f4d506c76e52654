"""NodeBook (raylane.control.nodes), pure: node states from journal entries, probe and gang-failure quarantine,
Ray drain notices, and a replay that rebuilds the same book. Also the health policy section and the probes."""
import pytest

from raylane.control.journal import Journal
from raylane.control.nodes import NODES_ID, HealthRules, NodeBook, NodeState
from raylane.errors import ValidationError


class Book:
    """A NodeBook driven the way the control actor drives it: journal each event, then apply it."""

    def __init__(self, tmp_path, rules=HealthRules(probe_failures=2, gang_failures=3, gang_failure_window_s=100)):
        self.journal = Journal(str(tmp_path / "journal.db"))
        self.rules = rules
        self.book = NodeBook(rules)

    def event(self, node, event, **data):
        self.book.apply(self.journal.append("node", NODES_ID, node=node, event=event, **data))

    def apply_all(self, events):
        for ev in events:
            ev = dict(ev)
            self.event(ev.pop("node"), ev.pop("event"), **ev)
        return [e["event"] for e in events]

    def replayed(self):
        b = NodeBook(self.rules)
        for e in self.journal.replay():
            if e.kind == "node":
                b.apply(e)
        return b


def test_states_follow_the_events_and_only_ready_is_schedulable(tmp_path):
    b = Book(tmp_path)
    b.event("n1", "joined", node_type="a100", gpus=8, address="10.0.0.1")
    assert b.book.get("n1").state is NodeState.READY and b.book.schedulable("n1")
    for event, state in (("cordoned", "cordoned"), ("uncordoned", "ready"), ("draining", "draining"),
                         ("drained", "drained"), ("uncordoned", "ready"), ("quarantined", "quarantined")):
        b.event("n1", event, by="op", reason=f"r-{event}")
        st = b.book.get("n1")
        assert st.state.value == state and st.reason == f"r-{event}"
        assert b.book.schedulable("n1") is (state == "ready")
    assert [s.id for s in b.book.evicting()] == ["n1"]
    b.event("n1", "lost")
    # Lost is final: nothing brings a dead Ray node id back.
    b.event("n1", "uncordoned")
    b.event("n1", "joined")
    assert b.book.get("n1").state is NodeState.LOST
    assert b.book.get("n1").node_type == "a100" and b.book.get("n1").gpus == 8
    assert b.book.resolve("n") == [] and b.book.resolve("n", include_lost=True) == ["n1"]
    # A node the book has never seen is schedulable (it joins on the actor's next look).
    assert b.book.schedulable("n9")


def test_a_restart_keeps_a_cordon_and_replay_rebuilds_the_same_book(tmp_path):
    b = Book(tmp_path)
    b.event("n1", "joined", node_type="t4", gpus=2)
    b.event("n2", "joined", node_type="t4", gpus=2)
    b.event("n1", "cordoned", by="op", reason="firmware")
    b.event("n1", "joined")  # the actor restarted and saw it again
    b.apply_all(b.book.on_probe("n2", False, "disk full"))
    again = b.replayed()
    for nid in ("n1", "n2"):
        assert again.get(nid).public() == b.book.get(nid).public()
    assert again.get("n1").state is NodeState.CORDONED and again.get("n1").reason == "firmware"
    assert again.get("n2").probe_fails == 1


@pytest.mark.parametrize("results,expected_state,events", [
    ([(False, "x")], "ready", [["probe_failed"]]),
    ([(False, "x"), (False, "y")], "quarantined", [["probe_failed"], ["probe_failed", "quarantined"]]),
    ([(False, "x"), (True, "fine"), (False, "z")], "ready", [["probe_failed"], ["probe_ok"], ["probe_failed"]]),
    ([(True, "fine"), (True, "fine")], "ready", [[], []]),
    ([(False, "a"), (False, "b"), (False, "c")], "quarantined",
     [["probe_failed"], ["probe_failed", "quarantined"], ["probe_failed"]]),
])
def test_consecutive_probe_failures_quarantine(tmp_path, results, expected_state, events):
    b = Book(tmp_path)
    b.event("n1", "joined")
    got = [b.apply_all(b.book.on_probe("n1", ok, msg)) for ok, msg in results]
    assert got == events
    assert b.book.get("n1").state.value == expected_state
    if expected_state == "quarantined":
        assert "probe failed 2 times in a row" in b.book.get("n1").reason and b.book.get("n1").by == "health"


def test_probe_quarantine_off_and_probes_of_lost_nodes_ignored(tmp_path):
    b = Book(tmp_path, HealthRules(probe_failures=0))
    b.event("n1", "joined")
    for _ in range(5):
        b.apply_all(b.book.on_probe("n1", False, "bad"))
    assert b.book.get("n1").state is NodeState.READY and b.book.get("n1").probe_fails == 5
    b.event("n1", "lost")
    assert b.book.on_probe("n1", False, "bad") == [] and b.book.on_probe("n9", False, "bad") == []


def test_gang_failures_of_several_workloads_quarantine_one_workload_does_not(tmp_path):
    b = Book(tmp_path)
    for n in ("n1", "n2"):
        b.event(n, "joined")
    # One workload crashing again and again is its own bug.
    for t in range(5):
        b.apply_all(b.book.on_gang_failure(["n1", "n1"], "w1", now=t))
    assert b.book.get("n1").state is NodeState.READY
    # Gangs of three workloads failing on n1 within the window: n1 is suspect; n2 saw only one.
    b.apply_all(b.book.on_gang_failure(["n1"], "w2", now=10))
    events = b.apply_all(b.book.on_gang_failure(["n1", "n2"], "w3", now=11))
    assert events == ["gang_failed", "quarantined", "gang_failed"]
    st = b.book.get("n1")
    assert st.state is NodeState.QUARANTINED and "w1, w2, w3" in st.reason
    assert b.book.get("n2").state is NodeState.READY
    # Uncordon forgives the past: failures start counting again.
    b.event("n1", "uncordoned", by="op")
    assert b.book.get("n1").failures == []


def test_failures_outside_the_window_do_not_count(tmp_path):
    b = Book(tmp_path)  # window 100 s
    b.event("n1", "joined")
    ts = list(b.journal.replay())[-1].ts
    b.apply_all(b.book.on_gang_failure(["n1"], "w1", now=ts))
    b.apply_all(b.book.on_gang_failure(["n1"], "w2", now=ts))
    # judged 500 s later, the first two failures are outside the window
    assert [e["event"] for e in b.book.on_gang_failure(["n1"], "w3", now=ts + 500)] == ["gang_failed"]
    assert [e["event"] for e in b.book.on_gang_failure(["n1"], "w3", now=ts + 50)] == ["gang_failed", "quarantined"]


def test_ray_drain_notices(tmp_path):
    b = Book(tmp_path)
    for n in ("n1", "n2", "n3"):
        b.event(n, "joined")
    b.event("n3", "quarantined", reason="probe")
    events = b.book.on_ray_draining({"n1": 1_900_000_000_000, "n3": 0, "n9": 0})
    assert [(e["node"], e["event"], e["by"]) for e in events] == [("n1", "ray_draining", "ray")]
    assert "deadline 1900000000" in events[0]["reason"]
    b.apply_all(events)
    assert b.book.get("n1").state is NodeState.DRAINING
    assert b.book.on_ray_draining({"n1": 0}) == []  # once


def test_health_policy_errors_name_field_value_and_what_is_allowed():
    from raylane.config.loader import load_policy_from_dict
    from tests.raytest import local_policy

    p = local_policy()
    p["health"] = {"probe": "not a probe", "probe_interval": 0, "gang_failures": -1, "colour": "red"}
    with pytest.raises(ValidationError) as e:
        load_policy_from_dict(p, "policy")
    text = str(e.value)
    for needle in ("health.probe: got 'not a probe'; module:function", "health.probe_interval: got 0",
                   "health.gang_failures: got -1", "health.colour"):
        assert needle in text, text
    p["health"] = {"probe": "raylane.health:default_probe", "probe_interval": "10s", "probe_failures": 3}
    h = load_policy_from_dict(p, "policy").health
    assert (h.probe_interval, h.probe_failures, h.gang_failures) == (10.0, 3, 3)


def test_default_probe_reads_condition_files(tmp_path):
    from raylane.health import ProbeContext, ProbeFailed, condition_files, default_probe

    ctx = ProbeContext("abc123", str(tmp_path), declared_gpus=2)
    assert condition_files(ctx) is None
    assert "2 logical GPUs declared" in default_probe(ctx)  # no CUDA here
    (tmp_path / "other").write_text("not this node")
    assert condition_files(ctx) is None
    (tmp_path / "abc123").write_text("fan failure\n")
    with pytest.raises(ProbeFailed, match="fan failure"):
        default_probe(ctx)
    (tmp_path / "abc123").unlink()
    (tmp_path / "all").write_text("")
    with pytest.raises(ProbeFailed, match=r"\(empty\)"):
        default_probe(ctx)
