"""The runtime model: learns from each finished workload how long similar work runs, online, in bounded memory.

This module owns ``RuntimeModel``: the runs it has seen, by key at each level of similarity (``dist.LEVELS``), and
each user's estimate errors. Drivers feed it: the control plane at every workload's end (and again from the
journal at a restart), the simulator at each simulated end, never anything that has not ended yet. It answers
``predict(features, estimate_s)`` with a ``RuntimeDist`` that a driver attaches to the workload
(``Workload.predicted``); the scheduling core and the forecast read only that.

Words
- *features*: what the model keys on (``RunFeatures``): who submitted it and its name, its entrypoint and config
  (``entry``: a digest the driver makes), team, class and gang shape (GPUs in all, workers).
- *run*: one finished workload's runtime (seconds of service at its size over all its attempts, ``dist``'s word).
  Work that was cancelled is not a run: its runtime says when someone stopped it, not how long it needed.
- *window*: each key keeps its last ``window`` runs (recent work says more of the next run than old work does),
  and the model keeps at most ``max_keys`` keys per level, dropping those seen least recently: memory is bounded
  by ``window x max_keys x levels`` numbers whatever the history's length.
- *estimate error*: a run's actual runtime over what its user declared; each user's last ``window`` of them.
  ``predict`` with a declared estimate, by the rule ``learn`` (the default): the estimate times the user's past
  ratios when there are ``min_runs`` of them, else everyone's, else the estimate as the median of a distribution
  shaped as its most similar runs are, else the estimate alone; ``trust``: the estimate alone, as a point; ``cap``:
  the history's distribution cut at the estimate (a limit the user set: their work is stopped there).
  ``ESTIMATE_RULES``; docs/eta.md measures them.

Pure: no Ray, no clock, no randomness.
"""
from __future__ import annotations

import hashlib
import json
import math
from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import Any, Deque, Dict, List, Optional, Tuple

from raylane.runtimes.dist import Basis, RuntimeDist, human_s, point

__all__ = ["RunFeatures", "RuntimeModel", "entry_digest", "ESTIMATE_RULES", "DEFAULT_WINDOW", "DEFAULT_MAX_KEYS"]

ESTIMATE_RULES = ("learn", "trust", "cap")
# The estimate errors of every user together: what corrects the estimates of a user with none of their own yet.
_EVERYONE = "*"
DEFAULT_WINDOW = 64
DEFAULT_MAX_KEYS = 20_000


@dataclass(frozen=True, slots=True)
class RunFeatures:
    """What the model keys a workload on. ``user`` and ``name`` None where unknown (a trace without them)."""

    team: str
    cls: str
    gpus: float
    workers: int = 1
    user: Optional[str] = None
    name: Optional[str] = None
    entry: Optional[str] = None

    def keys(self) -> List[Tuple[str, str]]:
        """(level, key) of each level this workload has a key at, most specific first."""
        out: List[Tuple[str, str]] = []
        if self.user is not None and self.name is not None:
            out.append(("user-name", f"{self.user}/{self.name}"))
        if self.entry is not None:
            out.append(("entry", self.entry))
        out.append(("team-class-shape", f"{self.team}/{self.cls}/{_gpus(self.gpus)}x{self.workers}w"))
        out.append(("class", f"class {self.cls}"))
        out.append(("cluster", "the cluster"))
        return out


def entry_digest(code: Any, config: Any) -> Optional[str]:
    """``RunFeatures.entry`` of a workload: its entrypoint or command, shortened, and a digest of it with its
    config (the same code with the same settings). None without code."""
    if not code:
        return None
    blob = json.dumps([code, config or {}], sort_keys=True, default=str)
    text = code if isinstance(code, str) else " ".join(str(c) for c in code)
    text = text if len(text) <= 60 else text[:57] + "..."
    return f"{text}#{hashlib.sha1(blob.encode()).hexdigest()[:8]}"


def _gpus(g: float) -> str:
    return f"{g:g}gpu"


class _Level:
    """One level's keys: each a window of runs, least recently used dropped past ``max_keys``."""

    __slots__ = ("window", "max_keys", "runs", "cache")

    def __init__(self, window: int, max_keys: int):
        self.window, self.max_keys = window, max_keys
        self.runs: "OrderedDict[str, Deque[float]]" = OrderedDict()
        self.cache: Dict[str, Basis] = {}

    def add(self, level: str, key: str, value: float) -> None:
        d = self.runs.get(key)
        if d is None:
            d = self.runs[key] = deque(maxlen=self.window)
            while len(self.runs) > self.max_keys:
                old, _ = self.runs.popitem(last=False)
                self.cache.pop(old, None)
        else:
            self.runs.move_to_end(key)
        d.append(value)
        self.cache.pop(key, None)

    def basis(self, level: str, key: str) -> Optional[Basis]:
        b = self.cache.get(key)
        if b is None:
            d = self.runs.get(key)
            if not d:
                return None
            b = self.cache[key] = Basis(level, key, tuple(sorted(d)))
        return b


class RuntimeModel:
    """Runtimes learned from finished work (the module docstring). Not thread-safe: one driver feeds it."""

    def __init__(self, *, window: int = DEFAULT_WINDOW, max_keys: int = DEFAULT_MAX_KEYS, min_runs: int = 3,
                 estimate_rule: str = "learn"):
        errors = []
        if not (isinstance(window, int) and window >= 1):
            errors.append(f"window={window!r} (allowed: an integer >= 1)")
        if not (isinstance(max_keys, int) and max_keys >= 1):
            errors.append(f"max_keys={max_keys!r} (allowed: an integer >= 1)")
        if not (isinstance(min_runs, int) and min_runs >= 1):
            errors.append(f"min_runs={min_runs!r} (allowed: an integer >= 1)")
        if estimate_rule not in ESTIMATE_RULES:
            errors.append(f"estimate_rule={estimate_rule!r} (allowed: {', '.join(ESTIMATE_RULES)})")
        if errors:
            raise ValueError("RuntimeModel: " + "; ".join(errors))
        self.window, self.min_runs, self.estimate_rule = window, min_runs, estimate_rule
        self._levels: Dict[str, _Level] = {}
        self._max_keys = max_keys
        self._ratios = _Level(window, max_keys)
        self.observed = 0

    # ------------------------------------------------------------------------------------------------ learning
    def observe(self, f: RunFeatures, runtime_s: float, estimate_s: Optional[float] = None) -> None:
        """Learn one finished run of ``f``: ``runtime_s`` seconds at its size; ``estimate_s`` what its user had
        declared (None: nothing)."""
        if not (isinstance(runtime_s, (int, float)) and math.isfinite(runtime_s) and runtime_s >= 0):
            raise ValueError(f"runtime_s={runtime_s!r}: allowed: a finite number of seconds >= 0")
        for level, key in f.keys():
            lv = self._levels.get(level)
            if lv is None:
                lv = self._levels[level] = _Level(self.window, self._max_keys)
            lv.add(level, key, float(runtime_s))
        if estimate_s is not None and estimate_s > 0:
            ratio = float(runtime_s) / float(estimate_s)
            if f.user is not None:
                self._ratios.add("declared", f.user, ratio)
            self._ratios.add("declared", _EVERYONE, ratio)
        self.observed += 1

    # ---------------------------------------------------------------------------------------------- predicting
    def history(self, f: RunFeatures) -> Tuple[Basis, ...]:
        """The bases ``f`` has history at, most specific first: each level's key with at least ``min_runs`` runs
        (the cluster's with any)."""
        out = []
        for level, key in f.keys():
            lv = self._levels.get(level)
            b = lv.basis(level, key) if lv is not None else None
            if b is not None and (len(b.runtimes) >= self.min_runs or level == "cluster"):
                out.append(b)
        return tuple(out)

    def predict(self, f: RunFeatures, estimate_s: Optional[float] = None) -> Optional[RuntimeDist]:
        """The distribution of ``f``'s runtime (None: no history at all and no estimate), the declared
        ``estimate_s`` folded in by the model's ``estimate_rule``."""
        bases = self.history(f)
        if estimate_s is None:
            return RuntimeDist(bases) if bases else None
        est = float(estimate_s)
        if self.estimate_rule == "learn":
            # The user's own estimate errors, else everyone's.
            for who in ((f.user,) if f.user is not None else ()) + (_EVERYONE,):
                rb = self._ratios.basis("declared", who)
                if rb is not None and len(rb.runtimes) >= self.min_runs:
                    by = f"by {who}" if who != _EVERYONE else "by anyone"
                    scaled = Basis("declared", f"{human_s(est)} {by}", tuple(est * r for r in rb.runtimes))
                    return RuntimeDist((scaled,) + bases)
        if self.estimate_rule == "cap" and bases:
            capped = tuple(Basis(b.level, b.key, tuple(min(est, x) for x in b.runtimes)) for b in bases)
            return RuntimeDist(capped + point(est).bases)
        if self.estimate_rule == "learn" and bases and bases[0].median > 0:
            # No estimate errors known yet: the estimate as the median, spread as its most similar runs spread.
            b0 = bases[0]
            shaped = Basis("declared", f"{human_s(est)} shaped as {b0.key}",
                           tuple(est * x / b0.median for x in b0.runtimes))
            return RuntimeDist((shaped,) + bases)
        return RuntimeDist(point(est, key=f"the declared {human_s(est)}").bases + bases)

    def size(self) -> int:
        """Runs held in all (bounded by window x max_keys x levels)."""
        return sum(len(d) for lv in self._levels.values() for d in lv.runs.values()) + \
            sum(len(d) for d in self._ratios.runs.values())
