"""Ray Train adapter of the reference training loop: ``TorchTrainer(train_loop_per_worker, train_loop_config=...)``.

This module is the only one in ``workloads`` that imports Ray. It turns Ray Train's session into ``TrainHooks``:

- resume: ``ray.train.get_checkpoint()``, copied to a local directory; Ray Train hands the latest reported
  checkpoint to a retried worker group and to a new ``fit()`` with the same ``RunConfig(name, storage_path)``.
- checkpoint: every rank calls ``ray.train.report(metrics, checkpoint=...)`` (a barrier); only rank 0 has files.
- metrics: with every checkpoint, and every ``report_every`` steps if set (rank 0's are the ones Ray keeps).
  Off by default because each ``ray.train.report`` waits until the controller has taken the previous one off a
  one-slot queue, which it polls every ``RAY_TRAIN_HEALTH_CHECK_INTERVAL_S`` (2 s by default): measured here,
  188 ms a report at 0.2 s. Per-step metrics belong in a ``wrap_hooks`` wrapper of ``report`` on rank 0.
- stop: ``stop_poll()`` runs on rank 0 every ``stop_poll_every`` steps and its answer reaches every rank through
  ``ray.train.collective.broadcast_from_rank_zero`` (about 4 ms with two workers on two cores); with
  ``yield_on_preemption`` a node drain seen by ``ray.train.get_preemption_info()`` also makes the run yield.
- DDP: ``ray.train.torch.prepare_model`` when the group has more than one worker.

Config: the keys of ``workloads.train_lm.TrainConfig`` plus the adapter's own, all optional:
- ``stop_poll``: zero-argument callable -> bool, picklable, run on rank 0 (Python API only); an exception it raises
  is logged and counts as "keep going".
- ``stop_poll_every``: int >= 1, default 1: ask every that many steps (``stop_poll`` and the preemption notice).
- ``wrap_hooks``: callable taking and returning ``TrainHooks`` (Python API only); it wraps the hooks of every rank.
- ``report_every``: int >= 0, default 0 (metrics reach Ray only with checkpoints).
- ``yield_on_preemption``: bool, default True: yield at the current step when ``ray.train.get_preemption_info()``
  says so (a node drain, or a platform that preempts the job through it, as Raylane does); one collective per poll.
- ``mlflow``: bool, default True: when the environment names an MLflow run (``MLFLOW_RUN_ID``, as Raylane sets it),
  rank 0 logs every step's metrics there (``workloads.mlflow_log``).
``check_config`` validates the lot on the driver before anything is launched; ``RayTrainConfig`` is the same
schema as a pydantic model, declared as ``train_loop_per_worker.config_schema`` so a platform can check a spec's
config before it queues. Bad config raises ``workloads.errors.ConfigError`` (``fatal``: no retry fixes it).

The function returns ``TrainResult.to_dict()``, which ``Result.return_value`` carries: ``status`` is ``"yielded"``
when the run stopped on request.
"""
from __future__ import annotations

import logging
import tempfile
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional

import torch
from torch import nn

from pydantic import ConfigDict, Field, SkipValidation

from workloads.errors import ConfigError
from workloads.mlflow_log import StepLogger, from_environment
from workloads.train_lm import TrainConfig, TrainHooks, parse_config, train

import ray.train
import ray.train.torch
from ray.train.collective import broadcast_from_rank_zero

__all__ = ["AdapterOptions", "RayTrainConfig", "RayTrainHooks", "check_config", "train_loop_per_worker"]

logger = logging.getLogger(__name__)

_ADAPTER_KEYS = ("stop_poll", "stop_poll_every", "wrap_hooks", "report_every", "yield_on_preemption", "mlflow")


@dataclass(frozen=True)
class AdapterOptions:
    """The adapter's own config keys; see the module docstring."""

    stop_poll: Optional[Callable[[], bool]] = None
    stop_poll_every: int = 1
    wrap_hooks: Optional[Callable[[TrainHooks], TrainHooks]] = None
    report_every: int = 0
    yield_on_preemption: bool = True
    mlflow: bool = True


class RayTrainConfig(TrainConfig):
    """The whole config of ``train_loop_per_worker`` as one pydantic model (``TrainConfig`` plus the adapter's
    keys): ``train_loop_per_worker.config_schema``."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, arbitrary_types_allowed=True)

    stop_poll: SkipValidation[Optional[Callable[[], bool]]] = None
    stop_poll_every: int = Field(default=1, ge=1)
    wrap_hooks: SkipValidation[Optional[Callable[[TrainHooks], TrainHooks]]] = None
    report_every: int = Field(default=0, ge=0)
    yield_on_preemption: bool = True
    mlflow: bool = True


def check_config(config: Mapping[str, Any]) -> tuple[AdapterOptions, TrainConfig]:
    """Split ``config`` into the adapter's options and a ``TrainConfig``; one ``ConfigError`` lists all problems."""
    errors: list[tuple[str, object, str]] = []
    if not isinstance(config, Mapping):
        raise ConfigError("ray train config", [("<config>", config, "a mapping of config keys to values")])
    opts = {k: config[k] for k in _ADAPTER_KEYS if k in config}
    for key in ("stop_poll", "wrap_hooks"):
        if opts.get(key) is not None and not callable(opts[key]):
            errors.append((key, opts[key], "a callable or null"))
    for key, least in (("stop_poll_every", 1), ("report_every", 0)):
        every = opts.get(key, least)
        if not isinstance(every, int) or isinstance(every, bool) or every < least:
            errors.append((key, every, f"an integer >= {least}"))
    for key in ("yield_on_preemption", "mlflow"):
        if not isinstance(opts.get(key, True), bool):
            errors.append((key, opts[key], "true or false"))
    train_cfg = None
    try:
        train_cfg = parse_config({k: v for k, v in config.items() if k not in _ADAPTER_KEYS})
    except ConfigError as exc:
        errors += exc.errors
    if errors or train_cfg is None:
        raise ConfigError("ray train config", errors)
    return AdapterOptions(**opts), train_cfg


class RayTrainHooks(TrainHooks):
    """``TrainHooks`` over the Ray Train session of the calling worker; see the module docstring."""

    def __init__(self, options: AdapterOptions = AdapterOptions()):
        ctx = ray.train.get_context()
        self.world_rank = ctx.get_world_rank()
        self.world_size = ctx.get_world_size()
        self.options = options
        self._resume_dir: Optional[tempfile.TemporaryDirectory] = None
        self._polls = 0

    def load_checkpoint(self) -> Optional[str]:
        found = ray.train.get_checkpoint()
        if found is None:
            return None
        self._resume_dir = tempfile.TemporaryDirectory(prefix="raylane-resume-")
        return found.to_directory(self._resume_dir.name)

    def save_checkpoint(self, dir_path: Optional[str], step: int, metrics: Mapping[str, float]) -> None:
        checkpoint = ray.train.Checkpoint.from_directory(dir_path) if dir_path is not None else None
        # Named by step so that the run's storage lists checkpoints in training order.
        ray.train.report({**metrics, "step": step}, checkpoint=checkpoint, checkpoint_dir_name=f"checkpoint_{step:08d}")

    def report(self, step: int, metrics: Mapping[str, float]) -> None:
        if self.options.report_every and step % self.options.report_every == 0:
            ray.train.report({**metrics, "step": step})

    def should_stop(self) -> bool:
        # Every rank counts the same calls, so every rank takes part in the same collectives.
        self._polls += 1
        if (self._polls - 1) % self.options.stop_poll_every:
            return False
        stop = False
        if self.options.yield_on_preemption:
            stop = ray.train.get_preemption_info() is not None
        if self.options.stop_poll is not None:
            asked = self._poll() if self.world_rank == 0 else None
            stop = bool(broadcast_from_rank_zero(asked)) or stop
        return stop

    def _poll(self) -> bool:
        try:
            return bool(self.options.stop_poll())
        except Exception as exc:  # noqa: BLE001 - e.g. a control plane restarting: keep training, ask again
            logger.warning("stop_poll failed, will ask again next step: %s", exc)
            return False

    def prepare_model(self, model: nn.Module) -> nn.Module:
        if self.world_size > 1:
            # Logical GPUs (a CPU build of torch, or a test cluster) still get Ray's GPU scheduling; the model
            # then stays on the CPU and DDP runs over gloo instead of asking CUDA for a device.
            device = True if torch.cuda.is_available() else torch.device("cpu")
            return ray.train.torch.prepare_model(model, move_to_device=device)
        # One worker: no DDP wrapper, but a worker given a real GPU must train on it (the GPU Ray assigned it).
        return model.to(ray.train.torch.get_device()) if torch.cuda.is_available() else model

    def close(self) -> None:
        if self._resume_dir is not None:
            self._resume_dir.cleanup()
            self._resume_dir = None


def train_loop_per_worker(config: Mapping[str, Any]) -> dict[str, Any]:
    """The per-worker function for ``ray.train.torch.TorchTrainer``; returns ``TrainResult.to_dict()``."""
    options, train_cfg = check_config(config)
    hooks = RayTrainHooks(options)
    logged = None
    try:
        wrapped: TrainHooks = hooks
        run = from_environment() if options.mlflow else None
        if run is not None and hooks.world_rank == 0:
            every = options.report_every
            # Flushed before every step whose metrics go to Ray too, so a report logger sees them logged already.
            wrapped = logged = StepLogger(hooks, run_id=run[0], tracking_uri=run[1],
                                          flush_at=(lambda step: step % every == 0) if every else None)
        if options.wrap_hooks is not None:
            wrapped = options.wrap_hooks(wrapped)
        return train(train_cfg, hooks=wrapped).to_dict()
    finally:
        if logged is not None:
            logged.close()
        hooks.close()


train_loop_per_worker.config_schema = RayTrainConfig
