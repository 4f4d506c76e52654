"""The control plane's watch over Ray's jobs (a role of ``raylane.control.state.ControlState``).

Every ``JOB_WATCH_S``, on a full tick, one listing of Ray's jobs (``Host.job_table``) says which workloads' jobs have
ended without telling the control plane (driver killed, job stopped, or gone with the Ray cluster it ran on): they
end and release their lease. What an end left to do once its Ray job is over (stop a driver that outlived a cancel,
close the MLflow run a driver left open: ``raylane.control.ends``) is done from the same listing, and so are a
script's job tokens retired and a pipeline whose driver's job ended cancelled.

Words: an *end* here is a workload ended with something left to do (``ends.pending``); *closing*, one whose MLflow
run a ``CloseRun`` effect is closing now (``run_closed`` says how that went).
"""
from __future__ import annotations

from typing import Any, Callable, Dict, Optional

from raylane.control import effects as fx
from raylane.control import ends
from raylane.control.journal import Kind
from raylane.control.records import Record, State

# A workload queued with a job id the jobs API does not know yet is not taken for gone this long after its submit:
# `raylane submit` queues it first and submits its driver's job right after (raylane.cli.cluster.submit).
JOB_SUBMIT_GRACE_S = 60.0
# Ray's job table is read at most this often (``JobWatch.watch``).
JOB_WATCH_S = 5.0


def _listed_state(table: Dict[str, str], job_id: str):
    """(``ends.JobState``, Ray's status name or ``gone``) of a job, from the host's job table: a job Ray does not
    list is one it never had (gone)."""
    status = table.get(job_id)
    if status is None:
        return ends.JobState.GONE, "gone"
    return ends.job_state(status), status.rsplit(".", 1)[-1]


class JobWatch:
    """Owns the ended workloads with something left to do, those whose MLflow run is being closed, and when Ray's
    job table was last read. Handed the records, the host, the ``ClusterState`` (getter: a policy reload replaces
    it), the pipeline book, the gate (a script's job tokens), ``append``, ``emit``, the leases (a gone job's
    reservation is removed) and the pipelines (a pipeline whose driver's job ended has its stages cancelled)."""

    def __init__(self, *, records, host, state: Callable[[], Any], pipes, gate, append: Callable[..., Any],
                 emit: Callable[[fx.Effect], None], leases, pipelines):
        self.records, self.host, self.pipes, self.gate = records, host, pipes, gate
        self._state = state
        self._append, self._emit = append, emit
        self.leases, self.pipelines = leases, pipelines
        # Ended workloads with something left to do once their Ray job is over (``ends.pending``), and those whose
        # MLflow run a task is closing now (raylane.control.ends).
        self._ends: set = set()
        self._closing: set = set()
        self._jobs_checked = 0.0

    @property
    def state(self):
        return self._state()

    def recovered(self) -> None:
        """The journal is replayed: the ends left to do are those of the records now."""
        self._ends = {wid for wid, rec in self.records.items() if ends.pending(rec)}

    def noted(self, rec: Record) -> None:
        """An entry was applied to ``rec``: whether its end has something left to do now."""
        if ends.pending(rec):
            self._ends.add(rec.id)
        else:
            self._ends.discard(rec.id)

    def watch(self, now: float) -> None:
        """A workload whose Ray job ended without telling us (driver killed, job stopped, or gone with the Ray
        cluster it ran on) ends and releases its lease; what an end left to do (stop a driver that outlived a
        cancel, close the MLflow run a driver left open) is done once the job is over (``raylane.control.ends``)."""
        if now - self._jobs_checked < JOB_WATCH_S:
            return
        self._jobs_checked = now
        live = [r for r in self.records.values() if r.job_id and not r.state.terminal]
        pipes = [r for r in self.pipes.active() if r.job_id]
        ended = [self.records[wid] for wid in sorted(self._ends - self._closing)]
        scripts = [s for s in self.gate.script_scopes() if all(self._over(w) for w in s.members)]
        if not live and not pipes and not ended and not scripts:
            return
        # One listing of Ray's jobs per watch, not a request per workload: a queue of thousands of `raylane submit`
        # workloads each has a job.
        table = self.host.job_table()
        if table is None:  # no answer (no dashboard): nothing is decided from it
            return
        for rec in live:
            job, status = _listed_state(table, rec.job_id)
            if job is ends.JobState.LIVE or job is None:
                continue
            if job is ends.JobState.GONE and now - rec.submit_time < JOB_SUBMIT_GRACE_S:
                continue  # `raylane submit` queues the workload first, then submits the job that drives it
            # its lease, if it holds one, is over (raylane.scheduling.apply); else it leaves the queue
            if self.leases.applier.ended(rec.id, now) is None and self.state.is_pending(rec.id):
                self.state.dequeue(rec.id)
            self.leases.remove_pg(rec)
            if job is ends.JobState.GONE:
                self._append(Kind.CANCELLED, rec, by="control plane", outcome="ray job gone", close_run=True,
                             note=f"its Ray job {rec.job_id} no longer exists: the Ray cluster it ran on was "
                                  f"stopped")
                continue
            kind = Kind.CANCELLED if status == "STOPPED" else Kind.FINISHED
            self._append(kind, rec, state=State.FAILED, outcome=f"ray job {status.lower()}", close_run=True,
                         note=f"its Ray job {rec.job_id} ended ({status}) without releasing")
        for rec in ended:
            job = _listed_state(table, rec.job_id)[0] if rec.job_id else None
            self._after_end(ends.after_end(rec, job, now))
        for scope in scripts:  # a script's job token: retired once its workloads and their Ray job are over
            jobs = {self.records[w].job_id for w in scope.members if w in self.records and self.records[w].job_id}
            states = [_listed_state(table, j)[0] for j in sorted(jobs)]
            if all(s is not ends.JobState.LIVE for s in states):
                self.gate.retire(scope.token_id, now, "its script's workloads have ended, and so has their Ray job "
                                                      f"({', '.join(sorted(jobs)) or 'none'})")
        for run in pipes:  # a pipeline whose driver's job ended: no one runs its stages any more
            job, status = _listed_state(table, run.job_id)
            if job is not ends.JobState.LIVE and job is not None:
                self.pipelines.cancel_stages(run, f"its driver's Ray job {run.job_id} ended ({status})")

    def _over(self, wid: str) -> bool:
        rec = self.records.get(wid)
        return rec is None or rec.state.terminal

    def _after_end(self, action: Optional[ends.Action]) -> None:
        """Carry out what ``ends.after_end`` decided for an ended workload."""
        if action is None:
            return
        rec = self.records[action.workload_id]
        if isinstance(action, ends.Settled):
            self._ends.discard(rec.id)
        elif isinstance(action, ends.StopJob):
            self._append(Kind.EVENT, rec, job_stopped=True, note=action.note)
            self._emit(fx.StopJob(action.job_id))
        elif isinstance(action, ends.CloseRun):
            self._closing.add(rec.id)
            self._emit(action)

    def run_closed(self, wid: str, note: Optional[str]) -> None:
        """Event: the actor's try at closing ``wid``'s MLflow run (a ``CloseRun``) is over: ``note`` says what was
        done, journaled; None: the try failed, and the next watch tries again."""
        self._closing.discard(wid)
        if note is not None:
            self._append(Kind.EVENT, self.records[wid], mlflow_run_closed=True, note=note)
