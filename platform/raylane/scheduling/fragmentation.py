"""Stranded GPUs: free GPUs that the waiting work cannot use because of how they are spread over the nodes.

This module owns the definition of the figure that the control actor exports (``raylane_stranded_gpus``),
``raylane queue`` prints in its footer and the simulator averages over a replay. Pure: no Ray, no clock; it reads
a ``Snapshot`` (or nodes and gangs) and changes nothing.

Words
- *in service*: a schedulable node (not cordoned, draining or quarantined). Free GPUs elsewhere are not counted:
  they are out of service, not fragmented.
- *waiting gang*: a pending workload that asks for GPUs and that its team's quota would admit now (the
  snapshot's admission policy on the current usage). Work blocked by quota cannot use free GPUs wherever they
  are, so it neither makes GPUs stranded nor counts as able to use them.
- *usable on a node*: a waiting gang could use a node when it could be placed whole (all-or-nothing) on the free
  capacity now with one of its workers there: the node has its features and room for a worker (GPU, CPU and
  memory), and its strategy's rule holds (strict-pack: one node holds every worker; strict-spread: enough
  distinct nodes have room; group: nodes sharing one value of its label hold it; the others: enough room in all).
- *blocked by spread*: a waiting gang that cannot be placed now although the free GPUs on the in-service nodes
  with its features add up to its GPUs: it waits because of where the free GPUs are, not because there are too
  few. (A 16-GPU gang waiting on a cluster with 8 free GPUs waits for capacity; that is not fragmentation.)

The figure
    While some waiting gang is blocked by spread, a node's stranded GPUs are its free GPUs less the most GPUs that
    workers of the waiting gangs usable there could fill together (any mix of their worker shapes, each as many
    times as fits). Summed per node type. While no waiting gang is blocked by spread, nothing is stranded:
    an idle cluster, or one whose waiting work waits for capacity or quota, is not fragmented.

Demand is not counted: one waiting 1-GPU job makes a 1-GPU hole on each of four nodes usable (it could take any
of them), so those holes are not stranded; idle for lack of work is not fragmentation. What is stranded is what
no waiting shape fits: the odd GPU on nodes where only 2-GPU workers wait, 7 free GPUs of a node where a
1 x 8-GPU gang waits.

Cost: the waiting gangs are reduced to their distinct (team, gang) shapes (with the caller's memo, a team queue
that has not changed since the last call is not read again) and the nodes to distinct (type, free, features)
classes, so a cluster of 1,000 nodes and a queue of 10,000 is a few dozen shapes over a few dozen classes.
The per-class fill is an exact search over worker counts, bounded by ``FILL_STEPS``; past the bound it keeps the
best fill found (stranded is then over-, never under-counted).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from operator import attrgetter
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from raylane.scheduling.admission import ADMISSIONS, QuotaLedger
from raylane.scheduling.cycle import team_usage
from raylane.scheduling.capacity import gpu_slots, partial
from raylane.scheduling.placement import slots
from raylane.scheduling.types import Gang, Node, Resources, Snapshot, Team, Workload, node_devices

__all__ = ["Fragmentation", "PendingMemo", "UNTYPED", "FILL_STEPS", "admissible", "best_fill", "fragmentation",
           "pending_gangs", "stranded_gpus", "takes_any_gpu"]

# The node-type key of nodes whose type is not set.
UNTYPED = "-"
# Bound on the search for the best fill of one node class (steps of the depth-first search).
FILL_STEPS = 2000
_EPS = 1e-9
_GANG = attrgetter("gang")

# A driver's memo for ``pending_gangs``: team -> (the queue it last read, that queue's distinct GPU gangs).
PendingMemo = Dict[str, Tuple[Sequence[Workload], Tuple[Gang, ...]]]


@dataclass(frozen=True)
class Fragmentation:
    """Stranded and free GPUs per node type (every in-service type with free GPUs, zeros included)."""

    stranded: Mapping[str, float]
    free: Mapping[str, float]
    # Distinct waiting gang shapes (after the quota filter), and how many of them are blocked by spread.
    waiting_shapes: int = 0
    blocked_shapes: int = 0

    @property
    def total(self) -> float:
        return sum(self.stranded.values())

    @property
    def free_total(self) -> float:
        return sum(self.free.values())

    def describe(self) -> str:
        """``3 (a100: 2, t4: 1)``: the total, then the node types that have any."""
        parts = [f"{t}: {v:g}" for t, v in sorted(self.stranded.items()) if v > _EPS]
        return f"{self.total:g}" + (f" ({', '.join(parts)})" if parts else "")


def pending_gangs(queues: Mapping[str, Sequence[Workload]], memo: Optional[PendingMemo] = None
                  ) -> Dict[str, Tuple[Gang, ...]]:
    """Per team, the distinct gangs of its pending GPU workloads.

    ``memo`` is the caller's to keep between calls (a dict; None: none): a team queue that is the very object it
    was last time (``ClusterState.snapshot`` hands out the same tuple until the queue changes) is not walked again.
    """
    out: Dict[str, Tuple[Gang, ...]] = {}
    for team, queue in queues.items():
        got = memo.get(team) if memo is not None else None
        if got is not None and got[0] is queue:
            out[team] = got[1]
            continue
        gangs = tuple(g for g in dict.fromkeys(map(_GANG, queue)) if g.per_worker.gpu > 0)
        out[team] = gangs
        if memo is not None:
            memo[team] = (queue, gangs)
    if memo is not None:
        for team in [t for t in memo if t not in queues]:
            del memo[team]
    return out


def admissible(per_team: Mapping[str, Iterable[Gang]], teams: Mapping[str, Team], usage: Mapping[str, Resources],
               admission: str = "quota") -> List[Gang]:
    """The distinct gangs of ``per_team`` that their team's quota would admit now (one check per team and gang)."""
    policy = ADMISSIONS.get(admission)
    ledger = QuotaLedger(teams, usage)
    out: Dict[Gang, None] = {}
    for team, gangs in per_team.items():
        for g in gangs:
            if g not in out and policy.check(ledger, team, g.total) is None:
                out[g] = None
    return list(out)


def stranded_gpus(snapshot: Snapshot, memo: Optional[PendingMemo] = None) -> Fragmentation:
    """The stranded GPUs of ``snapshot`` (its nodes, its pending work, its quotas). ``memo``: see
    ``pending_gangs``; a driver that computes this every tick keeps one."""
    if not any(n.schedulable and n.free.gpu > _EPS for n in snapshot.nodes):
        return fragmentation(snapshot.nodes, ())  # no free GPU in service: the queue need not be read
    usage = snapshot.usage if snapshot.usage is not None else team_usage(snapshot.leases)
    gangs = admissible(pending_gangs(snapshot.queues, memo), snapshot.teams, usage, snapshot.config.admission)
    return fragmentation(snapshot.nodes, gangs)


class _Class:
    """Nodes alike for this purpose: same type, free resources and features (and, while group gangs are decided,
    the same values of their labels; after that, the same group gangs usable there)."""

    __slots__ = ("node_type", "free", "features", "labels", "count", "usable", "devices")

    def __init__(self, node_type: str, free: Resources, features: frozenset, labels: Tuple = (),
                 devices: Optional[Tuple[float, ...]] = None):
        self.node_type, self.free, self.features, self.labels = node_type, free, features, labels
        # The free share of each GPU device where one is partly used (a worker fits by devices there), else None.
        self.devices = devices
        self.count = 0
        self.usable: Dict[Resources, None] = {}


def fragmentation(nodes: Iterable[Node], gangs: Sequence[Gang]) -> Fragmentation:
    """Stranded GPUs of ``nodes`` given the waiting ``gangs`` (already filtered by quota; see the module doc)."""
    gangs = [g for g in gangs if g.per_worker.gpu > 0]
    label_keys = tuple(dict.fromkeys(g.group_by for g in gangs if g.strategy == "group"))
    free, fine, whole = _node_classes(nodes, label_keys)
    if not gangs or not fine or (whole and any(map(takes_any_gpu, gangs))):
        # Nothing waits, nothing is free, or a waiting single 1-GPU worker could take any free GPU.
        return Fragmentation({t: 0.0 for t in free}, free, len(gangs), 0)
    room = _Slots()
    # Gangs of one worker shape and feature set share their per-class room; what differs between them (workers,
    # strategy) is then decided from a few totals.
    by_shape: Dict[Tuple, List[Gang]] = {}
    for g in gangs:
        key = (g.per_worker, g.features, g.group_by if g.strategy == "group" else None)
        by_shape.setdefault(key, []).append(g)
    fine_list = list(fine.values())
    blocked = _mark_group_gangs(by_shape, fine_list, label_keys, room)
    cls = _merged(fine_list)
    blocked += _mark_other_gangs(by_shape, cls, room)
    if not blocked:
        return Fragmentation({t: 0.0 for t in free}, free, len(gangs), 0)
    return Fragmentation(_stranded(cls, free), free, len(gangs), blocked)


def _node_classes(nodes: Iterable[Node], label_keys: Tuple) -> Tuple[Dict[str, float], Dict[Tuple, _Class], bool]:
    """1. Node classes: nodes in service with free GPUs, by type, free resources, features (and group labels).
    Also the free GPUs per node type, and whether every free GPU count is a whole number on whole devices."""
    free: Dict[str, float] = {}
    fine: Dict[Tuple, _Class] = {}
    whole = True
    for n in nodes:
        f = n.free
        if not n.schedulable or f.gpu <= _EPS:
            continue
        t = n.node_type or UNTYPED
        free[t] = free.get(t, 0.0) + f.gpu
        devs = n.devices if n.devices is not None else node_devices(n)
        devs = devs if partial(devs) else None
        whole = whole and f.gpu % 1 == 0 and devs is None
        labels = tuple(n.labels.get(k) for k in label_keys) if label_keys else ()
        key = (t, f.gpu, f.cpu, f.memory, n.features, labels, devs)  # floats: hashed faster than a Resources
        c = fine.get(key)
        if c is None:
            c = fine[key] = _Class(t, f, n.features, labels, devs)
        c.count += 1
    return free, fine, whole


def _mark_group_gangs(by_shape: Mapping[Tuple, List[Gang]], fine_list: List[_Class], label_keys: Tuple,
                      room: "_Slots") -> int:
    """2. Group gangs, on the classes split by label value: a class is usable when it has room for a worker and
    its group (nodes sharing the label value) has room for the whole gang. Marks ``usable``; the gangs blocked."""
    blocked = 0
    for (pw, feats, group_by), members in by_shape.items():
        if group_by is None:
            continue
        at = label_keys.index(group_by)
        per_value: Dict[str, int] = {}
        matching_gpus = 0.0
        fits = []
        for c in fine_list:
            if feats and not feats <= c.features:
                continue
            matching_gpus += c.free.gpu * c.count
            value = c.labels[at]
            k = room(c.free, pw, c.devices)
            if value is not None and k > 0:
                per_value[value] = per_value.get(value, 0) + k * c.count
                fits.append(c)
        fewest = min(g.workers for g in members)
        for c in fits:
            if per_value[c.labels[at]] >= fewest:
                c.usable[pw] = None
        largest_group = max(per_value.values(), default=0)
        blocked += sum(1 for g in members if largest_group < g.workers and matching_gpus + _EPS >= g.total.gpu)
    return blocked


def _merged(fine_list: List[_Class]) -> List[_Class]:
    """3. The classes merged again, label values left out."""
    merged: Dict[Tuple, _Class] = {}
    for c in fine_list:
        key = (c.node_type, c.free, c.features, tuple(c.usable), c.devices)
        m = merged.get(key)
        if m is None:
            m = merged[key] = _Class(c.node_type, c.free, c.features, devices=c.devices)
            m.usable = dict(c.usable)
        m.count += c.count
    return list(merged.values())


def _mark_other_gangs(by_shape: Mapping[Tuple, List[Gang]], cls: List[_Class], room: "_Slots") -> int:
    """4. Every other gang: could it be placed whole now, and on which classes could one of its workers be? Marks
    ``usable``; the gangs blocked."""
    blocked = 0
    for (pw, feats, group_by), members in by_shape.items():
        if group_by is not None:
            continue
        ks = [0 if feats and not feats <= c.features else room(c.free, pw, c.devices) for c in cls]
        matching_gpus = sum(c.free.gpu * c.count for c in cls if not feats or feats <= c.features)
        slots_total = sum(k * c.count for c, k in zip(cls, ks))
        nodes_with_room = sum(c.count for c, k in zip(cls, ks) if k > 0)
        most_on_one = max(ks, default=0)
        # The fewest workers a gang placeable here needs on one node: 1, or a strict-pack gang's size.
        one_node = math.inf
        for g in members:
            if g.strategy == "strict-pack":
                placeable = most_on_one >= g.workers
                if placeable:
                    one_node = min(one_node, g.workers)
            else:
                placeable = (nodes_with_room if g.strategy == "strict-spread" else slots_total) >= g.workers
                if placeable:
                    one_node = 1
            if not placeable and matching_gpus + _EPS >= g.total.gpu:
                blocked += 1
        for c, k in zip(cls, ks):
            if k >= one_node:
                c.usable[pw] = None
    return blocked


def _stranded(cls: List[_Class], free: Mapping[str, float]) -> Dict[str, float]:
    """5. Per node type: free GPUs less the best fill of the worker shapes usable on each class."""
    stranded: Dict[str, float] = {t: 0.0 for t in free}
    memo: Dict[Tuple, float] = {}
    for c in cls:
        shapes = tuple(sorted(c.usable, key=lambda r: (-r.gpu, r.cpu, r.memory)))
        key = (c.free, shapes, c.devices)
        used = memo.get(key)
        if used is None:
            used = memo[key] = best_fill(c.free, shapes, c.devices)
        left = c.free.gpu - used
        if left > _EPS:
            stranded[c.node_type] += left * c.count
    return {t: round(v, 6) for t, v in stranded.items()}


def takes_any_gpu(g: Gang) -> bool:
    """One worker of one GPU and nothing else, on any node: it can be placed wherever a whole GPU is free."""
    pw = g.per_worker
    return (g.workers == 1 and pw.gpu == 1 and pw.cpu == 0 and pw.memory == 0 and not g.features
            and g.strategy != "group")


class _Slots:
    """``slots(free, per_worker)``, remembered: the classes share a few free vectors, the gangs a few shapes."""

    __slots__ = ("seen",)

    def __init__(self):
        self.seen: Dict[Tuple[Resources, Resources], int] = {}

    def __call__(self, free: Resources, per_worker: Resources, devices: Optional[Tuple[float, ...]] = None) -> int:
        key = (free, per_worker, devices)
        k = self.seen.get(key)
        if k is None:
            k = slots(free, per_worker)
            if devices is not None and per_worker.gpu > 0:
                k = min(k, gpu_slots(devices, per_worker.gpu))
            self.seen[key] = k
        return k


def best_fill(free: Resources, shapes: Sequence[Resources], devices: Optional[Tuple[float, ...]] = None) -> float:
    """The most GPUs that workers of ``shapes`` (each any number of times) fill in ``free``: an exact
    depth-first search over worker counts, largest workers first, bounded by ``FILL_STEPS``. On a node with partly
    used ``devices``, one shape's fill counts by devices; several shapes are filled by the free amounts."""
    if not shapes:
        return 0.0
    if len(shapes) == 1:
        k = slots(free, shapes[0])
        if devices is not None and shapes[0].gpu > 0:
            k = min(k, gpu_slots(devices, shapes[0].gpu))
        return k * shapes[0].gpu
    best = 0.0
    steps = 0

    def go(i: int, room: Resources, used: float) -> None:
        nonlocal best, steps
        if used > best:
            best = used
        # Nothing left to try, the node filled, the budget spent, or even filling all the room left would not
        # beat the best fill found.
        if (i == len(shapes) or best >= free.gpu - _EPS or steps >= FILL_STEPS
                or used + room.gpu <= best + _EPS):
            return
        steps += 1
        pw = shapes[i]
        for c in range(slots(room, pw), -1, -1):
            go(i + 1, room - pw.scale(c), used + pw.gpu * c)

    go(0, free, 0.0)
    return best
