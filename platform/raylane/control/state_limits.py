"""Run limits in the control plane (a role of ``raylane.control.state.ControlState``): a workload class's
``max_runtime`` enforced on the ticks, journaled, and carried out as its ``on_max_runtime`` says.

The rule is ``raylane.scheduling.runlimit``'s (the simulator applies the same one); this module owns when it is
checked and what is done then:
- *the index*: a heap of (due time, workload id, attempt start), one entry per lease of a class with a limit, pushed
  at its admission (``track``); a full tick pops what fell due (``enforce``), so a tick's work grows with the
  limits that fall due, not with the leases. An entry whose attempt has ended since is stale and dropped. It is
  built from the leases when first needed and again after a policy change (the classes' limits may have changed).
- *reached*: a ``RUNNING`` gang past its limit is asked to save a checkpoint and stop within its class's grace
  period (a ``run_limit`` entry; the record is ``PREEMPTING`` with the reason), and stopped by force after it, as a
  preemption's victim is (``Leases.enforce_deadlines``). A lease not running yet (its driver is starting the gang, or
  restarting it after a resize) is checked again at the next full tick; one stopping already for a preemption is
  left to it.
- *its gang stopped* (``end_run_limited``, from ``Leases.release_lease``): ``requeue``: back to its queue at its
  original place, with its service; ``stop``: it ends ``FAILED``, outcome ``max runtime``, with the reason, its
  MLflow run closed and its Ray job stopped if its driver does not exit, as after a cancel.
"""
from __future__ import annotations

import heapq
from typing import Any, Callable, List, Optional, Tuple

from raylane.control import effects as fx
from raylane.control.journal import Kind
from raylane.control.records import Record, State
from raylane.scheduling import lifecycle, runlimit


class RunLimits:
    """The index of run limits and what is done when one is reached. Handed the records, the ``ClusterState`` and
    the policy (getters: a policy reload replaces both), the pipeline book (a stage's job is its pipeline's driver),
    the cancel grace period, ``append``, ``emit``, ``poke`` and ``remove_pg`` (``Leases.remove_pg``)."""

    def __init__(self, *, records, state: Callable[[], Any], policy: Callable[[], Any], pipes, cancel_grace_s: float,
                 append: Callable[..., Any], emit: Callable[[fx.Effect], None], poke: Callable[[], None],
                 remove_pg: Callable[[Record], None]):
        self.records, self.pipes, self.cancel_grace_s = records, pipes, cancel_grace_s
        self._state, self._policy = state, policy
        self._append, self._emit, self._poke, self._remove_pg = append, emit, poke, remove_pg
        # (due, workload id, attempt start); None until first needed. ``_limits_policy``: the policy it was built for.
        self._limit_due: Optional[List[Tuple[float, str, float]]] = None
        self._limits_policy: Any = None

    @property
    def state(self):
        return self._state()

    @property
    def policy(self):
        return self._policy()

    def track(self, rec: Record) -> None:
        """``rec`` was just admitted: index when its attempt reaches its class's limit, if it has one."""
        if self._limit_due is not None and self._limits_policy is self.policy:
            self._push_run_limit(rec)  # otherwise the next full tick indexes every lease, this one included

    def _push_run_limit(self, rec: Record) -> None:
        lease = self.state.leases.get(rec.id)
        if lease is None or rec.attempt_started is None:
            return
        due = runlimit.due_at(lease.workload.cls, rec.attempt_started, rec.past_run_s)
        if due is not None:
            heapq.heappush(self._limit_due, (due, rec.id, rec.attempt_started))

    def _index_run_limits(self) -> None:
        self._limit_due, self._limits_policy = [], self.policy
        for wid in self.state.leases:
            rec = self.records.get(wid)
            if rec is not None:
                self._push_run_limit(rec)

    def enforce(self, now: float) -> None:
        """Gangs whose attempt (or, for ``stop``, whose attempts together) reached their class's ``max_runtime`` are
        asked to stop (see the module's *reached*)."""
        if self._limit_due is None or self._limits_policy is not self.policy:
            self._index_run_limits()
        heap, later = self._limit_due, []
        while heap and heap[0][0] <= now:
            entry = heapq.heappop(heap)
            _, wid, started = entry
            rec = self.records.get(wid)
            lease = self.state.leases.get(wid)
            if rec is None or lease is None or rec.attempt_started != started or rec.state is State.PREEMPTING:
                continue  # its attempt ended, or it is stopping for good already
            if rec.state is not State.RUNNING:
                later.append(entry)  # its gang is starting or restarting at a new size: checked again next tick
                continue
            hit = runlimit.reached(wid, lease.workload.cls, now, started, rec.past_run_s)
            if hit is None:
                later.append(entry)  # not yet after all (a due time rounded down): checked again next tick
                continue
            self._reach_run_limit(rec, hit, lease.workload.cls.grace_period_s, now)
        for entry in later:
            heapq.heappush(heap, entry)

    def _reach_run_limit(self, rec: Record, hit: runlimit.RunLimitReached, grace: float, now: float) -> None:
        reason = str(hit)
        self._append(Kind.RUN_LIMIT, rec, action=hit.action.value, ran_s=hit.ran_s, limit_s=hit.limit_s,
                     deadline=now + grace, reason=reason,
                     note=f"{reason} (its gang has {grace:g}s to save a checkpoint and stop)")
        lifecycle.begin_stop(self.state, rec.id)

    def end_run_limited(self, rec: Record, now: float, outcome: str, step: Optional[int]) -> bool:
        """The gang of ``rec`` stopped (``outcome``: yielded, or by force): if it stopped for its run limit, it goes
        back to its queue or ends, as its class says; False when it stopped for something else (a preemption)."""
        limit = rec.run_limit
        if not limit or rec.state is not State.PREEMPTING or rec.id not in self.state.leases:
            return False
        lease = lifecycle.end(self.state, rec.id, now)
        self._remove_pg(rec)
        step = step if step is not None else rec.step
        if limit["action"] == runlimit.OnMaxRuntime.REQUEUE.value:
            attained = lifecycle.attained_gpu_s(lease, now)
            self._append(Kind.REQUEUED, rec, attained_gpu_s=attained, step=step, run_limit=True,
                         note=f"back in the queue ({outcome}): {limit['reason']}")
            lifecycle.requeue(self.state, lease, now, attained)
        else:
            own_job = bool(rec.job_id) and self.pipes.stage_of(rec.id) is None
            self._append(Kind.FINISHED, rec, state=State.FAILED, outcome="max runtime", step=step, close_run=True,
                         job_stop_at=now + self.cancel_grace_s if own_job else None,
                         note=f"failed ({outcome}): {limit['reason']}")
            self._emit(fx.Wake(rec.id))
        self._poke()
        return True
