"""A Ray-free stand-in for the control actor's loop and for the gangs' drivers, over ``tests.controltest.Harness``.

``Live`` plays what the actor and the drivers do, on the harness's fake clock:
- the actor: a full tick every ``tick_s``; after any change that asks for one (``wants_cycle``), a cycle alone, at
  most one every ``spacing_s`` (the actor's ``CYCLE_SPACING_S``);
- each admitted gang's driver: it takes the lease over ``handover_s`` after the admission (Ray Train's start:
  ``report running``), runs its work at its size, checkpoints every ``checkpoint_s`` of run and when asked to stop,
  yields ``stop_s`` after a preemption or resize is asked (capped by nothing: the control plane forces a stop at
  the deadline), and releases when its work is done.

Time moves from one instant that matters to the next (an arrival, a tick, a spaced cycle, a hand-over, an end, a
yield), never by polling, so a hundred jobs over hours of trace replay in seconds. A control plane that keeps
asking for cycles with nothing outside it changing (a flip-flop) shows in ``quiet``: the cycles asked for by
changes since anything outside happened (``most_quiet``: the most in a row); ``run`` stops past
``max_cycles_per_change`` (``Churn``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from raylane.control.api import EndState, Outcome
from raylane.control.records import State


EPS = 1e-5  # the fake clock counts POSIX seconds: a float of that size is exact to about 2e-7 s


class Churn(AssertionError):
    """The control plane cycled again and again with nothing outside it changing."""


@dataclass
class Job:
    id: str
    spec: Dict[str, Any]
    submit: float
    work: float  # seconds of work at its submitted size
    size: int
    # filled in as it runs
    wid: Optional[str] = None
    done: float = 0.0
    kept: float = 0.0
    steps: int = 0
    workers: int = 0
    since: Optional[float] = None  # running since (its driver's last look), None: not running
    stop_at: Optional[float] = None  # when it yields to a stop it was asked for
    handover_at: Optional[float] = None
    last_ckpt: float = 0.0
    admissions: int = 0
    first_start: Optional[float] = None
    end: Optional[float] = None
    rejected: Optional[str] = None  # refused at submit: why
    # Seconds of run between its checkpoints (None: the driver's ``checkpoint_s``; 0: none, and none when it yields:
    # a stop loses what it ran since its start).
    checkpoint_s: Optional[float] = None
    story: List[Tuple[float, str]] = field(default_factory=list)


class Live:
    def __init__(self, harness, jobs: List[Job], *, tick_s: float = 1.0, spacing_s: float = 0.02,
                 handover_s: float = 0.0, stop_s: float = 1.0, checkpoint_s: float = 60.0,
                 max_cycles_per_change: int = 50, events=()):
        self.h, self.jobs = harness, sorted(jobs, key=lambda j: (j.submit, j.id))
        self.tick_s, self.spacing_s, self.handover_s, self.stop_s = tick_s, spacing_s, handover_s, stop_s
        self.checkpoint_s, self.max_cycles = checkpoint_s, max_cycles_per_change
        harness.host.jobs = None  # Ray's job table does not answer: the gangs here are this driver's, not Ray jobs
        self.by_wid: Dict[str, Job] = {}
        self.t0 = harness.clock()
        self.cycles: Dict[float, int] = {}  # instant (trace time) -> cycles run then
        self.last_cycle = -math.inf
        self.next_full = 0.0
        self.quiet = 0  # cycles asked for by changes since the last thing outside the control plane happened
        self.most_quiet = 0
        # (trace time, fn(harness)): what happens outside the gangs at a time (a node lost), in time order.
        self.events = sorted(events, key=lambda e: e[0])

    # ------------------------------------------------------------------------------------------------ time
    def now(self) -> float:
        return self.h.clock() - self.t0

    def _advance_to(self, t: float) -> None:
        dt = t - self.now()
        if dt > 0:
            self.h.clock.advance(dt)

    def _next_instant(self, arrivals: List[Job]) -> float:
        cands = [self.next_full]
        if arrivals:
            cands.append(arrivals[0].submit)
        if self.events:
            cands.append(self.events[0][0])
        if self.h.cs.wants_cycle:
            cands.append(max(self.now(), self.last_cycle + self.spacing_s))
        for j in self.by_wid.values():
            if j.end is not None:
                continue
            if j.handover_at is not None:
                cands.append(j.handover_at)
            if j.since is None:
                continue
            rate = j.workers / j.size
            cands.append(j.since + (j.work - j.done) / rate)  # its work done (while it stops, too)
            if j.stop_at is not None:
                cands.append(j.stop_at)
            else:
                every = self._every(j)
                if every:  # its next checkpoint
                    cands.append(j.last_ckpt + every)
        return max(self.now(), min(cands))

    # ------------------------------------------------------------------------------------------------ run
    def run(self, until: float = 1e7) -> None:
        arrivals = list(self.jobs)
        same, last = 0, None
        while (arrivals or any(j.end is None for j in self.by_wid.values())) and self.now() < until:
            t = self._next_instant(arrivals)
            same = same + 1 if t == last else 0
            last = t
            if same > 10 * self.max_cycles:
                raise Churn(f"the driver looked {same} times at t={t:.2f} s and nothing moved")
            self._advance_to(t)
            now = self.now()
            self._progress(now)
            while self.events and self.events[0][0] <= now + EPS:
                self._outside()
                self.events.pop(0)[1](self.h)
            while arrivals and arrivals[0].submit <= now + EPS:
                self._submit(arrivals.pop(0))
            self._drive(now)
            if now >= self.next_full - EPS:
                self._cycle(now, full=True)
                self.next_full = now + self.tick_s
            elif self.h.cs.wants_cycle and now >= self.last_cycle + self.spacing_s - EPS:
                self._cycle(now, full=False)
            self._drive(now)

    def _cycle(self, now: float, full: bool) -> None:
        self.cycles[now] = self.cycles.get(now, 0) + 1
        if not full:  # a cycle a change asked for: one more since anything outside the control plane moved
            self.quiet += 1
            self.most_quiet = max(self.most_quiet, self.quiet)
            if self.quiet > self.max_cycles:
                raise Churn(f"{self.quiet} cycles in a row by t={now:.2f} s with nothing outside changing; "
                            "admitted most: " + ", ".join(f"{j.id} x{j.admissions}" for j in sorted(
                                self.by_wid.values(), key=lambda j: -j.admissions)[:4]))
        self.h.tick(full=full)
        self.last_cycle = now

    def _outside(self) -> None:
        """Something outside the control plane happened (an arrival, a driver's call)."""
        self.quiet = 0

    def _submit(self, job: Job) -> None:
        from raylane.errors import RaylaneError

        self._outside()
        try:
            rec = self.h.call("submit", spec=job.spec)
        except RaylaneError as exc:  # refused at submit (it can never fit): it ends there
            job.end, job.rejected = self.now(), str(exc)
            return
        job.wid = rec["id"]
        self.by_wid[job.wid] = job

    def _progress(self, now: float) -> None:
        for j in self.by_wid.values():
            if j.since is not None and j.end is None:
                j.done = min(j.work, j.done + j.workers / j.size * (now - j.since))
                j.since = now

    def _drive(self, now: float) -> None:
        """Each gang's driver looks at its record now."""
        call = self.h.call
        for j in list(self.by_wid.values()):
            if j.end is not None:
                continue
            rec = self.h.record(j.wid)
            st = rec.state
            if st.terminal:
                j.end = now
                j.since = None
                continue
            if st is State.ADMITTED:
                if j.since is not None:  # requeued and admitted again under it (a lost node)
                    j.since, j.done = None, j.kept
                if j.handover_at is None:
                    j.admissions += 1
                    j.story.append((now, "admitted"))
                    j.handover_at = now + self.handover_s
                if now >= j.handover_at - EPS:
                    self._outside()
                    call("report", workload_id=j.wid, kind="running", job_id=f"raysubmit_{j.wid}")
                    j.handover_at = None
                    j.since = j.last_ckpt = now
                    j.workers = len(rec.placement or ()) or j.size
                    if j.first_start is None:
                        j.first_start = now
                continue
            j.handover_at = None  # not admitted (any more): no hand-over due
            if st is State.PENDING:
                if j.since is not None:  # its lease went (a node lost): back to its last checkpoint
                    j.done, j.since = j.kept, None
                j.handover_at = j.stop_at = None
                continue
            if j.since is None:
                continue
            if st.stopping and j.done < j.work - 1e-6:  # (one whose work is done as it stops ends, below)
                if j.stop_at is None:
                    j.stop_at = now + self.stop_s
                    j.story.append((now, st.value.lower()))
                if now >= j.stop_at - EPS:
                    if self._every(j):
                        self._checkpoint(j, now)
                    else:
                        j.done = j.kept  # nothing saved: it starts again from what it had
                    j.since = j.stop_at = None
                    self._outside()
                    call("release", workload_id=j.wid, outcome=Outcome.YIELDED.value, state=EndState.SUCCEEDED.value,
                         step=j.steps)
                continue
            if j.done >= j.work - 1e-6:
                j.since = None
                self._outside()
                call("release", workload_id=j.wid, outcome=Outcome.FINISHED.value, state=EndState.SUCCEEDED.value,
                     step=j.steps)
                j.end = now
                continue
            every = self._every(j)
            if every and now - j.last_ckpt >= every - EPS:
                self._checkpoint(j, now)

    def _every(self, j: Job) -> float:
        return self.checkpoint_s if j.checkpoint_s is None else j.checkpoint_s

    def _checkpoint(self, j: Job, now: float) -> None:
        j.steps += 1
        j.kept = j.done
        j.last_ckpt = now
        self.h.call("checkpoint_saved", workload_id=j.wid, path=f"/nonexistent/{j.wid}/checkpoint_{j.steps:06d}",
                    metrics={"step": j.steps})
