"""The state a driver keeps between cycles, and the snapshots it hands out (Kueue's cache, in small).

``ClusterState`` owns: nodes and what is free on them (per GPU device too: ``Node.devices``, and each lease's
``Lease.devices``), the team queues (each kept sorted by the ordering's queue
key), the leases, team usage and decayed usage (per user too, for a team whose user rule is on:
``raylane.scheduling.users``). Only a driver (the control actor, the simulator) changes it, and
only through these methods; the cycle reads the immutable ``Snapshot`` it returns. Keeping usage and free capacity
up to date incrementally is what lets a cycle over 10,000 pending workloads and 1,000 nodes stay in milliseconds.

Pure: no Ray, no clock (every method that needs time takes ``now``).
"""
from __future__ import annotations

import bisect
import math
import operator
from dataclasses import replace
from typing import Dict, Iterable, List, Mapping, Optional, Tuple

from raylane.errors import NotFoundError
from raylane.scheduling.capacity import choose_devices, pick_devices, returned_devices, shift_devices
from raylane.scheduling.leaseorder import LeaseOrder, SortedLeases, static_end
from raylane.scheduling.ordering import ORDERINGS
from raylane.scheduling.backfill import BACKFILLS
from raylane.scheduling.preemption import PREEMPTIONS, settled_after
from raylane.scheduling.users import per_user_head
from raylane.scheduling.types import (
    Admit,
    Lease,
    Resize,
    LeaseState,
    Node,
    Resources,
    SchedulerConfig,
    Snapshot,
    Team,
    Workload,
    node_devices,
)

_KEY = operator.itemgetter(0)  # of a queue entry (queue key, workload)


class ClusterState:
    def __init__(self, nodes: Iterable[Node], teams: Mapping[str, Team], config: SchedulerConfig = SchedulerConfig()):
        self.config = config
        self._order = ORDERINGS.get(config.ordering)
        self.nodes: Dict[str, Node] = {n.id: _with_devices(n) for n in nodes}
        self.teams: Dict[str, Team] = dict(teams)
        self.leases: Dict[str, Lease] = {}
        self.usage: Dict[str, Resources] = {}
        self._queues: Dict[str, List[Tuple[Tuple, Workload]]] = {}
        self._where: Dict[str, Tuple[str, Tuple]] = {}  # pending workload id -> (team, its queue key)
        self._counts: Dict[Tuple[str, str], int] = {}  # (team, class) -> how many of its workloads are pending
        # Pending workloads that preempted and wait for what they freed (``nominate``), in the order nominated: every
        # cycle examines them, past its window too (``Snapshot.nominated``).
        self.nominated: Dict[str, None] = {}
        # team -> {limit: the first `limit` workloads of its queue (None: all)}
        self._queue_cache: Dict[str, Dict[Optional[int], Tuple[Workload, ...]]] = {}
        self._leases_cache: Optional[Tuple[Lease, ...]] = None
        self._team_leases: Dict[str, Dict[str, Lease]] = {}
        self._team_leases_cache: Dict[str, Tuple[Lease, ...]] = {}
        self._nodes_cache: Optional[Tuple[Node, ...]] = None
        self._decayed_at: Optional[float] = None
        # The leases by static end and by when they settle, with each one's place in the lease table (its sequence
        # number: the table keeps the order leases started in), so that a cycle need not sort them
        # (raylane.scheduling.leaseorder).
        # Kept only where the configured backfill or preemption policy reads them (``reads_lease_order``): elsewhere
        # keeping them would only cost (a cycle with no use for them reads none; growth then looks over all leases).
        self._orders = any(getattr(reg.get(name), "reads_lease_order", False)
                           for reg, name in ((BACKFILLS, config.backfill), (PREEMPTIONS, config.preemption))
                           if name in reg.names())
        self._seq = 0
        self._seq_of: Dict[str, int] = {}
        self._by_end = SortedLeases()
        self._by_settle = SortedLeases()
        self._order_cache: Optional[LeaseOrder] = None
        self._seq_cache: Optional[Dict[str, int]] = None  # copied for snapshots only when a lease comes or goes
        self._elastic: Dict[str, Lease] = {}  # the leases of elastic gangs, in table order
        # Counts the nodes added and removed: while it stays the same, each node's capacity, features, labels,
        # node type and datasets do too (what it holds, and whether it is schedulable, may change).
        self.node_version = 0

    def copy(self) -> "ClusterState":
        """An independent copy: a forecast or a what-if drives it forward and this state never sees it. Nodes,
        leases, workloads and teams are immutable values and are shared; every container is copied, so the cost
        grows with the number of workloads and leases (a few hundred microseconds for a thousand of each)."""
        out = ClusterState.__new__(ClusterState)
        out.config, out._order = self.config, self._order
        out.nodes, out.teams, out.leases, out.usage = dict(self.nodes), dict(self.teams), dict(self.leases), \
            dict(self.usage)
        out._queues = {team: list(q) for team, q in self._queues.items()}
        out._where, out._counts = dict(self._where), dict(self._counts)
        out.nominated = dict(self.nominated)
        out._queue_cache = {team: dict(c) for team, c in self._queue_cache.items()}
        out._leases_cache = self._leases_cache
        out._team_leases = {team: dict(ls) for team, ls in self._team_leases.items()}
        out._team_leases_cache = dict(self._team_leases_cache)
        out._nodes_cache = self._nodes_cache
        out._decayed_at = self._decayed_at
        out._orders, out._seq, out._seq_of = self._orders, self._seq, dict(self._seq_of)
        out._by_end, out._by_settle = self._by_end.copy(), self._by_settle.copy()
        out._order_cache, out._seq_cache = self._order_cache, self._seq_cache
        out._elastic = dict(self._elastic)
        out.node_version = self.node_version
        return out

    # -- nodes ---------------------------------------------------------------------------------------------
    def add_node(self, node: Node) -> None:
        self.nodes[node.id] = _with_devices(node)
        self._nodes_cache = None
        self.node_version += 1

    def remove_node(self, node_id: str, now: float) -> List[Lease]:
        """The node is gone: every lease with a worker on it is over (an all-or-nothing gang cannot run short of
        a worker). Those leases are finished in the ledger and returned, for the driver to requeue; their other
        nodes get their share back."""
        lost = [lease for lease in self.leases.values() if node_id in lease.placement]
        for lease in lost:
            self.finish(lease.id, now)
        self.nodes.pop(node_id, None)
        self._nodes_cache = None
        self.node_version += 1
        return lost

    def set_schedulable(self, node_id: str, schedulable: bool) -> None:
        """Cordon (False) or uncordon (True) a node: leases there keep running, new ones are not placed there."""
        n = self.nodes.get(node_id)
        if n is None:
            raise NotFoundError(f"no node {node_id!r}")
        if n.schedulable != schedulable:
            self.nodes[node_id] = replace(n, schedulable=schedulable)
            self._nodes_cache = None

    def _adjust(self, placement: Tuple[str, ...], per_worker: Resources, devices, sign: int) -> None:
        g = per_worker.gpu
        for i, nid in enumerate(placement):
            n = self.nodes.get(nid)
            if n is not None:
                free = (n.free + per_worker if sign > 0 else n.free - per_worker).rounded()
                if devices:
                    idx = devices[i]
                elif g > 0:  # a lease that names no devices (some of its nodes were gone when it started)
                    idx = (choose_devices(n.devices, g) if sign < 0 else returned_devices(n.devices, g)) or ()
                else:
                    idx = ()
                devs = shift_devices(n.devices, idx, g, sign)
                self.nodes[nid] = replace(n, free=free, devices=devs)
        self._nodes_cache = None

    # -- queue ---------------------------------------------------------------------------------------------
    def enqueue(self, w: Workload) -> int:
        """Queue ``w``; returns its index in its team's queue (``in_snapshot`` tells whether a snapshot of a given
        depth holds it)."""
        if w.id in self._where or w.id in self.leases:
            raise ValueError(f"workload {w.id} is already known")
        q = self._queues.setdefault(w.team, [])
        key = self._order.queue_key(w, self.config)
        at = bisect.bisect_right(q, key, key=_KEY)
        q.insert(at, (key, w))
        self._where[w.id] = (w.team, key)
        cached = self._queue_cache.get(w.team)
        if cached:  # the snapshots' heads it falls behind are unchanged (a burst queues behind them)
            for limit in [n for n in cached if self.in_snapshot(w.team, at, n)]:
                del cached[limit]
        c = (w.team, w.cls.name)
        self._counts[c] = self._counts.get(c, 0) + 1
        return at

    def dequeue(self, workload_id: str) -> Workload:
        if workload_id not in self._where:
            raise NotFoundError(f"no pending workload {workload_id!r}")
        team, i = self._place(workload_id)
        del self._where[workload_id]
        self.nominated.pop(workload_id, None)
        _, w = self._queues[team].pop(i)
        self._queue_cache.pop(team, None)
        c = (team, w.cls.name)
        self._counts[c] -= 1
        if not self._counts[c]:
            del self._counts[c]
        return w

    def _place(self, workload_id: str) -> Tuple[str, int]:
        """(team, index in its queue) of a pending workload. A queue key does not change while its workload waits:
        bisect to it (keys may tie where an ordering's key does not end in the id: then the run of equal keys is
        looked through)."""
        team, key = self._where[workload_id]
        q = self._queues[team]
        for i in range(bisect.bisect_left(q, key, key=_KEY), len(q)):
            k, w = q[i]
            if k != key:
                break
            if w.id == workload_id:
                return team, i
        raise NotFoundError(f"no pending workload {workload_id!r}")  # pragma: no cover - _where and queues agree

    def is_pending(self, workload_id: str) -> bool:
        return workload_id in self._where

    def nominate(self, ids: Iterable[str]) -> None:
        """The pending workloads that preempted and wait for what they freed are ``ids`` now (the others are
        not nominated any more); an id not pending is left out, and a workload leaves the book as it leaves its
        queue."""
        self.nominated = {wid: None for wid in ids if wid in self._where}

    def pending_count(self) -> int:
        return len(self._where)

    def pending(self) -> List[Workload]:
        return [w for q in self._queues.values() for _, w in q]

    def pending_counts(self) -> Dict[Tuple[str, str], int]:
        """How many workloads are pending per (team, class name), kept as they come and go."""
        return dict(self._counts)

    # -- leases --------------------------------------------------------------------------------------------
    def start(self, admit: Admit, now: float) -> Lease:
        """Apply an Admit decision: the workload leaves its queue and holds its placement from ``now``."""
        w = self.dequeue(admit.workload.id)
        placement = tuple(admit.placement)
        if w.gang.max_workers is not None and len(placement) != w.gang.workers:
            # An elastic gang admitted at another size than it was queued at: it holds what it was admitted with.
            w = replace(w, gang=w.gang.at(len(placement)))
        devices = tuple(admit.devices)
        if not devices and w.gang.per_worker.gpu > 0:
            # Not chosen by a cycle (a driver re-admitting what it found running): Ray's rule, on the devices now.
            # (a worker on a node that is gone holds no device)
            devs = {nid: self.nodes[nid].devices for nid in placement if nid in self.nodes}
            here = [nid for nid in placement if nid in devs]
            try:
                it = iter(pick_devices(devs, here, w.gang.per_worker.gpu))
                devices = tuple(next(it) if nid in devs else () for nid in placement)
            except ValueError:
                devices = ()  # Ray runs more there than the books have room for: counted, on no named device
        lease = Lease(w, placement, now, None, LeaseState.RUNNING, devices)
        self._put(lease)
        self._adjust(lease.placement, w.gang.per_worker, lease.devices, -1)
        self.usage[w.team] = (self.usage.get(w.team, Resources()) + w.gang.total).rounded()
        self._leases_cache = None
        return lease

    def resize(self, rz: Resize, now: float) -> Lease:
        """Apply a Resize decision: the running gang goes on at ``rz.to_workers`` on ``rz.placement`` from ``now``
        (a resize is a restart from a checkpoint: its start time is now, its service so far is kept). A driver that
        keeps a shrinking gang booked whole until it has stopped (``mark_terminating``) applies the shrink then: a
        terminating lease may be resized too, and runs again at its new size."""
        old = self.leases.get(rz.workload.id)
        if old is None:
            raise KeyError(f"resize of {rz.workload.id}: allowed only for a running or terminating lease")
        g = old.workload.gang
        if rz.from_workers != g.workers or len(rz.placement) != rz.to_workers or not g.lo <= rz.to_workers <= g.hi:
            raise ValueError(f"resize of {rz.workload.id} from {rz.from_workers} to {rz.to_workers} workers on "
                             f"{len(rz.placement)} nodes: allowed: from its size now ({g.workers}) to a size in "
                             f"[{g.lo}, {g.hi}], one node per worker")
        gone = self.finish(rz.workload.id, now)
        w = gone.workload
        ran = max(0.0, now - gone.start_time) * w.gang.total.gpu
        w2 = replace(w, gang=w.gang.at(rz.to_workers), attained_gpu_s=w.attained_gpu_s + ran)
        self.enqueue(w2)
        return self.start(Admit(w2, tuple(rz.placement), devices=tuple(rz.devices)), now)

    def mark_terminating(self, workload_id: str) -> Lease:
        lease = self._lease(workload_id)
        lease = replace(lease, state=LeaseState.TERMINATING)
        self._put(lease)
        return lease

    def checkpointed(self, workload_id: str, now: float) -> None:
        lease = self._lease(workload_id)
        self._put(replace(lease, last_checkpoint_time=now))

    def finish(self, workload_id: str, now: float) -> Lease:
        """The lease's work ended (done, failed, cancelled or stopped): give its resources back."""
        lease = self.leases.pop(workload_id, None)
        if lease is None:
            raise NotFoundError(f"no lease {workload_id!r}")
        w = lease.workload
        del self._team_leases[w.team][workload_id]
        if self._orders:
            del self._seq_of[workload_id]
            self._elastic.pop(workload_id, None)
            self._seq_cache = None
            self._by_end.remove(workload_id)
            self._by_settle.remove(workload_id)
            self._order_cache = None
        self._team_leases_cache.pop(w.team, None)
        self._adjust(lease.placement, w.gang.per_worker, lease.devices, +1)
        self.usage[w.team] = (self.usage.get(w.team, Resources()) - w.gang.total).rounded()
        self._leases_cache = None
        self._charge(w.team, w.gang.total.gpu * max(0.0, now - lease.start_time), now, w.user)
        return lease

    def requeue(self, lease: Lease, now: float, attained_gpu_s: Optional[float] = None) -> Workload:
        """Put a stopped lease's workload back in its queue, keeping its original submit time (its place)."""
        w = lease.workload
        if attained_gpu_s is None:
            attained_gpu_s = w.attained_gpu_s + w.gang.total.gpu * max(0.0, now - lease.start_time)
        w2 = replace(w, attained_gpu_s=attained_gpu_s)
        self.enqueue(w2)
        return w2

    def _put(self, lease: Lease) -> None:
        if self._orders:
            seq = self._seq_of.get(lease.id)
            if seq is None:  # a new entry of the table: last in its order
                seq = self._seq_of[lease.id] = self._seq
                self._seq += 1
                self._seq_cache = None
            self._by_end.put(lease, static_end(lease, self.config), seq)
            self._by_settle.put(lease, settled_after(lease, self.config), seq)
            if lease.workload.gang.max_workers is not None:
                self._elastic[lease.id] = lease
            self._order_cache = None
        self.leases[lease.id] = lease
        self._team_leases.setdefault(lease.team, {})[lease.id] = lease
        self._team_leases_cache.pop(lease.team, None)
        self._leases_cache = None

    def _lease(self, workload_id: str) -> Lease:
        lease = self.leases.get(workload_id)
        if lease is None:
            raise NotFoundError(f"no lease {workload_id!r}")
        return lease

    # -- fair share ------------------------------------------------------------------------------------------
    def in_snapshot(self, team: str, index: int, limit: Optional[int]) -> bool:
        """Whether the workload at ``index`` of ``team``'s queue is among those ``snapshot(limit)`` holds: one of the
        first ``limit``, or any of a team whose users share it fairly (its snapshot picks among its whole queue)."""
        return limit is None or index < limit or self._user_fair(team)

    def _user_fair(self, team: str) -> bool:
        t = self.teams.get(team)
        return t is not None and t.users is not None and t.users.fair

    def _charge(self, team: str, gpu_s: float, now: float, user: Optional[str] = None) -> None:
        if team in self.teams and gpu_s > 0:
            self.decay(now)
            t = self.teams[team]  # read after the decay, or the charged team's own decay would be undone
            if t.users is None:
                self.teams[team] = replace(t, decayed_usage=t.decayed_usage + gpu_s)
            else:
                per_user = dict(t.user_usage)
                per_user[user] = per_user.get(user, 0.0) + gpu_s
                self.teams[team] = replace(t, decayed_usage=t.decayed_usage + gpu_s, user_usage=per_user)

    def decay(self, now: float) -> None:
        """Age every team's decayed usage to ``now`` with the configured half-life."""
        if self._decayed_at is None:
            self._decayed_at = now
            return
        dt = now - self._decayed_at
        if dt <= 0:
            return
        f = math.pow(0.5, dt / self.config.fair_share_half_life_s)
        self.teams = {k: replace(t, decayed_usage=t.decayed_usage * f) if t.users is None else
                      replace(t, decayed_usage=t.decayed_usage * f,
                              user_usage={u: v * f for u, v in t.user_usage.items()})
                      for k, t in self.teams.items()}
        self._decayed_at = now

    # -- snapshot ------------------------------------------------------------------------------------------
    def snapshot(self, limit: Optional[int] = None) -> Snapshot:
        """The state now. ``limit``: keep only the first ``limit`` workloads of each team queue; a cycle run with
        ``max_examined <= limit`` decides exactly as on the whole queue, and long queues are not copied."""
        if self._nodes_cache is None:
            self._nodes_cache = tuple(self.nodes.values())
        if self._leases_cache is None:
            self._leases_cache = tuple(self.leases.values())
        queues = {}
        for team, q in self._queues.items():
            per_limit = self._queue_cache.setdefault(team, {})
            t = per_limit.get(limit)
            if t is None:
                if limit is not None and self._user_fair(team):
                    t = per_limit[limit] = per_user_head((w for _, w in q), limit)
                else:
                    t = per_limit[limit] = tuple(w for _, w in (q if limit is None else q[:limit]))
            if t:
                queues[team] = t
        by_team = {}
        for team, ls in self._team_leases.items():
            t = self._team_leases_cache.get(team)
            if t is None:
                t = self._team_leases_cache[team] = tuple(ls.values())
            if t:
                by_team[team] = t
        if self._orders and self._order_cache is None:
            if self._seq_cache is None:
                self._seq_cache = dict(self._seq_of)
            self._order_cache = LeaseOrder(*self._by_end.frozen(), *self._by_settle.frozen(), self._seq_cache,
                                           tuple(self._elastic.values()))
        nominated = tuple(self._queues[t][i][1] for t, i in map(self._place, self.nominated))
        return Snapshot(self._nodes_cache, self._leases_cache, queues, dict(self.teams), self.config,
                        usage=dict(self.usage), leases_by_team=by_team, lease_order=self._order_cache,
                        nominated=nominated)


def _with_devices(node: Node) -> Node:
    """``node`` with its device shares written out, so that leases can take and give back named devices."""
    devs = node_devices(node)
    return node if devs is node.devices else replace(node, devices=devs)
