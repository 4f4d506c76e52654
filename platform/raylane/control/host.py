"""``Host``: what the control plane's state machine reads of the world (``raylane.control.state``).

Its own module, so that the actor's module (``raylane.control.actor``) defines ``RayHost`` without importing the
state machine: Ray imports the actor's module in every process that looks the actor up by name (to read its
class), and each CLI command is such a process.
"""
from __future__ import annotations

from time import perf_counter, thread_time
from typing import Any, Callable, Dict, List, Optional


class Host:
    """What the control plane reads of the world. The actor's host reads Ray (``raylane.control.actor.RayHost``);
    a test's is a fake. Every method must be cheap enough to call once a tick."""

    def nodes(self) -> List[Dict[str, Any]]:
        """Ray's node table, as ``ray.nodes()`` gives it."""
        return []

    def draining(self) -> Dict[str, int]:
        """Ray's drain notices: node id -> the drain deadline (ms since the epoch; 0: none)."""
        return {}

    def job_table(self) -> Optional[Dict[str, str]]:
        """Ray's status of every job it lists, by submission id; None when Ray did not answer."""
        return None

    def placement_groups(self) -> Dict[str, str]:
        """Placement groups that exist and are not removed: name -> Ray's state (``CREATED`` once placed)."""
        return {}

    def forecast(self, run: Callable[[], Any], done: Callable[[Any, float, float], None]) -> None:
        """Run a queue forecast: ``run`` is pure (it reads a copy of the state, never the live one); call
        ``done(result, wall_s, cpu_s)`` with what it gave, its wall time and the CPU time of the thread that ran
        it. Here at once, in the caller; the actor's host runs it on a thread of its own and calls ``done`` back
        on its event loop, so that a forecast of thousands of pending workloads does not stall the loop."""
        t0, c0 = perf_counter(), thread_time()
        out = run()
        done(out, perf_counter() - t0, thread_time() - c0)
