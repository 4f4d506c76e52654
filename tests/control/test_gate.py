"""The control plane's gate without Ray (``raylane.auth``, ``raylane.control.gate`` over a real sqlite journal): API
tokens and every way one is refused, how they are stored, the authorization rules as a table of named cases, the
audit trail of every refusal and its survival across a restart, and a seeded fuzz of malformed calls, each refused
with a ``ValidationError`` that names the field.

The clock is an argument: tokens are created at ``T0`` and checked at ``T0 + seconds``.
"""
from __future__ import annotations

import json
import os
import random
import string
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import pytest

from raylane import auth
from raylane.auth import ANONYMOUS, Action, Principal, Role
from raylane.control import api
from raylane.control import gate as gate_mod
from raylane.control.gate import SUMMARY_FIELDS, Gate
from raylane.control.journal import Journal
from raylane.errors import AuthenticationError, NotFoundError, PermissionDeniedError, ValidationError

TEAMS = ("team-a", "team-b")
T0 = 1_000_000.0
# The workloads the calls of these tests target: id -> (team, owner). What the actor's ``_team_of`` reads.
WORKLOADS = {"w-alice": ("team-a", "alice"), "w-erin": ("team-a", "erin"), "w-bob": ("team-b", "bob")}


@pytest.fixture
def journal(tmp_path):
    j = Journal(str(tmp_path / "state" / "journal.db"))
    yield j
    j.close()


@pytest.fixture
def gate(journal):
    return Gate(journal, teams=TEAMS)


def issue(gate: Gate, user: str, teams=(), role: str = "member", **kw) -> str:
    """A token for ``user``, created at ``T0`` (its only copy)."""
    return gate.add_token(user=user, teams=list(teams), role=role, created_by="test", now=T0, **kw)


def token_id(token: str) -> str:
    return auth.parse_token(token)[0]


def secret_of(token: str) -> str:
    return auth.parse_token(token)[1]


def well_formed(token: Any) -> bool:
    try:
        auth.parse_token(token)
    except AuthenticationError:
        return False
    return True


def team_of(req: api.Request) -> Tuple[Optional[str], Optional[str]]:
    """(team, owner) of a call's target, as the control actor answers it (the same ``target_team``)."""
    def find(wid):
        if wid not in WORKLOADS:
            raise NotFoundError(f"no workload {wid!r}")
        return WORKLOADS[wid]

    return gate_mod.target_team(req, find)


def audit_rows(gate: Gate) -> List[Dict[str, Any]]:
    return gate.audit(limit=100000)


def entries(journal: Journal) -> List[Tuple[str, str]]:
    return [(e.kind, e.workload_id) for e in journal.replay()]


# ------------------------------------------------------------------------------------------------ tokens


def test_a_token_is_shown_once_in_its_documented_form_and_authenticates_as_its_principal(gate):
    tok = issue(gate, "alice", ["team-a"], "member")
    tid, secret = auth.parse_token(tok)
    assert tok == f"rlt_{tid}_{secret}" and len(tid) == 12 and len(secret) == 43
    p = gate.authenticate(tok, T0 + 1)
    assert p == Principal("alice", ("team-a",), Role.MEMBER, tid, job=False)
    assert not p.operator and "alice (member, token " in p.label()
    # Two tokens of one user are two random tokens.
    other = issue(gate, "alice", ["team-a"], "member")
    assert other != tok and token_id(other) != tid and secret_of(other) != secret
    listed = {t["id"]: t for t in gate.token_list(include_revoked=False)}
    assert listed[tid]["user"] == "alice" and listed[tid]["status"] == "active"
    assert not any(secret in json.dumps(t) for t in listed.values())


def test_a_token_with_surrounding_whitespace_is_the_same_token(gate):
    tok = issue(gate, "alice", ["team-a"])
    assert gate.authenticate(f"  {tok}\n", T0).user == "alice"  # as read from a credentials file


def _forged(tok: str) -> str:
    tid, secret = auth.parse_token(tok)
    flipped = ("A" if secret[0] != "A" else "B") + secret[1:]
    return f"rlt_{tid}_{flipped}"


# name -> (how to make the presented credential from (gate, alice's token, ...), when, what the refusal says)
REFUSED = {
    "missing (None)": (lambda g, t: None, T0, "no credential"),
    "missing (empty)": (lambda g, t: "", T0, "no credential"),
    "not a string": (lambda g, t: 12345, T0, "got a int"),
    "bytes": (lambda g, t: t.encode(), T0, "got a bytes"),
    "malformed: no prefix": (lambda g, t: t[4:], T0, "malformed token"),
    "malformed: truncated": (lambda g, t: t[:-1], T0, "malformed token"),
    "malformed: a character too many": (lambda g, t: t + "x", T0, "malformed token"),
    "malformed: a password": (lambda g, t: "hunter2", T0, "malformed token"),
    "malformed: upper-case id": (lambda g, t: "rlt_A" + token_id(t)[1:] + "_" + secret_of(t), T0, "malformed token"),
    "forged secret": (lambda g, t: _forged(t), T0, "is not valid (unknown or forged)"),
    "unknown id": (lambda g, t: auth.new_token()[0], T0, "is not valid (unknown or forged)"),
    "another token's secret": (lambda g, t: f"rlt_{token_id(t)}_{secret_of(issue(g, 'bob', ['team-b']))}", T0,
                               "is not valid (unknown or forged)"),
    "expired": (lambda g, t: issue(g, "carl", ["team-a"], ttl_s=60), T0 + 60, "of carl is expired"),
    "revoked": (lambda g, t: (g.revoke(token_id(t), ANONYMOUS), t)[1], T0, "of alice is revoked"),
    "rotated (the old one)": (lambda g, t: (g.rotate(token_id(t), ANONYMOUS), t)[1], T0, "of alice is revoked"),
    "job token whose parent is revoked": (
        lambda g, t: (issue(g, "alice", ["team-a"], parent=token_id(t)), g.revoke(token_id(t), ANONYMOUS))[0], T0,
        "is revoked (its parent token"),
    "job token whose parent expired": (
        lambda g, t: issue(g, "dana", ["team-a"], parent=token_id(issue(g, "dana", ["team-a"], ttl_s=10))), T0 + 10,
        "is expired (its parent token"),
    "job token expired (parent active)": (
        lambda g, t: issue(g, "alice", ["team-a"], ttl_s=30, parent=token_id(t)), T0 + 31, "of alice is expired"),
}


@pytest.mark.parametrize("make, when, why", list(REFUSED.values()), ids=list(REFUSED))
def test_a_refused_credential_is_named_without_showing_the_secret(gate, make, when, why):
    alice = issue(gate, "alice", ["team-a"])
    presented = make(gate, alice)
    with pytest.raises(AuthenticationError) as err:
        gate.authenticate(presented, when)
    assert why in str(err.value), str(err.value)
    for tok in (alice, presented):
        if well_formed(tok):
            assert secret_of(tok) not in str(err.value)
    assert "hunter2" not in str(err.value)


def test_an_unknown_id_and_a_forged_secret_are_refused_alike(gate):
    alice = issue(gate, "alice", ["team-a"])
    unknown = f"rlt_{'z' * 12}_{secret_of(alice)}"
    msgs = []
    for presented in (unknown, _forged(alice)):
        with pytest.raises(AuthenticationError) as err:
            gate.authenticate(presented, T0)
        msgs.append(str(err.value).replace(token_id(presented), "<id>"))
    assert msgs[0] == msgs[1]  # a caller learns nothing about which ids exist


def test_expiry_is_exact_and_a_token_without_one_never_expires(gate):
    short = issue(gate, "alice", ["team-a"], ttl_s=60)
    forever = issue(gate, "bob", ["team-b"])
    assert gate.authenticate(short, T0 + 59.9).user == "alice"
    with pytest.raises(AuthenticationError, match="expired"):
        gate.authenticate(short, T0 + 60)
    assert gate.authenticate(forever, T0 + 10 * 366 * 86400).user == "bob"


def test_rotation_refuses_the_old_token_and_gives_a_new_one_with_the_same_rights(gate):
    ops = gate.authenticate(issue(gate, "root", role="operator"), T0)
    old = issue(gate, "carol", ["team-a", "team-b"], "team-admin")
    new = gate.rotate(token_id(old), ops)
    assert new != old and token_id(new) != token_id(old)
    with pytest.raises(AuthenticationError, match="revoked"):
        gate.authenticate(old, T0)
    p = gate.authenticate(new, T0)
    assert (p.user, p.teams, p.role) == ("carol", ("team-a", "team-b"), Role.TEAM_ADMIN)
    listed = {t["id"]: t for t in gate.token_list(include_revoked=True)}
    assert listed[token_id(old)]["status"] == "revoked"
    assert listed[token_id(new)]["note"].startswith(f"rotated from {token_id(old)}")
    assert token_id(old) not in {t["id"] for t in gate.token_list(include_revoked=False)}
    with pytest.raises(ValidationError) as err:  # a revoked token cannot be rotated back to life
        gate.rotate(token_id(old), ops)
    assert [p for p, _, _ in err.value.errors] == ["token_id"] and "revoked" in str(err.value)
    with pytest.raises(NotFoundError, match="zzzzzzzzzzzz"):
        gate.revoke("zzzzzzzzzzzz", ops)


def test_a_job_token_has_its_creators_rights_and_is_revoked_with_its_parent(gate):
    parent = issue(gate, "alice", ["team-a"])
    job = issue(gate, "alice", ["team-a"], parent=token_id(parent), ttl_s=3600)
    p = gate.authenticate(job, T0)
    assert (p.user, p.teams, p.role, p.job) == ("alice", ("team-a",), Role.MEMBER, True)
    # Its own driver acts on its own workload (the owner is the user, whichever of her tokens asks).
    auth.authorize(p, Action.CANCEL, team="team-a", owner="alice")
    gate.revoke(token_id(parent), p)
    with pytest.raises(AuthenticationError, match=f"its parent token {token_id(parent)}"):
        gate.authenticate(job, T0)


def test_bootstrap_is_idempotent(gate, journal):
    tok, tid, salt, digest = auth.new_token()
    gate.bootstrap("root", tid, salt, digest)
    gate.bootstrap("root", tid, salt, digest)  # a restart with the same arguments
    assert [e for e in entries(journal) if e[0] == "token"] == [("token", "@tokens")]
    assert gate.authenticate(tok, T0).role is Role.OPERATOR


@pytest.mark.parametrize("kw, field", [
    ({"user": "Alice"}, "user"),
    ({"user": ""}, "user"),
    ({"user": "a" * 65}, "user"),
    ({"teams": ["team-c"]}, "teams[0]"),
    ({"teams": ["Team A"]}, "teams[0]"),
    ({"teams": ["team-a", 7]}, "teams[1]"),
    ({"role": "admin"}, "role"),
    ({"role": "root"}, "role"),
], ids=["upper-case user", "empty user", "long user", "team not in the policy", "bad team name", "team not a string",
        "unknown role", "no such role"])
def test_a_token_for_a_bad_principal_is_refused_naming_the_field(gate, journal, kw, field):
    args = {"user": "alice", "teams": ["team-a"], "role": "member", **kw}
    before = entries(journal)
    with pytest.raises(ValidationError) as err:
        gate.add_token(created_by="test", **args)
    assert field in [p for p, _, _ in err.value.errors], str(err.value)
    assert entries(journal) == before  # nothing was created


# ----------------------------------------------------------------------------------------------- storage


def test_tokens_are_stored_only_as_salt_and_digest(gate, journal):
    ops = gate.authenticate(issue(gate, "root", role="operator"), T0)
    made = [issue(gate, "alice", ["team-a"]), issue(gate, "carol", ["team-a"], "team-admin", ttl_s=600)]
    made.append(issue(gate, "alice", ["team-a"], parent=token_id(made[0])))
    made.append(gate.rotate(token_id(issue(gate, "bob", ["team-b"])), ops))
    # A presented forged token is not stored either (the audit trail keeps the id only).
    forged = _forged(made[0])
    with pytest.raises(AuthenticationError):
        gate.check(forged, "whoami", {})
    journal.close()
    folder = Path(journal.path).parent
    stored = b"".join(p.read_bytes() for p in sorted(folder.iterdir()))  # the db and its -wal/-shm files
    for tok in made + [forged]:
        assert tok.encode() not in stored and secret_of(tok).encode() not in stored
    # What is stored instead: each token's id, salt and digest of its secret.
    for tok in made:
        rec = gate.store.tokens[token_id(tok)]
        assert rec.digest == auth.digest(secret_of(tok), rec.salt)
        assert rec.digest.encode() in stored and rec.salt.encode() in stored
    assert len({gate.store.tokens[token_id(t)].salt for t in made}) == len(made)  # a salt per token


def test_the_journal_is_readable_by_its_owner_only(tmp_path):
    path = tmp_path / "state" / "journal.db"
    j = Journal(str(path))
    try:
        Gate(j, teams=TEAMS).add_token(user="alice", teams=["team-a"], role="member", created_by="test")
        assert oct(path.stat().st_mode & 0o777) == oct(0o600)
        assert path.parent.stat().st_mode & 0o077 == 0
        for p in path.parent.iterdir():  # sqlite's -wal and -shm files too
            assert p.stat().st_mode & 0o077 == 0, (p.name, oct(p.stat().st_mode))
    finally:
        j.close()


def test_a_world_readable_journal_is_made_private_when_opened(tmp_path):
    path = tmp_path / "journal.db"
    path.touch()
    os.chmod(path, 0o644)  # as journals were created before
    Journal(str(path)).close()
    assert oct(path.stat().st_mode & 0o777) == oct(0o600)


# --------------------------------------------------------------------------------------------- the rules

ALICE = Principal("alice", ("team-a",), Role.MEMBER, "aaaaaaaaaaaa")
ALICE_JOB = Principal("alice", ("team-a",), Role.MEMBER, "jjjjjjjjjjjj", job=True)
CAROL = Principal("carol", ("team-a",), Role.TEAM_ADMIN, "cccccccccccc")
BOB = Principal("bob", ("team-b",), Role.MEMBER, "bbbbbbbbbbbb")
BOTH = Principal("dana", ("team-a", "team-b"), Role.MEMBER, "dddddddddddd")
OPS = Principal("root", (), Role.OPERATOR, "oooooooooooo")
NOT_MY_TEAM = "not one of the caller's teams"
NOT_MINE = "only its owner, a team-admin of team-a, an operator or its own driver may"
OPERATORS_ONLY = "only operators may"


def case(name, who, action, target=None, *, ok=True, why=""):
    """A row of the rules: ``who`` asks for ``action`` on ``target`` (a workload of WORKLOADS, or a team for a
    submit); refused unless ``ok``, saying ``why``."""
    team, owner = (WORKLOADS[target] if target in WORKLOADS else (target, None)) if target else (None, None)
    return pytest.param(who, action, team, owner, ok, why, id=name)


RULES = [
    # submit: to one of the caller's teams
    case("member submits to its team", ALICE, Action.SUBMIT, "team-a"),
    case("member submits to another team", ALICE, Action.SUBMIT, "team-b", ok=False, why=NOT_MY_TEAM),
    case("member of two teams submits to either", BOTH, Action.SUBMIT, "team-b"),
    case("team-admin submits to another team", CAROL, Action.SUBMIT, "team-b", ok=False, why=NOT_MY_TEAM),
    case("submit naming no team", ALICE, Action.SUBMIT, None, ok=False, why=NOT_MY_TEAM),
    case("operator submits to any team", OPS, Action.SUBMIT, "team-b"),
    # cancel, release, report: the owner, a team-admin of its team, an operator, its own driver
    *[row for action in (Action.CANCEL, Action.RELEASE, Action.REPORT) for row in (
        case(f"member {action.value}s its own workload", ALICE, action, "w-alice"),
        case(f"its driver (a job token) {action.value}s it", ALICE_JOB, action, "w-alice"),
        case(f"member {action.value}s a teammate's workload", ALICE, action, "w-erin", ok=False, why=NOT_MINE),
        case(f"member {action.value}s another team's workload", ALICE, action, "w-bob", ok=False, why=NOT_MY_TEAM),
        case(f"team-admin {action.value}s a teammate's workload", CAROL, action, "w-erin"),
        case(f"team-admin {action.value}s another team's workload", CAROL, action, "w-bob", ok=False,
             why=NOT_MY_TEAM),
        case(f"operator {action.value}s any workload", OPS, action, "w-bob"),
    )],
    # read (a workload's spec, config, owner and journal): its team and operators
    case("member reads its own workload", ALICE, Action.READ, "w-alice"),
    case("member reads a teammate's workload", ALICE, Action.READ, "w-erin"),
    case("member reads another team's workload", ALICE, Action.READ, "w-bob", ok=False, why=NOT_MY_TEAM),
    case("team-admin reads another team's workload", CAROL, Action.READ, "w-bob", ok=False, why=NOT_MY_TEAM),
    case("operator reads any workload", OPS, Action.READ, "w-bob"),
    # the queue (positions and reasons of all work): everyone
    case("member reads the queue", BOB, Action.QUEUE),
    # spend: one's own teams (no team named: the actor leaves other teams' rows out), operators any team
    case("member reads its teams' cost", ALICE, Action.COST_READ),
    case("member reads its team's cost", ALICE, Action.COST_READ, "team-a"),
    case("member reads another team's cost", ALICE, Action.COST_READ, "team-b", ok=False, why=NOT_MY_TEAM),
    case("team-admin reads another team's cost", CAROL, Action.COST_READ, "team-b", ok=False, why=NOT_MY_TEAM),
    case("operator reads any team's cost", OPS, Action.COST_READ, "team-b"),
    # tokens, policy, audit trail: operators only
    *[row for action in (Action.TOKEN_ADMIN, Action.POLICY_RELOAD, Action.AUDIT_READ) for row in (
        case(f"member: {action.value}", ALICE, action, ok=False, why=OPERATORS_ONLY),
        case(f"member on its own team: {action.value}", ALICE, action, "team-a", ok=False, why=OPERATORS_ONLY),
        case(f"team-admin: {action.value}", CAROL, action, ok=False, why=OPERATORS_ONLY),
        case(f"operator: {action.value}", OPS, action),
    )],
]


@pytest.mark.parametrize("who, action, team, owner, ok, why", RULES)
def test_authorization_rules(who, action, team, owner, ok, why):
    if ok:
        auth.authorize(who, action, team=team, owner=owner)
        return
    with pytest.raises(PermissionDeniedError) as err:
        auth.authorize(who, action, team=team, owner=owner)
    msg = str(err.value)
    assert msg.startswith(f"{action.value}: refused for {who.user} ({who.role.value}") and why in msg, msg


# Through the gate: each call is checked for its action, on the target the control actor names.
CALLS = [
    # (name, who, call, args, refusal or None, what the refusal says)
    ("member submits to its team", "alice", "submit", {"spec": {"team": "team-a"}}, None, ""),
    ("member submits to another team", "alice", "submit", {"spec": {"team": "team-b"}}, PermissionDeniedError,
     "team 'team-b'"),
    ("member cancels its own workload", "alice", "cancel", {"workload_id": "w-alice"}, None, ""),
    ("member cancels a teammate's", "alice", "cancel", {"workload_id": "w-erin"}, PermissionDeniedError,
     "belongs to 'erin'"),
    ("member cancels another team's", "alice", "cancel", {"workload_id": "w-bob"}, PermissionDeniedError,
     "team 'team-b'"),
    ("team-admin cancels a teammate's", "carol", "cancel", {"workload_id": "w-erin"}, None, ""),
    ("member releases another team's", "alice", "release", {"workload_id": "w-bob", "outcome": "finished"},
     PermissionDeniedError, "release: refused"),
    ("member reports for another team's", "alice", "report", {"workload_id": "w-bob", "kind": "event"},
     PermissionDeniedError, "report: refused"),
    ("member saves a checkpoint for a teammate's", "alice", "checkpoint_saved",
     {"workload_id": "w-erin", "path": "runs/w-erin/checkpoint_00000010"}, PermissionDeniedError, "report: refused"),
    ("member registers workers for another team's", "bob", "register_workers",
     {"workload_id": "w-alice", "handles": []}, PermissionDeniedError, "report: refused"),
    ("member resolves another team's checkpoint", "bob", "resolve_checkpoint", {"workload_id": "w-alice"},
     PermissionDeniedError, "report: refused"),
    ("member polls another team's stop", "bob", "should_stop", {"workload_id": "w-alice"}, PermissionDeniedError,
     "report: refused"),
    ("member reads another team's status (redacted)", "bob", "status", {"workload_id": "w-alice"}, None, ""),
    ("member explains another team's (redacted)", "bob", "explain", {"workload_id": "w-alice"}, None, ""),
    ("member reads the queue", "bob", "queue", {}, None, ""),
    ("member reads its teams' cost", "bob", "cost", {}, None, ""),
    ("member reads its team's cost", "bob", "cost", {"team": "team-b", "by": "workload"}, None, ""),
    ("member reads another team's cost", "bob", "cost", {"team": "team-a"}, PermissionDeniedError,
     "cost-read: refused"),
    ("operator reads any team's cost", "root", "cost", {"team": "team-a"}, None, ""),
    ("member asks who it is", "bob", "whoami", {}, None, ""),
    ("member reads every team's quota and usage", "bob", "teams", {}, None, ""),
    ("member makes a job token", "bob", "job_token", {}, None, ""),
    ("member creates a token", "alice", "token_create", {"user": "mallory", "teams": ["team-a"], "role": "operator"},
     PermissionDeniedError, "token-admin: refused"),
    ("team-admin lists tokens", "carol", "token_list", {}, PermissionDeniedError, "token-admin: refused"),
    ("team-admin revokes a token", "carol", "token_revoke", {"token_id": "aaaaaaaaaaaa"}, PermissionDeniedError,
     "token-admin: refused"),
    ("member rotates a token", "alice", "token_rotate", {"token_id": "aaaaaaaaaaaa"}, PermissionDeniedError,
     "token-admin: refused"),
    ("team-admin reloads the policy", "carol", "reload_policy", {"policy": {}}, PermissionDeniedError,
     "policy-reload: refused"),
    ("member reads the audit trail", "alice", "audit", {}, PermissionDeniedError, "audit-read: refused"),
    ("operator creates a token", "root", "token_create", {"user": "zed", "teams": ["team-b"]}, None, ""),
    ("operator reads the audit trail", "root", "audit", {}, None, ""),
    ("operator cancels any workload", "root", "cancel", {"workload_id": "w-bob"}, None, ""),
    ("a workload that does not exist", "alice", "cancel", {"workload_id": "w-nobody"}, NotFoundError, "w-nobody"),
]


@pytest.fixture
def people(gate) -> Dict[str, str]:
    """A token for each user of these tests."""
    return {"alice": issue(gate, "alice", ["team-a"]), "erin": issue(gate, "erin", ["team-a"]),
            "carol": issue(gate, "carol", ["team-a"], "team-admin"), "bob": issue(gate, "bob", ["team-b"]),
            "root": issue(gate, "root", role="operator")}


@pytest.mark.parametrize("who, call, args, refusal, why", [c[1:] for c in CALLS], ids=[c[0] for c in CALLS])
def test_each_call_is_authorized_for_its_target(gate, journal, people, who, call, args, refusal, why):
    before = entries(journal)
    if refusal is None:
        p, req = gate.check(people[who], call, args, team_of=team_of, now=T0)
        assert p.user == who and isinstance(req, api.CALLS[call])
        assert entries(journal) == before  # an allowed call is audited by the actor, once it has run
        return
    with pytest.raises(refusal) as err:
        gate.check(people[who], call, args, team_of=team_of, now=T0)
    assert why in str(err.value), str(err.value)
    # A refusal changes nothing but the audit trail: one entry, naming who, what, on what, and why.
    added = entries(journal)[len(before):]
    assert added == [("audit", args.get("workload_id") or f"@{call}")]
    row = audit_rows(gate)[-1]
    assert (row["user"], row["action"], row["target"], row["outcome"], row["reason"]) == (
        who, call, args.get("workload_id"), "refused", str(err.value))
    assert row["token_id"] == token_id(people[who]) and row["ts"] == T0


def test_another_teams_workload_shows_positions_and_reasons_only(gate):
    public = {"id": "w-alice", "team": "team-a", "class": "pretrain", "state": "PENDING", "position": 2,
              "reason": "team team-a uses 4 of 4 GPU", "owner": "alice", "spec": {"config": {"lr": 0.1}},
              "config": {"lr": 0.1}, "job_id": "raysubmit_x", "checkpoints": {"10": "runs/x"}}
    for who in (ALICE, CAROL, OPS):
        assert gate.view(who, public) == public
    seen = gate.view(BOB, public)
    assert seen["redacted"] is True and (seen["position"], seen["reason"]) == (2, public["reason"])
    assert set(seen) == set(SUMMARY_FIELDS) | {"redacted"}
    for private in ("owner", "spec", "config", "job_id", "checkpoints", "journal"):
        assert private not in seen


def test_with_authentication_off_every_caller_is_the_anonymous_operator(journal):
    gate = Gate(journal, enabled=False)
    p, req = gate.check(None, "cancel", {"workload_id": "w-bob"}, team_of=team_of)
    assert p is ANONYMOUS and p.operator and req.workload_id == "w-bob"


# -------------------------------------------------------------------------------------------------- audit

# name -> (credential of (people), call, args, the refusal's type, what its audit row names as its principal)
AUDITED = {
    "no credential": (lambda t: None, "cancel", {"workload_id": "w-bob"}, AuthenticationError,
                      {"user": None, "token_id": None}),
    "a malformed credential": (lambda t: "hunter2", "cancel", {"workload_id": "w-bob"}, AuthenticationError,
                               {"user": None, "token_id": "malformed"}),
    "a forged token": (lambda t: _forged(t["alice"]), "cancel", {"workload_id": "w-bob"}, AuthenticationError,
                       {"user": None, "token_id": "<alice>"}),
    "not allowed": (lambda t: t["alice"], "cancel", {"workload_id": "w-bob"}, PermissionDeniedError,
                    {"user": "alice", "role": "member", "teams": ["team-a"], "token_id": "<alice>"}),
    "an operator's call by a member": (lambda t: t["alice"], "token_create", {"user": "mallory", "role": "operator"},
                                       PermissionDeniedError, {"user": "alice", "token_id": "<alice>"}),
    "no such workload": (lambda t: t["alice"], "cancel", {"workload_id": "w-nobody"}, NotFoundError,
                         {"user": "alice", "token_id": "<alice>"}),
    "bad arguments from an authenticated caller": (lambda t: t["alice"], "cancel", {"workload_id": "w/../x"},
                                                   ValidationError, {"user": "alice", "token_id": "<alice>"}),
    "an unknown call": (lambda t: t["alice"], "drop_journal", {}, ValidationError,
                        {"user": "alice", "token_id": "<alice>", "action": "?"}),
}


@pytest.mark.parametrize("cred, call, args, refusal, principal", list(AUDITED.values()), ids=list(AUDITED))
def test_every_refusal_is_audited_with_principal_action_target_outcome_and_reason(gate, people, cred, call, args,
                                                                                 refusal, principal):
    presented = cred(people)
    with pytest.raises(refusal) as err:
        gate.check(presented, call, args, team_of=team_of, now=T0 + 5)
    row = audit_rows(gate)[-1]
    expected = {"action": call, "target": args.get("workload_id"), "outcome": "refused", "reason": str(err.value),
                "ts": T0 + 5}
    expected.update({k: (token_id(people["alice"]) if v == "<alice>" else v) for k, v in principal.items()})
    assert {k: row.get(k) for k in expected} == expected, row
    # The trail names a token by its id: no secret is ever written to it.
    for tok in list(people.values()) + [presented]:
        if well_formed(tok):
            assert secret_of(tok) not in json.dumps(row)


def test_the_audit_trail_filters_by_time_user_and_team(gate, people):
    for i, (who, wid) in enumerate((("alice", "w-bob"), ("bob", "w-alice"), ("carol", "w-bob"))):
        with pytest.raises(PermissionDeniedError):
            gate.check(people[who], "cancel", {"workload_id": wid}, team_of=team_of, now=T0 + 10 * i)
    ops = gate.authenticate(people["root"], T0)
    gate.record(ops, "cancel", "w-bob", "ok", now=T0 + 30)
    teams_of = lambda wid: WORKLOADS.get(wid, (None,))[0]  # noqa: E731 - as the actor passes it
    assert [(r["user"], r["outcome"]) for r in gate.audit()] == [
        ("alice", "refused"), ("bob", "refused"), ("carol", "refused"), ("root", "ok")]
    assert [r["user"] for r in gate.audit(since=T0 + 10)] == ["bob", "carol", "root"]
    assert [r["user"] for r in gate.audit(user="bob")] == ["bob"]
    # A team's trail: what its members did, and what was done to its workloads.
    assert [r["user"] for r in gate.audit(team="team-b", teams_of=teams_of)] == ["alice", "bob", "carol", "root"]
    assert [r["user"] for r in gate.audit(team="team-a", teams_of=teams_of)] == ["alice", "bob", "carol"]
    assert [r["user"] for r in gate.audit(limit=2)] == ["carol", "root"]  # the newest


def test_tokens_and_the_audit_trail_survive_a_restart(tmp_path):
    path = str(tmp_path / "state" / "journal.db")
    j = Journal(path)
    g = Gate(j, teams=TEAMS)
    ops_tok = issue(g, "root", role="operator")
    ops = g.authenticate(ops_tok, T0)
    alice, bob = issue(g, "alice", ["team-a"]), issue(g, "bob", ["team-b"])
    rotated = g.rotate(token_id(bob), ops)
    job = issue(g, "alice", ["team-a"], parent=token_id(alice), ttl_s=3600)
    g.revoke(token_id(alice), ops)
    for cred, wid in ((bob, "w-alice"), (rotated, "w-alice"), (None, "w-bob")):
        with pytest.raises((AuthenticationError, PermissionDeniedError)):
            g.check(cred, "cancel", {"workload_id": wid}, team_of=team_of, now=T0 + 1)
    g.record(ops, "token_revoke", None, "ok", now=T0 + 2)
    trail, tokens = g.audit(), g.token_list(include_revoked=True)
    j.close()

    # The control actor restarted: a new gate over the same journal, replayed.
    j2 = Journal(path)
    try:
        g2 = Gate(j2, teams=TEAMS)
        for e in j2.replay():
            g2.apply(e)
        assert g2.audit() == trail and len(trail) == 4
        assert [r["user"] for r in trail] == [None, "bob", None, "root"]
        assert g2.token_list(include_revoked=True) == tokens
        assert g2.authenticate(ops_tok, T0).user == "root"
        assert g2.authenticate(rotated, T0).user == "bob"
        for refused in (alice, bob, job):
            with pytest.raises(AuthenticationError):
                g2.authenticate(refused, T0)
        # And it goes on appending to the same trail.
        with pytest.raises(PermissionDeniedError):
            g2.check(rotated, "cancel", {"workload_id": "w-alice"}, team_of=team_of, now=T0 + 3)
        assert len(g2.audit()) == 5
    finally:
        j2.close()


# --------------------------------------------------------------------------------------------------- fuzz

# A valid call of each kind (for the operator, on a workload that exists): the fuzz breaks one thing at a time.
VALID: Dict[str, Dict[str, Any]] = {
    "submit": {"spec": {"name": "x", "team": "team-a"}, "job_id": "raysubmit_abc"},
    "cancel": {"workload_id": "w-bob"},
    "release": {"workload_id": "w-bob", "outcome": "finished", "state": "SUCCEEDED", "step": 3, "detail": "done"},
    "report": {"workload_id": "w-bob", "kind": "event", "note": "n", "detail": "d", "restart": False,
               "mlflow_run_id": "abc123", "mlflow_run_error": "RetryableError: no store", "job_id": "raysubmit_abc",
               "step": 1},
    "checkpoint_saved": {"workload_id": "w-bob", "path": "runs/w-bob/checkpoint_00000010", "metrics": {"step": 10}},
    "register_workers": {"workload_id": "w-bob", "handles": []},
    "should_stop": {"workload_id": "w-bob"},
    "resolve_checkpoint": {"workload_id": "w-bob"},
    "status": {"workload_id": "w-bob"},
    "explain": {"workload_id": "w-bob"},
    "wait_admission": {"workload_id": "w-bob", "timeout_s": 1.0},
    "find_job": {"job_id": "raysubmit_abc"},
    "queue": {"include_done": True},
    "class_info": {"name": "pretrain"},
    "info": {},
    "whoami": {},
    "teams": {},
    "token_create": {"user": "zed", "teams": ["team-a"], "role": "member", "ttl_s": 60.0, "note": "n"},
    "job_token": {"ttl_s": 60.0, "note": "n"},
    "token_rotate": {"token_id": "abcdefghijkl"},
    "token_revoke": {"token_id": "abcdefghijkl"},
    "token_list": {"include_revoked": True},
    "audit": {"since": 0.0, "user": "alice", "team": "team-a", "limit": 10},
    "reload_policy": {"policy": {}},
    "cost": {"since": 0.0, "until": 10.0, "team": "team-a", "by": "team", "workload_ids": ["w-1"],
             "mlflow_run_id": "abc123"},
}

HUGE_INT = 10 ** 5000  # more digits than Python will print
BAD_IDS = ["", " ", "../../etc/passwd", "a/b", "a b", "-dash-first", ".hidden", "x" * 161, "w\n1", "w\x001", "wé",
           "*", "w;DROP TABLE journal", 1, 2.5, True, [], {}, b"w-1", ["w-1"], HUGE_INT]
# field -> values that field never accepts; (call, field) where a call's own limits differ.
WRONG: Dict[Any, List[Any]] = {
    "workload_id": BAD_IDS + [None],
    "job_id": ["", "a b", "x" * 161, "/jobs/1", 1, [], {}, HUGE_INT],
    "spec": ["spec.yaml", 1, [], None, {1: "x"}, {"a": "x" * (1 << 20)}, {"a": [[["x" * 1000] * 100] * 20]},
             {"a": HUGE_INT}],
    "outcome": ["done", "FINISHED", 1, None, ["finished"], "x" * 10_000],
    "state": ["RUNNING", "succeeded", 1, None, {}],
    "step": [-1, 10 ** 12 + 1, 10 ** 100, HUGE_INT, "5", 5.5, True, [1]],
    "detail": ["x" * 4001, "x" * 1_000_000, 1, [], {}],
    "kind": ["progress", "RUNNING", 1, None, []],
    "note": ["x" * 4001, 1, [], {"a": 1}],
    ("token_create", "note"): ["x" * 201, 1, []],
    ("job_token", "note"): ["x" * 201, 1, []],
    "restart": ["yes", 1, 0, "true", []],
    "mlflow_run_id": ["", "run id", "x" * 65, 1, "../x"],
    "mlflow_run_error": ["x" * 4001, 1, [], {"a": 1}],
    "mlflow_uri": ["", "file:///x", "/x/mlflow.db", "sqlite:///" + "x" * 4001, "sqlite:///x\ny", 1, []],
    "path": ["", "x" * 4097, 1, None, []],
    "metrics": ["x", [1], {1: 2}, 5],
    "handles": ["x", None, 1, {"a": 1}, [0] * 4097],
    "timeout_s": [-1, 3601, float("nan"), float("inf"), [], None, HUGE_INT],
    "include_done": ["yes", 1, None, [], "true"],
    "include_revoked": ["no", 0, None, {}],
    "name": ["Pretrain", "", "x" * 64, 1, None, "pre train", "../x"],
    "user": [1, None, [], {"u": 1}, HUGE_INT],
    ("audit", "user"): ["x" * 65, 1, [], {}],
    "team": ["x" * 65, 1, [], {}],
    "teams": ["team-a", [1], [None], ["t"] * 65, {"team-a": 1}, 5],
    "role": [1, None, [], 2.5],
    "ttl_s": [0, -5, 367 * 86400, float("nan"), float("inf"), [], "x"],
    ("job_token", "ttl_s"): [0, -5, 8 * 86400, float("nan"), [], "x"],
    "script": ["yes", 1, 0, "true", [], None],
    "token_id": ["", "ABCDEFGHIJKL", "short", "x" * 13, 1, None, "abcdefghijk!"],
    "since": [-1, 1e12, float("nan"), "x", []],
    "until": [-1, 1e12, float("nan"), "x", []],
    "by": ["node", "Team", 1, [], "team "],
    "workload_ids": ["w-1", [""], ["a b"], [1], ["w"] * 4097, {}],
    "limit": [0, 100001, 10 ** 30, "10", 1.5, None, True],
    "policy": ["policy.yaml", 1, [], None, {1: 2}],
}
UNKNOWN_CALLS = ["", "Submit", "submit ", "_api_submit", "ping", "request", "__init__", "gate", "x" * 10_000, None, 1,
                 ["submit"], {"call": "submit"}, b"submit"]
NOT_A_MAPPING = [[], ["workload_id", "w-bob"], "workload_id=w-bob", 1, 2.5, True, ("w-bob",), {"w-bob"}, b"{}",
                 object()]


def wrong_values(call: str, field: str) -> List[Any]:
    return WRONG.get((call, field), WRONG[field])


def fuzz_cases(seed: int, extra: int) -> List[Tuple[str, Any, Any, List[str]]]:
    """(label, call, args, fields the error must name): every wrong value of every field of every call, then
    ``extra`` seeded random ones (unknown fields, missing fields, several wrong fields at once, args that are no
    mapping or have non-string keys, unknown call names)."""
    cases = []
    for call, valid in VALID.items():
        for field in api.CALLS[call].model_fields:
            for i, v in enumerate(wrong_values(call, field)):
                cases.append((f"{call}.{field} #{i}", call, {**valid, field: v}, [field]))
    for i, name in enumerate(UNKNOWN_CALLS):
        cases.append((f"unknown call #{i}", name, {}, ["call"]))
    rng = random.Random(seed)
    calls = sorted(VALID)
    for i in range(extra):
        call = rng.choice(calls)
        valid = VALID[call]
        fields = list(api.CALLS[call].model_fields)
        what = rng.choice(["unknown field", "missing field", "two wrong fields", "not a mapping", "non-string key",
                           "unknown call"])
        if what == "unknown field":
            name = rng.choice(["owner", "credential", "token", "__class__", "workload", "spec2", "x" * 1000,
                               "".join(rng.choices(string.ascii_letters + "_.-/ ", k=rng.randint(1, 40)))])
            if name in fields:
                continue
            cases.append((f"#{i} {call}: unknown field", call, {**valid, name: rng.choice(BAD_IDS)}, [name]))
        elif what == "missing field":
            required = [f for f in fields if api.CALLS[call].model_fields[f].is_required()]
            if not required:
                continue
            gone = rng.choice(required)
            args = {k: v for k, v in valid.items() if k != gone} if rng.random() < 0.8 else None
            cases.append((f"#{i} {call}: no {gone}", call, args, required if args is None else [gone]))
        elif what == "two wrong fields" and len(fields) >= 2:
            a, b = rng.sample(fields, 2)
            args = {**valid, a: rng.choice(wrong_values(call, a)), b: rng.choice(wrong_values(call, b))}
            cases.append((f"#{i} {call}: wrong {a} and {b}", call, args, [a, b]))
        elif what == "not a mapping":
            cases.append((f"#{i} {call}: args not a mapping", call, rng.choice(NOT_A_MAPPING), ["args"]))
        elif what == "non-string key":
            key = rng.choice([1, None, 2.5, ("a",), True])
            cases.append((f"#{i} {call}: key {key!r}", call, {**valid, key: "x"}, ["args"]))
        elif what == "unknown call":
            name = "".join(rng.choices(string.printable, k=rng.randint(0, 60)))
            if name not in api.CALLS:
                cases.append((f"#{i} unknown call {name!r}", name, valid, ["call"]))
    return cases


def names(exc: ValidationError, field: str) -> bool:
    """Whether ``exc`` names ``field`` (or a part of it, such as ``teams.0`` or ``spec.1.[key]``)."""
    return any(path == field or path.startswith(field + ".") for path, _, _ in exc.errors) and field in str(exc)


def test_every_valid_call_of_the_fuzz_passes(gate, people):
    for call, args in VALID.items():
        p, req = gate.check(people["root"], call, args, team_of=team_of)
        assert isinstance(req, api.CALLS[call]) and p.user == "root"


def test_malformed_calls_are_refused_naming_the_field_and_audited(gate, journal, people):
    cases = fuzz_cases(seed=20240611, extra=150)
    assert len(cases) >= 250
    before = len(audit_rows(gate))
    problems = []
    for i, (label, call, args, fields) in enumerate(cases):
        try:  # one a second: under the rate at which a caller's refusals are journaled one by one (Refusals)
            gate.check(people["root"], call, args, team_of=team_of, now=T0 + i)
        except ValidationError as exc:
            missed = [f for f in fields if not names(exc, f)]
            if missed:
                problems.append(f"{label}: does not name {missed}: {str(exc)[:300]}")
            elif len(str(exc)) > 20_000:
                problems.append(f"{label}: an error of {len(str(exc))} characters (huge values are not cut)")
        except Exception as exc:  # noqa: BLE001 - what the fuzz is for
            problems.append(f"{label}: {type(exc).__name__}: {str(exc)[:200]}")
        else:
            problems.append(f"{label}: accepted")
    assert not problems, f"{len(problems)} of {len(cases)} malformed calls:\n" + "\n".join(problems)
    rows = audit_rows(gate)[before:]
    # Every refusal counted; a case the fuzz drew twice (the same call, target and reason) shares its row.
    assert sum(r["count"] for r in rows) == len(cases) and all(r["outcome"] == "refused" for r in rows)
    assert len(rows) > 0.9 * len(cases)
    # Huge values are cut before they reach the journal.
    assert max(len(json.dumps(r)) for r in rows) < 4000
    assert {k for k, _ in entries(journal)} == {"token", "audit"}  # nothing but the trail was written


# ------------------------------------------------------------------------------------------------ job scopes
# A job token is worth its one workload (issue 44): bound at its first submit, it acts on that workload alone and
# dies with it. "w-bob" is what bob's job submitted; "w-bob-2" is bob's other workload.
SCOPE_WORKLOADS = {**WORKLOADS, "w-bob-2": ("team-b", "bob"), "p1": ("team-b", "bob"), "p1-prep": ("team-b", "bob")}


def scope_team_of(req: api.Request) -> Tuple[Optional[str], Optional[str]]:
    def find(wid):
        if wid not in SCOPE_WORKLOADS:
            raise NotFoundError(f"no workload {wid!r}")
        return SCOPE_WORKLOADS[wid]

    return gate_mod.target_team(req, find)


def job_token_of(gate: Gate, parent: str, user: str = "bob", teams=("team-b",)) -> str:
    return gate.add_token(user=user, teams=list(teams), role="member", created_by=user, ttl_s=7 * 86400.0,
                          parent=token_id(parent), note="job token", now=T0)


def bound(gate: Gate, tok: str, wid: str = "w-bob", kind: str = "train") -> None:
    """What the control plane does once a job token's submit has its id (``ControlState._api_submit``)."""
    p = gate.authenticate(tok, T0)
    gate.bind(p, [wid], team="team-b", kind=kind, now=T0)


SUBMIT_B = {"spec": {"team": "team-b", "kind": "train"}}
RELEASE = {"outcome": "failed", "state": "FAILED"}
# name -> (what the job token did before: None, or the kind of workload it submitted, call, args, refusal, words)
SCOPE_CASES = {
    "its first submit": (None, "submit", SUBMIT_B, None, ""),
    "a second submit": ("train", "submit", SUBMIT_B, PermissionDeniedError, "a job token submits once"),
    "a second submit to another of its teams": ("train", "submit", {"spec": {"team": "team-b", "kind": "eval"}},
                                                PermissionDeniedError, "submits once"),
    "a sweep's driver submits another slot": ("tune", "submit", {"spec": {"team": "team-b", "kind": "tune"}}, None,
                                              ""),
    "a sweep's driver submits another kind": ("tune", "submit", SUBMIT_B, PermissionDeniedError, "submits once"),
    "a serving driver submits a replica lease": ("serve", "submit", {"spec": {"team": "team-b", "kind": "serve"}},
                                                 None, ""),
    "it reports on its workload": ("train", "report", {"workload_id": "w-bob", "kind": "event"}, None, ""),
    "it releases its workload": ("train", "release", {"workload_id": "w-bob", **RELEASE}, None, ""),
    "it polls its stop": ("train", "should_stop", {"workload_id": "w-bob"}, None, ""),
    "it waits for its admission": ("train", "wait_admission", {"workload_id": "w-bob"}, None, ""),
    "it cancels its workload (ray job stop)": ("train", "cancel", {"workload_id": "w-bob"}, None, ""),
    "it cancels its user's other workload": ("train", "cancel", {"workload_id": "w-bob-2"}, PermissionDeniedError,
                                             "acts only on the workload it submitted (w-bob), not on w-bob-2"),
    "it releases its user's other workload": ("train", "release", {"workload_id": "w-bob-2", **RELEASE},
                                              PermissionDeniedError, "acts only on the workload it submitted"),
    "it reports on its user's other workload": ("train", "report", {"workload_id": "w-bob-2", "kind": "event"},
                                                PermissionDeniedError, "acts only on the workload it submitted"),
    "it reports before submitting anything": (None, "report", {"workload_id": "w-bob", "kind": "event"},
                                              PermissionDeniedError, "nothing submitted yet"),
    "it reads the queue": ("train", "queue", {}, None, ""),
    "it asks who it is": ("train", "whoami", {}, None, ""),
    "it mints an operator token": ("train", "token_create", {"user": "mallory", "role": "operator"},
                                   PermissionDeniedError, "job tokens may not manage tokens"),
}


@pytest.mark.parametrize("before, call, args, refusal, words", list(SCOPE_CASES.values()), ids=list(SCOPE_CASES))
def test_a_job_token_acts_only_on_the_workload_it_submitted(gate, people, before, call, args, refusal, words):
    tok = job_token_of(gate, people["bob"])
    if before is not None:
        bound(gate, tok, kind=before)
    if refusal is None:
        p, _ = gate.check(tok, call, args, team_of=scope_team_of, now=T0 + 1)
        assert p.job and p.token_id == token_id(tok)
        return
    n = len(audit_rows(gate))
    with pytest.raises(refusal) as err:
        gate.check(tok, call, args, team_of=scope_team_of, now=T0 + 1)
    assert words in str(err.value), str(err.value)
    rows = audit_rows(gate)[n:]
    assert [(r["user"], r["token_id"], r["action"], r["outcome"]) for r in rows] == [
        ("bob", token_id(tok), call, "refused")]
    assert rows[0]["reason"] == str(err.value)


def test_a_users_own_token_is_not_scoped(gate, people):
    for call, args in (("submit", SUBMIT_B), ("submit", SUBMIT_B), ("cancel", {"workload_id": "w-bob-2"})):
        gate.check(people["bob"], call, args, team_of=scope_team_of, now=T0 + 1)


def test_a_pipeline_drivers_token_covers_the_pipeline_and_its_stages_only(gate, people):
    tok = job_token_of(gate, people["bob"])
    args = {"spec": {"team": "team-b", "kind": "pipeline", "stages": {"prep": {}}}, "pipeline_id": "p1",
            "storage_path": "/tmp/x"}
    gate.check(tok, "pipeline_submit", args, team_of=scope_team_of, now=T0 + 1)
    for wid in ("p1", "p1-prep"):
        gate.check(tok, "report", {"workload_id": wid, "kind": "event"}, team_of=scope_team_of, now=T0 + 1)
    with pytest.raises(PermissionDeniedError, match="not on w-bob-2"):
        gate.check(tok, "cancel", {"workload_id": "w-bob-2"}, team_of=scope_team_of, now=T0 + 1)
    with pytest.raises(PermissionDeniedError, match="submits once"):
        gate.check(tok, "pipeline_submit", {**args, "pipeline_id": "p2"}, team_of=scope_team_of, now=T0 + 1)


def test_a_job_token_is_retired_when_its_last_workload_ends_and_that_survives_a_restart(gate, journal, people):
    tok = job_token_of(gate, people["bob"])
    bound(gate, tok, "w-bob", kind="tune")
    bound(gate, tok, "w-bob-2", kind="tune")
    live = {"w-bob": False, "w-bob-2": True}
    gate.workload_ended("w-bob", T0 + 10, live=live.get)
    assert gate.scopes[token_id(tok)].retired is None  # one slot still runs
    gate.check(tok, "submit", {"spec": {"team": "team-b", "kind": "tune"}}, team_of=scope_team_of, now=T0 + 11)
    live["w-bob-2"] = False
    gate.workload_ended("w-bob-2", T0 + 20, live=live.get)
    rec = gate.store.tokens[token_id(tok)]
    assert rec.expires == T0 + 20 + gate_mod.AFTER_END_S
    # In its last minute its driver reads its end; it submits nothing more.
    gate.check(tok, "release", {"workload_id": "w-bob", **RELEASE}, team_of=scope_team_of, now=T0 + 21)
    with pytest.raises(PermissionDeniedError, match="its workloads have ended"):
        gate.check(tok, "submit", {"spec": {"team": "team-b", "kind": "tune"}}, team_of=scope_team_of, now=T0 + 21)
    later = T0 + 21 + gate_mod.AFTER_END_S
    with pytest.raises(AuthenticationError, match="expired"):
        gate.check(tok, "report", {"workload_id": "w-bob", "kind": "event"}, team_of=scope_team_of, now=later)
    # The control plane restarts: the scope and the retirement come back from the journal.
    journal.commit()
    again = Gate(journal, teams=TEAMS)
    for e in journal.replay():
        again.apply(e)
    assert again.scopes[token_id(tok)].members == {"w-bob", "w-bob-2"}
    with pytest.raises(AuthenticationError, match="expired"):
        again.check(tok, "report", {"workload_id": "w-bob", "kind": "event"}, team_of=scope_team_of, now=later)
    fresh = job_token_of(again, people["bob"])
    again.bind(again.authenticate(fresh, T0), ["w-bob"], team="team-b", kind="train", now=T0)
    with pytest.raises(PermissionDeniedError, match="not on w-bob-2"):
        again.check(fresh, "cancel", {"workload_id": "w-bob-2"}, team_of=scope_team_of, now=T0 + 1)
