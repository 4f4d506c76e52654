"""The ``sweep:`` section of ``kind: tune`` specs: every bad field named with its value and what is allowed, all errors
of a spec at once, the checks that tie fields together, and the driver's pre-flight checks of the trainable.

Pure: no Ray session (building Tune objects imports Ray Tune, but starts nothing).
"""
from __future__ import annotations

import copy
from pathlib import Path

import pytest

from tests.specdoc import DELETE
from tests.specdoc import raw as _raw
from tests.specdoc import with_field as _with_field

from raylane.config import sweep as sweep_cfg
from raylane.config.loader import MISSING, load_policy, load_spec, load_spec_from_dict
from raylane.errors import ValidationError
from raylane.launchers.tune import _parse, slot_specs
from raylane.sweeps import build
from raylane.sweeps.trainables import base_config, check_trainable, merge_config

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "specs" / "sweep-asha-team-a.yaml"
LOCAL = ROOT / "policies" / "local.yaml"


def raw() -> dict:
    return _raw(EXAMPLE)


def with_field(doc: dict, path: str, value) -> dict:
    """Paths are split on '/', since search-space parameter names may hold dots."""
    return _with_field(doc, path, value, sep="/")


def errors_of(doc) -> list:
    with pytest.raises(ValidationError) as exc:
        load_spec_from_dict(doc)
    return exc.value.errors


def assert_has_error(errors, path, value, allowed_part):
    matches = [e for e in errors if e[0] == path]
    assert matches, f"no error at {path!r}; got {errors}"
    if value is not None:
        assert any(v == value or v is value for _, v, _ in matches), (matches, value)
    assert any(allowed_part in a for _, _, a in matches), (matches, allowed_part)


def test_example_is_valid_against_the_local_policy():
    spec = load_spec(EXAMPLE, load_policy(LOCAL))
    s = spec.sweep
    assert (spec.kind, spec.class_, s.scheduler.type, s.search.algorithm) == ("tune", "sweep", "asha", "tpe")
    assert s.trials == 8 and s.concurrency == 2 and s.resources.gpu == 1
    assert build.asha_rungs(s) == [10, 20, 40]


def test_defaults_live_in_one_place():
    doc = raw()
    doc["sweep"] = {"trainable": "workloads.ray_tune:lm_trainable",
                    "space": {"lr": {"type": "uniform", "low": 0.001, "high": 0.01}}, "budget": {"max": 10},
                    "metric": "loss", "mode": "min", "trials": 3}
    s = load_spec_from_dict(doc).sweep
    assert s.search.algorithm == sweep_cfg.DEFAULT_SEARCH
    assert s.scheduler.type == sweep_cfg.DEFAULT_SCHEDULER and s.budget.report_every == 1
    assert s.max_concurrent == sweep_cfg.DEFAULT_MAX_CONCURRENT and s.concurrency == 3  # no more slots than trials
    assert s.resources == sweep_cfg.DEFAULT_TRIAL_RESOURCES


SWEEP_CASES = [
    ("kind tune without sweep", "sweep", DELETE, "sweep", None, "required for kind: tune: a mapping with fields"),
    ("gang of two workers", "gang", {"workers": 2}, "sweep", None, "gang.workers 1 for kind: tune (got 2)"),
    ("trainable", "sweep/trainable", "train.py", "sweep.trainable", "train.py", "'package.module:name'"),
    ("space empty", "sweep/space", {}, "sweep.space", {}, "at least 1 entry"),
    ("space path", "sweep/space", {"Bad Key": {"type": "choice", "values": [1]}}, "sweep.space.Bad Key", "Bad Key",
     "a dotted parameter path"),
    ("param type", "sweep/space/lr/type", "normal", "sweep.space.lr.type", "normal",
     "one of uniform, loguniform, choice, grid"),
    ("low missing", "sweep/space/lr/low", DELETE, "sweep.space.lr.low", None, "required for type loguniform"),
    ("loguniform low 0", "sweep/space/lr/low", 0, "sweep.space.lr.low", 0, "a number > 0 (type loguniform)"),
    ("high below low", "sweep/space/lr/high", 1e-5, "sweep.space.lr.high", 1e-5, "a number > low (0.0001)"),
    ("uniform with values", "sweep/space/lr/values", [1, 2], "sweep.space.lr.values", [1, 2],
     "only for types choice and grid"),
    ("choice without values", "sweep/space/weight_decay/values", DELETE, "sweep.space.weight_decay.values", None,
     "required for type choice"),
    ("choice with a bound", "sweep/space/weight_decay/low", 0.0, "sweep.space.weight_decay.low", 0.0,
     "only for types uniform and loguniform"),
    ("repeated values", "sweep/space/weight_decay/values", [0.1, 0.1], "sweep.space.weight_decay.values",
     [0.1, 0.1], "distinct values"),
    ("algorithm", "sweep/search/algorithm", "bayes", "sweep.search.algorithm", "bayes",
     "one of random, grid, tpe, evolutionary"),
    ("population for tpe", "sweep/search/population", 8, "sweep.search.population", 8,
     "only for algorithm evolutionary (this search is tpe)"),
    ("grid parameter for tpe", "sweep/space/model.d_model/type", "grid", "sweep.search", None,
     "algorithm grid for grid parameters (model.d_model)"),
    ("budget missing", "sweep/budget", DELETE, "sweep.budget", MISSING, "required: a mapping with fields max"),
    ("report past max", "sweep/budget/report_every", 100, "sweep.budget.report_every", 100,
     "an integer from 1 to budget.max (80)"),
    ("scheduler type", "sweep/scheduler/type", "hyperband", "sweep.scheduler.type", "hyperband",
     "one of fifo, median, asha, pbt"),
    ("eta 1", "sweep/scheduler/eta", 1, "sweep.scheduler.eta", 1, "an integer >= 2"),
    ("grace off the reports", "sweep/scheduler/grace_period", 15, "sweep.scheduler", None,
     "grace_period (15) must be a multiple of budget.report_every (10) below budget.max (80)"),
    ("grace at max", "sweep/scheduler/grace_period", 80, "sweep.scheduler", None, "below budget.max (80)"),
    ("pbt field on asha", "sweep/scheduler/quantile_fraction", 0.25, "sweep.scheduler.quantile_fraction", 0.25,
     "only for scheduler pbt (this one is asha)"),
    ("synch on asha", "sweep/scheduler/synch", True, "sweep.scheduler.synch", True,
     "only for scheduler pbt (this one is asha)"),
    ("synchronous not a bool", "sweep/scheduler/synchronous", "often", "sweep.scheduler.synchronous", "often",
     "true or false"),
    ("metric empty", "sweep/metric", "", "sweep.metric", "", "at least 1 character"),
    ("mode", "sweep/mode", "minimize", "sweep.mode", "minimize", "one of min, max"),
    ("trials missing", "sweep/trials", DELETE, "sweep.trials", None, "required for algorithm tpe"),
    ("max_concurrent 0", "sweep/max_concurrent", 0, "sweep.max_concurrent", 0, "an integer >= 1"),
    ("resources", "sweep/resources/gpu", -1, "sweep.resources.gpu", -1, "a number >= 0"),
    ("typo", "sweep/trails", 8, "sweep.trails", 8, "did you mean trials?"),
]


@pytest.mark.parametrize("field, value, path, bad, allowed", [c[1:] for c in SWEEP_CASES],
                         ids=[c[0] for c in SWEEP_CASES])
def test_sweep_field_errors_name_path_value_and_allowed(field, value, path, bad, allowed):
    assert_has_error(errors_of(with_field(raw(), field, value)), path, bad, allowed)


def test_sweep_on_another_kind_is_refused():
    doc = with_field(raw(), "kind", "train")
    assert_has_error(errors_of(doc), "sweep", None, "only for kind: tune (this spec's kind is train)")


def test_all_errors_of_a_sweep_at_once():
    doc = with_field(raw(), "sweep/mode", "up")
    doc = with_field(doc, "sweep/space/lr/low", -1)
    doc = with_field(doc, "sweep/search/algorithm", "annealing")
    doc = with_field(doc, "team", "Team A")
    paths = {e[0] for e in errors_of(doc)}
    assert {"sweep.mode", "sweep.space.lr.low", "sweep.search.algorithm", "team"} <= paths


PBT = {"trainable": "workloads.ray_tune:lm_trainable", "space": {"lr": {"type": "loguniform", "low": 1e-4, "high": 1e-2}},
       "budget": {"max": 40, "report_every": 5},
       "scheduler": {"type": "pbt", "perturbation_interval": 10,
                     "mutations": {"lr": {"type": "loguniform", "low": 1e-4, "high": 1e-2}}},
       "metric": "val_loss", "mode": "min", "trials": 4}

PBT_CASES = [
    ("interval missing", "scheduler/perturbation_interval", DELETE, "sweep.scheduler.perturbation_interval",
     "required for scheduler pbt: an integer >= 1"),
    ("mutations missing", "scheduler/mutations", DELETE, "sweep.scheduler.mutations", "required for scheduler pbt"),
    ("mutation outside the space", "scheduler/mutations/batch_size", {"type": "choice", "values": [8, 16]},
     "sweep.scheduler", "mutations must be parameters of the space (batch_size are not)"),
    ("grid mutation", "scheduler/mutations/lr", {"type": "grid", "values": [0.001]}, "sweep.scheduler.mutations",
     "(lr is grid)"),
    ("interval off the reports", "scheduler/perturbation_interval", 12, "sweep.scheduler",
     "perturbation_interval (12) must be a multiple of budget.report_every (5)"),
    ("eta on pbt", "scheduler/eta", 2, "sweep.scheduler.eta", "only for scheduler asha (this one is pbt)"),
    ("pbt with tpe", "search", {"algorithm": "tpe"}, "sweep.scheduler",
     "scheduler pbt draws its population with search algorithm random or grid (not tpe)"),
]


@pytest.mark.parametrize("field, value, path, allowed", [c[1:] for c in PBT_CASES], ids=[c[0] for c in PBT_CASES])
def test_pbt_section(field, value, path, allowed):
    doc = with_field(raw(), "sweep", copy.deepcopy(PBT))
    load_spec_from_dict(doc)  # the base case is valid
    assert_has_error(errors_of(with_field(doc, "sweep/" + field, value)), path, None, allowed)


def test_grid_trials_default_to_the_grid_and_may_not_exceed_it():
    grid = {"trainable": "tests.sweep_fns:quadratic", "space": {"lr": {"type": "grid", "values": [0.001, 0.01]},
                      "model.d_model": {"type": "grid", "values": [16, 32, 64]}},
            "search": {"algorithm": "grid"}, "budget": {"max": 10}, "metric": "loss", "mode": "min"}
    doc = with_field(raw(), "sweep", grid)
    assert load_spec_from_dict(doc).sweep.trials == 6
    assert_has_error(errors_of(with_field(doc, "sweep/trials", 7)), "sweep.trials", 7, "or the grid's size (6)")
    assert load_spec_from_dict(with_field(doc, "sweep/trials", 6)).sweep.trials == 6
    mixed = with_field(doc, "sweep/space/wd", {"type": "uniform", "low": 0, "high": 0.1})
    assert_has_error(errors_of(mixed), "sweep.search", None, "every space parameter of type grid (wd are not)")


def test_every_name_the_config_accepts_has_a_builder():
    assert build.SEARCHERS.names() == sorted(sweep_cfg.SEARCH_ALGORITHMS)
    assert build.SCHEDULERS.names() == sorted(sweep_cfg.TRIAL_SCHEDULERS)


def _quadratic(config):  # a trainable for Tune's variant generator to name; never run
    pass


def draw(s, n=4):
    """The first ``n`` configs the spec's search algorithm draws (under a grant with room for all)."""
    from raylane.sweeps import quota

    key = f"spec-test-{s.search.algorithm}-{id(s)}"
    quota.register(key, quota.Grant(n)).set_slots(n, n)
    alg = build.search_algorithm(s, key)
    space = build.param_space(s)
    if isinstance(alg, quota.GrantedVariantGenerator):
        alg.add_configurations({"exp": {"run": _quadratic, "config": space, "num_samples": build.num_samples(s)}})
        return [alg.next_trial().config for _ in range(n)]
    alg.set_search_properties(s.metric, s.mode, space)
    return [alg.suggest(f"t{i}") for i in range(n)]


@pytest.mark.parametrize("algorithm", sweep_cfg.SEARCH_ALGORITHMS)
def test_each_search_algorithm_draws_seeded_configs_from_the_space(algorithm):
    doc = raw()
    if algorithm == "grid":
        doc["sweep"]["space"] = {"lr": {"type": "grid", "values": [0.001, 0.01]},
                                 "model.d_model": {"type": "grid", "values": [16, 32]}}
        doc["sweep"].pop("trials")
    doc["sweep"]["search"] = {"algorithm": algorithm, "seed": 3}
    doc["sweep"]["max_concurrent"] = 4
    s = load_spec_from_dict(doc).sweep
    first = draw(s)
    assert first == draw(s)  # seeded
    for cfg in first:
        assert set(cfg) >= {"lr", "model"} and cfg["model"]["d_model"] in (16, 32)
    if algorithm == "grid":
        assert sorted((c["lr"], c["model"]["d_model"]) for c in first) == [(0.001, 16), (0.001, 32), (0.01, 16),
                                                                             (0.01, 32)]
    else:
        assert all(1e-4 <= c["lr"] <= 3e-2 for c in first) and len({c["lr"] for c in first}) == 4


@pytest.mark.parametrize("kind", sweep_cfg.TRIAL_SCHEDULERS)
def test_each_scheduler_measures_the_progress_the_quota_wrapper_adds(kind):
    """Every scheduler reads one field, which ``QuotaScheduler`` fills from the sweep's time attribute
    (``tests/sweeps/test_sweep_conventions.py`` drives each with Tune-shaped results)."""
    doc = raw()
    doc["sweep"]["search"] = {"algorithm": "random"}
    doc["sweep"]["scheduler"] = {"type": kind, **({"perturbation_interval": 20, "mutations": {
        "lr": {"type": "loguniform", "low": 1e-4, "high": 1e-2}}} if kind == "pbt" else {})}
    sched = build.scheduler(load_spec_from_dict(doc).sweep)
    assert getattr(sched, "_time_attr", build.PROGRESS) == build.PROGRESS


@pytest.mark.parametrize("synch", [None, True, False])
def test_pbt_is_asynchronous_unless_synch(synch):
    doc = raw()
    doc["sweep"]["search"] = {"algorithm": "random"}
    doc["sweep"]["scheduler"] = {"type": "pbt", "perturbation_interval": 20,
                                 "mutations": {"lr": {"type": "loguniform", "low": 1e-4, "high": 1e-2}},
                                 **({} if synch is None else {"synch": synch})}
    assert build.scheduler(load_spec_from_dict(doc).sweep)._synch is bool(synch)


@pytest.mark.parametrize("kind", ["fifo", "median", "pbt"])
def test_synchronous_is_an_asha_field(kind):
    doc = raw()
    doc["sweep"]["search"] = {"algorithm": "random"}
    doc["sweep"]["scheduler"] = {"type": kind, "synchronous": True, **({"perturbation_interval": 20, "mutations": {
        "lr": {"type": "loguniform", "low": 1e-4, "high": 1e-2}}} if kind == "pbt" else {})}
    assert_has_error(errors_of(doc), "sweep.scheduler.synchronous", True,
                     f"only for scheduler asha (this one is {kind})")


@pytest.mark.parametrize("synchronous", [None, False, True])
def test_asha_is_tunes_asynchronous_one_unless_synchronous(synchronous):
    from ray.tune.schedulers import AsyncHyperBandScheduler

    from raylane.sweeps.rungs import SynchronousHalvingScheduler

    doc = with_field(raw(), "sweep/scheduler", {"type": "asha", "eta": 2, "grace_period": 10,
                                                **({} if synchronous is None else {"synchronous": synchronous})})
    sweep = load_spec_from_dict(doc).sweep
    sched = build.scheduler(sweep)
    if synchronous:
        assert isinstance(sched, SynchronousHalvingScheduler)
        h = sched.halving
        assert (list(h.rungs), h.eta, h.expected, h.max_t) == ([10, 20, 40], 2, sweep.trials, 80)
        # Trials waiting at a rung hold no slot: the search may keep every trial of the sweep unfinished.
        assert build.live_trial_cap(sweep) == sweep.trials
    else:
        assert isinstance(sched, AsyncHyperBandScheduler)
        assert build.live_trial_cap(sweep) == sweep.concurrency


def test_asha_rungs():
    doc = with_field(raw(), "sweep/scheduler", {"type": "asha", "eta": 3, "grace_period": 10})
    doc = with_field(doc, "sweep/budget", {"max": 270, "report_every": 10})
    assert build.asha_rungs(load_spec_from_dict(doc).sweep) == [10, 30, 90]


# ------------------------------------------------------------------------------------------ pre-flight


def test_the_lm_trainable_takes_the_budget_and_refuses_conflicts():
    from workloads.ray_tune import lm_trainable

    s = load_spec_from_dict(raw()).sweep
    base, errors = base_config(lm_trainable, {"lr": 0.01}, s)
    assert (base["max_steps"], base["checkpoint_every"], base["eval_every"], errors) == (80, 10, 10, [])
    _, errors = base_config(lm_trainable, {"max_steps": 50, "eval_every": 3}, s)
    assert [e[0] for e in errors] == ["config.max_steps", "config.eval_every"]


def test_a_trainable_without_declarations_takes_the_config_as_is_and_a_trainable_is_required():
    from tests.sweep_fns import quadratic

    s = load_spec_from_dict(raw()).sweep
    assert base_config(quadratic, {"x": 1}, s) == ({"x": 1}, [])
    doc = raw()
    del doc["sweep"]["trainable"]
    assert_has_error(errors_of(doc), "sweep.trainable", None, "required")


def test_trainable_preflight_reports_every_problem():
    doc = raw()
    doc["config"]["max_steps"] = 10
    doc["config"]["batch_size"] = 0
    doc["sweep"]["metric"] = "accuracy"
    doc["sweep"]["space"]["model.d_model"] = {"type": "choice", "values": [4, 32]}
    spec = load_spec_from_dict(doc)
    with pytest.raises(ValidationError) as exc:
        check_trainable(spec.config, spec.sweep)
    errors = exc.value.errors
    assert_has_error(errors, "config.max_steps", 10, "equal to sweep.budget.max (80)")
    assert_has_error(errors, "config.batch_size", 0, ">= 1")
    assert_has_error(errors, "sweep.metric", "accuracy", "one of step, loss, train_loss")
    assert_has_error(errors, "sweep.space.model.d_model", 4, ">= 8")


def test_user_trainable_must_import():
    doc = with_field(raw(), "sweep/trainable", "tests.sweep_fns:no_such_function")
    spec = load_spec_from_dict(doc)
    with pytest.raises(ValidationError) as exc:
        check_trainable(spec.config, spec.sweep)
    assert_has_error(exc.value.errors, "sweep.trainable", "tests.sweep_fns:no_such_function", "importable")
    check_trainable({}, load_spec_from_dict(with_field(doc, "sweep/trainable", "tests.sweep_fns:quadratic")).sweep)


def test_slots_are_one_worker_of_the_trial_resources_with_the_run_metadata():
    parsed = _parse(raw())
    slots = slot_specs(parsed)
    assert [s["name"] for s in slots] == ["lm-lr-sweep-slot-0", "lm-lr-sweep-slot-1"]
    for s in slots:
        assert s["gang"]["workers"] == 1 and s["gang"]["resources"] == {"gpu": 1.0, "cpu": 0.5, "memory": 1.0}
        assert s["run"]["intent"].startswith("Find the learning rate") and s["class"] == "sweep"
        load_spec_from_dict(s, policy=load_policy(LOCAL))  # what the control actor will check


def test_sweep_names_leave_room_for_slot_names_and_gang_resources_must_agree():
    with pytest.raises(ValidationError) as exc:
        _parse(with_field(with_field(raw(), "name", "s" * 60), "gang", {"resources": {"gpu": 2}}))
    assert_has_error(exc.value.errors, "name", "s" * 60, "at most 56 characters for a sweep")
    assert_has_error(exc.value.errors, "gang.resources", {"gpu": 2}, "equal to sweep.resources")
    _parse(with_field(raw(), "gang", {"resources": {"gpu": 1, "cpu": 0.5, "memory": "1Gi"}, "features": ["gpu-sim"]}))


def test_merge_config_is_deep():
    assert merge_config({"lr": 1, "model": {"d_model": 8, "n_layers": 1}}, {"model": {"d_model": 16}}) == \
        {"lr": 1, "model": {"d_model": 16, "n_layers": 1}}
