"""Queue ETA: when each pending workload is expected to start (and finish), and what it waits for until then.

This module owns the forecast. ``forecast(state, now)`` copies a ``ClusterState`` (``ClusterState.copy``) and drives
the same ``cycle`` the control plane runs over the copy in simulated time, carrying out its decisions through
``raylane.scheduling.apply`` as every driver does: leases end at their expected ends, and at
each of those instants the queue is decided in its order under the same quotas, placement, backfill and preemption
policies; nodes keep their schedulability (a cordoned or draining node stays out of service throughout). The state
it is given is never changed. ``describe(eta, now)`` says in one line what a workload waits for, for
``raylane explain``. ``forecast(..., method="plan")`` hands the same question to ``raylane.forecast.plan``: a
reservation plan (conservative backfill, as ``squeue --start``), much faster, with no preemption planned; the
answer's types, and the runtime rules both share, are in ``raylane.forecast.types``.

Pure, like ``raylane.scheduling``: no Ray, no clock (``now`` is an argument), no randomness; it imports only the
scheduling core and the standard library.

Words
- *expected end* of a lease: its start plus what is left of its runtime estimate (the estimate less the service it
  had in earlier attempts, ``attained_gpu_s`` over its GPUs); without an estimate, plus its class's runtime
  (``class_runtime_s``) or else ``default_runtime_s``. A lease already past that end has not ended: it is expected
  to run on for ``overrun`` of the time it has run (at least ``min_overrun_s``). A terminating lease is gone at
  ``stopping_ends[id]`` when the caller knows its deadline, else a grace period of its class after ``now``; its
  workload then goes back to its queue, as the control plane requeues it.
- *step*: one simulated instant: the leases due then end, then cycles run until one admits nothing more (as the
  simulator does at an instant). By default every distinct end time is a step, and a cycle costs what the live
  plane's does, so a forecast costs about one cycle per workload it sees start. ``resolution`` > 0 takes the ends
  within that share of the time from ``now`` (and within ``min_step_s``) as one step, at the last of them (each
  admission then starts when the end that freed its room came): about three times fewer cycles at 2%, but where
  many small gangs share GPUs the freed room is then handed out differently and ETAs drift (``docs/eta.md``).
- *blocked shape*: at a step, a team's pending gangs of one size (GPUs in all and per worker) that cannot start
  whatever the cycle decides: the team's quota cannot hold them (and no reclaim can free quota for them: the team
  is at or over its nominal quota, or nothing may preempt), or, when nothing may preempt, the free GPUs of nodes in
  service cannot hold them. Within a cycle quota only fills and capacity only empties, so the cycle would admit
  none of them: they are left out of the snapshot it reads (but a team's first one blocked for room, which may be
  the head EASY backfill reserves for), and a step where every shape is blocked runs no cycle. Of the rest, a team
  queue is cut after as many gangs as its quota and the free GPUs could take at once, plus ``lookahead`` for work
  that backfill holds back.
- *horizon*: how far the forecast looks (``horizon_s``). A workload that has not started by then, or that nothing
  can ever let in (no lease end is left to come and it still waits), gets ``start`` None and a note why.
- *wait*: one phase of what a workload waits for (``CapacityWait``, ``QuotaWait``, ``QueueWait``,
  ``PreemptionWait``), read from the reasons the cycle gives it (or its blocked shape) step by step; consecutive
  steps of one kind are one phase (and so are two spells of one wait around a step where only its turn was
  missing: others of its team took the quota first), which ends ``at`` an instant, usually when leases end
  (``ended``: those on the nodes it then gets, or its team's).

For the control plane: ``forecast(cs.state, now, stopping_ends={r.id: r.stop_deadline for r in cs.records.values()
if r.stop_deadline is not None})``: the live ``ClusterState`` already holds the node book's cordons and drains
(unschedulable nodes), and the records know when each stopping lease's grace period runs out.

Not modelled unless asked: arrivals after ``now`` (an ETA moves later when more urgent work arrives, earlier when
leases end before their estimates; ``arrivals=`` plays expected ones, ``expected_arrivals``, which docs/eta.md
measured and the control plane does not use); decisions that time alone brings between two lease ends (a lease passing its minimum
runtime or hysteresis is seen at the next step); the speed of a resized elastic gang (it keeps its expected end).
"""
from __future__ import annotations

import bisect
import heapq
import math
import time
from dataclasses import replace
from typing import Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from raylane.forecast.plan import plan
from raylane.forecast.types import (
    DEFAULT_HORIZON_S,
    CapacityWait,
    Eta,
    PreemptionWait,
    QueueWait,
    QuotaWait,
    Wait,
    expected_end,
    knows_runtime,
)
from raylane.forecast.types import remaining_runtime as _runtime
from raylane.scheduling import ADMISSIONS, ClusterState, LeaseState, QuotaLedger, cycle
from raylane.scheduling.apply import SETTLE, Applier
from raylane.scheduling.cycle import MAX_EXAMINED
from raylane.scheduling.types import (
    Admit,
    BehindHead,
    BlockedByReservation,
    CycleResult,
    Displaced,
    Lease,
    NoCapacity,
    QuotaExceeded,
    Reserved,
    Resources,
    WaitingForPreemption,
    Workload,
)

__all__ = ["Eta", "CapacityWait", "QuotaWait", "QueueWait", "PreemptionWait", "Wait", "forecast", "describe",
           "expected_end", "expected_arrivals", "forecast_interval", "DEFAULT_HORIZON_S", "MAX_WAITS", "METHODS"]

# How a forecast may be computed (``forecast``'s ``method``): the live cycle replayed step by step, or a reservation
# plan (``raylane.forecast.plan``).
METHODS = ("replay", "plan")

# At most this many phases in ``Eta.waits_for``: the first ones and the last (what finally lets it in).
MAX_WAITS = 4
# How many lease ends a phase names as the ones that closed it.
_NAMED = 2
_EPS = 1e-9


# -------------------------------------------------------------------------------------------------- forecast


def forecast(
    state: ClusterState,
    now: float,
    *,
    default_runtime_s: Optional[float] = None,
    class_runtime_s: Mapping[str, float] = {},
    stopping_ends: Mapping[str, float] = {},
    only: Optional[Iterable[str]] = None,
    horizon_s: float = DEFAULT_HORIZON_S,
    resolution: float = 0.0,
    min_step_s: float = 0.0,
    overrun: float = 0.25,
    min_overrun_s: float = 300.0,
    max_examined: int = MAX_EXAMINED,
    lookahead: int = 16,
    method: str = "replay",
    quantile: float = 0.5,
    arrivals: Sequence[Workload] = (),
) -> Dict[str, Eta]:
    """The ETA of every pending workload of ``state`` (of those in ``only``, when given), seen at ``now``.

    ``method``: one of ``METHODS``: "replay" (this module: the live cycle driven forward, one cycle per step) or
    "plan" (``raylane.forecast.plan``: a reservation plan, as Slurm's ``squeue --start``; some hundred times
    faster, no preemption planned; ``docs/eta.md`` compares them). ``resolution``, ``min_step_s``,
    ``max_examined`` and ``lookahead`` are the replay's own and are not read by the plan.

    ``default_runtime_s``: the runtime assumed for a lease with no estimate and no ``class_runtime_s`` entry for its
    class (None: the scheduler config's ``default_runtime_s``). ``stopping_ends``: workload id -> when a terminating
    lease is gone (its grace deadline; the control plane's ``Record.stop_deadline``); others are gone a class grace
    period after ``now``. ``max_examined``: the cycle depth of the live plane. ``overrun``, ``min_overrun_s``: how
    long a lease past its expected end is taken to run on. ``horizon_s``, ``resolution``, ``min_step_s`` and
    ``lookahead`` trade precision for speed (module docstring). ``quantile``: which quantile of each learned
    prediction (``Workload.predicted``) work runs for (0.5, the median; ``forecast_interval`` runs 0.1 and 0.9 too);
    the cycles decide as the live plane does whatever it is. ``arrivals``: work expected to come after ``now``
    (``expected_arrivals``), queued at its submit time as the replay reaches it (method replay only; the plan
    ignores it). ``state`` is not changed.
    """
    errors = []
    if not math.isfinite(now):
        errors.append(f"now={now!r} (allowed: a finite time)")
    if not horizon_s > 0:
        errors.append(f"horizon_s={horizon_s!r} (allowed: > 0)")
    if not 0 <= resolution < 1:
        errors.append(f"resolution={resolution!r} (allowed: >= 0 and < 1)")
    if not min_step_s >= 0:
        errors.append(f"min_step_s={min_step_s!r} (allowed: >= 0)")
    if not (overrun >= 0 and min_overrun_s >= 0):
        errors.append(f"overrun={overrun!r}, min_overrun_s={min_overrun_s!r} (allowed: >= 0)")
    if not (max_examined >= 1 and lookahead >= 0):
        errors.append(f"max_examined={max_examined!r}, lookahead={lookahead!r} (allowed: >= 1 and >= 0)")
    if not 0 < quantile < 1:
        errors.append(f"quantile={quantile!r} (allowed: > 0 and < 1)")
    if method not in METHODS:
        errors.append(f"method={method!r} (allowed: {', '.join(repr(m) for m in METHODS)})")
    if errors:
        raise ValueError("forecast: " + "; ".join(errors))
    if method == "plan":
        return plan(state, now, default_runtime_s=default_runtime_s, class_runtime_s=class_runtime_s,
                    stopping_ends=stopping_ends, only=only, horizon_s=horizon_s, overrun=overrun,
                    min_overrun_s=min_overrun_s, quantile=quantile)
    default = default_runtime_s if default_runtime_s is not None else state.config.default_runtime_s
    run = _Run(state, now, default, class_runtime_s, stopping_ends, only, overrun, min_overrun_s, max_examined,
               lookahead, quantile, arrivals)
    return run.go(horizon_s, resolution, min_step_s)


def expected_arrivals(history: Sequence[Workload], now: float, window_s: float) -> List[Workload]:
    """The work expected to arrive in the next ``window_s`` seconds: what arrived in the last ``window_s`` (of
    ``history``: workloads with their submit times), again, ``window_s`` later (a persistence forecast of the
    arrival process: the same rate, the same shapes, classes, teams and learned runtimes). Ids are prefixed
    ``~expected-``; each has no attained service."""
    if not window_s > 0:
        raise ValueError(f"expected_arrivals: window_s={window_s!r} (allowed: > 0)")
    out = []
    for w in history:
        if now - window_s <= w.submit_time < now:
            out.append(replace(w, id=f"~expected-{w.id}", submit_time=w.submit_time + window_s, attained_gpu_s=0.0))
    return out


def forecast_interval(state: ClusterState, now: float, *, low: float = 0.1, high: float = 0.9,
                      **kw) -> Dict[str, Eta]:
    """``forecast``'s ETAs, each with an interval where runtimes are learned (``Workload.predicted``): its start
    when every workload runs for the ``low`` quantile of its predicted runtime, and when every one runs for the
    ``high`` one (``Eta.start_low``, ``start_high``), each decided by the same cycle as the median's; and what its
    own runtime rests on (``Eta.basis``). Moving every runtime to one quantile together is wider than the start's
    own quantiles would be (sums of independent runtimes spread less): an interval that errs towards covering.
    Without any learned runtime, ``forecast``'s answer as it is. ``kw``: as ``forecast``'s."""
    if not 0 < low < 0.5 < high < 1:
        raise ValueError(f"forecast_interval: low={low!r}, high={high!r} (allowed: 0 < low < 0.5 < high < 1)")
    mid = forecast(state, now, **kw)
    pending = {w.id: w for w in state.pending()}
    if not (any(w.predicted is not None for w in pending.values())
            or any(l.workload.predicted is not None for l in state.leases.values())):
        return mid
    early = forecast(state, now, quantile=low, **kw)
    late = forecast(state, now, quantile=high, **kw)
    out: Dict[str, Eta] = {}
    for wid, e in mid.items():
        a, b = early.get(wid), late.get(wid)
        lo = a.start if a is not None else None
        hi = b.start if b is not None else None
        if e.start is not None:
            lo = e.start if lo is None else min(lo, e.start)
            hi = None if (b is not None and b.start is None) else max(hi if hi is not None else e.start, e.start)
        w = pending.get(wid)
        basis = w.predicted.describe(w.ran_s) if w is not None and w.predicted is not None else (
            "its declared runtime estimate" if w is not None and w.runtime_estimate_s is not None else "")
        out[wid] = replace(e, start_low=lo, start_high=hi, basis=basis)
    return out


_END, _STOP, _ARRIVE = 0, 1, 2
# A shape that is not blocked: its work is decided by the cycle.
_OPEN = ("open",)
# The kind of a ``QueueWait``.
_TURN = ("turn",)
_UNREAD = object()


class _Run:
    """One forecast: the copied state and its clock, the lease ends still to come, and what each target waited for."""

    def __init__(self, state: ClusterState, now: float, default_runtime_s: float, class_runtime_s, stopping_ends,
                 only, overrun: float, min_overrun_s: float, max_examined: int, lookahead: int, q: float = 0.5,
                 arrivals: Sequence[Workload] = ()):
        self.now = now
        self.q = q
        self.lookahead = lookahead
        self.room: Dict[str, float] = {}
        self.default_runtime_s, self.class_runtime_s = default_runtime_s, class_runtime_s
        self.max_examined = max_examined
        self.st = st = state.copy()
        cfg = st.config
        self.admission = ADMISSIONS.get(cfg.admission)
        self.can_preempt = cfg.preemption != "none"
        # Carries out each cycle's result (raylane.scheduling.apply), with the hooks below.
        self.apply = Applier(st, self, rule=SETTLE, max_examined=max_examined)
        pending = st.pending()
        wanted = None if only is None else set(only)
        self.targets: Dict[str, Workload] = {w.id: w for w in pending if wanted is None or w.id in wanted}
        self.start: Dict[str, float] = {}
        self.placed: Dict[str, Lease] = {}
        # Per team, the pending gangs by (GPUs in all, GPUs per worker) -> how many: which shapes are blocked.
        self.shapes: Dict[str, Dict[Tuple[float, float], int]] = {}
        for w in pending:
            self._queued(w, 1)
        # (time, kind, sequence, workload id, attempt): an event of an attempt stopped since is stale.
        self.events: List[Tuple[float, int, int, str, int]] = []
        self.attempt: Dict[str, int] = {}
        self.seq = 0
        for lease in st.leases.values():
            if lease.state is LeaseState.TERMINATING:
                at = stopping_ends.get(lease.id, now + lease.workload.cls.grace_period_s)
                self._push(max(at, now), _STOP, lease.id)
            else:
                self._push(expected_end(lease, now, default_runtime_s=default_runtime_s,
                                        class_runtime_s=class_runtime_s, overrun=overrun,
                                        min_overrun_s=min_overrun_s, q=q), _END, lease.id)
        # Work expected to come (``arrivals``): queued as the replay reaches its submit time; never a target.
        self.coming: Dict[str, Workload] = {}
        for w in arrivals:
            if w.submit_time > now and w.id not in self.targets and w.id not in st.leases:
                self.coming[w.id] = w
                self._push(w.submit_time, _ARRIVE, w.id)
        # What happened, for ``waits_for``: when each shape was blocked or open, each target's own reasons when they
        # change, and which leases ended when on each node and of each team.
        self.shape_log: Dict[Tuple, List[Tuple[float, Tuple, Optional["Wait"]]]] = {}
        self.own_log: Dict[str, List[Tuple[float, Tuple, "Wait"]]] = {}
        self.ended_on: Dict[str, _Ends] = {}
        self.ended_of: Dict[str, _Ends] = {}
        self.ends = _Ends()
        self.step_ended: List[Tuple[float, Lease]] = []  # (when, lease) of the leases the current step ended

    # -- the loop --------------------------------------------------------------------------------------------
    def go(self, horizon_s: float, resolution: float, min_step_s: float) -> Dict[str, Eta]:
        t = self.now
        last = self.now + horizon_s
        while True:
            self._settle(t)
            if len(self.start) == len(self.targets) or not self.events:
                break
            t_next = self.events[0][0]
            if t_next > last:
                break
            # (never back in time: with ``resolution``, a step may hold only ends earlier than the last step's)
            t = max(t, self._end_until(min(t_next + max(min_step_s, resolution * (t_next - self.now)), last)))
        st = self.st
        return self._etas(t, any(self.attempt.get(wid) == a and wid in st.leases for _, _, _, wid, a in self.events))

    def _end_until(self, cut: float) -> float:
        """End every lease due by ``cut``; the step's time is the last of those ends."""
        events, st = self.events, self.st
        t, ended = events[0][0], []
        while events and events[0][0] <= cut:
            at, kind, _, wid, attempt = heapq.heappop(events)
            if kind == _ARRIVE:
                w = self.coming.pop(wid)
                st.enqueue(w)
                self._queued(w, 1)
                t = max(t, at)
                continue
            if self.attempt.get(wid) != attempt or wid not in st.leases:
                continue
            t = max(t, at)
            # a stop's lease goes back to its queue (requeued), an end's is over
            lease = self.apply.stopped(wid, at) if kind == _STOP else self.apply.ended(wid, at)
            ended.append((at, lease))
        for at, lease in ended:
            for nid in set(lease.placement):
                got = self.ended_on.get(nid)
                if got is None:
                    got = self.ended_on[nid] = _Ends()
                got.add(at, lease)
            got = self.ended_of.get(lease.team)
            if got is None:
                got = self.ended_of[lease.team] = _Ends()
            got.add(at, lease)
            self.ends.add(at, lease)
        self.step_ended = ended
        return t

    def _began(self, a: Admit, t: float) -> float:
        """When an admission of the step at ``t`` is taken to start: when the last lease of the step that freed its
        room ended (one on its nodes, else one of its team's), else when the step's first lease ended. A step takes
        the ends of a window at once; without this, each generation of short leases would start up to a window late
        and the lateness would add up over a long wait."""
        ended = self.step_ended
        if not ended:
            return t
        on = set(a.placement)
        got = [at for at, l in ended if on.intersection(l.placement)]
        if not got:
            team = a.workload.team
            got = [at for at, l in ended if l.team == team]
        return max(got) if got else ended[0][0]

    def _settle(self, t: float) -> None:
        """Cycles at ``t`` until one admits nothing more (or none is needed); then note what each target waits for."""
        blocked = self._blocked()
        for key, why in blocked.items():
            self._log_shape(key, t, why)
        for key in self.shape_log:
            if key not in blocked and self.shapes.get(key[0], {}).get(key[1:], 0) > 0:
                self._log_shape(key, t, None)
        if all((team,) + shape in blocked for team, shapes in self.shapes.items() for shape, c in shapes.items()
               if c > 0):
            return  # nothing waiting could start now: no cycle needed
        st = self.st
        result: Optional[CycleResult] = None
        for _ in range(1000):  # a guard: cycles that never settle at one instant would be a policy's bug
            snap = st.snapshot(limit=self.max_examined)
            snap = replace(snap, queues=_open_queues(snap.queues, blocked, self.room, self.lookahead))
            result = cycle(snap, t, max_examined=self.max_examined)
            if not self.apply.apply(result, t):
                break
            if result.admitted:
                blocked = self._blocked()  # quota and room filled: fewer shapes may start, fewer to look at
        if result is not None:
            targets, start = self.targets, self.start
            # A cycle hands one reason object to every workload of a shape it told the same (its caches): read each
            # once. (The result holds the reasons, so their ids are not reused meanwhile.)
            waits: Dict[int, Optional[Tuple[Tuple, Wait]]] = {}
            for p in result.pending:
                w = p.workload
                if w.id in targets and w.id not in start and _shape(w) not in blocked:
                    r = p.reason
                    got = waits.get(id(r), _UNREAD)
                    if got is _UNREAD:
                        got = waits[id(r)] = _wait_of(r)
                    if got is not None:
                        self._log_own(w.id, got, t)

    # The Applier's hooks (``self.apply``, raylane.scheduling.apply): what the forecast's copy does around each step.
    resizes_at_once = True  # as the simulator does

    def starts_at(self, a: Admit, t: float) -> float:
        return self._began(a, t)

    def admitted(self, a: Admit, lease: Lease, t: float) -> None:
        w = lease.workload
        began = lease.start_time
        self._queued(a.workload, -1)
        self._push(began + _runtime(w, self.default_runtime_s, self.class_runtime_s, self.q), _END, w.id)
        if w.id in self.targets and w.id not in self.start:
            self.start[w.id] = began
            self.placed[w.id] = lease

    def resize_refused(self, rz, why, t: float) -> None:
        pass  # a resize the state refuses is decided again at the next step

    def stopping(self, stop, lease: Lease, t: float) -> bool:
        """A victim stops a grace period after it is told (an event), or at once without one."""
        grace = lease.workload.cls.grace_period_s
        if grace > 0:
            self._push(t + grace, _STOP, stop.workload_id)
            return False
        self.attempt[lease.id] = self.attempt.get(lease.id, 0) + 1  # its end event no longer holds
        return True

    def requeued(self, lease: Lease, w: Workload, stop, t: float, attained: float) -> None:
        self._queued(w, 1)

    def _blocked(self) -> Dict[Tuple, Tuple[Tuple, "Wait"]]:
        """The pending shapes (team, GPUs in all, GPUs per worker) that cannot start now whatever the cycle decides,
        each with what they wait for: their team's quota cannot hold them (and no reclaim can free quota for them:
        the team is over its nominal quota, or nothing may preempt), or, when nothing may preempt, the GPUs free on
        nodes in service cannot hold them. Within a cycle quota only fills and capacity only empties, so the cycle
        would admit none of them; it need not look at them.

        Also sets, per team, how many of its gangs could start at this instant at most (``room``: its quota and the
        free GPUs fill)."""
        st = self.st
        free, widest = 0.0, 0.0
        for n in st.nodes.values():
            if n.schedulable:
                g = n.free.gpu
                free += g
                if g > widest:
                    widest = g
        ledger = QuotaLedger(st.teams, st.usage) if self.admission.protects_in_quota else None
        check, can_preempt = self.admission.check, self.can_preempt
        out: Dict[Tuple, Tuple[Tuple, Wait]] = {}
        self.room = {}
        pooled = free  # the GPUs all teams' quotas together let them add: unused guaranteed parts and the pool
        if ledger is not None:
            pooled = ledger.pool_cap["gpu"] - ledger.pool_used["gpu"]
            for team, lim in ledger.limits.items():
                for r, _, guaranteed, _ in lim:
                    if r == "gpu":
                        pooled += max(0.0, guaranteed - ledger.used(team).gpu)
        for team, shapes in self.shapes.items():
            room, smallest = free, math.inf
            if ledger is not None and any(r == "gpu" for r, _, _, _ in ledger.limits.get(team, ())):
                room = min(room, ledger.headroom(team, "gpu"), pooled)
            for (gpus, per), c in shapes.items():
                if c <= 0:
                    continue
                if ledger is not None:
                    need = Resources(gpu=gpus)
                    why = check(ledger, team, need)
                    if why is not None and not (can_preempt and ledger.within_nominal(team, need)):
                        left = max(0.0, why.nominal + why.borrowable - why.used)
                        out[(team, gpus, per)] = (("quota", why.team, why.resource),
                                                  QuotaWait(why.team, why.resource, max(0.0, why.needed - left), 0.0))
                        continue
                if not can_preempt and (gpus > free + _EPS or per > widest + _EPS):
                    out[(team, gpus, per)] = (("room",), CapacityWait(gpus, 0.0))
                    continue
                smallest = min(smallest, gpus)
            self.room[team] = math.inf if smallest <= _EPS else int(room / smallest + _EPS)
        return out

    # -- bookkeeping -----------------------------------------------------------------------------------------
    def _push(self, at: float, kind: int, wid: str) -> None:
        attempt = self.attempt[wid] = self.attempt.get(wid, 0) + 1
        self.seq += 1
        heapq.heappush(self.events, (at, kind, self.seq, wid, attempt))

    def _queued(self, w: Workload, k: int) -> None:
        shapes = self.shapes.setdefault(w.team, {})
        key = (w.gang.total.gpu, w.gang.per_worker.gpu)
        shapes[key] = shapes.get(key, 0) + k

    def _log_shape(self, key: Tuple, t: float, why: Optional[Tuple[Tuple, "Wait"]]) -> None:
        log = self.shape_log.setdefault(key, [])
        kind = why[0] if why is not None else _OPEN
        if not log or log[-1][1] != kind:
            log.append((t, kind, why[1] if why is not None else None))

    def _log_own(self, wid: str, got: Tuple[Tuple, Wait], t: float) -> None:
        log = self.own_log.setdefault(wid, [])
        if not log or log[-1][1] != got[0]:
            log.append((t, got[0], got[1]))

    # -- the answer ------------------------------------------------------------------------------------------
    def _etas(self, t: float, more: bool) -> Dict[str, Eta]:
        out: Dict[str, Eta] = {}
        note = ("does not start within the forecast's horizon" if more else
                "nothing in the forecast lets it in: no lease is left to end and it still waits (nodes out of "
                "service, or a quota that cannot hold it)")
        for wid, w in self.targets.items():
            start = self.start.get(wid)
            waits = self._waits(w, start)
            if start is None:
                out[wid] = Eta(wid, None, None, waits, note)
            else:
                finish = start + _runtime(w, 0.0, {}, self.q) if knows_runtime(w) else None
                out[wid] = Eta(wid, start, finish, waits)
        return out

    def _waits(self, w: Workload, start: Optional[float]) -> Tuple[Wait, ...]:
        """The phases of what ``w`` waited for from ``now`` to its start: its shape's blocked spells, and within its
        open spells the reasons the cycles gave it; consecutive phases of one kind are one."""
        end = start if start is not None else math.inf
        if start is not None and start <= self.now:
            return ()
        own = self.own_log.get(w.id, ())
        spans: List[Tuple[float, Tuple, Optional[Wait]]] = []  # (from, kind, wait)
        shape = self.shape_log.get(_shape(w), [(self.now, _OPEN, None)])
        j, last = 0, None  # the next of its own reasons, and the last one before it
        for i, (t0, key, wait) in enumerate(shape):
            if t0 >= end:
                break
            while j < len(own) and own[j][0] < t0:
                last, j = own[j], j + 1
            if key != _OPEN:
                spans.append((t0, key, wait))
                continue
            if j >= len(own) or own[j][0] > t0:
                # Open, but the cycle said nothing new at the spell's start: what it said last, else its turn.
                spans.append((t0, last[1], last[2]) if last is not None else (t0, _TURN, QueueWait(None, 0.0)))
            t1 = shape[i + 1][0] if i + 1 < len(shape) else end
            while j < len(own) and own[j][0] < t1:
                last, j = own[j], j + 1
                spans.append(last)
        phases: List[Tuple[float, Tuple, Wait]] = []
        for t0, key, wait in spans:
            if phases and phases[-1][1] == key:
                continue
            if len(phases) >= 2 and phases[-1][1] == _TURN and phases[-2][1] == key:
                # Its turn came between two spells of one wait (others of its team took the quota first): one wait.
                phases.pop()
                continue
            phases.append((t0, key, wait))
        out: List[Wait] = []
        for i, (t0, key, wait) in enumerate(phases):
            t1 = phases[i + 1][0] if i + 1 < len(phases) else end
            out.append(_ended(wait, t1, self._named(w, wait, t0, t1, start)))
        if len(out) > MAX_WAITS:
            out = out[:MAX_WAITS - 1] + out[-1:]
        return tuple(out)

    def _named(self, w: Workload, wait: Wait, t0: float, t1: float, start: Optional[float]) -> Tuple[str, ...]:
        """The lease ends that let phase ``wait`` (``t0`` to ``t1``) end, the latest last: for room, those in the
        phase on the nodes it got (when the phase ends with its start); for quota, its team's; else any. At most
        ``_NAMED``; of ends at one instant, the largest gangs."""
        if not math.isfinite(t1):
            return ()
        if isinstance(wait, PreemptionWait):
            return tuple(wait.victims[:_NAMED])
        got: List[Tuple[float, Lease]] = []
        if isinstance(wait, CapacityWait) and t1 == start and w.id in self.placed:
            for nid in set(self.placed[w.id].placement):
                got += _between(self.ended_on.get(nid), t0, t1)
            got = list({l.id: (at, l) for at, l in got}.values())
        elif isinstance(wait, QuotaWait):
            got = _between(self.ended_of.get(wait.team), t0, t1)
        if not got:
            got = _between(self.ends, t0, t1)
        got.sort(key=lambda e: (e[0], e[1].workload.gang.total.gpu))
        return tuple(l.id for _, l in got[-_NAMED:])


def _between(log: Optional["_Ends"], t0: float, t1: float) -> List[Tuple[float, Lease]]:
    """The last few lease ends of ``log`` after ``t0`` and by ``t1``."""
    if log is None:
        return []
    i = bisect.bisect_right(log.times, t1)
    return [(at, l) for at, l in zip(log.times[max(0, i - 4 * _NAMED):i], log.leases[max(0, i - 4 * _NAMED):i])
            if at > t0]


class _Ends:
    """Lease ends in the order they happened (times nearly sorted: a step ends leases in time order)."""

    __slots__ = ("times", "leases")

    def __init__(self):
        self.times: List[float] = []
        self.leases: List[Lease] = []

    def add(self, at: float, lease: Lease) -> None:
        self.times.append(at)
        self.leases.append(lease)


def _shape(w: Workload) -> Tuple[str, float, float]:
    return w.team, w.gang.total.gpu, w.gang.per_worker.gpu


def _open_queues(queues: Mapping[str, Tuple[Workload, ...]], blocked: Mapping[Tuple, Tuple],
                 room: Mapping[str, float], lookahead: int) -> Dict[str, Tuple[Workload, ...]]:
    """What the cycle looks at: each team queue, in its order, less the blocked shapes' work and cut after the
    first ``room[team] + lookahead`` workloads that may start (more than that many cannot start at one instant
    unless the first ones are held back by backfill: ``lookahead`` covers those); of work blocked for room, only
    the first of each team stays, the head EASY backfill may reserve for."""
    out = {}
    for team, q in queues.items():
        keep: List[Workload] = []
        left = room.get(team, math.inf) + lookahead
        head = False
        for w in q:
            why = blocked.get((team, w.gang.total.gpu, w.gang.per_worker.gpu))
            if why is None:
                if left > 0:
                    keep.append(w)
                    left -= 1
                elif head:
                    break
            elif not head and why[0] == ("room",):
                keep.append(w)
                head = True
                if left <= 0:
                    break
        if keep:
            out[team] = tuple(keep) if len(keep) < len(q) else q
    return out


def _wait_of(r) -> Optional[Tuple[Tuple, Wait]]:
    """(its kind, the wait) for a cycle's reason ``r``; None for a reason that says nothing new (not reached)."""
    if isinstance(r, QuotaExceeded):
        room = max(0.0, r.nominal + r.borrowable - r.used)
        return ("quota", r.team, r.resource), QuotaWait(r.team, r.resource, max(0.0, r.needed - room), 0.0)
    if isinstance(r, (NoCapacity, Reserved)):
        inner = r.inner if isinstance(r, Reserved) else r
        return ("room",), CapacityWait(inner.workers * inner.per_worker.gpu, 0.0)
    if isinstance(r, WaitingForPreemption):
        return ("stop",), PreemptionWait(tuple(r.victims), 0.0)
    if isinstance(r, (BehindHead, BlockedByReservation)):
        return _TURN, QueueWait(r.head, 0.0)
    if isinstance(r, Displaced):
        return _TURN, QueueWait(r.by, 0.0)
    return None  # NotReached, Infeasible


def _ended(w: Wait, at: float, ended: Tuple[str, ...]) -> Wait:
    return replace(w, at=at, ended=ended)


# -------------------------------------------------------------------------------------------------- describe


def _clock(t: float, now: float) -> str:
    """``t`` as local clock time, with the weekday when it is not within the next 20 hours."""
    return time.strftime("%H:%M" if t - now < 20 * 3600 else "%a %H:%M", time.localtime(t))


def _who(ids: Sequence[str]) -> str:
    return " and ".join(ids) + (" end" if len(ids) > 1 else " ends")


def describe(eta: Eta, now: float, clock: Callable[[float, float], str] = _clock) -> str:
    """``eta`` in one line, what it waits for in order, e.g. "after pretrain-x ends, about 14:20; then 2 GPUs of
    team-b's quota, about 15:10; starts about 15:10". ``clock(t, now)`` writes a time (local HH:MM by default)."""
    if eta.start is not None and eta.start <= now:
        return "starts now"
    parts: List[str] = []
    for w in eta.waits_for:
        when = f"about {clock(w.at, now)}" if math.isfinite(w.at) else "with no end in sight"
        if isinstance(w, CapacityWait):
            text = (f"after {_who(w.ended)}, {when}" if w.ended else
                    f"room for {w.gpus:g} GPU{'' if w.gpus == 1 else 's'}, {when}")
        elif isinstance(w, QuotaWait):
            unit = {"gpu": "GPU", "cpu": "CPU", "memory": "GiB of memory"}.get(w.resource, w.resource)
            unit += "s" if w.amount != 1 and w.resource in ("gpu", "cpu") else ""
            text = f"{w.amount:g} {unit} of {w.team}'s quota, {when}"
            if w.ended:
                text += f" (when {_who(w.ended)})"
        elif isinstance(w, QueueWait):
            text = f"{'its turn behind ' + w.head if w.head else 'its turn in the queue'}, {when}"
        else:
            text = f"{', '.join(w.victims)} to stop (preempted for it), {when}"
        parts.append(text if not parts else "then " + text)
    if eta.start is None:
        parts.append(eta.note or "no start forecast")
    else:
        span = ""
        if eta.start_low is not None and (eta.start_high is None or eta.start_high > eta.start_low):
            span = (f" (between {clock(eta.start_low, now)} and "
                    f"{clock(eta.start_high, now) if eta.start_high is not None else 'past the horizon'})")
        parts.append(f"starts about {clock(eta.start, now)}{span}"
                     + (f", ends about {clock(eta.finish, now)}" if eta.finish is not None else ""))
    if eta.basis:
        parts.append(f"its runtime: {eta.basis}")
    return "; ".join(parts)
