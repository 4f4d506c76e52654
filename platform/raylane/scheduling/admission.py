"""The admission axis: may a team take more resources, under its quota?

Quotas follow Kueue's cohort model, with the whole cluster as one cohort:
- A team may hold up to ``nominal + borrowing_limit`` of a resource (no limit when ``borrowing_limit`` is None).
- The part of a team's nominal quota above ``nominal - lending_limit`` (its *guaranteed* part) is *lendable*; all
  lendable quota forms a shared pool. Whatever a team holds beyond its guaranteed part draws on that pool, so a team
  borrows only what others leave unused, and gets it back by reclaiming.
- A team *borrows* a resource when it holds more than its nominal quota of it.
A resource a team has no quota entry for is not limited for that team.

Teams may be nested under cohorts to any depth (``raylane.scheduling.cohorts``): then the pool is a tree, each
cohort keeping the part of its subtree's quota it does not lend for its own members, and a team's room is what the
tree makes available to it (Kueue's hierarchical cohorts). A flat policy has no tree and the one pool above.

Teams may also have per-flavor GPU quotas (``raylane.scheduling.flavors``): the ledger then keeps, beside their
usage, the GPUs they hold per node type, each node type a flat pool of its own (``flavor_room``).

``QuotaLedger`` is the cycle's mutable copy of team usage (changed through ``raylane.scheduling.working``); the
policies read it. Policies: ``quota`` (the above)
and ``none`` (capacity is the only limit; no work is ever "in quota", so no work is protected from preemption by it).
"""
from __future__ import annotations

from typing import Dict, Mapping, Optional, Protocol, Tuple

from raylane.scheduling.cohorts import CohortTree, cohort_tree
from raylane.scheduling.recorded import Recorded
from raylane.scheduling.registry import Registry
from raylane.scheduling.types import RESOURCE_NAMES, ZERO, QuotaExceeded, Resources, Team


_INF = float("inf")
_FLAVOR = object()  # tags a recorded change of the flavor part
_NO_FLAVORS: Dict[str, Dict[str, Tuple[float, float, float]]] = {}


class QuotaLedger(Recorded):
    """Team usage and the lending pool, changed by the cycle as it admits and as preemption searches try victims.

    ``limits`` holds, per known team, ``(resource, nominal, guaranteed, ceiling)`` for each resource it has a quota
    for: read on every check, so worked out once. ``pool_cap`` and ``pool_used`` are the root's pool. With cohorts,
    ``tree`` is the ``CohortTree`` and ``cohort_used`` each cohort's usage U per resource (its module's words);
    both None for a flat policy.

    Flavors (``raylane.scheduling.flavors``): ``flimits`` holds, per team with flavor quotas, ``node type ->
    (nominal, guaranteed, ceiling)`` in GPUs (empty when no team has any: the rest is then never read); ``fused``
    the GPUs each of those teams holds per node type (``flavor_usage``: what its leases hold now); ``fpool_cap`` and
    ``fpool_used`` each node type's pool.
    """

    __slots__ = ("teams", "usage", "pool_cap", "pool_used", "limits", "changes", "tree", "cohort_used",
                 "flimits", "fused", "fpool_cap", "fpool_used")

    def __init__(self, teams: Mapping[str, Team], usage: Mapping[str, Resources],
                 flavor_usage: Optional[Mapping[str, Mapping[str, float]]] = None):
        super().__init__()
        self.teams = teams
        self._init_flavors(teams, flavor_usage or {})
        # How many changes (usage applied or restored): while it stays the same, every check answers as before.
        self.changes = 0
        self.usage: Dict[str, Resources] = dict(usage)
        self.limits: Dict[str, Tuple[Tuple[str, float, float, float], ...]] = {
            name: tuple((r, q.nominal, q.guaranteed, q.ceiling) for r, q in t.quotas.items())
            for name, t in teams.items()
        }
        self.pool_cap: Dict[str, float] = {r: 0.0 for r in RESOURCE_NAMES}
        self.pool_used: Dict[str, float] = {r: 0.0 for r in RESOURCE_NAMES}
        self.tree: Optional[CohortTree] = cohort_tree(teams)
        self.cohort_used: Optional[Dict[str, Dict[str, float]]] = None
        if self.tree is not None:
            self._init_tree()
            return
        for name, lim in self.limits.items():
            u = self.usage.get(name, ZERO)
            for r, nominal, guaranteed, _ in lim:
                self.pool_cap[r] += nominal - guaranteed
                self.pool_used[r] += max(0.0, getattr(u, r) - guaranteed)

    def _init_flavors(self, teams: Mapping[str, Team], fu: Mapping[str, Mapping[str, float]]) -> None:
        flimits = {name: {k: (q.nominal, q.guaranteed, q.ceiling) for k, q in t.flavors.items()}
                   for name, t in teams.items() if t.flavors}
        self.flimits = flimits or _NO_FLAVORS
        self.fused = {name: dict(fu.get(name, {})) for name in flimits}
        self.fpool_cap, self.fpool_used = {}, {}
        for name, lim in flimits.items():
            u = self.fused[name]
            for k, (nominal, g, _) in lim.items():
                self.fpool_cap[k] = self.fpool_cap.get(k, 0.0) + nominal - g
                self.fpool_used[k] = self.fpool_used.get(k, 0.0) + max(0.0, u.get(k, 0.0) - g)

    def _init_tree(self) -> None:
        tree = self.tree
        self.pool_cap = {r: tree.root_quota(r) for r in RESOURCE_NAMES}
        self.cohort_used = {c: {r: 0.0 for r in RESOURCE_NAMES} for c in tree.cohorts}
        for name, lim in self.limits.items():
            u = self.usage.get(name, ZERO)
            self._push_up(tree.up[name], tuple((r, 0.0, max(0.0, getattr(u, r) - g)) for r, _, g, _ in lim))

    def _push_up(self, up: Tuple[str, ...], deltas) -> None:
        """Add to each cohort of ``up`` (nearest first), then to the root's pool, what a child's use beyond its
        guaranteed part changes by: ``deltas`` is ``(resource, before, after)`` of that use. A cohort passes up only
        what goes beyond its own guaranteed part."""
        limits, used, pool_used = self.tree.limits, self.cohort_used, self.pool_used
        for r, before, after in deltas:
            d = after - before
            for c in up:
                if d == 0.0:
                    break
                u = used[c]
                old = u[r]
                g = limits[c][r][1]
                u[r] = new = old + d
                d = (new - g if new > g else 0.0) - (old - g if old > g else 0.0)
            else:
                pool_used[r] += d

    def copy(self) -> "QuotaLedger":
        c = QuotaLedger.__new__(QuotaLedger)
        c.teams, c.limits, c.tree = self.teams, self.limits, self.tree
        c.usage, c.pool_cap, c.pool_used = dict(self.usage), dict(self.pool_cap), dict(self.pool_used)
        c.cohort_used = None if self.cohort_used is None else {k: dict(v) for k, v in self.cohort_used.items()}
        c.flimits, c.fpool_cap = self.flimits, self.fpool_cap
        c.fused, c.fpool_used = {k: dict(v) for k, v in self.fused.items()}, dict(self.fpool_used)
        Recorded.__init__(c)
        c.changes = 0
        return c

    def _restore(self, entry) -> None:
        self.changes += 1
        if entry[0] is _FLAVOR:
            self.fused[entry[1]], self.fpool_used = entry[2], entry[3]
            return
        team, old, pool = entry[:3]
        if old is None:
            self.usage.pop(team, None)
        else:
            self.usage[team] = old
        for r, v in pool:
            self.pool_used[r] = v
        if len(entry) > 3:
            for c, saved in entry[3]:
                self.cohort_used[c] = dict(saved)

    def used(self, team: str) -> Resources:
        return self.usage.get(team, ZERO)

    def add(self, team: str, res: Resources, flavors: Tuple[Tuple[str, float], ...] = ()) -> None:
        """``team`` takes ``res`` more; ``flavors``: the GPUs of it on each node type (``flavors.placed_gpus``),
        read only for a team with flavor quotas."""
        self._apply(team, self.used(team) + res)
        if flavors and team in self.flimits:
            self._apply_flavors(team, flavors, 1.0)

    def remove(self, team: str, res: Resources, flavors: Tuple[Tuple[str, float], ...] = ()) -> None:
        self._apply(team, self.used(team) - res)
        if flavors and team in self.flimits:
            self._apply_flavors(team, flavors, -1.0)

    def _apply_flavors(self, team: str, flavors, sign: float) -> None:
        self.changes += 1
        lim, old = self.flimits[team], self.fused[team]
        if self._log is not None:
            self._log.append((_FLAVOR, team, old, dict(self.fpool_used)))
        new = dict(old)
        for k, gpus in flavors:
            before = old.get(k, 0.0)
            new[k] = after = before + sign * gpus
            q = lim.get(k)
            if q is not None:
                g = q[1]
                self.fpool_used[k] += max(0.0, after - g) - max(0.0, before - g)
        self.fused[team] = new

    def flavor_used(self, team: str, node_type: str) -> float:
        """The GPUs ``team`` holds on nodes of ``node_type`` (counted for a team with flavor quotas only)."""
        got = self.fused.get(team)
        return got.get(node_type, 0.0) if got is not None else 0.0

    def flavor_room(self, team: str, node_type: str) -> Optional[float]:
        """The most GPUs ``team`` could add on nodes of ``node_type`` under its flavor quota for that type, as
        ``room`` answers for a team quota; None when it has no flavor quota for that type (not limited)."""
        lim = self.flimits.get(team)
        q = lim.get(node_type) if lim is not None else None
        if q is None:
            return None
        _, guaranteed, ceiling = q
        used = self.fused[team].get(node_type, 0.0)
        pool = (self.fpool_cap[node_type] - self.fpool_used[node_type]
                + (guaranteed - used if guaranteed > used else 0.0))
        room = ceiling - used
        return room if room < pool else pool

    def _apply(self, team: str, new: Resources) -> None:
        self.changes += 1
        lim = self.limits.get(team)
        if self.tree is not None:
            self._apply_tree(team, new, lim)
            return
        if self._log is not None:
            self._log.append((team, self.usage.get(team), tuple((r, self.pool_used[r]) for r, _, _, _ in lim or ())))
        if lim:
            old = self.usage.get(team, ZERO)
            pool_used = self.pool_used
            for r, _, g, _ in lim:
                pool_used[r] += max(0.0, getattr(new, r) - g) - max(0.0, getattr(old, r) - g)
        self.usage[team] = new

    def _apply_tree(self, team: str, new: Resources, lim) -> None:
        up = self.tree.up.get(team, ())
        if self._log is not None:
            self._log.append((team, self.usage.get(team), tuple((r, self.pool_used[r]) for r, _, _, _ in lim or ()),
                              tuple((c, dict(self.cohort_used[c])) for c in up) if lim else ()))
        if lim:
            old = self.usage.get(team, ZERO)
            self._push_up(up, tuple((r, max(0.0, getattr(old, r) - g), max(0.0, getattr(new, r) - g))
                                    for r, _, g, _ in lim))
        self.usage[team] = new

    def headroom(self, team: str, resource: str) -> float:
        """The most of ``resource`` the team could add now."""
        for r, _, guaranteed, ceiling in self.limits[team]:
            if r == resource:
                used = getattr(self.used(team), resource)
                if self.tree is not None:
                    return self.tree_room(team, resource, guaranteed, ceiling, used)
                return self.room(resource, guaranteed, ceiling, used)
        raise KeyError(resource)

    def room(self, resource: str, guaranteed: float, ceiling: float, used: float) -> float:
        """The most of ``resource`` a team using ``used`` (of a quota with this guaranteed part and ceiling) could
        add now: up to its ceiling, from its own unused guaranteed part and the pool."""
        pool = self.pool_cap[resource] - self.pool_used[resource] + (guaranteed - used if guaranteed > used else 0.0)
        room = ceiling - used
        return room if room < pool else pool

    def tree_room(self, team: str, resource: str, guaranteed: float, ceiling: float, used: float) -> float:
        """``room`` under a cohort tree: what the tree makes available to the team, A(team) (``cohorts``' words),
        worked out from the root's pool down the team's cohorts."""
        limits, cused = self.tree.limits, self.cohort_used
        avail = self.pool_cap[resource] - self.pool_used[resource]
        for c in reversed(self.tree.up.get(team, ())):
            s, g, b = limits[c][resource]
            u = cused[c][resource]
            if b != _INF:
                bound = s - g - (u - g if u > g else 0.0) + b
                if bound < avail:
                    avail = bound
            avail += g - u if g > u else 0.0
        bound = ceiling - guaranteed - (used - guaranteed if used > guaranteed else 0.0)
        if bound < avail:
            avail = bound
        return avail + (guaranteed - used if guaranteed > used else 0.0)

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
        tree = ledger.tree
        for r, nominal, guaranteed, ceiling in lim:
            n = getattr(need, r)
            if n <= 0:
                continue
            used = getattr(u, r)
            if tree is None:
                room = ledger.room(r, guaranteed, ceiling, used)
            else:
                room = ledger.tree_room(team, r, guaranteed, ceiling, used)
            if n > room + 1e-9:
                borrowable = max(0.0, room - max(0.0, nominal - used))
                return QuotaExceeded(team, r, used, nominal, borrowable, n)
        return None


@ADMISSIONS.register("none")
class NoQuota:
    protects_in_quota = False

    def check(self, ledger, team, need):
        return None
