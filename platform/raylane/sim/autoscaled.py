"""Autoscaled node groups in a replay: the nodes asked for, starting, joined, idle, removed or reclaimed, and their cost.

This module owns the lives of a replay's nodes when its cluster has growable, priced or spot groups
(``ClusterSpec.elastic``): which nodes exist, which are starting and when they join, since when each has been
idle, the spot reclaims drawn for them, and what they cost. It decides nothing about workloads: how many new nodes
each group needs comes from ``raylane.scheduling.autoscale.compute_demand`` on the scheduling cycle's ``Pending``
decisions, as the control plane will ask it; the arithmetic from that demand to launches and cancellations is the
pure ``scale_actions``. ``Fleet`` keeps the books and returns what to do; the replay (``raylane.sim.replay``)
carries it out on its ``ClusterState`` and its event queue, through the same node paths as outages.

Words
- *launch*: a node is asked for at ``t``; it *joins* (is added to the state, empty) at ``t + startup``, the group's
  ``startup`` or ``DEFAULT_STARTUP_S``. Until then it is *starting*.
- *demand*: ``compute_demand`` after the cycles of an instant settle, with each group at its joined nodes and the
  previous requests (a gang keeps its group). It asks, per gang, for whole new nodes; the group's *idle* nodes
  (joined, schedulable, holding no lease) count toward it first, as Ray's autoscaler packs requested bundles onto
  idle nodes before it launches any. The rest must be starting: more are launched, or the youngest starting nodes
  are *cancelled* (a request withdrawn before its nodes arrive cancels those not yet joined; they are billed until
  cancelled).
- *min*: a group never has fewer joined plus starting nodes than ``min``: a reclaimed node below it is replaced.
  A fixed group is a group with ``min == max == count``.
- *idle timeout*: a node that has held no lease for ``SimOptions.idle_timeout_s`` is removed, unless its group is
  at ``min`` or the demand counts on it; a node that holds a lease is never removed.
- *reclaim*: each joined spot node is taken back after an exponential time of rate
  ``SimOptions.spot_reclaim_per_hour``, drawn from a generator of its own seeded by the replay's seed and the node
  id, so that every policy replayed with one seed meets the same reclaims. Its leases end at once and are requeued
  as a failure's are (the work since their last checkpoint lost; cause ``reclaim``). A reclaimed node is gone.
- *bought*: a node is billed from its launch (the replay's first submit for the nodes the cluster starts with) to
  its removal, reclaim, cancellation or the end of the replay: node-hours, GPU-hours (node-hours x GPUs) and cost
  (GPU-hours x ``price``; node-hours x ``price`` for a node with no GPUs), split spot and on-demand.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from raylane.scheduling.autoscale import NodeRequest, ScaleSnapshot, compute_demand
from raylane.scheduling.types import Node, Pending
from raylane.sim.cluster import ClusterSpec, NodeGroupSpec
from raylane.sim.types import DEFAULT_IDLE_TIMEOUT_S, DEFAULT_SPOT_RECLAIM_PER_HOUR, DEFAULT_STARTUP_S, SimOptions

__all__ = ["DEFAULT_STARTUP_S", "DEFAULT_IDLE_TIMEOUT_S", "DEFAULT_SPOT_RECLAIM_PER_HOUR", "GroupNow",
           "scale_actions", "GroupLedger", "CapacityLog", "Fleet", "reclaim_rng"]

# What an idle check finds: remove the node, look again one idle timeout later, or nothing (no longer idle).
REMOVE, REARM = "remove", "rearm"


@dataclass(frozen=True)
class GroupNow:
    """One group as the scaling arithmetic reads it: its bounds, its joined, starting and idle nodes."""

    name: str
    lo: int
    hi: int
    joined: int
    starting: int
    idle: int


def scale_actions(groups: Sequence[GroupNow], wanted: Mapping[str, int]) -> Dict[str, int]:
    """Per group, nodes to launch (> 0) or starting nodes to cancel (< 0), for ``wanted`` new nodes per group (the
    demand's ``nodes_by_group``); groups with nothing to do are left out. The idle nodes count toward the demand,
    the group stays at ``min`` or above and at ``max`` or below (module words)."""
    out: Dict[str, int] = {}
    for g in groups:
        need = max(0, wanted.get(g.name, 0) - g.idle, g.lo - g.joined)
        need = min(need, max(0, g.hi - g.joined))
        if need != g.starting:
            out[g.name] = need - g.starting
    return out


def reclaim_rng(seed: int, node_id: str) -> random.Random:
    return random.Random(f"reclaims/{seed}/{node_id}")


@dataclass
class GroupLedger:
    """What one group did and cost over a replay."""

    name: str
    node_type: str
    gpus: int
    price: Optional[float]
    spot: bool
    lo: int
    hi: int
    start: int
    startup_s: float
    launched: int = 0
    cancelled: int = 0
    removed_idle: int = 0
    reclaimed: int = 0
    peak: int = 0
    node_s: float = 0.0

    @property
    def gpu_hours(self) -> float:
        return self.node_s * self.gpus / 3600.0

    @property
    def cost(self) -> Optional[float]:
        if self.price is None:
            return None
        return self.price * (self.gpu_hours if self.gpus else self.node_s / 3600.0)


@dataclass
class CapacityLog:
    """A replay's nodes: per group (``GroupLedger``), the options that shaped them, and sampled after every instant
    (beside ``SimResult.times``) the joined nodes, the starting nodes and the joined GPUs."""

    groups: List[GroupLedger]
    idle_timeout_s: float
    spot_reclaim_per_hour: float
    t0: float
    t1: float = 0.0
    nodes: List[int] = field(default_factory=list)
    starting: List[int] = field(default_factory=list)
    gpus: List[float] = field(default_factory=list)
    # Every node's billed life: (group, from, to), for the cost over part of the replay (``billed``).
    lives: List[Tuple[str, float, float]] = field(default_factory=list)

    def billed(self, t0: float, t1: float) -> Dict[str, float]:
        """Node-seconds per group billed within ``[t0, t1]``."""
        out = {g.name: 0.0 for g in self.groups}
        for name, a, b in self.lives:
            out[name] += max(0.0, min(b, t1) - max(a, t0))
        return out


class Fleet:
    """The books of one replay's nodes (module words). Every method takes ``now`` from the replay and returns what
    the replay must do; none touches the ``ClusterState``, which the methods only read."""

    def __init__(self, cluster: ClusterSpec, options: SimOptions, t0: float):
        self.opts = options
        self.t0 = t0
        self.specs: Dict[str, NodeGroupSpec] = {g.name: g for g in cluster.node_groups}
        self.growable_types = frozenset(g.node_type for g in cluster.node_groups if g.growable)
        self.ledger: Dict[str, GroupLedger] = {
            g.name: GroupLedger(g.name, g.node_type, g.gpus, g.price, g.spot, g.lo, g.hi, g.count or 0,
                                DEFAULT_STARTUP_S if g.startup is None else g.startup, peak=g.count or 0)
            for g in cluster.node_groups}
        self.next_index = {g.name: g.count or 0 for g in cluster.node_groups}
        self.group_of: Dict[str, str] = {}
        self.joined: Dict[str, Dict[str, float]] = {g.name: {} for g in cluster.node_groups}  # node -> billed from
        self.starting: Dict[str, Dict[str, float]] = {g.name: {} for g in cluster.node_groups}  # node -> launched
        self.idle_since: Dict[str, float] = {}
        self.counted: Dict[str, int] = {}  # idle nodes per group that the last demand counts on
        self.previous: Tuple[NodeRequest, ...] = ()
        self.memo: Dict[Tuple, object] = {}  # compute_demand's: the nodes each gang shape needs on each group
        self.index_of: Dict[str, int] = {}
        # Idle nodes of a group at ``min`` whose check found nothing to do: checked again when the group grows.
        self.unchecked: Dict[str, set] = {g.name: set() for g in cluster.node_groups}
        self.log = CapacityLog(list(self.ledger.values()), options.idle_timeout_s, options.spot_reclaim_per_hour, t0)
        for g in cluster.node_groups:
            for i, nd in enumerate(g.nodes()):
                self.group_of[nd.id] = g.name
                self.index_of[nd.id] = i
                self.joined[g.name][nd.id] = t0

    # ------------------------------------------------------------------------------------------------ reading
    def _idle(self, group: str, nodes: Mapping[str, Node]) -> List[str]:
        out = []
        for nid in self.joined[group]:
            nd = nodes.get(nid)
            if nd is not None and nd.schedulable and nid in self.idle_since:
                out.append(nid)
        return out

    def initial_events(self) -> List[Tuple[float, str, str, object]]:
        """The idle checks and reclaims of the nodes the cluster starts with: (time, kind, node, argument)."""
        out: List[Tuple[float, str, str, object]] = []
        for name in self.joined:
            for nid in self.joined[name]:
                out += self._on_join(nid, self.t0)
        return out

    # ------------------------------------------------------------------------------------------------ scaling
    def rescale(self, now: float, pending: Sequence[Pending], nodes: Mapping[str, Node],
                flavor_room: Tuple[Tuple[str, str, float], ...] = ()) -> Tuple[List[Tuple[float, str]], List[str]]:
        """After the cycles of an instant settled on ``pending`` (the last cycle's ``Pending`` decisions) and the
        state's ``nodes``: the nodes to launch as (join time, node id), and the starting nodes cancelled.
        ``flavor_room``: what the teams' flavor quotas still have room for (``flavors.flavor_rooms``)."""
        groups = tuple(g.scale_group(len(self.joined[g.name])) for g in self.specs.values())
        demand = compute_demand(ScaleSnapshot(tuple(pending), groups, previous=self.previous,
                                              flavor_room=flavor_room), memo=self.memo)
        self.previous = demand.requests
        wanted = demand.nodes_by_group()
        now_groups = []
        for name, g in self.specs.items():
            idle = len(self._idle(name, nodes))
            self.counted[name] = min(idle, wanted.get(name, 0))
            now_groups.append(GroupNow(name, g.lo, g.hi, len(self.joined[name]), len(self.starting[name]), idle))
        launch: List[Tuple[float, str]] = []
        cancelled: List[str] = []
        for name, k in scale_actions(now_groups, wanted).items():
            led, starting = self.ledger[name], self.starting[name]
            if k > 0:
                for _ in range(k):
                    i = self.next_index[name]
                    nid = self.specs[name].node(i).id
                    self.next_index[name] += 1
                    self.group_of[nid] = name
                    self.index_of[nid] = i
                    starting[nid] = now
                    led.launched += 1
                    launch.append((now + led.startup_s, nid))
            else:
                for nid in sorted(starting, key=lambda n: (starting[n], n), reverse=True)[:-k]:
                    since = starting.pop(nid)
                    led.node_s += now - since
                    self.log.lives.append((name, since, now))
                    led.cancelled += 1
                    cancelled.append(nid)
        return launch, cancelled

    def join(self, nid: str, now: float) -> Optional[Tuple[Node, List[Tuple[float, str, str, object]]]]:
        """A launched node's start-up is over: the node to add to the state and the events it brings (its idle
        check, its reclaim, and the checks of idle nodes of its group that were at ``min``); None when it was
        cancelled meanwhile."""
        name = self.group_of.get(nid)
        if name is None or nid not in self.starting[name]:
            return None
        self.joined[name][nid] = self.starting[name].pop(nid)
        led = self.ledger[name]
        led.peak = max(led.peak, len(self.joined[name]))
        events = self._on_join(nid, now)
        for other in sorted(self.unchecked[name]):
            since = self.idle_since.get(other)
            if since is not None:
                events.append((max(now, since + self.opts.idle_timeout_s), "idle", other, since))
        self.unchecked[name].clear()
        return self.specs[name].node(self.index_of[nid]), events

    def _on_join(self, nid: str, now: float) -> List[Tuple[float, str, str, object]]:
        """The node is idle from ``now``: its idle check (a growable group's nodes only) and its reclaim (spot)."""
        spec = self.specs[self.group_of[nid]]
        self.idle_since[nid] = now
        out: List[Tuple[float, str, str, object]] = []
        if spec.growable:
            out.append((now + self.opts.idle_timeout_s, "idle", nid, now))
        rate = self.opts.spot_reclaim_per_hour
        if spec.spot and rate > 0:
            rng = reclaim_rng(self.opts.seed, nid)
            out.append((now + rng.expovariate(rate / 3600.0), "reclaim", nid, None))
        return out

    # -------------------------------------------------------------------------------------------------- leases
    def busy(self, placement: Sequence[str]) -> None:
        """A lease now holds these nodes: they are not idle."""
        for nid in placement:
            self.idle_since.pop(nid, None)

    def maybe_idle(self, placement: Sequence[str], nodes: Mapping[str, Node], now: float
                   ) -> List[Tuple[float, str, str, object]]:
        """A lease on these nodes ended: the idle checks of those it left holding no lease."""
        out: List[Tuple[float, str, str, object]] = []
        for nid in set(placement):
            nd = nodes.get(nid)
            if nd is None or nid in self.idle_since or nid not in self.group_of or not _empty(nd):
                continue
            self.idle_since[nid] = now
            if self.specs[self.group_of[nid]].growable:
                out.append((now + self.opts.idle_timeout_s, "idle", nid, now))
        return out

    def idle_check(self, nid: str, since: float, nodes: Mapping[str, Node]) -> Optional[str]:
        """An idle check of ``nid`` (idle from ``since``) is due: ``REMOVE`` it, ``REARM`` the check (the demand
        counts on the group's idle nodes), or None (it held a lease since, or its group is at ``min``: it is checked
        again when the group grows)."""
        name = self.group_of.get(nid)
        if name is None or self.idle_since.get(nid) != since or nid not in self.joined[name] or nid not in nodes:
            return None
        if not _empty(nodes[nid]):
            return None
        if len(self.joined[name]) <= self.specs[name].lo:
            self.unchecked[name].add(nid)
            return None
        if len(self._idle(name, nodes)) <= self.counted.get(name, 0):
            return REARM
        return REMOVE

    def gone(self, nid: str, now: float, reclaimed: bool = False) -> bool:
        """A joined node was removed (idle) or reclaimed at ``now``; whether it was one."""
        name = self.group_of.get(nid)
        if name is None or nid not in self.joined[name]:
            return False
        led = self.ledger[name]
        since = self.joined[name].pop(nid)
        led.node_s += now - since
        self.log.lives.append((name, since, now))
        self.idle_since.pop(nid, None)
        self.unchecked[name].discard(nid)
        if reclaimed:
            led.reclaimed += 1
        else:
            led.removed_idle += 1
        return True

    def is_joined(self, nid: str) -> bool:
        name = self.group_of.get(nid)
        return name is not None and nid in self.joined[name]

    # ------------------------------------------------------------------------------------------------- series
    def sample(self) -> None:
        log = self.log
        log.nodes.append(sum(len(j) for j in self.joined.values()))
        log.starting.append(sum(len(s) for s in self.starting.values()))
        log.gpus.append(float(sum(len(self.joined[n]) * g.gpus for n, g in self.specs.items())))

    def close(self, t1: float) -> CapacityLog:
        """The books at the end of the replay (``t1``): nodes still joined or starting are billed to it."""
        for name in self.specs:
            led = self.ledger[name]
            for since in list(self.joined[name].values()) + list(self.starting[name].values()):
                led.node_s += max(0.0, t1 - since)
                self.log.lives.append((name, since, max(since, t1)))
            self.joined[name].clear()
            self.starting[name].clear()
        self.log.t1 = t1
        return self.log


def _empty(node: Node) -> bool:
    f, c = node.free, node.capacity
    return f.gpu >= c.gpu - 1e-9 and f.cpu >= c.cpu - 1e-9 and f.memory >= c.memory - 1e-9
