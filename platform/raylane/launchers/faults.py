"""Fault injection for end-to-end tests of the retry path: a spec's ``config.fault`` makes a worker crash.

``fault: {crash_at_step: K, times: N}`` makes rank 0 raise at step K in the first N attempts that reach it. The
count is kept in marker files under the run's storage, so it survives the gang restarts it causes.
"""
from __future__ import annotations

import os

from workloads.train_lm import ForwardingHooks


class InjectedCrash(RuntimeError):
    pass


class CrashAt:
    def __init__(self, *, step: int, times: int, marker_dir: str):
        self.step, self.times, self.marker_dir = step, times, marker_dir

    def __call__(self, hooks):
        return _CrashHooks(hooks, self)


class _CrashHooks(ForwardingHooks):
    def __init__(self, inner, fault: CrashAt):
        super().__init__(inner)
        self.fault = fault

    def report(self, step, metrics):
        super().report(step, metrics)
        f = self.fault
        if step == f.step and self.world_rank == 0:
            os.makedirs(f.marker_dir, exist_ok=True)
            done = len(os.listdir(f.marker_dir))
            if done < f.times:
                open(os.path.join(f.marker_dir, f"crash-{done}"), "w").close()
                raise InjectedCrash(f"injected crash at step {step} ({done + 1} of {f.times})")
