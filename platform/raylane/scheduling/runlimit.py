"""Run limits: a workload class's ``max_runtime`` and what is done with work that reaches it (``on_max_runtime``).

This module owns the rule, as pure functions that both drivers call: the control plane
(``raylane.control.state_limits``) on its ticks, and the simulator (``raylane.sim.replay``) at the simulated time the
limit falls due. It decides only whether a limit is reached and says so (``RunLimitReached``, with the numbers a user
needs); carrying it out (journal, stop, requeue or end) is the driver's.

Words
- *attempt*: one lease, from its admission to its end. A requeue (a preemption, a lost node, a run limit) ends it
  and the next admission starts another; a resize does not (the gang goes on, at another size, on the same lease).
- *ran*: the time counted against the limit. For ``requeue``, the attempt's time only (Slurm's ``TimeLimit`` with
  ``--requeue``, KAI's maximum run time with requeue: each run gets a fresh limit; the requeue makes the gang save a
  checkpoint and lets the queue's order decide again who runs next). For ``stop``, the time of all its attempts
  together (as Kueue's ``maximumExecutionTimeSeconds`` accumulates across evictions): a preemption or a lost node
  does not give the work a fresh budget.
- *requeue*: the gang is asked to save a checkpoint and stop within its class's grace period (stopped by force
  after it, as a preemption), and the workload goes back to its queue at its original place (its submit time),
  with the service it had. It is not a preemption: it is not counted as one.
- *stop*: the gang is asked to stop the same way, and the workload then ends ``FAILED`` with the reason.

Pure: no Ray, no clock (``now`` and the attempt's start are arguments).
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Optional

from raylane.scheduling.types import WorkloadClass

__all__ = ["OnMaxRuntime", "ON_MAX_RUNTIME", "RunLimitReached", "counted_s", "due_at", "reached", "duration_text"]

# Float sums of times fall just short of a limit reached exactly.
_EPS = 1e-6


class OnMaxRuntime(str, enum.Enum):
    """What is done with work that reaches its class's ``max_runtime`` (see the module's words)."""

    REQUEUE = "requeue"
    STOP = "stop"


# The values a policy may give ``on_max_runtime``, in the order its errors list them; the first is the default.
ON_MAX_RUNTIME = tuple(a.value for a in OnMaxRuntime)


@dataclass(frozen=True)
class RunLimitReached:
    """Work that reached its class's ``max_runtime``: ``ran_s`` counted (see *ran*), against ``limit_s``."""

    workload_id: str
    cls: str
    action: OnMaxRuntime
    ran_s: float
    limit_s: float

    @property
    def requeues(self) -> bool:
        return self.action is OnMaxRuntime.REQUEUE

    def __str__(self) -> str:
        if self.requeues:
            return (f"ran {clock_text(self.ran_s)} since its admission, its class {self.cls!r} allows max_runtime "
                    f"{duration_text(self.limit_s)}: requeued after a checkpoint")
        return (f"ran {clock_text(self.ran_s)} in all its attempts, its class {self.cls!r} allows max_runtime "
                f"{duration_text(self.limit_s)}: stopped")


def counted_s(cls: WorkloadClass, attempt_s: float, past_s: float) -> float:
    """The time counted against ``cls``'s limit: ``attempt_s`` (this attempt's) for ``requeue``, plus ``past_s``
    (earlier attempts') for ``stop``."""
    return attempt_s + (past_s if cls.on_max_runtime == OnMaxRuntime.STOP.value else 0.0)


def due_at(cls: WorkloadClass, attempt_start: float, past_s: float) -> Optional[float]:
    """When an attempt that started at ``attempt_start`` (after ``past_s`` seconds of earlier attempts) reaches
    ``cls``'s limit; None when the class has none."""
    if cls.max_runtime_s is None:
        return None
    return attempt_start + cls.max_runtime_s - counted_s(cls, 0.0, past_s)


def reached(workload_id: str, cls: WorkloadClass, now: float, attempt_start: float,
            past_s: float) -> Optional[RunLimitReached]:
    """The limit ``cls`` puts on an attempt that started at ``attempt_start`` (after ``past_s`` seconds of earlier
    attempts), if it is reached by ``now``; None when it is not, or the class has none."""
    limit = cls.max_runtime_s
    if limit is None:
        return None
    ran = counted_s(cls, max(0.0, now - attempt_start), past_s)
    if ran < limit - _EPS:
        return None
    return RunLimitReached(workload_id, cls.name, OnMaxRuntime(cls.on_max_runtime), ran, limit)


def duration_text(s: float) -> str:
    """A duration as a policy would write it: ``2h``, ``1h30m``, ``90s`` -> ``1m30s``, ``0s``."""
    left = int(round(s))
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        n, left = divmod(left, size)
        if n:
            parts.append(f"{n}{unit}")
    return "".join(parts) or "0s"


def clock_text(s: float) -> str:
    """A time run, to the minute past an hour: ``2h00m``, ``12m05s``, ``40s``."""
    h, rem = divmod(int(round(s)), 3600)
    m, sec = divmod(rem, 60)
    if h:
        return f"{h}h{m:02d}m"
    return f"{m}m{sec:02d}s" if m else f"{sec}s"
