"""Cost in the control plane (a role of ``raylane.control.state.ControlState``; the accounting is ``raylane.cost``'s).

A ledger fed from the journal (``sync``: what it holds that the ledger has not seen, before a report and before a
compaction archives it), the cost counters and budget gauges every ``COST_EXPORT_TICKS`` ticks (``export``), each
team's spend this month (``month_spend``: scale-up reads it against the budgets) and the ``cost`` call.

Owns the ledger, when the counters were last brought up to date and the month's spend per team as of then. Handed
the journal, the clock, the policy (getter: a reload replaces it; its prices and budgets), the tick length, when the
control plane started and the node presence the last compaction archived.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, Optional

from raylane import metrics
from raylane.auth import Principal
from raylane.control import api
from raylane.control.state_gauges import GaugeKeys
from raylane.cost import GROUPS as COST_GROUPS, KINDS as COST_KINDS, Ledger, month_start
from raylane.errors import ValidationError

# The cost counters and budget gauges are brought up to date every this many ticks (raylane.cost).
COST_EXPORT_TICKS = 15


class Costs:
    """The cost ledger and what it exports (module docstring)."""

    def __init__(self, *, journal, clock: Callable[[], float], policy: Callable[[], Any], tick_s: float,
                 started: float, nodes_snapshot: Optional[Dict[str, Any]]):
        self.journal, self.clock, self._policy, self.tick_s = journal, clock, policy, tick_s
        # A ledger that follows the journal; the counters export what accrued since the last export, from this start
        # on. Archived workloads are read when asked for.
        self.ledger = Ledger(history=journal.archived_entries)
        if nodes_snapshot is not None:  # node presence the last compaction archived the entries of
            self.ledger.load_node_spans(nodes_snapshot["spans"])
        self.sync()
        self._cost_exported_at = started
        self._month_spend: Optional[tuple] = None  # (month start, prices, team -> spend this month)
        self._keys = GaugeKeys()

    @property
    def policy(self):
        return self._policy()

    def sync(self) -> None:
        """Feed the ledger what the journal holds that it has not seen."""
        self.ledger.feed(self.journal.entries_after(self.ledger.seq, COST_KINDS))

    def export(self, now: float) -> None:
        """Every ``COST_EXPORT_TICKS`` ticks: the spend accrued since the last export into the cost counters, and each
        team's spend this month and its budget into the gauges (raylane.metrics)."""
        if now - self._cost_exported_at < COST_EXPORT_TICKS * self.tick_s:
            return
        since, self._cost_exported_at = self._cost_exported_at, now
        self.sync()
        prices = self.policy.prices
        leased, idle = self.ledger.spend(prices, now=now, since=since, until=now)
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
            month = self.ledger.report(prices, now=now, since=month_start(now), groups=("team",))
            self._month_spend = (month_start(now), dict(prices), {r.key: r.cost for r in month.groups["team"]})
        else:
            for (team, _, _), v in leased.items():
                self._month_spend[2][team] = self._month_spend[2].get(team, 0.0) + v
        spent = self._month_spend[2]
        for (team,), v in self._keys({(t,): spent.get(t, 0.0) for t in self.policy.teams}, "spend").items():
            metrics.TEAM_SPEND.set(v, team=team)
        share = self.policy.budget_alert_share
        budgets = {}
        for name, t in self.policy.teams.items():
            budgets[(name, "monthly")] = t.budget if t.budget else -1
            budgets[(name, "alert")] = t.budget * share if t.budget else -1
        for (team, what), v in self._keys(budgets, "budgets").items():
            metrics.TEAM_BUDGET.set(v if (team, what) in budgets else -1, team=team, what=what)

    def month_spend(self, now: float) -> Dict[str, float]:
        """Each team's spend this calendar month, as of the last cost export (``export`` keeps it up); summed
        from the journal up to that export when no figure is current (the first call, a new month, new prices)."""
        prices = self.policy.prices
        if (self._month_spend is None or self._month_spend[0] != month_start(now)
                or self._month_spend[1] != prices):
            self.sync()
            until = max(self._cost_exported_at, month_start(now))
            month = self.ledger.report(prices, now=now, since=month_start(now), until=until, groups=("team",))
            self._month_spend = (month_start(now), dict(prices), {r.key: r.cost for r in month.groups["team"]})
        return self._month_spend[2]

    def cost(self, p: Principal, req: api.Cost) -> Dict[str, Any]:
        """Spend from the journal (``raylane.cost.CostReport`` as a dict): the teams in the caller's scope (an
        operator's: all, or ``team``; anyone else's: their own teams, or ``team``, one of them, as the gate
        checked), the cluster's idle cost, each team in scope's month against its budget."""
        if req.team is not None and req.team not in self.policy.teams:
            raise ValidationError("call cost", [("team", req.team, "a team of the policy: one of "
                                                                   + ", ".join(sorted(self.policy.teams)))])
        teams = {req.team} if req.team else (None if p.operator else set(p.teams))
        self.sync()
        rep = self.ledger.report(
            self.policy.prices, now=self.clock(), since=req.since, until=req.until, teams=teams,
            workloads=set(req.workload_ids) if req.workload_ids is not None else None,
            runs={req.mlflow_run_id} if req.mlflow_run_id is not None else None,
            groups=(req.by.value,) if req.by is not None else COST_GROUPS,
            budgets={name: t.budget for name, t in self.policy.teams.items()},
            alert_share=self.policy.budget_alert_share)
        return rep.to_dict()
