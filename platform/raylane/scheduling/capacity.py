"""Working capacity of one cycle: free resources per node and per GPU device, indexed for fast best-fit and
worst-fit lookups.

The cycle builds one ``Capacity`` from the snapshot's nodes and changes only this copy while it decides
(admissions take, preemption searches give back and roll back, through ``raylane.scheduling.working``). The
snapshot itself is never touched.

Nodes are bucketed by free GPUs so that a placement looks at a handful of buckets, not at every node: with 1,000
nodes a single-GPU best-fit is a few dictionary lookups. Within a bucket nodes are kept in node id order: among
equally good nodes the choice depends only on their ids, never on the order nodes were added or on what was freed
before, so a replay's figures depend only on the trace, the cluster and the policy.

Devices (see ``raylane.scheduling.types``): beside a node's free resources, the free share of each of its GPU
devices. The free GPU count (buckets, reasons, quotas) is their sum; whether a worker *fits* is decided on the
devices. Which device a worker takes follows Ray's own rule, so that the core's books match what Ray does with the
bundle pinned to that node: a share below 1 goes to the device it fits tightest (best fit, lowest index on ties),
a whole number of GPUs to the lowest-numbered fully free devices. A take or give-back is of named devices
(``Lease.devices``), so finishing, preemption and a rollback return exactly what was taken.
"""
from __future__ import annotations

import bisect
from operator import attrgetter
from typing import Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

from raylane.scheduling.recorded import Recorded
from raylane.scheduling.types import GPU_EPS, Node, Resources, node_devices

__all__ = ["Capacity", "Devices", "WorkerDevices", "choose_devices", "gpu_slots", "partial", "pick_devices",
           "returned_devices", "shift_devices"]

_GPU, _CPU, _MEMORY = attrgetter("gpu"), attrgetter("cpu"), attrgetter("memory")
_NOTHING = Resources()
_MANY = 1 << 30

Devices = Tuple[float, ...]
# The devices one worker holds: one index for a share of a GPU, k indices for k whole GPUs, none for no GPU.
WorkerDevices = Tuple[int, ...]


# -- devices: pure functions of one node's free shares ------------------------------------------------------------
def gpu_slots(devs: Devices, g: float) -> int:
    """How many workers of ``g`` GPUs fit on devices with these free shares."""
    if g <= 0:
        return _MANY
    if g < 1:
        return sum(int(d / g + GPU_EPS) for d in devs)
    full = 0
    for d in devs:
        if d >= 1 - GPU_EPS:
            full += 1
    return full // int(round(g))


def choose_devices(devs: Devices, g: float) -> Optional[WorkerDevices]:
    """The devices a worker of ``g`` GPUs takes by Ray's rule, or None when none fit."""
    if g <= 0:
        return ()
    if g < 1:
        best, best_left = -1, 2.0
        for i, d in enumerate(devs):
            left = d - g
            if left >= -GPU_EPS and left < best_left - GPU_EPS:
                best, best_left = i, left
        return None if best < 0 else (best,)
    k = int(round(g))
    if k == 1:
        for i, d in enumerate(devs):
            if d >= 1 - GPU_EPS:
                return (i,)
        return None
    out = tuple(i for i, d in enumerate(devs) if d >= 1 - GPU_EPS)[:k]
    return out if len(out) == k else None


def returned_devices(devs: Devices, g: float) -> WorkerDevices:
    """Which devices a worker of ``g`` GPUs gives back to when its lease does not name the ones it held: the most
    used devices that can take ``g`` back, highest index first (where ``node_devices`` puts what is used). With
    ``shift_devices`` it is how ``Capacity.give``, ``ClusterState`` and the forecast's plan return such a worker's
    GPUs, so that all three count them on the same devices."""
    if g <= 0:
        return ()
    order = sorted(range(len(devs)), key=lambda i: (devs[i], -i))
    if g < 1:
        for i in order:
            if devs[i] + g <= 1 + GPU_EPS:
                return (i,)
        return (order[0],) if order else ()
    return tuple(order[:int(round(g))])


def shift_devices(devs: Devices, idx: WorkerDevices, g: float, sign: int) -> Devices:
    """``devs`` (free shares) with a worker of ``g`` GPUs on devices ``idx`` taken (``sign`` -1) or given back (+1):
    a share of a GPU rounded to 9 places (the same shares whatever the order of takes and gives), whole devices
    exactly. ``devs`` is not changed."""
    if not idx:
        return devs
    out = list(devs)
    if g < 1:
        for i in idx:
            out[i] = round(out[i] + sign * g, 9)
    else:
        for i in idx:
            out[i] += sign  # whole devices: 1.0 <-> 0.0, exact
    return tuple(out)



def partial(devs: Devices) -> bool:
    """Whether some device is partly used (neither fully free nor fully taken)."""
    return devs.count(1.0) + devs.count(0.0) != len(devs)


def pick_devices(devs: Dict[str, Devices], placement: Sequence[str], g: float) -> Tuple[WorkerDevices, ...]:
    """The devices each worker of ``placement`` would take, in order, from ``devs`` (not changed)."""
    if g <= 0:
        return ((),) * len(placement)
    local: Dict[str, Devices] = {}
    out = []
    for nid in placement:
        d = local.get(nid)
        if d is None:
            d = devs[nid]
        idx = choose_devices(d, g)
        if idx is None:
            raise ValueError(f"node {nid}: no GPU device has room for {g:g} GPU (free shares {list(d)})")
        local[nid] = shift_devices(d, idx, g, -1)
        out.append(idx)
    return tuple(out)


def _devices_of(node: Node) -> Devices:
    d = node_devices(node)
    return d if node.schedulable else (0.0,) * len(d)


class Capacity(Recorded):
    __slots__ = ("nodes", "free", "dev", "_partial", "_buckets", "_keys", "_total", "grown", "changes")

    def __init__(self, nodes: Iterable[Node]):
        super().__init__()
        self.nodes: Dict[str, Node] = {n.id: n for n in nodes}
        # An unschedulable (cordoned) node offers nothing: no placement lands there, and a preemption search that
        # gives back a victim's share on it frees nothing usable.
        self.free: Dict[str, Resources] = {nid: n.free if n.schedulable else _NOTHING for nid, n in self.nodes.items()}
        # A node's own devices are trusted to add up to its free GPUs (ClusterState keeps them so); derived if absent.
        self.dev: Dict[str, Devices] = {nid: n.devices if n.devices is not None and n.schedulable else
                                        _devices_of(n) for nid, n in self.nodes.items()}
        # Whether a node has a partly used device, worked out when first asked (a cycle looks at few nodes): only
        # there does a fit need a look at the devices; elsewhere whole free GPUs are whole free devices.
        self._partial: Dict[str, bool] = {}
        self._buckets: Dict[float, List[str]] = {}
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
        # How many changes have given something back on some node (a give, a rollback, an assign of more): while it
        # stays the same, only takes happened, and a gang that found no room finds none (``cycle`` remembers).
        self.grown = 0
        # How many changes of any kind: while it stays the same, every query answers as before.
        self.changes = 0

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
    def _set(self, node_id: str, new: Resources, devs: Devices) -> None:
        old = self.free[node_id]
        if self._log is not None:
            self._log.append((node_id, old, self.dev[node_id]))
        if old.gpu != new.gpu:
            self._bucket_remove(node_id, old.gpu)
            self._bucket_add(node_id, new.gpu)
        self.free[node_id] = new
        old_devs = self.dev[node_id]
        if devs is not old_devs:
            self.dev[node_id] = devs
            self._partial.pop(node_id, None)
        if new.gpu > old.gpu or new.cpu > old.cpu or new.memory > old.memory or (
                devs is not old_devs and any(n > o for n, o in zip(devs, old_devs))):
            self.grown += 1
        self.changes += 1
        self._total = self._total - old + new

    def assign(self, node_id: str, free: Resources, devices: Devices) -> None:
        """Set what is free on ``node_id`` outright (the cycle's view of what may start now is the lesser of the
        present and the future, worked out per node)."""
        self._set(node_id, free, devices)

    def take(self, node_id: str, res: Resources, devices: Optional[WorkerDevices] = None) -> WorkerDevices:
        """One worker of ``res`` on ``node_id``: on ``devices``, or on the devices Ray's rule picks. Returns them."""
        devs = self.dev[node_id]
        if devices is None:
            devices = choose_devices(devs, res.gpu)
            if devices is None:
                raise ValueError(f"node {node_id}: no GPU device has room for {res.gpu:g} GPU "
                                 f"(free shares {list(devs)})")
        free = self.free[node_id] - res
        if res.gpu % 1:
            free = free.rounded()  # shares of a GPU: the same free count whatever the order of takes and gives
        self._set(node_id, free, shift_devices(devs, devices, res.gpu, -1))
        return devices

    def give(self, node_id: str, res: Resources, devices: Optional[WorkerDevices] = None) -> None:
        """Give back one worker of ``res`` on ``node_id``: exactly ``devices``, when known."""
        devs = self.dev[node_id]
        if not devices and res.gpu > 0:
            devices = returned_devices(devs, res.gpu)
        free = self.free[node_id] + res
        if res.gpu % 1:
            free = free.rounded()
        self._set(node_id, free, shift_devices(devs, devices or (), res.gpu, +1))

    def take_placement(self, placement: Tuple[str, ...], per_worker: Resources,
                       devices: Sequence[WorkerDevices] = ()) -> Tuple[WorkerDevices, ...]:
        """Every worker of a placement (on ``devices`` when given); returns the devices each took.

        The inverse of ``give_placement``: a worker on an unknown or unschedulable node takes nothing (nothing is
        offered there, and giving it back gave nothing)."""
        nodes = self.nodes
        if devices:
            for nid, d in zip(placement, devices):
                n = nodes.get(nid)
                if n is not None and n.schedulable:
                    self.take(nid, per_worker, d)
            return tuple(devices)
        return tuple(self.take(nid, per_worker) if nid in nodes and nodes[nid].schedulable else ()
                     for nid in placement)

    def give_placement(self, placement: Tuple[str, ...], per_worker: Resources,
                       devices: Sequence[WorkerDevices] = ()) -> None:
        for i, nid in enumerate(placement):
            if nid in self.free and self.nodes[nid].schedulable:
                self.give(nid, per_worker, devices[i] if devices else None)

    def holds(self, placement: Sequence[str], per_worker: Resources, devices: Sequence[WorkerDevices]) -> bool:
        """Whether every worker of ``placement`` fits on its ``devices`` here now."""
        g = per_worker.gpu
        if g <= 0:
            return True
        local: Dict[str, Devices] = {}
        for nid, idx in zip(placement, devices):
            d = local.get(nid, self.dev[nid])
            share = g if g < 1 else 1.0
            if any(d[i] < share - GPU_EPS for i in idx):
                return False
            local[nid] = shift_devices(d, idx, g, -1)
        return True

    def pick(self, placement: Sequence[str], per_worker: Resources) -> Tuple[WorkerDevices, ...]:
        """The devices each worker of ``placement`` would take here by Ray's rule (nothing changes)."""
        return pick_devices(self.dev, placement, per_worker.gpu)

    # -- trial changes (see raylane.scheduling.working) -------------------------------------------------------
    def mark(self) -> Tuple[int, Resources]:
        """A mark (``Recorded``), with the total free as it is: a rollback puts it back rather than summing back."""
        return super().mark(), self._total

    def rollback(self, mark: Tuple[int, Resources]) -> None:
        at, total = mark
        super().rollback(at)
        self._total = total

    def _restore(self, entry) -> None:
        node_id, old, devs = entry
        self._set(node_id, old, devs)

    # -- queries -------------------------------------------------------------------------------------------
    def slots(self, node_id: str, per_worker: Resources) -> int:
        """How many workers of ``per_worker`` fit on ``node_id`` now: CPU and memory by the free amounts, GPUs by
        the devices."""
        f = self.free[node_id]
        n = _MANY
        for req, have in ((per_worker.gpu, f.gpu), (per_worker.cpu, f.cpu), (per_worker.memory, f.memory)):
            if req > 0:
                k = int(have / req + 1e-9)
                if k < n:
                    n = k
        g = per_worker.gpu
        if n > 0 and g > 0:
            if g >= 1:
                p = self._partial.get(node_id)
                if p is None:
                    p = self._partial[node_id] = partial(self.dev[node_id])
            if g < 1 or p:
                k = gpu_slots(self.dev[node_id], g)
                if k < n:
                    n = k
        return max(0, n)

    def best_device_left(self, node_id: str, g: float) -> float:
        """What the tightest-fitting device would have left after a share ``g`` (< 1) of it; 2.0 when none fits."""
        best = 2.0
        for d in self.dev[node_id]:
            left = d - g
            if -GPU_EPS <= left < best:
                best = left
        return best

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
        c.dev = dict(self.dev)
        c._partial = dict(self._partial)
        c._buckets = {k: list(v) for k, v in self._buckets.items()}
        c._keys = list(self._keys)
        Recorded.__init__(c)
        c._total = self._total
        c.grown = 0
        c.changes = 0
        return c
