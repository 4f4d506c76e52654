"""Limits one tenant's calls put on the control plane, without Ray (issue 44, item 3): open admission waits are
bounded per credential, per workload and in all, each waiter woken on its own (``raylane.control.waits``); refusals
are coalesced into one audit row with a count and rate limited per caller (``raylane.control.gate.Refusals``), so a
flood of forged or refused calls grows the journal by a few rows, every refusal still typed and counted; ``raylane
audit`` shows the count. The clock is an argument everywhere."""
from __future__ import annotations

import asyncio
from typing import List

import pytest

from raylane import auth
from raylane.auth import ANONYMOUS
from raylane.cli.auth import audit_table
from raylane.control import gate as gate_mod
from raylane.control.gate import COALESCE_S, RATE_ROWS, RATE_S, UNAUTHENTICATED, AuditRow, Gate, Refusals
from raylane.control.journal import Journal, Kind
from raylane.control.waits import TooManyRequestsError, WaitLimits, Waits
from raylane.errors import (AuthenticationError, NotFoundError, PermissionDeniedError, RetryableError,
                            ValidationError)

T0 = 1_000_000.0
TEAMS = ("team-a", "team-b")
WORKLOADS = {"w-a": ("team-a", "alice"), "w-b": ("team-b", "bob")}


# ------------------------------------------------------------------------------------------------ waits

def test_too_many_requests_is_a_retryable_raylane_error():
    assert issubclass(TooManyRequestsError, RetryableError)


# name -> (limits, the (key, workload) waits opened in order, the index of the first refused, the bound it names)
WAIT_CASES = {
    "one credential's burst on its own workload": (WaitLimits(per_principal=8, per_workload=64, total=256),
                                                   [("alice", "w-a")] * 9, 8, "this credential has 8"),
    "many credentials on one workload": (WaitLimits(per_principal=8, per_workload=4, total=256),
                                         [(f"job{i}", "w-a") for i in range(5)], 4, "4 admission waits are open on w-a"),
    "the whole plane": (WaitLimits(per_principal=8, per_workload=64, total=3),
                        [(f"job{i}", f"w-{i}") for i in range(4)], 3, "3 admission waits are open on the control"),
    "authentication off: no bound per credential": (WaitLimits(per_principal=2, per_workload=64, total=256),
                                                    [(None, "w-a")] * 5, None, ""),
}


@pytest.mark.parametrize("name", list(WAIT_CASES))
def test_open_waits_are_bounded(name):
    limits, opens, refused_at, words = WAIT_CASES[name]
    w = Waits(limits)
    for i, (key, wid) in enumerate(opens):
        if i == refused_at:
            with pytest.raises(TooManyRequestsError, match=words):
                w.open(key, wid)
            break
        w.open(key, wid)
    else:
        assert refused_at is None
    assert w.total == (refused_at if refused_at is not None else len(opens))


def test_a_closed_wait_frees_its_place_and_closing_twice_is_harmless():
    w = Waits(WaitLimits(per_principal=1, per_workload=1, total=1))
    first = w.open("alice", "w-a")
    with pytest.raises(TooManyRequestsError):
        w.open("bob", "w-b")
    w.close(first)
    w.close(first)
    assert w.total == 0 and w.open_of("alice") == 0 and w.open_of(workload_id="w-a") == 0
    w.open("bob", "w-b")  # its place is free again


def test_the_default_bounds_leave_most_of_the_actors_slots_free():
    lim = WaitLimits()
    assert lim.total <= 300 and lim.per_workload <= lim.total and lim.per_principal <= lim.per_workload


def test_a_refused_identical_burst_costs_one_open_wait_per_place():
    """1,000 waits of one credential (issue 44): its bound's worth are open, the rest refused at once."""
    w = Waits()
    refused = 0
    for _ in range(1000):
        try:
            w.open("mallory", "w-a")
        except TooManyRequestsError:
            refused += 1
    assert w.total == WaitLimits().per_principal and refused == 1000 - WaitLimits().per_principal


def test_every_waiter_is_woken_and_one_finishing_does_not_put_the_others_back_to_sleep():
    """The shared event of before: the first waiter to time out cleared it, and a wake set just then was lost for
    the rest. Each waiter's own event: a short wait timing out touches nobody else's."""
    async def scenario():
        w = Waits()
        short = asyncio.ensure_future(w.wait("a", "w-a", 0.01))
        longs = [asyncio.ensure_future(w.wait(f"k{i}", "w-a", 5.0)) for i in range(3)]
        assert await short is False  # timed out, closed its own wait
        assert w.open_of(workload_id="w-a") == 3
        assert w.wake("w-a") == 3
        woke = await asyncio.wait_for(asyncio.gather(*longs), 2.0)
        assert woke == [True, True, True] and w.total == 0
        # A wake with nobody waiting is forgotten: a later wait waits for its own wake.
        assert w.wake("w-a") == 0
        assert await w.wait("a", "w-a", 0.01) is False

    asyncio.run(scenario())


def test_a_cancelled_wait_frees_its_place():
    async def scenario():
        w = Waits(WaitLimits(per_principal=1, per_workload=1, total=1))
        t = asyncio.ensure_future(w.wait("a", "w-a", 5.0))
        await asyncio.sleep(0)
        assert w.total == 1
        t.cancel()
        with pytest.raises(asyncio.CancelledError):
            await t
        assert w.total == 0

    asyncio.run(scenario())


def test_the_actor_waits_through_waits_and_audits_a_refusal():
    """The actor's wait path (read, not run: it needs Ray): one ``Waits``, a refusal recorded through the gate."""
    from pathlib import Path

    src = (Path(gate_mod.__file__).parent / "actor.py").read_text()
    body = src[src.index("    async def _wait_admission"):src.index("    # ----", src.index("    async def _wait_admission"))]
    assert "self.waits.wait(" in body and "TooManyRequestsError" in body and "gate.record(" in body
    assert "ev.clear()" not in src and "self.waits.wake(e.workload_id)" in src


# ------------------------------------------------------------------------------------------- refusals

@pytest.fixture
def journal(tmp_path):
    j = Journal(str(tmp_path / "state" / "journal.db"))
    yield j
    j.close()


@pytest.fixture
def gate(journal):
    return Gate(journal, teams=TEAMS)


@pytest.fixture
def people(gate):
    return {u: gate.add_token(user=u, teams=[t] if t else [], role=r, created_by="test", now=T0)
            for u, t, r in (("alice", "team-a", "member"), ("bob", "team-b", "member"), ("root", None, "operator"))}


def team_of(req):
    def find(wid):
        if wid not in WORKLOADS:
            raise NotFoundError(f"no workload {wid!r}")
        return WORKLOADS[wid]

    return gate_mod.target_team(req, find)


def audit_entries(journal: Journal) -> List:
    return list(journal.entries_of_kind(Kind.AUDIT))


def forged(tok: str, n: int = 0) -> str:
    tid, secret = auth.parse_token(tok)
    return f"rlt_{tid}_{'A' * 42}{'ABCDEFGH'[n % 8]}"


def refuse(gate, cred, call, args, now, error=(AuthenticationError, PermissionDeniedError, ValidationError)):
    with pytest.raises(error):
        gate.check(cred, call, args, team_of=team_of, now=now)


def test_two_thousand_forged_calls_journal_one_row_counted_2000(gate, journal, people):
    """Issue 44: 2,000 calls with a forged token were 2,000 audit rows (+3.4 MB). Now: one row with its count, and
    each call still answered with its typed refusal."""
    bad = forged(people["alice"])
    before = len(audit_entries(journal))
    for i in range(2000):
        refuse(gate, bad, "status", {"workload_id": "w-a"}, T0 + i * 0.01, AuthenticationError)
    assert len(audit_entries(journal)) - before == 1  # the repeats are still counting (their window is open)
    (row,) = [r for r in gate.audit(limit=10) if r["action"] == "status"]
    assert row["count"] == 2000 and row["outcome"] == "refused" and row["user"] is None
    assert row["token_id"] == auth.parse_token(bad)[0] and auth.parse_token(bad)[1] not in str(row)
    # The window closes: the next call through the gate journals the count.
    gate.check(people["root"], "status", {"workload_id": "w-a"}, team_of=team_of, now=T0 + COALESCE_S + 1)
    rows = audit_entries(journal)[before:]
    assert len(rows) == 2 and rows[1].data["count"] == 1999 and rows[1].data["repeats"] is True
    (row,) = [r for r in gate.audit(limit=10) if r["action"] == "status"]
    assert row["count"] == 2000 and row["last_ts"] == pytest.approx(T0 + 19.99)


# name -> (two refusals as (credential name, call, args), whether they share a row)
KINDS = {
    "the same refusal again": (("alice", "cancel", {"workload_id": "w-b"}), ("alice", "cancel", {"workload_id": "w-b"}),
                               True),
    "another target": (("alice", "cancel", {"workload_id": "w-b"}), ("alice", "cancel", {"workload_id": "w-c"}),
                       False),
    "another call": (("alice", "cancel", {"workload_id": "w-b"}), ("alice", "release", {"workload_id": "w-b"}),
                     False),
    "another caller": (("alice", "cancel", {"workload_id": "w-b"}), ("root", "cancel", {"workload_id": "w-c"}),
                       False),
    "another reason": (("alice", "status", {"workload_id": 5}), ("alice", "status", {"workload_id": []}), False),
}


@pytest.mark.parametrize("name", list(KINDS))
def test_only_identical_refusals_share_a_row(gate, journal, people, name):
    one, two, shared = KINDS[name]
    before = len(audit_entries(journal))
    for i, (who, call, args) in enumerate((one, two)):
        refuse(gate, people[who], call, args, T0 + i, (PermissionDeniedError, ValidationError, NotFoundError))
    added = len(audit_entries(journal)) - before
    rows = gate.audit(since=T0 - 1)[-2:] if not shared else gate.audit(since=T0 - 1)[-1:]
    if shared:
        assert added == 1 and rows[0]["count"] == 2
    else:
        assert added == 2 and [r["count"] for r in rows] == [1, 1]


def test_a_caller_past_the_rate_is_counted_in_one_row_and_others_are_not_affected(gate, journal, people):
    before = len(audit_entries(journal))
    for i in range(RATE_ROWS + 50):  # new kinds of refusal (other targets), all within RATE_S
        refuse(gate, people["alice"], "cancel", {"workload_id": f"w-x{i}"}, T0 + i * 0.01, Exception)
    added = audit_entries(journal)[before:]
    assert len(added) == RATE_ROWS + 1 and added[-1].data["action"] == "*"
    assert added[-1].data["reason"].startswith(f"rate limited: more than {RATE_ROWS} kinds of refusal")
    assert gate.refusals.limited == 50
    rows = gate.audit(user="alice")
    assert sum(r["count"] for r in rows) == RATE_ROWS + 50 and rows[-1]["count"] == 50
    # bob's refusal in the same second is journaled as usual.
    refuse(gate, people["bob"], "cancel", {"workload_id": "w-a"}, T0 + 1)
    assert audit_entries(journal)[-1].data["user"] == "bob"
    # Once RATE_S has passed, alice's new kinds of refusal are journaled one by one again.
    refuse(gate, people["alice"], "cancel", {"workload_id": "w-new"}, T0 + RATE_S + 1, Exception)
    assert audit_entries(journal)[-1].data["target"] == "w-new"


def test_forged_tokens_with_ever_new_ids_share_the_unauthenticated_rate(gate, journal):
    before = len(audit_entries(journal))
    for i in range(2000):
        tok = f"rlt_{i:012d}_{'A' * 43}"  # an id of the caller's choosing each time
        refuse(gate, tok, "status", {"workload_id": "w-a"}, T0 + i * 0.001, AuthenticationError)
    added = audit_entries(journal)[before:]
    assert len(added) == RATE_ROWS + 1 and added[-1].data["token_id"] is None
    assert "callers whose credential was refused" in added[-1].data["reason"]
    assert sum(r["count"] for r in gate.audit(limit=100000)) >= 2000


def test_a_refusal_from_the_actors_wait_path_coalesces_too(gate, journal, people):
    p = gate.authenticate(people["alice"], T0)
    before = len(audit_entries(journal))
    for i in range(500):
        gate.record(p, "wait_admission", "w-a", "refused", "TooManyRequestsError: ...", now=T0 + i * 0.01)
    assert len(audit_entries(journal)) - before == 1
    assert gate.audit(user="alice")[-1]["count"] == 500


def test_allowed_calls_are_not_coalesced_or_limited(gate, journal):
    before = len(audit_entries(journal))
    for i in range(100):
        gate.record(ANONYMOUS, "cancel", "w-a", "ok", now=T0)
    assert len(audit_entries(journal)) - before == 100


def test_counts_survive_a_restart_once_journaled_and_a_new_window_starts_after_it(tmp_path):
    path = str(tmp_path / "state" / "journal.db")
    j = Journal(path)
    g = Gate(j, teams=TEAMS)
    tok = g.add_token(user="alice", teams=["team-a"], role="member", created_by="test", now=T0)
    for i in range(30):
        refuse(g, tok, "cancel", {"workload_id": "w-b"}, T0 + i)
    g.check(tok, "status", {"workload_id": "w-a"}, team_of=team_of, now=T0 + COALESCE_S + 1)  # closes the window
    for i in range(5):  # a second window, still open when the actor dies: its repeats are lost, its first row kept
        refuse(g, tok, "cancel", {"workload_id": "w-b"}, T0 + COALESCE_S + 2 + i)
    j.close()
    j2 = Journal(path)
    try:
        g2 = Gate(j2, teams=TEAMS)
        for e in j2.replay():
            g2.apply(e)
        rows = [r for r in g2.audit() if r["action"] == "cancel"]
        assert [r["count"] for r in rows] == [30, 1]
        refuse(g2, tok, "cancel", {"workload_id": "w-b"}, T0 + COALESCE_S + 10)  # a new window after the restart
        assert [r["count"] for r in g2.audit() if r["action"] == "cancel"] == [30, 1, 1]
    finally:
        j2.close()


def test_refusals_is_pure_and_bounded():
    """``Refusals`` alone: events in, rows out; the journal of a long flood grows with windows, not calls."""
    r = Refusals(window_s=60, rate_rows=20, rate_s=10)
    rows = []
    for i in range(36_000):  # an hour of ten identical refusals a second
        row = AuditRow(T0 + i / 10, "@status", {"user": None, "token_id": "x", "action": "status",
                                                 "target": "w-a", "reason": "forged", "outcome": "refused"})
        rows += r.note(UNAUTHENTICATED, row, T0 + i / 10)
    rows += r.due(T0 + 3600 + 60)
    assert len(rows) == 2 * 60 and sum(x.data.get("count", 1) for x in rows) == 36_000


def test_the_audit_table_shows_the_count():
    from rich.console import Console

    rows = [{"ts": T0, "user": "alice", "role": "member", "token_id": "abc", "action": "cancel", "target": "w-b",
             "outcome": "refused", "reason": "not yours", "count": 2000},
            {"ts": T0, "user": "root", "role": "operator", "token_id": "def", "action": "cancel", "target": "w-b",
             "outcome": "ok", "reason": ""}]
    out = Console(width=200, record=True)
    out.print(audit_table(rows))
    text = out.export_text()
    assert "COUNT" in text and "2000" in text
    line = next(ln for ln in text.splitlines() if "root" in ln)
    assert " 1 " in line  # a row without a count is one call


def test_the_client_tries_a_refused_wait_again_within_its_timeout(monkeypatch):
    # The typed client: a wait refused for too many open ones is tried again a second later, and past the caller's
    # timeout the record is answered as it is (no error reaches the driver's wait loop).
    import raylane.control.client as client_mod

    calls = []

    class Fake(client_mod.ControlClient):
        def __init__(self):
            pass

        def _call(self, call, timeout=None, **args):
            calls.append((call, args.get("timeout_s")))
            if call == "wait_admission" and len(calls) < 3:
                raise TooManyRequestsError("wait_admission: refused: too many")
            return {"id": args["workload_id"], "state": "PENDING", "ready": call == "wait_admission"}

    monkeypatch.setattr(client_mod.time if hasattr(client_mod, "time") else __import__("time"), "sleep",
                        lambda s: None)
    view = Fake().wait_admission("w1", 30.0)
    assert [c for c, _ in calls] == ["wait_admission"] * 3 and view["ready"]
    calls.clear()

    class Never(Fake):
        def _call(self, call, timeout=None, **args):
            calls.append((call, args.get("timeout_s")))
            if call == "wait_admission":
                raise TooManyRequestsError("wait_admission: refused: too many")
            return {"id": args["workload_id"], "state": "PENDING", "ready": False}

    assert Never().wait_admission("w1", 0.5)["ready"] is False
    assert calls[-1][0] == "status"
