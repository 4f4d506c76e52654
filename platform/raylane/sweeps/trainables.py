"""What a sweep trains: the trainable a spec names, as the Tune function trainable each trial runs.

This module owns the resolution of ``sweep.trainable`` and the config a trial sees; it imports neither torch nor any
trainable at import time (the trial actors of a user's function do not pay for them), and knows no trainable by name.

``sweep.trainable: package.module:function`` is a Ray Tune function trainable, called with the spec's ``config``
merged with the trial's sampled parameters. It must report ``step`` (the budget's unit) and the sweep's metric in
every result, and checkpoint with ``ray.tune.report(..., checkpoint=...)`` / resume with ``ray.tune.get_checkpoint()``
if its trials are to survive a pause (a reclaimed slot) or be cloned by PBT; a trial without a checkpoint restarts
from its first step. A trainable may declare, as attributes of the function:

- ``config_schema``: a pydantic model of its whole config; the base config and every corner of the space (each
  parameter at each end or value) are checked against it before anything queues (``config.*`` / ``sweep.space.*``).
- ``reports``: the metric names its results carry; the sweep's ``metric`` must be one of them.
- ``sweep_config(config, budget, metric) -> (config, errors)``: the base config the trials start from, given the
  budget (``{"max": N, "report_every": K}``) and the metric, with conflicts as (path, value, allowed) errors
  (the reference LM sets ``max_steps`` and ``checkpoint_every`` from the budget this way).
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Mapping, Optional, Tuple

from raylane.errors import ValidationError

if TYPE_CHECKING:  # pragma: no cover
    from raylane.config.sweep import SweepSpec

__all__ = ["merge_config", "base_config", "check_trainable", "tune_trainable", "user_trainable"]


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

    fn = _resolve(sweep.trainable)
    base, errors = base_config(fn, config, sweep)
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
        raise ValidationError("sweep", [("sweep.trainable", path, f"an importable function "
                                                                  f"({type(exc).__name__}: {exc})")]) from None
    if not callable(fn):
        raise ValidationError("sweep", [("sweep.trainable", path, "a callable taking the trial's config")])
    return fn


def user_trainable(config: Mapping[str, Any], *, path: str, base: Optional[Mapping[str, Any]] = None) -> Any:
    """A trial of a user's function: ``base`` merged with the trial's ``config``."""
    return _resolve(path)(merge_config(base, config))


def tune_trainable(config: Mapping[str, Any], sweep: "SweepSpec"):
    """The Tune trainable of the spec, with its base config bound and the trial's resources attached."""
    from ray import tune

    from raylane.control.state import GiB

    base, _ = base_config(_resolve(sweep.trainable), config, sweep)
    fn = tune.with_parameters(user_trainable, path=sweep.trainable, base=base)
    r = sweep.resources
    resources = {"cpu": r.cpu, "gpu": r.gpu}
    if r.memory:
        resources["memory"] = int(r.memory * GiB)
    return tune.with_resources(fn, resources)
