"""When a failed attempt is retried: the class's retry budget, and the rule that an error which repeats is not.

A crash is retried from the latest checkpoint with backoff, up to the class's ``retry_budget``. But a failure that
comes back the same on the next attempt (the same exception type and message: a shape mismatch, a missing column,
an import error inside the loop) will come back on every attempt: retrying it only burns the budget and the GPUs.
So a workload whose error repeats on two consecutive attempts fails after the second one, with a reason that says
so; a flaky failure (a different error each time, or a success in between) keeps its whole budget.

Glossary
- *signature*: what identifies an error across attempts (``signature``): the innermost error's type name and its
  message, with what differs from process to process (memory addresses, process ids, actor and node ids) masked.
- *decision*: ``Retry(backoff_s, note)`` or ``GiveUp(reason)``, from ``RetryRule.after_failure``.

Pure: no Ray, no clock. The training and one-shot launchers use it.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import List, Optional, Union

__all__ = ["signature", "root_error", "RetryRule", "Retry", "GiveUp"]

# What differs between two attempts failing the same way: addresses, pids, Ray ids, ports, temp paths.
_VOLATILE = [
    (re.compile(r"0x[0-9a-fA-F]+"), "0x?"),
    (re.compile(r"\b[0-9a-f]{16,}\b"), "<id>"),
    (re.compile(r"\bpid=\d+"), "pid=?"),
    (re.compile(r"\b(?:ip|address)=[\w.:\-]+"), "addr=?"),
    (re.compile(r"/tmp/[^\s'\"]+"), "/tmp/?"),
]


def root_error(exc: BaseException) -> BaseException:
    """The error that started it: for a Ray Train ``WorkerGroupError``, the lowest rank's error; then down the
    ``cause`` / ``__cause__`` chain (Ray's task errors carry the user's exception as ``cause``)."""
    seen = set()
    while id(exc) not in seen:
        seen.add(id(exc))
        failures = getattr(exc, "worker_failures", None)
        if isinstance(failures, dict) and failures:
            exc = failures[min(failures)]
            continue
        inner = getattr(exc, "cause", None)
        if isinstance(inner, BaseException):
            exc = inner
            continue
        if exc.__cause__ is not None:
            exc = exc.__cause__
            continue
        break
    return exc


def signature(exc: BaseException) -> str:
    """``Type: message`` of the error's root, with per-process details masked; equal for the same failure."""
    root = root_error(exc)
    lines = [ln.strip() for ln in str(root).strip().splitlines() if ln.strip()]
    # A Ray task error's text is a traceback ending in the user's error: the last line says what happened.
    message = lines[-1] if lines else ""
    for pattern, repl in _VOLATILE:
        message = pattern.sub(repl, message)
    return f"{type(root).__name__}: {message}"[:500]


@dataclass(frozen=True)
class Retry:
    backoff_s: float
    note: str


@dataclass(frozen=True)
class GiveUp:
    reason: str


@dataclass
class RetryRule:
    """Counts a workload's failed attempts. ``budget``: retries allowed (the class's ``retry_budget``);
    ``max_backoff_s``: the cap of the exponential backoff (1, 2, 4, ... seconds)."""

    budget: int
    max_backoff_s: float = 30.0
    failures: int = 0
    history: List[str] = field(default_factory=list)  # the signatures of consecutive failures, the latest last

    def after_failure(self, exc: Union[BaseException, str], short: Optional[str] = None) -> Union[Retry, GiveUp]:
        """What to do after attempt ``failures + 1`` failed with ``exc`` (an exception or its signature already).
        ``short``: how the error is named in the reason (default: its signature)."""
        sig = exc if isinstance(exc, str) else signature(exc)
        short = short or sig
        self.failures += 1
        repeated = bool(self.history) and self.history[-1] == sig
        self.history.append(sig)
        if repeated:
            return GiveUp(f"failed the same way on {len(self._same_tail())} consecutive attempts, so it is not "
                          f"retried again (retry budget {self.budget}, {self.failures - 1} used): {short}")
        if self.failures > self.budget:
            return GiveUp(f"failed {self.failures} times (retry budget {self.budget}): {short}")
        backoff = min(2.0 ** (self.failures - 1), self.max_backoff_s)
        return Retry(backoff, f"attempt failed ({short}); retry {self.failures}/{self.budget} in {backoff:g}s")

    def after_success(self) -> None:
        """An attempt got somewhere (it yielded, was resized or moved): a later failure is not a repeat of the
        one before it."""
        self.history.clear()

    def _same_tail(self) -> List[str]:
        tail = [self.history[-1]]
        for sig in reversed(self.history[:-1]):
            if sig != tail[0]:
                break
            tail.append(sig)
        return tail
