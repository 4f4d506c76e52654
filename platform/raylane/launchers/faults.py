"""The fault drills under their first name: they live in ``raylane.faults``, below both ``raylane.train`` (which
calls them from the wrapped report) and the launchers (which check ``config.fault``)."""
from raylane.faults import FAULT_KEYS, Faults, InjectedCrash

__all__ = ["Faults", "InjectedCrash", "FAULT_KEYS"]
