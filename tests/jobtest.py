"""End-to-end helpers through Ray's jobs API: a module-scoped environment (a local cluster with logical GPUs, the
control actor, a jobs client, a sqlite MLflow store) and the calls tests make on it. Shared by every e2e module
that submits workloads as a user would (``python -m raylane.run SPEC`` as a Ray job).

The control plane runs with authentication on, as `raylane up` starts it: ``env["ctl"]`` is the operator's client
(``start_control``'s bootstrap token), and every job's driver gets a credential the documented way
(``raylane.jobs.with_credential``: a ``py_modules`` entry), the operator's unless a test passes another token."""
from __future__ import annotations

import os
import sys
from typing import Any, Dict, Optional

import ray

from raylane.control.client import ControlClient, WorkloadView, start_control, stop_control
from tests.raytest import empty_store, local_policy, start_cluster, stop_cluster, wait_for

# What every test job's driver gets: no auth (a test cluster), a fast Train controller, no drain watcher.
JOB_ENV = {"RAY_AUTH_MODE": "disabled", "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.2",
           "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0"}


def job_env(env, **more: str) -> Dict[str, str]:
    """``JOB_ENV`` for a job of ``env``'s cluster, with its address: Ray Train's placement-group cleaner (an actor of
    the job) asks Ray's state API about its controller, which finds the cluster by address, and with two clusters on
    the machine (`make test` runs two modules at once) and no address it fails ("Found multiple active Ray
    instances") and stops watching."""
    return {**JOB_ENV, "RAY_ADDRESS": env["cluster"].address, **more}


def start_env(tmp, *, policy: Optional[dict] = None, gpu_nodes=(("gpu-a", ["gpu-sim", "nvlink"]),), gpus: int = 4,
              cpus: int = 4) -> Dict[str, Any]:
    """Cluster, control actor and jobs client; stop with ``stop_env``."""
    from ray.job_submission import JobSubmissionClient

    from raylane.jobs import wait_ready

    cluster = start_cluster(gpu_nodes=gpu_nodes, gpus=gpus, cpus=cpus, dashboard=True)
    try:
        ray.init(address=cluster.address, namespace="raylane", log_to_driver=False)
        ctl = start_control(policy or local_policy(), str(tmp / "journal.db"), tick_s=0.2)
        dash = "http://" + ray._private.worker.get_dashboard_url()
        client = JobSubmissionClient(dash)
        wait_ready(client)
    except BaseException:
        stop_cluster(cluster)
        raise
    return {"cluster": cluster, "ctl": ctl, "client": client, "dash": dash, "tmp": tmp,
            "uri": empty_store(tmp / "mlflow.db"), "storage": str(tmp / "runs"), "jobs": []}


def module_env(tmp_path_factory, name: str, scheduler: Optional[dict] = None, **class_overrides):
    """For a module-scoped ``env`` fixture: ``yield from module_env(tmp_path_factory, "x", pretrain={...})``, the
    classes of ``local_policy`` overridden as given (and its ``scheduler`` settings, if given). Job logs of a
    failed test are printed by conftest."""
    policy = local_policy(**class_overrides)
    policy["scheduler"].update(scheduler or {})
    env = start_env(tmp_path_factory.mktemp(name), policy=policy)
    try:
        yield env
    finally:
        stop_env(env)


def stop_env(env) -> None:
    stop_control()
    stop_cluster(env["cluster"])


def write_spec(env, s: dict, name: str):
    import yaml

    path = env["tmp"] / f"{name}.yaml"
    path.write_text(yaml.safe_dump(s))
    return path


def submit_job(env, s: dict, name: str, *, working_dir: Optional[str] = None, env_vars: Optional[dict] = None,
               token: Optional[str] = None) -> str:
    """Submit ``s`` as ``python -m raylane.run SPEC`` (a plain Ray job); ``working_dir`` is uploaded with it. Its
    driver acts with ``token`` (default: the operator's; ``""``: none), sent with the job by
    ``raylane.jobs.with_credential``."""
    from raylane.jobs import submit_job as submit
    from raylane.jobs import with_credential

    path = write_spec(env, s, name)
    runtime_env: Dict[str, Any] = {"env_vars": job_env(env, **(env_vars or {}))}
    if working_dir:
        runtime_env["working_dir"] = str(working_dir)
    runtime_env = with_credential(runtime_env, token if token is not None else operator_token(env))
    job = submit(env["client"],
                 entrypoint=f"{sys.executable} -m raylane.run {path} --storage-path {env['storage']} "
                            f"--tracking-uri {env['uri']}",
                 runtime_env=runtime_env)
    env["jobs"].append(job)
    return job


def operator_token(env) -> Optional[str]:
    """The operator's token (None when the control plane runs without authentication)."""
    ctl: ControlClient = env["ctl"]
    return ctl.credential.token if ctl.credential is not None else None


def record_of_job(env, job_id: str, timeout: float = 240) -> WorkloadView:
    """The workload job ``job_id``'s driver submitted, once it has: one call a poll (``find_job``), not one for each
    workload queued. Its driver's start took 68 s in a fresh-clone CI run, on a machine the suite had at a load
    average of 20 and more (the wait was 60 s)."""
    return wait_for(lambda: env["ctl"].find_job(job_id), timeout=timeout, what=f"workload of job {job_id}")


def finished(env, job_id: str, timeout: float = 240):
    from ray.job_submission import JobStatus

    return wait_for(lambda: (s := env["client"].get_job_status(job_id)) in
                    (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED) and s, timeout=timeout,
                    every=0.25, what=f"job {job_id} to end")


def mlflow_run(env, wid: str, must: bool = True):
    """The one MLflow run of workload ``wid`` (None when ``must`` is false and there is none yet)."""
    from raylane.tracking import client_for

    client = client_for(env["uri"])
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()],
                              f"tags.`raylane.workload_id` = '{wid}'")
    if not runs and not must:
        return None
    assert len(runs) == 1, f"one MLflow run for {wid}, found {len(runs)}"
    return runs[0]


def metric_history(env, wid: str, key: str = "loss", must: bool = True):
    """(run, [(step, value), ...] sorted by step, then by when each was logged) of ``key`` in workload ``wid``'s
    run: an elastic gang that resizes twice at one step has its ``workers`` at that step in the order they ran."""
    from raylane.tracking import client_for

    run = mlflow_run(env, wid, must)
    if run is None:
        return None, []
    hist = client_for(env["uri"]).get_metric_history(run.info.run_id, key)
    return run, [(m.step, m.value) for m in sorted(hist, key=lambda m: (m.step, m.timestamp))]


def print_job_logs_on_failure(request, env) -> None:
    """For an autouse fixture: after a failed test, print the tail of each job's logs."""
    rep = getattr(request.node, "rep_call", None)
    if rep is not None and rep.failed:
        tail = int(os.environ.get("RAYLANE_TEST_LOG_CHARS", "4000"))  # more of each job's log, when debugging
        for job in env["jobs"]:
            print(f"----- logs of {job} -----\n" + env["client"].get_job_logs(job)[-tail:])
        # Once more after the logs: a CI excerpt that shows only the tail of the output still names the failure.
        crash = getattr(rep.longrepr, "reprcrash", None)
        if crash is not None:
            print(f"----- the failure: {crash.path}:{crash.lineno} -----\n{crash.message[:tail]}")
    env["jobs"].clear()


__all__ = ["JOB_ENV", "job_env", "start_env", "module_env", "stop_env", "write_spec", "submit_job", "operator_token",
           "record_of_job", "finished", "mlflow_run", "metric_history", "print_job_logs_on_failure", "local_policy",
           "wait_for"]


def reference_losses(config) -> Dict[int, float]:
    """Step -> loss of the reference LM trained in this process, uninterrupted (one worker)."""
    import tempfile

    from workloads.train_lm import LocalHooks, train

    losses = {}

    class Rec(LocalHooks):
        def report(self, step, metrics):
            losses[step] = metrics["loss"]

    with tempfile.TemporaryDirectory() as d:
        train(config, hooks=Rec(d))
    return losses


def reclaiming_lease(env, name: str, *, team: str = "team-b", cls: str = "finetune", gpu: float = 2) -> str:
    """A workload of ``team`` queued with the control actor directly, with no Ray job behind it: the preemptor of a
    preemption test. Its admission preempts what holds the quota it reclaims, as a gang's would, and its reservation
    (a placement group of its GPUs) is placed only once the victim's gang has really let them go (``placed``); end it
    with ``finish_lease``. A preemptor training a gang of its own would add only that gang's start-up: about 20
    CPU-seconds, on a 2-core machine that runs the suite's Ray modules two at a time."""
    from tests.raytest import spec

    return env["ctl"].submit(spec(name, team, cls, gpu=gpu, cpu=1)).id


def placed(env, wid: str, timeout: float = 120) -> None:
    """Wait until ``wid``'s reservation is placed: Ray holds its placement group on GPUs that are free."""
    wait_for(lambda: env["ctl"].wait_admission(wid, 1.0).ready, timeout=timeout, what=f"{wid}'s reservation placed")


def finish_lease(env, wid: str) -> None:
    """End a ``reclaiming_lease`` as a finished workload does (its GPUs and placement group go back)."""
    from raylane.control.client import Outcome

    env["ctl"].release(wid, Outcome.FINISHED)
