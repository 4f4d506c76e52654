"""``python -m raylane.run SPEC.yaml``: the driver of one workload, run as a plain Ray job.

    ray job submit --working-dir . -- python -m raylane.run examples/specs/pretrain-team-a.yaml

The driver registers the workload with the control actor (with its Ray job id, so stopping the job cancels the
workload and cancelling the workload stops the job), prints its queue position and reason while it waits, and
starts only once admitted. Then, for a training workload, it runs a Ray Train gang on the lease:
- the gang yields when the control actor preempts it (graceful: a checkpoint at the current step), the driver
  releases the lease and waits again; admitted again, it resumes from the latest checkpoint;
- a gang stopped by force after the grace period is treated the same way (it resumes from its last periodic
  checkpoint);
- a crash is retried on the same lease from the latest checkpoint with exponential backoff, up to the class's
  retry budget; then the workload fails with the reason.
One MLflow run follows the logical workload across all of that (``raylane.tracking``).

``run_workload`` is the same driver for a user's own training function (``train_fn``).
"""
from __future__ import annotations

import json
import logging
import os
import signal
import sys
import time
from typing import Any, Callable, Dict, Optional


log = logging.getLogger("raylane.run")


def _job_id() -> Optional[str]:
    raw = os.environ.get("RAY_JOB_CONFIG_JSON_ENV_VAR")
    if not raw:
        return None
    try:
        return json.loads(raw).get("metadata", {}).get("job_submission_id")
    except json.JSONDecodeError:
        return None


class _Stopped(Exception):
    pass


def _say(msg: str) -> None:
    print(f"[raylane] {msg}", flush=True)


def run_workload(spec: Dict[str, Any], *, train_fn: Optional[Callable] = None, storage_path: Optional[str] = None,
                 tracking_uri: Optional[str] = None, poll_s: float = 2.0) -> Dict[str, Any]:
    """Register ``spec``, wait for admission, run it to the end through preemptions and retries; returns the record."""
    import ray

    from raylane.control.client import call, get_control
    from raylane.errors import FatalError

    if not ray.is_initialized():
        ray.init(address=os.environ.get("RAY_ADDRESS", "auto"), namespace="raylane", log_to_driver=True)
    ctl = get_control()
    job_id = _job_id()
    kind = spec.get("kind", "train")
    # Sweeps and serving drive their own leases (one per trial slot, one per replica shortfall).
    if kind == "tune":
        from raylane.launchers.tune import run_sweep

        return run_sweep(spec, ctl=ctl, job_id=job_id, storage_path=storage_path, tracking_uri=tracking_uri)
    if kind == "serve":
        from raylane.launchers.serve import run_serving

        return run_serving(spec, ctl=ctl, job_id=job_id)
    if kind == "train" and train_fn is None:
        _check_train_config(spec)
    rec = call(ctl, "submit", spec, job_id=job_id)
    wid = rec["id"]
    _say(f"workload {wid} submitted (job {job_id or '-'})")

    def on_signal(signum, frame):  # `ray job stop` sends SIGTERM (or SIGINT): the workload is cancelled
        raise _Stopped(signal.Signals(signum).name)

    if threading_main():
        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
    try:
        return _drive(ctl, wid, spec, train_fn=train_fn, storage_path=storage_path, tracking_uri=tracking_uri,
                      poll_s=poll_s)
    except _Stopped as exc:
        _say(f"job stopped ({exc}); cancelling {wid}")
        call(ctl, "cancel", wid)
        raise SystemExit(130)
    except FatalError:
        raise


def _check_train_config(spec: Dict[str, Any]) -> None:
    """Refuse a bad training config before the workload queues, with every problem named.

    ``init_from: {workload, step}`` names another workload's checkpoint: its shape is checked here, whether it can
    resolve by the control actor at submit, and it becomes a directory when the gang starts."""
    from raylane.control.checkpoints import parse_ref
    from workloads.ray_train import check_config

    cfg = {k: v for k, v in (spec.get("config") or {}).items() if k not in ("storage_path", "fault")}
    if parse_ref(cfg.get("init_from")) is not None:
        cfg.pop("init_from")
    check_config(cfg)


def threading_main() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


def _wait_admitted(ctl, wid: str, poll_s: float) -> Dict[str, Any]:
    from raylane.control.client import call

    last = None
    while True:
        rec = call(ctl, "wait_admission", wid, poll_s)
        if rec["state"] in ("CANCELLED", "FAILED", "SUCCEEDED", "REJECTED"):
            return rec
        if rec.get("ready"):
            return rec
        shown = (rec.get("position"), rec.get("reason"))
        if shown != last and rec["state"] == "PENDING":
            _say(f"{wid} waiting: position {rec.get('position') or '-'}: {rec.get('reason') or 'queued'}")
            last = shown


def _drive(ctl, wid, spec, *, train_fn, storage_path, tracking_uri, poll_s) -> Dict[str, Any]:
    from raylane.control.client import call
    from raylane.errors import FatalError
    from raylane.launchers.train import DEFAULT_STORAGE, StopPoll, build_trainer
    from raylane.tracking import RunTracker, wrap_hooks_factory

    storage_path = storage_path or spec.get("config", {}).get("storage_path") or DEFAULT_STORAGE
    tracker = RunTracker(workload_id=wid, spec=spec, tracking_uri=tracking_uri)
    run_id = tracker.start()
    call(ctl, "report", wid, "event", mlflow_run_id=run_id, note=f"MLflow run {run_id}")
    retry_budget = int(call(ctl, "class_info", spec["class"])["retry_budget"])
    failures = 0
    while True:
        rec = _wait_admitted(ctl, wid, poll_s)
        if rec["state"] in ("CANCELLED", "FAILED", "SUCCEEDED", "REJECTED"):
            tracker.finish("KILLED" if rec["state"] == "CANCELLED" else rec["state"])
            return rec
        attempt_t0 = time.time()
        _say(f"{wid} admitted on {len(set(rec['placement']))} node(s); starting the gang")
        if call(ctl, "report", wid, "running", job_id=_job_id(), note="gang starting")["state"] != "RUNNING":
            continue  # preempted or cancelled between admission and start: wait again
        loop_cfg = dict(spec.get("config", {}))
        loop_cfg.pop("storage_path", None)
        try:
            loop_cfg.update(_resolved_init(ctl, wid, loop_cfg))
        except FatalError as exc:  # the checkpoint it starts from can never exist: no attempt will do better
            return _fail_now(ctl, tracker, wid, f"{exc}")
        fault = loop_cfg.pop("fault", None)
        loop_cfg["stop_poll"] = StopPoll(wid)
        loop_cfg["wrap_hooks"] = _compose(wrap_hooks_factory(run_id, tracker.tracking_uri),
                                          _fault_hooks(fault, storage_path, wid))
        trainer = build_trainer(workload_id=wid, spec=spec, placement=rec["placement"], storage_path=storage_path,
                                train_loop_config=loop_cfg, train_fn=train_fn)
        error: Optional[BaseException] = None
        result = None
        try:
            result = trainer.fit()
        except Exception as exc:  # noqa: BLE001 - classified below: forced stop, cancel, or a crash to retry
            error = exc
        state = call(ctl, "status", wid)["state"]
        out = (result.return_value or {}) if result is not None else {}
        step = out.get("step")
        if state == "CANCELLED":
            tracker.event("cancelled", f"cancelled at step {step}")
            tracker.finish("KILLED")
            return call(ctl, "status", wid)
        # A gang that reached its last step finished, even if a preemption arrived meanwhile.
        done = error is None and out.get("status") == "finished"
        if not done and (state in ("PREEMPTING", "PENDING") or out.get("status") == "yielded"):
            how = "yielded" if error is None else "stopped by force"
            tracker.event("preempted", f"{how} at step {step}", step=step)
            _say(f"{wid} preempted ({how}) at step {step}; releasing the lease")
            call(ctl, "release", wid, "yielded", step=step)
            continue
        if error is None:
            tracker.event("finished", f"finished at step {step}", step=step)
            _log_model(tracker, storage_path, wid)
            tracker.finish("FINISHED")
            rec = call(ctl, "release", wid, "finished", state="SUCCEEDED", step=step,
                       detail=f"{step} steps in {time.time() - attempt_t0:.0f}s (last attempt)")
            _say(f"{wid} finished at step {step}")
            return rec
        fatal = _fatal_cause(error)
        if fatal is not None:  # bad config, missing checkpoint: every attempt would fail the same way
            return _fail_now(ctl, tracker, wid, f"{_short(fatal)} (not retried: it fails the same way every time)")
        failures += 1
        if failures > retry_budget:
            return _fail_now(ctl, tracker, wid,
                             f"gang failed {failures} times (retry budget {retry_budget}): {_short(error)}")
        backoff = min(2.0 ** (failures - 1), 30.0)
        tracker.event("restarted", f"attempt {failures} failed ({_short(error)}); retry in {backoff:g}s")
        call(ctl, "report", wid, "event", restart=True, note=f"restart {failures}/{retry_budget} after "
                                                              f"{_short(error)}; backoff {backoff:g}s")
        _say(f"{wid} gang failed ({_short(error)}); retry {failures}/{retry_budget} in {backoff:g}s")
        time.sleep(backoff)


def _resolved_init(ctl, wid: str, cfg: Dict[str, Any]) -> Dict[str, Any]:
    """``init_from: {workload, step}`` as the directory the control actor pinned for this workload."""
    from raylane.control.checkpoints import parse_ref
    from raylane.control.client import call

    if parse_ref(cfg.get("init_from")) is None:
        return {}
    got = call(ctl, "resolve_checkpoint", wid)
    _say(f"{wid} starts from {got['source']}'s checkpoint at step {got['step']}: {got['path']}")
    return {"init_from": got["path"]}


def _fatal_cause(error: Optional[BaseException]) -> Optional[BaseException]:
    """The error behind a failed attempt that no retry can fix (a ``FatalError`` such as a config
    ``ValidationError``, on any worker), or None."""
    from raylane.errors import FatalError

    seen = set()
    todo = [error] if error is not None else []
    while todo:
        exc = todo.pop()
        if exc is None or id(exc) in seen:
            continue
        seen.add(id(exc))
        if isinstance(exc, FatalError):
            return exc
        todo += [getattr(exc, "cause", None), exc.__cause__, exc.__context__]
        todo += list((getattr(exc, "worker_failures", None) or {}).values())
    return None


def _fail_now(ctl, tracker, wid: str, why: str) -> Dict[str, Any]:
    from raylane.control.client import call

    tracker.event("failed", why)
    tracker.finish("FAILED")
    _say(f"{wid} failed: {why}")
    return call(ctl, "release", wid, "failed", state="FAILED", detail=why)


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[-1] if text else ''}"[:300]


def _log_model(tracker, storage_path: str, wid: str) -> None:
    from raylane.launchers.train import latest_checkpoint

    path = latest_checkpoint(storage_path, wid)
    if path:
        tracker.log_model_dir(path, "model")


def _compose(*wrappers):
    wrappers = [w for w in wrappers if w is not None]
    return _Compose(wrappers)


class _Compose:
    def __init__(self, wrappers):
        self.wrappers = wrappers

    def __call__(self, hooks):
        for w in self.wrappers:
            hooks = w(hooks)
        return hooks


def _fault_hooks(fault: Optional[Dict[str, Any]], storage_path: str, wid: str):
    if not fault:
        return None
    from raylane.launchers.faults import Faults

    return Faults(marker_dir=os.path.join(storage_path, wid, "_faults"), **fault)


def main(argv=None) -> int:
    import argparse

    from raylane.config.loader import read_yaml
    from raylane.errors import FatalError

    p = argparse.ArgumentParser(prog="python -m raylane.run", description=__doc__.split("\n\n")[0])
    p.add_argument("spec", nargs="?", help="workload spec (YAML)")
    p.add_argument("--spec-json", default=None, help="the spec itself, as JSON (what `raylane submit` passes)")
    p.add_argument("--storage-path", default=None, help="where checkpoints go (default ~/.raylane/runs)")
    p.add_argument("--tracking-uri", default=None, help="MLflow tracking URI (default sqlite ~/.raylane/mlflow.db)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO)
    try:
        if args.spec_json:
            data = json.loads(args.spec_json)
        elif args.spec:
            data, _ = read_yaml(args.spec, "spec file")
        else:
            p.error("give a spec file or --spec-json")
        rec = run_workload(data, storage_path=args.storage_path, tracking_uri=args.tracking_uri)
    except FatalError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    _say(f"{rec['id']}: {rec['state']} (preemptions {rec['preemptions']}, restarts {rec['restarts']})")
    return 0 if rec["state"] == "SUCCEEDED" else 1


if __name__ == "__main__":
    sys.exit(main())
