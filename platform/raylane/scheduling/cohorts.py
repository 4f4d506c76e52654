"""The quota tree: teams nested under cohorts to any depth (org > department > team), Kueue's hierarchical cohorts.

This module owns the tree's arithmetic: what each node may lend, keep and borrow. It holds no usage of its own:
``QuotaLedger`` (``raylane.scheduling.admission``) keeps the usage and asks the tree what it implies, preemption asks
it which subtrees borrow, fair share how subtrees compare, and ``cohort_usage`` reports each cohort for displays. A
flat policy (no team names a cohort) has no tree: every team is a child of the root and the ledger keeps one pool,
as it always did.

Words (per resource; a team or cohort is a *node*; the *root* is the implicit cohort that is the whole cluster,
parent of every node that names no parent; a cohort is known to the core through its teams' ``Team.cohort``):
- *subtree quota* S(n): a team's nominal; a cohort's own nominal plus what each child puts in, S(k) - G(k).
- *guaranteed* G(n): the part of S(n) that never leaves n: S(n) - lending_limit (at least 0), 0 without a limit.
- *usage* U(n): what a team holds; for a cohort, what its children hold beyond their guaranteed parts,
  sum of max(0, U(k) - G(k)). The root's S and U are the ledger's ``pool_cap`` and ``pool_used``.
- *available* A(n), what n may add now: max(0, G(n) - U(n)) + min(A(parent), S(n) - G(n) - max(0, U(n) - G(n)) +
  borrowing_limit(n)) (no bound without a borrowing limit); A(root) = S(root) - U(root). A gang fits when it needs
  at most A(team). So a node borrows first from what its nearest cohort keeps for its members (that cohort's
  guaranteed part), then from farther up; its borrowing limit bounds what its subtree takes beyond what it puts in.
- *subtree nominal* T(n) and *held* V(n): the nominal quotas in n's subtree (cohorts' own included) and what its
  teams hold. A subtree *borrows* a resource when V > T: reclaim reads these (``crosses``).

A resource a cohort has no quota entry for: own nominal 0, no limits (it passes its members' quota up unchanged).
A team without a quota entry for a resource is not limited by it and does not count in any cohort's numbers of it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, Iterable, List, Mapping, Optional, Tuple

from raylane.scheduling.types import RESOURCE_NAMES, ZERO, Cohort, Resources, Team

__all__ = ["CohortTree", "CohortUsage", "cohort_tree", "cohort_usage", "cohort_path", "cohort_row"]

_INF = math.inf


class CohortTree:
    """The cohorts above a set of teams, with each cohort's S, G, borrowing limit and T per resource. Immutable once
    built; shared by a ledger and its copies.

    ``up[team]``: the team's cohorts, nearest first (empty for a team under the root). ``path[team]``: the same,
    top-down. ``members[cohort]``: every team under it, at any depth. ``limits[cohort]``: per resource,
    ``(S, G, borrowing limit or inf)``. ``nominal[cohort]``: T per resource.
    """

    __slots__ = ("cohorts", "teams", "up", "path", "children", "members", "limits", "nominal", "weight", "decayed")

    def __init__(self, teams: Mapping[str, Team]):
        self.teams = teams
        self.cohorts: Dict[str, Cohort] = {}
        self.up: Dict[str, Tuple[str, ...]] = {}
        for name, t in teams.items():
            chain: List[str] = []
            c = t.cohort
            while c is not None:
                self.cohorts.setdefault(c.name, c)
                chain.append(c.name)
                c = c.parent
            self.up[name] = tuple(chain)
        self.path = {t: tuple(reversed(chain)) for t, chain in self.up.items()}
        # Children of each cohort ("" is the root), teams and cohorts apart, in a fixed order.
        self.children: Dict[str, Tuple[List[str], List[str]]] = {"": ([], [])}
        for c in self.cohorts.values():
            self.children.setdefault(c.name, ([], []))
        for c in self.cohorts.values():
            self.children[c.parent.name if c.parent is not None else ""][1].append(c.name)
        for name, t in teams.items():
            self.children[t.cohort.name if t.cohort is not None else ""][0].append(name)
        self.members: Dict[str, Tuple[str, ...]] = {c: () for c in self.cohorts}
        for name, chain in self.up.items():
            for c in chain:
                self.members[c] += (name,)
        self.weight = {c: co.weight for c, co in self.cohorts.items()}
        self.decayed = {c: sum(teams[t].decayed_usage for t in ms) for c, ms in self.members.items()}
        self.limits: Dict[str, Dict[str, Tuple[float, float, float]]] = {}
        self.nominal: Dict[str, Dict[str, float]] = {}
        for c in self.bottom_up():
            self._sum(c)

    def bottom_up(self) -> List[str]:
        """Every cohort, each after the cohorts under it."""
        order: List[str] = []

        def visit(c: str) -> None:
            for k in self.children[c][1]:
                visit(k)
            order.append(c)

        for top in self.children[""][1]:
            visit(top)
        return order

    def _sum(self, c: str) -> None:
        own = self.cohorts[c].quotas
        teams, subs = self.children[c]
        lim: Dict[str, Tuple[float, float, float]] = {}
        nom: Dict[str, float] = {}
        for r in RESOURCE_NAMES:
            q = own.get(r)
            s = t = q.nominal if q is not None else 0.0
            for k in teams:
                kq = self.teams[k].quotas.get(r)
                if kq is not None:
                    s += kq.nominal - kq.guaranteed
                    t += kq.nominal
            for k in subs:
                ks, kg, _ = self.limits[k][r]
                s += ks - kg
                t += self.nominal[k][r]
            g = 0.0
            b = _INF
            if q is not None:
                if q.lending_limit is not None:
                    g = max(0.0, s - q.lending_limit)
                if q.borrowing_limit is not None:
                    b = q.borrowing_limit
            lim[r] = (s, g, b)
            nom[r] = t
        self.limits[c] = lim
        self.nominal[c] = nom

    def root_quota(self, r: str) -> float:
        """S(root) of ``r``: the pool every top-level node puts its lendable quota in."""
        teams, subs = self.children[""]
        s = 0.0
        for k in teams:
            kq = self.teams[k].quotas.get(r)
            if kq is not None:
                s += kq.nominal - kq.guaranteed
        for k in subs:
            ks, kg, _ = self.limits[k][r]
            s += ks - kg
        return s

    # -- reclaim ------------------------------------------------------------------------------------------------
    def distance(self, team: str, other: str) -> int:
        """How many cohort boundaries up from ``team`` the lowest cohort it shares with ``other`` is: 0 when they
        have the same parent (the root included), 1 for cousins under one grandparent, and so on."""
        mine, theirs = self.up.get(team, ()), set(self.up.get(other, ()))
        for i, c in enumerate(mine):
            if c in theirs:
                return i
        return len(mine)

    def below_common(self, team: str, other: str) -> Tuple[str, ...]:
        """``team``'s cohorts, nearest first, that ``other`` is not under: the boundaries between ``team`` and the
        lowest cohort the two share."""
        theirs = set(self.up.get(other, ()))
        out: List[str] = []
        for c in self.up.get(team, ()):
            if c in theirs:
                break
            out.append(c)
        return tuple(out)

    def held(self, cohort: str, r: str, held_by) -> float:
        """V(cohort) of ``r``: what the teams under it with a quota entry for ``r`` hold (``held_by(team)``)."""
        teams = self.teams
        return sum(held_by(t).get(r) for t in self.members[cohort] if r in teams[t].quotas)


def cohort_tree(teams: Mapping[str, Team]) -> Optional[CohortTree]:
    """The tree above ``teams``; None for a flat policy (no team names a cohort)."""
    if all(t.cohort is None for t in teams.values()):
        return None
    return CohortTree(teams)


# ---------------------------------------------------------------------------------------------------- report


@dataclass(frozen=True)
class CohortUsage:
    """One cohort as a display shows it, per resource: ``nominal`` (T: the nominal quotas under it, its own
    included), ``used`` (V: what its teams hold, of the resources they have a quota for), ``borrowed`` (what its
    subtree holds beyond its nominal), ``idle`` (its nominal it does not use) and ``lendable`` (the part of ``idle``
    its lending limit lets others use). ``parent`` None: a top-level cohort."""

    name: str
    parent: Optional[str]
    teams: Tuple[str, ...]
    nominal: Resources
    used: Resources
    borrowed: Resources
    idle: Resources
    lendable: Resources


def cohort_usage(teams: Mapping[str, Team], usage: Mapping[str, Resources]) -> Dict[str, CohortUsage]:
    """Each cohort's numbers for ``usage`` (team -> what it holds), top-down; empty for a flat policy."""
    tree = cohort_tree(teams)
    if tree is None:
        return {}
    out: Dict[str, CohortUsage] = {}
    held_by = lambda t: usage.get(t, ZERO)  # noqa: E731
    for c in reversed(tree.bottom_up()):
        co = tree.cohorts[c]
        vals: Dict[str, Dict[str, float]] = {k: {} for k in ("nominal", "used", "borrowed", "idle", "lendable")}
        for r in RESOURCE_NAMES:
            t, v = tree.nominal[c][r], tree.held(c, r, held_by)
            idle = max(0.0, t - v)
            q = co.quotas.get(r)
            lend = idle if q is None or q.lending_limit is None else min(idle, q.lending_limit)
            for k, x in (("nominal", t), ("used", v), ("borrowed", max(0.0, v - t)), ("idle", idle),
                         ("lendable", lend)):
                vals[k][r] = x
        out[c] = CohortUsage(c, co.parent.name if co.parent is not None else None, tree.members[c],
                             **{k: Resources(**x) for k, x in vals.items()})
    return out


def cohort_path(team: Team) -> List[str]:
    """The cohorts above ``team``, top-down (``["org", "research"]``); empty under a flat policy."""
    out: List[str] = []
    c = team.cohort
    while c is not None:
        out.append(c.name)
        c = c.parent
    return out[::-1]


def cohort_row(c: CohortUsage) -> Dict[str, object]:
    """``c`` as a reply's dict: ``cohort``, ``parent``, ``teams`` and, per figure, resource -> amount."""
    out: Dict[str, object] = {"cohort": c.name, "parent": c.parent, "teams": list(c.teams)}
    for k in ("nominal", "used", "borrowed", "idle", "lendable"):
        out[k] = dict(getattr(c, k).items())
    return out


def crosses(tree: CohortTree, team: str, preemptor_team: str, over: Iterable[str], held_by) -> bool:
    """Whether ``team``'s borrowing of some resource in ``over`` (those it holds beyond its nominal) crosses every
    cohort boundary between it and ``preemptor_team``: each of its cohorts below the lowest one they share holds
    more than its subtree nominal of that resource too. Only then may the preemptor reclaim from ``team``."""
    between = tree.below_common(team, preemptor_team)
    for r in over:
        if all(tree.held(c, r, held_by) > tree.nominal[c][r] + 1e-9 for c in between):
            return True
    return False
