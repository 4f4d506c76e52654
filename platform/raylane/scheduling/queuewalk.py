"""The queue walk: the order in which a scheduling cycle examines the pending workloads of its team queues.

This module owns that order, and nothing else: the per-team views that an ordering's head key reads
(``OrderingPolicy.head_key``'s ``team``), the merge of the team queues by those keys, and when a team is re-keyed.
``raylane.scheduling.cycle`` steps through it while it decides; the queue forecast's planner
(``raylane.forecast.plan``) walks it to plan the workloads in the order the live cycle would examine them. Neither
has a copy. It decides nothing and changes no book: the caller changes its quota ledger (an admission, a planned
start) and then says so (``took``). Pure: no Ray, no clock, no randomness.

Words
- *team queue*: one team's pending workloads in its queue order (``queue_key``; drivers keep them so), put back
  workloads (``requeued``) at their place by that key, then, for a team whose user rule is ``fair``, reordered by
  its users' shares (``raylane.scheduling.users.order_by_user``).
- *cursor*: the index in its team queue of the next workload of a team that the walk has not reached; that
  workload is the team's *head*.
- *key*: a team's head key, ``head_key(head, view, cfg)``, read with what the team holds now on the ledger. The
  walk takes the head of least key, then that team's next workload becomes its head and is keyed. Every ordering's
  keys end in the workload id, so no two heads tie: the order depends on the keys alone.
- *re-key*: read a team's key again after what it holds changed (fair share reads it; under a cohort tree it reads
  what the team's cohorts hold, so every team is re-keyed).

Cost: a step is one key and one heap operation over the teams; a re-key after an admission rebuilds the heap of
teams (a few dozen). Where the head key is the queue key (``StaticOrdering``) and no key reads what a team holds,
iterating the walk whole is a merge of the team queues (``heapq.merge``, the same order as stepping).
"""
from __future__ import annotations

import heapq
from bisect import bisect_right
from typing import Callable, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Tuple

from raylane.scheduling.admission import QuotaLedger
from raylane.scheduling.ordering.base import OrderingPolicy, StaticOrdering
from raylane.scheduling.types import ZERO, SchedulerConfig, Team, Workload
from raylane.scheduling.users import order_by_user

__all__ = ["QueueWalk", "HeldByUser"]

# GPUs each user of a team holds now (``users.held_by_user``), asked per team name, only of a team whose user rule
# is ``fair`` and whose queue is not empty.
HeldByUser = Callable[[str], Mapping[Optional[str], float]]

_NO_TEAM = Team("", {})


class _View:
    """A team as an ordering's head key reads it (``ordering.base.TeamView``); ``ledger``: what every team holds
    now, for orderings that compare cohorts (fair share under a cohort tree). ``usage`` is set before each key."""

    __slots__ = ("team", "usage", "ledger")

    def __init__(self, team: Team, ledger: QuotaLedger):
        self.team, self.usage, self.ledger = team, ZERO, ledger


class QueueWalk:
    """The team queues of one cycle, merged by the ordering's head key (module docstring).

    ``queues``: team -> its pending workloads in queue order (not changed: the walk keeps its own lists where it
    changes one). ``ledger``: the quota ledger the keys read what a team holds from; the caller changes it, the walk
    only reads it. ``requeued``: workloads to put back in their team queues at their place by ``queue_key`` before
    the walk starts (the forecast's plan: the workloads of terminating leases, with the service they will have had).
    ``held``: GPUs per user a team holds now, for the teams whose user rule is ``fair`` (None: no team's users are
    reordered). ``cohorts``: whether ``took`` re-keys every team under a cohort tree, as the cycle does (False: only
    the team that took, as the forecast's plan has done so far).

    Step by step (the cycle): ``next`` gives the next workload, ``took`` says that a team's holdings changed,
    ``head``, ``skip_to`` and ``drop`` let a caller pass over part of a team queue, ``rest`` gives what was not
    reached. Whole (the plan): iterate a fresh walk; ``took`` may be called between two workloads. Not thread-safe:
    one walk per cycle.
    """

    __slots__ = ("queues", "cursor", "keys", "_ledger", "_order", "_cfg", "_views", "_heap", "_seq", "_cohorts",
                 "_static")

    def __init__(self, queues: Mapping[str, Sequence[Workload]], teams: Mapping[str, Team], ledger: QuotaLedger,
                 order: OrderingPolicy, cfg: SchedulerConfig, *, requeued: Iterable[Workload] = (),
                 held: Optional[HeldByUser] = None, cohorts: bool = True):
        self._ledger, self._order, self._cfg, self._cohorts = ledger, order, cfg, cohorts
        qs: Dict[str, Sequence[Workload]] = dict(queues)
        key, own = order.queue_key, set()
        for w in requeued:
            if w.team not in own:  # the walk's own list of that team, to change
                qs[w.team] = list(qs.get(w.team, ()))
                own.add(w.team)
            q = qs[w.team]
            q.insert(bisect_right(q, key(w, cfg), key=lambda x: key(x, cfg)), w)
        if held is not None:
            for t in teams.values():
                q = qs.get(t.name)
                if q and t.users is not None and t.users.fair:
                    qs[t.name] = order_by_user(tuple(q), t, held(t.name), cfg)
        self.queues = qs
        self._static = isinstance(order, StaticOrdering)
        # Only teams with work get a view, a cursor and a key.
        self._views = {t: _View(teams.get(t, _NO_TEAM), ledger) for t, q in qs.items() if q}
        self.cursor: Dict[str, int] = {}
        self.keys: Dict[str, Tuple] = {}
        heap: List[Tuple[Tuple, int, str]] = []
        for seq, team in enumerate(self._views):
            self.cursor[team] = 0
            k = self.keys[team] = self._key(team, qs[team][0])
            heap.append((k, seq, team))
        heapq.heapify(heap)
        self._heap, self._seq = heap, len(heap)

    def _key(self, team: str, w: Workload) -> Tuple:
        view = self._views[team]
        view.usage = self._ledger.used(team)
        return self._order.head_key(w, view, self._cfg)

    def __bool__(self) -> bool:
        """Whether some team still has a head."""
        return bool(self._heap)

    # -- step by step ---------------------------------------------------------------------------------------------
    def next(self, limit: Optional[int] = None) -> Optional[Tuple[str, Workload]]:
        """(team, workload): the head of least key, or None when every queue is walked. The team's next workload
        becomes its head and is keyed now, with what the team holds now; ``limit``: its queue ends there (a queue is
        then walked no further than its first ``limit``)."""
        heap = self._heap
        if not heap:
            return None
        team = heap[0][2]
        q = self.queues[team]
        cursor = self.cursor
        i = cursor[team] + 1
        cursor[team] = i
        if i < len(q) and (limit is None or i < limit):
            view = self._views[team]  # (``_key``, written out: this is every step of every cycle)
            view.usage = self._ledger.used(team)
            k = self.keys[team] = self._order.head_key(q[i], view, self._cfg)
            self._seq = seq = self._seq + 1
            heapq.heapreplace(heap, (k, seq, team))
        else:
            heapq.heappop(heap)
        return team, q[i - 1]

    def took(self, team: str) -> None:
        """What ``team`` holds on the ledger changed (an admission, a planned start): re-key it; under a cohort tree
        (and ``cohorts``) every team, since a key may read what the team's cohorts hold."""
        if self._static:
            return  # its keys read no holdings
        heap, queues, cursor = self._heap, self.queues, self.cursor
        if self._cohorts and self._ledger.tree is not None:
            heap[:] = [(self._key(t, queues[t][cursor[t]]), s, t) for _, s, t in heap]
            heapq.heapify(heap)
            self.keys.update((t, k) for k, _, t in heap)
            return
        q = queues.get(team)
        i = cursor.get(team, 0)
        if q is None or i >= len(q):
            return
        k = self._key(team, q[i])
        if k != self.keys[team]:
            self.keys[team] = k
            for n, (_, s, t) in enumerate(heap):
                if t == team:
                    heap[n] = (k, s, t)
                    heapq.heapify(heap)
                    return

    def head(self) -> Optional[str]:
        """The team whose head comes next, or None."""
        return self._heap[0][2] if self._heap else None

    def skip_to(self, j: int) -> None:
        """The next team (``head``)'s cursor moves on to ``j`` (past its head): what lies between is passed over,
        and the team is keyed by its workload at ``j``."""
        team = self._heap[0][2]
        self.cursor[team] = j
        self._seq += 1
        k = self.keys[team] = self._key(team, self.queues[team][j])
        heapq.heapreplace(self._heap, (k, self._seq, team))

    def drop(self) -> None:
        """The next team (``head``) leaves the walk: the rest of its queue is not reached."""
        heapq.heappop(self._heap)

    def rest(self) -> Iterator[Workload]:
        """Every workload the walk has not reached (nor passed over), team by team."""
        cursor = self.cursor
        for team, q in self.queues.items():
            yield from q[cursor.get(team, 0):]

    # -- whole -------------------------------------------------------------------------------------------------
    def __iter__(self) -> Iterator[Workload]:
        """Every workload, in the walk's order (of a walk not stepped yet)."""
        if self._static:
            # The head key is the queue key and reads no holdings: stepping is a k-way merge by it.
            key, cfg = self._order.queue_key, self._cfg
            yield from heapq.merge(*self.queues.values(), key=lambda w: key(w, cfg))
            return
        step = self.next
        while True:
            got = step()
            if got is None:
                return
            yield got[1]  # ``took`` may change what the team holds before the next key is read
