"""Tune's conventions as a sweep reads them: which result field measures a trial's progress, and what a trainable
must do for the spec's scheduler to work.

This module owns two rules, both pure (no Ray session, no clock):

- the *time attribute* (``TimeAttr``): the field of a result that says how far the trial has trained, in the unit of
  ``budget``, rungs, grace periods and perturbation intervals. It is the spec's ``sweep.time_attr`` when given;
  else ``step`` when the result carries one (the reference LM reports its global step); else
  ``training_iteration``, which Tune adds to every result of a function or class trainable (its own schedulers'
  default; Ray's example trainables report no ``step``). Every consumer reads it here: the schedulers (which
  measure ``PROGRESS``, a field ``TimeAttr.stamped`` adds to the copy of the result they get, so that ASHA, the
  median rule, PBT and the synchronous rungs all follow one rule), the budget stop, the grant's trial views, and the
  MLflow step of each point (``raylane.sweeps.tracking``).
- the *static checks* (``convention_errors``): what can be known before anything queues from the trainable's code
  alone: that it is a function or a ``tune.Trainable`` subclass, that a named ``time_attr`` is one it reports, and
  that a PBT sweep's trainable saves and restores checkpoints (PBT's exploit copies a checkpoint; a trainable that
  never writes one makes PBT a random search, silently). A function checkpoints when its module calls
  ``report(..., checkpoint=...)`` and ``get_checkpoint()`` (read from its source); a class when it overrides
  ``save_checkpoint`` and ``load_checkpoint``. A trainable may say so itself with the attribute ``checkpoints =
  True`` (its checkpointing lives in another module) or ``False``; code whose source cannot be read is not refused.

Words
- *progress*: the value of the time attribute in one result.
- *trainable*: what ``sweep.trainable`` names: a Tune function trainable or a ``tune.Trainable`` subclass.
"""
from __future__ import annotations

import ast
import inspect
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

from raylane.errors import FatalError

__all__ = ["STEP", "TRAINING_ITERATION", "PROGRESS", "AUTO_TIME_ATTRS", "TimeAttr", "TrialResultError",
           "is_class_trainable", "checkpointing", "convention_errors"]

STEP = "step"
TRAINING_ITERATION = "training_iteration"  # ray.tune.result.TRAINING_ITERATION (a test keeps the two equal)
# Counters Tune itself adds to every result: a spec may name one as its time attribute whatever its trainable reports.
AUTO_TIME_ATTRS = (TRAINING_ITERATION, "time_total_s", "timesteps_total", "episodes_total")
# The field the wrapped schedulers measure (``TimeAttr.stamped`` adds it to their copy of each result).
PROGRESS = "raylane_progress"

ErrorList = List[Tuple[str, Any, str]]


class TrialResultError(FatalError):
    """A trial's result breaks the sweep's conventions (it lacks the time attribute the spec names): every trial
    would, so the sweep fails with the reason rather than run without its scheduler."""


@dataclass(frozen=True)
class TimeAttr:
    """The sweep's time attribute; ``declared`` is ``sweep.time_attr`` (None: ``step``, else
    ``training_iteration``). Picklable: Tune keeps the plug-ins that hold it in its experiment state."""

    declared: Optional[str] = None

    def name(self, result: Mapping[str, Any]) -> Optional[str]:
        """The field of ``result`` that measures progress; None when the declared one is missing."""
        if self.declared is not None:
            return self.declared if self.declared in result else None
        if result.get(STEP) is not None:
            return STEP
        return TRAINING_ITERATION if TRAINING_ITERATION in result else None

    def value(self, result: Mapping[str, Any]) -> Optional[float]:
        """The progress of ``result`` (None: none found, or not a number)."""
        key = self.name(result)
        x = result.get(key) if key is not None else None
        if isinstance(x, bool) or not isinstance(x, (int, float)):
            return None
        return x

    def stamped(self, result: Mapping[str, Any], trial_id: str = "?") -> Dict[str, Any]:
        """A copy of ``result`` with ``PROGRESS`` set, for the schedulers. ``TrialResultError`` when the result has no
        progress (only a declared ``time_attr`` can be missing: Tune adds ``training_iteration`` to every result)."""
        x = self.value(result)
        if x is None:
            raise TrialResultError(
                f"trial {trial_id} reported a result without a number in {self.describe()} (sweep.time_attr), "
                f"which measures every trial's budget; the result has: {_keys(result)}. Report it in every result, "
                f"or leave sweep.time_attr out (then {STEP} if reported, else Tune's {TRAINING_ITERATION})")
        return {**result, PROGRESS: x}

    def describe(self) -> str:
        return repr(self.declared) if self.declared else f"{STEP} (else {TRAINING_ITERATION})"


def _keys(result: Mapping[str, Any], limit: int = 30) -> str:
    names = sorted(str(k) for k in result)
    return ", ".join(names[:limit]) + (f" and {len(names) - limit} more" if len(names) > limit else "")


# --------------------------------------------------------------------------------------------- static checks


def is_class_trainable(obj: Any) -> bool:
    """Whether ``obj`` is a ``tune.Trainable`` subclass (else a function trainable, if callable)."""
    if not inspect.isclass(obj):
        return False
    from ray.tune import Trainable

    return issubclass(obj, Trainable)


def checkpointing(obj: Any) -> Tuple[Optional[bool], Optional[bool], str]:
    """``(saves, restores, where)``: whether the trainable writes and reads checkpoints (None: cannot tell), and what
    that rests on (for messages)."""
    declared = getattr(obj, "checkpoints", None)
    if isinstance(declared, bool):
        return declared, declared, f"its attribute checkpoints = {declared}"
    if is_class_trainable(obj):
        from ray.tune import Trainable

        return (obj.save_checkpoint is not Trainable.save_checkpoint,
                obj.load_checkpoint is not Trainable.load_checkpoint, f"the methods of class {obj.__name__}")
    module = inspect.getmodule(obj)
    try:
        tree = ast.parse(inspect.getsource(module)) if module is not None else None
    except (OSError, TypeError, SyntaxError):
        tree = None
    if tree is None:
        return None, None, "its source, which cannot be read"
    saves = restores = False
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            named = _called_name(node.func)
            if any(k.arg == "checkpoint" and not _is_none(k.value) for k in node.keywords):
                saves = True
            elif named == "report" and len(node.args) >= 2 and not _is_none(node.args[1]):
                saves = True
            if named == "get_checkpoint":
                restores = True
    return saves, restores, f"the source of module {module.__name__}"


def _called_name(func: ast.AST) -> Optional[str]:
    if isinstance(func, ast.Attribute):
        return func.attr
    if isinstance(func, ast.Name):
        return func.id
    return None


def _is_none(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and node.value is None


def convention_errors(obj: Callable, sweep: Any) -> ErrorList:
    """What cannot work, known from the trainable ``obj`` of ``sweep`` (a ``SweepSpec``) before anything queues; as
    (field path, value, what is allowed)."""
    path = sweep.trainable
    if inspect.isclass(obj) and not is_class_trainable(obj):
        return [("sweep.trainable", path, f"a Ray Tune function trainable or a ray.tune.Trainable subclass "
                                          f"({obj.__name__} is a class that does not derive from Trainable)")]
    errors: ErrorList = []
    reports = getattr(obj, "reports", None)
    attr = getattr(sweep, "time_attr", None)
    if attr is not None and reports is not None and attr not in reports and attr not in AUTO_TIME_ATTRS:
        errors.append(("sweep.time_attr", attr, f"a field every result of {path} carries: one of "
                                                f"{', '.join(list(reports) + list(AUTO_TIME_ATTRS))}"))
    if sweep.scheduler.type == "pbt":
        saves, restores, where = checkpointing(obj)
        missing = [what for what, ok in (("saves", saves), ("restores", restores)) if ok is False]
        if missing:
            how = ("override save_checkpoint and load_checkpoint" if is_class_trainable(obj) else
                   "report them with ray.tune.report(metrics, checkpoint=ray.tune.Checkpoint.from_directory(d)) "
                   "and resume from ray.tune.get_checkpoint()")
            errors.append(("sweep.scheduler.type", "pbt",
                           f"a trainable that saves and restores checkpoints for scheduler pbt, whose exploit copies "
                           f"a stronger trial's checkpoint into a weaker one: {path} never "
                           f"{' nor '.join(missing)} one (read from {where}). To use pbt, {how} "
                           f"(or declare checkpoints = True on it if another module does); else choose scheduler "
                           f"asha, median or fifo"))
    return errors
