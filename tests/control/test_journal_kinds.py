"""Journal kinds and workload states as enums (``raylane.control.journal.Kind``, ``raylane.control.records.State``):
the journal stores a kind's value whichever way it is named, a record ignores a kind an older release wrote but keeps
its note, and the narrower types (``EndState``, ``ReportKind``) and the lists kept outside the control package
(``raylane.cost.KINDS``, ``raylane.tracking.STATE_TO_STATUS``) agree with them. Pure: no Ray."""
from __future__ import annotations

import json
import sqlite3

import pytest

from raylane import cost, tracking
from raylane.control import ends
from raylane.control.api import EndState, Release, Report, ReportKind
from raylane.control.journal import Entry, Journal, Kind
from raylane.control.records import TERMINAL, Record, State
from raylane.errors import ValidationError


def rows(path):
    with sqlite3.connect(path) as db:
        return db.execute("SELECT kind, data FROM journal ORDER BY seq").fetchall()


def test_a_kind_is_stored_as_its_value_however_it_is_named(tmp_path):
    path = str(tmp_path / "j.db")
    j = Journal(path)
    live = j.append(Kind.FINISHED, "w", state=State.FAILED)
    j.append("finished", "w", state="FAILED")
    j.close()
    assert rows(path) == [("finished", json.dumps({"state": "FAILED"}))] * 2
    replayed = list(Journal(path).replay())
    # Live, the entry carries the member; read back, the text: both find the same step and compare equal.
    assert live.kind is Kind.FINISHED and [e.kind for e in replayed] == [Kind.FINISHED, Kind.FINISHED]
    assert [type(e.kind) for e in replayed] == [str, str]


def test_a_kind_no_reader_knows_is_refused_at_append(tmp_path):
    j = Journal(str(tmp_path / "j.db"))
    with pytest.raises(ValueError, match="'finsihed' is not a valid Kind"):
        j.append("finsihed", "w")
    j.close()


def test_a_kind_an_older_release_wrote_changes_no_record_but_keeps_its_note(tmp_path):
    path = str(tmp_path / "j.db")
    j = Journal(path)
    j.append(Kind.SUBMITTED, "w", spec={}, submit_time=0.0, owner="alice")
    j.append(Kind.ADMITTED, "w", placement=["n1"], pg_name="pg")
    j.close()
    with sqlite3.connect(path) as db:  # as an older release wrote it
        db.execute("INSERT INTO journal (ts, kind, workload_id, data) VALUES (5.0, 'retired', 'w', ?)",
                   (json.dumps({"state": "FAILED", "note": "from an older release"}),))
    rec = Record("w", {}, 0.0)
    for e in Journal(path).replay():
        rec.apply(e)
    assert rec.state is State.ADMITTED and rec.owner == "alice" and rec.placement == ("n1",)
    assert rec.events == [(5.0, "from an older release")]


@pytest.mark.parametrize("kind", [Kind.NODE, Kind.POLICY, Kind.PIPELINE, Kind.TOKEN, Kind.AUDIT])
def test_kinds_of_other_books_change_no_record(kind):
    rec = Record("w", {}, 0.0)
    rec.apply(Entry(1, 1.0, Kind.ADMITTED, "w", {"placement": ["n1"]}))
    before = rec.public()
    rec.apply(Entry(2, 2.0, kind, "w", {"state": "FAILED", "event": "finished", "placement": []}))
    assert rec.public() == before


def test_ends_by_kind():
    for kind, data, state in [(Kind.FINISHED, {}, State.SUCCEEDED), (Kind.FINISHED, {"state": "FAILED"}, State.FAILED),
                              (Kind.CANCELLED, {"state": "FAILED"}, State.CANCELLED),
                              (Kind.REJECTED, {"reason": "r"}, State.REJECTED)]:
        rec = Record("w", {}, 0.0)
        rec.apply(Entry(1, 7.0, kind.value, "w", data))
        assert rec.state is state and rec.state.terminal and rec.ended_at == 7.0, (kind, data)


def test_terminal_states_are_one_list():
    assert TERMINAL == {"SUCCEEDED", "FAILED", "CANCELLED", "REJECTED"}
    assert {s.value for s in State if s.terminal} == TERMINAL
    assert State.RUNNING.value not in TERMINAL and "RUNNING" not in TERMINAL and State.FAILED in TERMINAL


def test_a_release_reports_an_end_state_but_rejected():
    assert {e.value for e in EndState} == TERMINAL - {State.REJECTED.value}
    assert all(State(e).terminal for e in EndState)
    assert Release(workload_id="w", outcome="failed", state="CANCELLED").state is EndState.CANCELLED
    with pytest.raises(ValidationError, match="Input should be 'SUCCEEDED', 'FAILED' or 'CANCELLED'"):
        Release.parse({"workload_id": "w", "outcome": "failed", "state": "REJECTED"})


def test_a_report_is_journaled_as_a_kind():
    assert {k.value for k in ReportKind} <= {k.value for k in Kind}
    assert Kind(ReportKind.RUNNING) is Kind.RUNNING
    with pytest.raises(ValidationError, match="Input should be 'running' or 'event'"):
        Report.parse({"workload_id": "w", "kind": "admitted"})


def test_lists_kept_outside_the_control_package_agree_with_the_enums():
    # raylane.cost and raylane.tracking are imported by the control plane, so they write these out.
    assert set(cost.KINDS) <= {k.value for k in Kind} and set(cost.ENDS) <= set(cost.KINDS)
    assert set(tracking.STATE_TO_STATUS) == TERMINAL
    assert {s.value: status for s, status in ends._RUN_STATUS.items()} == tracking.STATE_TO_STATUS
