"""What the control plane's state machine (``raylane.control.state``) asks of Ray: its effects.

Each is a plain value. The control actor carries them out in the order they were decided, after committing the
journal entries that decided them (journal first, then act); a test reads them as the record of what would have
been done. An effect that fails comes back as an event (``ControlState.reservation_failed``), never as an exception
in the state machine.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Optional, Tuple, Union

from raylane.control.ends import CloseRun


@dataclass(frozen=True)
class Reserve:
    """Create the detached placement group ``pg_name``: one bundle per worker, bundle *i* pinned to
    ``placement[i]``; report it placed (``reservation_ready``) or not within the admission timeout
    (``reservation_failed``)."""
    workload_id: str
    pg_name: str
    bundle: Dict[str, float]
    strategy: str
    placement: Tuple[str, ...]


@dataclass(frozen=True)
class RemoveReservation:
    """Remove the placement group ``pg_name`` (gone already: nothing to do)."""
    pg_name: str


@dataclass(frozen=True)
class KillWorkers:
    """Kill a gang's registered worker actors (``register_workers``); dead ones are skipped."""
    workload_id: str
    handles: Tuple[Any, ...]


@dataclass(frozen=True)
class StopJob:
    """Stop a Ray job (gone already: nothing to do)."""
    job_id: str


@dataclass(frozen=True)
class RunProbes:
    """Run the policy's health probe on each node, pinned there, within ``timeout_s``; the verdicts come back in
    one ``probed`` event."""
    node_ids: Tuple[str, ...]
    probe: Any
    conditions_dir: Optional[str]
    timeout_s: float
    gpus: Tuple[float, ...]


@dataclass(frozen=True)
class Wake:
    """Wake the callers waiting for this workload's admission (``wait_admission``)."""
    workload_id: str


@dataclass(frozen=True)
class RequestNodes:
    """Ask Ray's autoscaler for room for ``bundles`` (each with the label selector at the same index of
    ``selectors``), replacing the previous ask, kept for ``expire_s`` unless asked again (``raylane.control.
    state_scale``); no bundles: withdraw the ask."""
    bundles: Tuple[Dict[str, float], ...]
    selectors: Tuple[Dict[str, str], ...]
    expire_s: float


@dataclass(frozen=True)
class PinCheckpoint:
    """Copy the checkpoint directory ``source`` to ``path`` (its pinned copy, out of the reach of the source's
    retention: ``raylane.control.checkpoints.pin_copy``, hard links where it can; there already: nothing to do),
    then report it (``ControlState.pin_copied``: done, or what stopped it)."""
    workload_id: str
    source: str
    path: str


@dataclass(frozen=True)
class DropPin:
    """Remove the pinned copy of a checkpoint at ``path`` (no consumer holds it any more; gone already: nothing
    to do)."""
    path: str


Effect = Union[Reserve, RemoveReservation, KillWorkers, StopJob, RunProbes, Wake, CloseRun, RequestNodes,
               PinCheckpoint, DropPin]
