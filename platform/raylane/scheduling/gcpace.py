"""Keeping Python's garbage collector out of scheduling cycles.

With the ~100,000 live objects of a large queue, one full collection takes tens of milliseconds; where the
allocation counters happen to trip it inside ``cycle``, it sets the cycle's tail latency (tests/bench/bench_core.py
measured p99 38 ms with the default collector, under 10 ms with collections between cycles). Every driver of the
core (the control actor, the simulator, the benchmark) runs each cycle inside ``gc_paused()``: automatic
collection is off while the cycle runs and back on after it, so a collection the cycle's allocations made due runs at
the driver's next allocation, in its own time (applying the decisions), never inside the cycle. Nothing is collected
more often than Python's own thresholds say, so a simulator running a million cycles pays nothing extra.

Owned here: only the collector's switches around a cycle. No Ray, no clock.
"""
from __future__ import annotations

import gc
from contextlib import contextmanager
from typing import Iterator


@contextmanager
def gc_paused() -> Iterator[None]:
    """Automatic collection off for the duration (one scheduling cycle), as it was after it."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()

