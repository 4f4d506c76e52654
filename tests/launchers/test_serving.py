"""Online inference reclaiming GPUs from preemptible training, end to end on a real local Ray cluster (logical GPUs).

One GPU node with 4 logical GPUs: the serving app (team-b, class serving) holds 1 for its one standing replica, and
team-a's pretraining gang holds the other 3 (team-a's 2 nominal, and 1 that team-b lends while it does not use it).
Both are submitted as Ray jobs running ``python -m raylane.run SPEC``. A bounded burst from a load generator on
localhost makes the serving driver want a second replica; team-b is within its nominal quota, so the core preempts
team-a's borrowing gang, which checkpoints and yields; the new replica serves; the burst ends, the replica goes after
the downscale delay, and the training resumes where it stopped and finishes. Every request is answered; no training
step is lost (MLflow's loss history has every step exactly once); the operator's metrics reach Prometheus.
"""
import json
import sys
import time
import urllib.request

import pytest

ray = pytest.importorskip("ray")

from raylane.control.client import State, start_control, stop_control  # noqa: E402
from raylane.jobs import with_credential  # noqa: E402
from raylane.launchers.serve import slot_resource  # noqa: E402
from tests import jobtest  # noqa: E402
from tests.jobtest import JOB_ENV  # noqa: E402
from tests.loadgen import LoadGen  # noqa: E402
from tests.raytest import (empty_store, free_port, local_policy, spec, start_cluster, stop_cluster,  # noqa: E402
                           wait_for, wait_while_progressing)

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.e2e]

TRAIN = {"max_steps": 1500, "checkpoint_every": 500, "batch_size": 8, "warmup_steps": 2, "eval_every": 0,
         "corpus": {"max_bytes": 200_000}, "model": {"d_model": 32, "n_layers": 1, "n_heads": 2, "context": 32}}
SHAPE = {"d_model": 32, "n_layers": 1, "n_heads": 2, "context": 32}
DOWNSCALE_DELAY = 6.0
# What every test job gets, and: `ray job stop` waits this long after SIGTERM, so the serving driver can drain and
# give its leases back.
ENV = {**JOB_ENV, "RAY_JOB_STOP_WAIT_TIME_S": "60"}


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    from ray import serve
    from ray.job_submission import JobSubmissionClient

    from workloads.train_lm import LocalHooks, train

    tmp = tmp_path_factory.mktemp("serving")
    # A small checkpoint of the LM for the replicas to load (pure torch, about a second).
    hooks = LocalHooks(tmp / "lm")
    train(dict(TRAIN, max_steps=4, checkpoint_every=4), hooks=hooks)
    cluster = start_cluster(gpu_nodes=(("gpu-a", ["gpu-sim"]),), gpus=4, cpus=4, dashboard=True)
    ray.init(address=cluster.address, namespace="raylane", log_to_driver=False)
    ctl = start_control(local_policy(pretrain={"min_runtime": "2s"}), str(tmp / "journal.db"), tick_s=0.2)
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    client = JobSubmissionClient("http://" + ray._private.worker.get_dashboard_url())
    yield {"ctl": ctl, "client": client, "tmp": tmp, "port": port, "checkpoint": hooks.latest_checkpoint(),
           "address": cluster.address,
           "uri": empty_store(tmp / "mlflow.db"), "storage": str(tmp / "runs")}
    for job in client.list_jobs():
        if job.submission_id and not job.status.is_terminal():
            client.stop_job(job.submission_id)
    try:
        serve.shutdown()
    except Exception:  # noqa: BLE001 - already gone
        pass
    stop_control()
    stop_cluster(cluster)


def serve_spec(env) -> dict:
    return {
        "name": "lm", "team": "team-b", "class": "serving", "kind": "serve",
        "serve": {
            "model": {"deployment": "workloads.serve_lm:LMServer",
                      "args": {"checkpoint": env["checkpoint"], "max_new_tokens": 8, "token_delay_ms": 20}},
            "route_prefix": "/lm",
            "replica": {"resources": {"gpu": 1, "cpu": 0.5}, "max_ongoing_requests": 32},
            "autoscaling": {"min_replicas": 1, "max_replicas": 2, "target_ongoing_requests": 2,
                            "upscale_delay": "1s", "downscale_delay": DOWNSCALE_DELAY},
            "latency_objective_ms": 2000,
        },
        "run": {"intent": "test: serve the LM through a burst", "owner": "pytest"},
    }


def submit_job(env, s, name):
    import yaml

    path = env["tmp"] / f"{name}.yaml"
    path.write_text(yaml.safe_dump(s))
    # The driver acts as the operator that started the control plane; its token travels as a py_modules entry.
    return env["client"].submit_job(
        entrypoint=f"{sys.executable} -m raylane.run {path} --storage-path {env['storage']} "
                   f"--tracking-uri {env['uri']}",
        runtime_env=with_credential({"env_vars": {**ENV, "RAY_ADDRESS": env["address"]}},
                                    env["ctl"].credential.token))


def record_of_job(env, job_id):
    # Replica leases carry their app's job id once held; find_job answers the first record of the job, the app's own,
    # queued before any of its replicas.
    try:
        return jobtest.record_of_job(env, job_id)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{job_log(env, job_id)}") from None


def job_log(env, job_id) -> str:
    c = env["client"]
    return f"job {job_id} {c.get_job_status(job_id)}; its log ends:\n{c.get_job_logs(job_id)[-3000:]}"


def job_ended(env, job_id, timeout=240):
    return wait_for(lambda: (s := env["client"].get_job_status(job_id)).is_terminal() and s, timeout=timeout,
                    every=0.25, what=f"job {job_id} to end")


def loss_steps(env, wid):
    from raylane.tracking import client_for

    client = client_for(env["uri"])  # under the store's init lock: the job's tracker may be creating the tables
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()],
                              f"tags.`raylane.workload_id` = '{wid}'")
    if not runs:
        return []
    return sorted(m.step for m in client.get_metric_history(runs[0].info.run_id, "loss"))


def journal(env, wid, kind):
    return [e for e in env["ctl"].explain(wid)["journal"] if e["kind"] == kind]


def replica_leases(env):
    return sorted((r for r in env["ctl"].queue(include_done=True) if r.id.startswith("lm-replica-")),
                  key=lambda r: int(r.id.split("-")[2]))


def slots():
    """The app's slot resource in the cluster (one GPU node): how many replicas Ray may place."""
    return ray.cluster_resources().get(slot_resource("lm"), 0.0)


def scrape(name: str) -> str:
    """The Prometheus lines of ``name`` from every node's metrics export port (Ray adds the ``ray_`` prefix)."""
    lines = []
    for n in ray.nodes():
        if not n["Alive"]:
            continue
        try:
            with urllib.request.urlopen(f"http://{n['NodeManagerAddress']}:{n['MetricsExportPort']}/metrics",
                                        timeout=5) as r:
                lines += [ln for ln in r.read().decode().splitlines() if ln.startswith("ray_" + name)]
        except OSError:
            pass
    return "\n".join(lines)


def ask(url):
    req = urllib.request.Request(url, data=json.dumps({"prompt": "import "}).encode(), method="POST")
    with urllib.request.urlopen(req, timeout=30) as r:
        return r.status, json.loads(r.read())


@pytest.fixture
def explain_failure(env, request):
    """On failure, print the queue and the tail of every job's log."""
    yield
    rep = getattr(request.node, "rep_call", None)
    if rep is None or rep.passed:
        return
    print("\n--- queue ---")
    for r in env["ctl"].queue(include_done=True):
        print(r)
    for job in env["client"].list_jobs():
        if job.submission_id:
            print(f"\n--- {job_log(env, job.submission_id)}")


def test_burst_reclaims_gpus_from_training_and_gives_them_back(env, explain_failure):
    ctl, url = env["ctl"], f"http://127.0.0.1:{env['port']}/lm"
    t0 = time.time()
    # 1. The serving app: one standing replica on one GPU, loaded from the checkpoint.
    s_job = submit_job(env, serve_spec(env), "serve")
    app = record_of_job(env, s_job)["id"]
    status, out = wait_for(lambda: _try(ask, url), timeout=120, what="the LM answering")
    assert status == 200 and out["new_tokens"] == 8
    wait_for(lambda: slots() == 1.0, timeout=10, what="one slot open")
    # 2. Training takes every other GPU: team-a's gang of 3 (2 nominal + 1 borrowed from team-b).
    t_job = submit_job(env, spec("pre-a", "team-a", "pretrain", workers=1, gpu=3, cpu=1, config=TRAIN), "pre-a")
    tr = record_of_job(env, t_job)["id"]
    wait_for(lambda: len(loss_steps(env, tr)) >= 20, timeout=120, what="training past step 20")
    assert ray.available_resources().get("GPU", 0) == 0
    t_burst = time.time()

    # 3. The burst: 6 closed-loop clients against a target of 2 ongoing per replica want 3 replicas (max 2).
    gen = LoadGen(url, clients=6, max_requests=3000, deadline_s=150, timeout_s=120).start()
    try:
        wait_for(lambda: ctl.status(tr)["preemptions"] == 1, timeout=60, what="training preempted")
        first = out["replica"]
        wait_for(lambda: sum(n for r, n in gen.replicas().items() if r != first) >= 20, timeout=90,
                 what="the new replica serving 20 requests")
    finally:
        results = gen.stop()
    t_end = time.time()
    assert len(results) == gen.sent
    assert [r for r in results if r.status != 200] == [], "every request is answered"
    assert len(gen.replicas()) == 2

    # The replica's lease was admitted only once the training had yielded its GPUs: a reclaim.
    leases = replica_leases(env)
    assert [r["id"].rsplit("-", 1)[0] for r in leases] == ["lm-replica-0", "lm-replica-1"]
    new = leases[1]["id"]
    preempting = journal(env, tr, "preempting")
    assert len(preempting) == 1 and new in preempting[0]["reason"]
    yielded = journal(env, tr, "requeued")[0]
    assert "yielded" in yielded["note"]
    assert journal(env, new, "admitted")[0]["ts"] >= yielded["ts"]
    events = [e.get("note", "") for e in ctl.explain(app)["journal"]]
    assert any(f"reclaimed 3 GPU(s) from {tr}" in n for n in events), events

    # 4. The burst is over: the replica goes back after the downscale delay, and the training resumes.
    wait_for(lambda: ctl.status(new).state is State.SUCCEEDED, timeout=60, what="the new replica released")
    held_s = journal(env, new, "finished")[0]["ts"] - journal(env, new, "running")[0]["ts"]
    assert held_s >= DOWNSCALE_DELAY, "a reclaimed GPU is not handed back before the downscale delay"
    wait_for(lambda: slots() == 1.0, timeout=10, what="the second slot closed")
    wait_for(lambda: ctl.status(tr).state is State.RUNNING, timeout=60, what="training admitted again")
    # What is left of its 1,500 steps: a minute alone, several beside the suite's other module; waited on while it
    # moves on.
    ended = wait_while_progressing(lambda: (s := env["client"].get_job_status(t_job)).is_terminal() and s,
                                   lambda: len(loss_steps(env, tr)), stall=120, every=3,
                                   what=f"job {t_job} to end")
    assert str(ended).endswith("SUCCEEDED")
    rec = ctl.status(tr)
    assert rec.state is State.SUCCEEDED and rec["preemptions"] == 1 and rec["restarts"] == 0
    # 0 steps lost: every step logged exactly once, none re-run after the resume.
    assert loss_steps(env, tr) == list(range(1, TRAIN["max_steps"] + 1))

    # The operator's metrics, as Prometheus scrapes them from the serving driver's node.
    text = wait_for(lambda: (t := scrape("raylane_serve_")) and 'path="reclaim"' in t and t, timeout=60,
                    what="serving metrics exported")
    assert 'ray_raylane_serve_reclaims_total{' in text and 'victim_team="team-a"' in text
    assert 'ray_raylane_serve_replicas_running{' in text and 'ray_raylane_serve_replicas_wanted{' in text
    assert 'ray_raylane_serve_demand_to_serving_seconds_bucket{' in text

    # 5. Stopping the serving job drains it and gives every lease back.
    env["client"].stop_job(s_job)
    job_ended(env, s_job, timeout=90)
    assert ctl.status(app).state is State.SUCCEEDED
    assert all(r.state is State.SUCCEEDED for r in replica_leases(env))
    wait_for(lambda: slots() == 0.0, timeout=10, what="slots closed")
    print(f"\n[serving e2e] burst {t_end - t_burst:.1f}s, {len(results)} requests, yielded at step "
          f"{yielded.get('step')}, replica held {held_s:.1f}s, total {time.time() - t0:.1f}s")


def _try(fn, *args):
    try:
        return fn(*args)
    except Exception:  # noqa: BLE001 - not up yet
        return None
