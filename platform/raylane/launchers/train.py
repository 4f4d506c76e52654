"""The training launcher: turns a lease into a Ray Train gang that lands where the control actor decided.

Ray Train V2 builds its own placement group and cannot take one reserved elsewhere, so the lease is handed over:
the control actor holds the gang's reservation (a placement group pinned node by node) until the driver is ready;
then the reservation is dropped and Train's own group of the same shape is created with a per-worker node-id
label selector, so every worker lands on the node the core chose. The ledger keeps the capacity counted throughout.

Train's own retries are off (``max_failures=0``): the driver (``raylane.run``) decides, because a worker that died
because the control actor stopped it by force after a preemption's grace period is not a failure, while a crash is
retried from the latest checkpoint with backoff up to the class's retry budget.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional, Sequence

import torch
from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
from ray.train.torch import TorchConfig, TorchTrainer

from raylane.config.models import spec_workers
from raylane.control.state import GiB
from raylane.errors import ValidationError
from raylane.launchers.datasets import TrainData
from raylane.launchers.datasets import build as build_datasets
from raylane.faults import FAULT_KEYS
from raylane.launchers.retry import GiveUp, RetryRule, root_error
from raylane.launchers.train_callbacks import RecordCheckpoints, RegisterWorkers
from raylane.scheduling.placement import RAY_STRATEGY
from raylane.train import LoopOptions, StopPoll, UserLoop  # noqa: F401 - StopPoll re-exported

DEFAULT_STORAGE = os.path.join(os.path.expanduser("~"), ".raylane", "runs")


@dataclass(frozen=True)
class UserTrainer:
    """What a user's own trainer brings to every attempt of its workload (script mode, ``raylane.script.trainer``):
    its loop config, datasets and ``DataConfig``, and the parts of its ``RunConfig`` that do not fight the
    launcher's (checkpoint retention, callbacks after the launcher's own, the workers' runtime env). Its name,
    storage and failure settings are the workload's; its ScalingConfig became the spec's gang."""

    train_loop_config: Optional[Dict[str, Any]] = None
    datasets: Optional[Dict[str, Any]] = None
    dataset_config: Any = None
    checkpoint_config: Any = None
    callbacks: Sequence[Any] = ()
    worker_runtime_env: Any = None


def build_trainer(*, workload_id: str, spec: Dict[str, Any], placement: Sequence[str], storage_path: str,
                  train_loop_config: Dict[str, Any], loop: UserLoop, control, resume_step: int = 0,
                  data: Optional[TrainData] = None, user: Optional[UserTrainer] = None) -> TorchTrainer:
    """A ``TorchTrainer`` running ``loop`` (the user's entrypoint under ``raylane.train``) on the nodes of the lease.
    ``resume_step``: the workload's step when this attempt starts (a step-less loop's reports count from it).
    ``data``: the spec's datasets and their ``DataConfig`` (``raylane.launchers.datasets.build``), or None.
    ``user``: the pieces of a user's own trainer kept (script mode); its datasets when the spec has none."""
    gang = spec["gang"]
    res = gang.get("resources", {})
    per_worker: Dict[str, float] = {"CPU": float(res.get("cpu", 1) or 0)}
    if res.get("gpu"):
        per_worker["GPU"] = float(res["gpu"])
    if res.get("memory"):
        per_worker["memory"] = float(_gib(res["memory"]) * GiB)
    real_gpus = torch.cuda.is_available()
    workers = gang.get("workers", 1)
    # An elastic gang ({min, max}) runs at the size its lease was given: one placement node per worker.
    num_workers = len(placement) if isinstance(workers, dict) and placement else spec_workers(workers)
    scaling = ScalingConfig(
        num_workers=num_workers,
        # Logical GPUs are scheduled as GPUs; without CUDA the workers train on the CPU over gloo.
        use_gpu=bool(res.get("gpu")),
        resources_per_worker=per_worker,
        placement_strategy=RAY_STRATEGY.get(gang.get("placement") or "pack", "PACK"),
        label_selector=[{"ray.io/node-id": nid} for nid in placement],
    )
    run_config = RunConfig(
        name=workload_id,
        storage_path=storage_path,
        # Nothing is retried inside Train, worker failures, controller errors (a worker group that cannot start,
        # e.g. pinned to a node that has just died) and node preemptions alike: Train would retry a start on a
        # dead node forever. The driver decides (raylane.run), with the control actor's view of the lease.
        failure_config=FailureConfig(max_failures=0, controller_failure_limit=0, max_preemption_failures=0),
        checkpoint_config=(user.checkpoint_config if user is not None and user.checkpoint_config is not None
                           else CheckpointConfig(num_to_keep=3)),
        callbacks=[RegisterWorkers(workload_id, control),
                   RecordCheckpoints(workload_id, control, first_index=resume_step),
                   *(user.callbacks if user is not None else ())],
        worker_runtime_env=user.worker_runtime_env if user is not None else None,
    )
    if data is None and user is not None and (user.datasets or user.dataset_config is not None):
        data = TrainData(datasets=user.datasets or None, data_config=user.dataset_config)
    return TorchTrainer(
        loop,
        train_loop_config=train_loop_config,
        scaling_config=scaling,
        run_config=run_config,
        torch_config=TorchConfig(backend="nccl" if real_gpus else "gloo"),
        datasets=data.datasets if data is not None else None,
        dataset_config=data.data_config if data is not None else None,
    )


def _gib(value) -> float:
    from raylane.config.models import parse_memory

    return parse_memory(value)


def latest_checkpoint(storage_path: str, workload_id: str) -> Optional[str]:
    run_dir = os.path.join(storage_path, workload_id)
    if not os.path.isdir(run_dir):
        return None
    cps = sorted(d for d in os.listdir(run_dir)
                 if d.startswith("checkpoint_") and os.path.isdir(os.path.join(run_dir, d)))
    return os.path.join(run_dir, cps[-1]) if cps else None


def run_training(spec: Dict[str, Any], *, ctl, job_id: Optional[str] = None, storage_path: Optional[str] = None,
                 tracking_uri: Optional[str] = None, poll_s: float = 2.0,
                 train_fn: Optional[Callable] = None, workload_id: Optional[str] = None,
                 run_starter=None, user: Optional[UserTrainer] = None,
                 on_attempt: Optional[Callable[[Any, Optional[BaseException]], None]] = None) -> Dict[str, Any]:
    """The training launcher (``raylane.launchers``): register, wait, run the gang through preemptions, forced
    stops and retries, and return the final record. ``train_fn`` runs a function object instead of the spec's
    entrypoint (Python API). ``workload_id``: drive that workload, already submitted (a pipeline's stage).
    ``run_starter``: a ``raylane.runstart.RunStarter`` already preparing the MLflow run in a child process (the
    driver's start-up does this, so that MLflow is off the way to the first step); without it the run is started
    here. ``user``: what a user's own trainer brings (``UserTrainer``, script mode). ``on_attempt(result, error)``:
    told how each attempt's ``fit()`` ended (its ``ray.train.Result``, or what it raised), before the launcher
    decides what follows."""
    from raylane.launchers.driver import registered

    fault = (spec.get("config") or {}).get("fault")
    if fault is not None:  # a bad drill is refused before the workload queues, like any config
        from raylane.faults import Faults

        if not isinstance(fault, dict):
            raise ValidationError("spec", [("config.fault", fault, "a mapping of fault drills (raylane.faults)")])
        try:
            Faults(marker_dir="", **fault)
        except TypeError as exc:
            raise ValidationError("spec", [("config.fault", fault, f"known drills: {', '.join(FAULT_KEYS)} ({exc})")])
    target = train_fn or spec.get("entrypoint")
    try:
        return registered(ctl, spec, job_id, lambda wid: _drive(ctl, wid, spec, target=target,
                                                                 storage_path=storage_path, tracking_uri=tracking_uri,
                                                                 poll_s=poll_s, run_starter=run_starter,
                                                                 user=user, on_attempt=on_attempt),
                          workload_id=workload_id)
    finally:
        if run_starter is not None:
            run_starter.close()  # refused at submit, or stopped before asking: the child exits without a run


class _Run:
    """The workload's MLflow run, as its driver sees it: started by a ``RunStarter``'s child (its answer awaited in a
    thread, ``PendingRun``) or here, named to the control actor once known, and the driver's own tracker, built on
    first use (``LateTracker``: MLflow's import is not on the way to the gang's start)."""

    def __init__(self, ctl, wid: str, spec: Dict[str, Any], tracking_uri: Optional[str], run_starter=None):
        from raylane.launchers.driver import one_line
        from raylane.locations import tracking_uri as resolve_tracking_uri
        from raylane.runstart import LateTracker, PendingRun

        self.ctl, self.wid, self.spec, self._asked_uri = ctl, wid, spec, tracking_uri
        self.run_id: Optional[str] = None
        # The store, resolved as the run's starter resolves it: the workers get it even when the gang starts before
        # the run is named (they get the run's id from the control actor then, and its store from here).
        self.uri = resolve_tracking_uri(tracking_uri)
        self.tracker = LateTracker(self._make_tracker)
        self.pending: Optional[PendingRun] = None
        if run_starter is not None:
            # The gang's first attempt may start before the run exists: its workers wait for the name the control
            # actor is given (raylane.train), or for why there is none.
            run_starter.ask(workload_id=wid, spec=spec)
            self.pending = PendingRun(run_starter, announce=lambda started: self._name(started.run_id),
                                      fail=lambda exc: ctl.event(wid, f"MLflow run not started: {one_line(exc)}",
                                                                 mlflow_run_error=one_line(exc)))
        else:
            self.start()

    def _name(self, rid: str) -> None:
        # The store too, so the control plane can close the run if this driver dies with it open.
        known = self.uri if self.uri and self.uri.startswith(("sqlite:///", "http://", "https://")) else None
        self.ctl.event(self.wid, f"MLflow run {rid}", mlflow_run_id=rid, mlflow_uri=known)

    def start(self) -> str:
        """The run's id: the child's answer when a starter prepares it (waited for here; its error raised here),
        else started here."""
        if self.run_id is None:
            if self.pending is not None:
                started = self.pending.result()
                self.run_id, self.uri = started.run_id, started.tracking_uri
                if not self.pending.announced:  # the control actor was restarting when the thread told it
                    self._name(self.run_id)
            else:
                self.run_id, self.uri = self.tracker.run_id, self.tracker.tracking_uri
                self._name(self.run_id)
        return self.run_id

    def start_if_answered(self) -> None:
        """Take the child's answer if it has come (a failure is raised here, before the gang starts)."""
        if self.pending is not None and self.pending.done():
            self.start()

    def _make_tracker(self):
        from raylane.tracking import RunTracker

        if self.pending is not None:
            self.start()
        return RunTracker(workload_id=self.wid, spec=self.spec,
                          tracking_uri=self.uri if self.run_id else self._asked_uri, cost_of=self.ctl.run_cost)


def _drive(ctl, wid, spec, *, target, storage_path, tracking_uri, poll_s, run_starter=None,
           user: Optional[UserTrainer] = None, on_attempt=None) -> Dict[str, Any]:
    """Wait for each admission, run one attempt of the gang on it, and decide from how it ended (``_after``):
    another attempt (resized, preempted, a lost node, a failure within the retry budget) or the workload's end."""
    from raylane.control.client import State
    from raylane.errors import FatalError
    from raylane.launchers.driver import fail_now, ray_job_id, say, wait_admitted

    storage_path = storage_path or spec.get("config", {}).get("storage_path") or _default_storage()
    run = _Run(ctl, wid, spec, tracking_uri, run_starter)
    retries = RetryRule(int(ctl.class_info(spec["class"])["retry_budget"]))
    last_workers = None
    while True:
        rec = wait_admitted(ctl, wid, poll_s)
        if rec.terminal:
            run.start()  # the run exists before anything is logged to it, the gang's end included
            run.tracker.finish("KILLED" if rec.state is State.CANCELLED else rec.state.value)
            return rec
        attempt_t0 = time.time()
        say(f"{wid} admitted on {len(set(rec['placement']))} node(s); starting the gang")
        if ctl.running(wid, job_id=ray_job_id(), note="gang starting").state is not State.RUNNING:
            continue  # preempted or cancelled between admission and start: wait again
        loop_cfg = dict(spec.get("config", {}))
        loop_cfg.pop("storage_path", None)
        fault = loop_cfg.pop("fault", None)
        try:
            loop_cfg.update(_resolved_init(ctl, wid, loop_cfg))
        except FatalError as exc:  # the checkpoint it starts from can never exist: no attempt will do better
            return fail_now(ctl, run.tracker, wid, f"{exc}")
        if user is not None and user.train_loop_config:  # the user's own config, as its trainer had it
            loop_cfg = {**user.train_loop_config, **loop_cfg}
        run.start_if_answered()
        started_at = rec.get("step") or 0
        loop = UserLoop(target, LoopOptions(workload_id=wid, run_id=run.run_id, tracking_uri=run.uri,
                                            awaits_run=run.run_id is None, fault=fault, resume_step=started_at,
                                            marker_dir=os.path.join(storage_path, wid, "_faults"), control=ctl))
        bound_train_waits()
        try:  # the spec's datasets, built once per attempt (raylane.launchers.datasets)
            data = build_datasets(spec)
        except FatalError as exc:  # its function fails or returns no Dataset: every attempt would do the same
            return fail_now(ctl, run.tracker, wid, f"{exc}")
        trainer = build_trainer(workload_id=wid, spec=spec, placement=rec["placement"], storage_path=storage_path,
                                train_loop_config=loop_cfg, loop=loop, control=ctl, resume_step=started_at,
                                data=data, user=user)
        workers, started = len(rec["placement"]), time.time()
        error: Optional[BaseException] = None
        result = None
        try:
            result = trainer.fit()
        except Exception as exc:  # noqa: BLE001 - classified below: forced stop, cancel, or a crash to retry
            error = exc
        if on_attempt is not None:
            on_attempt(result, error)
        if workers != last_workers:  # every start of an elastic gang at a new size; a fixed gang's once
            # Logged once the attempt has ended, at the step it started from: the driver's first use of its tracker
            # imports MLflow (about 2 s of CPU here), which must not delay the gang's first step.
            run.tracker.log_workers(workers, step=started_at, at=started)
            last_workers = workers
        out = (result.return_value or {}) if result is not None else {}
        end = _after(ctl, wid, rec, run.tracker, retries, storage_path, out, error, workers, started_at, attempt_t0)
        if end is not None:
            return end


def _after(ctl, wid, rec, tracker, retries: RetryRule, storage_path: str, out: Dict[str, Any],
           error: Optional[BaseException], workers: int, started_at: int, attempt_t0: float
           ) -> Optional[Dict[str, Any]]:
    """How an attempt ended, told to the control actor and the run: the workload's final record, or None when
    another attempt follows (it waits for its next admission). ``out``: what the loop returned; ``error``: what
    ``fit()`` raised."""
    from raylane.control.client import EndState, Outcome, State
    from raylane.launchers.driver import fail_now, fatal_cause, one_line, say

    now_rec = ctl.status(wid)
    state = now_rec.state
    step = out.get("step")
    if out.get("restarted_from_zero") is not None:
        _tell_restart(tracker, out["restarted_from_zero"])
    if step is None:  # the attempt ended in an error or by force: it resumes from its last checkpoint's step
        step = now_rec.get("step")
    if state is State.CANCELLED:
        tracker.event("cancelled", f"cancelled at step {step}")
        tracker.finish("KILLED")
        return ctl.status(wid)
    # A gang that reached its last step finished, even if a preemption arrived meanwhile.
    done = error is None and out.get("status") == "finished"
    resized = state is State.RESIZING or (state is State.ADMITTED and now_rec.get("resizes", 0) >
                                          rec.get("resizes", 0))
    if not done and resized:
        # The core resized the gang: it stopped at a checkpoint (or, past its grace period, by force, and the
        # control actor has resized the lease already). It restarts from there at the new size.
        how = "yielded" if error is None else "stopped by force"
        if state is State.RESIZING:
            now_rec = ctl.release(wid, Outcome.YIELDED, step=step)
        size = len(now_rec["placement"])
        tracker.event("resized", f"{how} at step {step}: {workers} -> {size} workers", step=step,
                      from_workers=workers, to_workers=size)
        say(f"{wid} resized at step {step}: {workers} -> {size} workers; restarting from its checkpoint")
        retries.after_success()  # it got somewhere: a later failure is not a repeat of an earlier one
        return None
    # Preempted during this attempt: stopping, or already taken back by force past the grace period (and perhaps
    # admitted again since: its state alone would then read as a crash, to retry).
    preempted = now_rec.get("preemptions", 0) > rec.get("preemptions", 0)
    if not done and (state in (State.PREEMPTING, State.PENDING) or out.get("status") == "yielded" or preempted):
        how = "yielded" if error is None else "stopped by force"
        limit = (now_rec.get("run_limit") or {}).get("reason")  # its class's max_runtime, not a preemption
        tracker.event("run limit" if limit else "preempted", f"{how} at step {step}" + (f": {limit}" if limit else ""),
                      step=step)
        say(f"{wid} {'reached its run limit' if limit else 'preempted'} ({how}) at step {step}; releasing the lease")
        ctl.release(wid, Outcome.YIELDED, step=step)
        retries.after_success()
        return None
    if error is None:
        at = f"at step {step}" if step is not None else "(its loop reported no step)"
        tracker.event("finished", f"finished {at}", step=step)
        _log_model(tracker, storage_path, wid)
        tracker.finish("FINISHED")
        end = ctl.release(wid, Outcome.FINISHED, state=EndState.SUCCEEDED, step=step,
                          detail=f"finished {at}; its last attempt ran {time.time() - attempt_t0:.0f}s "
                                 f"from step {started_at}")
        say(f"{wid} finished {at}")
        return end
    if _lease_lost(ctl, wid, rec["placement"]):
        # A node of the lease died: the control actor takes the lease back and requeues the workload; that is
        # not the gang's failure, and a restart must not be pinned to the dead node again.
        tracker.event("node lost", f"a node of its lease was lost at step {step}; waiting for a new lease")
        say(f"{wid}: a node of its lease was lost; it resumes from its last checkpoint on a new lease")
        retries.after_success()
        return None
    fatal = fatal_cause(error)
    if fatal is not None:  # bad config, missing checkpoint: every attempt would fail the same way
        return fail_now(ctl, tracker, wid, f"{one_line(fatal)} (not retried: it fails the same way every time)")
    decision = retries.after_failure(error, one_line(root_error(error)))
    if isinstance(decision, GiveUp):
        return fail_now(ctl, tracker, wid, f"gang {decision.reason}")
    failures, backoff = retries.failures, decision.backoff_s
    budget = retries.budget
    tracker.event("restarted", f"attempt {failures} failed ({one_line(error)}); retry in {backoff:g}s")
    ctl.event(wid, f"restart {failures}/{budget} after {one_line(error)}; backoff {backoff:g}s", restart=True)
    say(f"{wid} gang failed ({one_line(error)}); retry {failures}/{budget} in {backoff:g}s")
    time.sleep(backoff)
    return None


def _tell_restart(tracker, resumed_at: int) -> None:
    """The attempt was resumed at ``resumed_at`` but its loop started again from zero (``raylane.train``)."""
    tracker.event("restarted from zero", f"resumed at step {resumed_at}, but the loop did not load its checkpoint "
                                         "(ray.train.get_checkpoint()): it trained again from the start",
                  step=resumed_at)
    tracker.set_tags({"raylane.restarted_from_zero": str(resumed_at)})


def _dead_nodes(placement, timeout_s: float = 10.0) -> set:
    """Nodes of ``placement`` that Ray reports dead, or that cannot run a trivial task within ``timeout_s``: Ray
    takes some seconds (its health checks) to declare a killed node dead, and a gang fails before that."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    alive = {n["NodeID"] for n in ray.nodes() if n.get("Alive")}
    dead = set(placement) - alive
    ping = ray.remote(num_cpus=0, max_retries=0)(_pong)
    refs = {ping.options(scheduling_strategy=NodeAffinitySchedulingStrategy(nid, soft=False)).remote(): nid
            for nid in set(placement) - dead}
    ready, pending = ray.wait(list(refs), num_returns=len(refs), timeout=timeout_s)
    for ref in ready:
        try:
            ray.get(ref)
        except Exception:  # noqa: BLE001 - the task died with its node
            dead.add(refs[ref])
    for ref in pending:
        ray.cancel(ref, force=True)
        dead.add(refs[ref])
    return dead


def _pong() -> int:
    return 1


def _lease_lost(ctl, wid: str, placement, wait_s: float = 60.0, poll_s: float = 1.0) -> bool:
    """Whether the failed attempt's lease is gone: the control actor requeued it, or one of its nodes is dead or
    unreachable and the actor requeues it within ``wait_s`` (Ray's health checks declare the node dead)."""
    from raylane.control.client import State

    if ctl.status(wid).state is not State.RUNNING:
        return True
    if not _dead_nodes(placement):
        return False
    deadline = time.time() + wait_s
    while time.time() < deadline:
        if ctl.status(wid).state is not State.RUNNING:
            return True
        time.sleep(poll_s)
    return False  # unreachable, yet never declared dead: a failure like any other


# Ray Train waits this long for a worker group to start (default 60 s) and for a worker's health check (default
# 10 min); a gang pinned to a node that has just died would sit in those waits. The driver's environment reaches
# Train's controller and workers (Train propagates these variables), so a user's own setting wins.
TRAIN_WAITS = {"RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S": "45", "RAY_TRAIN_WORKER_HEALTH_CHECK_TIMEOUT_S": "120"}


def bound_train_waits() -> None:
    for k, v in TRAIN_WAITS.items():
        os.environ.setdefault(k, v)


def _resolved_init(ctl, wid: str, cfg: Dict[str, Any]) -> Dict[str, Any]:
    """``init_from: {workload, step}`` as the directory the control actor pinned for this workload."""
    from raylane.control.checkpoints import parse_ref
    from raylane.launchers.driver import say

    if parse_ref(cfg.get("init_from")) is None:
        return {}
    got = ctl.resolve_checkpoint(wid)
    say(f"{wid} starts from {got['source']}'s checkpoint at step {got['step']}: {got['path']}")
    return {"init_from": got["path"]}


def _default_storage() -> str:
    """``~/.raylane/runs``, created readable by its user only (it holds every team's checkpoints)."""
    os.makedirs(DEFAULT_STORAGE, mode=0o700, exist_ok=True)
    return DEFAULT_STORAGE


def _log_model(tracker, storage_path: str, wid: str) -> None:
    path = latest_checkpoint(storage_path, wid)
    if path:
        tracker.log_model_dir(path, "model")


