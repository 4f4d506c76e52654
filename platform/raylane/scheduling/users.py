"""Fairness between the users of one team (Slurm's Fair Tree inside an account, KAI's per-user fairness).

A team's ``UserRule`` (``Team.users``; None: off, and nothing here runs) does two things, both inside the team:
- ``fair``: the team's pending work is ordered, inside each class priority (which still comes first), by its
  user's *share*, least first; a user's next workload then counts as if the one before it held its GPUs, so with
  equal shares a user's second workload goes behind another user's first. Across teams nothing changes: the cycle
  merges the reordered team queues by the ordering's head key as before.
- ``max_share``: a user may hold at most that share of the team's nominal GPU quota (its *cap*); beyond it the
  work waits with ``UserShareExceeded``. Borrowing raises what the team may hold, never a user's cap.

Words
- *user*: ``Workload.user``; None (not known) is one anonymous user of the team.
- *share* of a user: GPUs it holds now (its team's leases, stopping ones included) plus its decayed past usage
  (``Team.user_usage``, GPU-seconds with the scheduler's ``fair_share_half_life_s``) over the mean life of that
  decay: the same units as a team's fair share (``raylane.scheduling.ordering._fair_share.team_share``).

The order is worked out once per cycle per team with the rule on (``n log u`` for ``n`` queued and ``u`` users);
a snapshot of such a team keeps each user's first ``limit`` workloads instead of the queue's first ``limit``, so
that one user's long sweep cannot hide a teammate's run from a cycle. Pure: no Ray, no clock.
"""
from __future__ import annotations

import heapq
import math
from typing import Dict, Iterable, List, Mapping, Optional, Tuple

from raylane.scheduling.types import Lease, SchedulerConfig, Team, UserShareExceeded, Workload

__all__ = ["held_by_user", "user_cap", "order_by_user", "per_user_head", "cap_reason", "user_shares"]


def held_by_user(leases: Iterable[Lease]) -> Dict[Optional[str], float]:
    """GPUs each user holds in ``leases``."""
    held: Dict[Optional[str], float] = {}
    for l in leases:
        w = l.workload
        held[w.user] = held.get(w.user, 0.0) + w.gang.total.gpu
    return held


def user_cap(team: Team) -> Optional[float]:
    """The most GPUs one user of ``team`` may hold, or None (no cap, or no nominal GPU quota to take a share of)."""
    rule = team.users
    if rule is None or rule.max_share is None:
        return None
    q = team.quotas.get("gpu")
    return None if q is None else rule.max_share * q.nominal


def cap_reason(team: Team, cap: float, user: Optional[str], held: float, need: float) -> Optional[UserShareExceeded]:
    """Why a gang of ``need`` GPUs of ``user`` (who holds ``held``) waits under ``cap``; None when it may start."""
    if need > 0 and held + need > cap + 1e-9:
        return UserShareExceeded(team.name, user, held, cap, need)
    return None


def user_shares(team: Team, held: Mapping[Optional[str], float], cfg: SchedulerConfig,
                users: Iterable[Optional[str]]) -> Dict[Optional[str], float]:
    """Each of ``users``' share, in GPUs: held now plus decayed usage over the decay's mean life."""
    mean_life = cfg.fair_share_half_life_s / math.log(2)
    past = team.user_usage
    return {u: held.get(u, 0.0) + past.get(u, 0.0) / mean_life for u in users}


def order_by_user(queue: Tuple[Workload, ...], team: Team, held: Mapping[Optional[str], float],
                  cfg: SchedulerConfig) -> Tuple[Workload, ...]:
    """``queue`` (one team's, in its queue order) reordered by the ``fair`` rule: class priority first, then the
    user of least share, each user's work in queue order; a workload taken counts its GPUs to its user's share for
    the ones after it. Equal shares: the user with fewer workloads taken so far, then queue order."""
    classes: Dict[int, Dict[Optional[str], List[Tuple[int, Workload]]]] = {}
    for i, w in enumerate(queue):
        classes.setdefault(-w.cls.priority, {}).setdefault(w.user, []).append((i, w))
    if len(classes) == 1 and len(next(iter(classes.values()))) == 1:
        return queue  # one user, one class: the queue's order
    out: List[Workload] = []
    for prio in sorted(classes):
        by_user = classes[prio]
        if len(by_user) == 1:
            out.extend(w for _, w in next(iter(by_user.values())))
            continue
        share = user_shares(team, held, cfg, by_user)
        # (share, taken so far, queue index of its next, user's list, index into it); the queue index is unique.
        heap = [(share[u], 0, ws[0][0], u, 0) for u, ws in by_user.items()]
        heapq.heapify(heap)
        while heap:
            s, k, _, u, j = heap[0]
            ws = by_user[u]
            w = ws[j][1]
            out.append(w)
            if j + 1 < len(ws):
                heapq.heapreplace(heap, (s + w.gang.total.gpu, k + 1, ws[j + 1][0], u, j + 1))
            else:
                heapq.heappop(heap)
    return tuple(out)


def per_user_head(queue: Iterable[Workload], limit: int) -> Tuple[Workload, ...]:
    """The workloads of ``queue`` (in order) that are among the first ``limit`` of their user and class priority:
    what a cycle that examines at most ``limit`` reorders (``order_by_user``) exactly as it would the whole queue."""
    seen: Dict[Tuple[Optional[str], int], int] = {}
    out = []
    for w in queue:
        key = (w.user, w.cls.priority)
        n = seen.get(key, 0)
        if n < limit:
            seen[key] = n + 1
            out.append(w)
    return tuple(out)
