"""What the control plane remembers about each workload, rebuilt from the journal on every start.

A ``Record`` is the control actor's view of one submission across its whole life: pending, admitted (holding a
reservation), running, preempting, and its end. Only the control actor changes records, and only by applying
journal entries (``apply``), so the live path and recovery run the same code.

States: PENDING -> ADMITTED -> RUNNING -> (PREEMPTING -> PENDING)* -> SUCCEEDED | FAILED | CANCELLED;
REJECTED at submit. A gang that reached its class's run limit (``run_limit``) is PREEMPTING too: asked to stop, then
PENDING again (``on_max_runtime: requeue``) or FAILED (``stop``). An elastic gang also goes RUNNING -> RESIZING -> ADMITTED (the same lease at its new size): the
gang saves a checkpoint and stops, and its driver restarts it at the size the scheduling core chose.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field, fields
from typing import Any, Callable, Dict, FrozenSet, List, Optional, Tuple

from raylane.control.journal import Entry, Kind


class State(str, enum.Enum):
    """A workload's state. A str enum: a reply carries its value (``public``), and a value read from a reply compares
    equal to its member (``rec["state"] == State.RUNNING``); turn one into the member with ``State(text)``."""

    PENDING = "PENDING"
    ADMITTED = "ADMITTED"
    RUNNING = "RUNNING"
    PREEMPTING = "PREEMPTING"
    RESIZING = "RESIZING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    REJECTED = "REJECTED"

    @property
    def terminal(self) -> bool:
        """It has ended and never leaves this state (``TERMINAL``)."""
        return self in TERMINAL

    @property
    def holds_lease(self) -> bool:
        return self in (State.ADMITTED, State.RUNNING, State.PREEMPTING, State.RESIZING)

    @property
    def stopping(self) -> bool:
        """Its gang is asked to save a checkpoint and stop: preempted, or resized."""
        return self in (State.PREEMPTING, State.RESIZING)


# The states a workload ends in, as values: the one list of them. ``State.terminal`` reads it, and so does a caller
# that holds a state as text (a reply's ``state``).
TERMINAL: FrozenSet[str] = frozenset(s.value for s in (State.SUCCEEDED, State.FAILED, State.CANCELLED, State.REJECTED))


@dataclass
class Record:
    id: str
    spec: Dict[str, Any]
    submit_time: float
    state: State = State.PENDING
    reason: str = ""
    reason_data: Dict[str, Any] = field(default_factory=dict)
    position: Optional[int] = None
    placement: Tuple[str, ...] = ()
    # The GPU devices each worker holds (raylane.scheduling.types.Lease.devices), journaled with the admission.
    devices: Tuple[Tuple[int, ...], ...] = ()
    pg_name: Optional[str] = None
    admitted_at: Optional[float] = None
    attained_gpu_s: float = 0.0
    last_checkpoint: Optional[float] = None
    step: Optional[int] = None
    preemptions: int = 0
    restarts: int = 0
    attempts: int = 0
    job_id: Optional[str] = None
    # The authenticated user that submitted it (raylane.control.gate), never what its spec claims.
    owner: str = ""
    stop_deadline: Optional[float] = None
    outcome: str = ""
    ended_at: Optional[float] = None
    # Progress a workload's driver reports (a sweep's running/paused/finished trials, a deployment's replicas).
    detail: str = ""
    # When it last entered the queue: its submit time, or the time it was requeued after a preemption.
    queued_since: Optional[float] = None
    events: List[Tuple[float, str]] = field(default_factory=list)
    # Checkpoints its gang reported: step -> directory (Ray Train's retention may have deleted the older ones).
    checkpoints: Dict[int, str] = field(default_factory=dict)
    # Its claim on another workload's checkpoint (config.init_from: {workload, step}; raylane.control.checkpoints):
    # source id, step (None: latest at the start), path of the pinned copy once made, released once loaded.
    pin: Dict[str, Any] = field(default_factory=dict)
    # The resize under way (state RESIZING): from_workers, to_workers, placement and devices at the new size, reason.
    resize: Dict[str, Any] = field(default_factory=dict)
    resizes: int = 0
    # Run limits (raylane.scheduling.runlimit): when its current attempt was admitted (a resize does not change it),
    # the seconds its earlier attempts held their leases, and the limit reached (``run_limit`` entry: action,
    # ran_s, limit_s, reason) while its gang stops for it; ``run_limits``: how many times one was reached.
    attempt_started: Optional[float] = None
    past_run_s: float = 0.0
    run_limit: Dict[str, Any] = field(default_factory=dict)
    run_limits: int = 0
    # The MLflow run its driver named (``mlflow_run_id`` of a report), or why the driver could not start one: a gang
    # may start before the run exists, and its workers wait for one or the other (``raylane.train``).
    mlflow_run_id: Optional[str] = None
    mlflow_run_error: Optional[str] = None
    mlflow_uri: Optional[str] = None  # the store the driver named with its run (None: the cluster's default)
    # After an end the driver did not report itself (a cancel, a Ray job that ended or vanished): when its Ray job is
    # stopped if its driver is still there (a cancel gives the driver this long to end its run and exit), and whether
    # its MLflow run is still to be closed (``raylane.control.ends``). Cleared by an ``event`` saying it was done.
    job_stop_at: Optional[float] = None
    run_to_close: bool = False

    def _name_run(self, d: Dict[str, Any]) -> None:
        if d.get("mlflow_run_id"):
            self.mlflow_run_id, self.mlflow_run_error = d["mlflow_run_id"], None
            self.mlflow_uri = d.get("mlflow_uri") or self.mlflow_uri
        elif d.get("mlflow_run_error"):
            self.mlflow_run_error = d["mlflow_run_error"]

    @property
    def workers(self) -> int:
        """How many workers its lease holds (one placement node per worker); 0 without a lease."""
        return len(self.placement)

    @property
    def team(self) -> str:
        return self.spec.get("team", "")

    @property
    def cls(self) -> str:
        return self.spec.get("class", "")

    def apply(self, e: Entry) -> None:
        """Change this record as the journal entry says. The single place where record state moves: each kind's
        step is one method below (``_APPLY``). Kinds that are not a workload's (and any an older release wrote)
        change nothing; a note is kept whatever the kind."""
        step = _APPLY.get(e.kind)
        if step is not None:
            step(self, e)
        note = e.data.get("note")
        if note:
            self.events.append((e.ts, note))

    def _submitted(self, e: Entry) -> None:
        d = e.data
        self.owner = d.get("owner") or (d.get("spec", {}).get("run") or {}).get("owner") or ""

    def _rejected(self, e: Entry) -> None:
        self.state, self.reason, self.ended_at = State.REJECTED, e.data.get("reason", ""), e.ts

    def _admitted(self, e: Entry) -> None:
        self._hold(e)
        self.attempts += 1
        self.attempt_started, self.run_limit = e.ts, {}
        self.reason, self.position, self.reason_data = "", None, {}

    def _running(self, e: Entry) -> None:
        self.state = State.RUNNING
        self.job_id = e.data.get("job_id", self.job_id)
        self._name_run(e.data)

    def _event(self, e: Entry) -> None:
        d = e.data
        self.restarts += 1 if d.get("restart") else 0
        if "detail" in d:
            self.detail = d["detail"]
        self._name_run(d)
        if d.get("job_stopped"):
            self.job_stop_at = None
        if d.get("mlflow_run_closed"):
            self.run_to_close, self.job_stop_at = False, None

    def _checkpointed(self, e: Entry) -> None:
        d = e.data
        self.last_checkpoint = e.ts
        self.step = d.get("step", self.step)
        if d.get("path") and d.get("step") is not None:
            self.checkpoints[int(d["step"])] = d["path"]

    def _pinned(self, e: Entry) -> None:
        d = e.data
        self.pin = {"source": d["source"], "step": d.get("step"), "path": d.get("path"), "released": False}

    def _unpinned(self, e: Entry) -> None:
        self.pin = {**self.pin, "released": True}

    def _preempting(self, e: Entry) -> None:
        d = e.data
        self.state = State.PREEMPTING
        self.stop_deadline = d.get("deadline")
        self.preemptions += 1 if d.get("preemption", True) else 0
        self.resize = {}  # a preemption during a resize stops the gang: it is not restarted at the new size

    def _run_limited(self, e: Entry) -> None:
        d = e.data
        self.state = State.PREEMPTING
        self.stop_deadline = d.get("deadline")
        self.run_limit = {k: d.get(k) for k in ("action", "ran_s", "limit_s", "reason")}
        self.reason = d.get("reason", "")
        self.run_limits += 1
        self.resize = {}

    def _resizing(self, e: Entry) -> None:
        d = e.data
        self.state = State.RESIZING
        self.stop_deadline = d.get("deadline")
        self.resize = {k: d[k] for k in ("from_workers", "to_workers", "placement", "devices", "reason")}
        self.attained_gpu_s = d.get("attained_gpu_s", self.attained_gpu_s)
        if d["to_workers"] > d["from_workers"]:
            # Growth is booked at once (the new workers' capacity is held while the gang stops and restarts);
            # a shrink keeps the whole gang's until it has stopped.
            self.placement = tuple(d["placement"])
            self.devices = tuple(tuple(x) for x in d.get("devices") or ())

    def _resized(self, e: Entry) -> None:
        d = e.data
        self._hold(e)
        self.attained_gpu_s = d.get("attained_gpu_s", self.attained_gpu_s)
        self.step = d.get("step", self.step)
        self.stop_deadline = None
        self.resize = {}
        self.resizes += 1

    def _requeued(self, e: Entry) -> None:
        d = e.data
        self.state = State.PENDING
        self.queued_since = e.ts
        self.attained_gpu_s = d.get("attained_gpu_s", self.attained_gpu_s)
        self.step = d.get("step", self.step)
        self.restarts += 1 if d.get("restart") else 0
        self.placement, self.pg_name, self.admitted_at, self.stop_deadline = (), None, None, None
        self.devices = ()
        self.resize = {}
        self._attempt_over(e)

    def _finished(self, e: Entry) -> None:
        self._end(e, State(e.data.get("state", State.SUCCEEDED.value)))

    def _cancelled(self, e: Entry) -> None:
        self._end(e, State.CANCELLED)

    def _end(self, e: Entry, state: State) -> None:
        d = e.data
        self.state = state
        self.outcome = d.get("outcome", "")
        self.step = self.step if d.get("step") is None else d["step"]  # a failure's release may not know it
        self.ended_at = e.ts
        self.stop_deadline = None
        self.job_stop_at = d.get("job_stop_at")
        self.run_to_close = bool(d.get("close_run"))
        self._attempt_over(e)

    def _attempt_over(self, e: Entry) -> None:
        """Its lease ended (a requeue or an end): the attempt's time joins that of the earlier ones."""
        if self.attempt_started is not None:
            self.past_run_s += max(0.0, e.ts - self.attempt_started)
        self.attempt_started = None

    def _hold(self, e: Entry) -> None:
        """A lease (an admission, or the same lease at its new size after a resize): its nodes, devices and
        reservation, from the entry's time."""
        d = e.data
        self.state = State.ADMITTED
        self.placement = tuple(d["placement"])
        self.devices = tuple(tuple(x) for x in d.get("devices") or ())
        self.pg_name = d.get("pg_name")
        self.admitted_at = e.ts

    def public(self) -> Dict[str, Any]:
        """The record as a reply's dict: its fields (containers copied one level: the reply is serialized as it
        leaves the actor, so a deep copy of the spec on every reply bought nothing), state, team, class, kind."""
        out = {f.name: _shallow(getattr(self, f.name)) for f in fields(self)}
        out["state"] = self.state.value
        out["team"] = self.team
        out["class"] = self.cls
        out["kind"] = self.spec.get("kind", "train")
        out["workers"] = self.workers
        return out


# Each workload kind's step in ``Record.apply``. Keyed by ``Kind``: an entry read back carries the kind's text, which
# finds the same step (a str enum hashes and compares as its value).
_APPLY: Dict[Kind, Callable[[Record, Entry], None]] = {
    Kind.SUBMITTED: Record._submitted,
    Kind.REJECTED: Record._rejected,
    Kind.ADMITTED: Record._admitted,
    Kind.RUNNING: Record._running,
    Kind.EVENT: Record._event,
    Kind.CHECKPOINTED: Record._checkpointed,
    Kind.PINNED: Record._pinned,
    Kind.UNPINNED: Record._unpinned,
    Kind.PREEMPTING: Record._preempting,
    Kind.RESIZING: Record._resizing,
    Kind.RESIZED: Record._resized,
    Kind.RUN_LIMIT: Record._run_limited,
    Kind.REQUEUED: Record._requeued,
    Kind.FINISHED: Record._finished,
    Kind.CANCELLED: Record._cancelled,
}


def _shallow(v: Any) -> Any:
    return dict(v) if isinstance(v, dict) else list(v) if isinstance(v, list) else v
