"""Tune's conventions in a sweep, with Ray's own example trainables (``ray.tune.examples``, from the installed wheel):
their results carry ``training_iteration`` (Tune adds it) and no ``step``, so the sweep's time attribute is
``training_iteration``; every scheduler Raylane offers, the budget stop, the grant and the MLflow record count in it;
what cannot work (PBT over a trainable that never checkpoints) is refused before anything queues; a sweep's failure
is a ``RaylaneError`` with the reason, and the trials' runs it leaves open end with the sweep's status.

Pure: no Ray session (Tune's schedulers are driven with a fake controller; MLflow is a sqlite store).
"""
from __future__ import annotations

import pickle
from pathlib import Path
from types import SimpleNamespace

import pytest
from ray.tune.experiment import Trial
from ray.tune.schedulers import TrialScheduler

from tests.specdoc import raw as _raw

from raylane.config.loader import load_spec_from_dict
from raylane.errors import FatalError, RaylaneError, ValidationError
from raylane.sweeps import build, quota
from raylane.sweeps.conventions import (PROGRESS, STEP, TRAINING_ITERATION, TimeAttr, TrialResultError,
                                        checkpointing)
from raylane.sweeps.trainables import check_trainable, with_base

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "specs" / "sweep-asha-team-a.yaml"
PBT_FUNCTION = "ray.tune.examples.pbt_function:pbt_function"  # checkpoints; reports mean_accuracy
# Reports iterations (from 0) and mean_loss; never checkpoints.
EASY_OBJECTIVE = "ray.tune.examples.async_hyperband_example:easy_objective"
PBT_CLASS = "ray.tune.examples.pbt_example:PBTBenchmarkExample"  # a tune.Trainable with save/load_checkpoint
CONTINUE, STOP, PAUSE = TrialScheduler.CONTINUE, TrialScheduler.STOP, TrialScheduler.PAUSE

_keys = iter(range(10**6))


def sweep_doc(trainable: str, scheduler: dict, *, metric: str, mode: str, trials: int = 4, budget: int = 8,
              **extra) -> dict:
    doc = _raw(EXAMPLE)
    doc["config"] = {}
    doc["sweep"] = {"trainable": trainable, "space": {"lr": {"type": "uniform", "low": 0.001, "high": 0.02}},
                    "search": {"algorithm": "random", "seed": 0}, "budget": {"max": budget, "report_every": 1},
                    "scheduler": scheduler, "metric": metric, "mode": mode, "trials": trials, "max_concurrent": 4,
                    "resources": {"gpu": 0, "cpu": 0.5}, **extra}
    return doc


def sweep_of(*args, **kwargs):
    return load_spec_from_dict(sweep_doc(*args, **kwargs)).sweep


PBT = {"type": "pbt", "perturbation_interval": 2, "mutations": {"lr": {"type": "uniform", "low": 0.001,
                                                                       "high": 0.02}}}


def tune_result(iteration: int, **metrics) -> dict:
    """A result as Tune hands it to schedulers: what the trainable reported plus Tune's own fields."""
    return {**metrics, "training_iteration": iteration, "iterations_since_restore": iteration, "done": False,
            "time_this_iter_s": 0.1, "time_total_s": 0.1 * iteration, "timestamp": 1_700_000_000 + iteration,
            "trial_id": "?", "config/lr": 0.01}


def make_trial(trial_id: str) -> Trial:
    """A Tune trial as the controller holds it (a stub: no trainable registered, no Ray session), running."""
    t = Trial("easy_objective", config={"lr": 0.01}, stub=True, trial_id=trial_id)
    t.set_status(Trial.RUNNING)
    return t


class FakeController:
    search_alg = None

    def __init__(self, trials):
        self.trials = list(trials)
        self.stopped = []

    def get_trials(self):
        return list(self.trials)

    def get_live_trials(self):
        return [t for t in self.trials if t.status not in (Trial.TERMINATED, Trial.ERROR)]

    def stop_trial(self, trial):
        self.stopped.append(trial.trial_id)
        trial.set_status(Trial.TERMINATED)


def quota_scheduler(sweep, n: int):
    """The sweep's scheduler as the driver wraps it, within a grant of ``n`` slots, with ``n`` trials added."""
    key = f"conventions-{next(_keys)}"
    quota.register(key, quota.Grant(n)).set_slots(n, n)
    inner = build.scheduler(sweep)
    inner.set_search_properties(sweep.metric, sweep.mode)
    sched = quota.QuotaScheduler(inner, key, time_attr=build.time_attr(sweep))
    trials = [make_trial(f"t{i}") for i in range(n)]
    tc = FakeController(trials)
    for t in trials:
        sched.on_trial_add(tc, t)
    return sched, tc, trials, quota.grant_for(key)


# ---------------------------------------------------------------------------------------- the time attribute


def test_tune_names_the_iteration_as_this_module_does():
    from ray.tune.result import TRAINING_ITERATION as tunes

    assert TRAINING_ITERATION == tunes


TIME_ATTR = [
    ("Ray's examples report no step: Tune's iteration", None, tune_result(3, mean_accuracy=1.0),
     TRAINING_ITERATION, 3),
    ("the reference LM reports its step", None, tune_result(3, step=30, val_loss=2.0), STEP, 30),
    ("the field the spec names", "iterations", tune_result(3, iterations=2, mean_loss=1.0), "iterations", 2),
    ("a counter Tune adds", "time_total_s", tune_result(3, mean_loss=1.0), "time_total_s", 0.1 * 3),
]


@pytest.mark.parametrize("declared, result, name, value", [c[1:] for c in TIME_ATTR], ids=[c[0] for c in TIME_ATTR])
def test_the_time_attribute_is_the_specs_else_step_else_training_iteration(declared, result, name, value):
    t = TimeAttr(declared)
    assert t.name(result) == name and t.value(result) == pytest.approx(value)
    stamped = t.stamped(result, "t0")
    assert stamped[PROGRESS] == pytest.approx(value) and PROGRESS not in result  # the schedulers' copy only


def test_a_result_without_the_named_time_attribute_is_a_typed_error_naming_it():
    with pytest.raises(TrialResultError) as exc:
        TimeAttr("iterations").stamped(tune_result(1, mean_loss=1.0), "t7")
    assert isinstance(exc.value, FatalError)
    text = str(exc.value)
    assert "trial t7" in text and "'iterations'" in text and "sweep.time_attr" in text and "mean_loss" in text


def test_time_attr_is_an_optional_spec_field_checked_by_name():
    assert sweep_of(EASY_OBJECTIVE, {"type": "asha"}, metric="mean_loss", mode="min").time_attr is None
    assert sweep_of(EASY_OBJECTIVE, {"type": "asha"}, metric="mean_loss", mode="min",
                    time_attr="iterations").time_attr == "iterations"
    for bad in ("1st", "a b", "config/lr", ""):
        with pytest.raises(ValidationError) as exc:
            sweep_of(EASY_OBJECTIVE, {"type": "asha"}, metric="mean_loss", mode="min", time_attr=bad)
        (path, value, allowed), = [e for e in exc.value.errors if e[0] == "sweep.time_attr"]
        assert value == bad and "result field" in allowed
    with pytest.raises(ValidationError) as exc:  # unknown keys are refused, not dropped
        sweep_of(EASY_OBJECTIVE, {"type": "asha"}, metric="mean_loss", mode="min", time_attribute="iterations")
    assert [e[0] for e in exc.value.errors] == ["sweep.time_attribute"]


# ------------------------------------------------------------------------- every scheduler, Tune-shaped results


def test_asha_stops_weak_trials_of_a_trainable_that_reports_no_step():
    """Ray's easy_objective under ASHA (eta 2, first rung at iteration 1): the first trial sets the rung's cutoff,
    the weaker ones stop there (they all ran the full budget when the sweep measured ``step``)."""
    sweep = sweep_of(EASY_OBJECTIVE, {"type": "asha", "eta": 2, "grace_period": 1}, metric="mean_loss", mode="min")
    sched, tc, trials, g = quota_scheduler(sweep, 4)
    decisions = [sched.on_trial_result(tc, t, tune_result(1, iterations=0, mean_loss=1.0 + i))
                 for i, t in enumerate(trials)]
    assert decisions == [CONTINUE, STOP, STOP, STOP]
    assert g.trials()["t0"].step == 1  # the grant's view counts iterations too


def test_median_rule_stops_a_trial_worse_than_the_median_at_the_same_iteration():
    sweep = sweep_of(EASY_OBJECTIVE, {"type": "median", "grace_period": 1, "min_samples": 1}, metric="mean_loss",
                     mode="min", trials=2)
    sched, tc, (good, bad), _ = quota_scheduler(sweep, 2)
    assert sched.on_trial_result(tc, good, tune_result(1, iterations=0, mean_loss=1.0)) == CONTINUE
    assert sched.on_trial_result(tc, bad, tune_result(1, iterations=0, mean_loss=5.0)) == STOP


def test_pbt_runs_on_a_trainable_that_reports_no_step():
    """Ray's pbt_function under PBT: Tune's PBT raised 'Cannot find time_attr step' at the first result."""
    sweep = sweep_of(PBT_FUNCTION, PBT, metric="mean_accuracy", mode="max", trials=2)
    sched, tc, trials, g = quota_scheduler(sweep, 2)
    for t in trials:
        assert sched.on_trial_result(tc, t, tune_result(1, mean_accuracy=1.0, cur_lr=0.01)) == CONTINUE
    assert {v.step for v in g.trials().values()} == {1}


def test_synchronous_rungs_count_iterations():
    sweep = sweep_of(EASY_OBJECTIVE, {"type": "asha", "eta": 2, "grace_period": 2, "synchronous": True},
                     metric="mean_loss", mode="min", trials=2)
    sched, tc, (a, b), g = quota_scheduler(sweep, 2)
    assert sched.on_trial_result(tc, a, tune_result(1, iterations=0, mean_loss=3.0)) == CONTINUE
    assert sched.on_trial_result(tc, a, tune_result(2, iterations=1, mean_loss=2.0)) == PAUSE  # waits at rung 2
    assert g.trials()["t0"].paused_by == "rung"
    a.set_status(Trial.PAUSED)
    assert sched.on_trial_result(tc, b, tune_result(2, iterations=1, mean_loss=1.0)) == CONTINUE  # promoted
    assert tc.stopped == ["t0"]


def test_a_named_time_attribute_drives_the_schedulers_and_its_absence_fails_the_sweep_with_the_reason():
    sweep = sweep_of(EASY_OBJECTIVE, {"type": "asha", "eta": 2, "grace_period": 2}, metric="mean_loss", mode="min",
                     time_attr="iterations")
    sched, tc, (a, b, *_), _ = quota_scheduler(sweep, 4)
    # easy_objective's ``iterations`` starts at 0: rung 2 is its third result, not its second.
    assert sched.on_trial_result(tc, a, tune_result(2, iterations=1, mean_loss=1.0)) == CONTINUE
    assert sched.on_trial_result(tc, b, tune_result(2, iterations=1, mean_loss=9.0)) == CONTINUE
    assert sched.on_trial_result(tc, a, tune_result(3, iterations=2, mean_loss=1.0)) == CONTINUE
    assert sched.on_trial_result(tc, b, tune_result(3, iterations=2, mean_loss=9.0)) == STOP
    with pytest.raises(TrialResultError, match="'iterations'"):
        sched.on_trial_result(tc, a, tune_result(4, mean_loss=1.0))


@pytest.mark.parametrize("declared, result, stops", [
    (None, tune_result(8, mean_accuracy=1.0), True),  # the budget: 8 iterations
    (None, tune_result(7, mean_accuracy=1.0), False),
    (None, tune_result(2, step=8, val_loss=1.0), True),  # step first, when reported
    ("iterations", tune_result(9, iterations=7, mean_loss=1.0), False),
    ("iterations", tune_result(9, iterations=8, mean_loss=1.0), True),
    ("iterations", tune_result(9, mean_loss=1.0), False),  # left to the scheduler's typed error
])
def test_the_budget_stop_counts_in_the_time_attribute(declared, result, stops):
    key = f"conventions-{next(_keys)}"
    quota.register(key, quota.Grant(1))
    assert quota.GrantStopper(key, budget_max=8, time_attr=TimeAttr(declared))("t0", result) is stops


def test_the_wrappers_keep_their_time_attribute_across_tunes_experiment_state():
    sweep = sweep_of(EASY_OBJECTIVE, {"type": "asha"}, metric="mean_loss", mode="min", time_attr="iterations")
    sched = quota.QuotaScheduler(build.scheduler(sweep), "k", time_attr=build.time_attr(sweep))
    stopper = quota.GrantStopper("k", 8, time_attr=build.time_attr(sweep))
    assert pickle.loads(pickle.dumps(sched)).time_attr == TimeAttr("iterations")
    assert pickle.loads(pickle.dumps(stopper)).time_attr == TimeAttr("iterations")


# ------------------------------------------------------------------------------------- refused before it queues


def test_pbt_over_a_function_that_never_checkpoints_is_refused_with_the_reason():
    sweep = sweep_of(EASY_OBJECTIVE, PBT, metric="mean_loss", mode="min")
    with pytest.raises(ValidationError) as exc:
        check_trainable({}, sweep)
    (path, value, allowed), = exc.value.errors
    assert (path, value) == ("sweep.scheduler.type", "pbt")
    assert "never saves nor restores one" in allowed and "async_hyperband_example" in allowed
    assert "ray.tune.report(metrics, checkpoint=" in allowed and "asha" in allowed


@pytest.mark.parametrize("trainable, scheduler, metric, mode", [
    (PBT_FUNCTION, PBT, "mean_accuracy", "max"),
    (PBT_CLASS, PBT, "mean_accuracy", "max"),
    (EASY_OBJECTIVE, {"type": "asha"}, "mean_loss", "min"),  # no checkpoint: a paused trial restarts, allowed
])
def test_what_can_work_passes(trainable, scheduler, metric, mode):
    check_trainable({}, sweep_of(trainable, scheduler, metric=metric, mode=mode))


def test_pbt_over_a_class_without_checkpoint_methods_is_refused():
    from ray import tune

    class NoCheckpoints(tune.Trainable):
        def step(self):
            return {"score": 1.0}

    class Plain:
        pass

    saves, restores, where = checkpointing(NoCheckpoints)
    assert (saves, restores) == (False, False) and "NoCheckpoints" in where
    import sys
    import types

    module = types.ModuleType("_conventions_fake_module")
    module.NoCheckpoints, module.Plain = NoCheckpoints, Plain
    sys.modules["_conventions_fake_module"] = module
    try:
        sweep = sweep_of("_conventions_fake_module:NoCheckpoints", PBT, metric="score", mode="max")
        with pytest.raises(ValidationError) as exc:
            check_trainable({}, sweep)
        assert "override save_checkpoint and load_checkpoint" in exc.value.errors[0][2]
        sweep = sweep_of("_conventions_fake_module:Plain", {"type": "asha"}, metric="score", mode="max")
        with pytest.raises(ValidationError) as exc:
            check_trainable({}, sweep)
        assert exc.value.errors[0][0] == "sweep.trainable" and "Trainable subclass" in exc.value.errors[0][2]
    finally:
        del sys.modules["_conventions_fake_module"]


def test_a_declared_checkpoints_attribute_is_trusted_and_a_named_time_attr_must_be_reported():
    from tests import sweep_fns

    def elsewhere(config):  # its checkpointing lives in another module, which the source check cannot see
        pass

    assert checkpointing(sweep_fns.quadratic)[:2] == (True, True)
    elsewhere.checkpoints = True
    assert checkpointing(elsewhere)[:2] == (True, True)
    elsewhere.checkpoints = False
    assert checkpointing(elsewhere)[:2] == (False, False)

    def declared(config):
        pass

    declared.reports = ("loss", "epoch")
    sweep_fns._declared = declared
    try:
        for attr, ok in (("epoch", True), ("training_iteration", True), ("step", False)):
            sweep = sweep_of("tests.sweep_fns:_declared", {"type": "asha"}, metric="loss", mode="min",
                             time_attr=attr)
            if ok:
                check_trainable({}, sweep)
            else:
                with pytest.raises(ValidationError) as exc:
                    check_trainable({}, sweep)
                assert exc.value.errors == [("sweep.time_attr", "step", "a field every result of "
                                             "tests.sweep_fns:_declared carries: one of loss, epoch, "
                                             "training_iteration, time_total_s, timesteps_total, episodes_total")]
    finally:
        del sweep_fns._declared


def test_spec_check_refuses_pbt_over_a_trainable_that_never_checkpoints():
    """What ``raylane spec check`` and ``raylane submit`` run (``raylane.launchers.check``)."""
    from raylane.launchers.check import check_spec_dict

    with pytest.raises(ValidationError) as exc:
        check_spec_dict(sweep_doc(EASY_OBJECTIVE, PBT, metric="mean_loss", mode="min"), "pbt.yaml",
                        working_dir=str(ROOT))
    assert [(p, v) for p, v, _ in exc.value.errors] == [("sweep.scheduler.type", "pbt")]
    check_spec_dict(sweep_doc(PBT_FUNCTION, PBT, metric="mean_accuracy", mode="max"), "pbt.yaml",
                    working_dir=str(ROOT))


def test_a_class_trainable_sees_the_base_config_merged_with_the_trials():
    from ray.tune.examples.pbt_example import PBTBenchmarkExample

    cls = with_base(PBTBenchmarkExample, {"lr": 0.5, "extra": {"a": 1, "b": 2}})
    assert cls.__name__ == "PBTBenchmarkExample" and issubclass(cls, PBTBenchmarkExample)
    trainable = cls({"lr": 0.01, "extra": {"b": 3}})
    try:
        assert trainable.config == {"lr": 0.01, "extra": {"a": 1, "b": 3}}
        assert trainable.train()[TRAINING_ITERATION] == 1  # Tune counts its iterations; it reports no step
    finally:
        trainable.stop()


# -------------------------------------------------------------------------------- MLflow and the sweep's failure


@pytest.fixture
def store(uri):
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    experiment_id = client.create_experiment("raylane/team-a")
    parent = client.create_run(experiment_id, run_name="pbt-fn").info.run_id
    return SimpleNamespace(uri=uri, client=client, experiment_id=experiment_id, parent=parent)


def tracking(store, **kw):
    from raylane.sweeps.tracking import SweepTracking

    return SweepTracking(sweep_id="pbt-fn-abc", parent_run_id=store.parent, experiment_id=store.experiment_id,
                         uri=store.uri, name="pbt-fn", gpus_per_trial=1.0, budget_max=4, report_every=1, **kw)


def test_trial_curves_are_logged_against_the_iteration_and_a_resumed_driver_trains_no_step_twice(store):
    from raylane.sweeps.tracking import child_runs

    t = SimpleNamespace(trial_id="t_00000", status="RUNNING", config={"lr": 0.01})
    first = tracking(store)
    first.on_trial_start(0, [], t)
    for i in (1, 2):
        first.on_trial_result(0, [], t, tune_result(i, mean_accuracy=float(i)))
    second = pickle.loads(pickle.dumps(first))  # the driver died; the next one goes on from the checkpoint
    second.on_trial_start(0, [], t)
    for i in (3, 4):
        second.on_trial_result(0, [], t, {**tune_result(i, mean_accuracy=float(i)), "iterations_since_restore": 1})
    second.on_trial_complete(0, [], t)
    run, = child_runs(store.client, store.experiment_id, "pbt-fn-abc")
    history = store.client.get_metric_history(run.info.run_id, "mean_accuracy")
    assert [(p.step, p.value) for p in history] == [(1, 1.0), (2, 2.0), (3, 3.0), (4, 4.0)]
    assert run.data.metrics["trained_steps"] == 4
    assert run.data.tags["raylane.final_step"] == "4" and run.data.tags["raylane.stopped_early"] == "false"


@pytest.mark.parametrize("status", ["FAILED", "KILLED"])
def test_a_failed_or_cancelled_sweep_leaves_no_trial_run_running(store, status):
    from raylane.sweeps.tracking import child_runs, end_open_trials

    cb = tracking(store)
    trials = [SimpleNamespace(trial_id=f"t_{i:05d}", status="RUNNING", config={"lr": 0.01}) for i in range(3)]
    for t in trials:
        cb.on_trial_start(0, [], t)
        cb.on_trial_result(0, [], t, tune_result(1, mean_accuracy=1.0))
    cb.on_trial_complete(0, [], trials[0])
    assert end_open_trials(store.client, store.experiment_id, "pbt-fn-abc", status) == ["t_00001", "t_00002"]
    runs = {r.data.tags["raylane.trial_id"]: r for r in child_runs(store.client, store.experiment_id, "pbt-fn-abc")}
    assert {k: r.info.status for k, r in runs.items()} == {"t_00000": "FINISHED", "t_00001": status,
                                                            "t_00002": status}


def test_a_sweeps_failure_is_a_raylane_error_with_the_reason():
    from ray.tune.error import TuneError

    from raylane.launchers.tune import SweepFailed, sweep_failure

    try:
        try:
            raise RuntimeError("Cannot find time_attr step in trial result {...}")
        except RuntimeError as inner:
            raise TuneError("The Ray Tune run failed. Please inspect the previous error messages") from inner
    except TuneError as exc:
        failed = sweep_failure("pbt-fn-abc", exc)
    assert isinstance(failed, SweepFailed) and isinstance(failed, FatalError)
    assert str(failed) == "sweep pbt-fn-abc failed: RuntimeError: Cannot find time_attr step in trial result {...}"
    ours = TrialResultError("trial t0 reported a result without 'iterations'")
    try:
        raise TuneError("wrapped") from ours
    except TuneError as exc:
        assert sweep_failure("pbt-fn-abc", exc) is ours
    assert isinstance(sweep_failure("s", ValueError("x" * 5000)), RaylaneError)
    assert len(str(sweep_failure("s", ValueError("x" * 5000)))) < 2100
