"""What a queue ETA is, whichever way it is computed: ``Eta``, the phases of a wait (``CapacityWait``, ``QuotaWait``,
``QueueWait``, ``PreemptionWait``) and the runtime rules both forecasting methods share (``expected_end``,
``remaining_runtime``). ``raylane.forecast.replay`` (the replay) and ``raylane.forecast.plan`` (the reservation
plan) return these; ``raylane.forecast`` re-exports them, with ``describe``, which renders one.

Words
- *expected end* of a lease: its start plus what is left of its runtime estimate (the estimate less the service it
  had in earlier attempts, ``attained_gpu_s`` over its GPUs); without an estimate, plus its class's runtime
  (``class_runtime_s``) or else ``default_runtime_s``. A lease already past that end has not ended: it is expected
  to run on for ``overrun`` of the time it has run (at least ``min_overrun_s``).

Pure: imports only the scheduling core's types and the standard library.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional, Tuple, Union

from raylane.scheduling.types import Lease, Workload

__all__ = ["Eta", "CapacityWait", "QuotaWait", "QueueWait", "PreemptionWait", "Wait", "expected_end",
           "remaining_runtime", "knows_runtime", "DEFAULT_HORIZON_S"]

DEFAULT_HORIZON_S = 7 * 86400.0


# ------------------------------------------------------------------------------------------------------ waits


@dataclass(frozen=True, slots=True)
class CapacityWait:
    """Waits for room for its gang (``gpus`` GPUs in all) on nodes in service, until ``at``, when ``ended`` end."""

    gpus: float
    at: float
    ended: Tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class QuotaWait:
    """Waits for ``amount`` more of ``resource`` under ``team``'s quota, until ``at``, when ``ended`` end."""

    team: str
    resource: str
    amount: float
    at: float
    ended: Tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class QueueWait:
    """Could start but for its turn: work before it in queue order goes first (``head``: the one it waits behind,
    when the cycle named it), until ``at``."""

    head: Optional[str]
    at: float
    ended: Tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class PreemptionWait:
    """Waits for ``victims``, preempted for it, to stop, until ``at``."""

    victims: Tuple[str, ...]
    at: float
    ended: Tuple[str, ...] = ()


Wait = Union[CapacityWait, QuotaWait, QueueWait, PreemptionWait]


@dataclass(frozen=True, slots=True)
class Eta:
    """The forecast of one pending workload, on the clock of ``now``. ``finish`` is None without a runtime estimate
    of its own; ``start`` is None when it does not start within the horizon (``note`` says why)."""

    workload_id: str
    start: Optional[float]
    finish: Optional[float]
    waits_for: Tuple[Wait, ...] = ()
    note: str = ""
    # Where learned runtimes are known (``forecast.forecast_interval``): the start if work runs for its runtimes'
    # 10th and 90th percentiles (None: not known, or not within the horizon), and what its own runtime rests on.
    start_low: Optional[float] = None
    start_high: Optional[float] = None
    basis: str = ""


# ----------------------------------------------------------------------------------------------- runtimes


def expected_end(lease: Lease, now: float, *, default_runtime_s: float, class_runtime_s: Mapping[str, float] = {},
                 overrun: float = 0.25, min_overrun_s: float = 300.0, q: float = 0.5) -> float:
    """When a running ``lease`` is expected to end, seen at ``now`` (the module's *expected end*). With a learned
    prediction (``Workload.predicted``): ``now`` plus the q-quantile of its remaining time given all the service it
    has had by ``now`` (``RuntimeDist.remaining``); the overrun rule is then not needed."""
    w = lease.workload
    if w.predicted is not None:
        ran = w.ran_s + max(0.0, now - lease.start_time)
        return now + w.predicted.remaining(ran, q)
    end = lease.start_time + remaining_runtime(w, default_runtime_s, class_runtime_s)
    if end > now:
        return end
    return now + max(min_overrun_s, overrun * (now - lease.start_time))


def remaining_runtime(w: Workload, default_runtime_s: float, class_runtime_s: Mapping[str, float],
                      q: float = 0.5) -> float:
    """Seconds of running ``w`` still needs once started: the q-quantile of its prediction given the service it had,
    else its estimate less that service, else its class's runtime or the default."""
    if w.predicted is not None:
        return w.predicted.remaining(w.ran_s, q)
    est = w.runtime_estimate_s
    if est is None:
        return class_runtime_s.get(w.cls.name, default_runtime_s)
    gpus = w.gang.total.gpu
    return max(0.0, est - (w.attained_gpu_s / gpus if gpus > 0 else 0.0))


def knows_runtime(w: Workload) -> bool:
    """Whether a forecast can say when ``w`` finishes: it has an estimate or a learned prediction."""
    return w.runtime_estimate_s is not None or w.predicted is not None
