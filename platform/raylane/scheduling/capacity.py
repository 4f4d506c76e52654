"""Working capacity of one cycle: free resources per node, indexed for fast best-fit and worst-fit lookups.

The cycle builds one ``Capacity`` from the snapshot's nodes and changes only this copy while it decides
(admissions take, preemption searches give back and undo). The snapshot itself is never touched.

Nodes are bucketed by free GPUs so that a placement looks at a handful of buckets, not at every node: with 1,000
nodes a single-GPU best-fit is a few dictionary lookups. Within a bucket nodes are kept in node id order: among
equally good nodes the choice depends only on their ids, never on the order nodes were added or on what was freed
before, so a replay's figures depend only on the trace, the cluster and the policy.
"""
from __future__ import annotations

import bisect
from operator import attrgetter
from typing import Dict, Iterable, Iterator, List, Optional, Tuple

from raylane.scheduling.types import Node, Resources


_GPU, _CPU, _MEMORY = attrgetter("gpu"), attrgetter("cpu"), attrgetter("memory")
_NOTHING = Resources()


class Capacity:
    __slots__ = ("nodes", "free", "_buckets", "_keys", "_log", "_total")

    def __init__(self, nodes: Iterable[Node]):
        self.nodes: Dict[str, Node] = {n.id: n for n in nodes}
        # An unschedulable (cordoned) node offers nothing: no placement lands there, and a preemption search that
        # gives back a victim's share on it frees nothing usable.
        self.free: Dict[str, Resources] = {nid: n.free if n.schedulable else _NOTHING for nid, n in self.nodes.items()}
        self._buckets: Dict[float, List[str]] = {}
        self._log: Optional[List[Tuple[str, Resources]]] = None
        buckets = self._buckets
        for nid, f in self.free.items():
            b = buckets.get(f.gpu)
            if b is None:
                b = buckets[f.gpu] = []
            b.append(nid)
        for b in buckets.values():
            b.sort()
        self._keys: List[float] = sorted(buckets)
        # Kept up to date from here on: every capacity-blocked workload's reason reads it.
        free = self.free.values()
        self._total = Resources(sum(map(_GPU, free)), sum(map(_CPU, free)), sum(map(_MEMORY, free)))

    # -- buckets -------------------------------------------------------------------------------------------
    def _bucket_add(self, node_id: str, gpu: float) -> None:
        b = self._buckets.get(gpu)
        if b is None:
            self._buckets[gpu] = [node_id]
            bisect.insort(self._keys, gpu)
        else:
            bisect.insort(b, node_id)

    def _bucket_remove(self, node_id: str, gpu: float) -> None:
        b = self._buckets[gpu]
        del b[bisect.bisect_left(b, node_id)]
        if not b:
            del self._buckets[gpu]
            self._keys.pop(bisect.bisect_left(self._keys, gpu))

    # -- changes -------------------------------------------------------------------------------------------
    def _set(self, node_id: str, new: Resources) -> None:
        old = self.free[node_id]
        if old.gpu != new.gpu:
            self._bucket_remove(node_id, old.gpu)
            self._bucket_add(node_id, new.gpu)
        self.free[node_id] = new
        self._total = self._total - old + new

    def take(self, node_id: str, res: Resources) -> None:
        if self._log is not None:
            self._log.append((node_id, res))
        self._set(node_id, self.free[node_id] - res)

    def give(self, node_id: str, res: Resources) -> None:
        if self._log is not None:
            self._log.append((node_id, res.scale(-1)))
        self._set(node_id, self.free[node_id] + res)

    def take_placement(self, placement: Tuple[str, ...], per_worker: Resources) -> None:
        for nid in placement:
            self.take(nid, per_worker)

    def give_placement(self, placement: Tuple[str, ...], per_worker: Resources) -> None:
        for nid in placement:
            if nid in self.free and self.nodes[nid].schedulable:
                self.give(nid, per_worker)

    # -- trial changes (remove-and-undo, as Kueue's preemption search does) -----------------------------------
    def begin(self) -> None:
        """Start recording changes so that ``undo`` can put them back."""
        self._log = []

    def undo(self) -> None:
        log, self._log = self._log or [], None
        for node_id, res in reversed(log):
            self._set(node_id, self.free[node_id] + res)

    def commit(self) -> None:
        self._log = None

    # -- queries -------------------------------------------------------------------------------------------
    def ascending(self, min_gpu: float) -> Iterator[str]:
        """Node ids with at least ``min_gpu`` free GPUs, fewest free GPUs first (best fit), then by node id."""
        i = bisect.bisect_left(self._keys, min_gpu - 1e-9)
        for k in list(self._keys[i:]):
            yield from list(self._buckets.get(k, ()))

    def descending(self, min_gpu: float) -> Iterator[str]:
        """Node ids with at least ``min_gpu`` free GPUs, most free GPUs first (worst fit), then by node id."""
        i = bisect.bisect_left(self._keys, min_gpu - 1e-9)
        for k in list(reversed(self._keys[i:])):
            yield from list(self._buckets.get(k, ()))

    def total_free(self) -> Resources:
        return self._total

    def best_node_for(self, per_worker: Resources, features: frozenset) -> Tuple[Optional[str], Resources]:
        """The matching node with the most free GPUs (for a pending reason), and its free resources."""
        for nid in self.descending(0.0):
            if features <= self.nodes[nid].features:
                return nid, self.free[nid]
        return None, Resources()

    def copy(self) -> "Capacity":
        c = Capacity.__new__(Capacity)
        c.nodes = self.nodes
        c.free = dict(self.free)
        c._buckets = {k: list(v) for k, v in self._buckets.items()}
        c._keys = list(self._keys)
        c._log = None
        c._total = self._total
        return c
