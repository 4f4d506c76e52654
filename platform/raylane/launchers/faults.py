"""Fault injection for end-to-end tests of the retry and forced-stop paths, from a spec's ``config.fault``:

- ``crash_at_step: K`` with ``times: N``: rank 0 raises at step K in the first N attempts that reach it. The count
  is kept in marker files under the run's storage, so it survives the gang restarts it causes.
- ``ignore_stop: true``: the loop never hears a stop request, like a loop that does not poll; the control actor
  must then stop the gang by force after the class's grace period. It trains on meanwhile, so a short run may
  finish inside the grace period.
- ``hang_on_stop: true``: asked to stop, the loop neither yields nor trains on: it hangs, like a gang stuck in a
  collective or on I/O. Only the forced stop ends the attempt; resumed (nothing asks it to stop then), it trains
  normally.
- ``hold_at_step: K``: an attempt that starts without a checkpoint stops training after step K and keeps asking
  whether to stop until it is asked (then yields, or hangs with ``hang_on_stop``), so a test can preempt it at a
  known step however fast the machine. A resumed attempt does not hold.
- ``first_step_file: PATH``: rank 0 writes the wall-clock time of its first step there (submit-to-first-step
  benchmarks).
"""
from __future__ import annotations

import os
import time
from typing import Optional

from workloads.train_lm import ForwardingHooks


class InjectedCrash(RuntimeError):
    pass


class Faults:
    def __init__(self, *, marker_dir: str, crash_at_step: Optional[int] = None, times: int = 1,
                 ignore_stop: bool = False, hang_on_stop: bool = False, hold_at_step: Optional[int] = None,
                 first_step_file: Optional[str] = None):
        self.marker_dir, self.crash_at_step, self.times, self.ignore_stop = marker_dir, crash_at_step, times, ignore_stop
        self.hang_on_stop, self.hold_at_step = hang_on_stop, hold_at_step
        self.first_step_file = first_step_file

    def __call__(self, hooks):
        return _FaultHooks(hooks, self)


class _FaultHooks(ForwardingHooks):
    def __init__(self, inner, fault: Faults):
        super().__init__(inner)
        self.fault = fault
        self._resumed = False
        self._step: Optional[int] = None

    def load_checkpoint(self):
        found = super().load_checkpoint()
        self._resumed = found is not None  # the same on every rank: they all get the run's latest checkpoint
        return found

    def should_stop(self) -> bool:
        asked = super().should_stop()  # still asked: it is a collective every rank must join
        if self.fault.hold_at_step is not None and self._step == self.fault.hold_at_step and not self._resumed:
            while not asked:  # every rank loops on the broadcast answer, so all join the same polls
                time.sleep(0.5)
                asked = super().should_stop()
        if asked and self.fault.hang_on_stop:
            while True:  # until the control actor kills this worker
                time.sleep(1.0)
        return False if self.fault.ignore_stop else asked

    def report(self, step, metrics):
        self._step = step
        super().report(step, metrics)
        f = self.fault
        if f.first_step_file and self.world_rank == 0 and not os.path.exists(f.first_step_file):
            with open(f.first_step_file, "w") as fh:
                fh.write(repr(time.time()))
        if f.crash_at_step is not None and step == f.crash_at_step and self.world_rank == 0:
            os.makedirs(f.marker_dir, exist_ok=True)
            done = len(os.listdir(f.marker_dir))
            if done < f.times:
                open(os.path.join(f.marker_dir, f"crash-{done}"), "w").close()
                raise InjectedCrash(f"injected crash at step {step} ({done + 1} of {f.times})")
