"""Carrying out a cycle's result: one place for every driver of the core (the control plane, the simulator, the
queue forecast, the test driver).

A cycle (``raylane.scheduling.cycle``) returns decisions; ``Applier.apply`` carries them out on the
``ClusterState`` through ``raylane.scheduling.lifecycle``, in one order and under one set of rules, and calls the
driver's hooks (``Driver``) for what only the driver does around each step: the control plane journals and emits
effects, the simulator and the forecast schedule simulated events, the test driver records.

Rules, the live plane's (``raylane.control``), written once:
- *order*: admissions, then resizes, then the preemptions' victims; the victims a driver stops at once (nothing ran
  on the lease yet, or its driver models no stop delay) stop last, so that nothing freed in a cycle is admitted by
  that cycle (the next one sees it).
- *stop*: a victim is told to stop and stays booked whole (``TERMINATING``) until its gang has stopped
  (``stopped``); its deadline is its class's grace period from the request, after which the driver stops it by
  force. A victim already stopping, or no longer holding its lease, is left as it is; one stopping for a resize
  now stops for good, keeping its deadline.
- *resize*: a growth books the new size at once; a shrink keeps the whole gang booked while it stops
  (``lifecycle.begin_resize``) and goes on at the new size once it has (``stopped``). A driver that models no
  stop for a resize (``Driver.resizes_at_once``) takes the new size at once, either way.
- *requeue*: a stopped lease goes back to its queue at its original place with the service it had until its gang
  stopped working (``until``; default: the stop).
- *nominate*: a workload that preempted and waits for what it freed (``WaitingForPreemption``) is nominated
  (``ClusterState.nominate``) until a cycle examines it and it waits no more for a victim (it was admitted, or
  waits for something else): every cycle examines the nominated, past its window too, so that a cycle of a smaller
  window than the one that chose the victims (the control plane's cycles between full ticks) does not give what
  they freed to the work ahead of it, the victim first when it stopped at once (a flip-flop, once: admitted in
  the short cycle, preempted again at the next full tick).
- *cycle again*: with the ``LIVE`` rule, only when the cycle's decisions freed something at once (a victim stopped
  at once: the control plane's poke after a release); with ``SETTLE``, also when it resized, used its whole
  admission budget, or admitted and ran out of workloads to examine (what one more cycle at the same instant may
  still admit: the rule of a driver whose clock does not tick every second).

Pure: no Ray, no clock (every step takes ``now``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Dict, List, Optional, Protocol, Tuple

from raylane.scheduling import lifecycle
from raylane.scheduling.types import (Admit, CycleResult, Lease, LeaseState, NotReached, Resize,
                                      WaitingForPreemption, Workload)

if TYPE_CHECKING:
    from raylane.scheduling.state import ClusterState

__all__ = ["LIVE", "SETTLE", "RULES", "CYCLE_AGAIN_MAX", "Stop", "Driver", "Applier", "cycle_again", "nominees"]

# The rules for cycling again at the same instant (see the module's *cycle again*).
LIVE, SETTLE = "live", "settle"
RULES = (LIVE, SETTLE)
# Under the LIVE rule, the most cycles changes may ask for between two clock ticks: past it the next cycle waits for
# the tick, so that cycles whose decisions keep undoing each other (a gang preempted before it started, released,
# admitted again in place of the one admitted for it) never run in a tight loop.
CYCLE_AGAIN_MAX = 8


@dataclass
class Stop:
    """A lease told to stop: when it was asked, by when it must have stopped (its grace period), why, and for a
    resize the size it goes on at (None: back to its queue)."""

    workload_id: str
    asked: float
    deadline: float
    cause: str = "preemption"
    reason: str = ""
    preemptor: Optional[Workload] = None
    resize: Optional[Resize] = None


class Driver(Protocol):
    """What a driver does around each step (every hook optional: ``Applier`` calls those the driver has)."""

    #: Resizes take their new size at once, either way (the driver models no stop for them).
    resizes_at_once: bool

    def starts_at(self, a: Admit, now: float) -> float:
        """When the lease of an admission at ``now`` starts (default ``now``; the forecast, whose steps take a
        window of ends at once, dates it back to the end that freed its room)."""

    def admitted(self, a: Admit, lease: Lease, now: float) -> None:
        """The workload holds its lease from ``now`` (the driver starts its work or hands it over)."""

    def may_resize(self, rz: Resize, lease: Lease, now: float) -> bool:
        """Whether the gang can be resized now (a gang still starting cannot yield; the core decides again)."""

    def resize_refused(self, rz: Resize, why: ValueError, now: float) -> None:
        """The state refused a resize taken at once (a driver without it lets the ValueError through)."""

    def resizing(self, rz: Resize, grown: Optional[Lease], stop: Optional[Stop], now: float) -> None:
        """The resize is under way: ``grown`` is the new lease of a growth booked at once (None for a shrink, still
        booked whole), ``stop`` the gang's stop (None when it took its size at once)."""

    def stopping(self, stop: Stop, lease: Lease, now: float) -> bool:
        """The lease is told to stop; True when it stops at once (nothing runs on it yet, or no stop delay is
        modelled): ``Applier`` then stops it after the cycle's admissions."""

    def requeue_as(self, lease: Lease, stop: Optional[Stop], now: float) -> Tuple[Workload, float]:
        """What goes back to the queue for a lease stopped at ``now`` and until when its service counts (default:
        the lease's workload, until ``now``)."""

    def requeued(self, lease: Lease, w: Workload, stop: Optional[Stop], now: float, attained: float) -> None:
        """The stopped lease's workload ``w`` is back in its queue with ``attained`` GPU-seconds of service."""

    def resized(self, rz: Resize, lease: Lease, stop: Stop, now: float) -> None:
        """A resize's gang stopped: the lease goes on at its new size (``lease``) from ``now``."""


def cycle_again(result: CycleResult, released: int, rule: str, budget: int, max_examined: int) -> bool:
    """Whether to run another cycle at the same instant after ``result`` (``released``: leases it ended at once)."""
    if released:
        return True
    if rule == LIVE:
        return False
    admitted = len(result.admitted)
    return bool(result.resized or admitted >= budget or (admitted and admitted + len(result.pending) >= max_examined))


def nominees(result: CycleResult, before) -> List[str]:
    """The workloads nominated after ``result`` (the module's *nominate*), ``before``: those nominated before it."""
    waiting = [p.workload.id for p in result.pending if isinstance(p.reason, WaitingForPreemption)]
    if not before:
        return waiting
    seen = {a.workload.id for a in result.admitted}
    seen.update(p.workload.id for p in result.pending if not isinstance(p.reason, NotReached))
    return [wid for wid in before if wid not in seen] + waiting


class Applier:
    """Carries out cycles' results on ``state`` for ``driver``, and keeps the book of the leases told to stop
    (``stops``) until their gangs have."""

    def __init__(self, state: "ClusterState", driver, *, rule: str = LIVE, max_examined: int = 10**9):
        if rule not in RULES:
            raise ValueError(f"cycle-again rule {rule!r}: allowed: {', '.join(RULES)}")
        self.state, self.driver, self.rule, self.max_examined = state, driver, rule, max_examined
        self.stops: Dict[str, Stop] = {}
        self._at_once = bool(getattr(driver, "resizes_at_once", False))
        self._may_resize = getattr(driver, "may_resize", None)
        self._admitted = getattr(driver, "admitted", None)
        self._starts_at = getattr(driver, "starts_at", None)
        self._refused = getattr(driver, "resize_refused", None)
        self._resizing = getattr(driver, "resizing", None)
        self._requeue_as = getattr(driver, "requeue_as", None)
        self._requeued = getattr(driver, "requeued", None)
        self._resized = getattr(driver, "resized", None)

    # ---------------------------------------------------------------------------------------------- a cycle
    def apply(self, result: CycleResult, now: float) -> bool:
        """Carry out ``result`` at ``now``; whether to cycle again at this instant (the module's rules)."""
        st = self.state
        starts_at = self._starts_at
        for a in result.admitted:
            lease = lifecycle.admit(st, a, now if starts_at is None else starts_at(a, now))
            if self._admitted is not None:
                self._admitted(a, lease, now)
        for rz in result.resized:
            self.resize(rz, now)
        at_once: List[str] = []
        for p in result.preempted:
            for vid in p.victims:
                if self.stop(vid, now, "preemption", reason=p.reason, preemptor=p.preemptor):
                    at_once.append(vid)
        for vid in at_once:
            self.stopped(vid, now)
        st.nominate(nominees(result, st.nominated))
        return cycle_again(result, len(at_once), self.rule, st.config.max_admissions_per_cycle, self.max_examined)

    def resize(self, rz: Resize, now: float) -> bool:
        """Carry out one ``Resize``; False when the driver says the gang cannot yield now."""
        lease = self.state.leases.get(rz.workload.id)
        if lease is None or lease.state is not LeaseState.RUNNING or rz.workload.id in self.stops:
            return False
        if self._may_resize is not None and not self._may_resize(rz, lease, now):
            return False
        if self._at_once:
            try:
                grown = lifecycle.resize(self.state, rz, now)
            except ValueError as why:
                if self._refused is None:
                    raise
                self._refused(rz, why, now)
                return False
            if self._resizing is not None:
                self._resizing(rz, grown, None, now)
            return True
        grown = lifecycle.begin_resize(self.state, rz, now)
        stop = self.stops[rz.workload.id] = Stop(rz.workload.id, now, now + lease.workload.cls.grace_period_s,
                                                 cause="resize", reason=rz.reason, resize=rz)
        if self._resizing is not None:
            self._resizing(rz, grown, stop, now)
        return True

    # ----------------------------------------------------------------------------------------------- stops
    def stop(self, wid: str, now: float, cause: str, *, reason: str = "", preemptor: Optional[Workload] = None,
             grace: Optional[float] = None) -> bool:
        """Tell ``wid``'s lease to stop (a preemption, a drain, a run limit); True when the driver stops it at once
        (the caller then calls ``stopped``). A lease stopping already for a stop of its own is left as it is; one
        stopping for a resize now stops for good, keeping its deadline."""
        lease = self.state.leases.get(wid)
        if lease is None:
            return False
        prior = self.stops.get(wid)
        if prior is not None and prior.resize is None:
            return False
        if prior is None and lease.state is LeaseState.TERMINATING:
            return False
        g = lease.workload.cls.grace_period_s if grace is None else grace
        deadline = prior.deadline if prior is not None else now + g
        stop = self.stops[wid] = Stop(wid, now, deadline, cause=cause, reason=reason, preemptor=preemptor)
        lifecycle.begin_stop(self.state, wid)
        return bool(self.driver.stopping(stop, lease, now))

    def stopped(self, wid: str, now: float) -> Optional[Lease]:
        """The gang told to stop has stopped (it yielded, or was stopped by force): a resize goes on at its new size
        (the lease returned); anything else ends and goes back to its queue (the ended lease returned). None when
        it holds no lease any more."""
        stop = self.stops.pop(wid, None)
        if stop is not None and stop.resize is not None:
            rz = stop.resize
            lease = self.state.leases.get(wid)
            if lease is None:
                return None
            rz = Resize(lease.workload, lease.workload.gang.workers, rz.to_workers, rz.placement, rz.devices, rz.reason)
            lease = lifecycle.finish_shrink(self.state, rz, now)
            if lease is not None and self._resized is not None:
                self._resized(rz, lease, stop, now)
            return lease
        if wid not in self.state.leases:
            return None
        lease = lifecycle.end(self.state, wid, now)
        self.requeue(lease, stop, now)
        return lease

    def requeue(self, lease: Lease, stop: Optional[Stop], now: float,
                as_: Optional[Tuple[Workload, float]] = None) -> Workload:
        """Put an ended lease's workload back in its queue (a stop's, or a lost node's: ``stop`` None): ``as_``, else
        the driver's ``requeue_as``, says what goes back and until when its service counts."""
        if as_ is not None:
            w, until = as_
        elif self._requeue_as is not None:
            w, until = self._requeue_as(lease, stop, now)
        else:
            w, until = lease.workload, now
        attained = lifecycle.attained_gpu_s(lease, until)
        w = lifecycle.requeue(self.state, lease, now, attained, w)
        if self._requeued is not None:
            self._requeued(lease, w, stop, now, attained)
        return w

    def overdue(self, now: float) -> List[str]:
        """The leases told to stop whose deadline has passed, in the order they were asked (the driver stops them
        by force, then calls ``stopped``)."""
        return [wid for wid, s in self.stops.items() if now >= s.deadline]

    # ------------------------------------------------------------------------------------------------ ends
    def ended(self, wid: str, now: float) -> Optional[Lease]:
        """The lease's work is over (done, failed, cancelled, or stopped for good): its resources go back; None when
        it held none."""
        self.stops.pop(wid, None)
        if wid not in self.state.leases:
            return None
        return lifecycle.end(self.state, wid, now)

    def lose_node(self, node_id: str, now: float) -> List[Lease]:
        """A node is gone: the leases on it end now (each returned, for the driver to ``requeue``)."""
        ended = lifecycle.lose_node(self.state, node_id, now)
        for lease in ended:
            self.stops.pop(lease.id, None)
        return ended
