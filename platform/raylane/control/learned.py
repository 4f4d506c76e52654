"""The control plane's runtime history: a ``raylane.runtimes.RuntimeModel`` fed from workload records.

This module owns ``RuntimeBook``: the model, and which records it has learned from. The state machine hands it
every record whose journal entry moved it (``seen``, live and while the journal is replayed at a restart, so a
restart rebuilds the same model from the same entries) and asks it for a workload's prediction when it builds the
core's ``Workload`` (``predict``). Only work that ended of itself teaches it (SUCCEEDED or FAILED: a cancel says when
somebody stopped it, a rejection never ran).

Words
- *runtime* of a record: the seconds its leases ran over all attempts (``Record.past_run_s`` once it has ended:
  from each admission to the lease's end), as ``raylane.runtimes`` counts it.
- *entry*: the digest of a workload's entrypoint (or command) and config: the same code with the same settings.
"""
from __future__ import annotations

from typing import Dict, Optional

from raylane.config.fields import parse_duration
from raylane.control.records import Record, State
from raylane.runtimes import RunFeatures, RuntimeDist, RuntimeModel, entry_digest

__all__ = ["RuntimeBook", "features_of", "estimate_of"]

_TAUGHT = (State.SUCCEEDED, State.FAILED)


def features_of(rec: Record) -> RunFeatures:
    """What the model keys ``rec`` on: its owner and name, its code and config, team, class and gang shape."""
    spec = rec.spec
    gang = spec.get("gang") or {}
    workers = gang.get("workers", 1)
    if isinstance(workers, dict):  # an elastic gang: its shape at the size it is submitted at
        workers = workers.get("min", 1)
    per = (gang.get("resources") or {}).get("gpu", 0) or 0
    entry = entry_digest(spec.get("entrypoint") or spec.get("command"), spec.get("config"))
    return RunFeatures(team=rec.team, cls=rec.cls, gpus=float(per) * int(workers), workers=int(workers),
                       user=_owner(rec), name=spec.get("name"), entry=entry)


def _owner(rec: Record) -> Optional[str]:
    # As ``Workload.user``: the spec's ``run.owner``, which submit sets to the authenticated user under the gate.
    run = rec.spec.get("run")
    return (run.get("owner") if isinstance(run, dict) else None) or rec.owner or None


def estimate_of(rec: Record) -> Optional[float]:
    """The runtime its spec declares, in seconds (None: none, or none that reads as a duration)."""
    value = rec.spec.get("runtime_estimate")
    if value is None:
        return None
    try:
        return float(parse_duration(value))
    except (TypeError, ValueError):
        return None


class RuntimeBook:
    """The model and the records it learned from (module docstring)."""

    def __init__(self, model: Optional[RuntimeModel] = None):
        self.model = model or RuntimeModel()
        self._taught: set = set()

    def seen(self, rec: Record) -> None:
        """``rec`` was just changed by an entry: learn from it once it has ended of itself."""
        if rec.state not in _TAUGHT or rec.id in self._taught:
            return
        self._taught.add(rec.id)
        if rec.attempts == 0:
            return  # it never ran (a failure before any admission)
        self.model.observe(features_of(rec), rec.past_run_s, estimate_of(rec))

    def predict(self, rec: Record) -> Optional[RuntimeDist]:
        """``rec``'s runtime as learned so far, its declared estimate folded in (None: nothing to go by)."""
        return self.model.predict(features_of(rec), estimate_of(rec))

    def forget(self, ids) -> None:
        """Records dropped from memory (archived): their runs stay learned; only the bookkeeping goes."""
        self._taught.difference_update(ids)

    def stats(self) -> Dict[str, int]:
        return {"runs_learned": self.model.observed, "values_held": self.model.size()}
