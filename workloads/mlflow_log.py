"""Per-step MLflow metrics of the reference training loop, written by rank 0 into the run MLflow names.

MLflow's own convention says which run: ``MLFLOW_RUN_ID`` and ``MLFLOW_TRACKING_URI`` in the environment (a
platform that runs this loop, Raylane among them, sets both on every worker; ``ray_train.train_loop_per_worker``
wraps its hooks in ``StepLogger`` when they are set). Nothing here imports Ray or Raylane.

- Metrics are logged against the global step the loop reports, every ``log_every`` steps (steps with evaluation
  metrics always), buffered and written with one ``log_batch`` every ``flush_every`` logged steps, after
  ``flush_interval_s`` seconds, before every checkpoint (so what a checkpoint covers is in MLflow before the
  checkpoint is handed on), before every step ``flush_at(step)`` names (a runner that forwards those steps' metrics
  somewhere that also writes the run) and in ``close()``.
- High-water mark: the run's tag ``raylane.metrics_step`` is the last step whose metrics reached the run, written in
  the same ``log_batch`` as the metrics; steps at or below it are dropped, so an attempt that re-runs steps after a
  crash logs none of them twice (on CPU the re-run steps are bit-identical to the lost ones). Any other writer of
  the run that honours the same tag (Raylane's report logger does) never logs a step twice with this one.
- A failed write never reaches the training loop: it is logged, the buffer kept (bounded) and retried later.
"""
from __future__ import annotations

import logging
import os
import time
from typing import Any, Callable, Mapping, Optional

from workloads.train_lm import ForwardingHooks, TrainHooks

logger = logging.getLogger(__name__)

TAG_METRICS_STEP = "raylane.metrics_step"  # shared with the platform's report logger: same name, same meaning
_MAX_METRICS_PER_BATCH = 1000
_MAX_BUFFERED = 100_000
_STEP_METRICS = frozenset({"loss", "lr", "step_time_s", "samples_per_s"})


def from_environment() -> Optional[tuple[str, str]]:
    """(run id, tracking URI) when the environment names a run (``MLFLOW_RUN_ID``), else None."""
    run_id = os.environ.get("MLFLOW_RUN_ID")
    if not run_id:
        return None
    return run_id, os.environ.get("MLFLOW_TRACKING_URI", "")


class StepLogger(ForwardingHooks):
    """Training hooks that log rank 0's per-step metrics to ``run_id`` and pass every call on to ``inner``."""

    def __init__(self, inner: TrainHooks, *, run_id: str, tracking_uri: str, log_every: int = 1,
                 flush_every: int = 20, flush_interval_s: float = 30.0,
                 flush_at: Optional[Callable[[int], bool]] = None):
        errors = [(name, value, "an integer >= 1")
                  for name, value in (("log_every", log_every), ("flush_every", flush_every))
                  if not isinstance(value, int) or isinstance(value, bool) or value < 1]
        if not isinstance(flush_interval_s, (int, float)) or flush_interval_s <= 0:
            errors.append(("flush_interval_s", flush_interval_s, "a number of seconds > 0"))
        if not run_id:
            errors.append(("run_id", run_id, "the id of an MLflow run"))
        if errors:
            from workloads.errors import ConfigError

            raise ConfigError("mlflow step logger", errors)
        super().__init__(inner)
        self.run_id, self.tracking_uri = run_id, tracking_uri
        self.log_every, self.flush_every, self.flush_interval_s = log_every, flush_every, float(flush_interval_s)
        self.flush_at = flush_at
        self._client = None
        self._buffer: list = []
        self._buffered_steps = 0
        self._buffered_since: Optional[float] = None
        self._unlogged: Optional[tuple[int, dict[str, float]]] = None  # last report, skipped by log_every
        self._high_water: Optional[int] = None  # read from the run at the first flush
        self.failed_flushes = 0

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_client"] = None
        return state

    def report(self, step: int, metrics: Mapping[str, float]) -> None:
        if self.world_rank == 0:
            extra = any(k not in _STEP_METRICS for k in metrics)  # evaluation metrics: always kept
            if step % self.log_every == 0 or extra:
                self._add(step, metrics)
            else:
                self._unlogged = (step, dict(metrics))
            due = self._buffered_steps >= self.flush_every or (
                self._buffered_since is not None and time.monotonic() - self._buffered_since >= self.flush_interval_s)
            if due or (self.flush_at is not None and self.flush_at(step)):
                self.flush()
        super().report(step, metrics)

    def save_checkpoint(self, dir_path: Optional[str], step: int, metrics: Mapping[str, float]) -> None:
        if self.world_rank == 0:
            if self._unlogged is not None and self._unlogged[0] == step:  # the checkpoint's step is always logged
                self._add(*self._unlogged)
            self.flush()
        super().save_checkpoint(dir_path, step, metrics)

    def _add(self, step: int, metrics: Mapping[str, float]) -> None:
        from mlflow.entities import Metric

        ts = int(time.time() * 1000)
        self._buffer.extend(Metric(key, float(value), ts, int(step)) for key, value in metrics.items())
        self._buffered_steps += 1
        self._unlogged = None
        if self._buffered_since is None:
            self._buffered_since = time.monotonic()

    def flush(self) -> None:
        """Write what is buffered. Never raises: on failure the buffer is kept for a later flush."""
        if self.world_rank != 0 or not self._buffer:
            return
        try:
            from mlflow.entities import RunTag

            client = self._get_client()
            if self._high_water is None:
                self._high_water = int(client.get_run(self.run_id).data.tags.get(TAG_METRICS_STEP, 0))
            fresh = [m for m in self._buffer if m.step > self._high_water]
            for i in range(0, len(fresh), _MAX_METRICS_PER_BATCH - 1):
                chunk = fresh[i: i + _MAX_METRICS_PER_BATCH - 1]
                top = max(m.step for m in chunk)
                # The mark travels with the metrics: both land or neither does.
                client.log_batch(self.run_id, metrics=chunk, tags=[RunTag(TAG_METRICS_STEP, str(top))])
                self._high_water = max(self._high_water, top)
            self._buffer, self._buffered_steps, self._buffered_since = [], 0, None
        except Exception as exc:  # noqa: BLE001 - tracking must not kill training
            self.failed_flushes += 1
            self._buffered_steps, self._buffered_since = 0, time.monotonic()
            if len(self._buffer) > _MAX_BUFFERED:
                del self._buffer[: len(self._buffer) - _MAX_BUFFERED]
            logger.warning("run %s: could not write metrics to %s (%d failed flushes, %d metrics kept): %s",
                           self.run_id, self.tracking_uri, self.failed_flushes, len(self._buffer), exc)

    def close(self) -> None:
        """Flush what is left (the loop's last ``save_checkpoint`` flushes too)."""
        if self._unlogged is not None:
            self._add(*self._unlogged)
        self.flush()

    def _get_client(self):
        if self._client is None:
            from mlflow import MlflowClient

            self._client = MlflowClient(tracking_uri=self.tracking_uri or None)
        return self._client
