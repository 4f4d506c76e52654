"""A workload's predicted runtime: a distribution learned from similar finished work, conditional on service had.

This module owns ``RuntimeDist``, the immutable answer of ``raylane.runtimes.model.RuntimeModel.predict`` that a
driver attaches to a ``Workload`` (``Workload.predicted``) and that the scheduling core, the forecast and the
simulator read. It imports nothing of Raylane: the core reads a prediction without knowing how it was learned.

Words
- *runtime*: seconds of running a workload needs at its size, over all its attempts (wall time of its service,
  ``attained_gpu_s`` over its GPUs, at the end); its *GPU-time* is that times its GPUs.
- *basis*: one set of similar finished runs (``Basis``): a level of similarity (``LEVELS``, most specific first),
  the key at that level ("alice/pretrain-x") and the runtimes of its last runs, sorted. A distribution holds the
  bases that had enough runs, most specific first.
- *ran*: the seconds of service a workload has had. ``remaining(ran, q)`` is the q-quantile of the time it still
  needs *given that it ran that long*: the runs of the first basis that has at least ``MIN_TAIL`` runs longer than
  ``ran``, less ``ran``. Past every basis, the tail is taken as Pareto with index 1 (a run that has lasted t lasts
  as long again at the median: P(S > t + x | S > t) = t / (t + x)), the usual shape of job runtimes' tails.
- *declared*: a user's ``runtime_estimate``, folded in by the model (``RuntimeModel.predict``): where their past
  estimates have a known error, the distribution is the estimate times their past actual/estimate ratios.
"""
from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from typing import Optional, Sequence, Tuple

__all__ = ["Basis", "RuntimeDist", "LEVELS", "MIN_TAIL", "quantile", "human_s", "point"]

# Levels of similarity, most specific first (the model's keys; ``Basis.level``).
LEVELS = ("declared", "user-name", "entry", "team-class-shape", "class", "cluster")

# A basis answers for a workload that ran ``ran`` seconds only when this many of its runs lasted longer.
MIN_TAIL = 3


def quantile(sorted_values: Sequence[float], q: float) -> float:
    """The q-quantile of sorted values, linearly interpolated between order statistics (numpy's default)."""
    n = len(sorted_values)
    if n == 1:
        return sorted_values[0]
    x = q * (n - 1)
    i = int(x)
    if i >= n - 1:
        return sorted_values[-1]
    f = x - i
    return sorted_values[i] + f * (sorted_values[i + 1] - sorted_values[i])


def human_s(s: float) -> str:
    """A duration for a person: 45s, 12m, 2.1h, 3.0d."""
    if s < 90:
        return f"{s:.0f}s"
    if s < 5400:
        return f"{s / 60:.0f}m"
    if s < 2 * 86400:
        return f"{s / 3600:.1f}h"
    return f"{s / 86400:.1f}d"


@dataclass(frozen=True, slots=True)
class Basis:
    """Similar finished runs: ``level`` (one of ``LEVELS``), its ``key`` and their runtimes, sorted ascending."""

    level: str
    key: str
    runtimes: Tuple[float, ...]

    def describe(self) -> str:
        n = len(self.runtimes)
        what = "runs" if n != 1 else "run"
        if self.level == "declared":
            return f"declared {self.key}, corrected by {n} past estimates' errors: median {human_s(self.median)}"
        return f"{n} {what} of {self.key}: median {human_s(self.median)}"

    @property
    def median(self) -> float:
        return quantile(self.runtimes, 0.5)

    def tail(self, ran: float) -> int:
        """How many of its runs lasted longer than ``ran`` seconds."""
        return len(self.runtimes) - bisect.bisect_right(self.runtimes, ran)


@dataclass(frozen=True, slots=True)
class RuntimeDist:
    """What a workload's runtime is expected to be, from ``bases`` (most specific first; at least one)."""

    bases: Tuple[Basis, ...]

    def basis_at(self, ran: float = 0.0) -> Optional[Basis]:
        """The basis that answers for a workload that ran ``ran`` seconds (None: the Pareto tail does)."""
        for b in self.bases:
            # A declared estimate answers while the workload has run less than it.
            if b.tail(ran) >= MIN_TAIL or (b.level == "declared" and b.tail(ran) > 0):
                return b
        # Fewer runs than MIN_TAIL in every basis: the most specific one that still has a longer run.
        for b in self.bases:
            if b.tail(ran) > 0:
                return b
        return None

    def remaining(self, ran: float, q: float = 0.5) -> float:
        """The q-quantile of the seconds it still needs, given that it has run ``ran`` seconds (the module's
        words)."""
        ran = max(0.0, ran)
        b = self.basis_at(ran)
        if b is None:
            # Longer than every run seen: a Pareto tail of index 1 from ``ran``.
            if ran <= 0.0:
                return 0.0
            q = min(max(q, 1e-6), 1 - 1e-6)
            return ran * q / (1.0 - q)
        rt = b.runtimes
        i = bisect.bisect_right(rt, ran)
        return max(0.0, quantile(rt[i:], q) - ran)

    def gittins(self, ran: float, quantum: float = math.inf) -> float:
        """The Gittins index of a workload that ran ``ran`` seconds, per second of run: the most, over quanta up to
        ``quantum``, of the chance it ends within the quantum over the time it is expected to use of it
        (``sup P(S - ran <= d | S > ran) / E[min(S - ran, d) | S > ran]``, Gittins; Tiresias' 2D-Gittins orders by
        it). Past every basis (the Pareto tail), 1 / ran."""
        ran = max(0.0, ran)
        b = self.basis_at(ran)
        if b is None:
            return 1.0 / ran if ran > 0 else 0.0
        rt = b.runtimes
        i = bisect.bisect_right(rt, ran)
        rem = [x - ran for x in rt[i:]]
        m = len(rem)
        best, before = 0.0, 0.0
        for k, r in enumerate(rem):
            if r > quantum:
                break
            # Chance of ending within r: (k+1)/m; expected use of the quantum r: (sum of the shorter + r for the rest)/m.
            used = before + r * (m - k)
            if used > 0:
                best = max(best, (k + 1) / used)
            else:
                return math.inf
            before += r
        return best

    def runtime(self, q: float = 0.5) -> float:
        """The q-quantile of its whole runtime, before it starts."""
        return self.remaining(0.0, q)

    def describe(self, ran: float = 0.0) -> str:
        """What the prediction rests on, for a person: "14 runs of alice/pretrain-x: median 2.1h"."""
        b = self.basis_at(ran)
        if b is None:
            longest = max(max(x.runtimes) for x in self.bases)
            return (f"has run {human_s(ran)}, longer than every similar run ({human_s(longest)}): "
                    f"expected to run as long again at the median")
        text = b.describe()
        if ran > 0:
            text += f"; {b.tail(ran)} of them ran longer than its {human_s(ran)}"
        return text

    @property
    def level(self) -> str:
        b = self.basis_at(0.0)
        return b.level if b is not None else "tail"


def point(seconds: float, level: str = "declared", key: str = "the user's estimate") -> RuntimeDist:
    """A distribution of one value: what a declared estimate is when nothing says how wrong it may be."""
    if not (isinstance(seconds, (int, float)) and math.isfinite(seconds) and seconds >= 0):
        raise ValueError(f"runtime {seconds!r}: allowed: a finite number of seconds >= 0")
    return RuntimeDist((Basis(level, key, (float(seconds),)),))
