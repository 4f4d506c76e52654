"""What the control plane does after a workload's end that its driver did not carry out itself. Ray-free: the control
actor asks Ray for the job's state and carries out the action returned; tests drive it from tables.

A workload's driver ends its MLflow run and exits with the workload's outcome (non-zero unless it succeeded, so that
``ray job submit`` says whether the workload did). Two ends reach the driver late or never:
- *a cancel* (``raylane cancel``): the gang is stopped at once and the driver sees the cancel, ends its run
  ``KILLED`` and exits with 1. Its Ray job is stopped only when the driver is still there ``grace_s`` after the
  cancel (a driver stuck somewhere); the cancel's journal entry carries that deadline (``job_stop_at``).
- *a driver that is gone*: its Ray job was stopped (``ray job stop``: the driver cancels the workload and has 3 s
  before Ray kills it), failed without releasing, or no longer exists because the Ray cluster it ran on was stopped
  (``raylane down``) while the journal lived on. Its MLflow run may be left ``RUNNING``.
In every such case the end's journal entry carries ``close_run``; once the job is over, the workload's MLflow run, if
still ``RUNNING``, is ended with the status of the workload's state (``STATE_TO_STATUS``) and the reason as the tag
``raylane.end_reason`` (``raylane.tracking.close_run``). The control actor journals that it was done (an ``event``
with ``mlflow_run_closed``), so a restarted control plane does it once, and does what a stopped one left undone.

Words:
- *job state*: what Ray says of the workload's job: ``LIVE`` (pending or running), ``ENDED`` (stopped, failed or
  succeeded) or ``GONE`` (unknown to the cluster: the cluster it ran on was stopped). None: no answer (the
  dashboard is down); nothing is decided then.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Optional, Union

from raylane.control.records import Record, State

__all__ = ["CANCEL_GRACE_S", "CloseRun", "JobState", "Settled", "StopJob", "after_end", "job_state", "pending"]

CANCEL_GRACE_S = 30.0  # how long a cancelled workload's driver has to end its MLflow run and exit

# The control plane's terminal workload states, as the MLflow status of the run (raylane.tracking.STATE_TO_STATUS;
# not imported from there: that module imports MLflow).
_RUN_STATUS = {State.SUCCEEDED: "FINISHED", State.FAILED: "FAILED", State.CANCELLED: "KILLED", State.REJECTED: "FAILED"}


class JobState(str, enum.Enum):
    LIVE = "LIVE"
    ENDED = "ENDED"
    GONE = "GONE"


def job_state(status: Optional[str] = None, error: Optional[BaseException] = None) -> Optional[JobState]:
    """Ray's answer about a job as a ``JobState``: its status (``JobStatus`` or its text), or the error asking for
    it raised. Ray's jobs API answers 404 for a job it never had."""
    if error is not None:
        return JobState.GONE if "status code 404" in str(error) else None
    if status is None:
        return None
    name = str(status).rsplit(".", 1)[-1]
    return JobState.ENDED if name in ("STOPPED", "FAILED", "SUCCEEDED") else JobState.LIVE


@dataclass(frozen=True)
class StopJob:
    """Stop the workload's Ray job: its driver outlived the cancel's grace period."""
    workload_id: str
    job_id: str
    note: str


@dataclass(frozen=True)
class CloseRun:
    """End the workload's MLflow run ``run_id`` (in ``uri``; None: the cluster's default store) with ``status``
    if it is still ``RUNNING``, recording ``reason``."""
    workload_id: str
    run_id: str
    uri: Optional[str]
    status: str
    reason: str


@dataclass(frozen=True)
class Settled:
    """Nothing is left to do for this end (no run was named): stop asking Ray about the job."""
    workload_id: str


Action = Union[StopJob, CloseRun, Settled]


def pending(rec: Record) -> bool:
    """Whether ``after_end`` may still have something to do for ``rec``."""
    return rec.state.terminal and (rec.job_stop_at is not None or rec.run_to_close)


def after_end(rec: Record, job: Optional[JobState], now: float) -> Optional[Action]:
    """What to do now for the ended workload ``rec`` whose Ray job is in state ``job`` (ignored without a job id).
    None: nothing yet (the driver is still within its grace, or Ray did not answer)."""
    if not pending(rec):
        return None
    if rec.job_id:
        if job is None:
            return None
        if job is JobState.LIVE:
            if rec.job_stop_at is not None and now >= rec.job_stop_at:
                return StopJob(rec.id, rec.job_id, f"its driver had not exited when the cancel's grace period "
                                                   f"ended; stopping its Ray job {rec.job_id}")
            return None
    if not rec.run_to_close or not rec.mlflow_run_id:
        return Settled(rec.id)
    status = _RUN_STATUS[rec.state]
    reason = next((note for ts, note in reversed(rec.events) if ts == rec.ended_at), rec.state.value.lower())
    if rec.job_id and job is JobState.GONE:
        reason = f"{reason} (its Ray job {rec.job_id} is gone: the cluster it ran on was stopped)"
    return CloseRun(rec.id, rec.mlflow_run_id, rec.mlflow_uri, status, reason)
