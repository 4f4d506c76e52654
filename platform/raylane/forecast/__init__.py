"""Queue ETA: when each pending workload is expected to start (and finish), and what it waits for until then.

Pure, like ``raylane.scheduling``: no Ray, no clock, no randomness. Three modules, imported in this order:

- ``types``: what an ETA is, whichever way it is computed (``Eta``, the phases of a wait, ``expected_end`` and the
  other runtime rules both methods share).
- ``plan``: the reservation plan (``forecast(..., method="plan")``), as Slurm's ``squeue --start``.
- ``replay``: ``forecast``, the live ``cycle`` replayed over a copy of the state in simulated time, which hands
  ``method="plan"`` to ``plan``; ``forecast_interval``, ``expected_arrivals`` and ``describe``.

The names below are the package's public surface; ``from raylane.forecast import forecast`` is how callers reach it.
A test that replaces a function the forecast calls patches it where it is looked up (``raylane.forecast.replay``).
"""
from raylane.forecast.replay import (
    DEFAULT_HORIZON_S,
    MAX_EXAMINED,
    MAX_WAITS,
    METHODS,
    CapacityWait,
    Eta,
    PreemptionWait,
    QueueWait,
    QuotaWait,
    Wait,
    describe,
    expected_arrivals,
    expected_end,
    forecast,
    forecast_interval,
)

__all__ = ["Eta", "CapacityWait", "QuotaWait", "QueueWait", "PreemptionWait", "Wait", "forecast", "describe",
           "expected_end", "expected_arrivals", "forecast_interval", "DEFAULT_HORIZON_S", "MAX_WAITS", "METHODS",
           "MAX_EXAMINED"]
