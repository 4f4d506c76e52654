"""A data scientist's own Ray Train loop, submitted from its project folder with plain Ray jobs
(``--working-dir``): unchanged, it is queued under its team's quota, preempted by a higher class at its next
checkpoint, requeued and resumed from that checkpoint with no reported step repeated or lost; a loop that asks
``raylane.train.should_yield()`` yields at the step it is asked; a bad entrypoint is refused before it queues.
One cluster for the module (tests/jobtest.py)."""
import sys
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from raylane.control.client import State  # noqa: E402
from tests.jobtest import (finish_lease, finished, metric_history, module_env, placed,  # noqa: E402
                           reclaiming_lease, record_of_job, submit_job)
from tests.raytest import spec, wait_for  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.slow]

PROJECT = Path(__file__).parents[1] / "data" / "user_project"


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    yield from module_env(tmp_path_factory, "userloop",
                          pretrain={"min_runtime": "1s", "grace_period": "60s", "retry_budget": 1})


def reference(steps):
    sys.path.insert(0, str(PROJECT))
    try:
        from my_train import reference_losses
    finally:
        sys.path.remove(str(PROJECT))
    return reference_losses(steps)


def last_step(env, wid):
    return (metric_history(env, wid, "loss", must=False)[1] or [(0, 0)])[-1][0]


@pytest.mark.e2e
def test_an_unchanged_ray_train_loop_yields_at_its_next_checkpoint_and_resumes_exactly(env):
    # Long enough (~40 s alone) that the preemption lands well before the end on a loaded machine.
    steps, every, report_every = 400, 20, 4
    a_job = submit_job(env, spec("user-a", "team-a", "pretrain", workers=1, gpu=4, cpu=1,
                                 entrypoint="my_train:train_loop_per_worker",
                                 config={"steps": steps, "checkpoint_every": every, "report_every": report_every,
                                         "sleep_s": 0.05}),
                       "user-a", working_dir=PROJECT)
    a = record_of_job(env, a_job)["id"]
    wait_for(lambda: last_step(env, a) >= 24, timeout=180, what="the user's loop past step 24")
    b = reclaiming_lease(env, "user-b")  # team-b's finetune reclaims the 2 GPUs it lent
    wait_for(lambda: env["ctl"].status(a)["preemptions"] == 1, timeout=120, what="A preempted")
    placed(env, b)
    finish_lease(env, b)
    assert str(finished(env, a_job)).endswith("SUCCEEDED")
    ra = env["ctl"].explain(a)
    assert ra.state is State.SUCCEEDED and ra["preemptions"] == 1 and ra["restarts"] == 0
    requeued = [e for e in ra["journal"] if e["kind"] == "requeued"]
    assert len(requeued) == 1 and "yielded" in requeued[0]["note"], requeued
    yielded_at = requeued[0].get("step")
    assert yielded_at is not None and yielded_at % every == 0, requeued  # at a report that carried a checkpoint
    assert yielded_at < steps
    run, hist = metric_history(env, a, "loss")
    # Nothing reported after the checkpoint it yielded at, so no step is repeated or lost across the resume.
    reported = list(range(report_every, steps + 1, report_every))
    assert [s for s, _ in hist] == reported
    ref = reference(steps)
    assert [v for _, v in hist] == pytest.approx([ref[s] for s in reported], rel=1e-6)
    assert run.data.tags["raylane.preemptions"] == "1"
    assert run.info.status == "FINISHED"


@pytest.mark.e2e
def test_a_loop_that_asks_should_yield_stops_at_the_current_step(env):
    a_job = submit_job(env, spec("polite-a", "team-a", "pretrain", workers=1, gpu=4, cpu=1,
                                 entrypoint="polite_train:train_loop_per_worker", config={"steps": 4000}),
                       "polite-a", working_dir=PROJECT)
    a = record_of_job(env, a_job)["id"]
    wait_for(lambda: last_step(env, a) >= 10, timeout=180, what="the polite loop past step 10")
    b = reclaiming_lease(env, "polite-b")
    wait_for(lambda: env["ctl"].status(a)["preemptions"] == 1, timeout=120, what="A preempted")
    requeued = wait_for(lambda: [e for e in env["ctl"].explain(a)["journal"] if e["kind"] == "requeued"],
                        timeout=60, what="A requeued")
    assert "yielded" in requeued[0]["note"]
    placed(env, b)
    env["ctl"].cancel(a)
    finish_lease(env, b)
    finished(env, a_job)
    _, hist = metric_history(env, a, "loss")
    yielded_at = requeued[0]["step"]
    # It yielded where it was asked, not at a multiple of 5 (its reporting cadence) unless by chance.
    assert yielded_at in [s for s, _ in hist]
    assert len({s for s, _ in hist}) == len(hist)  # no step logged twice


def test_a_bad_entrypoint_is_refused_before_it_queues_naming_it(env):
    # Every kind of bad entrypoint is covered without Ray in tests/launchers/test_entrypoints.py; here the driver's
    # path.
    entry, why = "my_train:two_arguments", "needs 2 arguments"
    job = submit_job(env, spec("bad-entry", "team-a", "pretrain", workers=1, gpu=1, cpu=1, entrypoint=entry,
                               config={"steps": 2, "checkpoint_every": 1}), "bad-entry", working_dir=PROJECT)
    assert str(finished(env, job, timeout=120)).endswith("FAILED")
    logs = env["client"].get_job_logs(job)
    assert f"entrypoint: got '{entry}'" in logs and why in logs, logs[-2000:]
    assert env["ctl"].find_job(job) is None  # never queued
