"""MLflow for sweeps: one parent run per sweep, one child run per trial, the best trial, and the compute saved.

This module owns the trial side of a sweep's MLflow record. The parent run is a ``raylane.tracking.RunTracker`` run
keyed by the sweep id (so a driver that resumes the sweep writes the same run); ``SweepTracking`` is a Ray Tune
callback, run in the driver, that keeps one child run per trial under it; ``summarize`` reads the children back and
writes the sweep's outcome on the parent. It reuses ``raylane.tracking``'s helpers (param flattening, value limits,
batching) rather than its own.

Child runs: tag ``mlflow.parentRunId`` (MLflow's nesting), ``raylane.sweep_id``, ``raylane.trial_id``; params are
the trial's sampled config, flattened with dots (``model.d_model``), as Tune's own MLflow logger names them; metrics
are every number the trial reports, against its progress in the sweep's time attribute (``step``, else Tune's
``training_iteration``, or the spec's ``time_attr``: ``raylane.sweeps.conventions``), plus ``gpu_seconds``
(cumulative: the seconds between its results times the GPUs a trial holds). A trial found already in the store (a
resumed driver) gets the same child run; the points it already logged are not logged twice. A sweep that fails or
is cancelled ends the child runs still open with its own status (``end_open_trials``: FAILED, KILLED), so none is
left RUNNING. PBT changes a trial's config on exploit: the new
values go to the tags ``raylane.config.<param>`` (params are write-once). Where the trial's weights came from goes
to the tag ``raylane.exploits``: a JSON list with one entry per start of the trial from another trial's checkpoint,
``{"step": <first step reported after it>, "source": <trial id>, "source_step": <that checkpoint's step>}`` (the
latest ones, as many as MLflow's limit on a tag holds), taken from the first result of the start, which carries
``exploited_from`` and ``exploited_step`` (as ``workloads.ray_tune`` reports them); ``exploited_step`` is also a
metric of every result that carries it.

The child runs are the sweep's complete record of its results. Tune's own per-trial history (``result.json``,
hence ``Result.metrics_dataframe``) is not: Tune's logger callbacks copy a trial's ``result.json`` back from the
storage path each time the trial restarts with a checkpoint (a PBT exploit or time share, a quota pause), and that
copy is only as recent as the last experiment sync (every 10 s or more), so the results reported in between are
lost from it.

Words
- *GPU-seconds used*: per trial, the seconds between its results (training, evaluation, checkpointing and the
  first result's set-up; not the actor's start) times the GPUs a trial holds, summed over the sweep.
- *full budget*: what the sweep would have cost had every trial trained to ``budget.max``: what was used, plus each
  trial's missing steps at its steady cost per step (``steady_gpu_seconds / steady_steps``: results other than the
  first of a start), or at the median of the others' for a trial stopped at its first report. The parent's
  ``gpu_seconds_saved`` is the missing part: positive when a scheduler stopped trials early (ASHA, median), zero
  when every trial ran its budget (FIFO; PBT, whose exploits may even re-train steps).
- *best trial*: the one whose last reported metric is best under the sweep's mode; its child is tagged
  ``raylane.best_trial = true`` and the parent carries ``raylane.best_trial_id`` and the best value.
"""
from __future__ import annotations

import json
import logging
import math
import statistics
import time
from typing import Any, Dict, List, Mapping, Optional

from mlflow import MlflowClient
from mlflow.entities import Metric, Param, RunTag
from ray.tune import Callback
from ray.tune.result import AUTO_RESULT_KEYS

from raylane.sweeps.conventions import TimeAttr
from raylane.tracking import _MAX_TAG_VALUE, _chunks, _flatten, _param_value, _tag_value, client_for, tracking_uri

__all__ = ["TAG_SWEEP_ID", "TAG_TRIAL_ID", "TAG_BEST", "TAG_EXPLOITS", "SweepTracking", "summarize", "child_runs",
           "exploits", "end_open_trials"]

logger = logging.getLogger(__name__)

TAG_PARENT = "mlflow.parentRunId"
TAG_SWEEP_ID = "raylane.sweep_id"
TAG_TRIAL_ID = "raylane.trial_id"
TAG_TRIAL_STATUS = "raylane.trial_status"
TAG_FINAL_STEP = "raylane.final_step"
TAG_STOPPED_EARLY = "raylane.stopped_early"
TAG_BEST = "raylane.best_trial"
TAG_EXPLOITS = "raylane.exploits"
GPU_SECONDS = "gpu_seconds"
TRAINED_STEPS = "trained_steps"
# Cumulative GPU-seconds and steps of the results that were not a (re)start's first: the steady cost of a step.
STEADY_GPU_SECONDS = "steady_gpu_seconds"
STEADY_STEPS = "steady_steps"
_SKIP = frozenset(AUTO_RESULT_KEYS) | {"done", "trial_id", "experiment_tag", "should_checkpoint", "experiment_id"}
_MAX_METRICS_PER_BATCH = 900


class SweepTracking(Callback):
    """Tune callback (driver side) that keeps one MLflow child run per trial under the sweep's parent run.

    Never raises into Tune: a failed write is logged and the sweep goes on (losing a point of a curve is cheaper
    than losing a sweep). Picklable (Tune keeps its callbacks in the experiment state): the client and caches are
    rebuilt after unpickling.
    """

    time_attr: Optional[str] = None  # the spec's; also for a callback unpickled from a state saved without one

    def __init__(self, *, sweep_id: str, parent_run_id: str, experiment_id: str, uri: str, name: str,
                 gpus_per_trial: float, budget_max: Optional[int], report_every: int,
                 time_attr: Optional[str] = None):
        self.sweep_id = sweep_id
        self.parent_run_id = parent_run_id
        self.experiment_id = experiment_id
        self.uri = uri
        self.name = name
        self.gpus_per_trial = float(gpus_per_trial)
        self.budget_max = int(budget_max) if budget_max is not None else None
        self.report_every = int(report_every)
        self.time_attr = time_attr
        self._reset()

    def _reset(self) -> None:
        self._client: Optional[MlflowClient] = None
        self._runs: Dict[str, str] = {}
        self._gpu_s: Dict[str, float] = {}
        self._trained: Dict[str, int] = {}
        self._steady: Dict[str, tuple] = {}  # trial -> (GPU-seconds, steps) of steady results
        self._last_step: Dict[str, int] = {}
        self._resume_mark: Dict[str, int] = {}  # steps at or below this were logged by an earlier driver
        self._exploits: Dict[str, List[Dict[str, Any]]] = {}  # trial -> its TAG_EXPLOITS entries

    def __getstate__(self) -> Dict[str, Any]:
        keep = ("sweep_id", "parent_run_id", "experiment_id", "uri", "name", "gpus_per_trial", "budget_max",
                "report_every", "time_attr")
        return {k: self.__dict__[k] for k in keep if k in self.__dict__}

    def __setstate__(self, state: Dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._reset()

    @property
    def client(self) -> MlflowClient:
        if self._client is None:
            self._client = client_for(tracking_uri(self.uri))
        return self._client

    # -- the child run of a trial

    def _child(self, trial) -> str:
        tid = trial.trial_id
        run_id = self._runs.get(tid)
        if run_id is not None:
            return run_id
        found = self.client.search_runs(
            [self.experiment_id],
            filter_string=f"tags.`{TAG_SWEEP_ID}` = '{self.sweep_id}' and tags.`{TAG_TRIAL_ID}` = '{tid}'",
            max_results=1)
        if found:
            run = found[0]
            run_id = run.info.run_id
            self._gpu_s[tid] = float(run.data.metrics.get(GPU_SECONDS, 0.0))
            self._trained[tid] = int(run.data.metrics.get(TRAINED_STEPS, 0))
            self._steady[tid] = (float(run.data.metrics.get(STEADY_GPU_SECONDS, 0.0)),
                                 int(run.data.metrics.get(STEADY_STEPS, 0)))
            # The last step logged: the MLflow step of the newest point of a metric every result carries (a
            # trainable that reports no ``step`` has no metric of that name).
            history = self.client.get_metric_history(run_id, TRAINED_STEPS)
            self._resume_mark[tid] = max((int(p.step) for p in history), default=0)
            self._last_step[tid] = self._resume_mark[tid]
            self._exploits[tid] = exploits(run)
            if run.info.status != "RUNNING":
                self.client.update_run(run_id, status="RUNNING")
        else:
            tags = {TAG_PARENT: self.parent_run_id, TAG_SWEEP_ID: self.sweep_id, TAG_TRIAL_ID: tid,
                    "raylane.kind": "trial", TAG_TRIAL_STATUS: trial.status}
            run_id = self.client.create_run(self.experiment_id, tags=tags, run_name=f"{self.name}-{tid}").info.run_id
            params = [Param(k, _param_value(v)) for k, v in _flatten(trial.config or {})]
            for chunk in _chunks(params, 100):
                self.client.log_batch(run_id, params=chunk)
        self._runs[tid] = run_id
        return run_id

    def _safely(self, what: str, fn, *args) -> None:
        try:
            fn(*args)
        except Exception as exc:  # noqa: BLE001 - tracking must not fail the sweep
            logger.warning("sweep %s: MLflow %s failed: %s", self.sweep_id, what, exc)

    # -- Tune's hooks

    def on_trial_start(self, iteration: int, trials: List, trial, **info) -> None:
        self._safely("trial start", self._start, trial)

    def _start(self, trial) -> None:
        run_id = self._child(trial)
        tags = {TAG_TRIAL_STATUS: "RUNNING"}
        # PBT may have changed the config since the params were logged (params are write-once).
        logged = self.client.get_run(run_id).data.params
        for key, value in _flatten(trial.config or {}):
            if key in logged and logged[key] != _param_value(value):
                tags[f"raylane.config.{key}"] = _param_value(value)
        self.client.log_batch(run_id, tags=[RunTag(k, _tag_value(v)) for k, v in tags.items()])

    def on_trial_result(self, iteration: int, trials: List, trial, result: Dict, **info) -> None:
        self._safely("metrics", self._result, trial, result)

    def _result(self, trial, result: Mapping[str, Any]) -> None:
        tid = trial.trial_id
        run_id = self._child(trial)
        step = _int(TimeAttr(self.time_attr).value(result), 0)
        if tid in self._resume_mark:
            if step <= self._resume_mark[tid]:
                return  # an earlier driver logged this step already
            del self._resume_mark[tid]
        previous = self._last_step.get(tid, 0)
        if "exploited_step" in result and _int(result.get("iterations_since_restore"), 0) == 1:
            previous = _int(result.get("exploited_step"), previous)  # PBT: trained on from another trial's step
        delta = max(0, step - previous)
        self._trained[tid] = self._trained.get(tid, 0) + delta
        self._last_step[tid] = step
        gpu_s = float(result.get("time_this_iter_s") or 0.0) * self.gpus_per_trial
        self._gpu_s[tid] = self._gpu_s.get(tid, 0.0) + gpu_s
        steady = self._steady.get(tid, (0.0, 0))
        if _int(result.get("iterations_since_restore"), 1) > 1:  # the first result of a start carries its set-up
            steady = (steady[0] + gpu_s, steady[1] + delta)
        self._steady[tid] = steady
        ts = int(time.time() * 1000)
        metrics = [Metric(k, float(v), ts, step) for k, v in result.items()
                   if k not in _SKIP and _is_number(v)]
        metrics += [Metric(GPU_SECONDS, self._gpu_s[tid], ts, step), Metric(TRAINED_STEPS, self._trained[tid], ts, step),
                    Metric(STEADY_GPU_SECONDS, steady[0], ts, step), Metric(STEADY_STEPS, steady[1], ts, step)]
        tags = []
        source = result.get("exploited_from")
        if isinstance(source, str) and source != tid and _int(result.get("iterations_since_restore"), 0) == 1:
            entry = {"step": step, "source": source, "source_step": _int(result.get("exploited_step"), None)}
            self._exploits.setdefault(tid, []).append(entry)
            tags.append(RunTag(TAG_EXPLOITS, _exploits_tag(self._exploits[tid])))
        for chunk in _chunks(metrics, _MAX_METRICS_PER_BATCH):
            self.client.log_batch(run_id, metrics=chunk, tags=tags)
            tags = []

    def on_trial_complete(self, iteration: int, trials: List, trial, **info) -> None:
        self._safely("trial end", self._end, trial, "FINISHED")

    def on_trial_error(self, iteration: int, trials: List, trial, **info) -> None:
        self._safely("trial error", self._end, trial, "FAILED")

    def _end(self, trial, status: str) -> None:
        run_id = self._child(trial)
        step = self._last_step.get(trial.trial_id, 0)
        tags = {TAG_TRIAL_STATUS: "TERMINATED" if status == "FINISHED" else "ERROR", TAG_FINAL_STEP: str(step),
                TAG_STOPPED_EARLY: str(status == "FINISHED" and self.budget_max is not None
                                       and step < self.budget_max).lower()}
        self.client.log_batch(run_id, tags=[RunTag(k, v) for k, v in tags.items()])
        self.client.set_terminated(run_id, status)


def end_open_trials(client: MlflowClient, experiment_id: str, sweep_id: str, status: str) -> List[str]:
    """End every child run of the sweep still RUNNING with ``status`` (FAILED, KILLED or FINISHED: the sweep's own
    end, for trials Tune left unfinished); returns their trial ids. A driver that resumes the sweep opens them
    again (``SweepTracking._child``)."""
    ended = []
    for run in child_runs(client, experiment_id, sweep_id):
        if run.info.status != "RUNNING":
            continue
        tags = [RunTag(TAG_TRIAL_STATUS, {"FAILED": "ERROR", "KILLED": "KILLED"}.get(status, "TERMINATED"))]
        client.log_batch(run.info.run_id, tags=tags)
        client.set_terminated(run.info.run_id, status)
        ended.append(run.data.tags.get(TAG_TRIAL_ID, run.info.run_id))
    return ended


def child_runs(client: MlflowClient, experiment_id: str, sweep_id: str) -> list:
    """The child runs of sweep ``sweep_id``, oldest first."""
    runs = client.search_runs([experiment_id], filter_string=f"tags.`{TAG_SWEEP_ID}` = '{sweep_id}'",
                              max_results=10_000)
    return sorted(runs, key=lambda r: (r.info.start_time or 0, r.info.run_id))


def exploits(run) -> List[Dict[str, Any]]:
    """The ``raylane.exploits`` entries of a child run (see the module docstring), oldest first; [] for none."""
    text = run.data.tags.get(TAG_EXPLOITS)
    if not text:
        return []
    try:
        entries = json.loads(text)
    except ValueError:
        return []
    return [e for e in entries if isinstance(e, dict)] if isinstance(entries, list) else []


def _exploits_tag(entries: List[Dict[str, Any]]) -> str:
    """The tag's JSON: the latest entries that fit MLflow's limit on a tag (a too-long tag would fail the write of
    the result's metrics with it)."""
    for first in range(len(entries) + 1):
        text = json.dumps(entries[first:])
        if len(text) <= _MAX_TAG_VALUE:
            return text
    return "[]"


def summarize(client: MlflowClient, *, experiment_id: str, sweep_id: str, parent_run_id: str, metric: str,
              mode: str, budget_max: Optional[int]) -> Dict[str, Any]:
    """Read the sweep's children, tag the best one, and write the outcome on the parent; returns the outcome:
    ``trials``, ``best_trial_id``, ``best_metric``, ``best_config``, ``gpu_seconds_used``,
    ``gpu_seconds_full_budget``, ``gpu_seconds_saved``, ``trained_steps``, ``full_budget_steps``, ``stopped_early``."""
    children = child_runs(client, experiment_id, sweep_id)
    used = missing_cost = 0.0
    steps = full_steps = 0
    early = 0
    scored = []
    # The steady cost of a step: the trial's own, or the median of the others' for a trial stopped at its first
    # report (whose only result carries its set-up).
    rates = {run.info.run_id: run.data.metrics[STEADY_GPU_SECONDS] / run.data.metrics[STEADY_STEPS]
             for run in children if run.data.metrics.get(STEADY_STEPS)}
    typical = statistics.median(rates.values()) if rates else 0.0
    for run in children:
        m = run.data.metrics
        gpu_s, trained = float(m.get(GPU_SECONDS, 0.0)), int(m.get(TRAINED_STEPS, 0))
        used += gpu_s
        steps += trained
        # No known budget (a script's Tuner whose scheduler and stop name none): nothing is counted as saved.
        full_steps += budget_max if budget_max is not None else trained
        if budget_max is not None:
            missing_cost += max(0, budget_max - trained) * rates.get(run.info.run_id, typical)
        early += run.data.tags.get(TAG_STOPPED_EARLY) == "true"
        value = m.get(metric)
        if value is not None and math.isfinite(value):
            scored.append((value, run))
    full = used + missing_cost
    out: Dict[str, Any] = {"trials": len(children), "gpu_seconds_used": used, "gpu_seconds_full_budget": full,
                           "gpu_seconds_saved": missing_cost, "trained_steps": steps,
                           "full_budget_steps": full_steps, "stopped_early": early,
                           "best_trial_id": None, "best_metric": None, "best_config": {}}
    if scored:
        value, best = (min if mode == "min" else max)(scored, key=lambda x: x[0])
        out.update(best_trial_id=best.data.tags.get(TAG_TRIAL_ID), best_metric=value,
                   best_config=dict(best.data.params))
        for run in children:
            if run.data.tags.get(TAG_BEST) == "true" and run.info.run_id != best.info.run_id:
                client.set_tag(run.info.run_id, TAG_BEST, "false")
        client.set_tag(best.info.run_id, TAG_BEST, "true")
    ts = int(time.time() * 1000)
    metrics = [Metric(f"sweep_{k}", float(out[k]), ts, 0) for k in
               ("gpu_seconds_used", "gpu_seconds_full_budget", "gpu_seconds_saved", "trained_steps",
                "full_budget_steps", "trials", "stopped_early")]
    if out["best_metric"] is not None:
        metrics.append(Metric(f"best_{metric}", float(out["best_metric"]), ts, 0))
    tags = [RunTag("raylane.best_trial_id", str(out["best_trial_id"])),
            RunTag("raylane.gpu_seconds_saved", f"{out['gpu_seconds_saved']:.1f} of {full:.1f} "
                                                f"({_fraction(out['gpu_seconds_saved'], full)})")]
    tags += [RunTag(f"raylane.best_config.{k}", _tag_value(v)) for k, v in out["best_config"].items()]
    client.log_batch(parent_run_id, metrics=metrics, tags=tags)
    return out


def _fraction(part: float, whole: float) -> str:
    return f"{100.0 * part / whole:.0f}%" if whole else "-"


def _int(x: Any, default: int) -> int:
    try:
        return int(x)
    except (TypeError, ValueError):
        return default


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(float(v))
