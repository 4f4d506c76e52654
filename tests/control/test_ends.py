"""What the control plane does after an end its driver did not carry out (``raylane.control.ends``): a cancelled
workload's driver gets a grace period to end its MLflow run and exit before its Ray job is stopped; a run left open
(job stopped, driver gone with the cluster) is closed with the workload's state and the reason. Pure: records built
from journal entries, Ray's answers given as text; ``close_run`` on a sqlite MLflow store in a temp folder."""
from __future__ import annotations

import pytest

from raylane.control import ends
from raylane.control.ends import CloseRun, JobState, Settled, StopJob, after_end, job_state
from raylane.control.journal import Entry
from raylane.control.records import Record

T0 = 1000.0


def record(*entries, job_id="raysubmit_1", run_id="run1", uri=None) -> Record:
    """A workload submitted with ``job_id`` at ``T0``, its driver naming MLflow run ``run_id``, then ``entries``
    (``(seconds after T0, kind, data)``)."""
    rec = Record("w-1", {"team": "team-a", "class": "pretrain"}, T0, job_id=job_id)
    rows = [(0, "submitted", {}), (1, "admitted", {"placement": ["n1"], "pg_name": "pg"}),
            (2, "running", {"job_id": job_id} if job_id else {})]
    if run_id:
        rows.append((3, "event", {"mlflow_run_id": run_id, "mlflow_uri": uri, "note": f"MLflow run {run_id}"}))
    for seq, (dt, kind, data) in enumerate(rows + list(entries)):
        rec.apply(Entry(seq, T0 + dt, kind, rec.id, data))
    return rec


CANCEL = (10, "cancelled", {"by": "alice", "note": "cancelled by alice", "job_stop_at": T0 + 40, "close_run": True})

CASES = [
    # name, record, job state, now, expected
    ("cancelled, driver still within its grace", record(CANCEL), JobState.LIVE, T0 + 39, None),
    ("cancelled, driver past its grace: its job is stopped", record(CANCEL), JobState.LIVE, T0 + 40,
     StopJob("w-1", "raysubmit_1", "its driver had not exited when the cancel's grace period ended; stopping its "
                                   "Ray job raysubmit_1")),
    ("cancelled, driver exited: the run is closed KILLED if still open", record(CANCEL), JobState.ENDED, T0 + 12,
     CloseRun("w-1", "run1", None, "KILLED", "cancelled by alice")),
    ("cancelled, job stopped after the grace: then closed", record(CANCEL, (41, "event", {"job_stopped": True})),
     JobState.ENDED, T0 + 45, CloseRun("w-1", "run1", None, "KILLED", "cancelled by alice")),
    ("job stopped by force past the grace, still stopping", record(CANCEL, (41, "event", {"job_stopped": True})),
     JobState.LIVE, T0 + 45, None),
    ("no answer from Ray: nothing decided", record(CANCEL), None, T0 + 100, None),
    ("driver gone with its cluster: closed with why", record(
        (10, "cancelled", {"by": "control plane", "close_run": True,
                           "note": "its Ray job raysubmit_1 no longer exists"})),
     JobState.GONE, T0 + 11,
     CloseRun("w-1", "run1", None, "KILLED", "its Ray job raysubmit_1 no longer exists (its Ray job raysubmit_1 is "
                                             "gone: the cluster it ran on was stopped)")),
    ("job failed without releasing: closed FAILED in the store the driver named", record(
        (10, "finished", {"state": "FAILED", "close_run": True, "note": "its Ray job ended (FAILED)"}),
        uri="sqlite:////x/mlflow.db"),
     JobState.ENDED, T0 + 11, CloseRun("w-1", "run1", "sqlite:////x/mlflow.db", "FAILED",
                                       "its Ray job ended (FAILED)")),
    ("cancelled before its driver named a run: settled", record(CANCEL, run_id=None), JobState.ENDED, T0 + 12,
     Settled("w-1")),
    ("a reservation without a job: closed at once", record(
        (10, "cancelled", {"by": "alice", "note": "cancelled by alice", "close_run": True}), job_id=None),
     None, T0 + 10, CloseRun("w-1", "run1", None, "KILLED", "cancelled by alice")),
    ("ended by its driver: nothing to do", record((10, "finished", {"state": "SUCCEEDED"})), JobState.ENDED,
     T0 + 11, None),
    ("closed already: nothing to do", record(CANCEL, (12, "event", {"mlflow_run_closed": True})), JobState.ENDED,
     T0 + 13, None),
    ("not ended: the job watch's business", record(), JobState.GONE, T0 + 5, None),
]


@pytest.mark.parametrize("rec,job,now,expected", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_after_end(rec, job, now, expected):
    assert after_end(rec, job, now) == expected


@pytest.mark.parametrize("status,error,expected", [
    ("JobStatus.RUNNING", None, JobState.LIVE),
    ("PENDING", None, JobState.LIVE),
    ("JobStatus.STOPPED", None, JobState.ENDED),
    ("FAILED", None, JobState.ENDED),
    ("SUCCEEDED", None, JobState.ENDED),
    (None, RuntimeError("Request failed with status code 404: Job raysubmit_1 does not exist."), JobState.GONE),
    (None, RuntimeError("Request failed with status code 500: boom."), None),
    (None, ConnectionError("refused"), None),
])
def test_job_state(status, error, expected):
    assert job_state(status, error) is expected


def test_pending_follows_the_journal():
    rec = record(CANCEL)
    assert ends.pending(rec) and rec.job_stop_at == T0 + 40 and rec.run_to_close
    rec.apply(Entry(9, T0 + 41, "event", rec.id, {"job_stopped": True, "note": "stopping"}))
    assert ends.pending(rec) and rec.job_stop_at is None
    rec.apply(Entry(10, T0 + 45, "event", rec.id, {"mlflow_run_closed": True, "note": "closed"}))
    assert not ends.pending(rec)


def test_close_run_ends_an_open_run_once_and_creates_no_store(tmp_path):
    from raylane.tracking import TAG_END_REASON, RunTracker, close_run, client_for

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracker = RunTracker(workload_id="w-1", spec={"team": "team-a", "class": "pretrain"}, tracking_uri=uri)
    run_id = tracker.start()
    said = close_run(uri, run_id, "CANCELLED", "its Ray job is gone")
    run = client_for(uri).get_run(run_id)
    assert run.info.status == "KILLED" and run.data.tags[TAG_END_REASON] == "its Ray job is gone"
    assert "ended KILLED" in said
    # Ended already (by its driver, or by an earlier close): left as it is.
    assert close_run(uri, run_id, "FAILED", "again") == f"MLflow run {run_id} ended KILLED by its driver"
    assert client_for(uri).get_run(run_id).info.status == "KILLED"
    missing = tmp_path / "elsewhere" / "mlflow.db"
    assert "no store" in close_run(f"sqlite:///{missing}", run_id, "FAILED", "x")
    assert not missing.parent.exists()
