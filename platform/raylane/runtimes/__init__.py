"""Runtimes learned from history: what the duration-aware parts of Raylane read when users give no estimate.

``RuntimeModel`` (``model``) learns online from finished work; ``RuntimeDist`` (``dist``) is its answer for one
workload, conditional on the service it has had, with the basis it rests on. Pure Python, no Ray: the scheduling
core, the forecast, the simulator and the control plane all use it alike (docs/eta.md).
"""
from raylane.runtimes.dist import LEVELS, MIN_TAIL, Basis, RuntimeDist, human_s, point, quantile
from raylane.runtimes.model import (DEFAULT_MAX_KEYS, DEFAULT_WINDOW, ESTIMATE_RULES, RunFeatures, RuntimeModel,
                                    entry_digest)

__all__ = ["Basis", "RuntimeDist", "RunFeatures", "RuntimeModel", "LEVELS", "MIN_TAIL", "ESTIMATE_RULES",
           "DEFAULT_WINDOW", "DEFAULT_MAX_KEYS", "entry_digest", "human_s", "point", "quantile"]
