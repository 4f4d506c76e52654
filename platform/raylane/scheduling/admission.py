"""The admission axis: may a team take more resources, under its quota?

Quotas follow Kueue's cohort model, with the whole cluster as one cohort:
- A team may hold up to ``nominal + borrowing_limit`` of a resource (no limit when ``borrowing_limit`` is None).
- The part of a team's nominal quota above ``nominal - lending_limit`` (its *guaranteed* part) is *lendable*; all
  lendable quota forms a shared pool. Whatever a team holds beyond its guaranteed part draws on that pool, so a team
  borrows only what others leave unused, and gets it back by reclaiming.
- A team *borrows* a resource when it holds more than its nominal quota of it.
A resource a team has no quota entry for is not limited for that team.

``QuotaLedger`` is the cycle's mutable copy of team usage; the policies read it. Policies: ``quota`` (the above)
and ``none`` (capacity is the only limit; no work is ever "in quota", so no work is protected from preemption by it).
"""
from __future__ import annotations

from typing import Dict, Mapping, Optional, Protocol

from raylane.scheduling.registry import Registry
from raylane.scheduling.types import RESOURCE_NAMES, QuotaExceeded, Resources, Team


class QuotaLedger:
    """Team usage and the lending pool, changed by the cycle as it admits and as preemption searches try victims."""

    __slots__ = ("teams", "usage", "pool_cap", "pool_used")

    def __init__(self, teams: Mapping[str, Team], usage: Mapping[str, Resources]):
        self.teams = teams
        self.usage: Dict[str, Resources] = dict(usage)
        self.pool_cap: Dict[str, float] = {r: 0.0 for r in RESOURCE_NAMES}
        self.pool_used: Dict[str, float] = {r: 0.0 for r in RESOURCE_NAMES}
        for t in teams.values():
            u = self.usage.get(t.name, Resources())
            for r, q in t.quotas.items():
                self.pool_cap[r] += q.nominal - q.guaranteed
                self.pool_used[r] += max(0.0, u.get(r) - q.guaranteed)

    def used(self, team: str) -> Resources:
        return self.usage.get(team, Resources())

    def add(self, team: str, res: Resources) -> None:
        self._apply(team, self.used(team) + res)

    def remove(self, team: str, res: Resources) -> None:
        self._apply(team, self.used(team) - res)

    def _apply(self, team: str, new: Resources) -> None:
        t = self.teams.get(team)
        if t is not None:
            old = self.used(team)
            for r, q in t.quotas.items():
                g = q.guaranteed
                self.pool_used[r] += max(0.0, new.get(r) - g) - max(0.0, old.get(r) - g)
        self.usage[team] = new

    def headroom(self, team: str, resource: str) -> float:
        """The most of ``resource`` the team could add now."""
        q = self.teams[team].quotas[resource]
        used = self.used(team).get(resource)
        pool = self.pool_cap[resource] - self.pool_used[resource] + max(0.0, q.guaranteed - used)
        return min(q.ceiling - used, pool)

    def borrowing(self, team: str) -> bool:
        t = self.teams.get(team)
        if t is None:
            return False
        u = self.used(team)
        return any(u.get(r) > q.nominal + 1e-9 for r, q in t.quotas.items())

    def within_nominal(self, team: str, extra: Resources) -> bool:
        t = self.teams.get(team)
        if t is None:
            return False
        u = self.used(team) + extra
        return all(u.get(r) <= q.nominal + 1e-9 for r, q in t.quotas.items())


class AdmissionPolicy(Protocol):
    """Decides whether a team may take ``need`` more. Stateless; reads the ledger only."""

    # Whether another team's work that is within its nominal quota is protected from preemption.
    protects_in_quota: bool

    def check(self, ledger: QuotaLedger, team: str, need: Resources) -> Optional[QuotaExceeded]: ...


ADMISSIONS: Registry[AdmissionPolicy] = Registry("admission", default="quota")


@ADMISSIONS.register("quota")
class QuotaAdmission:
    protects_in_quota = True

    def check(self, ledger, team, need):
        t = ledger.teams.get(team)
        if t is None:
            return QuotaExceeded(team, "gpu", ledger.used(team).gpu, 0.0, 0.0, need.gpu)
        for r, q in t.quotas.items():
            n = need.get(r)
            if n <= 0:
                continue
            room = ledger.headroom(team, r)
            if n > room + 1e-9:
                used = ledger.used(team).get(r)
                borrowable = max(0.0, room - max(0.0, q.nominal - used))
                return QuotaExceeded(team, r, used, q.nominal, borrowable, n)
        return None


@ADMISSIONS.register("none")
class NoQuota:
    protects_in_quota = False

    def check(self, ledger, team, need):
        return None
