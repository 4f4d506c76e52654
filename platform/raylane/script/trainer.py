"""Script mode's trainer hook: every ``fit()`` of a Ray Train trainer in the driver of a script-mode job becomes a
Raylane training workload.

The one integration point with Ray Train is ``ray.train.v2.api.data_parallel_trainer.DataParallelTrainer.fit``,
the base class every Ray Train V2 trainer inherits ``fit`` from (``TorchTrainer``, and with it the Lightning and
Transformers integrations, which run their loops on a ``TorchTrainer``). ``install`` replaces it; ``uninstall``
puts it back. Ray Train V1's ``ray.train.base_trainer.BaseTrainer.fit`` (``RAY_TRAIN_V2_ENABLED=0``) is replaced
with a refusal, so a legacy trainer never runs unmanaged either.

What a ``fit()`` does under the hook (``ManagedFit``):
1. refuse a trainer type it does not know (anything but ``TorchTrainer``), or settings the spec cannot express,
   naming them (``gang_of``, ``_check_trainer``);
2. build the workload's spec: the gang from the trainer's ``ScalingConfig`` (``gang_of``), the team and class of the
   script's flags, a name unique in the script (``ScriptContext.next_name``);
3. run it with the training launcher (``raylane.launchers.train.run_training``): queued and admitted under the team's
   quota before any worker starts, preempted and resumed from its latest checkpoint, retried, tracked in MLflow,
   the user's loop, loop config, datasets and compatible ``RunConfig`` parts kept (``UserTrainer``);
4. answer as ``fit()`` would: the last attempt's ``ray.train.Result`` (its ``return_value`` the loop's own), or raise
   ``WorkloadFailedError``, a ``ray.train.TrainingFailedError``, when the workload did not succeed.

The launcher's own ``fit()`` calls, and any made inside ``unmanaged()``, go to Ray's ``fit`` unchanged.

Words
- *managed fit*: a ``fit()`` run as a Raylane workload; *unmanaged*: Ray's own ``fit``, with no lease.
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import re
import threading
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple

from ray.train.v2.api.exceptions import TrainingFailedError

from raylane.errors import FatalError, ValidationError
from raylane.script.context import ScriptContext

log = logging.getLogger("raylane.script")

__all__ = ["install", "uninstall", "installed", "unmanaged", "gang_of", "workload_name", "spec_for",
           "WorkloadFailedError", "UnsupportedTrainerError", "PLACEMENT_OF_RAY"]

# Ray's placement-group strategy -> the spec's placement name (the inverse of raylane.scheduling.placement's
# RAY_STRATEGY for the four names Ray has).
PLACEMENT_OF_RAY = {"PACK": "pack", "SPREAD": "spread", "STRICT_PACK": "strict-pack", "STRICT_SPREAD": "strict-spread"}
# The resources a worker may ask for, and the spec's names for them.
_RESOURCE_KEYS = {"CPU": "cpu", "GPU": "gpu", "memory": "memory"}
_GIB = float(1 << 30)
# What V2's RunConfig names a run it was given no name for (ray.train.v2.api.config.RunConfig.__post_init__).
_AUTO_NAME = "ray_train_run-"
_NAME_MAX = 55  # room for next_name's "-N" within the spec's 63


class UnsupportedTrainerError(FatalError):
    """A trainer script mode does not run (a type other than ``TorchTrainer``, or Ray Train V1)."""


class WorkloadFailedError(FatalError, TrainingFailedError):
    """What a managed ``fit()`` raises when its workload did not succeed (failed, cancelled, rejected): a
    ``ray.train.TrainingFailedError`` as Ray's own ``fit`` raises, chained from the last attempt's error if any.
    ``record``: the workload's final record."""

    def __init__(self, message: str, record: Optional[Dict[str, Any]] = None):
        super().__init__(message)
        self.record = record

    def __reduce__(self):
        return (type(self), (self.args[0], self.record))


# ----------------------------------------------------------------------------------------------- pure mapping

def gang_of(scaling) -> Dict[str, Any]:
    """The spec's ``gang`` for a ``ray.train.ScalingConfig``: its workers (``(min, max)``: an elastic gang), each
    worker's resources as Ray would give them (``use_gpu`` alone: 1 GPU and no CPU), its placement strategy. Raises
    ``ValidationError`` naming every setting the spec cannot express."""
    errors: List[Tuple[str, Any, str]] = []
    per_worker = dict(scaling._resources_per_worker_not_none)  # what Ray itself would reserve for each worker
    resources: Dict[str, float] = {}
    for key, value in per_worker.items():
        if key in _RESOURCE_KEYS:
            resources[_RESOURCE_KEYS[key]] = float(value) / _GIB if key == "memory" else float(value)
        elif key.startswith("accelerator_type:"):
            errors.append(("scaling_config.accelerator_type", scaling.accelerator_type,
                           "None: Raylane chooses the nodes (give the GPU type as the class's or gang's features)"))
        else:
            errors.append((f"scaling_config.resources_per_worker.{key}", value,
                           "only CPU, GPU and memory in script mode"))
    if getattr(scaling, "label_selector", None):
        errors.append(("scaling_config.label_selector", scaling.label_selector,
                       "None: Raylane places the gang on the nodes its scheduler chose"))
    if getattr(scaling, "use_tpu", False):
        errors.append(("scaling_config.use_tpu", True, "False (TPUs are not scheduled by Raylane)"))
    strategy = scaling.placement_strategy
    placement = PLACEMENT_OF_RAY.get(strategy)
    if placement is None:
        errors.append(("scaling_config.placement_strategy", strategy, ", ".join(PLACEMENT_OF_RAY)))
    if getattr(scaling, "elasticity_enabled", False):
        workers: Any = {"min": int(scaling.min_workers), "max": int(scaling.max_workers)}
    else:
        workers = int(scaling.num_workers)
        if workers < 1:
            errors.append(("scaling_config.num_workers", workers, "an integer >= 1, or (min, max)"))
    if errors:
        raise ValidationError("trainer", errors)
    gang: Dict[str, Any] = {"workers": workers, "resources": resources}
    if placement != "pack":  # pack is Ray's default; the class's default_placement applies otherwise
        gang["placement"] = placement
    return gang


def workload_name(ctx: ScriptContext, run_name: Optional[str]) -> str:
    """The workload's name: ``--name``, else the ``RunConfig`` name the user gave, else the script's stem, made a
    spec name (lowercase letters, digits, '-') and unique within the script."""
    given = run_name if run_name and not run_name.startswith(_AUTO_NAME) else None
    raw = ctx.name or given or Path(ctx.script).stem
    base = re.sub(r"[^a-z0-9-]+", "-", raw.lower()).strip("-")[:_NAME_MAX].strip("-") or "script"
    return ctx.next_name(base)


def spec_for(ctx: ScriptContext, trainer, name: str, *, owner: Optional[str] = None) -> Dict[str, Any]:
    """The training spec of one ``fit()`` of ``trainer`` (its ``ScalingConfig`` checked by ``gang_of``)."""
    run: Dict[str, Any] = {"intent": f"script {Path(ctx.script).name}: {type(trainer).__name__}.fit()"}
    if owner:
        run["owner"] = owner
    return {"name": name, "team": ctx.team, "class": ctx.class_name, "kind": "train",
            "gang": gang_of(trainer.scaling_config), "config": {}, "run": run}


def _check_trainer(trainer) -> None:
    from ray.train.v2.torch.torch_trainer import TorchTrainer

    if type(trainer) is not TorchTrainer:
        cls = type(trainer)
        raise UnsupportedTrainerError(
            f"script mode runs ray.train.torch.TorchTrainer (and the Lightning and Transformers loops on it), not "
            f"{cls.__module__}.{cls.__qualname__}: it was not run. Run it as a TorchTrainer, or submit it outside "
            f"script mode with a spec (docs/training.md)")
    errors = []
    if getattr(trainer.run_config, "storage_filesystem", None) is not None:
        errors.append(("run_config.storage_filesystem", trainer.run_config.storage_filesystem,
                       "None: give a storage_path (a local or mounted folder)"))
    if getattr(trainer, "validation_config", None) is not None:
        errors.append(("validation_config", trainer.validation_config,
                       "None: report validation metrics from the loop (script mode does not run Train's validation)"))
    if errors:
        raise ValidationError("trainer", errors)


def _user_parts(trainer):
    """The parts of ``trainer`` every attempt keeps (``raylane.launchers.train.UserTrainer``)."""
    from raylane.launchers.train import UserTrainer

    from ray.train import CheckpointConfig

    rc = trainer.run_config
    # RunConfig fills in CheckpointConfig() when given none: then the launcher's retention applies.
    kept = rc.checkpoint_config if rc.checkpoint_config not in (None, CheckpointConfig()) else None
    return UserTrainer(train_loop_config=trainer.train_loop_config, datasets=dict(trainer.datasets or {}) or None,
                       dataset_config=trainer.data_config, checkpoint_config=kept,
                       callbacks=tuple(rc.callbacks or ()), worker_runtime_env=rc.worker_runtime_env)


def _storage_of(ctx: ScriptContext, trainer) -> Optional[str]:
    """The user's ``RunConfig.storage_path`` when given (not Ray's default), else the driver's."""
    from ray.train.constants import DEFAULT_STORAGE_PATH

    given = trainer.run_config.storage_path
    return given if given and given != DEFAULT_STORAGE_PATH else ctx.storage_path


# ----------------------------------------------------------------------------------------------- the hook

_state = threading.local()
_ctx: Optional[ScriptContext] = None
_originals: Dict[Any, Any] = {}


@contextlib.contextmanager
def unmanaged() -> Iterator[None]:
    """``fit()`` calls in this thread within the block go to Ray's own ``fit``: what the launcher itself runs."""
    depth = getattr(_state, "depth", 0)
    _state.depth = depth + 1
    try:
        yield
    finally:
        _state.depth = depth


def _managed() -> bool:
    return _ctx is not None and getattr(_state, "depth", 0) == 0


def managed_fit(trainer):
    """A ``fit()`` of ``trainer`` as a Raylane workload (steps 1-4 of the module docstring)."""
    from raylane.config.loader import load_spec_from_dict
    from raylane.launchers.driver import say
    from raylane.launchers.train import run_training

    ctx = _ctx
    _check_trainer(trainer)  # 1. what it cannot run is refused before anything queues
    name = workload_name(ctx, trainer.run_config.name)  # 2. the workload's spec
    spec = spec_for(ctx, trainer, name, owner=ctx.owner)
    load_spec_from_dict(spec, f"{type(trainer).__name__} of {ctx.script}")
    last: Dict[str, Any] = {"result": None, "error": None}

    def on_attempt(result, error) -> None:
        last["result"], last["error"] = result, error

    say(f"{Path(ctx.script).name}: {type(trainer).__name__}.fit() runs as workload {name!r} "
        f"(team {ctx.team}, class {ctx.class_name})")
    with unmanaged(), _signals_restored():  # 3. the launcher's own fit() calls are Ray's
        rec = run_training(spec, ctl=ctx.ctl, job_id=ctx.job_id, storage_path=_storage_of(ctx, trainer),
                           tracking_uri=ctx.tracking_uri, poll_s=ctx.poll_s,
                           train_fn=trainer.train_loop_per_worker, user=_user_parts(trainer), on_attempt=on_attempt)
    return _answer(rec, last["result"], last["error"], why=lambda: _why(ctx.ctl, rec))  # 4. as fit() would


@contextlib.contextmanager
def _signals_restored() -> Iterator[None]:
    """The launcher makes SIGTERM and SIGINT cancel its workload while it drives it; after the ``fit()``, the
    script's own handlers (Python's, by default) are back for the rest of the script."""
    import signal

    from raylane.launchers.driver import threading_main

    if not threading_main():
        yield
        return
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)


def _why(ctl, rec) -> str:
    """Why the workload ended as it did, as ``raylane explain`` tells it: its last journal note."""
    try:
        journal = ctl.explain(rec["id"]).get("journal") or []
    except Exception:  # noqa: BLE001 - the record's own words then
        journal = []
    notes = [e.get("note") for e in journal if e.get("note")]
    return rec.get("detail") or rec.get("reason") or (notes[-1] if notes else "")


def _answer(rec, result, error, why=None):
    """The ``Result`` of a succeeded workload's last attempt, its ``return_value`` the user's loop's; else raise
    ``WorkloadFailedError`` with ``why()``."""
    from raylane.control.client import State

    state = rec.state if hasattr(rec, "state") else State(rec["state"])
    if state is State.SUCCEEDED and result is not None:
        out = result.return_value if isinstance(result.return_value, dict) else {}
        return dataclasses.replace(result, return_value=out.get("value"), error=None)
    why = (why() if why is not None else None) or rec.get("detail") or rec.get("reason") or "no reason recorded"
    raise WorkloadFailedError(f"workload {rec['id']} {state.value}: {why}", rec) from error


def install(ctx: ScriptContext) -> None:
    """Replace ``DataParallelTrainer.fit`` (and V1's ``BaseTrainer.fit``) for ``ctx``'s script; idempotent."""
    global _ctx
    from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer

    _ctx = ctx
    if DataParallelTrainer not in _originals:
        original = DataParallelTrainer.fit
        _originals[DataParallelTrainer] = original

        def fit(self):
            if not _managed():
                return original(self)
            return managed_fit(self)

        fit.__doc__ = original.__doc__
        fit.__wrapped__ = original
        DataParallelTrainer.fit = fit
    try:
        from ray.train.base_trainer import BaseTrainer
    except ImportError:  # a Ray without the V1 trainers
        return
    if BaseTrainer not in _originals:
        original_v1 = BaseTrainer.fit
        _originals[BaseTrainer] = original_v1

        def fit_v1(self):
            if not _managed():
                return original_v1(self)
            raise UnsupportedTrainerError(
                f"{type(self).__name__} is a Ray Train V1 trainer (RAY_TRAIN_V2_ENABLED=0): script mode runs Ray "
                f"Train V2's TorchTrainer; unset RAY_TRAIN_V2_ENABLED. It was not run")

        fit_v1.__wrapped__ = original_v1
        BaseTrainer.fit = fit_v1


def uninstall() -> None:
    """Put Ray's ``fit`` methods back."""
    global _ctx
    for cls, original in list(_originals.items()):
        cls.fit = original
        del _originals[cls]
    _ctx = None


def installed() -> bool:
    return bool(_originals)
