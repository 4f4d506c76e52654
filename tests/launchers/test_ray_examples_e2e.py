"""Ray Train code nobody in this project wrote, as a new user submits it: the example loops that ship inside Ray's
own wheel, named unchanged as entrypoints, submitted through the real ``ray job submit`` CLI on a local cluster
whose GPUs are logical (no CUDA). One cluster for the module (tests/jobtest.py).

- ``torch_linear_example:train_func`` calls ``prepare_data_loader`` / ``prepare_model`` (on logical GPUs Ray
  Train's torch utilities would ask CUDA for a stream) and reports checkpoints with no step and folders named by
  time: it runs on the CPU while its gang holds GPUs, its checkpoints are recorded at the report's index, it is
  preempted by a higher class and finishes, and since it never loads its checkpoint, MLflow says it restarted from
  zero while every point of both attempts is kept.
- ``torch_regression_example:train_func`` without a dataset fails the same way every attempt: it stops after the
  second, with the reason, and ``ray job submit`` exits non-zero.
- A gang that starts before its MLflow run is named still logs every point, to a store that is not the default.
"""
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from raylane.control.client import State  # noqa: E402
from raylane.jobs import with_credential  # noqa: E402
from tests.jobtest import (finish_lease, finished, job_env, metric_history, mlflow_run, module_env,  # noqa: E402
                           operator_token, placed, reclaiming_lease, record_of_job, write_spec)
from tests.raytest import spec, wait_for  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.e2e]

LINEAR = "ray.train.examples.pytorch.torch_linear_example:train_func"
REGRESSION = "ray.train.examples.pytorch.torch_regression_example:train_func"
PROJECT = Path(__file__).parents[1] / "data" / "user_project"
RAY_CLI = str(Path(sys.executable).parent / "ray")


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    yield from module_env(tmp_path_factory, "rayexamples",
                          pretrain={"min_runtime": "1s", "grace_period": "60s", "retry_budget": 3})


def cli_submit(env, s: dict, name: str, *, working_dir=None, wait: bool = False):
    """``ray job submit`` (the real CLI) of ``python -m raylane.run SPEC``, as the README writes it, with the
    operator's job credential as a ``py_modules`` entry. ``wait``: the CLI follows the job to its end; returns the
    finished process. Otherwise returns the submission id."""
    path = write_spec(env, s, name)
    runtime_env = {"env_vars": job_env(env)}
    if working_dir:
        runtime_env["working_dir"] = str(working_dir)
    runtime_env = with_credential(runtime_env, operator_token(env))
    job_id = f"raysubmit_{name}_{int(time.time() * 1000)}"
    cmd = [RAY_CLI, "job", "submit", "--address", env["dash"], "--submission-id", job_id,
           "--runtime-env-json", json.dumps(runtime_env)]
    if not wait:
        cmd.append("--no-wait")
    cmd += ["--", sys.executable, "-m", "raylane.run", str(path), "--storage-path", env["storage"],
            "--tracking-uri", env["uri"]]
    env["jobs"].append(job_id)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if not wait:
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return job_id
    return proc


def journal(env, wid, kind):
    return [e for e in env["ctl"].explain(wid)["journal"] if e["kind"] == kind]


def test_rays_linear_example_runs_on_logical_gpus_is_preempted_and_finishes(env):
    # Its first attempt holds at its second checkpointed report (epoch 2) until it is asked to stop (a platform
    # drill, ``config.fault``, that the loop never sees), so the preemption lands mid-run however slow the
    # preemptor's driver is to start on a loaded machine.
    epochs = 4
    a_job = cli_submit(env, spec("ray-linear", "team-a", "pretrain", workers=2, gpu=2, cpu=1, entrypoint=LINEAR,
                                 config={"epochs": epochs, "data_size": 2000, "batch_size": 32,
                                         "fault": {"hold_at_step": 2}}), "ray-linear")
    a = record_of_job(env, a_job).id
    wait_for(lambda: len(journal(env, a, "checkpointed")) >= 1, timeout=240, what="a checkpoint of A")
    b = reclaiming_lease(env, "user-b")  # team-b's finetune reclaims the 2 GPUs it lent (tests/jobtest.py)
    wait_for(lambda: env["ctl"].status(a)["preemptions"] == 1, timeout=120, what="A preempted")
    placed(env, b)
    finish_lease(env, b)
    assert str(finished(env, a_job, timeout=400)).endswith("SUCCEEDED")
    ra = env["ctl"].explain(a)
    assert ra.state is State.SUCCEEDED and ra["preemptions"] == 1 and ra["restarts"] == 0
    # Its checkpoints carry no step and Ray names their folders by time: each is recorded at the report's index in
    # the workload, counted on across the resume.
    steps = [e["step"] for e in journal(env, a, "checkpointed")]
    assert steps == list(range(1, len(steps) + 1)), steps
    requeued = journal(env, a, "requeued")
    assert len(requeued) == 1 and requeued[0]["step"] is not None, requeued
    yielded_at = requeued[0]["step"]
    assert yielded_at == 2 and yielded_at in steps
    # It never loads its checkpoint, so the second attempt trains all its epochs again: told, and every point of
    # both attempts is in MLflow, one per report.
    run, hist = metric_history(env, a, "loss")
    assert [s for s, _ in hist] == list(range(1, yielded_at + epochs + 1))
    assert run.data.tags["raylane.restarted_from_zero"] == str(yielded_at)
    assert run.info.status == "FINISHED"
    assert any("restarted from zero" in (e.get("note") or "") for e in ra["journal"]), ra["journal"]


def test_a_failure_that_repeats_stops_after_the_second_attempt(env):
    # Ray's regression example reads a "train" dataset shard; given none, every attempt fails the same way.
    proc = cli_submit(env, spec("ray-regression-nodata", "team-a", "pretrain", workers=1, gpu=1, cpu=1,
                                entrypoint=REGRESSION, config={"epochs": 1}), "ray-regression-nodata", wait=True)
    assert proc.returncode != 0, proc.stdout[-3000:]
    wid = next(r.id for r in env["ctl"].queue(include_done=True) if r.id.startswith("ray-regression-nodata"))
    rec = env["ctl"].explain(wid)
    assert rec.state is State.FAILED and rec["restarts"] == 1, rec["journal"]
    why = rec["journal"][-1]["note"]
    assert "failed the same way on 2 consecutive attempts" in why and "retry budget 3" in why, why
    assert "Dataset shard for 'train' not found" in why, why
    assert mlflow_run(env, wid).info.status == "FAILED"


class NamedLate:
    """A real run starter whose answer is held back until the gang has started: the workers must then get the
    run's id from the control actor and its store from the driver."""

    def __init__(self, starter, ctl):
        self.starter, self.ctl, self.wid = starter, ctl, None
        self.gang_started_first = threading.Event()

    def ask(self, *, workload_id, spec):
        self.wid = workload_id
        self.starter.ask(workload_id=workload_id, spec=spec)

    def result(self):
        wait_for(lambda: any(e["kind"] == "running" for e in self.ctl.explain(self.wid)["journal"]), timeout=120,
                 what="the gang to start")
        self.gang_started_first.set()
        return self.starter.result()

    def close(self):
        self.starter.close()


def test_a_gang_that_starts_before_its_run_is_named_logs_every_point_to_a_store_of_its_own(env, tmp_path):
    from ray import cloudpickle

    from raylane.launchers.train import run_training
    from raylane.runstart import RunStarter

    sys.path.insert(0, str(PROJECT))
    try:
        import my_train
    finally:
        sys.path.remove(str(PROJECT))
    cloudpickle.register_pickle_by_value(my_train)  # the workers have no copy of the project
    uri = f"sqlite:///{tmp_path / 'elsewhere' / 'runs.db'}"
    s = spec("late-run", "team-a", "pretrain", workers=1, gpu=1, cpu=1, entrypoint="my_train:train_loop_per_worker",
             config={"steps": 60, "checkpoint_every": 20})
    starter = NamedLate(RunStarter(team="team-a", tracking_uri=uri), env["ctl"])
    rec = run_training(s, ctl=env["ctl"], storage_path=str(tmp_path / "runs"), tracking_uri=uri,
                       train_fn=my_train.train_loop_per_worker, run_starter=starter)
    assert starter.gang_started_first.is_set()
    assert rec["state"] == "SUCCEEDED"
    named = [e for e in env["ctl"].explain(rec["id"])["journal"] if "MLflow run" in (e.get("note") or "")]
    started = journal(env, rec["id"], "running")
    assert named and started and started[0]["ts"] < named[0]["ts"]
    from raylane.tracking import client_for

    client = client_for(uri)
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()],
                              f"tags.`raylane.workload_id` = '{rec['id']}'")
    assert len(runs) == 1
    hist = client.get_metric_history(runs[0].info.run_id, "loss")
    assert sorted(m.step for m in hist) == list(range(1, 61))


def test_raylane_submit_from_a_users_project_folder_uploads_it_as_the_jobs_working_dir(env):
    """`raylane submit SPEC` run in the user's project folder, as `ray job submit --working-dir .` would be: the
    code is checked there and the folder is the job's working directory on the cluster (before, the driver could
    not import the user's module: nothing was uploaded)."""
    import os

    path = write_spec(env, spec("cli-project", "team-b", "finetune", workers=1, gpu=1, cpu=1,
                                entrypoint="my_train:train_loop_per_worker",
                                config={"steps": 5, "checkpoint_every": 5}), "cli-project")
    token = operator_token(env)
    cli_env = {k: v for k, v in os.environ.items() if k not in ("RAYLANE_TOKEN", "RAYLANE_CREDENTIALS")}
    cli_env.update(RAY_ADDRESS=env["cluster"].address, RAY_API_SERVER_ADDRESS=env["dash"],
                   RAYLANE_MLFLOW_URI=env["uri"], **({"RAYLANE_TOKEN": token} if token else {}))
    proc = subprocess.run([str(Path(sys.executable).parent / "raylane"), "submit", str(path)], cwd=PROJECT,
                          env=cli_env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    job_id = next(line.split()[2] for line in proc.stdout.splitlines() if line.startswith("ray job "))
    env["jobs"].append(job_id)
    wid = record_of_job(env, job_id).id
    assert str(finished(env, job_id)).endswith("SUCCEEDED"), env["client"].get_job_logs(job_id)[-3000:]
    assert env["ctl"].explain(wid).state is State.SUCCEEDED
    assert mlflow_run(env, wid).info.status == "FINISHED"
