"""What a sweep trains: the trainable a spec names, as the Tune trainable each trial runs.

This module owns the resolution of ``sweep.trainable`` and the config a trial sees; it imports neither torch nor any
trainable at import time (the trial actors of a user's function do not pay for them), and knows no trainable by name.

``sweep.trainable: package.module:name`` is a Ray Tune function trainable, called with the spec's ``config`` merged
with the trial's sampled parameters, or a ``ray.tune.Trainable`` subclass, constructed with that config. Every result
must carry the sweep's metric and its time attribute (the budget's unit: ``step`` if the trainable reports one, else
the ``training_iteration`` Tune adds, or the spec's ``time_attr``; ``raylane.sweeps.conventions``). A function
checkpoints with ``ray.tune.report(..., checkpoint=...)`` and resumes with ``ray.tune.get_checkpoint()``, a class with
``save_checkpoint``/``load_checkpoint``, if its trials are to survive a pause (a reclaimed slot) or be cloned by PBT
(a PBT sweep whose trainable does neither is refused before it queues); a trial without a checkpoint restarts from
its first step. A trainable may declare, as attributes of the function or class:

- ``config_schema``: a pydantic model of its whole config; the base config and every corner of the space (each
  parameter at each end or value) are checked against it before anything queues (``config.*`` / ``sweep.space.*``).
- ``reports``: the metric names its results carry; the sweep's ``metric`` must be one of them.
- ``sweep_config(config, budget, metric) -> (config, errors)``: the base config the trials start from, given the
  budget (``{"max": N, "report_every": K}``) and the metric, with conflicts as (path, value, allowed) errors
  (the reference LM sets ``max_steps`` and ``checkpoint_every`` from the budget this way).
- ``checkpoints``: True or False, whether it saves and restores checkpoints, where reading its module's source cannot
  tell (``raylane.sweeps.conventions.checkpointing``).
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Mapping, Optional, Tuple

from raylane.errors import ValidationError

if TYPE_CHECKING:  # pragma: no cover
    from raylane.config.sweep import SweepSpec

__all__ = ["merge_config", "base_config", "check_trainable", "tune_trainable", "user_trainable", "with_base"]


def merge_config(base: Optional[Mapping[str, Any]], params: Optional[Mapping[str, Any]]) -> Dict[str, Any]:
    """``base`` with ``params`` merged in, nested mappings merged key by key (``params`` wins)."""
    out: Dict[str, Any] = dict(base or {})
    for key, value in (params or {}).items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merge_config(out[key], value)
        else:
            out[key] = value
    return out


def _nest(path: str, value: Any) -> Dict[str, Any]:
    *parents, last = path.split(".")
    node: Dict[str, Any] = {last: value}
    for key in reversed(parents):
        node = {key: node}
    return node


def base_config(fn: Callable, config: Mapping[str, Any], sweep: "SweepSpec") -> Tuple[Dict[str, Any], List[tuple]]:
    """The base config of the trials (the trainable's ``sweep_config`` if it declares one) and its errors."""
    hook = getattr(fn, "sweep_config", None)
    if hook is None:
        return dict(config), []
    budget = {"max": sweep.budget.max, "report_every": sweep.budget.report_every}
    base, errors = hook(dict(config), budget, sweep.metric)
    return dict(base), [tuple(e) for e in errors]


def _points(sweep: "SweepSpec") -> List[Tuple[str, Dict[str, Any]]]:
    """Corner points of the space: each parameter at each of its ends or values, the others at their first."""
    first = {path: (p.low if p.low is not None else p.values[0]) for path, p in sweep.space.items()}
    points = []
    for path, p in sweep.space.items():
        for value in ([p.low, p.high] if p.low is not None else list(p.values or ())):
            point = dict(first)
            point[path] = value
            points.append((path, point))
    return points


def check_trainable(config: Mapping[str, Any], sweep: "SweepSpec") -> None:
    """Refuse, before anything queues, a sweep whose trials could not start; every problem in one
    ``ValidationError`` (paths as the user wrote them: ``config.*``, ``sweep.*``)."""
    from raylane.entrypoints import schema_errors
    from raylane.sweeps.conventions import convention_errors

    fn = _resolve(sweep.trainable)
    conventions = convention_errors(fn, sweep)
    if any(p == "sweep.trainable" for p, _, _ in conventions):
        raise ValidationError("sweep", conventions)
    base, errors = base_config(fn, config, sweep)
    errors += conventions
    reports = getattr(fn, "reports", None)
    if reports is not None and sweep.metric not in reports:
        errors.append(("sweep.metric", sweep.metric, f"a metric {sweep.trainable} reports: one of "
                                                     f"{', '.join(reports)}"))
    schema = getattr(fn, "config_schema", None)
    if schema is not None:
        errors += schema_errors(schema, base)
        seen = set()
        for path, point in _points(sweep):
            params: Dict[str, Any] = {}
            for k, v in point.items():
                params = merge_config(params, _nest(k, v))
            for p, v, a in schema_errors(schema, merge_config(base, params)):
                bare = p[len("config."):] if p.startswith("config.") else p
                where = f"sweep.space.{bare}" if bare in sweep.space else p
                if (where, repr(v)) not in seen and (p, v, a) not in errors:
                    seen.add((where, repr(v)))
                    errors.append((where, v, a))
    if errors:
        raise ValidationError("sweep", errors)


def _resolve(path: str) -> Callable:
    module, _, name = path.partition(":")
    try:
        fn = getattr(importlib.import_module(module), name)
    except Exception as exc:  # noqa: BLE001 - any failure to load the user's code is named, not a traceback
        raise ValidationError("sweep", [("sweep.trainable", path, f"an importable function or tune.Trainable "
                                                                  f"class ({type(exc).__name__}: {exc})")]) from None
    if not callable(fn):
        raise ValidationError("sweep", [("sweep.trainable", path, "a function taking the trial's config, or a "
                                                                  "ray.tune.Trainable subclass")])
    return fn


def user_trainable(config: Mapping[str, Any], *, path: str, base: Optional[Mapping[str, Any]] = None) -> Any:
    """A trial of a user's function: ``base`` merged with the trial's ``config``."""
    return _resolve(path)(merge_config(base, config))


def with_base(cls: type, base: Mapping[str, Any]) -> type:
    """The ``tune.Trainable`` subclass ``cls`` whose instances see ``base`` merged with the trial's config (under its
    own name, so that Tune's trial names and logs read as the user wrote it)."""
    base = dict(base)

    class Based(cls):  # type: ignore[misc, valid-type]
        def __init__(self, config: Optional[Dict[str, Any]] = None, *args, **kwargs):
            super().__init__(merge_config(base, config), *args, **kwargs)

        def reset_config(self, new_config: Dict[str, Any]) -> bool:
            return super().reset_config(merge_config(base, new_config))

    Based.__name__, Based.__qualname__ = cls.__name__, cls.__qualname__
    return Based


def tune_trainable(config: Mapping[str, Any], sweep: "SweepSpec"):
    """The Tune trainable of the spec (a function, or a ``tune.Trainable`` class), with its base config bound and
    the trial's resources attached."""
    from ray import tune

    from raylane.control.state import GiB
    from raylane.sweeps.conventions import is_class_trainable

    obj = _resolve(sweep.trainable)
    base, _ = base_config(obj, config, sweep)
    if is_class_trainable(obj):
        fn = with_base(obj, base)
    else:
        fn = tune.with_parameters(user_trainable, path=sweep.trainable, base=base)
    r = sweep.resources
    resources = {"cpu": r.cpu, "gpu": r.gpu}
    if r.memory:
        resources["memory"] = int(r.memory * GiB)
    return tune.with_resources(fn, resources)
