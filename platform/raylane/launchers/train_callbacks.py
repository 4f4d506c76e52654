"""Ray Train callbacks of the training launcher, in a module of their own: they run in Train's controller actor,
which unpickles them, so what this module imports is imported there before the worker group starts. It imports
neither torch nor ``ray.train.torch`` (``raylane.launchers.train`` does: seconds on a small machine, on the way
to the gang's first step).
"""
from __future__ import annotations

import logging

from ray.train.v2._internal.execution.callback import ReportCallback, WorkerGroupCallback

log = logging.getLogger("raylane.launchers.train")

__all__ = ["RegisterWorkers", "RecordCheckpoints"]


class RegisterWorkers(WorkerGroupCallback):
    """Tells the control actor which actors form the gang, so it can stop them by force after the grace period."""

    def __init__(self, workload_id: str, control):
        self.workload_id = workload_id
        self.control = control

    def after_worker_group_start(self, worker_group):
        handles = [w.actor for w in worker_group.get_workers()]
        self.control.register_workers(self.workload_id, handles, timeout=30)


class RecordCheckpoints(ReportCallback):
    """Tells the control actor of every checkpoint the gang registers, whatever loop wrote it.

    Runs in Train's controller after Train's own checkpoint manager took the report (and its retention deleted what
    fell out of ``num_to_keep``), so the checkpoint named here is on storage. The actor journals it, pins it for a
    consumer that waits for that step (raylane.control.checkpoints), and counts it as the gang's last checkpoint.
    """

    def __init__(self, workload_id: str, control, first_index: int = 0):
        self.workload_id = workload_id
        self.control = control
        self.index = first_index  # the workload's report index: a step-less loop's step (raylane.train.report_step)

    def after_report(self, training_report, metrics):
        from raylane.train import report_step

        self.index += 1
        checkpoint = getattr(training_report, "checkpoint", None)
        if checkpoint is None:
            return
        reported = getattr(training_report, "metrics", None) or {}
        step = {"step": report_step(reported, self.index)}
        try:
            self.control.checkpoint_saved(self.workload_id, checkpoint.path, step, timeout=60)
        except Exception as exc:  # noqa: BLE001 - the control plane restarting must not fail the training run
            log.warning("could not tell the control actor of checkpoint %s: %s", checkpoint.path, exc)
