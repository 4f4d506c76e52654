"""The run-limit rule (``raylane.scheduling.runlimit``) from a table: what is counted against a class's
``max_runtime`` (the attempt for ``requeue``, every attempt for ``stop``), when it falls due, and the reason given."""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional

import pytest

from raylane.scheduling.runlimit import OnMaxRuntime, clock_text, due_at, duration_text, reached
from raylane.scheduling.types import WorkloadClass

SWEEP = WorkloadClass("sweep", priority=50, preemptible=True, checkpoint_interval_s=300.0, max_runtime_s=7200.0)
STOP = replace(SWEEP, on_max_runtime="stop")
NONE = replace(SWEEP, max_runtime_s=None)


@dataclass
class Case:
    name: str
    cls: WorkloadClass
    now: float
    attempt_start: float
    past_s: float
    due: Optional[float]  # due_at
    ran: Optional[float]  # reached(...).ran_s; None: not reached


CASES = [
    Case("requeue: below the limit", SWEEP, 1000 + 7199, 1000, 0, 1000 + 7200, None),
    Case("requeue: at the limit", SWEEP, 1000 + 7200, 1000, 0, 1000 + 7200, 7200),
    Case("requeue: past it, counted since the attempt's admission", SWEEP, 1000 + 9000, 1000, 0, 8200, 9000),
    Case("requeue: earlier attempts do not count", SWEEP, 1000 + 7000, 1000, 5000, 8200, None),
    Case("stop: earlier attempts count", STOP, 1000 + 2200, 1000, 5000, 3200, 7200),
    Case("stop: below the limit across attempts", STOP, 1000 + 2000, 1000, 5000, 3200, None),
    Case("stop: already past it when admitted again", STOP, 1000, 1000, 8000, 200, 8000),
    Case("no limit: never reached", NONE, 10 ** 9, 0, 10 ** 8, None, None),
    Case("a float sum just short of the limit is the limit", SWEEP, 0.1 + 7199.9999999, 0.1, 0, 7200.1, 7199.9999999),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_run_limit(case: Case):
    assert due_at(case.cls, case.attempt_start, case.past_s) == (None if case.due is None else
                                                                  pytest.approx(case.due))
    hit = reached("w", case.cls, case.now, case.attempt_start, case.past_s)
    if case.ran is None:
        assert hit is None
    else:
        assert hit is not None and hit.ran_s == pytest.approx(case.ran) and hit.limit_s == case.cls.max_runtime_s
        assert hit.action is OnMaxRuntime(case.cls.on_max_runtime) and hit.cls == "sweep"


def test_the_reason_says_what_ran_what_is_allowed_and_what_follows():
    assert str(reached("w", SWEEP, 7200, 0, 0)) == (
        "ran 2h00m since its admission, its class 'sweep' allows max_runtime 2h: requeued after a checkpoint")
    assert str(reached("w", STOP, 3000, 0, 4500)) == (
        "ran 2h05m in all its attempts, its class 'sweep' allows max_runtime 2h: stopped")


@pytest.mark.parametrize("s, compact, clock", [(7200, "2h", "2h00m"), (5400, "1h30m", "1h30m"), (90, "1m30s", "1m30s"),
                                               (45, "45s", "45s"), (90061, "1d1h1m1s", "25h01m"), (0, "0s", "0s")])
def test_durations_as_text(s, compact, clock):
    assert (duration_text(s), clock_text(s)) == (compact, clock)


def test_the_default_is_no_limit_and_requeue():
    c = WorkloadClass("c", priority=1, preemptible=True)
    assert (c.max_runtime_s, c.on_max_runtime) == (None, OnMaxRuntime.REQUEUE.value)
