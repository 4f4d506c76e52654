"""The control plane's calls about who is asking and what it costs (a mixin of ``ControlState``): ``whoami``, the
teams and their quotas, tokens (``raylane.control.gate``: create, job token, rotate, revoke, list), the audit trail,
cost (``raylane.cost``: the ledger fed from the journal, the counters and budget gauges every ``COST_EXPORT_TICKS``
ticks, the ``cost`` report) and a policy reload (refused when a live workload would not fit the new policy).
"""
from __future__ import annotations

from typing import Any, Dict, List

from raylane import metrics
from raylane.auth import Principal
from raylane.config.loader import load_policy_from_dict, load_spec_from_dict
from raylane.control import api
from raylane.control.gate import SCRIPT_SCOPE
from raylane.control.journal import Kind
from raylane.cost import GROUPS as COST_GROUPS, KINDS as COST_KINDS, month_start
from raylane.errors import PermissionDeniedError, ValidationError
from raylane.scheduling.cohorts import cohort_path, cohort_row, cohort_usage
from raylane.scheduling.types import Resources

# The cost counters and budget gauges are brought up to date every this many ticks (raylane.cost).
COST_EXPORT_TICKS = 15


class AdminCalls:
    """Needs of the state machine: ``clock``, ``journal``, ``records``, ``state``, ``policy``, ``gate``, ``tick_s``,
    ``_ledger``, ``_cost_exported_at``, ``_month_spend``, ``_gauge_keys``, ``_set_policy``, ``_rebuild_state``,
    ``_poke``."""

    def _api_whoami(self, p: Principal, req: api.WhoAmI) -> Dict[str, Any]:
        return {"user": p.user, "teams": list(p.teams), "role": p.role.value, "token_id": p.token_id,
                "job": p.job, "auth": self.gate.enabled}

    def _api_teams(self, p: Principal, req: api.Teams) -> List[Dict[str, Any]]:
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

    def _api_cohorts(self, p: Principal, req: api.Cohorts) -> List[Dict[str, Any]]:
        return [cohort_row(c) for c in cohort_usage(self.state.teams, self.state.usage).values()]

    def _token_reply(self, token: str) -> Dict[str, Any]:
        """A new token (its only copy, for the caller) with its record."""
        return {"token": token, **self.gate.store.tokens[token.split("_")[1]].public(self.clock())}

    def _api_token_create(self, p: Principal, req: api.TokenCreate) -> Dict[str, Any]:
        token = self.gate.add_token(user=req.user, teams=req.teams, role=req.role, created_by=p.user,
                                    ttl_s=req.ttl_s, note=req.note)
        return self._token_reply(token)

    def _api_job_token(self, p: Principal, req: api.JobToken) -> Dict[str, Any]:
        if not self.gate.enabled:
            return {"token": None}
        if p.job:
            raise PermissionDeniedError(f"job-token: refused for {p.user}: a job token cannot create tokens")
        token = self.gate.add_token(user=p.user, teams=p.teams, role=p.role, created_by=p.user, ttl_s=req.ttl_s,
                                    parent=p.token_id, note=req.note or "job token",
                                    scope=SCRIPT_SCOPE if req.script else "")
        return self._token_reply(token)

    def _api_token_rotate(self, p: Principal, req: api.TokenRotate) -> Dict[str, Any]:
        token = self.gate.rotate(req.token_id, p)
        return self._token_reply(token)

    def _api_token_revoke(self, p: Principal, req: api.TokenRevoke) -> Dict[str, Any]:
        return self.gate.revoke(req.token_id, p)

    def _api_token_list(self, p: Principal, req: api.TokenList) -> List[Dict[str, Any]]:
        return self.gate.token_list(req.include_revoked)

    def _cost_sync(self) -> None:
        """Feed the ledger what the journal holds that it has not seen."""
        self._ledger.feed(self.journal.entries_after(self._ledger.seq, COST_KINDS))

    def _export_costs(self, now: float) -> None:
        """Every ``COST_EXPORT_TICKS`` ticks: the spend accrued since the last export into the cost counters, and each
        team's spend this month and its budget into the gauges (raylane.metrics)."""
        if now - self._cost_exported_at < COST_EXPORT_TICKS * self.tick_s:
            return
        since, self._cost_exported_at = self._cost_exported_at, now
        self._cost_sync()
        prices = self.policy.prices
        leased, idle = self._ledger.spend(prices, now=now, since=since, until=now)
        for (team, cls, ntype), v in leased.items():
            if v > 0:
                metrics.COST.inc(v, team=team, workload_class=cls, node_type=ntype)
        for ntype, v in idle.items():
            if v > 0:
                metrics.IDLE_COST.inc(v, node_type=ntype)
        # The month's spend: summed from the journal once (at the first export, a new month, new prices), then
        # kept up by each export's window, which partition the month.
        if (self._month_spend is None or self._month_spend[0] != month_start(now)
                or self._month_spend[1] != prices):
            month = self._ledger.report(prices, now=now, since=month_start(now), groups=("team",))
            self._month_spend = (month_start(now), dict(prices), {r.key: r.cost for r in month.groups["team"]})
        else:
            for (team, _, _), v in leased.items():
                self._month_spend[2][team] = self._month_spend[2].get(team, 0.0) + v
        spent = self._month_spend[2]
        for (team,), v in self._gauge_keys({(t,): spent.get(t, 0.0) for t in self.policy.teams},
                                           "_last_spend").items():
            metrics.TEAM_SPEND.set(v, team=team)
        share = self.policy.budget_alert_share
        budgets = {}
        for name, t in self.policy.teams.items():
            budgets[(name, "monthly")] = t.budget if t.budget else -1
            budgets[(name, "alert")] = t.budget * share if t.budget else -1
        for (team, what), v in self._gauge_keys(budgets, "_last_budgets").items():
            metrics.TEAM_BUDGET.set(v if (team, what) in budgets else -1, team=team, what=what)

    def month_spend(self, now: float) -> Dict[str, float]:
        """Each team's spend this calendar month, as of the last cost export (``_export_costs`` keeps it up); summed
        from the journal up to that export when no figure is current (the first call, a new month, new prices)."""
        prices = self.policy.prices
        if (self._month_spend is None or self._month_spend[0] != month_start(now)
                or self._month_spend[1] != prices):
            self._cost_sync()
            until = max(self._cost_exported_at, month_start(now))
            month = self._ledger.report(prices, now=now, since=month_start(now), until=until, groups=("team",))
            self._month_spend = (month_start(now), dict(prices), {r.key: r.cost for r in month.groups["team"]})
        return self._month_spend[2]

    def _api_cost(self, p: Principal, req: api.Cost) -> Dict[str, Any]:
        """Spend from the journal (``raylane.cost.CostReport`` as a dict): the teams in the caller's scope (an
        operator's: all, or ``team``; anyone else's: their own teams, or ``team``, one of them, as the gate
        checked), the cluster's idle cost, each team in scope's month against its budget."""
        if req.team is not None and req.team not in self.policy.teams:
            raise ValidationError("call cost", [("team", req.team, "a team of the policy: one of "
                                                                   + ", ".join(sorted(self.policy.teams)))])
        teams = {req.team} if req.team else (None if p.operator else set(p.teams))
        self._cost_sync()
        rep = self._ledger.report(
            self.policy.prices, now=self.clock(), since=req.since, until=req.until, teams=teams,
            workloads=set(req.workload_ids) if req.workload_ids is not None else None,
            runs={req.mlflow_run_id} if req.mlflow_run_id is not None else None,
            groups=(req.by.value,) if req.by is not None else COST_GROUPS,
            budgets={name: t.budget for name, t in self.policy.teams.items()},
            alert_share=self.policy.budget_alert_share)
        return rep.to_dict()

    def _api_audit(self, p: Principal, req: api.Audit) -> List[Dict[str, Any]]:
        def team_of(wid):
            rec = self.records.get(wid) if isinstance(wid, str) else None
            return rec.team if rec is not None else None

        return self.gate.audit(since=req.since, user=req.user, team=req.team, limit=req.limit, teams_of=team_of)

    def _api_reload_policy(self, p: Principal, req: api.ReloadPolicy) -> Dict[str, Any]:
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
        self._policy_data = self._journaled_policy = req.policy
        self._set_policy(req.policy)
        self._rebuild_state()
        self._poke()
        return {"teams": sorted(new.teams), "classes": sorted(new.classes)}
