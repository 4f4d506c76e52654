"""Raylane's pure scheduling core: it decides, on an immutable snapshot, what runs next and where.

No Ray import, no clock, no randomness: the control plane, the simulator, the queue forecast and the tests' driver
all drive the same ``cycle`` and carry out its result through ``raylane.scheduling.apply``.
Policies are looked up by name in one registry per axis: ``ORDERINGS``, ``ADMISSIONS``, ``PLACEMENTS``,
``BACKFILLS``, ``PREEMPTIONS`` (and how preemption prices its victims, ``VICTIM_COSTS``).
"""
from raylane.scheduling.admission import ADMISSIONS, AdmissionPolicy, QuotaLedger
from raylane.scheduling.backfill import BACKFILLS, BackfillPolicy, Reservation
from raylane.scheduling.capacity import Capacity
from raylane.scheduling.cycle import MAX_EXAMINED, check_feasible, cycle, team_usage
from raylane.scheduling.ordering import ORDERINGS, OrderingPolicy
from raylane.scheduling.placement import PLACEMENTS, RAY_STRATEGY, PlacementPolicy, place
from raylane.scheduling.preemption import PREEMPTIONS, VICTIM_COSTS, PreemptionPolicy, find_victims
from raylane.scheduling.state import ClusterState
from raylane.scheduling.working import Holdings, Working
from raylane.scheduling.types import *  # noqa: F401,F403
from raylane.scheduling.types import __all__ as _types_all  # type: ignore[attr-defined]

__all__ = [
    "ADMISSIONS", "AdmissionPolicy", "QuotaLedger", "BACKFILLS", "BackfillPolicy", "Reservation", "Capacity",
    "MAX_EXAMINED", "check_feasible", "cycle", "team_usage", "ORDERINGS", "OrderingPolicy", "PLACEMENTS",
    "RAY_STRATEGY", "PlacementPolicy", "place", "PREEMPTIONS", "VICTIM_COSTS", "PreemptionPolicy", "find_victims",
    "ClusterState", "Holdings", "Working",
] + list(_types_all)
