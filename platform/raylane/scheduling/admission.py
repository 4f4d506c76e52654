"""The admission axis: may a team take more resources, under its quota?

Quotas follow Kueue's cohort model, with the whole cluster as one cohort:
- A team may hold up to ``nominal + borrowing_limit`` of a resource (no limit when ``borrowing_limit`` is None).
- The part of a team's nominal quota above ``nominal - lending_limit`` (its *guaranteed* part) is *lendable*; all
  lendable quota forms a shared pool. Whatever a team holds beyond its guaranteed part draws on that pool, so a team
  borrows only what others leave unused, and gets it back by reclaiming.
- A team *borrows* a resource when it holds more than its nominal quota of it.
A resource a team has no quota entry for is not limited for that team.

``QuotaLedger`` is the cycle's mutable copy of team usage (changed through ``raylane.scheduling.working``); the
policies read it. Policies: ``quota`` (the above)
and ``none`` (capacity is the only limit; no work is ever "in quota", so no work is protected from preemption by it).
"""
from __future__ import annotations

from typing import Dict, Mapping, Optional, Protocol, Tuple

from raylane.scheduling.recorded import Recorded
from raylane.scheduling.registry import Registry
from raylane.scheduling.types import RESOURCE_NAMES, ZERO, QuotaExceeded, Resources, Team


class QuotaLedger(Recorded):
    """Team usage and the lending pool, changed by the cycle as it admits and as preemption searches try victims.

    ``limits`` holds, per known team, ``(resource, nominal, guaranteed, ceiling)`` for each resource it has a quota
    for: read on every check, so worked out once.
    """

    __slots__ = ("teams", "usage", "pool_cap", "pool_used", "limits", "changes")

    def __init__(self, teams: Mapping[str, Team], usage: Mapping[str, Resources]):
        super().__init__()
        self.teams = teams
        # How many changes (usage applied or restored): while it stays the same, every check answers as before.
        self.changes = 0
        self.usage: Dict[str, Resources] = dict(usage)
        self.limits: Dict[str, Tuple[Tuple[str, float, float, float], ...]] = {
            name: tuple((r, q.nominal, q.guaranteed, q.ceiling) for r, q in t.quotas.items())
            for name, t in teams.items()
        }
        self.pool_cap: Dict[str, float] = {r: 0.0 for r in RESOURCE_NAMES}
        self.pool_used: Dict[str, float] = {r: 0.0 for r in RESOURCE_NAMES}
        for name, lim in self.limits.items():
            u = self.usage.get(name, ZERO)
            for r, nominal, guaranteed, _ in lim:
                self.pool_cap[r] += nominal - guaranteed
                self.pool_used[r] += max(0.0, getattr(u, r) - guaranteed)

    def copy(self) -> "QuotaLedger":
        c = QuotaLedger.__new__(QuotaLedger)
        c.teams, c.limits = self.teams, self.limits
        c.usage, c.pool_cap, c.pool_used = dict(self.usage), dict(self.pool_cap), dict(self.pool_used)
        Recorded.__init__(c)
        c.changes = 0
        return c

    def _restore(self, entry) -> None:
        self.changes += 1
        team, old, pool = entry
        if old is None:
            self.usage.pop(team, None)
        else:
            self.usage[team] = old
        for r, v in pool:
            self.pool_used[r] = v

    def used(self, team: str) -> Resources:
        return self.usage.get(team, ZERO)

    def add(self, team: str, res: Resources) -> None:
        self._apply(team, self.used(team) + res)

    def remove(self, team: str, res: Resources) -> None:
        self._apply(team, self.used(team) - res)

    def _apply(self, team: str, new: Resources) -> None:
        self.changes += 1
        lim = self.limits.get(team)
        if self._log is not None:
            self._log.append((team, self.usage.get(team), tuple((r, self.pool_used[r]) for r, _, _, _ in lim or ())))
        if lim:
            old = self.usage.get(team, ZERO)
            pool_used = self.pool_used
            for r, _, g, _ in lim:
                pool_used[r] += max(0.0, getattr(new, r) - g) - max(0.0, getattr(old, r) - g)
        self.usage[team] = new

    def headroom(self, team: str, resource: str) -> float:
        """The most of ``resource`` the team could add now."""
        for r, _, guaranteed, ceiling in self.limits[team]:
            if r == resource:
                return self.room(resource, guaranteed, ceiling, getattr(self.used(team), resource))
        raise KeyError(resource)

    def room(self, resource: str, guaranteed: float, ceiling: float, used: float) -> float:
        """The most of ``resource`` a team using ``used`` (of a quota with this guaranteed part and ceiling) could
        add now: up to its ceiling, from its own unused guaranteed part and the pool."""
        pool = self.pool_cap[resource] - self.pool_used[resource] + (guaranteed - used if guaranteed > used else 0.0)
        room = ceiling - used
        return room if room < pool else pool

    def borrowing(self, team: str) -> bool:
        u = self.usage.get(team, ZERO)
        return any(getattr(u, r) > nominal + 1e-9 for r, nominal, _, _ in self.limits.get(team, ()))

    def within_nominal(self, team: str, extra: Resources) -> bool:
        lim = self.limits.get(team)
        if lim is None:
            return False
        u = self.usage.get(team, ZERO)
        for r, nominal, _, _ in lim:
            if getattr(u, r) + getattr(extra, r) > nominal + 1e-9:
                return False
        return True


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
        lim = ledger.limits.get(team)
        if lim is None:
            return QuotaExceeded(team, "gpu", ledger.used(team).gpu, 0.0, 0.0, need.gpu)
        u = ledger.usage.get(team, ZERO)
        for r, nominal, guaranteed, ceiling in lim:
            n = getattr(need, r)
            if n <= 0:
                continue
            used = getattr(u, r)
            room = ledger.room(r, guaranteed, ceiling, used)
            if n > room + 1e-9:
                borrowable = max(0.0, room - max(0.0, nominal - used))
                return QuotaExceeded(team, r, used, nominal, borrowable, n)
        return None


@ADMISSIONS.register("none")
class NoQuota:
    protects_in_quota = False

    def check(self, ledger, team, need):
        return None
