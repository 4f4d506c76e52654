"""Who is asking: principals, API tokens, and what each role may do. Pure: no Ray, no clock, no I/O.

The control actor (``raylane.control.gate``) owns the token store and asks ``authorize`` before every call; the CLI
and drivers only find and present a token (``raylane.credentials``). This module owns the token format, how a token
is checked against what the control plane stored, and the rules.

Words:
- *token*: ``rlt_<id>_<secret>``; the id names the token (it is shown in lists and the audit trail), the secret is
  32 random bytes (URL-safe base64) and is shown once, when the token is created or rotated.
- *digest*: HMAC-SHA256 of the secret under a per-token random salt; the control plane stores only id, salt and
  digest, and compares digests in constant time (``hmac.compare_digest``). Tokens carry 256 bits of entropy, so a
  fast keyed hash is enough (a slow password hash would only add latency to every call).
- *principal*: the authenticated caller: user, teams, role, and the id of the token it used.
- *roles*: ``member`` (submit to its teams, act on its own workloads, read its teams' details), ``team-admin``
  (also act on any workload of its teams), ``operator`` (everything, including tokens, policy and the audit trail).
- *job token*: a token ``raylane submit`` creates for one Ray job, with its creator's user, teams and role, a
  short expiry, and revoked with its parent: the long-lived token never leaves the submitting machine.
"""
from __future__ import annotations

import base64
import enum
import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional, Tuple

from raylane.errors import AuthenticationError, PermissionDeniedError, ValidationError

__all__ = ["Role", "Action", "Principal", "TokenRecord", "TokenStore", "authorize", "new_token", "parse_token",
           "ANONYMOUS", "USER_RE", "TEAM_RE"]

TOKEN_PREFIX = "rlt"
_TOKEN_RE = re.compile(r"^rlt_([a-z0-9]{12})_([A-Za-z0-9_-]{43})$")
USER_RE = re.compile(r"^[a-z0-9][a-z0-9._@-]{0,63}$")
TEAM_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")
MAX_TTL_S = 366 * 86400.0


class Role(str, enum.Enum):
    MEMBER = "member"
    TEAM_ADMIN = "team-admin"
    OPERATOR = "operator"


class Action(str, enum.Enum):
    """Every call the control plane authorizes; the audit trail names these."""

    SUBMIT = "submit"
    CANCEL = "cancel"
    RELEASE = "release"
    REPORT = "report"  # progress, checkpoints, worker registration, stop polls, checkpoint resolution
    READ = "read"  # a workload's spec, config, owner and journal
    QUEUE = "queue"  # positions and reasons of all work
    TOKEN_ADMIN = "token-admin"
    POLICY_RELOAD = "policy-reload"
    AUDIT_READ = "audit-read"
    NODE_ADMIN = "node-admin"  # cordon, uncordon and drain nodes
    COST_READ = "cost-read"  # spend: the whole cluster's rows (operators), a team's (its members), or one's own teams'


@dataclass(frozen=True)
class Principal:
    user: str
    teams: Tuple[str, ...]
    role: Role
    token_id: str
    job: bool = False

    @property
    def operator(self) -> bool:
        return self.role is Role.OPERATOR

    def label(self) -> str:
        return f"{self.user} ({self.role.value}, token {self.token_id})"


# With authentication off (a control plane started with auth=False): every caller is this operator.
ANONYMOUS = Principal("anonymous", (), Role.OPERATOR, "-")


@dataclass
class TokenRecord:
    """What the control plane keeps of a token: never the secret."""

    id: str
    user: str
    teams: Tuple[str, ...]
    role: Role
    salt: str
    digest: str
    created: float
    expires: Optional[float] = None
    revoked: Optional[float] = None
    created_by: str = ""
    parent: Optional[str] = None  # a job token's parent token: revoking the parent revokes it
    note: str = ""
    scope: str = ""  # a job token's: "" (one workload) or "script" (a script's workloads: raylane.control.gate)

    def public(self, now: float) -> Dict[str, object]:
        return {"id": self.id, "user": self.user, "teams": list(self.teams), "role": self.role.value,
                "created": self.created, "expires": self.expires, "revoked": self.revoked,
                "created_by": self.created_by, "parent": self.parent, "note": self.note,
                "status": self.status(now)}

    def status(self, now: float) -> str:
        if self.revoked is not None:
            return "revoked"
        if self.expires is not None and now >= self.expires:
            return "expired"
        return "active"


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def digest(secret: str, salt: str) -> str:
    return hmac.new(salt.encode(), secret.encode(), hashlib.sha256).hexdigest()


def new_token() -> Tuple[str, str, str, str]:
    """A fresh token: (token, id, salt, digest). Only the token's holder ever sees ``token``."""
    tid = "".join(secrets.choice("abcdefghijklmnopqrstuvwxyz0123456789") for _ in range(12))
    secret = _b64(secrets.token_bytes(32))
    salt = secrets.token_hex(16)
    return f"{TOKEN_PREFIX}_{tid}_{secret}", tid, salt, digest(secret, salt)


def parse_token(token: object) -> Tuple[str, str]:
    """(id, secret) of a well-formed token; raises ``AuthenticationError`` naming what is wrong (never the token)."""
    if token is None or token == "":
        raise AuthenticationError("no credential: set RAYLANE_TOKEN or write your token to ~/.raylane/credentials "
                                  "(`raylane token use TOKEN`); an operator creates one with `raylane token create`")
    if not isinstance(token, str):
        raise AuthenticationError(f"credential: got a {type(token).__name__}; expected a token string")
    m = _TOKEN_RE.match(token.strip())
    if m is None:
        raise AuthenticationError("credential: malformed token; expected rlt_<12 characters>_<43 characters>")
    return m.group(1), m.group(2)


def check_user(user: object) -> str:
    if not isinstance(user, str) or not USER_RE.match(user):
        raise ValidationError("token", [("user", user, "1-64 characters: lowercase letters, digits, . _ @ -")])
    return user


def check_teams(teams: object, known: Optional[Iterable[str]] = None) -> Tuple[str, ...]:
    if isinstance(teams, str):
        teams = [teams]
    if not isinstance(teams, (list, tuple)) or len(teams) > 64:
        raise ValidationError("token", [("teams", teams, "a list of up to 64 team names")])
    known_set = set(known) if known is not None else None
    errors = []
    for i, t in enumerate(teams):
        if not isinstance(t, str) or not TEAM_RE.match(t):
            errors.append((f"teams[{i}]", t, "a team name: lowercase letters, digits and -"))
        elif known_set is not None and t not in known_set:
            errors.append((f"teams[{i}]", t, f"one of the policy's teams: {', '.join(sorted(known_set))}"))
    if errors:
        raise ValidationError("token", errors)
    return tuple(dict.fromkeys(teams))


def check_role(role: object) -> Role:
    try:
        return Role(role)
    except ValueError:
        raise ValidationError("token", [("role", role, f"one of {', '.join(r.value for r in Role)}")]) from None


@dataclass
class TokenStore:
    """Token records by id, rebuilt from the journal (``raylane.control.gate``). Checks tokens; never keeps one."""

    tokens: Dict[str, TokenRecord] = field(default_factory=dict)

    def authenticate(self, token: object, now: float) -> Principal:
        tid, secret = parse_token(token)
        rec = self.tokens.get(tid)
        # Same work and the same answer whether the id is unknown or the secret is wrong: a caller learns nothing
        # about which ids exist.
        expected = rec.digest if rec is not None else digest("x", "unknown")
        ok = hmac.compare_digest(digest(secret, rec.salt if rec is not None else "unknown"), expected)
        if rec is None or not ok:
            raise AuthenticationError(f"credential: token {tid} is not valid (unknown or forged)")
        status = self._status(rec, now)
        if status != "active":
            raise AuthenticationError(f"credential: token {tid} of {rec.user} is {status}")
        return Principal(rec.user, rec.teams, rec.role, rec.id, job=rec.parent is not None)

    def _status(self, rec: TokenRecord, now: float) -> str:
        status = rec.status(now)
        if status == "active" and rec.parent is not None:
            parent = self.tokens.get(rec.parent)
            if parent is None or parent.status(now) != "active":
                return f"{status if parent is None else parent.status(now)} (its parent token {rec.parent})"
        return status

    def active_operators(self, now: float) -> List[TokenRecord]:
        return [t for t in self.tokens.values() if t.role is Role.OPERATOR and t.status(now) == "active"]


def authorize(p: Principal, action: Action, *, team: Optional[str] = None, owner: Optional[str] = None) -> None:
    """Raise ``PermissionDeniedError`` (naming who, what and why) unless ``p`` may do ``action``.

    ``team`` and ``owner`` describe the target workload (or, for a submit, the spec's team)."""
    if p.job and action in (Action.TOKEN_ADMIN, Action.POLICY_RELOAD, Action.NODE_ADMIN):
        # Code inside a job must not mint long-lived tokens or change the policy, even an operator's job.
        raise PermissionDeniedError(f"{action.value}: refused for {p.user}'s job token {p.token_id}: job tokens "
                                    f"may not manage tokens, nodes or the policy")
    if p.operator:
        return
    who = f"{p.user} ({p.role.value} of {', '.join(p.teams) or 'no team'})"
    if action in (Action.QUEUE,):
        return
    if action is Action.COST_READ:
        # No team named: the caller's own teams' spend (the control actor leaves the other teams' rows out).
        if team is None or team in p.teams:
            return
        raise PermissionDeniedError(f"cost-read: refused for {who}: team {team!r} is not one of the caller's teams")
    if action in (Action.TOKEN_ADMIN, Action.POLICY_RELOAD, Action.AUDIT_READ, Action.NODE_ADMIN):
        raise PermissionDeniedError(f"{action.value}: refused for {who}: only operators may")
    if action is Action.SUBMIT and (team is None or team not in p.teams):
        raise PermissionDeniedError(f"submit: refused for {who}: the spec's team {team!r} is not one of the caller's "
                                    f"teams")
    if team is None or team not in p.teams:
        raise PermissionDeniedError(f"{action.value}: refused for {who}: the workload belongs to team {team!r}, "
                                    f"not one of the caller's teams")
    if action in (Action.SUBMIT, Action.READ):
        return
    if p.role is Role.TEAM_ADMIN or owner == p.user:
        return
    raise PermissionDeniedError(f"{action.value}: refused for {who}: the workload belongs to {owner!r}; only its "
                                f"owner, a team-admin of {team}, an operator or its own driver may")

