"""Script mode's Tune hook (``raylane.script.tuner``): a user's unchanged ``Tuner.fit()`` becomes a sweep whose trials
run on slots the control actor admits under the team's quota, with the user's own search algorithm and scheduler.

Pure tests first (reading a ``Tuner``: trial resources, trial and slot counts, the budget, the recorded spec, the
gates; no Ray session), then a real local Ray cluster with the control actor, one for the module: a Tune script
written here, and Ray's own ``ray/tune/examples/async_hyperband_example.py``, both run as ``__main__`` in script mode
(``raylane.script.runner``), as ``python -m raylane.run --team T --class C SCRIPT`` runs them.
"""
import json
import textwrap
import time
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from ray import tune  # noqa: E402

from raylane.errors import RaylaneError, ValidationError  # noqa: E402
from raylane.script import tuner as hook  # noqa: E402

# ------------------------------------------------------------------------------------------ pure


def _fn(config):
    tune.report({"mean_loss": 1.0})


class _Gpu2(tune.Trainable):
    @classmethod
    def default_resource_request(cls, config):
        return {"CPU": 2, "GPU": 1}

    def step(self):
        return {"mean_loss": 1.0}


@pytest.mark.parametrize("trainable, expected", [
    pytest.param(_fn, {"cpu": 1.0, "gpu": 0.0}, id="function: 1 CPU"),
    pytest.param(tune.with_resources(lambda c: None, {"cpu": 0.5, "gpu": 1}), {"cpu": 0.5, "gpu": 1.0},
                 id="with_resources dict"),
    pytest.param(tune.with_resources(lambda c: None, tune.PlacementGroupFactory([{"CPU": 1}, {"CPU": 2, "GPU": 1}])),
                 {"cpu": 3.0, "gpu": 1.0}, id="placement group: the sum of its bundles"),
    pytest.param(_Gpu2, {"cpu": 2.0, "gpu": 1.0}, id="class: default_resource_request"),
    pytest.param(tune.with_resources(lambda c: None, {"cpu": 1, "memory": 2 * 2 ** 30}),
                 {"cpu": 1.0, "gpu": 0.0, "memory": 2.0}, id="memory in GiB"),
])
def test_trial_resources_come_from_the_trainable(trainable, expected):
    assert hook.trial_resources(trainable, {}) == expected


def test_resources_per_config_are_refused_by_name():
    fn = tune.with_resources(lambda c: None, lambda config: tune.PlacementGroupFactory([{"CPU": 1}]))
    with pytest.raises(ValidationError, match="resources per config"):
        hook.trial_resources(fn, {})


@pytest.mark.parametrize("num_samples, space, search, max_concurrent, trials, slots", [
    (4, {"x": tune.uniform(0, 1)}, None, 2, 4, 2),
    (1, {"x": tune.grid_search([1, 2, 3])}, None, None, 3, 3),
    (2, {"a": tune.grid_search([1, 2]), "b": {"c": tune.grid_search([1, 2, 3])}}, None, None, 12, hook.DEFAULT_SLOTS),
    (20, {"x": tune.uniform(0, 1)}, None, None, 20, hook.DEFAULT_SLOTS),
    (3, {"x": tune.uniform(0, 1)}, None, 8, 3, 3),  # never more slots than trials
])
def test_trials_and_slots(num_samples, space, search, max_concurrent, trials, slots):
    assert hook.trial_count(num_samples, space, search) == trials
    assert hook.slot_count(max_concurrent, search, trials) == slots


def test_a_user_concurrency_limiter_sets_the_slots():
    from ray.tune.search import ConcurrencyLimiter
    from ray.tune.search.optuna import OptunaSearch

    limited = ConcurrencyLimiter(OptunaSearch(), max_concurrent=3)
    assert hook.trial_count(10, {"x": tune.grid_search([1, 2])}, limited) == 10  # a searcher draws num_samples
    assert hook.slot_count(None, limited, 10) == 3


@pytest.mark.parametrize("scheduler, stop, budget", [
    ("asha", None, 8),
    ("asha", {"training_iteration": 3}, 3),
    (None, {"training_iteration": 5}, 5),
    (None, None, None),
    ("asha", {"other": 2}, 8),
])
def test_the_budget_is_what_the_script_says(scheduler, stop, budget):
    from ray.tune.schedulers import ASHAScheduler

    s = ASHAScheduler(max_t=8, grace_period=1) if scheduler else None
    assert hook.budget_of(s, stop, getattr(s, "_time_attr", None)) == budget


def test_the_recorded_spec_describes_the_sweep_and_loads():
    from ray.tune.schedulers import ASHAScheduler

    from raylane.config.loader import load_spec_from_dict

    tc = tune.TuneConfig(metric="mean_loss", mode="min", num_samples=4, scheduler=ASHAScheduler(max_t=8))
    space = {"lr": tune.loguniform(1e-4, 1e-1), "width": tune.uniform(10, 100), "act": tune.choice(["relu", "tanh"]),
             "model": {"depth": tune.grid_search([1, 2])}, "steps": 100, "fn": tune.sample_from(lambda s: 1)}
    sweep = hook._describe(tc, space, {"cpu": 1.0, "gpu": 0.0}, 8, 2, 8, "training_iteration")
    assert sweep["space"] == {"lr": {"type": "loguniform", "low": 1e-4, "high": 1e-1},
                              "width": {"type": "uniform", "low": 10, "high": 100},
                              "act": {"type": "choice", "values": ["relu", "tanh"]},
                              "model.depth": {"type": "choice", "values": [1, 2]}}
    assert sweep["scheduler"] == {"type": "asha"} and sweep["budget"] == {"max": 8, "report_every": 1}
    spec = {"name": "s", "team": "team-a", "class": "sweep", "kind": "tune", "run": {"intent": "x"}, "sweep": sweep}
    load_spec_from_dict(spec, "test")


def test_a_description_the_spec_refuses_falls_back_to_the_plainest():
    from raylane.config.loader import load_spec_from_dict

    tc = tune.TuneConfig(metric="m", mode="max", num_samples=2)
    sweep = hook._describe(tc, {"x": tune.uniform(0, 1)}, {"cpu": 1.0, "gpu": 0.0}, 2, 2, None, None)
    sweep["scheduler"] = {"type": "asha", "grace_period": 5}  # past budget.max (1): the spec's rules refuse it
    spec = {"name": "s", "team": "team-a", "class": "sweep", "kind": "tune", "run": {"intent": "x"}, "sweep": sweep}
    hook._check_spec(spec)
    assert spec["sweep"]["scheduler"] == {"type": "fifo"}
    load_spec_from_dict(spec, "test")


def test_a_trainer_in_a_tuner_is_refused_by_name():
    class TorchTrainer:  # what the check reads: the class's names (a V1 BaseTrainer is caught by isinstance too)
        pass

    with pytest.raises(hook.UnsupportedTunerError, match=r"TorchTrainer.*trainer\.fit\(\)"):
        hook._refuse_trainer(TorchTrainer())
    hook._refuse_trainer(_fn)
    hook._refuse_trainer(_Gpu2)


def test_stop_mappings_functions_and_stoppers_stand_beside_the_grant_stopper():
    from raylane.sweeps.quota import GrantStopper

    crit = hook._stoppers({"training_iteration": 3}, "k")
    assert isinstance(crit[0], GrantStopper) and len(crit) == 2
    assert not crit[1]("t", {"training_iteration": 2}) and crit[1]("t", {"training_iteration": 3})
    fn = hook._stoppers(lambda trial_id, result: result["x"] > 1, "k")
    assert fn[1]("t", {"x": 2}) and not fn[1]("t", {"x": 0})
    assert len(hook._stoppers(None, "k")) == 1


def test_any_search_algorithm_draws_only_within_the_grant():
    from ray.tune.search import BasicVariantGenerator
    from ray.tune.search.optuna import OptunaSearch

    from raylane.sweeps import quota

    key = "pure-gate-sweep"
    grant = quota.register(key, quota.Grant(2))
    user = BasicVariantGenerator(points_to_evaluate=[{"x": 0.1}])
    gated = hook._gated_search(user, key, 2)
    assert isinstance(gated, quota.GrantedSearch) and gated.inner is user
    assert gated.next_trial() is None  # nothing granted yet: no trial is drawn (the user's generator is not asked)
    assert isinstance(hook._gated_search(OptunaSearch(), key, 2), quota.GrantLimiter)
    assert isinstance(hook._gated_search(None, key, 2), quota.GrantedVariantGenerator)
    with pytest.raises(ValidationError, match="search_alg"):
        hook._gated_search("optuna", key, 2)
    grant.set_slots(1, 1)


def test_install_patches_tuner_fit_once_and_uninstall_puts_rays_back():
    from ray.tune import Tuner

    original = Tuner.fit
    hook.install(object())
    try:
        assert Tuner.fit is not original and hook.installed()
        hook.install(object())  # installing again only replaces the context
        assert Tuner.fit.__wrapped__ is original
    finally:
        hook.uninstall()
    assert Tuner.fit is original and not hook.installed()


# ------------------------------------------------------------------------------------------ Ray

SCRIPT = '''
import json
import sys

from ray import tune
from ray.tune.schedulers import ASHAScheduler
from ray.tune.search import BasicVariantGenerator


def trainable(config):
    for i in range(1, 9):
        tune.report({"mean_loss": config["x"] + 1.0 / i})


# Two good points first, then two worse ones: ASHA must stop the later, worse trials at its first rung.
points = [{"x": 0.1}, {"x": 0.2}, {"x": 0.8}, {"x": 0.9}]
tuner = tune.Tuner(
    trainable,
    param_space={"x": tune.uniform(0, 1)},
    tune_config=tune.TuneConfig(metric="mean_loss", mode="min", num_samples=4,
                                search_alg=BasicVariantGenerator(points_to_evaluate=points),
                                scheduler=ASHAScheduler(max_t=8, grace_period=1), max_concurrent_trials=2),
)
results = tuner.fit()
best = results.get_best_result()
with open(sys.argv[1], "w") as f:
    json.dump({"type": type(results).__name__, "best_x": best.config["x"], "best_loss": best.metrics["mean_loss"],
               "iterations": {str(r.config["x"]): r.metrics["training_iteration"] for r in results},
               "errors": sum(r.error is not None for r in results)}, f)
'''


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    from raylane.control.client import start_control, stop_control
    from tests.raytest import empty_store, local_policy, start_cluster, stop_cluster

    tmp = tmp_path_factory.mktemp("script-tuner")
    cluster = start_cluster(gpu_nodes=(("gpu-a", ["gpu-sim"]),), gpus=2, cpus=4, head_cpus=1)
    ray.init(address=cluster.address, namespace="raylane", log_to_driver=False)
    ctl = start_control(local_policy(sweep={"min_runtime": 0}), str(tmp / "journal.db"), tick_s=0.2)
    yield {"ctl": ctl, "tmp": tmp, "uri": empty_store(tmp / "mlflow.db"), "storage": str(tmp / "runs")}
    stop_control()
    ray.shutdown()
    stop_cluster(cluster)


def run_script(env, script: Path, argv):
    from raylane.script.context import ScriptContext
    from raylane.script.runner import run_in_main, script_mode

    ctx = ScriptContext(team="team-a", class_name="sweep", name=None, script=str(script), argv=list(argv),
                        ctl=env["ctl"], job_id=None, storage_path=env["storage"], tracking_uri=env["uri"], poll_s=0.2)
    t0 = time.time()
    with script_mode(ctx):
        code = run_in_main(str(script), list(argv))
    print(f"\n{script.name}: exit {code} in {time.time() - t0:.1f}s")
    return code


def trial_runs(env, name: str):
    """The MLflow parent run and child runs of the script's sweep ``name`` (its sweep id is ``<name>-<hex>``)."""
    from mlflow import MlflowClient

    from raylane.sweeps.tracking import child_runs

    client = MlflowClient(env["uri"])
    exp = client.get_experiment_by_name("raylane/team-a")
    parents = [r for r in client.search_runs([exp.experiment_id], filter_string="tags.`raylane.kind` != 'trial'")
               if r.data.tags.get("raylane.workload_id", "").startswith(name + "-")]
    assert len(parents) == 1, [p.data.tags for p in parents]
    parent = parents[0]
    return parent, child_runs(client, exp.experiment_id, parent.data.tags["raylane.workload_id"])


def slots_of(env, name: str):
    return [r for r in env["ctl"].queue(include_done=True) if r.id.startswith(name + "-slot-")]


@pytest.mark.ray
@pytest.mark.slow
def test_a_tune_script_runs_as_a_sweep_under_quota_with_its_own_asha(env, tmp_path):
    from raylane.control.client import State

    script = tmp_path / "tune_script.py"
    script.write_text(textwrap.dedent(SCRIPT))
    out = tmp_path / "out.json"
    assert run_script(env, script, [str(out)]) == 0
    got = json.loads(out.read_text())
    # The script got Tune's ResultGrid back, and its best result.
    assert got["type"] == "ResultGrid" and got["errors"] == 0
    assert got["best_x"] == 0.1 and got["best_loss"] == pytest.approx(0.1 + 1 / 8)
    # The user's ASHA kept: the two worse trials, started after the first two reached rung 1, stopped there.
    assert got["iterations"]["0.8"] == 1 and got["iterations"]["0.9"] == 1, got
    assert got["iterations"]["0.1"] == 8, got
    # Its trials ran on 2 slots, the team's workloads of class sweep, all given back at the end.
    slots = slots_of(env, "tune-script")
    assert len(slots) == 2, [r.id for r in slots]
    assert all(r["team"] == "team-a" and r.state in (State.SUCCEEDED, State.CANCELLED) for r in slots), slots
    notes = " ".join(e.get("note", "") for r in slots for e in env["ctl"].explain(r.id)["journal"])
    assert "slot taken by sweep tune-script-" in notes and "stopped early at step 1" in notes, notes
    # MLflow: one parent run, FINISHED; one child per trial, none left RUNNING; the early stops tagged.
    parent, children = trial_runs(env, "tune-script")
    assert parent.info.status == "FINISHED"
    assert parent.data.params["script.scheduler"].endswith("AsyncHyperBandScheduler")  # ASHAScheduler is its alias
    assert len(children) == 4 and all(c.info.status == "FINISHED" for c in children)
    early = sorted(c.data.params["x"] for c in children if c.data.tags["raylane.stopped_early"] == "true")
    assert early[-2:] == ["0.8", "0.9"], early
    assert [c for c in children if c.data.tags.get("raylane.best_trial") == "true"][0].data.params["x"] == "0.1"


@pytest.mark.ray
@pytest.mark.e2e
def test_rays_async_hyperband_example_runs_unchanged_in_script_mode(env, tmp_path):
    import ray.tune.examples.async_hyperband_example as example

    from raylane.control.client import State

    code = run_script(env, Path(example.__file__), ["--smoke-test"])
    assert code == 0
    slots = slots_of(env, "asynchyperband-test")
    assert len(slots) == hook.DEFAULT_SLOTS  # 20 trials, no max_concurrent_trials: the default number of slots
    assert all(r["team"] == "team-a" and r.state in (State.SUCCEEDED, State.CANCELLED) for r in slots)
    parent, children = trial_runs(env, "asynchyperband-test")
    assert parent.info.status == "FINISHED" and parent.data.tags.get("raylane.best_trial_id")
    assert len(children) == 20 and all(c.info.status == "FINISHED" for c in children)
    # Its stop at 1 iteration is the budget: no trial counts as stopped early.
    assert all(c.data.tags["raylane.stopped_early"] == "false" for c in children)


@pytest.mark.ray
@pytest.mark.slow
def test_a_failing_sweep_ends_its_trials_and_raises_a_typed_error(env, tmp_path):
    script = tmp_path / "failing_script.py"
    script.write_text(textwrap.dedent('''
        from ray import tune

        def trainable(config):
            raise RuntimeError("the user's bug")

        tune.Tuner(trainable, param_space={"x": tune.uniform(0, 1)},
                   tune_config=tune.TuneConfig(metric="m", mode="min", num_samples=2, max_concurrent_trials=1)).fit()
    '''))
    failed = r"sweep failing-script-\w+ failed: RuntimeError: the user's bug \(every one of its 2 trial"
    with pytest.raises(RaylaneError, match=failed):
        run_script(env, script, [])
    parent, children = trial_runs(env, "failing-script")
    assert parent.info.status == "FAILED"
    assert children and all(c.info.status == "FAILED" for c in children)


@pytest.mark.parametrize("run_name, script, given, expected", [
    pytest.param("_fn_2026-12-01_23-39-47", "tune_script.py", None, "tune-script", id="Tune's own name: the stem"),
    pytest.param("my_LR sweep", "x.py", None, "my-lr-sweep", id="the script's RunConfig name"),
    pytest.param("my-run", "x.py", "cli-name", "cli-name", id="--name first"),
])
def test_the_workload_name(run_name, script, given, expected):
    from raylane.script.context import ScriptContext

    ctx = ScriptContext(team="t", class_name="c", name=given, script=script, argv=[], ctl=None)
    name = hook._workload_name(ctx, None if hook._tune_made(run_name, _fn) else run_name)
    assert name == expected
    assert hook._workload_name(ctx, None if hook._tune_made(run_name, _fn) else run_name) == expected + "-2"
