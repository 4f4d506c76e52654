"""The control plane's gate: who is asking, whether they may, and the audit trail. Ray-free; the actor calls it.

It owns the token store (rebuilt from the journal's ``token`` entries: never a secret, only id, salt and digest),
the audit trail (``audit`` entries: principal, action, target, outcome, reason, time), and the views of a workload a
caller may see. ``check`` is the one place a call is authenticated and authorized; it journals every refusal
before raising it, so a refused call changes nothing but the audit trail.

Journal rows it writes: kind ``token`` (workload id ``@tokens``; data ``op``: created, rotated, revoked) and kind
``audit`` (workload id: the target workload, or ``@``+the call's name when there is none).

Views: every authenticated caller sees positions, reasons, states and sizes of all work (``summary``); a workload's
team and operators also see its spec, config, owner and journal (``full``).

Job scopes (``JobScope``): a job token is worth its one workload. Its first submit binds it to what it submitted
(journaled ``token`` entry, op ``bound``); from then on it may report on, release, wait for and cancel only that
workload (a pipeline: the pipeline and its stages), and submit nothing more, except a sweep's or a serving app's
driver, which submits further workloads of the same kind and team into the same scope. When the last workload of
its scope ends, the token is retired (op ``retired``): it expires ``AFTER_END_S`` later, the time its driver needs
to read its final record, and submits nothing in between. Words: *scope* (the workloads a job token may act on),
*bound* (a scope was made at its first submit), *retired* (its scope's work is over).

Refusals (``Refusals``): a refusal is answered at once, typed, and audited, but identical ones share a row. The
first refusal of a *kind* (same caller, call, target and reason) is journaled at once; the same refusal again within
``COALESCE_S`` of it is only counted, and when that window closes (found at the next call that reaches the gate,
or at a read of the trail, which adds the counts not journaled yet) one row carries the count of its repeats
(``count``, ``repeats: true``, ``first_ts``). A caller that makes more than ``RATE_ROWS`` new kinds of refusal in
``RATE_S`` (an attacker varying a forged token's id) is rate limited: the further new kinds of that window are
counted in one row (action ``*``, reason ``rate limited: ...``), not journaled one by one. The *caller* is the
token's id once authenticated, and ``@unauthenticated`` for every call whose credential was refused (its id is
the caller's choice, and Ray does not say where a call came from). So the journal grows with the kinds of refusal,
at most ``RATE_ROWS`` per ``RATE_S`` per caller, never with their number; what a crash or a kill of the actor loses
is the repeats counted in the windows still open (at most ``COALESCE_S`` of them; the first row of each is on disk).
``audit`` shows each kind's first row with the repeats of its window added (``count``).
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Deque, Dict, Iterable, List, Optional, Set, Tuple

from raylane import auth
from raylane.auth import ANONYMOUS, Action, Principal, Role, TokenRecord, TokenStore
from raylane.control import api
from raylane.control.journal import Entry, Journal, Kind
from raylane.errors import AuthenticationError, NotFoundError, PermissionDeniedError, RaylaneError, ValidationError

TOKENS = "@tokens"
# What every caller may see of any workload; the rest (spec, config, owner, journal, pins, checkpoints, job) only
# its team and operators.
SUMMARY_FIELDS = ("id", "team", "class", "kind", "state", "reason", "reason_data", "position", "submit_time",
                  "admitted_at", "ended_at", "preemptions", "restarts", "attempts", "outcome", "detail", "queued_since",
                  "step")
# How long a retired job token still authenticates after its scope's last workload ended: its driver reads its final
# record and closes its run; its workloads have ended, so nothing it may do in that time changes anything.
AFTER_END_S = 60.0
# The kinds whose driver submits more than one workload (a sweep's slots, a serving app's replica leases).
MULTI_SUBMIT_KINDS = ("tune", "serve")
# A script's job token (``JobToken.script``; raylane.script): it submits a workload for each fit() of the script, of
# these kinds and its first submit's team, and is retired once its workloads have ended and so has their Ray job.
SCRIPT_SCOPE = "script"
SCRIPT_KINDS = ("train", "tune")
# What a job token may do only on the workloads of its scope.
SCOPED_ACTIONS = (Action.CANCEL, Action.RELEASE, Action.REPORT, Action.READ)
# Identical refusals within this many seconds of the first share its audit row (Refusals).
COALESCE_S = 60.0
# More new kinds of refusal than RATE_ROWS from one caller within RATE_S: the rest of the window share one row.
RATE_ROWS = 20
RATE_S = 10.0
# The caller of a refusal whose credential was refused: one for all (a forged token's id is the caller's choice).
UNAUTHENTICATED = "@unauthenticated"
# The fields of an audit row that make two refusals the same kind (with the caller).
KIND_FIELDS = ("token_id", "user", "action", "target", "reason")


@dataclass(frozen=True)
class AuditRow:
    """An audit entry to journal: its time, its journal key (the target workload, or ``@`` + the call) and data."""

    ts: float
    key: str
    data: Dict[str, Any]


@dataclass
class _Window:
    """One kind of refusal, from its first (journaled) row: the repeats counted since, not journaled yet."""

    first: float
    last: float
    row: AuditRow
    repeats: int = 0

    def repeat_row(self) -> AuditRow:
        return AuditRow(self.last, self.row.key, {**self.row.data, "count": self.repeats, "repeats": True,
                                                 "first_ts": self.first})


class Refusals:
    """Which refusals are journaled (see the module docstring): events in (``note`` a refusal, ``due`` at a time),
    rows to journal out. Ray-free and clock-free: the gate passes ``now``."""

    def __init__(self, *, window_s: float = COALESCE_S, rate_rows: int = RATE_ROWS, rate_s: float = RATE_S):
        self.window_s, self.rate_rows, self.rate_s = window_s, rate_rows, rate_s
        # (caller, kind) -> its open window, oldest first (every window is window_s long: the first to close).
        self._open: Dict[Tuple, _Window] = {}
        self._recent: Dict[str, Deque[float]] = {}  # caller -> when its last new kinds were journaled
        self.limited = 0  # refusals counted in a rate-limited row, since this gate started

    def note(self, caller: str, row: AuditRow, now: float) -> List[AuditRow]:
        """A refusal by ``caller`` (its audit row ``row``): the rows to journal now, oldest first."""
        out = self.due(now)
        kind = (caller,) + tuple(row.data.get(k) for k in KIND_FIELDS)
        if self._repeat(kind, now):
            return out
        recent = self._recent.setdefault(caller, deque())
        while recent and recent[0] <= now - self.rate_s:
            recent.popleft()
        if len(recent) >= self.rate_rows:
            self.limited += 1
            if self._repeat((caller, "*"), now):
                return out
            d = row.data
            who = "callers whose credential was refused" if caller == UNAUTHENTICATED else "this caller"
            first = f"{d.get('action')} {d.get('target') or '-'}: {d.get('reason') or ''}"
            row = AuditRow(now, "@*", {**d, "action": "*", "target": None,
                                        **({"token_id": None} if caller == UNAUTHENTICATED else {}),
                                        "reason": f"rate limited: more than {self.rate_rows} kinds of refusal in "
                                                  f"{self.rate_s:g} s from {who}; those of the next "
                                                  f"{self.window_s:g} s are counted here, not journaled one by one "
                                                  f"(the first: {first[:300]})"})
            kind = (caller, "*")
        else:
            recent.append(now)
        self._open[kind] = _Window(now, now, row)
        out.append(row)
        return out

    def _repeat(self, kind: Tuple, now: float) -> bool:
        w = self._open.get(kind)
        if w is None:
            return False
        w.repeats += 1
        w.last = max(w.last, now)
        return True

    def due(self, now: float) -> List[AuditRow]:
        """The count rows of the windows closed by ``now`` (those with repeats), oldest first."""
        out = []
        while self._open:
            kind, w = next(iter(self._open.items()))
            if w.first + self.window_s > now:
                break
            del self._open[kind]
            if w.repeats:
                out.append(w.repeat_row())
        return out

    def pending(self) -> List[AuditRow]:
        """The count rows the open windows would journal now (what a reader of the trail adds)."""
        return [w.repeat_row() for w in self._open.values() if w.repeats]


@dataclass
class JobScope:
    """What one job token may act on: the workloads it submitted (a pipeline's id and its stages'), the team and
    kind of its first submit, and when its last workload ended (``retired``)."""

    token_id: str
    team: str
    kind: str
    members: Set[str] = field(default_factory=set)
    retired: Optional[float] = None

    def may_submit(self, team: Any, kind: Any) -> bool:
        if self.retired is not None or team != self.team:
            return False
        if self.kind == SCRIPT_SCOPE:
            return (kind or "train") in SCRIPT_KINDS
        return self.kind in MULTI_SUBMIT_KINDS and (kind or "train") == self.kind


class Gate:
    def __init__(self, journal: Journal, *, enabled: bool = True, teams: Iterable[str] = (),
                 clock: Callable[[], float] = time.time):
        self.journal = journal
        self.clock = clock  # token expiry and audit times (the control plane's injected clock)
        self.enabled = enabled
        self.teams = set(teams)
        self.store = TokenStore()
        self.scopes: Dict[str, JobScope] = {}  # job token id -> its scope (bound at its first submit)
        self._scope_of: Dict[str, str] = {}  # workload or pipeline id -> the job token whose scope holds it
        self.refusals = Refusals()

    # ------------------------------------------------------------------------------------------- tokens
    def apply(self, e: Entry) -> None:
        """Replay one ``token`` entry (the same code the live path uses)."""
        if e.kind != Kind.TOKEN:
            return
        d = e.data
        if d["op"] == "created":
            self.store.tokens[d["id"]] = TokenRecord(
                id=d["id"], user=d["user"], teams=tuple(d["teams"]), role=Role(d["role"]), salt=d["salt"],
                digest=d["digest"], created=e.ts, expires=d.get("expires"), created_by=d.get("created_by", ""),
                parent=d.get("parent"), note=d.get("note", ""), scope=d.get("scope", ""))
        elif d["op"] in ("revoked", "rotated"):
            rec = self.store.tokens.get(d["id"])
            if rec is not None and rec.revoked is None:
                rec.revoked = e.ts
        elif d["op"] == "bound":
            scope = self.scopes.setdefault(d["id"], JobScope(d["id"], d.get("team", ""),
                                                                  d.get("workload_kind") or "train"))
            for wid in d["workloads"]:
                scope.members.add(wid)
                self._scope_of[wid] = d["id"]
        elif d["op"] == "retired":
            scope, rec = self.scopes.get(d["id"]), self.store.tokens.get(d["id"])
            if scope is not None:
                scope.retired = e.ts
            if rec is not None:
                rec.expires = d["expires"] if rec.expires is None else min(rec.expires, d["expires"])

    def dead_tokens(self, before: float) -> List[str]:
        """Ids of the tokens that stopped working (revoked or expired) before ``before`` and are no other token's
        parent: what journal compaction may forget (an unknown token is refused as an expired one is)."""
        parents = {t.parent for t in self.store.tokens.values() if t.parent}
        out = []
        for tid, t in self.store.tokens.items():
            ends = [x for x in (t.revoked, t.expires) if x is not None]
            if ends and min(ends) < before and tid not in parents:
                out.append(tid)
        return out

    def forget_tokens(self, ids) -> None:
        """Drop tokens compaction removed from the journal (``dead_tokens``), and their job scopes."""
        for tid in ids:
            self.store.tokens.pop(tid, None)
            scope = self.scopes.pop(tid, None)
            if scope is not None:
                for wid in scope.members:
                    if self._scope_of.get(wid) == tid:
                        del self._scope_of[wid]

    def _token_entry(self, **data) -> None:
        self.apply(self.journal.append(Kind.TOKEN, TOKENS, **data))

    def add_token(self, *, user: str, teams, role, created_by: str, ttl_s: Optional[float] = None,
                  parent: Optional[str] = None, note: str = "", token: Optional[tuple] = None,
                  now: Optional[float] = None, scope: str = "") -> str:
        """Create a token and journal its digest; returns the token (its only copy). ``token``: a (token, id, salt,
        digest) made elsewhere (``bootstrap``)."""
        now = self.clock() if now is None else now
        user = auth.check_user(user)
        teams = auth.check_teams(teams, self.teams or None)
        role = auth.check_role(role)
        tok, tid, salt, dig = token or auth.new_token()
        self._token_entry(op="created", id=tid, user=user, teams=list(teams), role=role.value, salt=salt,
                          digest=dig, expires=(now + ttl_s) if ttl_s else None, created_by=created_by,
                          parent=parent, note=note, **({"scope": scope} if scope else {}))
        return tok

    def bootstrap(self, user: str, token_id: str, salt: str, digest: str) -> None:
        """The first operator token, whose digest the starter of the control plane passed in (its secret never
        reaches the actor). Idempotent: a restart with the same arguments adds nothing."""
        if token_id in self.store.tokens:
            return
        self._token_entry(op="created", id=token_id, user=auth.check_user(user), teams=[], role=Role.OPERATOR.value,
                          salt=salt, digest=digest, expires=None, created_by="bootstrap", parent=None,
                          note="created when the control plane started")

    def rotate(self, token_id: str, by: Principal) -> str:
        old = self._token(token_id)
        now = self.clock()
        if old.status(now) != "active":
            raise ValidationError("token rotate", [("token_id", token_id, f"an active token (this one is "
                                                                          f"{old.status(now)})")])
        ttl = (old.expires - old.created) if old.expires else None  # the same lifetime, from now
        tok = self.add_token(user=old.user, teams=old.teams, role=old.role, created_by=by.user, ttl_s=ttl,
                             parent=old.parent, note=f"rotated from {token_id}" + (f"; {old.note}" if old.note else ""))
        self._token_entry(op="rotated", id=token_id, by=by.user)
        return tok

    def revoke(self, token_id: str, by: Principal) -> Dict[str, Any]:
        rec = self._token(token_id)
        if rec.revoked is None:
            self._token_entry(op="revoked", id=token_id, by=by.user)
        return rec.public(self.clock())

    def _token(self, token_id: str) -> TokenRecord:
        rec = self.store.tokens.get(token_id)
        if rec is None:
            raise NotFoundError(f"no token {token_id!r}")
        return rec

    def token_list(self, include_revoked: bool) -> List[Dict[str, Any]]:
        now = self.clock()
        out = [t.public(now) for t in self.store.tokens.values()]
        return [t for t in out if include_revoked or t["status"] == "active"]

    # --------------------------------------------------------------------------------------------- check
    def authenticate(self, credential: Any, now: float) -> Principal:
        if not self.enabled:
            return ANONYMOUS
        return self.store.authenticate(credential, now)

    def check(self, credential: Any, call: Any, args: Any, *, team_of=None, now: Optional[float] = None):
        """(principal, request) for an allowed call. A refused one (bad arguments, bad credential, not allowed) is
        audited and raised. ``team_of(request) -> (team, owner)`` names the target's team and owner; it may raise
        ``NotFoundError``."""
        now = self.clock() if now is None else now
        self._journal_rows(self.refusals.due(now))
        principal: Optional[Principal] = None
        name = call if isinstance(call, str) and call in api.CALLS else "?"
        req = None
        try:
            req = api.parse(call, args)
            principal = self.authenticate(credential, now)
            if req.action is not None:
                team, owner = team_of(req) if team_of is not None else (None, None)
                auth.authorize(principal, req.action, team=team, owner=owner)
                if principal.job and self.enabled:
                    self._in_scope(principal, req, now)
            return principal, req
        except (AuthenticationError, PermissionDeniedError, ValidationError, NotFoundError) as exc:
            if principal is None and not isinstance(exc, AuthenticationError):
                try:  # a malformed call from a valid caller: the audit row names the caller
                    principal = self.authenticate(credential, now)
                except AuthenticationError:
                    pass
            self.record(principal, name, _target(req, args), "refused", str(exc), now=now,
                        credential=None if principal is not None else _token_id(credential))
            raise

    # --------------------------------------------------------------------------------------------- scopes
    def _in_scope(self, p: Principal, req: api.Request, now: float) -> None:
        """Raise ``PermissionDeniedError`` unless job token ``p`` may make ``req`` (see the module docstring). A
        pipeline's submit is bound here, its ids being the caller's; a workload's once it has its id (``bind``)."""
        scope = self.scopes.get(p.token_id)
        who = f"{p.user}'s job token {p.token_id}"
        if isinstance(req, api.Submit):
            spec = req.spec
            if scope is None:
                if isinstance(req, api.PipelineSubmit):
                    stages = spec.get("stages") if isinstance(spec.get("stages"), dict) else {}
                    self.bind(p, [req.pipeline_id] + [f"{req.pipeline_id}-{s}" for s in stages],
                              team=spec.get("team"), kind="pipeline", now=now)
                return
            if isinstance(req, api.PipelineSubmit) or not scope.may_submit(spec.get("team"), spec.get("kind")):
                done = "its workloads have ended" if scope.retired is not None else "it has submitted already"
                raise PermissionDeniedError(f"submit: refused for {who}: a job token submits once, for its own "
                                            f"job ({done}: {', '.join(sorted(scope.members)) or '-'})")
            return
        if req.action not in SCOPED_ACTIONS:
            return
        wid = getattr(req, "workload_id", None)
        if scope is None or wid not in scope.members:
            mine = ", ".join(sorted(scope.members)) if scope is not None else "nothing submitted yet"
            raise PermissionDeniedError(f"{req.action.value}: refused for {who}: a job token acts only on the "
                                        f"workload it submitted ({mine}), not on {wid}")

    def bind(self, p: Principal, workloads: List[str], *, team: Any, kind: Any,
             now: Optional[float] = None) -> None:
        """Journal that job token ``p``'s scope holds ``workloads`` (its first submit makes the scope). Anything
        but a job token: nothing to do."""
        if not (p.job and self.enabled):
            return
        rec = self.store.tokens.get(p.token_id)
        if rec is not None and rec.scope == SCRIPT_SCOPE and kind != "pipeline":
            kind = SCRIPT_SCOPE  # the scope's kind: what its further submits may be (SCRIPT_KINDS)
        self.apply(self.journal.append(Kind.TOKEN, TOKENS, ts=now, op="bound", id=p.token_id,
                                       workloads=list(workloads), team=team if isinstance(team, str) else "",
                                       workload_kind=kind if isinstance(kind, str) else "train"))

    def workload_ended(self, wid: str, now: float, live: Callable[[str], bool]) -> None:
        """A workload ended: once no workload of its job token's scope is ``live``, the token is retired (it expires
        ``AFTER_END_S`` from now). A workload no job token submitted: nothing to do."""
        tid = self._scope_of.get(wid)
        scope = self.scopes.get(tid) if tid is not None else None
        if scope is None or scope.retired is not None or any(live(w) for w in scope.members):
            return
        if scope.kind == SCRIPT_SCOPE:  # its script may fit() again: retired when its job ends (script_scopes)
            return
        self.retire(tid, now, f"{wid} ended: the job token's workloads are over")

    def retire(self, tid: str, now: float, reason: str) -> None:
        """Journal job token ``tid`` retired: it expires ``AFTER_END_S`` from now."""
        self.apply(self.journal.append(Kind.TOKEN, TOKENS, ts=now, op="retired", id=tid, expires=now + AFTER_END_S,
                                       reason=reason))

    def script_scopes(self) -> List[JobScope]:
        """The scopes of scripts' job tokens not retired: the control plane retires one once its workloads have
        ended and so has their Ray job (``ControlState._watch_jobs``)."""
        return [s for s in self.scopes.values() if s.kind == SCRIPT_SCOPE and s.retired is None]

    def record(self, principal: Optional[Principal], call: str, target: Optional[str], outcome: str,
               reason: str = "", *, now: Optional[float] = None, credential: Optional[str] = None) -> None:
        """One audit entry: who (user, role, token id, teams), what call, on what, with what outcome and why. A
        refusal goes through ``Refusals``: journaled, or counted on the row of an identical one."""
        p = principal
        data = dict(user=p.user if p else None, role=p.role.value if p else None,
                    token_id=p.token_id if p else credential, teams=list(p.teams) if p else [],
                    action=call, target=target, outcome=outcome, reason=reason[:1000])
        if outcome != "refused":
            self.journal.append(Kind.AUDIT, target or f"@{call}", ts=now, **data)
            return
        now = self.clock() if now is None else now
        caller = p.token_id if p else UNAUTHENTICATED
        self._journal_rows(self.refusals.note(caller, AuditRow(now, target or f"@{call}", data), now))

    def _journal_rows(self, rows: List[AuditRow]) -> None:
        for r in rows:
            self.journal.append(Kind.AUDIT, r.key, ts=r.ts, **r.data)

    def audit(self, *, since: Optional[float] = None, user: Optional[str] = None, team: Optional[str] = None,
              limit: int = 1000, teams_of=None) -> List[Dict[str, Any]]:
        """Audit entries, oldest first (the newest ``limit``), each with its ``count``: a refusal's row with the
        repeats of its window added (journaled or still counted here; ``last_ts``: the latest). ``team``: entries by
        a member of the team, or on one of its workloads (``teams_of(workload_id)``)."""
        rows: List[Dict[str, Any]] = []
        latest: Dict[Tuple, Dict[str, Any]] = {}  # a kind of refusal -> its newest first row read
        journaled = ((e.ts, e.data) for e in self.journal.entries_of_kind(Kind.AUDIT, since=since))
        counting = ((r.ts, r.data) for r in self.refusals.pending() if since is None or r.ts >= since)
        for ts, d in (*journaled, *counting):
            if user is not None and d.get("user") != user:
                continue
            if team is not None and team not in (d.get("teams") or []) and (
                    teams_of is None or teams_of(d.get("target")) != team):
                continue
            kind = tuple(d.get(k) for k in KIND_FIELDS)
            first = latest.get(kind) if d.get("repeats") else None
            if first is not None:
                first["count"] += d.get("count", 1)
                first["last_ts"] = max(first.get("last_ts", first["ts"]), ts)
                continue
            row = {"ts": ts, **d, "count": d.get("count", 1)}
            if d.get("outcome") == "refused" and not d.get("repeats"):
                latest[kind] = row
            rows.append(row)
        return rows[-limit:]

    # ---------------------------------------------------------------------------------------------- views
    def may_read(self, p: Principal, team: str) -> bool:
        return p.operator or team in p.teams

    def view(self, p: Principal, public: Dict[str, Any]) -> Dict[str, Any]:
        """A record as ``p`` may see it."""
        if self.may_read(p, public.get("team", "")):
            return public
        out = {k: public.get(k) for k in SUMMARY_FIELDS}
        out["redacted"] = True
        return out


def target_team(req: api.Request, find) -> tuple:
    """(team, owner) of a call's target: the spec's team for a submit (no owner yet), ``find(workload_id)`` for a
    call on a workload (it raises ``NotFoundError`` for an unknown one), (None, None) for a call on none."""
    if isinstance(req, api.Submit):
        team = req.spec.get("team")
        return (team if isinstance(team, str) else None), None
    if isinstance(req, api.Cost):  # the team whose spend is asked for, if one is named
        return req.team, None
    wid = getattr(req, "workload_id", None)  # target() may name something else (a node)
    return (None, None) if wid is None else find(wid)


def _target(req, args) -> Optional[str]:
    if req is not None:
        return req.target()
    wid = args.get("workload_id") if isinstance(args, dict) else None
    return wid if isinstance(wid, str) and len(wid) <= 160 else None


def _token_id(credential: Any) -> Optional[str]:
    """The id of a presented token, for the audit trail of a refusal (never the secret)."""
    try:
        return auth.parse_token(credential)[0]
    except RaylaneError:
        return None if credential in (None, "") else "malformed"
