"""The control plane's calls about who is asking and what is allowed (a role of ``raylane.control.state.
ControlState``): ``whoami``, the teams and their quotas, the cohorts, tokens (``raylane.control.gate``: create, job
token, rotate, revoke, list), the audit trail and a policy reload (refused when a live workload would not fit the new
policy). The ``cost`` call is ``state_costs``'.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List

from raylane.auth import Principal
from raylane.config.loader import load_policy_from_dict, load_spec_from_dict
from raylane.control import api
from raylane.control.gate import SCRIPT_SCOPE
from raylane.control.journal import Kind
from raylane.errors import PermissionDeniedError, ValidationError
from raylane.scheduling.cohorts import cohort_path, cohort_row, cohort_usage
from raylane.scheduling.types import Resources


class Admin:
    """The calls about callers, teams, tokens, the audit trail and the policy. Handed the clock, the journal, the
    records, the ``ClusterState`` (getter: a policy reload replaces it), the gate and ``adopt_policy`` (the new
    policy, journaled already, put in force: ``ControlState``)."""

    def __init__(self, *, clock: Callable[[], float], journal, records, state: Callable[[], Any], gate,
                 adopt_policy: Callable[[Dict[str, Any]], None]):
        self.clock, self.journal, self.records, self._state, self.gate = clock, journal, records, state, gate
        self._adopt_policy = adopt_policy

    @property
    def state(self):
        return self._state()

    def whoami(self, p: Principal, req: api.WhoAmI) -> Dict[str, Any]:
        return {"user": p.user, "teams": list(p.teams), "role": p.role.value, "token_id": p.token_id,
                "job": p.job, "auth": self.gate.enabled}

    def teams(self, p: Principal, req: api.Teams) -> List[Dict[str, Any]]:
        counts: Dict[tuple, int] = {}
        for rec in self.records.values():
            if not rec.state.terminal:
                key = (rec.team, "running" if rec.state.holds_lease else "pending")
                counts[key] = counts.get(key, 0) + 1
        rows = []
        for name, team in sorted(self.state.teams.items()):
            used = self.state.usage.get(name, Resources())
            rows.append({"team": name, "weight": team.weight, "used": dict(used.items()),
                         "cohorts": cohort_path(team),
                         "pending": counts.get((name, "pending"), 0), "running": counts.get((name, "running"), 0),
                         "quotas": {r: {"used": used.get(r), "nominal": q.nominal,
                                        "borrowing_limit": q.borrowing_limit, "lending_limit": q.lending_limit}
                                    for r, q in team.quotas.items()}})
        return rows

    def cohorts(self, p: Principal, req: api.Cohorts) -> List[Dict[str, Any]]:
        return [cohort_row(c) for c in cohort_usage(self.state.teams, self.state.usage).values()]

    def _token_reply(self, token: str) -> Dict[str, Any]:
        """A new token (its only copy, for the caller) with its record."""
        return {"token": token, **self.gate.store.tokens[token.split("_")[1]].public(self.clock())}

    def token_create(self, p: Principal, req: api.TokenCreate) -> Dict[str, Any]:
        token = self.gate.add_token(user=req.user, teams=req.teams, role=req.role, created_by=p.user,
                                    ttl_s=req.ttl_s, note=req.note)
        return self._token_reply(token)

    def job_token(self, p: Principal, req: api.JobToken) -> Dict[str, Any]:
        if not self.gate.enabled:
            return {"token": None}
        if p.job:
            raise PermissionDeniedError(f"job-token: refused for {p.user}: a job token cannot create tokens")
        token = self.gate.add_token(user=p.user, teams=p.teams, role=p.role, created_by=p.user, ttl_s=req.ttl_s,
                                    parent=p.token_id, note=req.note or "job token",
                                    scope=SCRIPT_SCOPE if req.script else "")
        return self._token_reply(token)

    def token_rotate(self, p: Principal, req: api.TokenRotate) -> Dict[str, Any]:
        token = self.gate.rotate(req.token_id, p)
        return self._token_reply(token)

    def token_revoke(self, p: Principal, req: api.TokenRevoke) -> Dict[str, Any]:
        return self.gate.revoke(req.token_id, p)

    def token_list(self, p: Principal, req: api.TokenList) -> List[Dict[str, Any]]:
        return self.gate.token_list(req.include_revoked)

    def audit(self, p: Principal, req: api.Audit) -> List[Dict[str, Any]]:
        def team_of(wid):
            rec = self.records.get(wid) if isinstance(wid, str) else None
            return rec.team if rec is not None else None

        return self.gate.audit(since=req.since, user=req.user, team=req.team, limit=req.limit, teams_of=team_of)

    def reload_policy(self, p: Principal, req: api.ReloadPolicy) -> Dict[str, Any]:
        """Replace the policy: every workload still queued or running must fit the new one, or nothing changes."""
        new = load_policy_from_dict(req.policy, "policy")
        errors = []
        for rec in self.records.values():
            if rec.state.terminal:
                continue
            try:
                load_spec_from_dict(rec.spec, f"workload {rec.id}", policy=new)
            except ValidationError as exc:
                errors += [(f"workload {rec.id}: {path}", value, allowed) for path, value, allowed in exc.errors]
        if errors:
            raise ValidationError("policy reload refused: workloads in the queue or running would not fit it", errors)
        self.journal.append(Kind.POLICY, "@policy", policy=req.policy, by=p.user)
        self._adopt_policy(req.policy)
        return {"teams": sorted(new.teams), "classes": sorted(new.classes)}
