"""Elastic gangs on a real local cluster (issue 15): the control actor carries out the core's ``Resize`` decisions
through a checkpoint, and the training driver restarts Ray Train at the new size on the nodes the core chose.

One scenario, as a user would see it, on 4 logical GPUs: an elastic pretraining gang ({min: 1, max: 2}, two GPUs a
worker) starts at 1 worker beside another team's lease, grows to 2 when that lease is cancelled, shrinks to 1 when a
higher class of its own team arrives (which then runs), and grows back when it leaves. (Two GPUs a worker: the same
GPU counts as {min: 2, max: 4} of one, with half the worker processes to start on a 2-core test machine.) Its MLflow
run has every step's loss once, the worker count as a metric and each resize as an event; its journal and ``raylane
explain`` give each reason."""
import pytest

ray = pytest.importorskip("ray")

from raylane.control.client import State  # noqa: E402
from tests.jobtest import (finished, metric_history, mlflow_run, module_env, placed,  # noqa: E402
                           record_of_job, submit_job)
from tests.raytest import spec, wait_for  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.e2e]

# Stop requests are heard at checkpoints. The gang holds at its checkpoints of steps 20, 40 and 60 until it is asked
# to stop (config.fault.hold_at_steps), so it is still training when the test changes the cluster around it,
# however fast the machine: at 1 worker until the other team's lease goes, at 2 until the finetune arrives, at 1
# until the finetune has gone. (Paced by the Train controller alone, it once ran all its steps while the finetune
# ran, and finished before it could grow back.)
TRAIN = {"checkpoint_every": 10, "report_every": 1, "batch_size": 4, "warmup_steps": 2, "eval_every": 0,
         "corpus": {"max_bytes": 200_000}, "model": {"d_model": 32, "n_layers": 1, "n_heads": 2, "context": 32}}
HOLDS = [20, 40, 60]
STEPS = 80


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    # A resize asked while the gang is still starting at its new size is heard at its first checkpoint there: on a
    # busy machine that can be over the local policy's 20 s grace period, which would stop it by force.
    yield from module_env(tmp_path_factory, "elastic", scheduler={"resize_interval": "5s"},
                          pretrain={"grace_period": "120s"})


def elastic(name, **config):
    # The same 8 windows a step at 1 or 2 workers (workloads.train_lm: global_batch).
    s = spec(name, "team-a", "pretrain", gpu=2, cpu=0.5, config=dict(TRAIN, global_batch=8, **config))
    s["gang"]["workers"] = {"min": 1, "max": 2}
    return s


def resizes(env, wid):
    return [(e["from_workers"], e["to_workers"], e["reason"]) for e in env["ctl"].explain(wid)["journal"]
            if e["kind"] == "resizing"]


def running_at(env, wid, workers, done):
    rec = env["ctl"].status(wid)
    return rec.state is State.RUNNING and rec["resizes"] == done and len(rec["placement"]) == workers


def checkpointed_after(env, wid, step):
    # The gang has trained and checkpointed past ``step`` at its size now (each resize then starts from a step of
    # its own, as a gang that has been running would; one right after a start yields at its first checkpoint).
    return (env["ctl"].status(wid)["step"] or 0) > step


def test_grows_into_freed_gpus_shrinks_for_a_higher_class_and_grows_back(env):
    ctl = env["ctl"]
    # Another team's workload holds 2 of the 4 GPUs: its lease, with its reservation placed, until it is cancelled
    # (queued with the control actor directly: a gang of its own would only add the start-up of another job).
    other = ctl.submit(spec("other-b", "team-b", "pretrain", gpu=2, cpu=0.5, config=dict(TRAIN, max_steps=10_000))).id
    placed(env, other, timeout=60)

    job = submit_job(env, elastic("elastic-a", max_steps=STEPS, fault={"hold_at_steps": HOLDS}), "elastic-a")
    wid = record_of_job(env, job)["id"]
    wait_for(lambda: running_at(env, wid, 1, 0), timeout=120, what="the elastic gang running at 1 worker")
    wait_for(lambda: checkpointed_after(env, wid, 0), timeout=120, what="the gang's checkpoint at 1 worker")

    # The other job leaves: the gang grows into its GPUs once it has run the resize interval.
    ctl.cancel(other)
    wait_for(lambda: running_at(env, wid, 2, 1), timeout=120, what="the elastic gang grown to 2 workers")
    grown_at = env["ctl"].status(wid)["step"] or 0
    wait_for(lambda: checkpointed_after(env, wid, grown_at), timeout=120, what="the gang's checkpoint at 2 workers")

    # A higher class of the same team arrives; the team is at its quota ceiling (4 GPUs): the gang shrinks.
    ft_job = submit_job(env, spec("ft-a", "team-a", "finetune", gpu=2, cpu=0.5, config=dict(TRAIN, max_steps=20)),
                        "ft-a")
    ft = record_of_job(env, ft_job)["id"]
    assert str(finished(env, ft_job)).endswith("SUCCEEDED")
    # ... and grows back once it has gone.
    assert str(finished(env, job, timeout=300)).endswith("SUCCEEDED")

    rec = ctl.explain(wid)
    journal = [(round(e["ts"], 1), e["kind"], e.get("note", "")) for e in rec["journal"]]
    got = resizes(env, wid)
    assert [(a, b) for a, b, _ in got] == [(1, 2), (2, 1), (1, 2)], journal
    assert got[0][2].startswith("grows from 1 to 2 workers (maximum 2) into free capacity"), got[0]
    assert f"to free quota for {ft} (team-a/finetune" in got[1][2] or \
        f"to free capacity for {ft} (team-a/finetune" in got[1][2], got[1]
    assert got[2][2].startswith("grows from 1 to 2 workers"), got[2]
    assert rec["resizes"] == 3 and rec["preemptions"] == 0 and rec["restarts"] == 0, journal
    assert not [e for e in rec["journal"] if e["kind"] == "requeued"], journal
    # Each resize restarted from the checkpoint the gang saved when asked: on the nodes the core chose.
    done = [e for e in rec["journal"] if e["kind"] == "resized"]
    assert [len(e["placement"]) for e in done] == [2, 1, 2], journal
    assert all("yielded at step" in e["note"] for e in done), [(e.get("step"), e["note"]) for e in done]

    # The higher class ran once the gang had shrunk, and was never rolled back or preempted.
    rf = ctl.explain(ft)
    admitted = next(e["ts"] for e in rf["journal"] if e["kind"] == "admitted")
    assert admitted >= done[1]["ts"], (journal, rf["journal"])
    assert not [e for e in rf["journal"] if e["kind"] == "requeued"], rf["journal"]

    # MLflow: every step's loss once (no step lost or run twice across three restarts), the worker count as a
    # metric (a step function), each resize as an event.
    run, hist = metric_history(env, wid)
    assert [s for s, _ in hist] == list(range(1, STEPS + 1))
    _, workers = metric_history(env, wid, "workers")
    assert [int(v) for _, v in workers] == [1, 2, 1, 2], workers
    assert [s for s, _ in workers] == [0] + [e["step"] for e in done], (workers, done)
    assert run.data.tags["raylane.resizes"] == "3"
    assert mlflow_run(env, wid).data.tags["raylane.last_event"].startswith("finished")
