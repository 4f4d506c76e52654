"""Open admission waits (``wait_admission``) of the control actor: how many there are, and who is woken. Ray-free.

A ``wait_admission`` call on a workload that is not ready yet holds one of the actor's concurrency slots (Ray's
``max_concurrency``, 1,000) for up to its ``timeout_s``. Unbounded, one caller's burst of waits took every slot and
froze the control plane for everyone (issue 44: 1,000 waits, ~37 s). ``Waits`` bounds them: at most
``WaitLimits.per_principal`` open waits per credential, ``per_workload`` per workload and ``total`` in all, the
total well under the actor's slots so that probes, drivers' reports and the CLI always find one free. A wait past a
bound is refused at once with ``TooManyRequestsError`` (retryable: a wait that ends frees its place); the actor
audits it through the gate, where identical refusals share one audit row (``raylane.control.gate.Refusals``).

Each waiter has an event of its own: ``wake(workload)`` sets the events of every wait open on it, and a waiter that
finishes touches nothing but its own. (A single event per workload, cleared by whichever waiter finished first, left
the others asleep until their timeout.)

Words: a *wait* is one open ``wait_admission`` call; its *key* is the credential it counts against (a token id;
None when authentication is off, where every caller is the same anonymous operator and only the workload and total
bounds apply).
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Dict, Optional, Set

from raylane.errors import TooManyRequestsError

__all__ = ["WaitLimits", "Waits", "Waiter", "TooManyRequestsError"]




@dataclass(frozen=True)
class WaitLimits:
    """Bounds on open waits. ``per_principal``: one credential's (a driver waits once per workload it drives; a
    pipeline's driver once per stage at the same time, hence more than a handful); ``per_workload``: on one workload,
    by anyone; ``total``: in all, well under the actor's 1,000 concurrency slots."""

    per_principal: int = 32
    per_workload: int = 64
    total: int = 256

    def __post_init__(self):
        for name in ("per_principal", "per_workload", "total"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"WaitLimits.{name}: got {getattr(self, name)!r}; a positive int")


@dataclass(eq=False)
class Waiter:
    """One open wait: its key, its workload, and its own event (set by ``Waits.wake``)."""

    key: Optional[str]
    workload_id: str
    event: asyncio.Event = field(default_factory=asyncio.Event)


class Waits:
    """The open waits of one control actor. Not thread-safe: the actor's event loop is its only user."""

    def __init__(self, limits: WaitLimits = WaitLimits()):
        self.limits = limits
        self._on: Dict[str, Set[Waiter]] = {}  # workload id -> its open waits
        self._of: Dict[str, int] = {}  # key -> how many waits it has open
        self.total = 0

    def open(self, key: Optional[str], workload_id: str) -> Waiter:
        """A new wait of ``key`` on ``workload_id``, or ``TooManyRequestsError`` naming the bound it would pass (the
        message is the same for every call refused by one bound, so their audit rows coalesce)."""
        lim = self.limits
        if key is not None and self._of.get(key, 0) >= lim.per_principal:
            raise TooManyRequestsError(f"wait_admission: refused: this credential has {lim.per_principal} admission "
                                       f"waits open, the most it may (retry when one ends)")
        if len(self._on.get(workload_id, ())) >= lim.per_workload:
            raise TooManyRequestsError(f"wait_admission: refused: {lim.per_workload} admission waits are open on "
                                       f"{workload_id}, the most there may be on one workload (retry when one ends)")
        if self.total >= lim.total:
            raise TooManyRequestsError(f"wait_admission: refused: {lim.total} admission waits are open on the "
                                       f"control plane, the most there may be (retry in a few seconds)")
        w = Waiter(key, workload_id)
        self._on.setdefault(workload_id, set()).add(w)
        if key is not None:
            self._of[key] = self._of.get(key, 0) + 1
        self.total += 1
        return w

    def close(self, w: Waiter) -> None:
        """``w`` ended (woken, timed out or cancelled); closing it twice is harmless."""
        on = self._on.get(w.workload_id)
        if on is None or w not in on:
            return
        on.discard(w)
        if not on:
            del self._on[w.workload_id]
        if w.key is not None:
            left = self._of[w.key] - 1
            if left:
                self._of[w.key] = left
            else:
                del self._of[w.key]
        self.total -= 1

    def wake(self, workload_id: str) -> int:
        """Set the event of every wait open on ``workload_id``; how many there were."""
        on = self._on.get(workload_id, ())
        for w in on:
            w.event.set()
        return len(on)

    async def wait(self, key: Optional[str], workload_id: str, timeout_s: float) -> bool:
        """Wait until ``workload_id`` is woken or ``timeout_s`` passes: whether it was woken. Raises
        ``TooManyRequestsError`` at once, before waiting, past a bound."""
        w = self.open(key, workload_id)
        try:
            await asyncio.wait_for(w.event.wait(), timeout=timeout_s)
            return True
        except asyncio.TimeoutError:
            return False
        finally:
            self.close(w)

    def open_of(self, key: Optional[str] = None, workload_id: Optional[str] = None) -> int:
        """Open waits of ``key``, or on ``workload_id``, or in all."""
        if key is not None:
            return self._of.get(key, 0)
        if workload_id is not None:
            return len(self._on.get(workload_id, ()))
        return self.total
