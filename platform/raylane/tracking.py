"""MLflow tracking of Raylane workloads: one MLflow run per logical workload, across restarts and preemptions.

This module owns the MLflow side of a workload: which experiment and run hold it, what the run records about the
spec and the environment it ran in, the run's event log, and the training metrics rank 0 of a gang reports.
It is the only module that writes the ``raylane.*`` tags and params of a run; the driver writes through
``RunTracker``, rank 0 of a training gang through ``MetricLogger`` (the metrics of its ``ray.train.report`` calls).
It never imports Ray.

Words:
- *workload id*: the control plane's id of one submission (``pretrain-tiny-lm-1a2b3c``). It is the key of the run:
  the run carries it as the tag ``raylane.workload_id`` and ``RunTracker.start()`` finds the run by it, so a driver
  that restarts, or a workload resumed after a preemption, goes on writing the same run.
- *attempt*: one stretch of execution of a workload, ended by a preemption, a yield, a crash or the finish. Attempts
  do not end the MLflow run (see *run lifecycle*); they are recorded as *events*.
- *event*: a line of the run's ``events.jsonl`` artifact (``{"seq", "time", "kind", "detail", "data"}``), in the
  order the driver recorded them. Kinds ``preempted`` and ``restarted`` also bump the tags ``raylane.preemptions``
  and ``raylane.restarts``, which are counted from the log itself so the two never disagree.
- *global step*: the optimizer step the training loop reports, which goes on from the checkpoint after a resume.
  Every metric is logged against it.
- *high-water mark*: the tag ``raylane.metrics_step``, the last global step whose metrics reached MLflow. It is
  written in the same ``log_batch`` as the metrics, so a resumed attempt that re-runs steps past its checkpoint
  (after a crash, say) does not log them twice: steps at or below the mark are dropped. On CPU the re-run steps are
  bit-identical to the lost ones, so nothing is lost by keeping the first copy.

Run lifecycle (the choice made here): the run stays ``RUNNING`` between attempts; a preemption or a yield is an
event, not an end. Only ``RunTracker.finish(status)`` ends the run, as ``FINISHED``, ``FAILED`` or ``KILLED``
(cancelled). A ``start()`` that finds its run already ended (a workload run again after it finished or failed)
reopens it as ``RUNNING``. A driver that dies leaves the run ``RUNNING`` until the next driver finishes it.

Tracking URIs: MLflow 3.x refuses ``file://`` stores, so the default is a sqlite database
(``~/.raylane/mlflow.db``), with artifacts in the directory ``mlartifacts`` next to it; both are readable by their
user only (0600, 0700). Every process of a gang must reach the store: on a cluster of several machines, use an
MLflow server (``http://...``) or a sqlite file on a shared file system.

Errors: ``RunTracker`` lets MLflow's errors through (the caller decides whether tracking may fail a workload).
``MetricLogger`` never raises into the training loop: a failed flush is logged and retried at the next one, because
losing metrics is cheaper than losing a training run.
"""
from __future__ import annotations


import importlib.metadata
import json
import logging
import os
import platform
import re
import socket
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Optional, Sequence, TypeVar, Union

import yaml
from mlflow import MlflowClient
from mlflow.entities import Metric, Param, Run, RunTag, ViewType
from mlflow.exceptions import MlflowException

from raylane.errors import FatalError, NotFoundError, ValidationError
from raylane.locations import (  # noqa: F401 - importable from here as before
    DEFAULT_TRACKING_URI, _default_uri, _env_uri, _normalise, _sqlite_path, ensure_cwd, tracking_uri)

__all__ = [
    "DEFAULT_TRACKING_URI",
    "STATE_TO_STATUS",
    "TERMINAL_STATUSES",
    "MetricLogger",
    "RunTracker",
    "close_run",
    "code_version",
    "spec_params",
    "tracking_uri",
]

logger = logging.getLogger(__name__)

# Tags and params this module owns.
TAG_WORKLOAD_ID = "raylane.workload_id"
TAG_PREEMPTIONS = "raylane.preemptions"
TAG_RESTARTS = "raylane.restarts"
TAG_RESIZES = "raylane.resizes"
METRIC_WORKERS = "workers"
TAG_LAST_EVENT = "raylane.last_event"
TAG_METRICS_STEP = "raylane.metrics_step"
TAG_INITIALISED = "raylane.initialised"  # set last, once params and artifacts of a new run are all logged
TAG_SNAPSHOT_SEEN = "raylane.data_snapshot.observed"  # a snapshot other than the logged param was trained on
TAG_END_REASON = "raylane.end_reason"  # why the control plane ended a run its driver left open (close_run)
TAG_COST = "raylane.cost"  # what the run's leases cost (raylane.cost), also its metric METRIC_COST
METRIC_COST = "cost"
PARAM_CODE_VERSION = "raylane.code_version"
PARAM_DATA_SNAPSHOT = "raylane.data_snapshot"
EVENTS_ARTIFACT = "events.jsonl"
COUNTED_EVENTS = {"preempted": TAG_PREEMPTIONS, "restarted": TAG_RESTARTS, "resized": TAG_RESIZES}
TERMINAL_STATUSES = ("FINISHED", "FAILED", "KILLED")
# The control plane's terminal workload states, as the MLflow status ``finish`` gives the run.
STATE_TO_STATUS = {"SUCCEEDED": "FINISHED", "FAILED": "FAILED", "CANCELLED": "KILLED", "REJECTED": "FAILED"}

# MLflow's limits (mlflow.utils.validation): longer values are refused, bigger batches too.
_MAX_PARAM_VALUE = 6000
_MAX_TAG_VALUE = 8000
_MAX_PARAMS_TAGS_PER_BATCH = 100
_MAX_METRICS_PER_BATCH = 1000
_BAD_KEY_CHARS = re.compile(r"[^A-Za-z0-9_\-. /]")

def client_for(uri: str) -> MlflowClient:
    """An ``MlflowClient`` whose store is initialised. For sqlite, creating the tables is a migration that two
    processes opening a new database at once would race on (the driver, rank 0, a reader), so it runs under an
    exclusive file lock beside the database."""
    ensure_cwd()
    db = _sqlite_path(uri)
    if db is None:
        return MlflowClient(tracking_uri=uri)
    import fcntl

    _private_store(db)
    with os.fdopen(os.open(f"{db}.lock", os.O_WRONLY | os.O_CREAT, 0o600), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            return MlflowClient(tracking_uri=uri)  # opening the store creates and migrates the tables
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _private_store(db: Path) -> None:
    """Make the sqlite store ``db`` and its artifact folder readable by this user only: they hold every team's runs
    (specs as params, metrics, configs, models). The database is created 0600 (sqlite gives its journal the same
    mode) and ``mlartifacts`` 0700; a database or artifact folder left group- or world-readable by an older version
    loses those bits. A missing parent folder is created 0700; an existing one (a project folder, say) is left as is.
    A file of another user, which this process may not chmod, is left as is too."""
    db.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.close(os.open(db, os.O_RDWR | os.O_CREAT, 0o600))
    artifacts = db.parent / _ARTIFACT_DIR
    artifacts.mkdir(exist_ok=True, mode=0o700)
    for path in (db, artifacts):
        try:
            mode = path.stat().st_mode & 0o777
            if mode & 0o077:
                os.chmod(path, mode & 0o700)
        except OSError:
            pass


_ARTIFACT_DIR = "mlartifacts"


def _artifact_root(uri: str) -> Optional[str]:
    """Where a new experiment keeps its artifacts: ``mlartifacts`` next to a sqlite database; the server's own
    choice otherwise."""
    db = _sqlite_path(uri)
    return str(db.parent / _ARTIFACT_DIR) if db is not None else None


# ---------------------------------------------------------------------------------------------------------------
# What a run records about its code and environment.


def code_version(repo_dir: Union[str, Path, None] = None) -> str:
    """``git rev-parse HEAD`` of ``repo_dir`` (default: the working directory), with ``-dirty`` when
    ``git status --porcelain`` lists anything (untracked files included); ``"unknown"`` outside git. Never raises."""
    cwd = str(repo_dir) if repo_dir is not None else None
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=10)
        if head.returncode != 0 or not head.stdout.strip():
            return "unknown"
        status = subprocess.run(["git", "status", "--porcelain"], cwd=cwd, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    dirty = status.returncode == 0 and bool(status.stdout.strip())
    return head.stdout.strip() + ("-dirty" if dirty else "")


def _distributions() -> list[str]:
    """``name==version`` of every installed distribution, sorted: ``pip freeze`` without needing pip."""
    found: dict[str, str] = {}
    for dist in importlib.metadata.distributions():
        name = dist.metadata["Name"]
        if name:
            found.setdefault(name.lower(), f"{name}=={dist.version}")
    return [found[k] for k in sorted(found)]


def _version(dist: str) -> Optional[str]:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _platform_info() -> dict[str, Any]:
    return {
        "python": platform.python_version(),
        "python_implementation": platform.python_implementation(),
        "executable": sys.executable,
        "platform": platform.platform(),
        "hostname": socket.gethostname(),
        "cpu_count": os.cpu_count(),
        **{name: _version(name) for name in ("raylane", "torch", "ray", "mlflow")},
    }


# ---------------------------------------------------------------------------------------------------------------
# Spec -> params and tags (pure).


def _spec_dict(spec: Any) -> dict[str, Any]:
    if hasattr(spec, "model_dump"):  # a WorkloadSpec: the dict a user would have written
        return spec.model_dump(by_alias=True, mode="json", exclude_none=True)
    if not isinstance(spec, Mapping):
        raise ValidationError("workload spec", [("<spec>", spec, "a mapping (a workload spec as a dict)")])
    return dict(spec)


def _spec_class(spec: Mapping[str, Any]) -> Optional[str]:
    return spec.get("class", spec.get("class_"))


def _param_value(value: Any) -> str:
    if isinstance(value, str):
        text = value
    elif isinstance(value, (list, tuple, dict)):
        text = json.dumps(value, default=str)
    else:
        text = str(value)
    return text if len(text) <= _MAX_PARAM_VALUE else text[: _MAX_PARAM_VALUE - 3] + "..."


def _flatten(d: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    for key, value in d.items():
        name = f"{prefix}{_BAD_KEY_CHARS.sub('_', str(key))}"
        if isinstance(value, Mapping) and value:
            yield from _flatten(value, name + ".")
        else:
            yield name, value


def spec_params(spec: Mapping[str, Any], code: str) -> dict[str, str]:
    """The params a new run gets: the spec's ``config`` flattened with dots and unprefixed (the way Ray Tune's
    MLflow logger names them, so runs and Tune trials compare column by column), then under ``raylane.``: the gang
    (``raylane.gang.workers``, ``raylane.gang.resources.gpu``...), ``raylane.class``, ``raylane.kind``,
    ``raylane.code_version`` (``code``) and ``raylane.data_snapshot`` when the spec names one."""
    params = {k: _param_value(v) for k, v in _flatten(spec.get("config") or {})}
    params.update({k: _param_value(v) for k, v in _flatten(spec.get("gang") or {}, "raylane.gang.")})
    for key, value in (("raylane.class", _spec_class(spec)), ("raylane.kind", spec.get("kind"))):
        if value is not None:
            params[key] = _param_value(value)
    params[PARAM_CODE_VERSION] = code
    snapshot = (spec.get("run") or {}).get("data_snapshot")
    if snapshot:
        params[PARAM_DATA_SNAPSHOT] = str(snapshot)
    return params


def _spec_tags(workload_id: str, spec: Mapping[str, Any], code: str) -> dict[str, str]:
    run = spec.get("run") or {}
    tags = {
        TAG_WORKLOAD_ID: workload_id,
        "raylane.team": spec.get("team"),
        "raylane.class": _spec_class(spec),
        "raylane.kind": spec.get("kind"),
        "raylane.owner": run.get("owner"),
        "raylane.intent": run.get("intent"),
        "mlflow.note.content": run.get("intent"),  # the run's description in the MLflow UI
        "mlflow.user": run.get("owner"),
        "mlflow.source.git.commit": code.removesuffix("-dirty") if code != "unknown" else None,
        TAG_PREEMPTIONS: "0",
        TAG_RESTARTS: "0",
    }
    stage_of = spec.get("pipeline")
    if isinstance(stage_of, Mapping):  # a pipeline's stage (raylane.pipelines): a child of the pipeline's run
        tags.update({"raylane.pipeline": stage_of.get("name"), "raylane.pipeline.stage": stage_of.get("stage"),
                     "mlflow.parentRunId": stage_of.get("parent_run_id")})
    return {k: _tag_value(v) for k, v in tags.items() if v is not None}


def _tag_value(value: Any) -> str:
    text = str(value)
    return text if len(text) <= _MAX_TAG_VALUE else text[: _MAX_TAG_VALUE - 3] + "..."


T = TypeVar("T")


def _chunks(items: Sequence[T], size: int) -> Iterator[Sequence[T]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


def _log_snapshot(client: MlflowClient, run_id: str, snapshot: str) -> None:
    """Log ``raylane.data_snapshot`` unless already there. MLflow params are write-once, so a different snapshot
    seen later goes to the tag ``raylane.data_snapshot.observed`` with a warning."""
    logged = client.get_run(run_id).data.params.get(PARAM_DATA_SNAPSHOT)
    if logged is None:
        client.log_batch(run_id, params=[Param(PARAM_DATA_SNAPSHOT, snapshot)])
    elif logged != snapshot:
        logger.warning("run %s: trained on data snapshot %s, but the run records %s", run_id, snapshot, logged)
        client.set_tag(run_id, TAG_SNAPSHOT_SEEN, snapshot)


# ---------------------------------------------------------------------------------------------------------------
# The driver's side.


class RunTracker:
    """The MLflow run of one workload, seen from its driver. ``start()`` first; every other method needs it.

    Not thread-safe: one tracker per driver, used from one thread. Two drivers that start the same workload at
    the same moment both end up on the older run (the younger one is deleted), so there is one run per workload id.
    """

    def __init__(
        self,
        *,
        workload_id: str,
        spec: Mapping[str, Any],
        tracking_uri: Optional[str] = None,
        experiment: Optional[str] = None,
        cost_of: Optional[Callable[[str], float]] = None,
    ):
        """``cost_of(run_id)``: what the run's leases cost (``ControlClient.run_cost``); ``finish`` records it."""
        spec = _spec_dict(spec)
        errors: list[tuple[str, object, str]] = []
        if not isinstance(workload_id, str) or not workload_id.strip() or re.search(r"['\"\\\x00-\x1f]", workload_id):
            errors.append(("workload_id", workload_id,
                           "a non-empty string without quotes, backslashes or control characters"))
        if experiment is None and not isinstance(spec.get("team"), str):
            errors.append(("spec.team", spec.get("team"), "a team name (or pass experiment=)"))
        if errors:
            raise ValidationError("run tracker", errors)
        self.workload_id = workload_id
        self.spec = spec
        self.tracking_uri = _resolve_uri(tracking_uri)
        self.experiment = experiment or f"raylane/{spec['team']}"
        self.resumed = False  # True once start() found a run of this workload that already existed
        self.cost_of = cost_of
        self._client: Optional[MlflowClient] = None
        self._run_id: Optional[str] = None
        self._events: Optional[list[dict[str, Any]]] = None  # the event log, loaded on first use

    # -- identity

    @property
    def run_id(self) -> str:
        if self._run_id is None:
            raise FatalError(f"RunTracker({self.workload_id!r}): call start() before using the run")
        return self._run_id

    @property
    def client(self) -> MlflowClient:
        if self._client is None:
            self._client = client_for(self.tracking_uri)
        return self._client

    def start(self) -> str:
        """The run id of this workload: the existing run (reopened if it had ended), or a new one with the spec's
        params and tags and the ``config/`` and ``environment/`` artifacts. Calling it again returns the same id."""
        if self._run_id is not None:
            return self._run_id
        experiment_id = self._experiment_id()
        runs = self._find(experiment_id)
        if runs:
            run, self.resumed = runs[0], True
        else:
            created = self.client.create_run(
                experiment_id, tags=_spec_tags(self.workload_id, self.spec, self._code_version()),
                run_name=self.spec.get("name") or self.workload_id,
            )
            # Another driver may have created one at the same moment: all agree on the oldest and drop the rest.
            run = self._find(experiment_id)[0]
            if run.info.run_id != created.info.run_id:
                self.client.delete_run(created.info.run_id)
                self.resumed = True
        self._run_id = run.info.run_id
        if run.info.status != "RUNNING":
            self.client.update_run(self._run_id, status="RUNNING")
        if run.data.tags.get(TAG_INITIALISED) != "1":  # new, or its creator died half-way: finish the job
            self._initialise(run)
        return self._run_id

    def find(self) -> Optional[str]:
        """The id of this workload's run if one exists, without creating or changing anything (for readers that
        only want a link to the run)."""
        if self._run_id is not None:
            return self._run_id
        found = self.client.get_experiment_by_name(self.experiment)
        runs = self._find(found.experiment_id) if found is not None and found.lifecycle_stage == "active" else []
        return runs[0].info.run_id if runs else None

    def _experiment_id(self) -> str:
        client = self.client
        found = client.get_experiment_by_name(self.experiment)
        if found is None:
            try:
                return client.create_experiment(self.experiment, artifact_location=_artifact_root(self.tracking_uri))
            except MlflowException:  # created meanwhile by another driver
                found = client.get_experiment_by_name(self.experiment)
                if found is None:
                    raise
        if found.lifecycle_stage == "deleted":
            client.restore_experiment(found.experiment_id)
        return found.experiment_id

    def _find(self, experiment_id: str) -> list[Run]:
        runs = self.client.search_runs(
            [experiment_id],
            filter_string=f"tags.`{TAG_WORKLOAD_ID}` = '{self.workload_id}'",
            run_view_type=ViewType.ACTIVE_ONLY,
            max_results=100,
        )
        return sorted(runs, key=lambda r: (r.info.start_time or 0, r.info.run_id))

    def _code_version(self) -> str:
        return (self.spec.get("run") or {}).get("code_version") or code_version()

    def _initialise(self, run: Run) -> None:
        """Params, artifacts, then the ``initialised`` tag: each step may be redone, so a creator that died
        half-way leaves a run the next ``start()`` completes."""
        client, run_id = self.client, self.run_id
        code = run.data.params.get(PARAM_CODE_VERSION) or self._code_version()
        params = spec_params(self.spec, code)
        missing = [Param(k, v) for k, v in params.items() if k not in run.data.params]
        for chunk in _chunks(missing, _MAX_PARAMS_TAGS_PER_BATCH):
            client.log_batch(run_id, params=chunk)
        plain = json.loads(json.dumps(self.spec, default=str))
        client.log_text(run_id, yaml.safe_dump(plain, sort_keys=False), "config/spec.yaml")
        client.log_text(run_id, "\n".join(_distributions()) + "\n", "environment/pip_freeze.txt")
        client.log_dict(run_id, _platform_info(), "environment/platform.json")
        client.set_tag(run_id, TAG_INITIALISED, "1")

    # -- writing

    def log_params(self, params: Mapping[str, Any]) -> None:
        """Log params; ones already logged with the same value are skipped (so a restarted driver may repeat
        itself). MLflow params are write-once: a different value raises ``ValidationError`` naming each key."""
        current = self.client.get_run(self.run_id).data.params
        values = {k: _param_value(v) for k, v in params.items()}
        clashes = [(k, v, f"the value already logged, {current[k]!r} (params are write-once; use a tag)")
                   for k, v in values.items() if k in current and current[k] != v]
        if clashes:
            raise ValidationError(f"params of run {self.run_id}", clashes)
        new = [Param(k, v) for k, v in values.items() if k not in current]
        for chunk in _chunks(new, _MAX_PARAMS_TAGS_PER_BATCH):
            self.client.log_batch(self.run_id, params=chunk)

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        items = [RunTag(k, _tag_value(v)) for k, v in tags.items()]
        for chunk in _chunks(items, _MAX_PARAMS_TAGS_PER_BATCH):
            self.client.log_batch(self.run_id, tags=chunk)

    def log_data_snapshot(self, snapshot: str) -> None:
        """Record the data snapshot when the spec did not name one (the loop learns it from the corpus)."""
        _log_snapshot(self.client, self.run_id, snapshot)

    def event(self, kind: str, detail: str, **data: Any) -> dict[str, Any]:
        """Append ``{"seq", "time", "kind", "detail", "data"}`` to ``events.jsonl`` and set ``raylane.last_event``;
        ``preempted`` and ``restarted`` also set ``raylane.preemptions`` / ``raylane.restarts`` to their counts
        in the log. Returns the record."""
        if not isinstance(kind, str) or not kind:
            raise ValidationError("run event", [("kind", kind, "a non-empty string: preempted, restarted, yielded...")])
        events = self.events()
        record = {
            "seq": len(events) + 1,
            "time": datetime.now(timezone.utc).isoformat(timespec="milliseconds"),
            "kind": kind,
            "detail": str(detail),
            "data": json.loads(json.dumps(data, default=str)),
        }
        events.append(record)
        with tempfile.TemporaryDirectory(prefix="raylane-events-") as tmp:
            path = Path(tmp) / EVENTS_ARTIFACT
            path.write_text("".join(json.dumps(e, sort_keys=True) + "\n" for e in events))
            self.client.log_artifact(self.run_id, str(path))
        tags = {TAG_LAST_EVENT: f"{kind}: {detail}"}
        if kind in COUNTED_EVENTS:
            tags[COUNTED_EVENTS[kind]] = str(sum(e["kind"] == kind for e in events))
        self.set_tags(tags)
        return record

    def events(self) -> list[dict[str, Any]]:
        """The run's event log, oldest first (read from the store once, then kept)."""
        if self._events is None:
            self._events = self._read_events()
        return self._events

    def _read_events(self) -> list[dict[str, Any]]:
        if not any(f.path == EVENTS_ARTIFACT for f in self.client.list_artifacts(self.run_id)):
            return []
        with tempfile.TemporaryDirectory(prefix="raylane-events-") as tmp:
            local = self.client.download_artifacts(self.run_id, EVENTS_ARTIFACT, tmp)
            return [json.loads(line) for line in Path(local).read_text().splitlines() if line.strip()]

    def log_model_dir(self, path: Union[str, Path], artifact_path: str = "model") -> None:
        """Copy a directory (a checkpoint, an exported model) into the run's artifacts under ``artifact_path``."""
        if not Path(path).is_dir():
            raise NotFoundError(f"model directory {str(path)!r} does not exist or is not a directory")
        self.client.log_artifacts(self.run_id, str(path), artifact_path)

    def log_workers(self, workers: int, step: int, at: Optional[float] = None) -> None:
        """The gang's worker count from ``step`` on, as the metric ``workers`` (logged for every start and restart,
        so an elastic gang's resizes read as a step function beside its loss), timestamped ``at`` (when that
        attempt started, in seconds since the epoch; now if not given): two resizes at one step keep their order."""
        when = time.time() if at is None else at
        self.client.log_batch(self.run_id, metrics=[Metric(METRIC_WORKERS, float(workers),
                                                           int(when * 1000), int(step))])

    def log_cost(self, cost: float) -> None:
        """What the run's leases cost (GPU-hours x the node types' prices, ``raylane.cost``), as the metric
        ``cost`` and the tag ``raylane.cost``."""
        self.client.log_batch(self.run_id, metrics=[Metric(METRIC_COST, float(cost), int(time.time() * 1000), 0)],
                              tags=[RunTag(TAG_COST, f"{cost:.6f}")])

    def finish(self, status: str) -> None:
        """End the run as ``FINISHED``, ``FAILED`` or ``KILLED``; the control plane's terminal states are taken
        too (``STATE_TO_STATUS``: ``SUCCEEDED`` -> ``FINISHED``, ``CANCELLED`` -> ``KILLED``, ``REJECTED`` ->
        ``FAILED``). Between attempts, do not call it (see the module docstring): a preemption is an ``event``.
        With ``cost_of``, the run's cost is recorded first (``log_cost``); a cost that cannot be had is logged as a
        warning and does not keep the run from ending."""
        mlflow_status = STATE_TO_STATUS.get(status, status)
        if mlflow_status not in TERMINAL_STATUSES:
            allowed = f"one of {', '.join(TERMINAL_STATUSES)}, or of the workload states {', '.join(STATE_TO_STATUS)}"
            raise ValidationError("run status", [("status", status, allowed)])
        if self.cost_of is not None:
            try:
                self.log_cost(self.cost_of(self.run_id))
            except Exception as exc:  # noqa: BLE001 - the cost is a record; ending the run matters more
                logger.warning("run %s: its cost could not be recorded: %s", self.run_id, exc)
        self.client.set_terminated(self.run_id, mlflow_status)


_resolve_uri = tracking_uri  # RunTracker's argument of the same name hides the function


def close_run(uri: Optional[str], run_id: str, status: str, reason: str) -> str:
    """End run ``run_id`` of the store ``uri`` (None: the default store) as ``status`` (an MLflow status or a workload
    state, as ``RunTracker.finish`` takes) if it is still ``RUNNING``, with ``reason`` as the tag
    ``raylane.end_reason``: a run its driver left open (``raylane.control.ends``). A run that has ended is left as
    it is; a sqlite store that does not exist is not created. Returns what it did, for the journal; never raises."""
    try:
        uri = _normalise(uri or _env_uri() or _default_uri())
        db = _sqlite_path(uri)
        if db is not None and not db.is_file():
            return f"MLflow run {run_id}: no store at {uri}"
        client = client_for(uri)
        run = client.get_run(run_id)
        if run.info.status in TERMINAL_STATUSES:
            return f"MLflow run {run_id} ended {run.info.status} by its driver"
        mlflow_status = STATE_TO_STATUS.get(status, status)
        client.set_tag(run_id, TAG_END_REASON, _tag_value(reason))
        client.set_terminated(run_id, mlflow_status)
        return f"MLflow run {run_id} left RUNNING by its driver: ended {mlflow_status} ({reason})"
    except Exception as exc:  # noqa: BLE001 - a record of what happened; the control plane goes on
        return f"MLflow run {run_id} could not be closed: {type(exc).__name__}: {str(exc)[:300]}"


# ---------------------------------------------------------------------------------------------------------------
# The training gang's side.


class MetricLogger:
    """Logs the metrics of a training loop's reports (``ray.train.report``) to the run ``run_id``, from rank 0.

    Each report is logged against its step (``raylane.train`` reads it from the metrics), buffered and written with
    one ``log_batch`` every ``flush_every`` reports, after ``flush_interval_s`` seconds, and whenever the caller
    flushes (before a report that carries a checkpoint is handed to Ray, at a yield and at the end). Only numbers
    are logged (bools as 0/1); other values are skipped. Steps at or below the run's high-water mark
    (``raylane.metrics_step``), read again at every flush, are dropped: a resumed attempt that re-runs steps after
    a crash does not log them twice, nor does a loop that logs its own metrics to the run first (the reference LM
    does, through ``MLFLOW_RUN_ID``). ``log`` and ``flush`` never raise into the loop: a failed flush is logged
    and retried at the next one.
    """

    def __init__(self, run_id: str, tracking_uri: str, *, flush_every: int = 20, flush_interval_s: float = 10.0):
        errors = []
        if not run_id:
            errors.append(("run_id", run_id, "the id of an MLflow run (RunTracker.start())"))
        if not isinstance(flush_every, int) or isinstance(flush_every, bool) or flush_every < 1:
            errors.append(("flush_every", flush_every, "an integer >= 1"))
        if not isinstance(flush_interval_s, (int, float)) or flush_interval_s <= 0:
            errors.append(("flush_interval_s", flush_interval_s, "a number of seconds > 0"))
        if errors:
            raise ValidationError("metric logger", errors)
        self.run_id, self.tracking_uri = run_id, tracking_uri
        self.flush_every, self.flush_interval_s = flush_every, float(flush_interval_s)
        self._client: Optional[MlflowClient] = None
        self._buffer: list[Metric] = []
        self._reports = 0
        self._since: Optional[float] = None
        self.failed_flushes = 0
        self._repeats_from: Optional[int] = None  # from this buffer index on, steps at or below the mark are kept

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_client"] = None
        return state

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        ts = int(time.time() * 1000)
        for key, value in metrics.items():
            number = _number(value)
            if number is not None and isinstance(key, str) and not _BAD_KEY_CHARS.search(key):
                self._buffer.append(Metric(key, number, ts, int(step)))
        self._reports += 1
        if self._since is None:
            self._since = time.monotonic()
        if self._reports >= self.flush_every or time.monotonic() - self._since >= self.flush_interval_s:
            self.flush()

    def flush(self) -> None:
        if not self._buffer:
            return
        try:
            client = self._get_client()
            mark = int(client.get_run(self.run_id).data.tags.get(TAG_METRICS_STEP, 0))
            keep = len(self._buffer) if self._repeats_from is None else self._repeats_from
            fresh = [m for i, m in enumerate(self._buffer) if m.step > mark or i >= keep]
            for chunk in _chunks(fresh, _MAX_METRICS_PER_BATCH - 1):
                top = max(m.step for m in chunk)
                # The mark travels with the metrics: both land or neither does.
                client.log_batch(self.run_id, metrics=chunk, tags=[RunTag(TAG_METRICS_STEP, str(max(top, mark)))])
            self._buffer, self._reports, self._since = [], 0, None
            if self._repeats_from is not None:
                self._repeats_from = 0
        except Exception as exc:  # noqa: BLE001 - tracking must not kill training
            self.failed_flushes += 1
            self._reports, self._since = 0, time.monotonic()
            if len(self._buffer) > _MAX_BUFFERED:
                dropped = len(self._buffer) - _MAX_BUFFERED
                del self._buffer[:dropped]
                if self._repeats_from is not None:
                    self._repeats_from = max(0, self._repeats_from - dropped)
            logger.warning("run %s: could not write metrics to %s (%d failed flushes, %d metrics kept): %s",
                           self.run_id, self.tracking_uri, self.failed_flushes, len(self._buffer), exc)

    def keep_repeats(self) -> None:
        """From now on, log steps at or below the run's high-water mark too: the loop restarted from zero, so its
        steps are new training, not a re-run of steps already logged (``raylane.train``)."""
        if self._repeats_from is None:
            self._repeats_from = len(self._buffer)

    def pending(self) -> int:
        """Metrics not written yet (a flush failed)."""
        return len(self._buffer)

    def _get_client(self) -> MlflowClient:
        if self._client is None:
            self._client = client_for(_resolve_uri(self.tracking_uri))
        return self._client


def _number(value: Any) -> Optional[float]:
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)):
        return float(value)
    item = getattr(value, "item", None)  # numpy scalars
    if callable(item) and getattr(value, "shape", None) == ():
        try:
            out = item()
        except Exception:  # noqa: BLE001
            return None
        return float(out) if isinstance(out, (int, float)) else None
    return None


_MAX_BUFFERED = 100_000
