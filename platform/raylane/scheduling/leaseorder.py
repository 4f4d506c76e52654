"""Leases kept in the order of a time that does not change while they run, so that a cycle need not sort them.

Per-cycle passes over every running lease used to set the cycle's cost at scale (issue 14: some 4,000 leases
and 10,000 pending on 1,000 x 8 GPUs): EASY's shadow time sorted all leases by expected end, and the ``ordering``
preemption policy ranked them all, though its hysteresis let it stop none that had run less than an hour. Both keys
are fixed for a lease from its start: its *static end* (start + its planned runtime: its prediction or estimate, or the configured default)
and the instant it *settles* (``preemption.settled_after``). ``ClusterState`` keeps its leases sorted by each as they
start and finish (``SortedLeases``), and hands the orders to the cycle with each snapshot (``LeaseOrder``); the
cycle then reads only the leases it needs (those that end before the blocked head fits; those settled by now). It
also keeps the elastic gangs apart, so that growth does not look over every lease each cycle.

A snapshot built without them (``Snapshot.lease_order`` None) is decided exactly the same way, by sorting.

Ties keep the order of ``Snapshot.leases`` (a driver's lease table in the order the leases started): each lease has
a sequence number, its place there, which breaks ties as a stable sort of ``Snapshot.leases`` would.

Pure: no Ray, no clock.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

from raylane.scheduling.preemption import settled_after
from raylane.scheduling.types import Lease, LeaseState, SchedulerConfig

Key = Tuple[float, int]  # (the time, the lease's sequence number)


def static_end(lease: Lease, cfg: SchedulerConfig) -> float:
    """When ``lease`` is expected to end, before the clamp to now: start + its estimate (or the default runtime)."""
    est = lease.workload.planned_s()
    return lease.start_time + (est if est is not None else cfg.default_runtime_s)


class SortedLeases:
    """Leases sorted by (a time fixed while they run, their sequence number); changed one lease at a time."""

    __slots__ = ("_keys", "_leases", "_key_of", "_frozen")

    def __init__(self) -> None:
        self._keys: List[Key] = []
        self._leases: List[Lease] = []
        self._key_of: Dict[str, Key] = {}
        self._frozen: Optional[Tuple[Tuple[Key, ...], Tuple[Lease, ...]]] = None

    def put(self, lease: Lease, t: float, seq: int) -> None:
        """Add ``lease`` at time ``t``, or replace the lease of the same id (a new state, a checkpoint)."""
        self.remove(lease.id)
        key = (t, seq)
        i = bisect.bisect_left(self._keys, key)
        self._keys.insert(i, key)
        self._leases.insert(i, lease)
        self._key_of[lease.id] = key
        self._frozen = None

    def remove(self, lease_id: str) -> None:
        key = self._key_of.pop(lease_id, None)
        if key is None:
            return
        i = bisect.bisect_left(self._keys, key)
        del self._keys[i]
        del self._leases[i]
        self._frozen = None

    def copy(self) -> "SortedLeases":
        """An independent copy (the leases, which are immutable, are shared)."""
        out = SortedLeases()
        out._keys, out._leases, out._key_of = list(self._keys), list(self._leases), dict(self._key_of)
        out._frozen = self._frozen
        return out

    def frozen(self) -> Tuple[Tuple[Key, ...], Tuple[Lease, ...]]:
        """The order now, as tuples (copied only after a change)."""
        if self._frozen is None:
            self._frozen = (tuple(self._keys), tuple(self._leases))
        return self._frozen


@dataclass(frozen=True)
class LeaseOrder:
    """A snapshot's leases in static-end order and in settle order, with each lease's sequence number."""

    end_keys: Tuple[Key, ...]
    by_end: Tuple[Lease, ...]
    settle_keys: Tuple[Key, ...]
    by_settle: Tuple[Lease, ...]
    seq: Mapping[str, int]
    # The elastic gangs (a gang with a maximum size), in table order: the only leases a cycle's growth looks at.
    elastic: Tuple[Lease, ...] = ()

    @classmethod
    def of(cls, leases: Sequence[Lease], cfg: SchedulerConfig) -> "LeaseOrder":
        """The orders of ``leases`` (a snapshot's lease table, in its order) under ``cfg``, built at once: for a
        driver that does not keep them as its leases change (``ClusterState`` does)."""
        seq = {l.id: i for i, l in enumerate(leases)}
        end = sorted(((static_end(l, cfg), seq[l.id]), l) for l in leases)
        settle = sorted(((settled_after(l, cfg), seq[l.id]), l) for l in leases)
        return cls(tuple(k for k, _ in end), tuple(l for _, l in end), tuple(k for k, _ in settle),
                   tuple(l for _, l in settle), seq, tuple(l for l in leases if l.workload.gang.max_workers is not None))

    def settled(self, now: float) -> Sequence[Lease]:
        """The leases settled by ``now`` (``now >= settled_after``), in settle order."""
        return self.by_settle[:bisect.bisect_right(self.settle_keys, (now, float("inf")))]

    def ending(self, now: float, stopping: Sequence[Lease], fresh: Sequence[Lease],
               cfg: SchedulerConfig) -> Iterator[Lease]:
        """Every lease (and this cycle's ``fresh`` admissions, last in the lease table) in ``expected_end`` order,
        ties in table order: as ``sorted(leases + fresh, key=expected_end)`` gives them, lazily.

        First the leases that end now (terminating: ``stopping``; or past their static end), in table order; then
        the rest by static end, with the fresh admissions merged in."""
        cut = bisect.bisect_right(self.end_keys, (now, float("inf")))
        seq = self.seq
        # This cycle's admissions come after every lease of the table: in it, and among themselves, in their order.
        ends = [static_end(l, cfg) for l in fresh]
        later = sorted(((e, _AFTER + i), l) for i, (e, l) in enumerate(zip(ends, fresh)) if e > now)
        due = [(seq[l.id], l) for l in stopping]
        due += [(k[1], l) for k, l in zip(self.end_keys[:cut], self.by_end[:cut])
                if l.state is not LeaseState.TERMINATING]
        due.sort(key=_first)
        for _, l in due:
            yield l
        for e, l in zip(ends, fresh):
            if e <= now:
                yield l
        j, n = 0, len(later)
        keys, leases = self.end_keys, self.by_end
        for i in range(cut, len(leases)):
            l = leases[i]
            if l.state is LeaseState.TERMINATING:
                continue
            while j < n and later[j][0] < keys[i]:
                yield later[j][1]
                j += 1
            yield l
        for _, l in later[j:]:
            yield l


# Above every sequence number a driver gives (its leases started before this cycle's admissions).
_AFTER = 1 << 62


def _first(e):
    return e[0]


class InEndOrder:
    """Leases handed to a backfill policy already in ``expected_end`` order (``shadow`` does not sort them)."""

    __slots__ = ("_it",)

    def __init__(self, it) -> None:
        self._it = it

    def __iter__(self):
        return iter(self._it)
