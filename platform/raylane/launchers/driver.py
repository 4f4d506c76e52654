"""What every workload driver shares: the one-lease launchers (``raylane.launchers.train``, ``.oneshot``), the
pipeline driver (``raylane.pipelines.driver``) and ``python -m raylane.run``, which starts them.

This module owns the driver's side of the conversation with the control plane that does not depend on the kind:
finding the job's Ray id, connecting to the cluster and the control actor as the job's caller, submitting a
workload and cancelling it when the job is stopped, waiting for admission, telling a failure no retry fixes from
one a retry may fix, and failing a workload at once. It sits below the launchers, the pipeline driver and
``raylane.run`` so that none of them imports another for these.

Words
- *driver*: the Ray job's main process, which drives one workload (or a pipeline's stages) from submission to end.
- *fatal*: an error that fails the same way on every attempt (``fatal_cause``); the workload fails without retry.
"""
from __future__ import annotations

import json
import os
import signal
from typing import Any, Callable, Dict, Optional

__all__ = ["say", "one_line", "ray_job_id", "init_ray", "connect_driver", "registered", "threading_main",
           "wait_admitted", "fatal_cause", "fail_now"]


def ray_job_id() -> Optional[str]:
    """The submission id of the Ray job this driver runs in, or None outside a job."""
    raw = os.environ.get("RAY_JOB_CONFIG_JSON_ENV_VAR")
    if not raw:
        return None
    try:
        return json.loads(raw).get("metadata", {}).get("job_submission_id")
    except json.JSONDecodeError:
        return None


class _Stopped(Exception):
    pass


def say(msg: str) -> None:
    print(f"[raylane] {msg}", flush=True)


def one_line(exc: BaseException) -> str:
    """``Type: last line of the message``, at most 300 characters: how a driver names an error in its output."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[-1] if text else ''}"[:300]


def connect_driver():
    """The control plane, as this driver's caller: with the credential ``raylane.credentials.find`` finds (the one
    ``raylane submit`` sent with the job, or the job's working directory's). With authentication on, a driver
    without a valid credential stops here, before anything queues (``AuthenticationError``)."""
    from raylane.control.client import ControlClient

    ctl = ControlClient.connect()
    who = ctl.whoami()
    if who.get("auth"):
        say(f"acting as {who['user']} ({who['role']}; teams {', '.join(who['teams']) or '-'})")
    return ctl, who


def init_ray() -> None:
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
        say(f"workload {wid} submitted (job {job_id or '-'})")
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
        say(f"job stopped ({exc}); cancelling {wid}")
        ctl.cancel(wid)
        raise SystemExit(130)


def threading_main() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


def wait_admitted(ctl, wid: str, poll_s: float) -> Dict[str, Any]:
    from raylane.control.client import State

    last = None
    while True:
        rec = ctl.wait_admission(wid, poll_s)
        if rec.terminal or rec.ready:
            return rec
        shown = (rec.position, rec.reason)
        if shown != last and rec.state is State.PENDING:
            say(f"{wid} waiting: position {rec.get('position') or '-'}: {rec.get('reason') or 'queued'}")
            last = shown


def fatal_cause(error: Optional[BaseException]) -> Optional[BaseException]:
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


def fail_now(ctl, tracker, wid: str, why: str) -> Dict[str, Any]:
    from raylane.control.client import EndState, Outcome

    tracker.event("failed", why)
    tracker.finish("FAILED")
    say(f"{wid} failed: {why}")
    return ctl.release(wid, Outcome.FAILED, state=EndState.FAILED, detail=why)
