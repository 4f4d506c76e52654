"""What a sweep trains: the trainable a spec names, as the Tune function trainable each trial runs.

This module owns the resolution of ``sweep.trainable`` and the config a trial sees; it imports neither torch nor the
reference workloads at import time (the trial actors of a user's function do not pay for them).

- ``workloads.train_lm``: ``workloads.ray_tune.lm_trainable`` with the spec's ``config`` as its base TrainConfig.
  The budget fixes ``max_steps`` (``budget.max``) and ``checkpoint_every`` (``budget.report_every``: a result with a
  checkpoint at every report), and ``eval_every`` defaults to one report so ``val_loss`` is in every result.
- ``package.module:function``: a user's Tune function trainable, called with the spec's ``config`` merged with the
  trial's sampled parameters. It must report ``step`` (the budget's unit) and the sweep's metric in every result,
  and checkpoint with ``ray.tune.report(..., checkpoint=...)`` / resume with ``ray.tune.get_checkpoint()`` if its
  trials are to survive a pause (a reclaimed slot) or be cloned by PBT; a trial without a checkpoint restarts from
  its first step.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Mapping, Optional, Tuple

from raylane.errors import ValidationError

if TYPE_CHECKING:  # pragma: no cover
    from raylane.config.sweep import SweepSpec

__all__ = ["LM_TRAINABLE", "merge_config", "lm_base_config", "check_trainable", "tune_trainable", "user_trainable"]

LM_TRAINABLE = "workloads.train_lm"


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


def lm_base_config(config: Mapping[str, Any], sweep: "SweepSpec") -> Tuple[Dict[str, Any], List[tuple]]:
    """The base TrainConfig of the LM trials, and the conflicts between ``config`` and the budget as errors."""
    errors = []
    budget = sweep.budget
    base = dict(config)
    for key, value, why in (("max_steps", budget.max, "budget.max"),
                            ("checkpoint_every", budget.report_every, "budget.report_every")):
        if key in base and base[key] != value:
            errors.append((f"config.{key}", base[key], f"left out, or equal to sweep.{why} ({value}): a sweep "
                                                        f"sets it from its budget"))
        base[key] = value
    if sweep.metric.startswith("val_"):
        every = base.setdefault("eval_every", budget.report_every)
        if not every or budget.report_every % every:
            errors.append(("config.eval_every", every, f"left out, or a divisor of sweep.budget.report_every "
                                                       f"({budget.report_every}): the metric {sweep.metric} must be "
                                                       f"in every result"))
    return base, errors


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
    errors: List[tuple] = []
    if sweep.trainable == LM_TRAINABLE:
        from workloads.ray_tune import LM_METRICS
        from workloads.train_lm import parse_config

        base, errors = lm_base_config(config, sweep)
        if sweep.metric not in LM_METRICS:
            errors.append(("sweep.metric", sweep.metric, f"a metric {LM_TRAINABLE} reports: one of "
                                                         f"{', '.join(LM_METRICS)}"))
        try:
            parse_config(base)
        except ValidationError as exc:
            errors += [(f"config.{p}", v, a) for p, v, a in exc.errors]
        seen = set()
        for path, point in _points(sweep):
            params: Dict[str, Any] = {}
            for k, v in point.items():
                params = merge_config(params, _nest(k, v))
            try:
                parse_config(merge_config(base, params))
            except ValidationError as exc:
                for p, v, a in exc.errors:
                    where = f"sweep.space.{p}" if p in sweep.space else f"config.{p}"
                    if (where, repr(v)) not in seen:
                        seen.add((where, repr(v)))
                        errors.append((where, v, a))
    else:
        try:
            _resolve(sweep.trainable)
        except ValidationError as exc:
            errors += exc.errors
    if errors:
        raise ValidationError("sweep", errors)


def _resolve(path: str) -> Callable:
    module, _, name = path.partition(":")
    try:
        fn = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise ValidationError("sweep", [("sweep.trainable", path, f"an importable function ({exc})")]) from None
    if not callable(fn):
        raise ValidationError("sweep", [("sweep.trainable", path, "a callable taking the trial's config")])
    return fn


def user_trainable(config: Mapping[str, Any], *, path: str, base: Optional[Mapping[str, Any]] = None) -> Any:
    """A trial of a user's function: ``base`` merged with the trial's ``config``."""
    return _resolve(path)(merge_config(base, config))


def tune_trainable(config: Mapping[str, Any], sweep: "SweepSpec"):
    """The Tune trainable of the spec, with its base config bound and the trial's resources attached."""
    from ray import tune

    from raylane.control.actor import GiB

    if sweep.trainable == LM_TRAINABLE:
        from workloads.ray_tune import lm_trainable

        base, _ = lm_base_config(config, sweep)
        fn = tune.with_parameters(lm_trainable, base=base)
    else:
        fn = tune.with_parameters(user_trainable, path=sweep.trainable, base=dict(config))
    r = sweep.resources
    resources = {"cpu": r.cpu, "gpu": r.gpu}
    if r.memory:
        resources["memory"] = int(r.memory * GiB)
    return tune.with_resources(fn, resources)
