"""A tiny driver of ``ClusterState`` + ``cycle`` with a fake clock, for multi-cycle tests.

Admitted workloads run for their duration; victims of a preemption stop ``grace`` seconds after they are told, lose
all work since they started (the worst case: no checkpoint), and go back to their queue. Resizes of elastic gangs
are carried out as the control actor does: growth at once, a shrink ``grace`` seconds later (the gang is kept whole,
terminating, until then); a gang's duration is not changed by its size here. Workloads arrive at their
submit time. ``run`` returns when nothing waits and nothing runs, and fails on a deadlock or after ``max_cycles``.
A cycle's result is carried out by ``raylane.scheduling.apply.Applier``, as in the control plane, the simulator and
the forecast; this driver times the stops.
"""
from __future__ import annotations

from typing import Callable, Dict, Iterable, List, Optional

from raylane.scheduling import ClusterState, CycleResult, Snapshot, Workload, cycle
from raylane.scheduling.apply import Applier


class Stuck(AssertionError):
    pass


class Driver:
    def __init__(self, state: ClusterState, workloads: Iterable[Workload], durations: Dict[str, float],
                 grace: float = 5.0, check: Optional[Callable[[Snapshot, CycleResult, float], None]] = None):
        self.state = state
        self.arrivals: List[Workload] = sorted(workloads, key=lambda w: (w.submit_time, w.id))
        self.durations = durations
        self.grace = grace
        self.check = check
        self.now = 0.0
        self.ends: Dict[str, float] = {}
        self.stops: Dict[str, float] = {}  # workload id -> when its gang stops (a preemption or a shrink)
        self.apply = Applier(state, self)
        self.resizes = self.shrunk = 0
        self.cycles = 0
        self.admissions = 0
        self.preemptions = 0
        self.finished: List[str] = []

    def _arrive(self) -> None:
        while self.arrivals and self.arrivals[0].submit_time <= self.now:
            self.state.enqueue(self.arrivals.pop(0))

    def step(self) -> CycleResult:
        self._arrive()
        snap = self.state.snapshot()
        res = cycle(snap, self.now)
        self.cycles += 1
        if self.check is not None:
            self.check(snap, res, self.now)
        self.apply.apply(res, self.now)
        return res

    # the Applier's hooks
    def admitted(self, a, lease, now: float) -> None:
        self.ends[a.workload.id] = now + self.durations[a.workload.id]
        self.admissions += 1

    def resizing(self, rz, grown, stop, now: float) -> None:
        self.resizes += 1
        if grown is None:  # a shrink: it stops first
            self.shrunk += 1
            self.stops[rz.workload.id] = now + self.grace

    def stopping(self, stop, lease, now: float) -> bool:
        self.ends.pop(stop.workload_id, None)
        self.stops[stop.workload_id] = now + self.grace
        self.preemptions += 1
        return False

    def advance(self) -> bool:
        """Move the clock to the next event and apply it; False when there is none."""
        times = list(self.ends.values()) + list(self.stops.values())
        if self.arrivals:
            times.append(self.arrivals[0].submit_time)
        if not times:
            return False
        self.now = max(self.now, min(times))
        for wid, t in sorted(self.ends.items(), key=lambda kv: (kv[1], kv[0])):
            if t <= self.now:
                del self.ends[wid]
                self.apply.ended(wid, self.now)
                self.finished.append(wid)
        for wid, t in sorted(self.stops.items(), key=lambda kv: (kv[1], kv[0])):
            if t <= self.now:
                del self.stops[wid]
                self.apply.stopped(wid, self.now)  # a shrink goes on at its size; a victim goes back to its queue
        return True

    def done(self) -> bool:
        return not self.arrivals and self.state.pending_count() == 0 and not self.state.leases

    def run(self, max_cycles: int = 2000) -> "Driver":
        while not self.done():
            if self.cycles >= max_cycles:
                raise Stuck(f"not done after {max_cycles} cycles at t={self.now:g}: {self.state.pending_count()} "
                            f"pending, {len(self.state.leases)} running, {self.preemptions} preemptions")
            res = self.step()
            if not self.advance():
                if self.done():
                    break
                raise Stuck(f"deadlock at t={self.now:g}: nothing runs and nothing arrives; pending reasons: "
                            + "; ".join(f"{p.workload.id}: {p.reason}" for p in res.pending))
        return self
