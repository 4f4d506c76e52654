"""Gang placement: which node each worker of a gang goes to, all or nothing.

One class per strategy, registered by the strategy's name (the ``Gang.strategy`` field). A placement policy reads a
``Capacity`` and returns one node id per worker, or ``None`` when the whole gang cannot be placed now. It never
changes the capacity: the cycle takes what it returns. Every strategy honours the gang's required node features.

Strategies (the Ray placement-group strategy each maps to is in ``RAY_STRATEGY``):
- pack: as few nodes as possible, fullest fitting node first (best fit); soft.
- strict-pack: every worker on one node.
- spread: one worker per node where possible, emptiest nodes first; soft.
- strict-spread: every worker on a different node.
- balanced: each worker to the node with the most free GPUs at that moment, so load stays even.
- group: every worker on nodes that share one value of a node label (``Gang.group_by``, e.g. a rack or NVLink
  domain); the fullest group that fits is chosen.
- data-locality: pack onto nodes that cache the workload's data snapshot; if they cannot hold it, pack anywhere.

GPUs are counted per device (``raylane.scheduling.capacity``): a worker fits on a node only where a device has room
for its share (below 1 GPU) or enough devices are fully free (whole GPUs). For fractional work, pack prefers the
node whose tightest-fitting device is left fullest (fewest partly used devices in the cluster); spread prefers the
emptiest nodes, as for whole GPUs.

Before any strategy, a gang with preferred nodes (``Gang.prefer``: a pipeline stage's planned node, then the nodes
holding its inputs) goes whole onto the first of them that holds it now; otherwise the strategy decides.

Flavors and spot (``tiers``): a gang that names node types (``Gang.node_types``, most preferred first) is placed on
nodes of one type at a time, the first type with room now winning, whatever the strategy; a gang whose class prefers
spot nodes (``Gang.spot``) tries each type's spot nodes before its on-demand ones, and one that never runs on them
is not placed there. The strategy places the gang within a tier, never across two. A gang is never placed on a node
type of its ``avoid_types`` (those its team's flavor quotas have no room for, ``raylane.scheduling.flavors``).
"""
from __future__ import annotations

import heapq
import math
from dataclasses import replace
from typing import Dict, Iterable, List, Optional, Protocol, Tuple

from raylane.scheduling.capacity import Capacity
from raylane.scheduling.registry import Registry
from raylane.scheduling.types import SPOT_LABEL, Gang, Resources

Placement = Tuple[str, ...]

# The Ray placement-group strategy a gang's reservation uses; node choice is pinned per bundle by the driver.
RAY_STRATEGY = {
    "pack": "PACK",
    "strict-pack": "STRICT_PACK",
    "spread": "SPREAD",
    "strict-spread": "STRICT_SPREAD",
    "balanced": "SPREAD",
    "group": "PACK",
    "data-locality": "PACK",
}


class PlacementPolicy(Protocol):
    """Chooses nodes for a gang. Must not mutate ``cap``; returns ``None`` unless every worker is placed."""

    def place(self, gang: Gang, cap: Capacity, data_snapshot: Optional[str] = None) -> Optional[Placement]: ...


PLACEMENTS: Registry[PlacementPolicy] = Registry("placement", default="pack")


def slots(free: Resources, per_worker: Resources) -> int:
    """How many workers of ``per_worker`` fit in ``free``."""
    n = math.inf
    for req, have in ((per_worker.gpu, free.gpu), (per_worker.cpu, free.cpu), (per_worker.memory, free.memory)):
        if req > 0:
            n = min(n, math.floor(have / req + 1e-9))
    return 1 << 30 if n is math.inf else max(0, int(n))


def _matching(cap: Capacity, gang: Gang, ids: Iterable[str]) -> Iterable[Tuple[str, int]]:
    feats, pw, node_slots = gang.features, gang.per_worker, cap.slots
    types, spot, avoid = gang.node_types, gang.spot, gang.avoid_types
    spot_rule = spot == "never" or spot == "only"
    for nid in ids:
        if feats and not feats <= cap.nodes[nid].features:
            continue
        if types and cap.nodes[nid].node_type not in types:
            continue
        if avoid and cap.nodes[nid].node_type in avoid:
            continue
        if spot_rule and (cap.nodes[nid].labels.get(SPOT_LABEL) == "true") != (spot == "only"):
            continue
        k = node_slots(nid, pw)
        if k > 0:
            yield nid, k


def _greedy_fill(gang: Gang, cap: Capacity, ids: Iterable[str], per_node_cap: int) -> Optional[Placement]:
    out: List[str] = []
    need = gang.workers
    for nid, k in _matching(cap, gang, ids):
        take = min(k, need, per_node_cap)
        out.extend([nid] * take)
        need -= take
        if need == 0:
            return tuple(out)
    return None


def _single_node(gang: Gang, cap: Capacity, ids: Iterable[str]) -> Optional[Placement]:
    for nid, k in _matching(cap, gang, ids):
        if k >= gang.workers:
            return (nid,) * gang.workers
    return None


def _fullest(gang: Gang, cap: Capacity) -> Iterable[str]:
    """Nodes that may hold the whole gang, best fit first. For a share of a GPU (0 < g < 1): by what the tightest
    device fitting one worker would have left, so partly used devices fill up before a fresh one is opened."""
    ids = cap.ascending(gang.per_worker.gpu * gang.workers)
    g = gang.per_worker.gpu
    if not 0 < g < 1:
        return ids
    left = cap.best_device_left
    return sorted(ids, key=lambda nid: (round(left(nid, g), 9), cap.free[nid].gpu, nid))


@PLACEMENTS.register("strict-pack")
class StrictPack:
    def place(self, gang, cap, data_snapshot=None):
        return _single_node(gang, cap, _fullest(gang, cap))


@PLACEMENTS.register("pack")
class Pack:
    def place(self, gang, cap, data_snapshot=None):
        one = _single_node(gang, cap, _fullest(gang, cap))
        if one is not None or gang.workers == 1:
            return one
        # No single node holds the gang: fill the emptiest nodes first so it spans as few nodes as possible.
        return _greedy_fill(gang, cap, cap.descending(gang.per_worker.gpu), gang.workers)


@PLACEMENTS.register("spread")
class Spread:
    def place(self, gang, cap, data_snapshot=None):
        distinct = _greedy_fill(gang, cap, cap.descending(gang.per_worker.gpu), 1)
        if distinct is not None:
            return distinct
        # More workers than nodes with room: deal them out round by round, emptiest node first in each round, so
        # the gang still spans every node that has room and no node gets two more workers than another.
        nodes = list(_matching(cap, gang, cap.descending(gang.per_worker.gpu)))
        if sum(k for _, k in nodes) < gang.workers:
            return None
        count = {nid: 0 for nid, _ in nodes}
        need = gang.workers
        while need:
            for nid, k in nodes:
                if need and count[nid] < k:
                    count[nid] += 1
                    need -= 1
        return tuple(nid for nid, _ in nodes for _ in range(count[nid]))


@PLACEMENTS.register("strict-spread")
class StrictSpread:
    def place(self, gang, cap, data_snapshot=None):
        return _greedy_fill(gang, cap, cap.descending(gang.per_worker.gpu), 1)


@PLACEMENTS.register("balanced")
class Balanced:
    def place(self, gang, cap, data_snapshot=None):
        if gang.workers == 1:
            return _greedy_fill(gang, cap, cap.descending(gang.per_worker.gpu), 1)
        # Gather enough candidate slots, emptiest nodes first, then hand workers out one at a time to the node
        # with the most free GPUs left.
        heap: List[Tuple[float, str, int]] = []
        total = 0
        for nid, k in _matching(cap, gang, cap.descending(gang.per_worker.gpu)):
            heap.append((-cap.free[nid].gpu, nid, k))
            total += k
            if total >= gang.workers and len(heap) >= gang.workers:
                break
        if total < gang.workers:
            return None
        heapq.heapify(heap)
        out = []
        for _ in range(gang.workers):
            neg, nid, k = heapq.heappop(heap)
            out.append(nid)
            if k > 1:
                heapq.heappush(heap, (neg + gang.per_worker.gpu, nid, k - 1))
        return tuple(out)


@PLACEMENTS.register("group")
class Group:
    def place(self, gang, cap, data_snapshot=None):
        groups: Dict[str, List[Tuple[str, int]]] = {}
        for nid, k in _matching(cap, gang, cap.descending(gang.per_worker.gpu)):
            value = cap.nodes[nid].labels.get(gang.group_by)
            if value is not None:
                groups.setdefault(value, []).append((nid, k))
        best: Optional[Tuple[int, str]] = None
        for value, members in groups.items():
            spare = sum(k for _, k in members) - gang.workers
            if spare >= 0 and (best is None or (spare, value) < best):
                best = (spare, value)
        if best is None:
            return None
        ids = [nid for nid, _ in groups[best[1]]]
        return _greedy_fill(gang, cap, ids, gang.workers)


@PLACEMENTS.register("data-locality")
class DataLocality:
    def place(self, gang, cap, data_snapshot=None):
        if data_snapshot:
            local = [nid for nid in cap.descending(gang.per_worker.gpu) if data_snapshot in cap.nodes[nid].datasets]
            local.sort(key=lambda nid: cap.free[nid].gpu)
            got = _single_node(gang, cap, local) or _greedy_fill(gang, cap, reversed(local), gang.workers)
            if got is not None:
                return got
        return Pack().place(gang, cap)


def tiers(gang: Gang) -> Tuple[Gang, ...]:
    """The gang as it is tried, in order: one node type of its ``node_types`` at a time (most preferred first) and,
    for ``spot: prefer``, on that type's spot nodes before its on-demand ones; just the gang when there is no
    choice to make."""
    if len(gang.node_types) <= 1 and gang.spot != "prefer":
        return (gang,)
    types = [(t,) for t in gang.node_types] or [()]
    spots = ("only", "never") if gang.spot == "prefer" else (gang.spot,)
    return tuple(replace(gang, node_types=t, spot=s) for t in types for s in spots)


def place(gang: Gang, cap: Capacity, data_snapshot: Optional[str] = None) -> Optional[Placement]:
    """Where ``gang`` goes now on ``cap`` (its preferred nodes, then its strategy), on the first of its ``tiers``
    that has room; None when none has."""
    if len(gang.node_types) > 1 or gang.spot == "prefer":
        for tier in tiers(gang):
            got = _place(tier, cap, data_snapshot)
            if got is not None:
                return got
        return None
    return _place(gang, cap, data_snapshot)


def _place(gang: Gang, cap: Capacity, data_snapshot: Optional[str]) -> Optional[Placement]:
    if gang.prefer:
        got = _single_node(gang, cap, [nid for nid in gang.prefer if nid in cap.nodes])
        if got is not None:
            return got
    return PLACEMENTS.get(gang.strategy).place(gang, cap, data_snapshot)
