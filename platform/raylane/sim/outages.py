"""Node outages a replay plays: failures (a list, or a rate per node) and scheduled drains.

This module owns what an outage is and how one is written (command-line flags, an events file) and drawn (a mean
time between failures per node, seeded). The engine applies them (``engine.Simulator``); the scheduling core only
sees their effect: a failed node is removed from the ``ClusterState`` (``remove_node``) and added back when it is
repaired; a draining node is unschedulable (``set_schedulable``) while its leases are stopped.

Words
- *failure*: the node dies at ``at``; every lease with a worker there ends at once and is requeued (keeping its
  submit time), losing the work since its last checkpoint. It is back, empty, ``down_for`` seconds later (None:
  never).
- *drain*: from ``at`` the node gets no new leases; the leases on it are preempted gracefully (told to stop, as a
  preemption of the scheduler is: they stop after the stop delay and keep the work up to their last checkpoint),
  at once or after the drain deadline (``Outages.drain_deadline_s``; None: never, the drain waits for them to end).
  The node is *drained* when no lease is left on it; the *drain time* is from ``at`` to then. It is back in
  service ``down_for`` seconds after ``at`` (None: never).
- *MTBF*: mean time between failures of one node (exponential), with a fixed repair time; each node draws from a
  generator of its own, seeded by the replay's seed and the node id, so every policy replayed with one seed meets
  the same failures.
"""
from __future__ import annotations

import csv
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, List, Optional, Tuple, Union

from raylane.config.fields import parse_duration
from raylane.errors import NotFoundError, ValidationError

__all__ = ["NodeFailure", "NodeDrain", "Outages", "parse_outage", "load_node_events", "next_failure", "node_rng",
           "EVENTS_COLUMNS"]

EVENTS_COLUMNS = ("time", "node", "event", "duration")
_EVENTS = ("fail", "drain")


@dataclass(frozen=True)
class NodeFailure:
    node: str
    at: float
    down_for: Optional[float] = None


@dataclass(frozen=True)
class NodeDrain:
    node: str
    at: float
    down_for: Optional[float] = None


@dataclass(frozen=True)
class Outages:
    """Every outage of one replay. ``mtbf_s``: draw failures per node at this mean (None: none drawn), each
    repaired after ``repair_s``. ``drain_deadline_s``: seconds a drain lets leases run before preempting them."""

    failures: Tuple[NodeFailure, ...] = ()
    drains: Tuple[NodeDrain, ...] = ()
    mtbf_s: Optional[float] = None
    repair_s: float = 3600.0
    drain_deadline_s: Optional[float] = 0.0

    def __post_init__(self):
        errors = []
        if self.mtbf_s is not None and not self.mtbf_s > 0:
            errors.append(("mtbf", self.mtbf_s, "a duration > 0"))
        if not self.repair_s >= 0:
            errors.append(("repair", self.repair_s, "a duration >= 0"))
        if self.drain_deadline_s is not None and not self.drain_deadline_s >= 0:
            errors.append(("drain_deadline", self.drain_deadline_s, "a duration >= 0, or none"))
        if errors:
            raise ValidationError("outages", errors)

    @property
    def any(self) -> bool:
        return bool(self.failures or self.drains or self.mtbf_s)

    def check_nodes(self, node_ids: Iterable[str]) -> None:
        """Every outage names a node of the cluster; else one error listing them all, with some known ids."""
        known = set(node_ids)
        bad = [(f"{kind} of {o.node!r} at {o.at:g}s", o.node, "a node of the cluster, e.g. "
                + ", ".join(sorted(known)[:3]))
               for kind, items in (("failure", self.failures), ("drain", self.drains)) for o in items
               if o.node not in known]
        if bad:
            raise ValidationError("outages", bad)


def next_failure(rng: random.Random, after: float, mtbf_s: float) -> float:
    """When a node that is up since ``after`` fails next (exponential, mean ``mtbf_s``)."""
    return after + rng.expovariate(1.0 / mtbf_s)


def node_rng(seed: int, node_id: str) -> random.Random:
    return random.Random(f"failures/{seed}/{node_id}")


def _duration(text: str, what: str, errors: list, allow_none: bool = False) -> Optional[float]:
    text = text.strip()
    if allow_none and text in ("", "none", "never"):
        return None
    try:
        return parse_duration(text)
    except ValueError:
        errors.append((what, text, "a duration like 90, 30m or 2h" + (", or none" if allow_none else "")))
        return None


def parse_outage(kind: str, value: str) -> Union[NodeFailure, NodeDrain]:
    """``NODE@TIME[+DOWN]`` (e.g. ``node-003@2h+30m``): a failure or a drain of NODE at TIME, for DOWN (a
    failure or drain without DOWN lasts to the end of the replay)."""
    flag = f"--{kind}"
    errors: list = []
    node, at_sep, rest = value.partition("@")
    if not node or not at_sep or not rest:
        raise ValidationError("flags", [(flag, value, "NODE@TIME or NODE@TIME+DOWN, e.g. node-003@2h+30m")])
    at_text, _, down_text = rest.partition("+")
    at = _duration(at_text, flag, errors)
    down = _duration(down_text, flag, errors, allow_none=True)
    if errors:
        raise ValidationError("flags", errors)
    return (NodeFailure if kind == "fail" else NodeDrain)(node, at, down)


def load_node_events(path: Union[str, Path]) -> Tuple[List[NodeFailure], List[NodeDrain]]:
    """A CSV file of outages with the columns ``time,node,event,duration`` (event: fail or drain; time and duration
    as seconds or durations like 2h; an empty duration: to the end of the replay). Every bad row is reported."""
    p = Path(path)
    if not p.exists():
        raise NotFoundError(f"node events file {p} does not exist")
    failures: List[NodeFailure] = []
    drains: List[NodeDrain] = []
    errors: list = []
    with p.open(newline="") as f:
        reader = csv.DictReader(f)
        cols = tuple(reader.fieldnames or ())
        missing = [c for c in EVENTS_COLUMNS if c not in cols]
        extra = [c for c in cols if c not in EVENTS_COLUMNS]
        if missing or extra:
            raise ValidationError(str(p), [("(header)", ",".join(cols), "the columns " + ",".join(EVENTS_COLUMNS))])
        for i, row in enumerate(reader, start=2):
            row_errors: list = []
            at = _duration(row["time"] or "", f"row {i}, column time", row_errors)
            down = _duration(row["duration"] or "", f"row {i}, column duration", row_errors, allow_none=True)
            event = (row["event"] or "").strip()
            node = (row["node"] or "").strip()
            if event not in _EVENTS:
                row_errors.append((f"row {i}, column event", event, "one of " + ", ".join(_EVENTS)))
            if not node:
                row_errors.append((f"row {i}, column node", node, "a node id"))
            if row_errors:
                errors += row_errors
                continue
            (failures if event == "fail" else drains).append(
                (NodeFailure if event == "fail" else NodeDrain)(node, at, down))
    if errors:
        raise ValidationError(str(p), errors)
    return failures, drains
