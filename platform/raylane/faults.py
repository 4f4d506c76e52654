"""Fault drills for end-to-end tests of the retry and forced-stop paths, from a spec's ``config.fault`` (read by the
platform and never passed to the user's loop). They act on the loop's reports (``raylane.train`` calls them from
the wrapped ``ray.train.report``), so they work for any loop that reports ``step``:

- ``crash_at_step: K`` with ``times: N``: rank 0 raises at its report of step K (before the report reaches Ray) in
  the first N attempts that get there. The count is kept in marker files under the run's storage, so it survives
  the gang restarts it causes.
- ``ignore_stop: true``: the loop never hears a stop request, like a loop that does not report checkpoints; the
  control actor must then stop the gang by force after the class's grace period. It trains on meanwhile, so a
  short run may finish inside the grace period.
- ``hang_on_stop: true``: asked to stop, the loop neither yields nor trains on: it hangs, like a gang stuck in a
  collective or on I/O. Only the forced stop ends the attempt; resumed (nothing asks it to stop then), it trains
  normally.
- ``hold_at_step: K``: an attempt that starts without a checkpoint stops at its report of step K and keeps asking
  whether to stop until it is asked (then yields, or hangs with ``hang_on_stop``), so a test can preempt it at a
  known step however fast the machine. A resumed attempt does not hold.
- ``hold_at_steps: [K1, K2, ...]``: one hold per stop, for a scenario of several (resizes, preemptions): the attempt
  after the n-th stop (the first attempt after none) holds at its checkpointed report of step K(n+1), as
  ``hold_at_step`` does, until it is asked to stop; an attempt asked before it gets there holds nowhere, and the
  next one holds at the next step listed. The stops are counted in marker files, like the crashes. So each phase of
  the scenario lasts until the test moves on, whatever the machine's speed, and each stop yields at a checkpoint.
  Rank 0 reports the checkpoint (the other ranks of a loop like ``workloads.ray_train`` pass none), so its decision
  to hold is broadcast to every rank (``raylane.train``).
- ``first_step_file: PATH``: rank 0 writes the wall-clock time of its first report there (submit-to-first-step
  benchmarks of a loop that reports every step).
"""
from __future__ import annotations

import os
import time
from typing import Optional, Sequence

from raylane.errors import ValidationError

__all__ = ["Faults", "InjectedCrash", "FAULT_KEYS"]

FAULT_KEYS = ("crash_at_step", "times", "ignore_stop", "hang_on_stop", "hold_at_step", "hold_at_steps",
              "first_step_file")


class InjectedCrash(RuntimeError):
    pass


class Faults:
    def __init__(self, *, marker_dir: str, crash_at_step: Optional[int] = None, times: int = 1,
                 ignore_stop: bool = False, hang_on_stop: bool = False, hold_at_step: Optional[int] = None,
                 hold_at_steps: Sequence[int] = (), first_step_file: Optional[str] = None):
        errors = []
        if not isinstance(hold_at_steps, (list, tuple)) or not all(
                isinstance(k, int) and not isinstance(k, bool) and k >= 1 for k in hold_at_steps):
            errors.append(("config.fault.hold_at_steps", hold_at_steps,
                           "a list of integers >= 1 (steps the loop reports)"))
        for name, value in (("crash_at_step", crash_at_step), ("hold_at_step", hold_at_step)):
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                errors.append((f"config.fault.{name}", value, "an integer >= 1 (a step the loop reports)"))
        if not isinstance(times, int) or isinstance(times, bool) or times < 1:
            errors.append(("config.fault.times", times, "an integer >= 1"))
        for name, value in (("ignore_stop", ignore_stop), ("hang_on_stop", hang_on_stop)):
            if not isinstance(value, bool):
                errors.append((f"config.fault.{name}", value, "true or false"))
        if errors:
            raise ValidationError("fault drill", errors)
        self.marker_dir, self.crash_at_step, self.times, self.ignore_stop = marker_dir, crash_at_step, times, ignore_stop
        self.hang_on_stop, self.hold_at_step = hang_on_stop, hold_at_step
        self.hold_at_steps = list(hold_at_steps)
        # this attempt's hold: the one after as many stops as the markers count (read once: every rank agrees)
        self._stops = self._count("stop-") if self.hold_at_steps else 0
        self._stop_marked = False
        self.first_step_file = first_step_file
        self._first_done = False

    def before_report(self, step: int, rank: int) -> None:
        if rank != 0:
            return
        if self.first_step_file and not self._first_done:
            self._first_done = True
            if not os.path.exists(self.first_step_file):
                with open(self.first_step_file, "w") as fh:
                    fh.write(repr(time.time()))
        if self.crash_at_step is not None and step == self.crash_at_step:
            os.makedirs(self.marker_dir, exist_ok=True)
            done = self._count("crash-")
            if done < self.times:
                open(os.path.join(self.marker_dir, f"crash-{done}"), "w").close()
                raise InjectedCrash(f"injected crash at step {step} ({done + 1} of {self.times})")

    def _count(self, prefix: str) -> int:
        if not self.marker_dir or not os.path.isdir(self.marker_dir):
            return 0
        return sum(1 for name in os.listdir(self.marker_dir) if name.startswith(prefix))

    def holds_at(self, step: int, resumed: bool, checkpointed: bool = False) -> bool:
        if checkpointed and self._stops < len(self.hold_at_steps) and step == self.hold_at_steps[self._stops]:
            return True
        return self.hold_at_step is not None and step == self.hold_at_step and not resumed

    def on_stop_answer(self, asked: bool, rank: int = 0) -> bool:
        """What the loop hears of a stop request ``asked`` (the same on every rank)."""
        if asked and self.hold_at_steps and rank == 0 and not self._stop_marked:
            self._stop_marked = True  # one stop of the scenario: the next attempt holds at the next step
            os.makedirs(self.marker_dir, exist_ok=True)
            open(os.path.join(self.marker_dir, f"stop-{self._stops}"), "w").close()
        if asked and self.hang_on_stop:
            while True:  # until the control actor kills this worker
                time.sleep(1.0)
        return False if self.ignore_stop else asked
