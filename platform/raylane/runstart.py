"""Starting a workload's MLflow run beside the driver's own start-up, in a child process.

A training driver needs its MLflow run's id before the gang starts (the workers log to it), but importing MLflow
and opening its store costs 2-3 s of CPU on a small machine: on the way from submit to the first step, that was a
third of Raylane's overhead over a bare Ray Train job. ``RunStarter`` moves it to a child process started as soon
as the spec is read: the child imports ``raylane.tracking`` and opens the experiment while the driver connects to
Ray, imports Ray Train and submits; the driver then hands it the workload id and gets the run id back
(``RunTracker.start`` in the child: the same run a driver of the same workload would find or create).

The gang does not wait for the run either (``PendingRun``): the driver awaits the child's answer in a thread and
names the run to the control actor (``mlflow_run_id`` of an event), while Ray Train starts the workers; each worker
waits for that name before the user's loop runs (``raylane.train``), which on an idle cluster it has long had.

The driver's own ``RunTracker`` (for events and the end of the run) is built when first used, after the gang has
started (``LateTracker``); its ``start()`` finds the run the child made.

Glossary
- *child*: ``python -m raylane.runstart``; reads one JSON line (what it can prepare: tracking URI, team), then a
  second (workload id and spec; an empty line means "not needed"), and writes one JSON line (``run_id``,
  ``tracking_uri``, ``resumed``) or an ``error`` with its type and message.

This module imports neither MLflow nor Ray in the driver.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from dataclasses import dataclass
from typing import Any, Callable, Dict, Mapping, Optional

from raylane.errors import FatalError, RaylaneError, RetryableError, ValidationError

__all__ = ["RunStarter", "StartedRun", "PendingRun", "LateTracker", "START_ENV", "MIN_CPUS", "use_child"]

# How a driver starts its MLflow run: ``child`` (a ``RunStarter``), ``inline`` (in the driver, before the gang), or
# unset: a child where the driver has at least ``MIN_CPUS`` CPUs to run it on beside its own start-up. The child
# gains time only on spare CPUs: it costs about 3.7 s of CPU per job on top of the driver's own MLflow import (which
# the driver does anyway, for the run's events and its end), and on a 2-core machine it takes those CPUs from the
# driver's start-up and the gang's.
START_ENV = "RAYLANE_RUN_START"
MIN_CPUS = 4

# How long the driver waits for the child's answer once it asked (a slow MLflow server, a locked sqlite file).
ANSWER_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class StartedRun:
    run_id: str
    tracking_uri: str
    resumed: bool


class RunStarter:
    """A child process that starts one workload's MLflow run: ``ask`` then ``result``, or ``close`` if not needed."""

    def __init__(self, *, team: Optional[str], tracking_uri: Optional[str]):
        self._proc: Optional[subprocess.Popen] = subprocess.Popen(
            [sys.executable, "-m", "raylane.runstart"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True, cwd=os.getcwd(), env=_child_env())
        self._asked: Optional[str] = None
        self._lock = threading.Lock()  # ``result`` may run in a ``PendingRun``'s thread while the driver closes
        self._send({"team": team, "tracking_uri": tracking_uri})

    def _send(self, message: Optional[Mapping[str, Any]]) -> None:
        assert self._proc is not None and self._proc.stdin is not None
        try:
            self._proc.stdin.write((json.dumps(message) if message is not None else "") + "\n")
            self._proc.stdin.flush()
        except BrokenPipeError:  # the child died already: ``start`` reports its error
            pass

    def ask(self, *, workload_id: str, spec: Mapping[str, Any]) -> None:
        """Ask the child for the run of ``workload_id`` (created, or found if it exists); ``result`` gives it."""
        if self._proc is None or self._asked is not None:
            raise RuntimeError("RunStarter.ask called twice, or after close")
        self._asked = workload_id
        self._send({"workload_id": workload_id, "spec": dict(spec)})

    def result(self) -> StartedRun:
        """The child's answer to ``ask`` (waits for it; the first call only)."""
        with self._lock:
            if self._proc is None or self._asked is None:
                raise RuntimeError("RunStarter.result called before ask, or twice")
            proc, self._proc, wid = self._proc, None, self._asked
        try:
            out, err = proc.communicate(timeout=ANSWER_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            raise RetryableError(f"the MLflow run of {wid} was not started within {ANSWER_TIMEOUT_S:g}s")
        answer = _last_json(out)
        if answer is None:
            raise RetryableError(f"starting the MLflow run of {wid} failed (exit {proc.returncode}): "
                                 f"{err.strip()[-2000:] or 'no output'}")
        if "error" in answer:
            raise _error(answer)
        return StartedRun(answer["run_id"], answer["tracking_uri"], bool(answer["resumed"]))

    def close(self) -> None:
        """Not needed after all (the driver stopped before submitting): the child exits without a run."""
        with self._lock:
            proc, self._proc = self._proc, None
        if proc is not None:
            try:
                proc.communicate(None if self._asked else "\n", timeout=30)
            except (subprocess.TimeoutExpired, BrokenPipeError, ValueError):
                proc.kill()
                proc.communicate()


class PendingRun:
    """A ``RunStarter``'s answer, awaited in a thread, so that the gang starts without it: ``announce(started)``
    runs in that thread once the run exists (the training driver names it to the control actor there), and
    ``fail(error)`` if it could not be started. ``result()`` waits for the answer and returns it, or raises the
    child's error."""

    def __init__(self, starter: RunStarter, *, announce: Callable[[StartedRun], None],
                 fail: Callable[[BaseException], None]):
        self._started: Optional[StartedRun] = None
        self._error: Optional[BaseException] = None
        self.announced = False
        self._thread = threading.Thread(target=self._await, args=(starter, announce, fail),
                                        name="raylane-run-starter", daemon=True)
        self._thread.start()

    def _await(self, starter: RunStarter, announce, fail) -> None:
        try:
            self._started = starter.result()
        except BaseException as exc:  # noqa: BLE001 - raised again by result(), in the driver's own thread
            self._error = exc
            _quietly(fail, exc)
            return
        self.announced = _quietly(announce, self._started)

    def done(self) -> bool:
        return not self._thread.is_alive()

    def result(self) -> StartedRun:
        self._thread.join()
        if self._error is not None:
            raise self._error
        assert self._started is not None
        return self._started


def _quietly(fn: Callable[[Any], None], arg: Any) -> bool:
    """``fn(arg)``; False (logged) if it raised: the control actor restarting must not lose the run's answer."""
    import logging

    try:
        fn(arg)
        return True
    except Exception:  # noqa: BLE001
        logging.getLogger("raylane.runstart").warning("could not tell the control actor about the MLflow run",
                                                      exc_info=True)
        return False


class LateTracker:
    """A ``RunTracker`` made on first use: attribute access builds it (``make()``) and starts it (which finds the
    run the child created), so MLflow is imported in the driver only once something is logged."""

    def __init__(self, make: Callable[[], Any]):
        self._make = make
        self._tracker = None

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        if self._tracker is None:
            tracker = self._make()
            tracker.start()
            self._tracker = tracker
        return getattr(self._tracker, name)


def use_child(environ: Optional[Mapping[str, str]] = None, cpus: Optional[int] = None) -> bool:
    """Whether a driver starts its MLflow run in a child process (``START_ENV``); ``cpus``: the CPUs this process
    may run on (default: its affinity)."""
    environ = os.environ if environ is None else environ
    how = (environ.get(START_ENV) or "").strip().lower()
    if how in ("child", "inline"):
        return how == "child"
    if how:
        raise ValidationError("environment", [(START_ENV, environ.get(START_ENV),
                                                "child, inline, or unset (a child with at least "
                                                f"{MIN_CPUS} CPUs)")])
    if cpus is None:
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return cpus >= MIN_CPUS


def _child_env() -> Dict[str, str]:
    env = dict(os.environ)
    # The child imports raylane from wherever this driver does (an editable install, or the job's working directory).
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    return env


def _last_json(out: str) -> Optional[Dict[str, Any]]:
    for line in reversed((out or "").splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                return None
    return None


def _error(answer: Mapping[str, Any]) -> RaylaneError:
    kind, message = answer.get("type", ""), answer.get("error", "")
    if kind == "ValidationError" and answer.get("errors"):
        return ValidationError(answer.get("source", "run tracker"), [tuple(e) for e in answer["errors"]])
    if kind in ("ValidationError", "FatalError", "UnknownNameError", "NotFoundError"):
        return FatalError(message)
    return RetryableError(f"starting the MLflow run failed: {kind}: {message}")


def main() -> int:
    """The child: prepare, then start the run it is asked for (see the module docstring)."""
    first = sys.stdin.readline()
    try:
        prepared = json.loads(first) if first.strip() else {}
        from raylane.tracking import client_for, tracking_uri

        team = prepared.get("team")
        if isinstance(team, str):  # open the store now (sqlite: its schema check), while the driver is busy
            client_for(tracking_uri(prepared.get("tracking_uri"))).get_experiment_by_name(f"raylane/{team}")
    except Exception:  # noqa: BLE001 - reported below, if the run is asked for at all
        pass
    second = sys.stdin.readline()
    if not second.strip():
        return 0
    try:
        from raylane.tracking import RunTracker

        req = json.loads(second)
        tracker = RunTracker(workload_id=req["workload_id"], spec=req["spec"],
                             tracking_uri=prepared.get("tracking_uri"))
        run_id = tracker.start()
        answer: Dict[str, Any] = {"run_id": run_id, "tracking_uri": tracker.tracking_uri, "resumed": tracker.resumed}
    except Exception as exc:  # noqa: BLE001 - every failure goes back to the driver, typed
        answer = {"error": str(exc), "type": type(exc).__name__}
        if isinstance(exc, ValidationError):
            answer.update(source=exc.source, errors=[[str(e[0]), e[1] if isinstance(e[1], (str, int, float, bool, type(None))) else repr(e[1]), str(e[2])] for e in exc.errors])
    sys.stdout.write(json.dumps(answer) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
