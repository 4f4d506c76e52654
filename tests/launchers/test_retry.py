"""The retry rule (raylane.launchers.retry), from tables: an error that repeats on consecutive attempts stops
after the second attempt with a reason that says so; a flaky one keeps the class's whole budget; what differs
from process to process does not make two identical failures look different. No Ray."""
import pytest

from raylane.launchers.retry import GiveUp, Retry, RetryRule, root_error, signature


class WorkerGroupError(Exception):
    """Shaped like Ray Train's: the workers' own errors by rank."""

    def __init__(self, msg, worker_failures):
        super().__init__(msg)
        self.worker_failures = worker_failures


class RayTaskError(Exception):
    def __init__(self, text, cause):
        super().__init__(text)
        self.cause = cause


def shard_missing(pid):
    inner = KeyError("Dataset shard for 'train' not found. Please ensure that the dataset is passed to the Trainer.")
    return WorkerGroupError(f"Training failed due to worker errors (pid={pid}, actor 0x7f{pid:x}):\n  rank 0 ...",
                            {1: RuntimeError("rank 1 saw rank 0 die"), 0: inner})


@pytest.mark.parametrize("name,errors,budget,expect", [
    # the case: the same WorkerGroupError each attempt (pids differ), budget 3 -> two attempts, then stop
    ("same error twice", [shard_missing(11), shard_missing(22)], 3, ["retry", "give up: same"]),
    ("flaky: different errors keep the budget", [ValueError("a"), ValueError("b"), ValueError("c"),
                                                  ValueError("d")], 3, ["retry", "retry", "retry", "give up: budget"]),
    ("budget 0: the first failure ends it", [ValueError("a")], 0, ["give up: budget"]),
    ("a repeat after a different error", [ValueError("a"), ValueError("b"), ValueError("b")], 5,
     ["retry", "retry", "give up: same"]),
    ("same message, another type is not a repeat", [ValueError("x"), TypeError("x")], 3, ["retry", "retry"]),
    ("addresses and temp paths are masked", [OSError("cannot open /tmp/ray/session_1/a.lock at 0xdeadbeef"),
                                             OSError("cannot open /tmp/ray/session_2/b.lock at 0xcafe")], 3,
     ["retry", "give up: same"]),
])
def test_retry_rule(name, errors, budget, expect):
    rule = RetryRule(budget)
    got = []
    for exc in errors:
        d = rule.after_failure(exc)
        if isinstance(d, Retry):
            got.append("retry")
        else:
            assert isinstance(d, GiveUp)
            got.append("give up: same" if "the same way" in d.reason else "give up: budget")
    assert got == expect, name


def test_a_repeat_says_so_with_the_error_and_the_budget():
    rule = RetryRule(3)
    assert isinstance(rule.after_failure(shard_missing(1)), Retry)
    d = rule.after_failure(shard_missing(2))
    assert isinstance(d, GiveUp)
    assert "failed the same way on 2 consecutive attempts" in d.reason
    assert "retry budget 3, 1 used" in d.reason and "Dataset shard for 'train' not found" in d.reason


def test_an_attempt_that_got_somewhere_breaks_the_repeat():
    rule = RetryRule(3)
    rule.after_failure(ValueError("oom"))
    rule.after_success()  # e.g. it yielded to a preemption in between
    assert isinstance(rule.after_failure(ValueError("oom")), Retry)
    assert rule.failures == 2  # the budget still counts every failure


def test_backoff_doubles_to_its_cap():
    rule = RetryRule(10, max_backoff_s=4)
    assert [rule.after_failure(ValueError(str(i))).backoff_s for i in range(5)] == [1, 2, 4, 4, 4]


def test_the_root_is_the_lowest_ranks_error_down_its_causes():
    user = KeyError("col")
    wrapped = RayTaskError("Traceback ...\nKeyError: 'col'", user)
    err = WorkerGroupError("failed", {2: ValueError("other"), 0: wrapped})
    assert root_error(err) is user
    assert signature(err) == "KeyError: 'col'"
    chained = RuntimeError("outer")
    chained.__cause__ = ZeroDivisionError("division by zero")
    assert signature(chained) == "ZeroDivisionError: division by zero"
