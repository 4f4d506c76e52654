"""A tiny driver of ``ClusterState`` + ``cycle`` with a fake clock, for multi-cycle tests.

Admitted workloads run for their duration; victims of a preemption stop ``grace`` seconds after they are told, lose
all work since they started (the worst case: no checkpoint), and go back to their queue. Resizes of elastic gangs
are carried out as the control actor does: growth at once, a shrink ``grace`` seconds later (the gang is kept whole,
terminating, until then); a gang's duration is not changed by its size here. Workloads arrive at their
submit time. ``run`` returns when nothing waits and nothing runs, and fails on a deadlock or after ``max_cycles``.
Every change to the state goes through ``raylane.scheduling.lifecycle``, as in the control plane and the simulator.
"""
from __future__ import annotations

from typing import Callable, Dict, Iterable, List, Optional

from raylane.scheduling import ClusterState, CycleResult, Snapshot, Workload, cycle, lifecycle


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
        self.stops: Dict[str, float] = {}
        self.shrinks: Dict[str, tuple] = {}  # workload id -> (when, the Resize)
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
        for a in res.admitted:
            lifecycle.admit(self.state, a, self.now)
            self.ends[a.workload.id] = self.now + self.durations[a.workload.id]
            self.admissions += 1
        for rz in res.resized:
            self.resizes += 1
            if lifecycle.begin_resize(self.state, rz, self.now) is None:  # a shrink: it stops first
                self.shrunk += 1
                self.shrinks[rz.workload.id] = (self.now + self.grace, rz)
        for p in res.preempted:
            for v in p.victims:
                lifecycle.begin_stop(self.state, v)
                self.ends.pop(v, None)
                self.stops[v] = self.now + self.grace
                self.preemptions += 1
        return res

    def advance(self) -> bool:
        """Move the clock to the next event and apply it; False when there is none."""
        times = list(self.ends.values()) + list(self.stops.values()) + [t for t, _ in self.shrinks.values()]
        if self.arrivals:
            times.append(self.arrivals[0].submit_time)
        if not times:
            return False
        self.now = max(self.now, min(times))
        for wid, t in sorted(self.ends.items(), key=lambda kv: (kv[1], kv[0])):
            if t <= self.now:
                del self.ends[wid]
                lifecycle.end(self.state, wid, self.now)
                self.finished.append(wid)
        for wid, (t, rz) in sorted(self.shrinks.items(), key=lambda kv: (kv[1][0], kv[0])):
            if t <= self.now:
                del self.shrinks[wid]
                lifecycle.finish_shrink(self.state, rz, self.now)  # nothing if it ended meanwhile
        for wid, t in sorted(self.stops.items(), key=lambda kv: (kv[1], kv[0])):
            if t <= self.now:
                del self.stops[wid]
                lifecycle.end_and_requeue(self.state, wid, self.now)
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
