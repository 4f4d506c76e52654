"""Ordering policies, registered by name in ``ORDERINGS``: fifo, priority, fair-share, las, srtf, gittins, qssf."""
from raylane.scheduling.ordering import _fair_share, _fifo, _gittins, _las, _priority, _qssf, _srtf  # noqa: F401  (registration)
from raylane.scheduling.ordering.base import ORDERINGS, OrderingPolicy, StaticOrdering, TeamView

__all__ = ["ORDERINGS", "OrderingPolicy", "StaticOrdering", "TeamView"]
