"""The ``sweep:`` section of a workload spec (``kind: tune``): what to train, over which space, searched how, stopped
early by which scheduler, judged by which metric, with how many trials and how much per trial.

This module owns that section's schema and its defaults; it reads no files, imports neither Ray nor Optuna, and
decides nothing (the sweep driver, ``raylane.launchers.tune``, acts on it). It builds on the field types of
``raylane.config.fields`` and is what ``WorkloadSpec.sweep`` holds.

Words
- *trial*: one training run with one point of the search space, a Ray Tune trial.
- *budget*: how far a trial may train, in the unit of the sweep's *time attribute*: the result field ``time_attr``
  names, else ``step`` when the trainable reports one (the optimizer steps of the reference LM), else Tune's
  ``training_iteration`` (the number of results so far, which Tune adds to every result; Ray's example trainables
  report no ``step``). ``budget.max`` is every trial's last step (ASHA's maximum budget); a trial reports its
  metric and a checkpoint every ``budget.report_every`` steps, so rungs, perturbations and pauses fall on those.
- *rung*: a budget at which ASHA compares the trials that reached it and stops the weaker ones:
  ``grace_period * eta**k`` below ``budget.max``.
- *slot*: room for one trial at a time, a workload of its own (class of the spec, 1 worker x ``resources``) that the
  control actor admits under the team's quota. The number of trials running follows the slots held, up to
  ``max_concurrent``.
- *parameter path*: a dotted key into the trial's config (``lr``, ``model.d_model``); the spec's ``config`` is the
  base every trial starts from.

Fields that only one algorithm or scheduler reads (``startup_trials``, ``eta``, ``mutations``...) are refused when
another one is chosen, rather than ignored; their defaults are the ``DEFAULT_*`` constants below.
"""
from __future__ import annotations

import math
import re
from typing import Annotated, Any, Dict, List, Optional, Union

from pydantic import AfterValidator, Field, ValidationInfo, field_validator

from raylane.config.fields import Allowed, ResourcesSpec, StrictModel
from raylane.config.fields import error as _err
from raylane.config.fields import one_of as _one_of

__all__ = [
    "SEARCH_ALGORITHMS",
    "TRIAL_SCHEDULERS",
    "PARAM_TYPES",
    "ParamSpec",
    "SearchSpec",
    "BudgetSpec",
    "TrialSchedulerSpec",
    "SweepSpec",
    "grid_size",
]

# The names each axis accepts. ``raylane.sweeps.build`` registers one builder per name (a test keeps the two equal);
# the names live here so that checking a spec imports neither Ray nor Optuna.
SEARCH_ALGORITHMS = ("random", "grid", "tpe", "evolutionary")
TRIAL_SCHEDULERS = ("fifo", "median", "asha", "pbt")
PARAM_TYPES = ("uniform", "loguniform", "choice", "grid")
MODES = ("min", "max")

DEFAULT_SEARCH = "random"
DEFAULT_SCHEDULER = "fifo"
DEFAULT_SEED = 0
DEFAULT_STARTUP_TRIALS = 4  # tpe: random trials before the model of the space takes over
DEFAULT_POPULATION = 4  # evolutionary: trials per generation
DEFAULT_ETA = 3  # asha
DEFAULT_MIN_SAMPLES = 3  # median: trials that must have reached a step before it stops one there
DEFAULT_QUANTILE = 0.25  # pbt: fraction of trials that clone (bottom) and are cloned (top)
DEFAULT_RESAMPLE = 0.25  # pbt: chance an explored value is drawn anew instead of perturbed
DEFAULT_MAX_CONCURRENT = 4
MAX_CONCURRENT_LIMIT = 256  # each slot is a workload of the queue
DEFAULT_TRIAL_RESOURCES = ResourcesSpec(gpu=1, cpu=1)

# --------------------------------------------------------------------------------------------- scalar types

TRAINABLE_ALLOWED = ("a Ray Tune function trainable or ray.tune.Trainable subclass as 'package.module:name' (the "
                     "reference LM's is workloads.ray_tune:lm_trainable)")
_TRAINABLE_RE = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*")


def _check_trainable(value: str) -> str:
    if not _TRAINABLE_RE.fullmatch(value):
        raise _err("trainable", TRAINABLE_ALLOWED)
    return value


Trainable = Annotated[str, AfterValidator(_check_trainable), Allowed(TRAINABLE_ALLOWED)]

PATH_ALLOWED = "a dotted parameter path of identifiers, like lr or model.d_model"
_PATH_RE = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")


def _check_path(value: str) -> str:
    if not _PATH_RE.fullmatch(value):
        raise _err("param_path", PATH_ALLOWED)
    return value


ParamPath = Annotated[str, AfterValidator(_check_path), Allowed(PATH_ALLOWED)]

TIME_ATTR_ALLOWED = ("the name of a result field that grows as the trial trains, like step or training_iteration "
                     "(letters, digits and _, not starting with a digit); leave it out for step, else Tune's "
                     "training_iteration")
_TIME_ATTR_RE = re.compile(r"[A-Za-z_]\w{0,99}")


def _check_time_attr(value: str) -> str:
    if not _TIME_ATTR_RE.fullmatch(value):
        raise _err("time_attr", TIME_ATTR_ALLOWED)
    return value


TimeAttrName = Annotated[str, AfterValidator(_check_time_attr), Allowed(TIME_ATTR_ALLOWED)]
Scalar = Union[bool, int, float, str]
SearchName = _one_of(SEARCH_ALGORITHMS)
SchedulerName = _one_of(TRIAL_SCHEDULERS)
ParamType = _one_of(PARAM_TYPES)
Mode = _one_of(MODES)


# ---------------------------------------------------------------------------------------------- the space


class ParamSpec(StrictModel):
    """One dimension of the search space. ``uniform`` and ``loguniform`` take ``low`` < ``high`` (``loguniform``
    with ``low`` > 0); ``choice`` and ``grid`` take ``values``. ``grid`` values are all tried, in every combination
    with the other grid parameters; ``choice`` values are sampled."""

    type: ParamType
    # Validated when absent too, to require them for the types that need them.
    low: Optional[float] = Field(default=None, validate_default=True)
    high: Optional[float] = Field(default=None, validate_default=True)
    values: Optional[List[Scalar]] = Field(default=None, validate_default=True)

    @field_validator("low", "high")
    @classmethod
    def _bounds(cls, v: Optional[float], info: ValidationInfo) -> Optional[float]:
        kind = info.data.get("type")
        if kind is None:
            return v
        ranged = kind in ("uniform", "loguniform")
        if ranged and v is None:
            raise _err("bound", f"required for type {kind}: a number")
        if not ranged and v is not None:
            raise _err("bound", f"only for types uniform and loguniform; type {kind} takes values")
        if kind == "loguniform" and v is not None and v <= 0:
            raise _err("bound", "a number > 0 (type loguniform)")
        low = info.data.get("low")
        if info.field_name == "high" and v is not None and low is not None and v <= low:
            raise _err("bound", f"a number > low ({low:g})")
        return v

    @field_validator("values")
    @classmethod
    def _values(cls, v: Optional[List[Any]], info: ValidationInfo) -> Optional[List[Any]]:
        kind = info.data.get("type")
        if kind is None:
            return v
        if kind in ("choice", "grid"):
            if not v:
                raise _err("values", f"required for type {kind}: a list of at least one value")
            if len({repr(x) for x in v}) != len(v):
                raise _err("values", "a list of distinct values")
        elif v is not None:
            raise _err("values", f"only for types choice and grid; type {kind} takes low and high")
        return v

    def size(self) -> int:
        return len(self.values or ())


def grid_size(space: Dict[str, ParamSpec]) -> int:
    """How many trials the grid of ``space`` has: the product of the sizes of its ``grid`` parameters."""
    return math.prod(p.size() for p in space.values() if p.type == "grid")


# -------------------------------------------------------------------------------------------------- search


class SearchSpec(StrictModel):
    """How trial configs are drawn: ``random`` (independent draws), ``grid`` (every combination of the ``grid``
    parameters, once), ``tpe`` (Optuna's tree-structured Parzen estimator, after ``startup_trials`` random ones),
    ``evolutionary`` (Optuna's NSGA-II genetic algorithm, generations of ``population`` trials). All are seeded.
    Scheduler ``pbt`` takes ``random`` or ``grid`` only (it changes configs itself)."""

    algorithm: SearchName = DEFAULT_SEARCH
    seed: int = Field(default=DEFAULT_SEED, ge=0, le=2**32 - 1)
    startup_trials: Optional[int] = Field(default=None, ge=1)
    population: Optional[int] = Field(default=None, ge=2)

    @field_validator("startup_trials", "population")
    @classmethod
    def _only_for_its_algorithm(cls, v: Optional[int], info: ValidationInfo) -> Optional[int]:
        owner = {"startup_trials": "tpe", "population": "evolutionary"}[info.field_name]
        algo = info.data.get("algorithm")
        if v is not None and algo is not None and algo != owner:
            raise _err("search_field", f"only for algorithm {owner} (this search is {algo}); remove it")
        return v


# -------------------------------------------------------------------------------------------------- budget


class BudgetSpec(StrictModel):
    """How far each trial trains, in reported steps, and how often it reports (and checkpoints)."""

    max: int = Field(ge=1)
    report_every: int = Field(default=1, ge=1)

    @field_validator("report_every")
    @classmethod
    def _at_most_max(cls, v: int, info: ValidationInfo) -> int:
        top = info.data.get("max")
        if top is not None and v > top:
            raise _err("report_every", f"an integer from 1 to budget.max ({top})")
        return v


# ----------------------------------------------------------------------------------------------- scheduler

# The fields each scheduler reads; any other one given is refused.
_SCHEDULER_FIELDS = {
    "fifo": (),
    "median": ("grace_period", "min_samples"),
    "asha": ("grace_period", "eta", "synchronous"),
    "pbt": ("perturbation_interval", "mutations", "quantile_fraction", "resample_probability", "synch"),
}


class TrialSchedulerSpec(StrictModel):
    """When trials stop early, pause or change: ``fifo`` (never: every trial runs to ``budget.max``), ``median``
    (stop a trial whose best result is worse than the median of the others' at the same step, after
    ``grace_period``), ``asha`` (successive halving: at each rung ``grace_period * eta**k`` only the best
    ``1/eta`` go on; asynchronous by default, each trial judged against the results recorded at the rung so far, so
    which trials stop depends on the order they arrive in; with ``synchronous: true`` a rung is decided once, when
    every trial of its cohort reached it, the others waiting paused: the same results give the same stopped trials
    whatever the timing, ``raylane.sweeps.rungs``), ``pbt`` (population based training: every ``perturbation_interval`` steps the bottom
    ``quantile_fraction`` of trials copy the checkpoint and config of a top one and perturb the ``mutations``;
    with ``synch: true`` every trial waits at each perturbation until the whole population has reached it, so the
    quantiles are taken over all trials at the same step: asynchronous PBT compares a trial with the others' last
    scores, and a trial that finished or has not started yet is no part of the population).
    Budgets are in steps and must fall on reports (multiples of ``budget.report_every``)."""

    type: SchedulerName = DEFAULT_SCHEDULER
    grace_period: Optional[int] = Field(default=None, ge=1)
    eta: Optional[int] = Field(default=None, ge=2)
    min_samples: Optional[int] = Field(default=None, ge=1)
    perturbation_interval: Optional[int] = Field(default=None, ge=1, validate_default=True)
    mutations: Optional[Dict[ParamPath, ParamSpec]] = Field(default=None, validate_default=True)
    quantile_fraction: Optional[float] = Field(default=None, gt=0, le=0.5)
    resample_probability: Optional[float] = Field(default=None, ge=0, le=1)
    synch: Optional[bool] = None
    synchronous: Optional[bool] = None  # asha: decide each rung once over its whole cohort (default false)

    @field_validator("grace_period", "eta", "min_samples", "perturbation_interval", "mutations",
                     "quantile_fraction", "resample_probability", "synch", "synchronous")
    @classmethod
    def _only_for_its_scheduler(cls, v: Any, info: ValidationInfo) -> Any:
        kind = info.data.get("type")
        if kind is None:
            return v
        owners = [k for k, fields in _SCHEDULER_FIELDS.items() if info.field_name in fields]
        if v is not None and kind not in owners:
            raise _err("scheduler_field", f"only for scheduler {' or '.join(owners)} (this one is {kind}); remove it")
        if v is None and kind == "pbt" and info.field_name in ("perturbation_interval", "mutations"):
            what = "an integer >= 1 (steps)" if info.field_name == "perturbation_interval" else \
                "a mapping of parameter paths to uniform, loguniform or choice parameters"
            raise _err("scheduler_field", f"required for scheduler pbt: {what}")
        if info.field_name == "mutations" and v is not None:
            if not v:
                raise _err("mutations", "at least one parameter to perturb")
            grid = [name for name, p in v.items() if p.type == "grid"]
            if grid:
                raise _err("mutations", f"uniform, loguniform or choice parameters ({', '.join(grid)} is grid)")
        return v


# ----------------------------------------------------------------------------------------------- the sweep


class SweepSpec(StrictModel):
    """The ``sweep:`` section of a ``kind: tune`` spec."""

    # A Ray Tune function trainable or tune.Trainable subclass (raylane.sweeps.trainables), e.g. the reference LM's
    # ``workloads.ray_tune:lm_trainable`` (the spec's ``config`` is then its base TrainConfig).
    trainable: Trainable
    # The result field budgets are counted in (raylane.sweeps.conventions); None: step, else training_iteration.
    time_attr: Optional[TimeAttrName] = None
    space: Dict[ParamPath, ParamSpec] = Field(min_length=1)
    search: SearchSpec = Field(default_factory=SearchSpec)
    budget: BudgetSpec
    scheduler: TrialSchedulerSpec = Field(default_factory=TrialSchedulerSpec)
    metric: str = Field(min_length=1)
    mode: Mode
    # Required, except for algorithm grid (the grid's size).
    trials: Optional[int] = Field(default=None, ge=1, le=100_000, validate_default=True)
    # Slots asked of the control actor; the trials running at once follow the slots it grants, up to this.
    max_concurrent: int = Field(default=DEFAULT_MAX_CONCURRENT, ge=1, le=MAX_CONCURRENT_LIMIT)
    # What one trial holds while it runs (its slot's gang is 1 worker of this).
    resources: ResourcesSpec = Field(default_factory=lambda: DEFAULT_TRIAL_RESOURCES)

    @field_validator("search")
    @classmethod
    def _search_fits_space(cls, v: SearchSpec, info: ValidationInfo) -> SearchSpec:
        space = info.data.get("space")
        if not space:
            return v
        grid = sorted(n for n, p in space.items() if p.type == "grid")
        other = sorted(n for n, p in space.items() if p.type != "grid")
        if v.algorithm == "grid" and other:
            raise _err("search", f"algorithm grid needs every space parameter of type grid ({', '.join(other)} "
                                 f"are not); or choose one of random, tpe, evolutionary")
        if v.algorithm != "grid" and grid:
            raise _err("search", f"algorithm grid for grid parameters ({', '.join(grid)}); algorithm "
                                 f"{v.algorithm} samples: make them choice")
        return v

    @field_validator("scheduler")
    @classmethod
    def _scheduler_fits_budget(cls, v: TrialSchedulerSpec, info: ValidationInfo) -> TrialSchedulerSpec:
        budget: Optional[BudgetSpec] = info.data.get("budget")
        space = info.data.get("space")
        problems = []
        if budget is not None:
            every, top = budget.report_every, budget.max
            for name in ("grace_period", "perturbation_interval"):
                x = getattr(v, name)
                if x is not None and (x % every or x >= top):
                    problems.append(f"{name} ({x}) must be a multiple of budget.report_every ({every}) below "
                                    f"budget.max ({top})")
        search: Optional[SearchSpec] = info.data.get("search")
        if v.type == "pbt" and search is not None and search.algorithm not in ("random", "grid"):
            problems.append(f"scheduler pbt draws its population with search algorithm random or grid (not "
                            f"{search.algorithm}): it changes the trials' configs itself")
        if v.mutations and space is not None:
            missing = sorted(set(v.mutations) - set(space))
            if missing:
                problems.append(f"mutations must be parameters of the space ({', '.join(missing)} are not)")
        if problems:
            raise _err("scheduler", "; ".join(problems))
        return v

    @field_validator("trials")
    @classmethod
    def _trials(cls, v: Optional[int], info: ValidationInfo) -> Optional[int]:
        search: Optional[SearchSpec] = info.data.get("search")
        space = info.data.get("space")
        if search is None or space is None:
            return v
        if search.algorithm == "grid":
            size = grid_size(space)
            if v is not None and v != size:
                raise _err("trials", f"left out, or the grid's size ({size}): a grid sweep tries every point once")
            return size
        if v is None:
            raise _err("trials", f"required for algorithm {search.algorithm}: an integer >= 1")
        return v

    @property
    def concurrency(self) -> int:
        """Slots the sweep asks for: ``max_concurrent``, no more than it has trials."""
        return min(self.max_concurrent, self.trials or self.max_concurrent)

    def trial_gang(self) -> Dict[str, Any]:
        """The gang of one slot: 1 worker of ``resources``."""
        return {"workers": 1, "resources": self.resources.model_dump(mode="json")}
