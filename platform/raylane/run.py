"""``python -m raylane.run SPEC.yaml``: the driver of one workload (or of a ``kind: pipeline`` spec's stages,
``raylane.pipelines.driver``), run as a plain Ray job.

    ray job submit --working-dir ./my-project -- python -m raylane.run spec.yaml

The driver checks the spec's code before anything queues (``raylane.entrypoints``: the entrypoint or command is
there, fits the kind, and the config fits the entrypoint's declared schema), then hands the workload to the launcher
of its kind (``raylane.launchers``). Every launcher registers the workload with the control actor (with its Ray job
id, so stopping the job cancels the workload and cancelling the workload stops the job), prints its queue position
and reason while it waits, and starts only once admitted. For training (``raylane.launchers.train``):
- the gang yields when the control actor preempts it (graceful: at its next report with a checkpoint, or at once
  for a loop that asks ``raylane.train.should_yield()``), the driver releases the lease and waits again; admitted
  again, it resumes from the latest checkpoint;
- a gang stopped by force after the grace period is treated the same way (it resumes from its last checkpoint);
- a crash is retried on the same lease from the latest checkpoint with exponential backoff, up to the class's
  retry budget; then the workload fails with the reason. An error no retry fixes (a ``FatalError``, a pydantic
  ``ValidationError``, any exception whose class says ``fatal = True``) fails it at once.
One MLflow run follows the logical workload across all of that (``raylane.tracking``).

``run_workload`` is the same driver from Python; ``train_fn`` runs a function object instead of the entrypoint.
"""
from __future__ import annotations

import json
import logging
import os
import signal
import sys
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
                 tracking_uri: Optional[str] = None, poll_s: float = 2.0,
                 working_dir: Optional[str] = None, workload_id: Optional[str] = None) -> Dict[str, Any]:
    """Check ``spec``'s code, then run it to the end with its kind's launcher; returns the final record.

    ``working_dir``: where the user's code is (default: the job's working directory, which Ray puts on the path).
    ``workload_id``: drive that workload, queued already with this job's id (``raylane submit`` queues it before
    it submits the job; kinds train, eval and batch), instead of submitting the spec."""
    from raylane import entrypoints
    from raylane.launchers import launcher_for

    kind = spec.get("kind", "train") if isinstance(spec, dict) else None
    from raylane.config.loader import load_spec_from_dict

    kwargs: Dict[str, Any] = {}
    if kind != "serve":  # a store MLflow refuses is named now, before anything queues (raylane.locations)
        from raylane.locations import tracking_uri as resolve_tracking_uri

        resolve_tracking_uri(tracking_uri)
    if kind == "train":  # MLflow's import and store open beside the rest of the start-up (raylane.runstart)
        from raylane.runstart import RunStarter

        kwargs["run_starter"] = RunStarter(team=spec.get("team"), tracking_uri=tracking_uri)
    try:
        import ray

        load_spec_from_dict(spec, "spec")  # its shape first: every problem named, before any code is imported
        if train_fn is None:
            with entrypoints.on_path(working_dir):
                entrypoints.check_spec(spec)
        if not ray.is_initialized():
            _init_ray()
        launcher = launcher_for(kind)
        ctl, who = connect_driver()
    except BaseException:
        if "run_starter" in kwargs:
            kwargs["run_starter"].close()
        raise
    if who.get("auth"):  # MLflow records the caller as the owner, not what the spec claims
        spec = {**spec, "run": {**(spec.get("run") or {}), "owner": who["user"]}}
    kwargs.update(ctl=ctl, job_id=_job_id())
    if kind != "serve":
        kwargs.update(storage_path=storage_path, tracking_uri=tracking_uri, poll_s=poll_s)
    if train_fn is not None:
        kwargs["train_fn"] = train_fn
    if workload_id is not None:
        kwargs["workload_id"] = workload_id
    return launcher(spec, **kwargs)


def connect_driver():
    """The control plane, as this driver's caller: with the credential ``raylane.credentials.find`` finds (the one
    ``raylane submit`` sent with the job, or the job's working directory's). With authentication on, a driver
    without a valid credential stops here, before anything queues (``AuthenticationError``)."""
    from raylane.control.client import ControlClient

    ctl = ControlClient.connect()
    who = ctl.whoami()
    if who.get("auth"):
        _say(f"acting as {who['user']} ({who['role']}; teams {', '.join(who['teams']) or '-'})")
    return ctl, who


def _init_ray() -> None:
    """Connect the job's driver to its cluster, staying in the job's working directory (``raylane.locations``: on
    several nodes of one machine, connecting has other nodes unpack the working directory again over this one)."""
    import ray

    from raylane.locations import ensure_cwd

    ensure_cwd()
    os.environ["PWD"] = os.getcwd()
    ray.init(address=os.environ.get("RAY_ADDRESS", "auto"), namespace="raylane", log_to_driver=True)
    ensure_cwd()


def registered(ctl, spec: Dict[str, Any], job_id: Optional[str],
               drive: Callable[[str], Dict[str, Any]], workload_id: Optional[str] = None) -> Dict[str, Any]:
    """Submit ``spec`` to the control actor (unless ``workload_id`` names it, submitted already: a pipeline's
    stage), then ``drive(workload_id)``; ``ray job stop`` (SIGTERM or SIGINT) cancels the workload. What one-lease
    launchers (train, eval, batch) share."""
    if workload_id is None:
        wid = ctl.submit(spec, job_id=job_id).id
        _say(f"workload {wid} submitted (job {job_id or '-'})")
    else:
        wid = workload_id

    def on_signal(signum, frame):  # `ray job stop` sends SIGTERM (or SIGINT): the workload is cancelled
        raise _Stopped(signal.Signals(signum).name)

    if threading_main():
        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
    try:
        return drive(wid)
    except _Stopped as exc:
        _say(f"job stopped ({exc}); cancelling {wid}")
        ctl.cancel(wid)
        raise SystemExit(130)


def threading_main() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


def _wait_admitted(ctl, wid: str, poll_s: float) -> Dict[str, Any]:
    from raylane.control.client import State

    last = None
    while True:
        rec = ctl.wait_admission(wid, poll_s)
        if rec.terminal or rec.ready:
            return rec
        shown = (rec.position, rec.reason)
        if shown != last and rec.state is State.PENDING:
            _say(f"{wid} waiting: position {rec.get('position') or '-'}: {rec.get('reason') or 'queued'}")
            last = shown


def _fatal_cause(error: Optional[BaseException]) -> Optional[BaseException]:
    """The error behind a failed attempt that no retry can fix, on any worker, or None: a ``FatalError`` (such as
    a config ``ValidationError``), a pydantic ``ValidationError`` (a config schema refused the config), or any
    exception whose class sets ``fatal = True`` (the reference workloads' ``ConfigError``; a user's own may too)."""
    import pydantic

    from raylane.errors import FatalError

    seen = set()
    todo = [error] if error is not None else []
    while todo:
        exc = todo.pop()
        if exc is None or id(exc) in seen:
            continue
        seen.add(id(exc))
        if isinstance(exc, (FatalError, pydantic.ValidationError)) or getattr(type(exc), "fatal", False) is True:
            return exc
        todo += [getattr(exc, "cause", None), exc.__cause__, exc.__context__]
        todo += list((getattr(exc, "worker_failures", None) or {}).values())
    return None


def _fail_now(ctl, tracker, wid: str, why: str) -> Dict[str, Any]:
    from raylane.control.client import EndState, Outcome

    tracker.event("failed", why)
    tracker.finish("FAILED")
    _say(f"{wid} failed: {why}")
    return ctl.release(wid, Outcome.FAILED, state=EndState.FAILED, detail=why)


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[-1] if text else ''}"[:300]


def main(argv=None) -> int:
    import argparse

    from raylane.config.loader import read_yaml
    from raylane.errors import FatalError

    p = argparse.ArgumentParser(prog="python -m raylane.run", description=__doc__.split("\n\n")[0])
    p.add_argument("spec", nargs="?", help="workload spec (YAML)")
    p.add_argument("--spec-json", default=None, help="the spec itself, as JSON (what `raylane submit` passes)")
    p.add_argument("--storage-path", default=None, help="where checkpoints go (default ~/.raylane/runs)")
    p.add_argument("--tracking-uri", default=None, help="MLflow tracking URI (default sqlite ~/.raylane/mlflow.db)")
    p.add_argument("--workload-id", default=None, help="drive this workload, queued already with this job's id "
                                                       "(what `raylane submit` passes)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO)
    try:
        if args.spec_json:
            data = json.loads(args.spec_json)
        elif args.spec:
            data, _ = read_yaml(args.spec, "spec file")
        else:
            p.error("give a spec file or --spec-json")
        if isinstance(data, dict) and data.get("kind") == "pipeline":  # raylane.pipelines
            from raylane.pipelines.driver import run_pipeline

            view = run_pipeline(data, storage_path=args.storage_path, tracking_uri=args.tracking_uri)
            return 0 if view["state"] == "SUCCEEDED" else 1
        rec = run_workload(data, storage_path=args.storage_path, tracking_uri=args.tracking_uri,
                           workload_id=args.workload_id)
    except FatalError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    _say(f"{rec['id']}: {rec['state']} (preemptions {rec['preemptions']}, restarts {rec['restarts']})")
    return 0 if rec["state"] == "SUCCEEDED" else 1


if __name__ == "__main__":
    sys.exit(main())
