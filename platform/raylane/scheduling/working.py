"""The cycle's working snapshot: capacity, quota usage and holdings, changed together and put back in one place.

A cycle decides on copies of the snapshot's state; the snapshot itself never changes. Three things change as it
decides, and always together when a lease comes or goes: the free capacity per node and GPU device (``Capacity``),
what each team uses under its quota (``QuotaLedger``) and what each team's running and freshly admitted leases hold
(``Holdings``: whether a team borrows, so whether its work is protected from other teams' preemption).

``Working`` holds them and changes them only through ``add`` and ``remove`` (of a lease, or ``take``/``give`` of a
workload's placement). ``trial_removal(leases)`` takes leases away and returns the function that puts everything
back (Kueue's ``SimulateWorkloadRemoval``); ``checkpoint()`` returns that function for changes still to come, so a
preemption search may remove and add candidates freely and then undo the lot. The cycle's present, its future (the
cluster once stopping leases are gone) and every preemption search go through it; nothing else writes the three.

A revert restores recorded values rather than applying the inverse arithmetic: a search that removes and adds back
thousands of leases leaves no float residue in usage (0.1 + 0.2 - 0.2 != 0.1) and no GPU device chosen differently
from the one that was given back.
"""
from __future__ import annotations

from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple

from raylane.scheduling.admission import QuotaLedger
from raylane.scheduling.capacity import Capacity, WorkerDevices
from raylane.scheduling.flavors import placed_gpus
from raylane.scheduling.recorded import Recorded
from raylane.scheduling.types import ZERO, Lease, LeaseState, Resources, Workload

Revert = Callable[[], None]


class Holdings(Recorded):
    """What each team's leases hold, running leases apart from *fresh* ones (admitted earlier in this cycle).

    Running holdings are summed from the leases when first read (a cycle that never asks pays nothing), unless
    given. A lease chosen as a victim or displaced holds nothing any more.
    """

    __slots__ = ("_leases", "_running", "fresh", "fresh_leases")

    def __init__(self, leases: Sequence[Lease], running: Optional[Dict[str, Resources]] = None):
        super().__init__()
        self._leases = leases
        self._running = running
        self.fresh: Dict[str, Resources] = {}
        self.fresh_leases: Dict[str, Lease] = {}

    @property
    def running(self) -> Dict[str, Resources]:
        if self._running is None:
            held: Dict[str, Resources] = {}
            for l in self._leases:
                if l.state is LeaseState.RUNNING:
                    held[l.team] = held.get(l.team, ZERO) + l.workload.gang.total
            self._running = held
        return self._running

    def of(self, team: str, with_fresh: bool = False) -> Resources:
        u = self.running.get(team, ZERO)
        return u + self.fresh.get(team, ZERO) if with_fresh else u

    def add(self, w: Workload) -> None:
        self._change(w, w.gang.total)

    def remove(self, w: Workload) -> None:
        self._change(w, w.gang.total.scale(-1))

    def _change(self, w: Workload, delta: Resources) -> None:
        held = self.fresh if w.id in self.fresh_leases else self.running
        old = held.get(w.team)
        if self._log is not None:
            self._log.append((held, w.team, old))
        held[w.team] = (old or ZERO) + delta

    def admit(self, lease: Lease) -> None:
        """``lease`` was admitted in this cycle: fresh from now on."""
        self.fresh_leases[lease.id] = lease
        self.add(lease.workload)

    def stop(self, lease: Lease) -> None:
        """``lease`` was chosen as a victim or displaced: it holds nothing and is no longer fresh."""
        self.remove(lease.workload)
        self.fresh_leases.pop(lease.id, None)

    # Trials (see ``Working``): admitting and stopping (which change who is fresh) are the cycle's own decisions,
    # never made inside a trial.
    def mark(self) -> int:
        self.running  # summed before the trial, so that a rollback never needs to forget it
        return super().mark()

    def _restore(self, entry) -> None:
        held, team, old = entry
        if old is None:
            held.pop(team, None)
        else:
            held[team] = old


class Working:
    """Capacity, quota ledger and (optionally) holdings of one view of the cycle, changed together.

    The holdings are attached only to the view a preemption search runs on: an admission changes the present and
    claims its share of the future, but is held once.
    """

    __slots__ = ("cap", "ledger", "holdings")

    def __init__(self, cap: Capacity, ledger: QuotaLedger, holdings: Optional[Holdings] = None):
        self.cap, self.ledger, self.holdings = cap, ledger, holdings

    def copy(self) -> "Working":
        """Independent copies of capacity and ledger (the holdings, which are the cycle's, are not attached)."""
        return Working(self.cap.copy(), self.ledger.copy())

    def with_holdings(self, holdings: Holdings) -> "Working":
        """The same capacity and ledger, with ``holdings`` changed along."""
        return Working(self.cap, self.ledger, holdings)

    # -- changes -------------------------------------------------------------------------------------------
    def take(self, w: Workload, placement: Tuple[str, ...], devices: Sequence[WorkerDevices] = ()
             ) -> Tuple[WorkerDevices, ...]:
        """``w``'s gang on ``placement`` (on ``devices`` when given, else on those Ray's rule picks); returns the
        devices taken."""
        taken = self.cap.take_placement(placement, w.gang.per_worker, devices)
        self.ledger.add(w.team, w.gang.total, self._flavors(w, placement))
        if self.holdings is not None:
            self.holdings.add(w)
        return taken

    def give(self, w: Workload, placement: Tuple[str, ...], devices: Sequence[WorkerDevices] = ()) -> None:
        """Give back ``w``'s gang on ``placement`` (exactly ``devices``, when known)."""
        self.cap.give_placement(placement, w.gang.per_worker, devices)
        self.ledger.remove(w.team, w.gang.total, self._flavors(w, placement))
        if self.holdings is not None:
            self.holdings.remove(w)

    def _flavors(self, w: Workload, placement: Tuple[str, ...]):
        """The GPUs ``w``'s gang holds per node type on ``placement``, for a team with flavor quotas; else ()."""
        if w.team not in self.ledger.flimits:
            return ()
        nodes = self.cap.nodes
        return placed_gpus(w.gang.per_worker.gpu, placement, lambda nid: nodes[nid].node_type if nid in nodes else None)

    def add(self, lease: Lease) -> Tuple[WorkerDevices, ...]:
        return self.take(lease.workload, lease.placement, lease.devices)

    def remove(self, lease: Lease) -> None:
        self.give(lease.workload, lease.placement, lease.devices)

    # -- trials --------------------------------------------------------------------------------------------
    def checkpoint(self) -> Revert:
        """The function that puts capacity, ledger and holdings back as they are now, whatever changes between.
        Reverts must be called in the reverse order of their checkpoints."""
        cap_mark, ledger_mark = self.cap.mark(), self.ledger.mark()
        holdings = self.holdings
        held_mark = holdings.mark() if holdings is not None else None
        cap, ledger = self.cap, self.ledger

        def revert() -> None:
            cap.rollback(cap_mark)
            ledger.rollback(ledger_mark)
            if holdings is not None:
                holdings.rollback(held_mark)
        return revert

    def trial_removal(self, leases: Iterable[Lease]) -> Revert:
        """Remove ``leases``; returns the function that puts them (and anything changed since) back."""
        revert = self.checkpoint()
        for l in leases:
            self.remove(l)
        return revert


__all__: List[str] = ["Holdings", "Revert", "Working"]
