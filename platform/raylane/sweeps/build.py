"""A ``SweepSpec`` turned into Ray Tune's objects: the param space, the search algorithm and the trial scheduler.

This module owns the mapping from the spec's names to Tune and Optuna classes: one builder per name in
``SEARCHERS`` and ``SCHEDULERS`` (``raylane.scheduling.registry.Registry``; an unknown name lists the known ones),
with the same names ``raylane.config.sweep`` accepts. It never starts anything. Ray Tune and Optuna are imported
inside the builders, so importing this module stays cheap.

Search algorithms, all seeded by ``search.seed`` and all gated by the sweep's grant (``raylane.sweeps.quota``):
``random`` and ``grid`` are Tune's own variant generator (``GrantedVariantGenerator``: independent draws, or every
combination of the ``grid`` parameters), the only kind Population Based Training accepts; ``tpe`` and
``evolutionary`` are Optuna samplers (``TPESampler``, ``NSGAIISampler``) behind Ray's ``OptunaSearch``, wrapped in
``GrantLimiter``. Every scheduler measures time in the sweep's time attribute (``time_attr``: the spec's
``time_attr``, else ``step``, else Tune's ``training_iteration``; ``raylane.sweeps.conventions``), read from the
field ``PROGRESS`` that ``raylane.sweeps.quota.QuotaScheduler`` adds to each result it hands them. ``asha`` is
Tune's asynchronous ``ASHAScheduler``, or with ``synchronous: true`` Raylane's
``raylane.sweeps.rungs.SynchronousHalvingScheduler`` (the same rungs, each decided once over its whole cohort).

Words: see ``raylane.config.sweep`` (budget, rung, parameter path).
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Callable, Dict, List

from raylane.config import sweep as cfg
from raylane.scheduling.registry import Registry
from raylane.sweeps.conventions import PROGRESS, TimeAttr

if TYPE_CHECKING:  # pragma: no cover
    from ray.tune.schedulers import TrialScheduler
    from ray.tune.search import SearchAlgorithm

    from raylane.config.sweep import ParamSpec, SweepSpec

__all__ = ["PROGRESS", "SEARCHERS", "SCHEDULERS", "param_space", "search_algorithm", "num_samples", "scheduler",
           "asha_rungs", "grace_period", "synchronous", "live_trial_cap", "time_attr"]

SEARCHERS: Registry[Callable[["SweepSpec", str], "SearchAlgorithm"]] = Registry("search algorithm", cfg.DEFAULT_SEARCH)
SCHEDULERS: Registry[Callable[["SweepSpec"], "TrialScheduler"]] = Registry("trial scheduler", cfg.DEFAULT_SCHEDULER)


# ------------------------------------------------------------------------------------------------- space


def domain(p: "ParamSpec") -> Any:
    """The Tune domain of one parameter (``grid``: a grid search, every value tried)."""
    from ray import tune

    if p.type == "uniform":
        return tune.uniform(p.low, p.high)
    if p.type == "loguniform":
        return tune.loguniform(p.low, p.high)
    if p.type == "grid":
        return tune.grid_search(list(p.values or ()))
    return tune.choice(list(p.values or ()))


def _nest(flat: Dict[str, Any]) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    for path, value in flat.items():
        *parents, last = path.split(".")
        node = out
        for key in parents:
            node = node.setdefault(key, {})
        node[last] = value
    return out


def param_space(sweep: "SweepSpec") -> Dict[str, Any]:
    """The nested param space of Tune: ``{"lr": tune.loguniform(...), "model": {"d_model": tune.choice(...)}}``."""
    return _nest({path: domain(p) for path, p in sweep.space.items()})


def time_attr(sweep: "SweepSpec") -> TimeAttr:
    """The sweep's time attribute: what its budget, rungs and intervals are counted in."""
    return TimeAttr(sweep.time_attr)


# ------------------------------------------------------------------------------------------------ search


def synchronous(sweep: "SweepSpec") -> bool:
    """Whether trials may wait paused at a rung (synchronous ASHA)."""
    return sweep.scheduler.type == "asha" and bool(sweep.scheduler.synchronous)


def live_trial_cap(sweep: "SweepSpec") -> int:
    """The most trials the search keeps unfinished: the slots asked for; all trials when some may wait at a rung
    (a waiting trial holds no slot, and the next one must be drawn so that the rung can be decided). The grant is
    the gate on what runs either way (``raylane.sweeps.quota``)."""
    return int(sweep.trials) if synchronous(sweep) else sweep.concurrency


def _optuna(sampler, sweep: "SweepSpec", grant_key: str):
    from ray.tune.search.optuna import OptunaSearch

    from raylane.sweeps.quota import GrantLimiter

    return GrantLimiter(OptunaSearch(sampler=sampler), live_trial_cap(sweep), grant_key)


def _variants(sweep: "SweepSpec", grant_key: str):
    from raylane.sweeps.quota import GrantedVariantGenerator

    return GrantedVariantGenerator(grant_key, max_concurrent=live_trial_cap(sweep), random_state=sweep.search.seed)


@SEARCHERS.register("random")
def _random_factory():
    return _variants


@SEARCHERS.register("grid")
def _grid_factory():
    return _variants


@SEARCHERS.register("tpe")
def _tpe_factory():
    def build(sweep: "SweepSpec", grant_key: str):
        import optuna

        startup = sweep.search.startup_trials or cfg.DEFAULT_STARTUP_TRIALS
        return _optuna(optuna.samplers.TPESampler(seed=sweep.search.seed, n_startup_trials=startup), sweep,
                       grant_key)

    return build


@SEARCHERS.register("evolutionary")
def _evolutionary_factory():
    def build(sweep: "SweepSpec", grant_key: str):
        import optuna

        population = sweep.search.population or cfg.DEFAULT_POPULATION
        return _optuna(optuna.samplers.NSGAIISampler(population_size=population, seed=sweep.search.seed), sweep,
                       grant_key)

    return build


def search_algorithm(sweep: "SweepSpec", grant_key: str):
    """The spec's search algorithm, drawing new trials only within the grant of ``grant_key`` (metric and mode
    come from ``TuneConfig``)."""
    return SEARCHERS.get(sweep.search.algorithm)(sweep, grant_key)


def num_samples(sweep: "SweepSpec") -> int:
    """Tune's ``num_samples``: the grid generator expands the grid itself, once."""
    return 1 if sweep.search.algorithm == "grid" else int(sweep.trials)


# --------------------------------------------------------------------------------------------- scheduler


def grace_period(sweep: "SweepSpec") -> int:
    """The scheduler's grace period in steps: the spec's, or one report."""
    return sweep.scheduler.grace_period or sweep.budget.report_every


def asha_rungs(sweep: "SweepSpec") -> List[int]:
    """The budgets at which ASHA compares trials: ``grace_period * eta**k`` below ``budget.max``."""
    eta = sweep.scheduler.eta or cfg.DEFAULT_ETA
    grace, top = grace_period(sweep), sweep.budget.max
    count = int(math.floor(math.log(top / grace, eta) + 1e-9)) + 1
    return [grace * eta ** k for k in range(count) if grace * eta ** k < top]


@SCHEDULERS.register("fifo")
def _fifo_factory():
    def build(sweep: "SweepSpec") -> "TrialScheduler":
        from ray.tune.schedulers import FIFOScheduler

        return FIFOScheduler()

    return build


@SCHEDULERS.register("median")
def _median_factory():
    def build(sweep: "SweepSpec") -> "TrialScheduler":
        from ray.tune.schedulers import MedianStoppingRule

        return MedianStoppingRule(time_attr=PROGRESS, grace_period=grace_period(sweep),
                                  min_samples_required=sweep.scheduler.min_samples or cfg.DEFAULT_MIN_SAMPLES)

    return build


@SCHEDULERS.register("asha")
def _asha_factory():
    def build(sweep: "SweepSpec") -> "TrialScheduler":
        eta = sweep.scheduler.eta or cfg.DEFAULT_ETA
        if synchronous(sweep):
            from raylane.sweeps.rungs import SynchronousHalvingScheduler

            return SynchronousHalvingScheduler(time_attr=PROGRESS, rungs=asha_rungs(sweep), eta=eta,
                                               trials=int(sweep.trials), max_t=sweep.budget.max)
        from ray.tune.schedulers import ASHAScheduler

        return ASHAScheduler(time_attr=PROGRESS, max_t=sweep.budget.max, grace_period=grace_period(sweep),
                             reduction_factor=eta, brackets=1)

    return build


@SCHEDULERS.register("pbt")
def _pbt_factory():
    def build(sweep: "SweepSpec") -> "TrialScheduler":
        from ray.tune.schedulers import PopulationBasedTraining

        s = sweep.scheduler
        mutations = _nest({path: domain(p) for path, p in (s.mutations or {}).items()})
        return PopulationBasedTraining(
            time_attr=PROGRESS,
            perturbation_interval=s.perturbation_interval,
            hyperparam_mutations=mutations,
            quantile_fraction=s.quantile_fraction if s.quantile_fraction is not None else cfg.DEFAULT_QUANTILE,
            resample_probability=(s.resample_probability if s.resample_probability is not None
                                  else cfg.DEFAULT_RESAMPLE),
            synch=bool(s.synch),
        )

    return build


def scheduler(sweep: "SweepSpec") -> "TrialScheduler":
    """The trial scheduler the spec names (metric and mode are set by Tune from ``TuneConfig``)."""
    return SCHEDULERS.get(sweep.scheduler.type)(sweep)
