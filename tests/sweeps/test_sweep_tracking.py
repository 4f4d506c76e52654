"""raylane.sweeps.tracking.SweepTracking against a real MLflow sqlite store, fed the callbacks Tune's loop makes
(no Ray session): a PBT exploit is recorded on the weak trial's child run with the trial and step its checkpoint
came from, across a driver that resumes the sweep.

Creating an MLflow database runs its migrations (~3 s), so one is made per test process and copied for
each test (conftest ``uri``)."""
from __future__ import annotations

import pickle
from types import SimpleNamespace

import pytest
from mlflow import MlflowClient

from raylane.sweeps.tracking import TAG_EXPLOITS, SweepTracking, child_runs, exploits

SWEEP = "pbt-lm-a1b2c3"


@pytest.fixture
def store(uri):
    client = MlflowClient(tracking_uri=uri)
    experiment_id = client.create_experiment("raylane/team-a")
    parent = client.create_run(experiment_id, run_name=SWEEP).info.run_id
    return SimpleNamespace(uri=uri, client=client, experiment_id=experiment_id, parent=parent)


def tracking(store) -> SweepTracking:
    return SweepTracking(sweep_id=SWEEP, parent_run_id=store.parent, experiment_id=store.experiment_id,
                         uri=store.uri, name="pbt-lm", gpus_per_trial=0.5, budget_max=20, report_every=5)


def trial(tid: str, lr: float):
    return SimpleNamespace(trial_id=tid, status="RUNNING", config={"lr": lr})


def report(cb: SweepTracking, t, step: int, since_restore: int, **extra) -> None:
    """One result as Tune hands it to callbacks (``exploited_*`` as workloads.ray_tune reports them)."""
    result = {"step": step, "val_loss": 5.0 - step / 10, "lr": t.config["lr"], "trial_id": t.trial_id,
              "iterations_since_restore": since_restore, "time_this_iter_s": 1.0, "training_iteration": step // 5,
              **extra}
    cb.on_trial_result(0, [], t, result)


def runs_by_trial(store) -> dict:
    return {r.data.tags["raylane.trial_id"]: r for r in child_runs(store.client, store.experiment_id, SWEEP)}


def test_an_exploit_is_recorded_on_the_weak_trials_child_run_with_its_source_trial_and_step(store):
    cb = tracking(store)
    strong, weak = trial("t_00000", 0.01), trial("t_00001", 0.0002)
    for t in (strong, weak):
        cb.on_trial_start(0, [], t)
        report(cb, t, 5, 1)
        report(cb, t, 10, 2)
    # PBT: the weak trial is paused, takes the strong one's checkpoint of step 10 and a mutated lr, and restarts.
    weak.config = {"lr": 0.012}
    cb.on_trial_start(0, [], weak)
    report(cb, weak, 15, 1, exploited_from=strong.trial_id, exploited_step=10)
    report(cb, weak, 20, 2, exploited_from=strong.trial_id, exploited_step=10)  # the same start: no new entry
    # The strong trial paused by PBT's time sharing and restarted from its own checkpoint: no exploit.
    cb.on_trial_start(0, [], strong)
    report(cb, strong, 15, 1)
    report(cb, strong, 20, 2)
    for t in (strong, weak):
        cb.on_trial_complete(0, [], t)

    runs = runs_by_trial(store)
    assert exploits(runs[weak.trial_id]) == [{"step": 15, "source": strong.trial_id, "source_step": 10}]
    assert exploits(runs[strong.trial_id]) == [] and TAG_EXPLOITS not in runs[strong.trial_id].data.tags
    assert runs[weak.trial_id].data.tags["raylane.config.lr"] == "0.012"
    # The source's curve holds the step the checkpoint was taken at, and the weak trial trained 5 steps from it.
    steps = [int(p.value) for p in store.client.get_metric_history(runs[strong.trial_id].info.run_id, "step")]
    assert 10 in steps
    assert runs[weak.trial_id].data.metrics["trained_steps"] == 20


def test_a_resumed_driver_adds_to_the_exploits_an_earlier_driver_recorded(store):
    a, b, c = trial("t_00000", 0.01), trial("t_00001", 0.0002), trial("t_00002", 0.02)
    first = tracking(store)
    first.on_trial_start(0, [], b)
    report(first, b, 5, 1)
    b.config = {"lr": 0.012}
    first.on_trial_start(0, [], b)
    report(first, b, 10, 1, exploited_from=a.trial_id, exploited_step=5)
    # The driver dies; the next one unpickles the callback from Tune's experiment state and goes on.
    second = pickle.loads(pickle.dumps(first))
    second.on_trial_start(0, [], b)
    report(second, b, 10, 1, exploited_from=a.trial_id, exploited_step=5)  # logged by the first driver: skipped
    report(second, b, 15, 2, exploited_from=a.trial_id, exploited_step=5)
    b.config = {"lr": 0.024}
    second.on_trial_start(0, [], b)
    report(second, b, 20, 1, exploited_from=c.trial_id, exploited_step=15)
    assert exploits(runs_by_trial(store)[b.trial_id]) == [
        {"step": 10, "source": a.trial_id, "source_step": 5},
        {"step": 20, "source": c.trial_id, "source_step": 15},
    ]
