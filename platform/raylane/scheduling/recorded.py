"""Marks and rollback for the cycle's working state (``Capacity``, ``QuotaLedger``, ``Holdings``; see
``raylane.scheduling.working``).

While a mark is open, each change records the values it replaced (``_log``); ``rollback(mark)`` restores them, newest
first, and forgets them. Marks nest and are rolled back in the reverse order they were made; nothing is recorded
once the last one is rolled back, so a cycle outside a trial pays one ``is None`` test per change.
"""
from __future__ import annotations

from typing import Any, List, Optional


class Recorded:
    __slots__ = ("_log", "_marks")

    def __init__(self) -> None:
        self._log: Optional[List[Any]] = None
        self._marks = 0  # marks not rolled back yet: changes are recorded while there are any

    def mark(self) -> int:
        if self._log is None:
            self._log = []
        self._marks += 1
        return len(self._log)

    def rollback(self, mark: int) -> None:
        log, self._log = self._log, None  # what is put back is not recorded again
        for i in range(len(log) - 1, mark - 1, -1):
            self._restore(log[i])
        del log[mark:]
        self._marks -= 1
        self._log = log if self._marks else None

    def _restore(self, entry: Any) -> None:
        """Put back the values one recorded change replaced."""
        raise NotImplementedError
