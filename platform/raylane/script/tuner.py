"""The Ray Tune hook of script mode: every ``ray.tune.Tuner.fit()`` a user's unchanged script calls becomes a Raylane
sweep whose trials run on slots the control actor admits under the team's quota.

    python -m raylane.run --team team-a --class sweep train.py --lr 0.1

This module owns one integration point, ``ray.tune.Tuner.fit`` (``install`` replaces it, ``uninstall`` puts Ray's
back), and the reading of a user's ``Tuner`` into a ``raylane.launchers.tune.SweepPlan``. The sweep itself runs
through the same driver as a ``kind: tune`` spec (``drive_sweep``: slots, ``SlotManager``, the grant, MLflow parent
and child runs, queue rows, the end), so the two paths cannot drift apart. What the user wrote is kept:

- the trainable (a function, ``tune.with_resources`` of one, or a ``tune.Trainable`` class), its ``param_space``;
- ``TuneConfig``: ``search_alg`` (gated by the grant: ``GrantLimiter`` around a ``Searcher``, ``GrantedSearch``
  around any other search algorithm, ``GrantedVariantGenerator`` when none is given), ``scheduler`` (wrapped in
  ``QuotaScheduler``, which pauses a trial when a slot is reclaimed and hands every other decision to it),
  ``num_samples``, ``metric``/``mode``, ``max_concurrent_trials`` (the number of slots asked for; default
  ``DEFAULT_SLOTS``, never more than the trials), ``time_budget_s`` and the rest;
- ``RunConfig``: ``stop`` (with the grant's own stopper beside it), ``callbacks`` (with ``SweepTracking``),
  ``checkpoint_config``, ``failure_config``, ``verbose``.

What Raylane sets: the experiment's folder (``<storage>/<sweep id>``: a script's sweep always starts afresh) and
``reuse_actors=False`` (a paused trial's resources are free once its actor stops). ``fit()`` returns Tune's own
``ResultGrid``, so ``results.get_best_result()`` works in the script; a sweep that fails or is cancelled raises
``SweepFailed`` (or the ``RaylaneError`` a plug-in raised) after every trial's MLflow run ended with the sweep.

Refused by name, before anything queues (``UnsupportedTunerError``): a Ray Train trainer passed to the ``Tuner``
(run ``trainer.fit()`` itself, which script mode admits as a gang), a ``Tuner.restore``d tuner, a Ray Client
connection, ``num_samples=-1`` (endless), resources given per config (a function in ``tune.with_resources``).

Words
- *slot*, *grant*: ``raylane.sweeps.quota``. *trial resources*: what Tune reserves for one trial (the trainable's
  ``tune.with_resources``, or its class's ``default_resource_request``, else 1 CPU): each slot is a gang of one
  worker of them.
- *budget*: a trial's last step in its scheduler's time attribute, where the script says one (the scheduler's
  ``max_t``, a ``stop`` on that attribute; the smaller); else unknown, and no compute is counted as saved.
"""
from __future__ import annotations

import functools
import logging
import math
import re
import threading
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Tuple

from ray.tune.stopper import Stopper

from raylane.errors import FatalError, ValidationError

__all__ = ["install", "uninstall", "installed", "fit_as_sweep", "UnsupportedTunerError", "DEFAULT_SLOTS",
           "trial_resources", "trial_count", "slot_count", "budget_of"]

log = logging.getLogger("raylane.script.tuner")

DEFAULT_SLOTS = 4  # slots asked for when the script sets no max_concurrent_trials (a spec's max_concurrent default)
_NAME_MAX = 40  # leaves room for "-<n>" from next_name and "-slot-<i>" within the workload name limit

_ctx = None
_original_fit = None
_TUNE_DATE = r"(_\d{4}-\d{2}-\d{2}_\d{2}-\d{2}-\d{2})?"  # ray.tune.utils.date_str, as Tune's names end
_inside = threading.local()  # our own Tuner.fit() calls Ray's, not the hook


class UnsupportedTunerError(FatalError):
    """A ``Tuner`` script mode cannot run as a sweep under quota; the message names what and what to do instead."""


# ------------------------------------------------------------------------------------------ the hook


def install(ctx) -> None:
    """Route every ``ray.tune.Tuner.fit()`` of this process through ``fit_as_sweep`` under ``ctx``
    (``raylane.script.context.ScriptContext``). Installing again replaces the context."""
    global _ctx, _original_fit
    from ray.tune import Tuner

    _ctx = ctx
    if _original_fit is None:
        _original_fit = Tuner.fit

        @functools.wraps(_original_fit)
        def fit(self):
            if _ctx is None or getattr(_inside, "active", False):
                return _original_fit(self)
            return fit_as_sweep(self, _ctx)

        Tuner.fit = fit


def uninstall() -> None:
    """Put Ray's ``Tuner.fit`` back."""
    global _ctx, _original_fit
    from ray.tune import Tuner

    if _original_fit is not None:
        Tuner.fit = _original_fit
    _ctx, _original_fit = None, None


def installed() -> bool:
    return _original_fit is not None


# ------------------------------------------------------------------------------------------ the sweep


def fit_as_sweep(tuner, ctx):
    """Run ``tuner`` (a user's ``ray.tune.Tuner``) as a sweep of the script's team and class; returns its
    ``ResultGrid``. See the module docstring."""
    from raylane.ids import new_id
    from raylane.launchers.tune import drive_sweep

    internal = _internal(tuner)
    trainable = internal.trainable
    tc, rc = internal._tune_config, internal._run_config
    param_space = internal.param_space or {}
    resources = trial_resources(trainable, param_space)
    trials = trial_count(tc.num_samples, param_space, tc.search_alg)
    slots = slot_count(tc.max_concurrent_trials, tc.search_alg, trials)
    name = _workload_name(ctx, None if _tune_made(rc.name, trainable) else rc.name)
    sweep_id = new_id(name, kind="sweep")
    storage = Path(ctx.storage_path or _default_storage()).expanduser().resolve()
    plan = _plan(ctx, name, sweep_id, storage / sweep_id, trainable, tc, rc, param_space, resources, trials, slots,
                 _owner(ctx))
    rec = drive_sweep(plan, lambda run: _run_tune(run, trainable, param_space, tc, rc, storage),
                      ctl=ctx.ctl, job_id=ctx.job_id, tracking_uri=ctx.tracking_uri, poll_s=ctx.poll_s)
    results = rec["results"]
    if rec["state"] != "SUCCEEDED":
        raise _not_succeeded(rec["id"], rec["state"], results)
    # The Tuner the script holds answers get_results() with this sweep's results.
    internal._experiment_analysis = results._experiment_analysis
    return results


def _not_succeeded(sweep_id: str, state: str, results):
    """The typed error of a sweep that ended without raising: every trial failed (FAILED) or trials were left
    unfinished (CANCELLED); the first trial error's innermost cause is named."""
    from raylane.launchers.tune import SweepFailed, sweep_failure

    errors = [r.error for r in results if r.error is not None]
    if state == "FAILED" and errors:
        # A trial's error is Ray's RayTaskError, whose text is the whole remote traceback: name its cause.
        cause = getattr(errors[0], "cause", None)
        failed = sweep_failure(sweep_id, cause if isinstance(cause, BaseException) else errors[0])
        if isinstance(failed, SweepFailed):
            failed = SweepFailed(f"{failed} (every one of its {len(errors)} trial(s) failed)")
            failed.__cause__ = errors[0]
        return failed
    return SweepFailed(f"sweep {sweep_id} {state.lower()}: {len(errors)} of {len(results)} trial(s) failed, the "
                       f"others did not finish")


def _run_tune(run, trainable, param_space, tc, rc, storage: Path):
    """Ray's own ``Tuner.fit`` on the user's trainable and space, with their search algorithm and scheduler kept
    within the grant (``run``: ``raylane.launchers.tune.SweepRun``)."""
    import copy

    from ray.tune import Tuner

    from raylane.sweeps import quota
    from raylane.sweeps.conventions import TimeAttr

    key, plan = run.state.sweep_id, run.plan
    time_attr = TimeAttr(plan.time_attr)
    tune_config = copy.copy(tc)
    tune_config.search_alg = _gated_search(tc.search_alg, key, plan.concurrency)
    tune_config.scheduler = quota.QuotaScheduler(_scheduler(tc.scheduler), key, time_attr=time_attr)
    tune_config.max_concurrent_trials = None  # the gate above holds it (Tune would wrap the gate in a limiter)
    tune_config.reuse_actors = False
    run_config = copy.copy(rc)
    run_config.name = plan.sweep_id
    run_config.storage_path = str(storage)
    run_config.storage_filesystem = None
    run_config.stop = _stoppers(rc.stop, key)
    run_config.callbacks = list(rc.callbacks or []) + [run.tracking()]
    _inside.active = True
    try:
        return Tuner(trainable, param_space=param_space, tune_config=tune_config, run_config=run_config).fit()
    finally:
        _inside.active = False


def _plan(ctx, name: str, sweep_id: str, exp_dir: Path, trainable, tc, rc, param_space,
          resources: Dict[str, float], trials: int, slots: int, owner: Optional[str]):
    from raylane.launchers.tune import SLOT_SUFFIX, SweepPlan
    from raylane.tracking import _flatten, _param_value

    scheduler = tc.scheduler
    time_attr = getattr(scheduler, "_time_attr", None) if scheduler is not None else None
    budget = budget_of(scheduler, rc.stop, time_attr)
    run_meta: Dict[str, Any] = {"intent": f"script {Path(ctx.script).name}: Tuner.fit()"}
    if owner:
        run_meta["owner"] = owner
    sweep = _describe(tc, param_space, resources, trials, slots, budget, time_attr)
    spec = {"name": name, "team": ctx.team, "class": ctx.class_name, "kind": "tune", "config": {},
            "run": run_meta, "sweep": sweep}
    _check_spec(spec)
    params = {f"sweep.{k}": _param_value(v) for k, v in _flatten(sweep)}
    params.update({"script.path": Path(ctx.script).name,
                   "script.search_alg": _class_name(tc.search_alg) if tc.search_alg is not None else "default",
                   "script.scheduler": _class_name(scheduler) if scheduler is not None else "FIFOScheduler",
                   "script.trainable": getattr(trainable, "__qualname__", type(trainable).__qualname__)})
    slot_specs = [{**spec, "name": name + SLOT_SUFFIX.format(i=i), "gang": {"workers": 1, "resources": resources}}
                  for i in range(slots)]
    return SweepPlan(name=name, class_=ctx.class_name, spec=spec, params=params, slot_specs=slot_specs,
                     trials=trials, metric=tc.metric or "", mode=tc.mode or "min", exp_dir=exp_dir,
                     budget_max=budget, gpus_per_trial=float(resources.get("gpu", 0.0)), report_every=1,
                     time_attr=time_attr, sweep_id=sweep_id)


# ------------------------------------------------------------------------------------ reading a Tuner


def _internal(tuner):
    """The ``TunerInternal`` behind ``tuner``, refusing what cannot run as a sweep under quota."""
    if getattr(tuner, "_is_ray_client", False):
        raise UnsupportedTunerError("script mode cannot run a Tuner over a Ray Client connection (ray://): run the "
                                    "script as the job's driver on the cluster")
    internal = tuner._local_tuner
    if getattr(internal, "_is_restored", False):
        raise UnsupportedTunerError("script mode runs fresh sweeps: a Tuner.restore()d experiment was not resumed; "
                                    "remove Tuner.restore from the script, or run it outside script mode")
    _refuse_trainer(internal.trainable)
    if internal._tune_config.num_samples is not None and internal._tune_config.num_samples < 0:
        raise ValidationError("Tuner", [("tune_config.num_samples", internal._tune_config.num_samples,
                                         "an integer >= 1: a sweep under quota has a known number of trials")])
    return internal


def _refuse_trainer(trainable) -> None:
    try:
        from ray.train.trainer import BaseTrainer
    except ImportError:  # pragma: no cover - Ray without Train
        BaseTrainer = ()  # noqa: N806
    names = {c.__name__ for c in type(trainable).__mro__} if not isinstance(trainable, type) else set()
    if isinstance(trainable, BaseTrainer) or names & {"DataParallelTrainer", "TorchTrainer", "BaseTrainer"}:
        raise UnsupportedTunerError(
            f"script mode does not run a Ray Train trainer ({type(trainable).__name__}) inside a ray.tune.Tuner: "
            f"Tune would start its own worker group per trial, outside the sweep's slots. Call trainer.fit() "
            f"(script mode admits it as a gang of its ScalingConfig), or pass the Tuner a function trainable")


def trial_resources(trainable, param_space: Mapping[str, Any]) -> Dict[str, float]:
    """One trial's resources as a gang worker (``{"cpu", "gpu", "memory"}``: memory in GiB): the trainable's
    ``tune.with_resources``, or its class's ``default_resource_request``, else 1 CPU; a placement group of several
    bundles counts as their sum (a slot is one worker)."""
    from ray.tune.execution.placement_groups import PlacementGroupFactory, resource_dict_to_pg_factory

    from raylane.sweeps.conventions import is_class_trainable

    pgf = getattr(trainable, "_resources", None)
    if pgf is None and is_class_trainable(trainable):
        try:
            pgf = trainable.default_resource_request(dict(param_space))
        except Exception:  # noqa: BLE001 - a request that needs a sampled config: try the empty one
            pgf = trainable.default_resource_request({})
    if pgf is None:
        return {"cpu": 1.0, "gpu": 0.0}
    if isinstance(pgf, dict):
        pgf = resource_dict_to_pg_factory(pgf)
    if not isinstance(pgf, PlacementGroupFactory):
        raise ValidationError("Tuner", [("trainable resources", _class_name(pgf),
                                         "a dict or PlacementGroupFactory in tune.with_resources (resources per "
                                         "config are not supported in script mode: each slot has one size)")])
    total = pgf.required_resources
    out = {"cpu": float(total.get("CPU", 0.0)), "gpu": float(total.get("GPU", 0.0))}
    if total.get("memory"):
        out["memory"] = float(total["memory"]) / 2 ** 30
    return out


def _grid_size(space: Any) -> int:
    if isinstance(space, Mapping):
        if set(space) == {"grid_search"}:
            return max(1, len(space["grid_search"]))
        return math.prod(_grid_size(v) for v in space.values()) if space else 1
    if isinstance(space, (list, tuple)):
        return math.prod(_grid_size(v) for v in space) if space else 1
    return 1


def trial_count(num_samples: Optional[int], param_space: Mapping[str, Any], search_alg) -> int:
    """How many trials Tune will run: ``num_samples`` times the grid's size (Tune's variant generator expands
    ``grid_search``; a searcher draws ``num_samples``)."""
    from ray.tune.search import Searcher
    from ray.tune.search.search_generator import SearchGenerator

    n = int(num_samples or 1)
    if isinstance(search_alg, (Searcher, SearchGenerator)):
        return n
    return n * _grid_size(param_space)


def slot_count(max_concurrent: Optional[int], search_alg, trials: int) -> int:
    """Slots to ask for: ``max_concurrent_trials``, else the user's ``ConcurrencyLimiter``'s, else
    ``DEFAULT_SLOTS``; never more than the trials."""
    from ray.tune.search import ConcurrencyLimiter

    if not max_concurrent and isinstance(search_alg, ConcurrencyLimiter):
        max_concurrent = search_alg.max_concurrent
    return max(1, min(int(max_concurrent or DEFAULT_SLOTS), trials))


def budget_of(scheduler, stop, time_attr: Optional[str]) -> Optional[int]:
    """A trial's last step, where the script says one: its scheduler's ``max_t`` (ASHA, HyperBand) and a ``stop``
    mapping on the scheduler's time attribute (default ``training_iteration``); the smaller; None when neither."""
    found: List[float] = []
    max_t = getattr(scheduler, "_max_t", None)
    if isinstance(max_t, (int, float)) and not isinstance(max_t, bool) and math.isfinite(max_t) and max_t > 0:
        found.append(max_t)
    key = time_attr or "training_iteration"
    if isinstance(stop, Mapping) and isinstance(stop.get(key), (int, float)) and stop[key] > 0:
        found.append(stop[key])
    return int(min(found)) if found else None


# --------------------------------------------------------------------------------- Tune's objects, gated


def _gated_search(search_alg, key: str, cap: int):
    from ray.tune.search import SearchAlgorithm, Searcher

    from raylane.sweeps import quota

    if search_alg is None:
        return quota.GrantedVariantGenerator(key, max_concurrent=cap)
    if isinstance(search_alg, Searcher):
        return quota.GrantLimiter(search_alg, cap, key)
    if isinstance(search_alg, SearchAlgorithm):
        return quota.GrantedSearch(search_alg, key)
    raise ValidationError("Tuner", [("tune_config.search_alg", _class_name(search_alg),
                                     "a ray.tune.search Searcher or SearchAlgorithm (a searcher's name as a string "
                                     "is not supported in script mode)")])


def _scheduler(scheduler):
    from ray.tune.schedulers import FIFOScheduler

    return scheduler if scheduler is not None else FIFOScheduler()


class StopCriteria(Stopper):
    """A ``RunConfig.stop`` mapping as a Tune ``Stopper`` (a trial stops once any field reaches its value, as Tune
    reads a mapping), so that it can stand beside the grant's stopper."""

    def __init__(self, criteria: Mapping[str, Any]):
        self.criteria = dict(criteria)

    def __call__(self, trial_id: str, result: Dict) -> bool:
        return any(k in result and result[k] >= v for k, v in self.criteria.items())

    def stop_all(self) -> bool:
        return False


def _stoppers(stop, key: str) -> List[Stopper]:
    """The grant's stopper and the script's ``stop`` (a mapping, a function, a ``Stopper`` or a list of them)."""
    from ray.tune.stopper import FunctionStopper

    from raylane.sweeps import quota

    stoppers: List[Stopper] = [quota.GrantStopper(key)]
    if isinstance(stop, Mapping):
        stoppers.append(StopCriteria(stop))
    elif isinstance(stop, (list, tuple)):
        stoppers.extend(stop)
    elif isinstance(stop, Stopper):
        stoppers.append(stop)
    elif callable(stop):
        stoppers.append(FunctionStopper(stop))
    return stoppers


# ----------------------------------------------------------------------------- the spec that describes it


def _describe(tc, param_space, resources, trials: int, slots: int, budget: Optional[int],
              time_attr: Optional[str]) -> Dict[str, Any]:
    """The ``sweep:`` section recorded for the slots and the parent run: what can be said in the spec's words of
    the script's sweep (the script's own search algorithm and scheduler are named in the ``script.*`` params)."""
    space = _space(param_space)
    grid = bool(space) and all(p["type"] == "grid" for p in space.values())
    if not space:
        space = {"script": {"type": "choice", "values": ["param_space of the script"]}}
    out: Dict[str, Any] = {
        "trainable": "raylane.script.tuner:script_trainable",
        "space": space,
        "search": {"algorithm": "grid" if grid else "random"},
        "budget": {"max": int(budget or 1), "report_every": 1},
        "scheduler": {"type": _scheduler_type(tc.scheduler)},
        "metric": tc.metric or "-", "mode": tc.mode or "min",
        "max_concurrent": slots,
        "resources": resources,
    }
    if not grid:
        out["trials"] = trials
    if time_attr:
        out["time_attr"] = time_attr
    return out


def _space(param_space: Mapping[str, Any], prefix: str = "") -> Dict[str, Dict[str, Any]]:
    from ray.tune.search.sample import Categorical, Float, LogUniform

    out: Dict[str, Dict[str, Any]] = {}
    for k, v in param_space.items():
        path = f"{prefix}{k}"
        if not re.fullmatch(r"[A-Za-z_][\w]*", str(k)):
            continue
        if isinstance(v, Mapping) and set(v) == {"grid_search"} and _scalars(v["grid_search"]):
            out[path] = {"type": "grid", "values": list(v["grid_search"])}
        elif isinstance(v, Mapping):
            out.update(_space(v, f"{path}."))
        elif isinstance(v, Float) and v.lower is not None and v.upper is not None and v.lower < v.upper:
            log_scale = isinstance(v.get_sampler(), LogUniform) and v.lower > 0
            out[path] = {"type": "loguniform" if log_scale else "uniform", "low": v.lower, "high": v.upper}
        elif isinstance(v, Categorical) and _scalars(v.categories):
            out[path] = {"type": "choice", "values": list(v.categories)}
    grid = [p for p in out.values() if p["type"] == "grid"]
    if grid and len(grid) < len(out):  # the spec's words: grid only with a grid search; sampled values are choices
        for p in grid:
            p["type"] = "choice"
    return out


def _scalars(values) -> bool:
    return bool(values) and all(isinstance(x, (str, int, float, bool)) for x in values)


def _scheduler_type(scheduler) -> str:
    names = {c.__name__ for c in type(scheduler).__mro__} if scheduler is not None else set()
    if names & {"AsyncHyperBandScheduler", "HyperBandScheduler"}:
        return "asha"
    if "MedianStoppingRule" in names:
        return "median"
    return "fifo"  # PBT's fields (mutations of the spec's space) cannot be said here; script.scheduler names it


def _check_spec(spec: Dict[str, Any]) -> None:
    """The recorded spec must load (the control plane checks it at submit); a description the spec's rules refuse
    falls back to the plainest one rather than fail a sweep Tune could run."""
    from raylane.config.loader import load_spec_from_dict

    try:
        load_spec_from_dict(spec, "script sweep")
    except ValidationError:
        sweep = spec["sweep"]
        sweep.update(space={"script": {"type": "choice", "values": ["param_space of the script"]}},
                     search={"algorithm": "random"}, scheduler={"type": "fifo"})
        sweep.setdefault("trials", 1)
        sweep.pop("time_attr", None)
        load_spec_from_dict(spec, "script sweep")


# ------------------------------------------------------------------------------------------------ helpers


def _workload_name(ctx, run_name: Optional[str]) -> str:
    """``--name``, else the ``RunConfig.name`` the script gave, else the script's stem; a spec name, unique in the
    script."""
    raw = ctx.name or run_name or Path(ctx.script).stem
    base = re.sub(r"[^a-z0-9-]+", "-", raw.lower()).strip("-")[:_NAME_MAX].strip("-") or "sweep"
    return ctx.next_name(base)


def _tune_made(run_name: Optional[str], trainable) -> bool:
    """Whether ``run_name`` is the one Tune gives a ``RunConfig`` without a name (``<trainable>_<date>``, or the
    trainable's name alone with ``TUNE_DISABLE_DATED_SUBDIR``: ``StorageContext.get_experiment_dir_name``)."""
    from ray.tune.experiment import Experiment

    if not run_name:
        return True
    try:
        made = re.escape(Experiment.get_trainable_name(trainable))
    except Exception:  # noqa: BLE001 - a trainable Tune cannot name: the date alone tells
        made = r".+"
    return re.fullmatch(made + _TUNE_DATE, run_name) is not None


def _owner(ctx) -> Optional[str]:
    if getattr(ctx, "owner", None):
        return ctx.owner
    try:
        who = ctx.ctl.whoami()
    except Exception:  # noqa: BLE001 - a client without whoami (tests' fakes): no owner recorded
        return None
    return who.get("user") if who.get("auth") else None


def _default_storage() -> str:
    from raylane.launchers.train import DEFAULT_STORAGE

    return str(DEFAULT_STORAGE)


def _class_name(obj: Any) -> str:
    cls = obj if isinstance(obj, type) else type(obj)
    return f"{cls.__module__}.{cls.__qualname__}"
