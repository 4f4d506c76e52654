"""Queue ETA by reservation plan: when each pending workload is expected to start, as Slurm's backfill scheduler
computes ``squeue --start`` (list scheduling over an availability profile).

This module owns ``plan(state, now)``. It takes the pending workloads in the order the live policy's cycle would
walk them now (the cycle's own queue walk, ``raylane.scheduling.queuewalk``: ``ORDERINGS``' head keys over the team
queues, each team's users ordered by their shares where its rule says so) and gives each the earliest start ``>=``
its *ready* time at which, for its whole expected runtime, (a) its gang fits all or nothing on nodes in service,
per worker on single nodes (a share of a GPU on one GPU device, whole GPUs on wholly free devices, as the live
placement counts them), and (b) its team's quota holds it, given the running leases' expected ends and the
reservations already made. Each workload then holds its reservation in the profiles. Which reservations bind
later work follows the policy's backfill rule:
- *EASY* (backfill ``easy``, up to ``EASY_MAX_PENDING`` pending): only the *head*'s, the first workload in queue
  order not yet planned. Any later workload that can start before the head's reservation does, earliest first
  (ties in queue order), and takes that room first; then the next head. Room is held for no other workload, as the
  live EASY cycle hands room to whatever fits when it frees.
- *conservative* (any other rule, or more pending): every earlier workload's, in queue order. Holes before later
  reservations are used: that is what makes it backfill.
The state it is given is never changed.

Pure, like ``raylane.scheduling``: no Ray, no clock (``now`` is an argument), no randomness; it imports only the
scheduling core (and its device rules, ``scheduling.capacity``), the shared ETA types
(``raylane.forecast.types``) and the standard library.

Words
- *ready*: the earliest a workload may start: ``now``, or, for the workload of a terminating lease, when that lease
  is gone (``stopping_ends[id]``, else its class's grace period after ``now``); it then goes back to its queue at its
  place, with the service it had, as the control plane requeues it.
- *profile*: a node's free GPUs as a step function of time from ``now``: ``times[i]`` starts segment ``i``, whose
  free GPUs are ``free[i]``; the last segment runs on for ever. It starts from what is free now and gets back each
  running lease's GPUs at its expected end (``types.expected_end``); a reservation takes its GPUs over its
  interval. A team's quota has one such profile per resource it has a quota for (what it holds), and, for a flat
  policy whose lending pool can bind, so does the pool.
- *hole* at a *level* L: a maximal interval in which a node has at least L GPUs free. Per level (each per-worker GPU
  count some pending gang asks for), every node's holes, sorted by start: a worker of L GPUs for d seconds fits at
  the first hole, in start order, with d seconds left in it after the workload's ready time; a gang of k such
  workers, one per node, at the first instant k holes cover its whole runtime. A reservation only cuts, at each
  level its nodes' free GPUs fall below, the runs that lost it out of the holes that held them (a hole is maximal, so
  each run lies in one, and at most two pieces are left). These lists are what make a plan cost about a bisection
  and a short scan per workload, not a look at every node.
- *device*: a GPU of a node (unit ``node#i``). Devices are planned only where some work takes a share of a GPU
  (pending, running, or a device partly used now); then a node's profile counts its wholly free devices and each
  device has its own profile of its free share. Otherwise a node's free GPUs are one amount (the same count).

Not modelled: preemption (a plan never stops running work for pending work: a workload that the live policy would
let in by preemption is planned after the leases it would preempt; preemptions already under way, terminating
leases, are); arrivals after ``now``; backfill ``none`` (planned conservatively, as any rule but EASY); the live
placement's choice of one node (EASY there lets a later workload in only on the node the placement policy picks;
the plan takes any node with room); in-quota-first and user caps within a cycle; under EASY, a team's head key
re-read as its work is planned to start (and otherwise, under a cohort tree, the other teams' keys: only the team's
own is, ``QueueWalk(cohorts=False)``); CPU and memory on nodes (quotas of CPU and memory are held); placement
groups (``group``), preferred nodes and flavor quotas; the growth of elastic gangs (each is planned at its minimum,
as admitted).
"""
from __future__ import annotations

import gc
import heapq
import math
import operator
from bisect import bisect_left, bisect_right, insort
from dataclasses import replace
from itertools import compress, repeat
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from raylane.forecast.types import (
    DEFAULT_HORIZON_S,
    CapacityWait,
    Eta,
    QuotaWait,
    Wait,
    expected_end,
    knows_runtime,
    remaining_runtime,
)
from raylane.scheduling import ADMISSIONS, ORDERINGS, ClusterState, LeaseState, QuotaLedger
from raylane.scheduling.capacity import returned_devices, shift_devices
from raylane.scheduling.queuewalk import QueueWalk
from raylane.scheduling.types import RESOURCE_NAMES, SPOT_LABEL, Workload, device_count, node_devices
from raylane.scheduling.users import held_by_user

__all__ = ["plan"]

_EPS = 1e-9
_INF = math.inf
# Up to this many pending, a policy with EASY backfill is planned as EASY (``_Plan.run_easy``); beyond, conservatively
# (``_Plan.run_conservative``): EASY's plan works a workload's start out again each time a reservation may have taken
# its room, which grows faster than the queue (on the bench's 100-node states, CPU on the loaded 2-core machine: EASY
# 15-30 ms at 100 pending, 40-160 ms at 200, 130-260 ms at 400, about 1 s at 1,000; conservative 6-40 ms at 100 to
# 400). The simulator's shared-burst queues reach 200 to 400: at 200, its median error was 25%, at 400 14%.
EASY_MAX_PENDING = 400
# How many ends a wait names as the ones that closed it.
_NAMED = 2
_WID = operator.itemgetter(2)  # of an end (time, GPUs, workload id)
# The length classes of holes (seconds): a minute, times 4 up to about 11 days, and the rest (tails run for ever).
# A hole of a class whose lower bound is at least a workload's runtime is long enough for it wherever it starts.
_CLASSES = (0.0,) + tuple(60.0 * 4 ** i for i in range(8))


def plan(
    state: ClusterState,
    now: float,
    *,
    default_runtime_s: Optional[float] = None,
    class_runtime_s: Mapping[str, float] = {},
    stopping_ends: Mapping[str, float] = {},
    only: Optional[Iterable[str]] = None,
    horizon_s: float = DEFAULT_HORIZON_S,
    overrun: float = 0.25,
    min_overrun_s: float = 300.0,
    quantile: float = 0.5,
) -> Dict[str, Eta]:
    """The ETA of every pending workload of ``state`` (of those in ``only``, when given), seen at ``now``, by
    reservation plan (module docstring). Arguments as ``raylane.forecast.forecast``'s; ``state`` is not changed."""
    errors = []
    if not (isinstance(now, (int, float)) and math.isfinite(now)):
        errors.append(f"now={now!r} (allowed: a finite time)")
    if not (isinstance(horizon_s, (int, float)) and horizon_s > 0):
        errors.append(f"horizon_s={horizon_s!r} (allowed: > 0)")
    if not (overrun >= 0 and min_overrun_s >= 0):
        errors.append(f"overrun={overrun!r}, min_overrun_s={min_overrun_s!r} (allowed: >= 0)")
    if default_runtime_s is not None and not default_runtime_s >= 0:
        errors.append(f"default_runtime_s={default_runtime_s!r} (allowed: >= 0, or None for the scheduler's)")
    if errors:
        raise ValueError("plan: " + "; ".join(errors))
    default = default_runtime_s if default_runtime_s is not None else state.config.default_runtime_s
    # A plan makes about a hundred thousand tuples and lists that live until it ends and form no cycles (reference
    # counting frees them): the cyclic collector would only walk them, several times a plan, and at times all of the
    # process's heap with them (in the control actor, a large one). So it is off while the plan runs (as ``timeit``
    # does while it times), and back on after.
    collecting = gc.isenabled()
    gc.disable()
    try:
        return _Plan(state, now, default, class_runtime_s, stopping_ends, overrun, min_overrun_s,
                     quantile).run(only, horizon_s)
    finally:
        if collecting:
            gc.enable()


# ------------------------------------------------------------------------------------------------ profiles


class _Profile:
    """A step function of time from ``now``: ``times[i]`` starts segment ``i`` of value ``vals[i]``; the last
    segment runs on for ever. ``ends``: time -> (time, GPUs, workload id) of what gives its share back then."""

    __slots__ = ("times", "vals", "ends")

    def __init__(self, now: float, value: float, changes: Iterable[Tuple[float, float]]):
        by: Dict[float, float] = {}
        for t, dv in changes:
            by[t] = by.get(t, 0.0) + dv
        self.times = [now]
        self.vals = [value]
        for t in sorted(by):
            value += by[t]
            if t <= now:
                self.vals[-1] = value
            else:
                self.times.append(t)
                self.vals.append(value)
        self.ends: Dict[float, List[Tuple[float, float, str]]] = {}

    def split(self, t: float) -> int:
        """The index of the segment starting at ``t`` (made if need be)."""
        times = self.times
        i = bisect_right(times, t) - 1
        if times[i] == t:
            return i
        times.insert(i + 1, t)
        self.vals.insert(i + 1, self.vals[i])
        return i + 1

    def add(self, s: float, e: float, dv: float) -> Tuple[int, List[float]]:
        """Add ``dv`` over ``[s, e)``; returns the index of the segment starting at ``s`` and the values there
        before. (``split`` at ``s`` and ``e``, written out: this runs for every node a reservation takes.)"""
        times, vals = self.times, self.vals
        i = bisect_right(times, s) - 1
        if times[i] != s:
            i += 1
            times.insert(i, s)
            vals.insert(i, vals[i - 1])
        if e < _INF:
            j = bisect_right(times, e, i) - 1
            if times[j] != e:
                j += 1
                times.insert(j, e)
                vals.insert(j, vals[j - 1])
        else:
            j = len(times)
        before = vals[i:j]
        vals[i:j] = map(operator.add, before, repeat(dv))
        return i, before

    def at(self, t: float) -> float:
        return self.vals[bisect_right(self.times, t) - 1]

    def least(self, s: float, e: float) -> float:
        """The least value over ``[s, e)``."""
        times = self.times
        i = bisect_right(times, s) - 1
        return min(self.vals[i:bisect_left(times, e, i + 1)])

    def first_fit(self, s: float, d: float, limit: float) -> Tuple[float, float]:
        """The earliest ``q >= s`` such that the value stays ``<= limit`` over ``[q, q + d)``, and by how much it
        went over first (0 when ``q == s``); ``q`` is infinite when it never does. Each try looks at the segments of
        ``[q, q + d)`` at once (``max`` of a slice) and, if some go over, tries again just after the last of them."""
        times, vals = self.times, self.vals
        n = len(times)
        i = bisect_right(times, s) - 1
        lim = limit + _EPS
        q, over = s, 0.0
        if d <= 0:  # the first segment from ``s`` on that holds
            while vals[i] > lim:
                if not over:
                    over = vals[i] - limit
                i += 1
                if i >= n:
                    return _INF, over
                q = times[i]
            return q, over
        while True:
            end = q + d
            if end <= q:
                return q, over
            j = bisect_left(times, end, i + 1)
            window = vals[i:j]
            if max(window) <= lim:
                return q, over
            if not over:
                over = next(v for v in window if v > lim) - limit
            j -= 1
            while vals[j] <= lim:
                j -= 1
            i = j + 1
            if i >= n:
                return _INF, over
            q = times[i]


# ---------------------------------------------------------------------------------------------------- plan


class _Gang:
    """What a pending workload asks of the plan: ``k`` workers of ``g`` GPUs (``level``), ``per``: how many of its
    workers one node may take at most, ``total``: its resources in all, ``nodes``: the nodes it may use (None:
    any in service)."""

    __slots__ = ("k", "g", "per", "total", "nodes")

    def __init__(self, k: int, g: float, per: int, total, nodes: Optional[frozenset]):
        self.k, self.g, self.per, self.total, self.nodes = k, g, per, total, nodes


class _Plan:
    """One plan: the profiles of nodes in service and of quotas, the holes per level, and the answer so far."""

    def __init__(self, state: ClusterState, now: float, default_runtime_s: float, class_runtime_s,
                 stopping_ends: Mapping[str, float], overrun: float, min_overrun_s: float, q: float = 0.5):
        self.state, self.now = state, now
        self.q = q
        self.default_runtime_s, self.class_runtime_s = default_runtime_s, class_runtime_s
        cfg = state.config
        self.admission = ADMISSIONS.get(cfg.admission)
        self.quota = cfg.admission != "none"
        # 1. When each lease gives its share back; a terminating lease's workload is requeued then.
        self.requeued: List[Tuple[Workload, float]] = []
        gone: List[Tuple[float, object]] = []
        for lease in state.leases.values():
            if lease.state is LeaseState.TERMINATING:
                at = max(now, stopping_ends.get(lease.id, now + lease.workload.cls.grace_period_s))
                w = lease.workload
                attained = w.attained_gpu_s + w.gang.total.gpu * max(0.0, at - lease.start_time)
                self.requeued.append((_with_attained(w, attained), at))
            else:
                at = expected_end(lease, now, default_runtime_s=default_runtime_s, class_runtime_s=class_runtime_s,
                                  overrun=overrun, min_overrun_s=min_overrun_s, q=q)
            gone.append((at, lease))
        # 2. The profiles of the nodes in service (and of their GPU devices, where some work takes a share of one).
        self.nodes: Dict[str, _Profile] = {}
        self.caps: Dict[str, float] = {}
        self.devs: Dict[str, _Profile] = {}
        self.dev_caps: Dict[str, float] = {}
        self.dev_of: Dict[str, Tuple[str, ...]] = {}
        self.pending = state.pending()
        self.shares = _shares(state, self.pending)
        if self.shares:
            self._device_profiles(gone)
        else:
            self._node_profiles(gone)
        self.widest = max(self.caps.values(), default=0.0)
        self.slots: Dict[Tuple, int] = {}  # (level, per, nodes) -> how many workers all nodes hold when empty
        # level -> length class -> the holes of every node of that length, by start (``_CLASSES``)
        self.holes: Dict[float, List[List[Tuple[float, float, str]]]] = {}
        self.node_holes: Dict[float, Dict[str, List[Tuple[float, float]]]] = {}  # level -> node -> its holes
        # device or not -> (each level planned on that kind of unit, less _EPS, ascending; (its node holes, its
        # classes) at that place): what ``_cut`` bisects for the levels a fall of free GPUs crosses
        self.lanes: Dict[bool, Tuple[List[float], List[Tuple[Dict[str, List[Tuple[float, float]]], List]]]] = {}
        # 3. The quota profiles: per team and resource it has a quota for, what it holds; per resource, the pool.
        self.ledger = QuotaLedger(state.teams, state.usage)
        self.team_use: Dict[Tuple[str, str], _Profile] = {}
        self.pool_use: Dict[str, _Profile] = {}
        self.pool_cap: Dict[str, float] = {}
        self.binds: Dict[str, Tuple[Tuple[str, float, float], ...]] = {}
        if self.quota:
            self._quota_profiles(gone)

    def _node_profiles(self, gone) -> None:
        """Each node's free GPUs as one amount (no work takes a share of a GPU: every device is wholly free or
        wholly taken, so the amount is the number of whole free devices)."""
        now, state = self.now, self.state
        per_node: Dict[str, List[Tuple[float, float]]] = {}
        for n in state.nodes.values():
            if n.schedulable:
                per_node[n.id] = []
                self.caps[n.id] = n.capacity.gpu
        for at, lease in gone:
            g = lease.workload.gang.per_worker.gpu
            if g > 0:
                for nid in lease.placement:
                    got = per_node.get(nid)
                    if got is not None:
                        got.append((at, g))
        for n in state.nodes.values():
            if n.schedulable:
                self.nodes[n.id] = _Profile(now, n.free.gpu, per_node[n.id])
        for at, lease in gone:
            if at > now:
                for nid in set(lease.placement):
                    p = self.nodes.get(nid)
                    if p is not None:
                        p.ends.setdefault(at, []).append((at, lease.workload.gang.total.gpu, lease.id))

    def _device_profiles(self, gone) -> None:
        """Each GPU device's free share over time (unit ``node#i``), as the live placement sees devices: a worker
        of a share of a GPU takes it on one device, a worker of g whole GPUs takes g wholly free devices. A node's
        profile is then the number of its wholly free devices (what whole-GPU workers may use)."""
        now, state = self.now, self.state
        changes: Dict[str, List[Tuple[float, float]]] = {}
        start: Dict[str, Tuple[float, ...]] = {}
        for n in state.nodes.values():
            if n.schedulable:
                devs = node_devices(n)
                start[n.id] = devs
                units = self.dev_of[n.id] = tuple(f"{n.id}#{i}" for i in range(len(devs)))
                for u in units:
                    changes[u] = []
                for i, c in enumerate(_device_caps(n.capacity.gpu)):
                    self.dev_caps[units[i]] = c
                self.caps[n.id] = float(sum(1 for c in _device_caps(n.capacity.gpu) if c >= 1 - _EPS))
        scratch = dict(start)
        for at, lease in sorted(gone, key=lambda e: e[0]):
            g = lease.workload.gang.per_worker.gpu
            if g <= 0:
                continue
            for i, nid in enumerate(lease.placement):
                units = self.dev_of.get(nid)
                if units is None:
                    continue
                if i < len(lease.devices) and lease.devices[i]:
                    idx = lease.devices[i]
                else:  # a lease that names no devices: what the state would give back (the most used ones)
                    idx = returned_devices(scratch[nid], g)
                scratch[nid] = shift_devices(scratch[nid], idx, g, +1)
                for j in idx:
                    if j < len(units):
                        changes[units[j]].append((at, g if g < 1 else 1.0))
        for nid, units in self.dev_of.items():
            for i, u in enumerate(units):
                self.devs[u] = _Profile(now, start[nid][i], changes[u])
            self.nodes[nid] = _whole(now, [self.devs[u] for u in units])
        for at, lease in gone:
            if at > now:
                for i, nid in enumerate(lease.placement):
                    units = self.dev_of.get(nid)
                    if units is None:
                        continue
                    gpus = lease.workload.gang.total.gpu
                    _end(self.nodes[nid], at, gpus, lease.id)
                    for j in (lease.devices[i] if i < len(lease.devices) else ()):
                        if j < len(units):
                            _end(self.devs[units[j]], at, gpus, lease.id)

    def _units(self, level: float) -> Dict[str, _Profile]:
        """The profiles a worker of ``level`` GPUs is placed on: devices for a share of one GPU (where devices are
        modelled), else nodes."""
        return self.devs if self.shares and level < 1 - _EPS else self.nodes

    def _quota_profiles(self, gone) -> None:
        """What each team holds over time, per resource whose quota can bind (its ceiling is below what the nodes
        hold, or the lending pool is), and the pool, where it can bind."""
        ledger, now, state = self.ledger, self.now, self.state
        total = {r: sum(getattr(n.capacity, r) for n in state.nodes.values()) for r in RESOURCE_NAMES}
        held: Dict[str, List] = {}
        for at, lease in gone:
            held.setdefault(lease.team, []).append((at, lease))
        # team -> resource -> [guaranteed part, ceiling (infinite: only the pool binds)]
        entries: Dict[str, Dict[str, List[float]]] = {}
        for team, lim in ledger.limits.items():
            for r, _, guaranteed, ceiling in lim:
                if ceiling < total[r] - _EPS:
                    entries.setdefault(team, {})[r] = [guaranteed, ceiling]
        # The lending pool binds only where what all teams may lend is less than the nodes hold; flat policies only
        # (under a cohort tree, each team's ceiling is held, not its cohorts').
        self.pool_cap: Dict[str, float] = {}
        if ledger.tree is None:
            for r in RESOURCE_NAMES:
                if ledger.pool_cap[r] < total[r] - _EPS:
                    self.pool_cap[r] = ledger.pool_cap[r]
                    for team, lim in ledger.limits.items():
                        for rr, _, guaranteed, _ in lim:
                            if rr == r:
                                entries.setdefault(team, {}).setdefault(r, [guaranteed, _INF])
        pool_changes: Dict[str, List[Tuple[float, float]]] = {r: [] for r in self.pool_cap}
        for team, mine in entries.items():
            ends = sorted(held.get(team, ()), key=lambda e: e[0])
            for r, (guaranteed, _) in mine.items():
                u = getattr(ledger.used(team), r)
                p = self.team_use[(team, r)] = _Profile(now, u, (
                    (at, -getattr(lease.workload.gang.total, r)) for at, lease in ends))
                for at, lease in ends:
                    if at > now:
                        p.ends.setdefault(at, []).append((at, lease.workload.gang.total.gpu, lease.id))
                    if r in pool_changes:
                        v = u - getattr(lease.workload.gang.total, r)
                        pool_changes[r].append((at, max(0.0, v - guaranteed) - max(0.0, u - guaranteed)))
                        u = v
        self.binds = {team: tuple((r, g, c) for r, (g, c) in mine.items()) for team, mine in entries.items()}
        for r, changes in pool_changes.items():
            pool = self.pool_use[r] = _Profile(now, ledger.pool_used[r], changes)
            for team, mine in entries.items():
                if r in mine:
                    p = self.team_use[(team, r)]
                    for t in p.times[1:]:
                        pool.split(t)  # the pool's breakpoints hold every team's: one value a segment for each
                    for t, got in p.ends.items():
                        pool.ends.setdefault(t, []).extend(got)

    # -- the loop --------------------------------------------------------------------------------------------
    def run(self, only: Optional[Iterable[str]], horizon_s: float) -> Dict[str, Eta]:
        if self.state.config.backfill == "easy" and self.state.pending_count() <= EASY_MAX_PENDING:
            return self.run_easy(only, horizon_s)
        return self.run_conservative(only, horizon_s)

    def run_conservative(self, only: Optional[Iterable[str]], horizon_s: float) -> Dict[str, Eta]:
        """Conservative backfill: every workload in queue order holds its reservation against all later ones."""
        state, now = self.state, self.now
        wanted = None if only is None else set(only)
        targets = {w.id for w in self.pending if wanted is None or w.id in wanted}
        out: Dict[str, Eta] = {}
        last = now + horizon_s
        order = self._walk()
        ready = {w.id: at for w, at in self.requeued}
        gangs: Dict[Tuple, Tuple[_Gang, Optional[Tuple[str, Wait]]]] = {}
        empty = QuotaLedger(state.teams, {})
        for w in order:
            if len(out) == len(targets):
                break
            r = ready.get(w.id, now)
            key = _shape(w)
            got = gangs.get(key)
            if got is None:
                gang = self._gang(w)
                got = gangs[key] = (gang, self._never(w.team, gang, empty))
            gang, never = got
            d = remaining_runtime(w, self.default_runtime_s, self.class_runtime_s, self.q)
            if never is not None:
                start, nodes, waits, why = None, (), (never[1],), never[0]
            else:
                start, nodes, waits, why = self._explain(w, gang, r, self._find(w, gang, r, d))
            if start is not None:
                self._book(w, gang, start, d, nodes)
                if start <= now + _EPS:  # it starts now: its team holds it (for the head keys that read that)
                    self.ledger.add(w.team, w.gang.total)
                    order.took(w.team)
            if w.id not in targets:
                continue
            if start is None:
                out[w.id] = Eta(w.id, None, None, waits, why)
            elif start > last:
                out[w.id] = Eta(w.id, None, None, waits, "does not start within the forecast's horizon")
            else:
                finish = start + d if knows_runtime(w) else None
                out[w.id] = Eta(w.id, start, finish, waits)
        return out

    def run_easy(self, only: Optional[Iterable[str]], horizon_s: float) -> Dict[str, Eta]:
        """EASY backfill: only the *head* (the first workload in queue order not yet planned) holds a reservation
        against later work; any later workload that can start before the head's reservation does, in the order
        of the instants it can start at (ties: queue order), and takes that room first. Then the next head. The
        room a workload that is not the head would need is not held for it: work behind it that fits sooner takes
        it, as the live EASY cycle hands room to whatever fits when it frees.

        Each workload's earliest start only moves later as reservations are made, so the starts are kept in a heap
        and worked out again only when one comes up (lazily): one that still holds is the earliest of all."""
        state, now = self.state, self.now
        wanted = None if only is None else set(only)
        targets = {w.id for w in self.pending if wanted is None or w.id in wanted}
        out: Dict[str, Eta] = {}
        last = now + horizon_s
        ready = {w.id: at for w, at in self.requeued}
        gangs: Dict[Tuple, Tuple[_Gang, Optional[Tuple[str, Wait]]]] = {}
        empty = QuotaLedger(state.teams, {})
        # (workload, gang, ready, runtime, never) in queue order (the order as it stands now: a team's head key is
        # not re-read as its work is planned to start)
        items = []
        for w in self._walk():
            key = _shape(w)
            got = gangs.get(key)
            if got is None:
                gang = self._gang(w)
                got = gangs[key] = (gang, self._never(w.team, gang, empty))
            items.append((w, got[0], ready.get(w.id, now),
                          remaining_runtime(w, self.default_runtime_s, self.class_runtime_s, self.q), got[1]))
        done = [False] * len(items)
        left = len(targets)

        def settle(pos: int, found) -> float:
            nonlocal left
            w, gang, r, d, never = items[pos]
            done[pos] = True
            if never is not None:
                start, nodes, waits, why = None, (), (never[1],), never[0]
            else:
                start, nodes, waits, why = self._explain(w, gang, r, found)
            if start is not None:
                self._book(w, gang, start, d, nodes)
            if w.id in targets:
                left -= 1
                if start is None:
                    out[w.id] = Eta(w.id, None, None, waits, why)
                elif start > last:
                    out[w.id] = Eta(w.id, None, None, waits, "does not start within the forecast's horizon")
                else:
                    out[w.id] = Eta(w.id, start, start + d if knows_runtime(w) else None, waits)
            return _INF if start is None else start

        heap = []
        found_at: Dict[int, Tuple] = {}  # position -> what ``_find`` last gave it
        for pos, (w, gang, r, d, never) in enumerate(items):
            if never is None:
                found_at[pos] = got = self._find(w, gang, r, d)
                heap.append((got[0], pos))
        heapq.heapify(heap)
        head = 0
        while left > 0:
            while head < len(items) and done[head]:
                head += 1
            if head == len(items):
                break
            w, gang, r, d, never = items[head]
            shadow = settle(head, None if never is not None else self._find(w, gang, r, d))
            # What can start before the head's reservation does, earliest first.
            while heap and heap[0][0] < shadow and left > 0:
                at, pos = heapq.heappop(heap)
                if done[pos]:
                    continue
                w, gang, r, d, _ = items[pos]
                found = found_at[pos]
                if not self._still_fits(w, gang, found, d):
                    found_at[pos] = found = self._find(w, gang, r, d)
                if found[0] > at + _EPS:
                    if found[0] < _INF:
                        heapq.heappush(heap, (found[0], pos))
                    continue
                settle(pos, found)
        return out

    def _walk(self) -> QueueWalk:
        """The pending workloads, and those terminating leases will requeue (with the service they will have had),
        in the order the live cycle walks them now (``raylane.scheduling.queuewalk``). A team is re-keyed after a
        workload of its own starts now (``QueueWalk.took``), and only that team, under a cohort tree too."""
        state, cfg = self.state, self.state.config
        # (read without ``snapshot``, which would fill the state's caches: the state is left as it was)
        queues: Dict[str, List[Workload]] = {}
        for w in self.pending:  # team by team, each in its queue order (``state.pending()``)
            queues.setdefault(w.team, []).append(w)

        def held(team: str):
            return held_by_user([lease for lease in state.leases.values() if lease.team == team])

        return QueueWalk(queues, state.teams, self.ledger, ORDERINGS.get(cfg.ordering), cfg,
                         requeued=[w for w, _ in self.requeued], held=held, cohorts=False)

    def _still_fits(self, w: Workload, gang: _Gang, found, d: float) -> bool:
        """Whether ``found`` (``_find``'s start and nodes for ``w``) still holds after the reservations made since:
        then it is still its earliest start (reservations only take room and quota)."""
        s, nodes = found[0], found[1]
        if s == _INF:
            return False
        g = gang.g
        if g > _EPS:
            units = self._units(g)
            e = s + d
            for u in set(nodes):
                if units[u].least(s, e) < g * nodes.count(u) - _EPS:
                    return False
        return self._quota_fit(w.team, gang.total, s, d)[0] == s

    def _gang(self, w: Workload) -> _Gang:
        g = w.gang
        if g.max_workers is not None and w.cls.resizable:
            g = g.at(g.lo)  # an elastic gang is admitted at its minimum
        k, pw = g.workers, g.per_worker.gpu
        if g.strategy == "strict-pack":
            k, pw = 1, pw * g.workers
        on_devices = self.shares and _EPS < pw < 1 - _EPS
        if on_devices:  # a unit is one device: it holds as many workers as shares fit in it
            per = 1 if g.strategy == "strict-spread" else max(1, min(k, int(1.0 / pw + _EPS)))
        elif pw > _EPS:
            per = 1 if g.strategy == "strict-spread" else max(1, min(k, int(self.widest / pw + _EPS)))
        else:
            per = k
        nodes = None
        spot = g.spot == "never" or g.spot == "only"
        if g.features or g.node_types or g.avoid_types or spot:
            ns = self.state.nodes
            nodes = frozenset(
                nid for nid in self.nodes
                if g.features <= ns[nid].features and (not g.node_types or ns[nid].node_type in g.node_types)
                and ns[nid].node_type not in g.avoid_types
                and (not spot or (ns[nid].labels.get(SPOT_LABEL) == "true") == (g.spot == "only")))
            if on_devices:
                nodes = frozenset(u for nid in nodes for u in self.dev_of[nid])
        return _Gang(k, pw, per, g.total, nodes)

    # -- one workload ------------------------------------------------------------------------------------------
    def _find(self, w: Workload, gang: _Gang, r: float, d: float):
        """(start, nodes, when it found room, where, what its quota lacked first) of ``w`` ready at ``r`` for ``d``
        seconds; the start is infinite when nothing in the plan lets it in."""
        s, nodes = self._room(gang, r, d)
        if not self.quota:
            return s, nodes, s, nodes, None
        room_at, room_nodes = s, nodes
        quota_wait: Optional[Tuple[str, float, _Profile]] = None
        while s < _INF:
            q, short = self._quota_fit(w.team, gang.total, s, d)
            if short is not None and quota_wait is None:
                quota_wait = short
            if q == s:
                break
            if q == _INF:
                s = _INF
                break
            s, nodes = self._room(gang, q, d)
        return s, nodes, room_at, room_nodes, quota_wait

    def _explain(self, w: Workload, gang: _Gang, r: float, found):
        """(start, [node per worker], waits, note) of ``w`` ready at ``r`` from ``_find``'s answer ``found``;
        start None: never."""
        s, nodes, room_at, room_nodes, quota_wait = found
        if s == _INF:
            why = ("nothing in the plan lets it in: no lease or reservation is left to end and it still does not fit "
                   "(nodes out of service, or a quota that cannot hold it)")
            waits: List[Wait] = []
            if room_at == _INF:
                waits.append(CapacityWait(gang.total.gpu, _INF))
            elif quota_wait is not None:
                waits.append(QuotaWait(w.team, quota_wait[0], quota_wait[1], _INF))
            return None, (), tuple(waits), why
        return s, nodes, self._waits(w, gang, r, room_at, room_nodes, s, quota_wait), ""

    def _never(self, team: str, gang: _Gang, empty: QuotaLedger) -> Optional[Tuple[str, Wait]]:
        """(note, wait) when no plan could ever let ``team``'s ``gang`` in: it fits no set of nodes in service even
        when all are empty, or the team's quota could not hold it even if no team held anything (``empty``)."""
        if gang.g > _EPS:
            key = (gang.g, gang.per, gang.nodes)
            slots = self.slots.get(key)
            if slots is None:
                all_caps = self.dev_caps if self._units(gang.g) is self.devs else self.caps
                caps = all_caps if gang.nodes is None else {n: all_caps[n] for n in gang.nodes}
                slots = self.slots[key] = sum(min(gang.per, int(c / gang.g + _EPS)) for c in caps.values())
            if slots < gang.k:
                return ("nothing in the plan lets it in: its gang does not fit the nodes in service even when they "
                        "are empty", CapacityWait(gang.total.gpu, _INF))
        if self.quota:
            why = self.admission.check(empty, team, gang.total)
            if why is not None:
                room = max(0.0, why.nominal + why.borrowable)
                return (f"nothing in the plan lets it in: team {team}'s quota can never hold it",
                        QuotaWait(why.team, why.resource, max(0.0, why.needed - room), _INF))
        return None

    def _room(self, gang: _Gang, r: float, d: float) -> Tuple[float, Tuple[str, ...]]:
        """The earliest start ``>= r`` at which the gang fits for ``d`` seconds, and its nodes (a node per worker)."""
        if gang.g <= _EPS:
            return r, ()
        classes = self._holes(gang.g)
        ok = gang.nodes
        dd = d - _EPS
        first = bisect_right(_CLASSES, d) - 1  # holes of shorter classes are all too short
        if gang.k == 1:
            # Per class, the first hole in start order with d seconds left after r; of ties, the shortest class.
            best, where = _INF, ""
            for c in range(len(classes) - 1, first - 1, -1):
                for st, en, nid in classes[c]:
                    if st > best or (st == best and c > first):
                        break
                    at = st if st > r else r
                    if en - at >= dd and (ok is None or nid in ok):
                        if at <= best:
                            best, where = at, nid
                        break
            return (best, (where,)) if where else (_INF, ())
        # A gang: sweep the holes long enough in start order, keeping their ends; at each start, those whose end is
        # past start + d cover the runtime.
        k, per, g = gang.k, gang.per, gang.g
        ends: List[Tuple[float, str]] = []
        lists = [c for c in classes[first:] if c]  # (most searches have one class long enough)
        for st, en, nid in lists[0] if len(lists) == 1 else heapq.merge(*lists):
            at = st if st > r else r
            if en - at < dd or (ok is not None and nid not in ok):
                continue
            insort(ends, (en, nid))
            i = bisect_left(ends, (at + dd,))
            if (len(ends) - i) * per < k:
                continue
            if per == 1:
                return at, tuple(nid for _, nid in ends[i:i + k])
            # Several workers a node: how many each covering node holds over the runtime.
            units = self._units(g)
            out: List[str] = []
            for _, n in ends[i:]:
                take = min(per, k - len(out), int(units[n].least(at, at + d) / g + _EPS))
                out.extend([n] * take)
                if len(out) >= k:
                    return at, tuple(out)
        return _INF, ()

    def _quota_fit(self, team: str, need, s: float, d: float) -> Tuple[float, Optional[Tuple[str, float, _Profile]]]:
        """The earliest start ``>= s`` at which ``team``'s quota holds ``need`` for ``d`` seconds, and what it
        lacked first ((resource, amount, the profile that bound: the team's or the pool's); None when it holds at
        ``s``)."""
        if not self.quota:
            return s, None
        binds = self.binds.get(team, ())
        short = None
        while True:
            q = s
            for r, guaranteed, ceiling in binds:
                n = getattr(need, r)
                if n <= 0:
                    continue
                p = self.team_use[(team, r)]
                if ceiling < _INF:
                    q2, over = p.first_fit(q, d, ceiling - n)
                    if q2 != q:
                        if short is None:
                            short = (r, over, p)
                        q = q2
                        if q == _INF:
                            return q, short
                pool = self.pool_use.get(r)
                if pool is not None:
                    q2, over = self._pool_fit(pool, p, r, n, guaranteed, q, d)
                    if q2 != q:
                        if short is None:
                            short = (r, over, pool)
                        q = q2
                        if q == _INF:
                            return q, short
            if q == s:
                return s, short
            s = q

    def _pool_fit(self, pool: _Profile, mine: _Profile, r: str, n: float, guaranteed: float, s: float, d: float):
        """``_Profile.first_fit`` for the lending pool: taking ``n`` more draws on it what takes the team past its
        guaranteed part (the pool's breakpoints hold the team's, so what the team holds is one value a segment)."""
        cap = self.pool_cap[r]
        times, vals = pool.times, pool.vals
        m = len(times)
        i = bisect_right(times, s) - 1
        q, over = s, 0.0
        while i < m:
            t0 = times[i] if times[i] > q else q
            if t0 >= q + d and d > 0:
                return q, over
            u = mine.at(times[i])
            extra = max(0.0, u + n - guaranteed) - max(0.0, u - guaranteed)
            if vals[i] + extra > cap + _EPS:
                if not over:
                    over = vals[i] + extra - cap
                if i + 1 >= m:
                    return _INF, over
                q = times[i + 1]
            elif i + 1 >= m:
                return q, over
            i += 1
        return q, over  # pragma: no cover

    # -- booking ---------------------------------------------------------------------------------------------
    def _book(self, w: Workload, gang: _Gang, s: float, d: float, nodes: Sequence[str]) -> None:
        """``w`` holds its nodes' GPUs and its team's quota over ``[s, s + d)``."""
        e = s + d
        if e <= s:
            return
        gpus = gang.total.gpu
        g = gang.g
        if not self.shares:
            for nid in nodes:
                p = self.nodes[nid]
                i, before = p.add(s, e, -g)
                self._cut(nid, p.times, i, before, g, False)
                _end(p, e, gpus, w.id)
        elif g < 1 - _EPS:
            for u in nodes:  # a share of one device; its node loses a whole device where the device was whole
                dev = self.devs[u]
                i, before = dev.add(s, e, -g)
                self._cut(u, dev.times, i, before, g, True)
                _end(dev, e, gpus, w.id)
                nid = u.rsplit("#", 1)[0]
                self._lose_whole(nid, dev.times, i, before, g, e, gpus, w.id)
        else:
            k = int(math.ceil(g - _EPS))
            for nid in nodes:  # g whole devices, the lowest-numbered wholly free over the interval (Ray's rule)
                devs = [self.devs[u] for u in self.dev_of[nid]]
                least = [dev.least(s, e) for dev in devs]
                free = [i for i, v in enumerate(least) if v >= 1 - _EPS][:k]
                if len(free) < k:  # wholly free at every instant, not all the same devices: the most free ones
                    free += sorted((i for i in range(len(devs)) if i not in free), key=lambda i: -least[i])[:k - len(free)]
                for i in free:
                    dev = devs[i]
                    j, before = dev.add(s, e, -1.0)
                    u = self.dev_of[nid][i]
                    self._cut(u, dev.times, j, before, 1.0, True)
                    _end(dev, e, gpus, w.id)
                    self._lose_whole(nid, dev.times, j, before, 1.0, e, gpus, w.id)
        if not self.quota:
            return
        team = w.team
        for r, guaranteed, _ in self.binds.get(team, ()):
            n = getattr(gang.total, r)
            if n <= 0:
                continue
            mine = self.team_use[(team, r)]
            pool = self.pool_use.get(r)
            if pool is not None:
                # What the team draws on the pool grows by what takes it past its guaranteed part, segment by
                # segment of what it holds (the pool's breakpoints hold the team's).
                pool.split(s)
                pool.split(e)
                i = bisect_right(pool.times, s) - 1
                while i < len(pool.times) and pool.times[i] < e:
                    u = mine.at(pool.times[i])
                    pool.vals[i] += max(0.0, u + n - guaranteed) - max(0.0, u - guaranteed)
                    i += 1
                pool.ends.setdefault(e, []).append((e, gpus, w.id))
            mine.add(s, e, n)
            mine.ends.setdefault(e, []).append((e, gpus, w.id))

    def _cut(self, unit: str, times: List[float], i: int, before: List[float], g: float, device: bool) -> None:
        """``unit``'s free GPUs fell by ``g`` over its segments ``i``... of ``times`` (from ``before``): at each
        level of its kind, the runs of those segments that had the level and have it no more are cut out of its
        holes (``_cut_hole``). The levels segment ``m`` no longer has are those in ``(before[m] - g, before[m]]``
        (as ``_Profile.add`` leaves the value): a bisection of the sorted levels, not a look at each."""
        got = self.lanes.get(device)
        if got is None:
            return
        lvs, lanes = got
        k = i + len(before)
        end = times[k] if k < len(times) else _INF
        if len(before) == 1:
            v = before[0]
            for li in range(bisect_right(lvs, v - g), bisect_right(lvs, v)):
                mine, classes = lanes[li]
                _cut_hole(classes, mine[unit], unit, times[i], end)
            return
        # The levels a segment lost are one range of indices, [lo, hi): a run is open for each index of the last
        # segment's range, and closes (is cut) where the next segment's range leaves it out.
        began: Dict[int, float] = {}  # level index -> where its run of lost segments began
        plo = phi = 0
        for m, v in enumerate(before):
            lo, hi = bisect_right(lvs, v - g), bisect_right(lvs, v)
            if lo == plo and hi == phi:
                continue
            t = times[i + m]
            for li in range(plo, phi):
                if not lo <= li < hi:
                    mine, classes = lanes[li]
                    _cut_hole(classes, mine[unit], unit, began.pop(li), t)
            for li in range(lo, hi):
                if not plo <= li < phi:
                    began[li] = t
            plo, phi = lo, hi
        for li, t in began.items():
            mine, classes = lanes[li]
            _cut_hole(classes, mine[unit], unit, t, end)

    def _lose_whole(self, nid: str, times: List[float], i: int, before: List[float], g: float, e: float,
                    gpus: float, wid: str) -> None:
        """Node ``nid`` has one wholly free device less where its device (segments ``i``... of ``times``, whose
        free shares were ``before``) was wholly free and fell by ``g``."""
        node = self.nodes[nid]
        run = None
        spans = []
        for m, v in enumerate(before):
            t0 = times[i + m]
            lost = v >= 1 - _EPS and v - g < 1 - _EPS
            if lost and run is None:
                run = t0
            elif not lost and run is not None:
                spans.append((run, t0))
                run = None
        if run is not None:
            spans.append((run, e))
        for a, b in spans:
            j, lost = node.add(a, b, -1.0)
            self._cut(nid, node.times, j, lost, 1.0, False)
        if spans:
            _end(node, e, gpus, wid)

    # -- holes -----------------------------------------------------------------------------------------------
    def _holes(self, level: float) -> List[List[Tuple[float, float, str]]]:
        """Every node's holes at ``level``, per length class, by start (worked out when a gang first asks for that
        level; ``_cut`` keeps them up to date from then on)."""
        got = self.holes.get(level)
        if got is not None:
            return got
        got = [[] for _ in _CLASSES]
        per_node = {}
        for nid, p in self._units(level).items():
            mine = per_node[nid] = _find_holes(p, level)
            for st, en in mine:
                got[bisect_right(_CLASSES, en - st) - 1].append((st, en, nid))
        for c in got:
            c.sort()
        self.holes[level] = got
        self.node_holes[level] = per_node
        lvs, lanes = self.lanes.setdefault(bool(self.shares and level < 1 - _EPS), ([], []))
        at = bisect_right(lvs, level - _EPS)
        lvs.insert(at, level - _EPS)
        lanes.insert(at, (per_node, got))
        return got

    # -- waits -----------------------------------------------------------------------------------------------
    def _waits(self, w: Workload, gang: _Gang, r: float, room_at: float, nodes: Sequence[str], s: float,
               quota_wait: Optional[Tuple[str, float, _Profile]]) -> Tuple[Wait, ...]:
        """What ``w`` waits for: room for its gang until ``room_at``, then its team's quota until ``s``; each named
        by what ends then (on its nodes; of its team, or of any team for the lending pool)."""
        if s <= self.now + _EPS:
            return ()
        out: List[Wait] = []
        gpus = gang.total.gpu
        if room_at > r + _EPS:
            ended: List[Tuple[float, float, str]] = []
            units = self._units(gang.g)
            if len(nodes) == 1:
                ended = _ended(units[nodes[0]], r, room_at)
            else:
                for nid in set(nodes):  # the nodes (devices) its room was found on first
                    ended += _ended(units[nid], r, room_at)
            out.append(CapacityWait(gpus, room_at, _named(ended)))
        if quota_wait is not None and (s > room_at + _EPS or not out):
            res, amount, p = quota_wait
            ended = _ended(p, room_at, s)
            out.append(QuotaWait(w.team, res, amount, s, _named(ended)))
        if not out:
            out.append(CapacityWait(gpus, s, ()))  # ready later than now (a requeued workload)
        return tuple(out)


def _shares(state: ClusterState, pending: Sequence[Workload]) -> bool:
    """Whether some work takes a share of a GPU (pending, running, or on a device now): then devices are planned."""
    per_worker = {lease.workload.gang.per_worker.gpu for lease in state.leases.values()}
    per_worker.update(w.gang.per_worker.gpu for w in pending)
    if any(_EPS < g < 1 - _EPS for g in per_worker):
        return True
    return any(_EPS < d < 1 - _EPS for n in state.nodes.values() if n.schedulable for d in node_devices(n))


def _device_caps(capacity_gpu: float) -> List[float]:
    """Each device's share of a node of ``capacity_gpu`` GPUs (1, but for a fractional rest)."""
    out, left = [], capacity_gpu
    for _ in range(device_count(capacity_gpu)):
        out.append(min(1.0, left))
        left -= 1.0
    return out


def _whole(now: float, devs: Sequence[_Profile]) -> _Profile:
    """The number of wholly free devices of ``devs`` over time."""
    changes: List[Tuple[float, float]] = []
    count = 0
    for p in devs:
        full = p.vals[0] >= 1 - _EPS
        count += full
        for t, v in zip(p.times[1:], p.vals[1:]):
            f = v >= 1 - _EPS
            if f != full:
                changes.append((t, 1.0 if f else -1.0))
                full = f
    return _Profile(now, float(count), changes)


def _end(p: _Profile, at: float, gpus: float, wid: str) -> None:
    """``wid`` (of ``gpus`` GPUs in all) gives its share of ``p`` back at ``at``."""
    got = p.ends.setdefault(at, [])
    if not got or got[-1][2] != wid:
        got.append((at, gpus, wid))


def _ended(p: _Profile, t0: float, t1: float) -> List[Tuple[float, float, str]]:
    """The last few (time, GPUs, workload id) of what gives its share of ``p`` back after ``t0`` and by ``t1``."""
    times, ends = p.times, p.ends
    i = bisect_right(times, t1) - 1
    out: List[Tuple[float, float, str]] = []
    while i > 0:
        t = times[i]
        if t <= t0:
            break
        got = ends.get(t)
        if got:
            # Only the largest few of one instant can be named (many leases may end at one instant of a quota's
            # profile); ``_named`` ranks by time first.
            out += got if len(got) <= _NAMED else heapq.nlargest(_NAMED, set(got))
            if len(out) >= _NAMED:
                break
        i -= 1
    return out


def _named(ended: List[Tuple[float, float, str]]) -> Tuple[str, ...]:
    """At most ``_NAMED`` workloads of ``ended``, the latest last (of those ending at one instant, the largest)."""
    return tuple(map(_WID, sorted(set(ended))[-_NAMED:]))


def _cut_hole(classes: List[List[Tuple[float, float, str]]], mine: List[Tuple[float, float]], unit: str, x: float,
              y: float) -> None:
    """Take ``[x, y)`` out of the hole of ``unit`` (its holes ``mine`` at a level, ``classes`` every unit's there)
    that holds it: a hole is a maximal interval, so a run that lost the level lies in one, which leaves at most two
    and needs no look at the profile."""
    j = bisect_right(mine, (x, _INF)) - 1
    h0, h1 = mine[j]
    c = classes[bisect_right(_CLASSES, h1 - h0) - 1]
    del c[bisect_left(c, (h0, h1, unit))]
    if y < h1:
        insort(classes[bisect_right(_CLASSES, h1 - y) - 1], (y, h1, unit))
        if h0 < x:
            insort(classes[bisect_right(_CLASSES, x - h0) - 1], (h0, x, unit))
            mine[j:j + 1] = ((h0, x), (y, h1))
        else:
            mine[j] = (y, h1)
    elif h0 < x:
        insort(classes[bisect_right(_CLASSES, x - h0) - 1], (h0, x, unit))
        mine[j] = (h0, x)
    else:
        del mine[j]


def _find_holes(p: _Profile, level: float) -> List[Tuple[float, float]]:
    """The maximal intervals in which ``p`` is at least ``level``: the runs of segments that have it, whose ends
    are found in C (where having it changes)."""
    times, vals = p.times, p.vals
    n = len(vals)
    has = list(map(operator.ge, vals, repeat(level - _EPS)))
    edges = [0, *compress(range(1, n), map(operator.ne, has[1:], has)), n]  # each run: edges[m] to edges[m + 1]
    ends = times[1:] + [_INF]  # where the segments end
    return [(times[edges[m]], ends[edges[m + 1] - 1]) for m in range(0 if has[0] else 1, len(edges) - 1, 2)]


def _shape(w: Workload) -> Tuple:
    """What ``_Plan._gang`` and ``_Plan._never`` read of ``w``, as a key of plain values (cheaper to hash and
    compare than the ``Gang`` itself, whose other fields, ``prefer`` and ``group_by``, they do not read)."""
    g = w.gang
    p = g.per_worker
    return (g.workers, p.gpu, p.cpu, p.memory, g.strategy, g.min_workers, g.max_workers, g.features, g.node_types,
            g.spot, g.avoid_types, w.team, w.cls.resizable)


def _with_attained(w: Workload, attained: float) -> Workload:
    return replace(w, attained_gpu_s=attained)
