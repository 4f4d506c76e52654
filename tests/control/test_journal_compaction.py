"""Journal compaction (``raylane.control.archive``): ended workloads leave memory and the live tail for an archive,
audit entries are archived in chunks, both with a retention; a restart reads the snapshot and the live tail and
rebuilds the same state (records, tokens, nodes, pipelines, MLflow runs, the runtime model's predictions), and a
compaction that dies at any step loses nothing. What was archived is still read by explain, status, audit, cost and
``raylane sim --from-journal``. No Ray: the state machine on a fake clock (``tests/controltest.py``)."""
from __future__ import annotations

import pytest

from raylane.config.loader import load_policy_from_dict
from raylane.control import ends
from raylane.control.archive import Records
from raylane.control.journal import Journal
from raylane.errors import ValidationError
from raylane.sim.journal import trace_from_journal
from tests.controltest import Harness
from tests.raytest import local_policy, spec
from tests.pipelines.test_pipelines import undeclared_eval

DAY = 86400.0


def policy(**journal):
    data = local_policy()
    data["journal"] = {"compact_every": 10**9, "archive_after": "1h", **journal}
    return data


def finish(h, name, minutes, *, team="team-a", outcome="finished", run_id=None):
    wid = h.call("submit", spec=spec(name, team, "pretrain"))["id"]
    h.tick()
    h.call("report", workload_id=wid, kind="running", job_id=f"raysubmit_{wid}",
           **({"mlflow_run_id": run_id} if run_id else {}))
    h.clock.advance(minutes * 60)
    state = "SUCCEEDED" if outcome == "finished" else "FAILED"
    h.call("release", workload_id=wid, outcome=outcome, state=state, step=minutes)
    return wid


def history(h):
    """Ended workloads of a few names and lengths (what the runtime model learns), a cancelled and a rejected one,
    refused calls, a token, a pipeline, and two live workloads: one running, one pending."""
    ended = [finish(h, f"lm-{i % 3}", 5 + 7 * i, run_id=f"run{i}" if i % 2 else None) for i in range(9)]
    ended.append(finish(h, "lm-fail", 3, outcome="failed"))
    wid = h.call("submit", spec=spec("gone", "team-b", "pretrain"))["id"]
    h.call("cancel", workload_id=wid)
    ended.append(wid)
    for _ in range(3):  # refused: audited, never replayed
        with pytest.raises(ValidationError):
            h.call("status", workload_id=5)
    h.cs.gate.add_token(user="alice", teams=["team-a"], role="member", created_by="test")
    d = undeclared_eval()
    d["stages"]["eval"]["workload"]["runtime_estimate"] = "5m"
    h.call("pipeline_submit", spec=d, pipeline_id="pl-1", storage_path=h.path + ".out")
    running = h.call("submit", spec=spec("live", "team-a", "pretrain", gpu=2))["id"]
    h.tick()
    h.call("report", workload_id=running, kind="running", job_id="raysubmit_live", mlflow_run_id="liverun")
    pending = h.call("submit", spec=spec("wait", "team-a", "pretrain", gpu=2, workers=2))["id"]
    h.tick()
    h.clock.advance(2 * 3600)  # past archive_after for every ended one
    h.tick()
    for w in ended:  # the cancel's MLflow run, closed (what the actor reports): nothing left to do after its end
        if ends.pending(h.record(w)):
            h.run_closed(w, "test: its run is closed")
    return ended, [running, pending]


def probe(h):
    """What the runtime model predicts for a new lm-1 run (the forecast's history): its runtimes and basis."""
    from raylane.control.records import Record

    dist = h.cs.runtimes.predict(Record("probe", spec("lm-1", "team-a", "pretrain"), h.clock()))
    return [(b.level, b.key, b.runtimes) for b in dist.bases]


def state_of(h, ids):
    """Everything a restart must bring back, as plain data (after a tick: pending reasons are not journaled)."""
    h.tick()
    cs = h.cs
    return {
        "records": {w: cs.records.get(w).public() for w in ids},
        "tokens": cs.gate.token_list(True),
        "nodes": h.call("node_list"),
        "pipelines": {pid: (run.terminal, dict(run.stages)) for pid, run in cs.pipes.runs.items()},
        "runs": {w: cs.records.get(w).mlflow_run_id for w in ids},
        "predict": probe(h),
        "queue": h.call("queue"),
    }


def live_ids(h):
    return sorted(dict.keys(h.cs.records))


@pytest.fixture
def make(tmp_path):
    made = []

    def make_(path=None, **journal):
        h = Harness(path or str(tmp_path / f"journal-{len(made)}.db"), policy(**journal))
        made.append(h)
        return h

    yield make_
    for h in made:
        h.close()


def test_a_compaction_moves_ended_workloads_out_of_memory_and_a_restart_rebuilds_the_same_state(make):
    h = make()
    ended, live = history(h)
    ids = ended + live + [w for w in h.cs.pipes.runs["pl-1"].stages.values()]
    before = state_of(h, ids)
    explained = {w: [(e["kind"], e.get("note")) for e in h.call("explain", workload_id=w)["journal"]] for w in ended}
    audit = [(r["action"], r["outcome"], r["target"]) for r in h.call("audit", limit=100000)]
    cost = h.call("cost")
    sim = trace_from_journal(h.path, load_policy_from_dict(local_policy(), "p"))
    live_before = h.cs.journal.sizes()["live_entries"]

    assert h.cs.compactor.run() == len(ended)
    sizes = h.cs.journal.sizes()
    assert sizes["archived_workloads"] == len(ended) and sizes["audit_chunks"] >= 1
    assert sizes["live_entries"] < live_before / 2
    assert not set(ended) & set(live_ids(h)) and set(live) <= set(live_ids(h))
    assert state_of(h, ids) == before  # read back from the archive by id
    assert not set(ended) & set(h.cs.costs.ledger.workloads)  # the cost ledger forgot them too ...
    assert h.call("cost") == cost  # ... and reads them back from the archive for a report

    h.restart()
    assert not set(ended) & set(live_ids(h))
    assert state_of(h, ids) == before
    assert {w: [(e["kind"], e.get("note")) for e in h.call("explain", workload_id=w)["journal"]]
            for w in ended} == explained
    assert [(r["action"], r["outcome"], r["target"]) for r in h.call("audit", limit=100000)][:len(audit)] == audit
    assert h.call("cost") == cost
    again = trace_from_journal(h.path, load_policy_from_dict(local_policy(), "p"))
    assert [(j.id, j.submit, j.duration) for j in again.trace.jobs] == [(j.id, j.submit, j.duration)
                                                                        for j in sim.trace.jobs]


def test_without_a_usable_snapshot_the_runtime_model_is_learned_again_from_the_archive(make):
    h = make()
    ended, live = history(h)
    predicted = probe(h)
    h.cs.compactor.run()
    h.cs.journal._db.execute("DELETE FROM snapshot")  # as if written by a release whose format this one cannot read
    h.restart()
    assert probe(h) == predicted


def test_compaction_runs_on_its_own_every_compact_every_entries(make):
    h = make(compact_every=40)
    ended, live = history(h)
    for i in range(4):
        finish(h, f"more-{i}", 5)
    h.clock.advance(2 * 3600)
    for i in range(60):  # entries (audited refusals, each of its own kind) past compact_every: a commit compacts
        h.clock.advance(1)  # (a second apart: under the gate's rate of new kinds of refusal)
        with pytest.raises(ValidationError):
            h.call("status", workload_id=5 + i)
    assert h.cs.compactor.runs >= 1 and h.cs.journal.sizes()["archived_workloads"] >= len(ended)
    assert h.cs.journal.appended < 40 + 10


class Died(BaseException):
    """The process dies here (not an Exception: nothing catches it)."""


STEPS = ["_archive_workloads", "_archive_chunks", "_write_snapshots", "_expire"]


@pytest.mark.parametrize("step", STEPS + ["after_commit"])
def test_a_restart_after_a_compaction_died_at_any_step_loses_nothing(make, monkeypatch, step):
    h = make()
    ended, live = history(h)
    ids = ended + live + [w for w in h.cs.pipes.runs["pl-1"].stages.values()]
    before = state_of(h, ids)
    entries = sorted((e.seq, e.kind, e.workload_id) for e in h.cs.journal.history())

    def die(*a, **k):
        raise Died(step)

    if step == "after_commit":  # the journal is compacted; memory not yet
        monkeypatch.setattr(Records, "drop", die)
    else:
        monkeypatch.setattr(Journal, step, die)
    with pytest.raises(Died):
        h.cs.compactor.run()
    monkeypatch.undo()
    h.cs.journal._db.close()  # the process is gone: nothing more is written
    h.restart()  # the same host (its placement groups outlive the process) and clock
    assert state_of(h, ids) == before
    assert sorted((e.seq, e.kind, e.workload_id) for e in h.cs.journal.history()) == entries
    assert h.cs.journal.sizes()["archived_workloads"] == (len(ended) if step == "after_commit" else 0)
    h.cs.compactor.run()  # and the next compaction goes through
    h.restart()
    assert state_of(h, ids) == before


def test_a_compaction_that_fails_is_logged_and_leaves_the_journal_and_memory_as_they_were(make, monkeypatch):
    h = make(compact_every=1)
    h.cs.compactor.spec = lambda: h.cs.policy.journal.model_copy(update={"compact_every": 10**9})
    ended, live = history(h)
    h.cs.compactor.spec = lambda: h.cs.policy.journal.model_copy(update={"compact_every": 1})
    monkeypatch.setattr(Journal, "_write_snapshots", lambda *a: 1 / 0)
    h.call("queue")  # its commit compacts, which fails: the call is answered all the same
    assert set(ended) <= set(live_ids(h)) and h.cs.journal.sizes()["archived_workloads"] == 0


def test_archived_workloads_and_audit_entries_are_dropped_past_their_retention(make):
    h = make(retention="1d", audit_retention="2d")
    ended, live = history(h)
    h.cs.compactor.run()
    assert h.cs.journal.sizes()["archived_workloads"] == len(ended)
    # (identical refusals share a row, with their count)
    refused = sum(r.get("count", 1) for r in h.call("audit", limit=100000) if r["outcome"] == "refused")
    assert refused == 3
    h.clock.advance(1.5 * DAY)
    h.cs.compactor.run()
    assert h.cs.journal.sizes()["archived_workloads"] == 0 and h.cs.records.get(ended[0]) is None
    assert any(r["outcome"] == "refused" for r in h.call("audit", limit=100000))
    h.clock.advance(1 * DAY)
    h.cs.compactor.run()
    rows = h.call("audit", limit=100000)
    assert not any(r["outcome"] == "refused" for r in rows)
    assert all(r["ts"] >= h.clock() - 2 * DAY for r in rows)


def test_refused_calls_do_not_grow_the_live_tail(make):
    h = make(compact_every=50)
    for _ in range(400):
        with pytest.raises(ValidationError):
            h.call("status", workload_id=5)
    live_audit = [e for e in h.cs.journal.replay() if e.kind == "audit"]
    assert len(live_audit) < 50
    assert sum(r.get("count", 1) for r in h.call("audit", limit=100000) if r["outcome"] == "refused") >= 400


@pytest.mark.parametrize("field, value", [("retention", "-1d"), ("retention", 0), ("audit_retention", "soon"),
                                          ("compact_every", 0), ("archive_after", -5)])
def test_the_policy_refuses_a_bad_journal_setting_naming_it(field, value):
    data = local_policy()
    data["journal"] = {field: value}
    with pytest.raises(ValidationError) as info:
        load_policy_from_dict(data, "policy")
    assert [e[0] for e in info.value.errors] == [f"journal.{field}"]
    assert info.value.errors[0][1] == value


def test_the_policy_refuses_an_unknown_journal_key_and_defaults_to_ninety_days():
    data = local_policy()
    data["journal"] = {"retentoin": "30d"}
    with pytest.raises(ValidationError) as info:
        load_policy_from_dict(data, "policy")
    assert [e[0] for e in info.value.errors] == ["journal.retentoin"]
    assert load_policy_from_dict(local_policy(), "p").journal.retention == 90 * DAY


def test_tokens_dead_for_longer_than_the_retention_leave_the_journal(make):
    # Job tokens come one per job: those revoked or expired past the retention are forgotten by compaction, so that
    # a restart does not replay them; a live token, and the parent of a token still known, stay.
    from raylane.auth import ANONYMOUS

    h = make(retention="1d")
    gate = h.cs.gate
    auth = lambda tok: h.cs.gate.store.authenticate(tok, h.clock())  # noqa: E731  (the gate's check, auth on or off)
    id_of = lambda user: next(t.id for t in h.cs.gate.store.tokens.values() if t.user == user)  # noqa: E731
    live = gate.add_token(user="carol", teams=["team-a"], role="member", created_by="test")
    dead = [gate.add_token(user=f"u{i}", teams=["team-a"], role="member", created_by="test", ttl_s=60.0)
            for i in range(50)]
    gate.add_token(user="dan", teams=["team-a"], role="member", created_by="test")
    parent_id = id_of("dan")
    gate.revoke(parent_id, by=ANONYMOUS)
    child = gate.add_token(user="erin", teams=["team-a"], role="member", created_by="test", parent=parent_id)
    h.cs.journal.commit()
    rows = lambda: sum(1 for e in h.cs.journal.replay() if e.kind == "token")  # noqa: E731
    before = rows()
    h.clock.advance(0.5 * DAY)
    h.cs.compactor.run()
    assert rows() == before  # dead for less than the retention: kept
    h.clock.advance(1 * DAY)
    h.cs.compactor.run()
    assert rows() <= before - 50 and len(h.cs.gate.store.tokens) == 3
    h.restart()
    assert auth(live).user == "carol"
    for tok in dead[:3]:
        with pytest.raises(Exception):
            auth(tok)
    assert parent_id in h.cs.gate.store.tokens  # the parent of a token still known stays
    with pytest.raises(Exception):
        auth(child)  # its parent is revoked: so is it


def test_node_entries_leave_the_tail_with_a_snapshot_of_the_node_book(make):
    """A year of node churn and failing probes costs a restart nothing: a compaction moves the node book's entries
    to the node archive with a snapshot of the book and of the cost ledger's node presence; a restart loads the
    snapshot. Nodes lost before the retention are forgotten; history (cost, the simulator) still reads the rest."""
    from tests.controltest import node_id

    h = make(retention="30d")
    nodes = [h.host.add_node(f"churn-{i}", gpus=4, node_type="a100") for i in range(6)]
    h.tick()
    h.host.kill_node("churn-0")  # lost long ago: past the retention when compacted
    h.tick()
    h.clock.advance(40 * DAY)
    h.host.kill_node("churn-1")  # lost lately: kept
    h.tick()
    h.call("node_cordon", node=nodes[2][:10], reason="firmware")
    for _ in range(30):  # a flaky probe: every failure is journaled
        h.probed({nodes[3]: (False, "nvidia-smi timed out")})
        h.clock.advance(30)
    finish(h, "after", 5)
    h.clock.advance(2 * 3600)
    h.tick()
    before = {"live": h.call("node_list"), "all": h.call("node_list", include_lost=True)}
    cost = h.call("cost", since=h.clock() - 5 * DAY)
    node_rows = sum(1 for e in h.cs.journal.replay() if e.kind == "node")
    assert node_rows >= 40

    h.cs.compactor.run()
    assert not [e for e in h.cs.journal.replay() if e.kind == "node"]  # the tail holds none
    assert h.cs.journal.sizes()["node_chunks"] >= 1
    assert len(list(h.cs.journal.entries_of_kind("node"))) == node_rows  # history reads them
    h.restart()
    after = {"live": h.call("node_list"), "all": h.call("node_list", include_lost=True)}
    assert after["live"] == before["live"]
    assert [n["id"] for n in after["all"]] == [n["id"] for n in before["all"] if n["id"] != node_id("churn-0")]
    assert next(n for n in after["live"] if n["id"] == nodes[2])["state"] == "cordoned"
    assert h.call("cost", since=h.clock() - 5 * DAY) == cost
    # Entries after the snapshot apply on top of it; the next compaction carries them over.
    h.call("node_uncordon", node=nodes[2][:10])
    h.cs.compactor.run()
    h.restart()
    assert next(n for n in h.call("node_list") if n["id"] == nodes[2])["state"] == "ready"
    sim = trace_from_journal(h.path, load_policy_from_dict(local_policy(), "p"))
    assert {n.id for n in sim.nodes} >= set(nodes[2:])
    # Past the retention, the node archive's chunks expire; the snapshot still gives the simulator the nodes.
    h.clock.advance(40 * DAY)
    h.cs.compactor.run()
    assert h.cs.journal.sizes()["node_chunks"] <= 1  # only the chunk of the uncordon, a compaction ago
    sim = trace_from_journal(h.path, load_policy_from_dict(local_policy(), "p"))
    assert {n.id for n in sim.nodes} >= set(nodes[2:])
    assert all(n.capacity.gpu == 4 for n in sim.nodes if n.id in nodes[2:])
