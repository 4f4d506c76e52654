"""Sweeps on a real local Ray cluster (one node of 2 logical GPUs) under the control actor: an ASHA sweep of the small
LM whose weak trials stop at the rungs, with its MLflow parent and child runs; a synchronous ASHA sweep that stops
exactly the weaker half at each rung; a PBT sweep whose exploit copies a
checkpoint; PBT sweeps of Ray's own ``pbt_function`` and ``PBTBenchmarkExample`` (no ``step``: counted in
``training_iteration``); a sweep that fails with a typed reason; an Optuna TPE sweep; a sweep that shrinks when a
higher-class gang of its team arrives and grows back after; a sweep whose driver is killed and resumed.

One cluster and one control actor for the module. Trials are tiny (a 1-layer LM of width 16 on 50 kB, or a
torch-free quadratic from ``tests.sweep_fns``) so that the module fits a few minutes on two cores.
"""
import json
import math
import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest

ray = pytest.importorskip("ray")

from raylane.control.client import EndState, Outcome, State, start_control, stop_control  # noqa: E402
from tests.raytest import REPO, empty_store, local_policy, spec, start_cluster, stop_cluster, wait_for  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.slow]

LM = {"batch_size": 8, "warmup_steps": 2, "eval_windows": 8, "corpus": {"max_bytes": 50_000},
      "model": {"d_model": 16, "n_layers": 1, "n_heads": 2, "context": 16}}


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sweeps")
    cluster = start_cluster(gpu_nodes=(("gpu-a", ["gpu-sim"]),), gpus=2, cpus=4, head_cpus=1)
    ray.init(address=cluster.address, namespace="raylane", log_to_driver=False)
    # No minimum runtime for sweep slots: a higher class may reclaim one at once.
    policy = local_policy(sweep={"min_runtime": 0, "grace_period": "60s"}, finetune={"min_runtime": 0})
    ctl = start_control(policy, str(tmp / "journal.db"), tick_s=0.2)
    yield {"ctl": ctl, "tmp": tmp, "uri": empty_store(tmp / "mlflow.db"), "storage": str(tmp / "runs"),
           "address": cluster.address}
    stop_control()
    stop_cluster(cluster)


def sweep_spec(name, sweep, config=None, cls="sweep"):
    s = spec(name, "team-a", cls, kind="tune", config=config or {})
    del s["gang"]
    s["sweep"] = sweep
    return s


def run(env, s, **kw):
    from raylane.launchers.tune import run_sweep

    t0 = time.time()
    rec = run_sweep(s, ctl=env["ctl"], storage_path=env["storage"], tracking_uri=env["uri"], verbose=0, **kw)
    rec["wall_s"] = time.time() - t0
    print(f"\n{s['name']}: {rec['state']} in {rec['wall_s']:.1f}s, {rec['trials']} trials, "
          f"GPU-s {rec['gpu_seconds']['gpu_seconds_used']:.1f} of {rec['gpu_seconds']['gpu_seconds_full_budget']:.1f}")
    return rec


def mlflow_client(env):
    from mlflow import MlflowClient

    return MlflowClient(env["uri"])


def trial_curves(env, rec):
    """trial id -> (its MLflow child run, its results as rows ``{metric: value}``, in the order reported), read from
    the sweep's child runs: the product's record of every result. Tune's own histories (``metrics_dataframe``) lose
    the results a trial reported shortly before it restarted (see ``raylane.sweeps.tracking``)."""
    from raylane.sweeps.tracking import TAG_TRIAL_ID, child_runs

    client = mlflow_client(env)
    experiment_id = client.get_run(rec["mlflow_run_id"]).info.experiment_id
    out = {}
    for run in child_runs(client, experiment_id, rec["id"]):
        rows = {}  # the metrics of one result share a timestamp and a step
        for key in run.data.metrics:
            for point in client.get_metric_history(run.info.run_id, key):
                rows.setdefault((point.timestamp, point.step), {"step": point.step})[key] = point.value
        out[run.data.tags[TAG_TRIAL_ID]] = (run, [rows[k] for k in sorted(rows)])
    return out


def cli(env, *args) -> str:
    """``raylane ARGS`` in this process, as the operator (its token in ``RAYLANE_TOKEN``, as a user would set it)."""
    from typer.testing import CliRunner

    from raylane.cli import app

    result = CliRunner().invoke(app, list(args), env={"RAYLANE_TOKEN": env["ctl"].credential.token})
    assert result.exit_code == 0, result.output
    return result.stdout


def slot_records(env, prefix):
    return [r for r in env["ctl"].queue(include_done=True) if r.id.startswith(prefix + "-slot-")]


# ---------------------------------------------------------------------------------------------------- ASHA


def test_asha_sweep_of_the_lm_stops_weak_trials_at_the_rungs_and_records_mlflow(env):
    s = sweep_spec("asha-lm", {
        "trainable": "workloads.ray_tune:lm_trainable",
        "space": {"lr": {"type": "loguniform", "low": 1e-5, "high": 3e-2}},
        "search": {"algorithm": "random", "seed": 0},
        "budget": {"max": 40, "report_every": 10},
        "scheduler": {"type": "asha", "eta": 2, "grace_period": 10},
        "metric": "val_loss", "mode": "min", "trials": 6, "max_concurrent": 2,
        "resources": {"gpu": 1, "cpu": 0.5}}, LM)
    rec = run(env, s)
    assert rec["state"] == "SUCCEEDED" and rec["trials"] == 6
    assert rec["max_running_over_leased"] == 0  # never more trials running than slots held
    final = {r.metrics["trial_id"]: r.metrics["step"] for r in rec["results"]}
    rungs = {10, 20}
    assert set(final.values()) <= rungs | {40}, final
    early = {t: step for t, step in final.items() if step < 40}
    assert early and len(early) < 6, final  # some weak trials stopped, some trials ran the whole budget
    assert rec["stopped_early"] == len(early)
    # Every report fell on a multiple of report_every, and nothing trained past its rung.
    for tid, (_, rows) in trial_curves(env, rec).items():
        assert [row["step"] for row in rows] == list(range(10, final[tid] + 1, 10))
    # The slots are all given back; their journals tell which trial stopped where.
    slots = slot_records(env, "asha-lm")
    assert len(slots) == 2 and all(r.state in (State.SUCCEEDED, State.CANCELLED) for r in slots)
    notes = " ".join(e.get("note", "") for r in slots for e in env["ctl"].explain(r.id)["journal"])
    assert "stopped early at step" in notes and "started (lr=" in notes

    # MLflow: one parent run for the sweep, one child per trial with its params and curve, the best tagged.
    client = mlflow_client(env)
    parent = client.get_run(rec["mlflow_run_id"])
    assert parent.data.tags["raylane.workload_id"] == rec["id"] and parent.info.status == "FINISHED"
    assert parent.data.params["sweep.scheduler.type"] == "asha" and parent.data.params["sweep.trials"] == "6"
    m = parent.data.metrics
    assert m["sweep_trials"] == 6 and m["sweep_gpu_seconds_saved"] > 0
    assert m["sweep_gpu_seconds_used"] < m["sweep_gpu_seconds_full_budget"]
    assert m["sweep_trained_steps"] == sum(final.values()) < m["sweep_full_budget_steps"] == 6 * 40
    children = client.search_runs([parent.info.experiment_id],
                                  f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'")
    assert len(children) == 6
    by_trial = {c.data.tags["raylane.trial_id"]: c for c in children}
    assert set(by_trial) == set(final)
    for tid, child in by_trial.items():
        assert "lr" in child.data.params and child.info.status == "FINISHED"
        curve = client.get_metric_history(child.info.run_id, "val_loss")
        assert sorted(p.step for p in curve) == list(range(10, final[tid] + 1, 10))
        assert child.data.tags["raylane.stopped_early"] == str(final[tid] < 40).lower()
    best = [c for c in children if c.data.tags.get("raylane.best_trial") == "true"]
    assert len(best) == 1
    assert best[0].data.metrics["val_loss"] == min(c.data.metrics["val_loss"] for c in children)
    assert parent.data.tags["raylane.best_trial_id"] == best[0].data.tags["raylane.trial_id"] == rec["best"]["trial_id"]


@pytest.mark.e2e
def test_synchronous_asha_stops_the_same_trials_whatever_the_order_they_reach_a_rung(env):
    """Eight points of the quadratic, drawn worst first, two slots: Tune's asynchronous ASHA never stops the first
    trials to reach a rung, so it would let the worst go on; synchronous rungs wait for all eight (the first ones
    paused, holding no slot) and keep exactly the best half at each rung."""
    xs = [-0.7, 1.2, -0.4, 0.95, -0.1, 0.6, 0.2, 0.35]  # distance to the optimum 0.3: 1.0 down to 0.05
    s = sweep_spec("sync-asha", {
        "trainable": "tests.sweep_fns:quadratic",
        "space": {"x": {"type": "grid", "values": xs}},
        "search": {"algorithm": "grid"},
        "budget": {"max": 8, "report_every": 1},
        "scheduler": {"type": "asha", "eta": 2, "grace_period": 1, "synchronous": True},  # rungs 1, 2, 4
        "metric": "loss", "mode": "min", "max_concurrent": 2,
        "resources": {"gpu": 1, "cpu": 0.5}}, {"max_steps": 8, "report_every": 1})
    rec = run(env, s)
    assert rec["state"] == "SUCCEEDED" and rec["trials"] == 8 and rec["max_running_over_leased"] == 0
    final = {r.config["x"]: r.metrics["step"] for r in rec["results"]}
    assert final == {-0.7: 1, 1.2: 1, -0.4: 1, 0.95: 1, -0.1: 2, 0.6: 2, 0.2: 4, 0.35: 8}
    assert rec["trained_steps"] == 20 and rec["stopped_early"] == 7
    assert float(rec["best"]["config"]["x"]) == 0.35  # MLflow params are strings
    # Each trial reported every step up to its last once: the promoted ones resumed from their rung's checkpoint.
    by_x = {r.metrics["trial_id"]: r.config["x"] for r in rec["results"]}
    for tid, (_, rows) in trial_curves(env, rec).items():
        assert [row["step"] for row in rows] == list(range(1, final[by_x[tid]] + 1)), (by_x[tid], rows)
    resumed = [r for r in rec["results"] if r.metrics.get("resumed_from") is not None]
    assert {r.config["x"] for r in resumed} == {-0.1, 0.6, 0.2, 0.35}
    notes = " ".join(e.get("note", "") for r in slot_records(env, "sync-asha")
                     for e in env["ctl"].explain(r.id)["journal"])
    assert "waits at its rung for the other trials" in notes and "stopped early at step 1" in notes


# ----------------------------------------------------------------------------------------------------- PBT


@pytest.mark.e2e
def test_pbt_sweep_exploit_copies_a_checkpoint_of_a_stronger_trial(env):
    from raylane.sweeps.tracking import exploits

    s = sweep_spec("pbt-lm", {
        # Synchronous PBT: at every perturbation the whole population is ranked at the same step. Asynchronous PBT
        # ranks a trial against the others' last scores and leaves out trials that finished, so on an idle machine,
        # where each short trial finishes before the next has started, no exploit ever happened (seen in CI). The
        # two trials that barely learn (lr 1e-6) are the lower half at the first perturbation and exploit then.
        "trainable": "workloads.ray_tune:lm_trainable",
        "space": {"lr": {"type": "grid", "values": [1e-6, 1e-2, 1.5e-6, 2e-2]}},
        "search": {"algorithm": "grid", "seed": 1},
        # A perturbation at every report and half the population in each quantile.
        "budget": {"max": 20, "report_every": 5},
        "scheduler": {"type": "pbt", "perturbation_interval": 5, "quantile_fraction": 0.5, "synch": True,
                      "mutations": {"lr": {"type": "loguniform", "low": 1e-4, "high": 3e-2}}},
        "metric": "val_loss", "mode": "min", "max_concurrent": 4,
        # Half a logical GPU each: the population of 4 runs at once on the 2 GPUs, within team-a's nominal quota.
        "resources": {"gpu": 0.5, "cpu": 0.5}}, LM)
    rec = run(env, s)
    assert rec["state"] == "SUCCEEDED" and rec["trials"] == 4 and rec["max_running_over_leased"] == 0
    curves = trial_curves(env, rec)
    found = {tid: exploits(child) for tid, (child, _) in curves.items()}
    found = {tid: entries for tid, entries in found.items() if entries}
    assert found, {tid: [r["step"] for r in rows] for tid, (_, rows) in curves.items()}
    tid, entries = next(iter(found.items()))
    exploit = entries[-1]  # its last exploit
    source, at = exploit["source"], exploit["source_step"]
    # The weak trial went on from the strong trial's checkpoint: the step it reports next follows that step, and the
    # strong trial had reported that step.
    assert exploit["step"] == at + 5
    assert source in curves and at in [r["step"] for r in curves[source][1]], {
        t: [(r["step"], r.get("exploited_step")) for r in rows] for t, (_, rows) in curves.items()}
    child, rows = curves[tid]
    first_after = [r for r in rows if r["step"] == at + 5 and r.get("exploited_step") == at][-1]
    # And it trains with its own (mutated) learning rate, not the one stored in the copied optimizer: the LR of the
    # update to step at+5 is lr * multiplier(at + 4) (the schedule stepped at+4 times before it).
    mutated_lr = float(child.data.tags.get("raylane.config.lr", child.data.params["lr"]))
    assert mutated_lr == pytest.approx(next(r for r in rec["results"] if r.metrics["trial_id"] == tid).config["lr"])
    assert first_after["lr"] == pytest.approx(mutated_lr * _lr_multiplier(at + 4, total=20), rel=1e-4)


def _lr_multiplier(step, *, total, warmup=2, floor=0.1):
    from workloads.train_lm import _lr_multiplier as f

    return f(step, warmup=warmup, total=total, floor=floor)


# ------------------------------------------------------------------------------------- Ray's own examples


@pytest.mark.parametrize("name, trainable", [
    ("pbt-ray-fn", "ray.tune.examples.pbt_function:pbt_function"),  # a function that checkpoints with its reports
    ("pbt-ray-cls", "ray.tune.examples.pbt_example:PBTBenchmarkExample"),  # a tune.Trainable with save/load
])
def test_ray_examples_pbt_sweeps_in_training_iterations(env, name, trainable):
    """Ray's PBT examples report no ``step``: the sweep counts in the ``training_iteration`` Tune adds. PBT
    exploits (it raised 'Cannot find time_attr step' before), every trial stops at the budget (the trainables
    themselves never end before accuracy 200), and no trial's MLflow run is left RUNNING."""
    from raylane.sweeps.tracking import child_runs

    s = sweep_spec(name, {
        "trainable": trainable,
        "space": {"lr": {"type": "grid", "values": [0.0001, 0.01]}},
        "search": {"algorithm": "grid"},
        "budget": {"max": 6, "report_every": 1},
        "scheduler": {"type": "pbt", "perturbation_interval": 2, "quantile_fraction": 0.5, "synch": True,
                      "mutations": {"lr": {"type": "uniform", "low": 0.001, "high": 0.02}}},
        "metric": "mean_accuracy", "mode": "max", "max_concurrent": 2,
        "resources": {"gpu": 0.5, "cpu": 0.5}})
    rec = run(env, s)
    assert rec["state"] == "SUCCEEDED" and rec["trials"] == 2 and rec["max_running_over_leased"] == 0
    assert sorted(r.metrics["training_iteration"] for r in rec["results"]) == [6, 6]
    client = mlflow_client(env)
    children = child_runs(client, client.get_run(rec["mlflow_run_id"]).info.experiment_id, rec["id"])
    assert {c.info.status for c in children} == {"FINISHED"}
    assert {c.data.tags["raylane.final_step"] for c in children} == {"6"}
    # The weaker trial took the stronger one's checkpoint and a perturbed lr at a perturbation.
    assert any("raylane.config.lr" in c.data.tags for c in children), [c.data.tags for c in children]
    history = client.get_metric_history(children[0].info.run_id, "mean_accuracy")
    assert sorted({p.step for p in history}) == [1, 2, 3, 4, 5, 6]  # the curve is against the iteration


def test_a_sweep_that_fails_raises_the_reason_and_leaves_no_trial_run_running(env):
    """A named ``time_attr`` the results lack: the sweep fails at the first result with a typed error naming it (not
    a traceback out of Tune's loop), and the MLflow runs of its trials and the sweep end FAILED."""
    from raylane.sweeps.conventions import TrialResultError
    from raylane.sweeps.tracking import child_runs

    s = sweep_spec("fail-ray-fn", {
        "trainable": "ray.tune.examples.pbt_function:pbt_function", "time_attr": "iterations",
        "space": {"lr": {"type": "grid", "values": [0.0001, 0.01]}}, "search": {"algorithm": "grid"},
        "budget": {"max": 6}, "scheduler": {"type": "asha"},
        "metric": "mean_accuracy", "mode": "max", "max_concurrent": 2, "resources": {"gpu": 0.5, "cpu": 0.5}})
    with pytest.raises(TrialResultError, match="'iterations'"):
        run(env, s)
    client = mlflow_client(env)
    parent = client.search_runs([client.get_experiment_by_name("raylane/team-a").experiment_id],
                                filter_string="tags.`raylane.workload_id` LIKE 'fail-ray-fn-%'")
    assert [p.info.status for p in parent] == ["FAILED"]
    children = child_runs(client, parent[0].info.experiment_id, parent[0].data.tags["raylane.workload_id"])
    assert children and {c.info.status for c in children} == {"FAILED"}
    assert not [r for r in slot_records(env, "fail-ray-fn") if not r.state.terminal]


# ----------------------------------------------------------------------------------------------------- TPE


def test_optuna_tpe_sweep_of_a_user_function(env):
    s = sweep_spec("tpe-quad", {
        "trainable": "tests.sweep_fns:quadratic",
        "space": {"x": {"type": "uniform", "low": -1, "high": 1}, "y": {"type": "uniform", "low": -1, "high": 1}},
        "search": {"algorithm": "tpe", "seed": 0, "startup_trials": 3},
        "budget": {"max": 3, "report_every": 1},
        "metric": "loss", "mode": "min", "trials": 8, "max_concurrent": 2,
        "resources": {"gpu": 1, "cpu": 0.5}}, {"max_steps": 3, "report_every": 1})
    rec = run(env, s)
    assert rec["state"] == "SUCCEEDED" and rec["trials"] == 8 and rec["max_running_over_leased"] == 0
    assert all(r.metrics["step"] == 3 for r in rec["results"])  # FIFO: every trial runs the whole budget
    assert rec["gpu_seconds"]["gpu_seconds_saved"] == pytest.approx(0.0, abs=1e-6)
    client = mlflow_client(env)
    parent = client.get_run(rec["mlflow_run_id"])
    assert parent.data.params["sweep.search.algorithm"] == "tpe"
    losses = [r.metrics["loss"] for r in rec["results"]]
    assert rec["best"]["loss"] == min(losses)


# ------------------------------------------------------------------------------------------- shrink & grow


def test_sweep_shrinks_for_a_higher_class_gang_of_its_team_and_grows_back(env):
    ctl = env["ctl"]
    s = sweep_spec("elastic", {
        "trainable": "tests.sweep_fns:quadratic",
        "space": {"x": {"type": "uniform", "low": -1, "high": 1}},
        "search": {"algorithm": "random", "seed": 0},
        "budget": {"max": 60, "report_every": 4},
        "metric": "loss", "mode": "min", "trials": 2, "max_concurrent": 2,
        # ~24 s a trial: the other trial still runs when the fine-tuning gang leaves, so the slot is needed again.
        "resources": {"gpu": 1, "cpu": 0.5}}, {"max_steps": 60, "report_every": 4, "sleep_s": 0.4})
    out = {}
    t = threading.Thread(target=lambda: out.update(rec=run(env, s)), daemon=True)
    t.start()
    try:
        wait_for(lambda: all(r.state is State.RUNNING and "2 running" in r["detail"]
                             for r in slot_records(env, "elastic")) and len(slot_records(env, "elastic")) == 2,
                 timeout=90, what="the sweep running 2 trials on 2 slots")
        # Team-a's fine-tuning gang (a higher class) needs one of the two GPUs the sweep holds.
        ft = ctl.submit(spec("ft", "team-a", "finetune", gpu=1)).id
        admitted = wait_for(lambda: (r := ctl.wait_admission(ft, 1.0)).ready and r, timeout=60,
                            what="the fine-tuning gang admitted")
        slots = slot_records(env, "elastic")
        assert sorted(r.state.value for r in slots) == ["PENDING", "RUNNING"]
        victim = next(r for r in slots if r.state is State.PENDING)
        assert victim["preemptions"] == 1
        # The sweep paused a trial with its checkpoint and runs the other alone.
        wait_for(lambda: all("1 running, 1 paused" in r["detail"] for r in slot_records(env, "elastic")),
                 timeout=30, what="queue detail showing 1 running, 1 paused")
        notes = [e.get("note", "") for e in ctl.explain(victim.id)["journal"]]
        assert any("paused at step" in n and "slot was reclaimed" in n for n in notes), notes
        # What an operator sees: `raylane queue` and `raylane explain` show the sweep's running and paused trials.
        rows = json.loads(cli(env, "queue", "--json"))
        assert all("1 running, 1 paused" in r["detail"] for r in rows if r["id"].startswith("elastic-slot-"))
        shown = " ".join(cli(env, "explain", victim.id).split())
        assert "now: sweep elastic-" in shown and "1 running, 1 paused" in shown and "slot was reclaimed" in shown
        assert admitted.state is State.ADMITTED
        assert ctl.running(ft, job_id=None, note="test gang").state is State.RUNNING
        time.sleep(1.0)
        assert all("1 running, 1 paused" in r["detail"] for r in slot_records(env, "elastic"))
        ctl.release(ft, Outcome.FINISHED, state=EndState.SUCCEEDED)
        # The slot comes back and the paused trial resumes from its checkpoint.
        wait_for(lambda: ctl.status(victim.id).state is State.RUNNING, timeout=60,
                 what="the reclaimed slot admitted again")
    finally:
        t.join(timeout=180)
    rec = out["rec"]
    assert rec["state"] == "SUCCEEDED" and rec["trials"] == 2 and rec["preemptions"] == 1
    assert rec["max_running_over_leased"] == 0  # never more trials running than slots held
    granted = [g for _, g, _, _ in rec["grant_history"]]
    shrunk = granted.index(1, granted.index(2))
    assert 2 in granted[shrunk:]  # 2 slots, then 1, then 2 again
    hist = {tid: rows for tid, (_, rows) in trial_curves(env, rec).items()}
    resumed = {tid: rows for tid, rows in hist.items() if any(value(r, "resumed_from") is not None for r in rows)}
    # At least the trial paused for the shrink resumed. A CI run once saw both trials paused and resumed (why the
    # second one paused was not established); every paused trial must go on from its checkpoint with no step lost
    # and none trained twice.
    assert resumed, {t: [r["step"] for r in rows] for t, rows in hist.items()}
    for rows in resumed.values():
        assert [r["step"] for r in rows] == list(range(4, 61, 4))  # no step lost, none trained twice
        at = next(value(r, "resumed_from") for r in rows if value(r, "resumed_from") is not None)
        assert 4 <= at < 60  # it went on from its checkpoint, not from the start


def value(row, key):
    """A result's ``key``, None where the trial did not report it (NaN in Tune's dataframe)."""
    v = row.get(key)
    return None if v is None or (isinstance(v, float) and math.isnan(v)) else v


# --------------------------------------------------------------------------------------- driver death


@pytest.mark.e2e
def test_sweep_resumes_after_its_driver_dies(env, tmp_path):
    import yaml

    ctl = env["ctl"]
    s = sweep_spec("phoenix", {
        "trainable": "tests.sweep_fns:quadratic",
        "space": {"x": {"type": "uniform", "low": -1, "high": 1}},
        "search": {"algorithm": "random", "seed": 0},
        "budget": {"max": 12, "report_every": 2},
        "metric": "loss", "mode": "min", "trials": 4, "max_concurrent": 2,
        "resources": {"gpu": 1, "cpu": 0.5}}, {"max_steps": 12, "report_every": 2, "sleep_s": 0.25})
    path = tmp_path / "phoenix.yaml"
    path.write_text(yaml.safe_dump(s))
    cmd = [sys.executable, "-m", "raylane.run", str(path), "--storage-path", env["storage"],
           "--tracking-uri", env["uri"]]
    # A driver started by hand (not a Ray job) finds its credential in RAYLANE_TOKEN.
    child_env = {**os.environ, "RAY_ADDRESS": env["address"], "PYTHONPATH": str(REPO),
                 "RAYLANE_TOKEN": ctl.credential.token}
    log1 = open(tmp_path / "driver1.log", "w")
    first = subprocess.Popen(cmd, cwd=str(REPO), env=child_env, stdout=log1, stderr=subprocess.STDOUT)
    try:
        def one_finished():
            rows = slot_records(env, "phoenix")
            done = [int(m.group(1)) for r in rows if (m := re.search(r"(\d+) finished", r["detail"] or ""))]
            return rows and max(done or [0]) >= 1 and max(done) < 4
        wait_for(one_finished, timeout=120, every=0.2, what="a trial of the first driver finished")
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=30)
    old = [r.id for r in slot_records(env, "phoenix") if r.state not in (State.SUCCEEDED, State.CANCELLED)]
    second = subprocess.run(cmd, cwd=str(REPO), env=child_env, capture_output=True, text=True, timeout=240)
    print(second.stdout[-3000:])
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert "resuming, driver 1" in second.stdout
    for wid in old:  # the dead driver's slots were given back
        assert ctl.status(wid).state is State.CANCELLED
    client = mlflow_client(env)
    parents = client.search_runs([e.experiment_id for e in client.search_experiments()],
                                 "tags.`raylane.workload_id` LIKE 'phoenix-%'")
    assert len(parents) == 1  # the same parent run went on
    parent = parents[0]
    assert parent.info.status == "FINISHED" and parent.data.tags["raylane.restarts"] == "1"
    children = client.search_runs([parent.info.experiment_id], f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'")
    assert len(children) == 4  # no trial ran twice as a new trial
    for c in children:
        steps = [p.step for p in client.get_metric_history(c.info.run_id, "loss")]
        assert steps == sorted(set(steps)) and steps[-1] == 12  # each curve whole, no step logged twice
