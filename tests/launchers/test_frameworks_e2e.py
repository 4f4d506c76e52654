"""The framework examples end to end, as a user runs them: examples/user-code/lightning-digits (Ray Train's
Lightning utilities) and examples/user-code/transformers-gpt2 (a Transformers ``Trainer`` with Ray's callback), each
submitted with its project folder as the Ray job's working dir, preempted once by a higher-class workload (a
fine-tune lease of team-b: tests/jobtest.py), resumed from the checkpoint it yielded at, and finished: no step
reported twice, one MLflow run. One cluster for the module (tests/jobtest.py).

Each first attempt holds at a checkpointed report (``config.fault.hold_at_step``, a platform drill the loop never
sees) until it is asked to stop, so the preemption lands at a known step however fast or slow the machine is."""
from pathlib import Path

import pytest
import yaml

ray = pytest.importorskip("ray")
pytest.importorskip("lightning")
pytest.importorskip("transformers")

from raylane.control.client import State  # noqa: E402
from tests.jobtest import (finish_lease, finished, metric_history, module_env, placed,  # noqa: E402
                           reclaiming_lease, record_of_job, submit_job)
from tests.raytest import wait_for  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.e2e]


USER_CODE = Path(__file__).resolve().parents[2] / "examples" / "user-code"


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    yield from module_env(tmp_path_factory, "frameworks",
                          pretrain={"min_runtime": "1s", "grace_period": "60s", "retry_budget": 1})


def example_spec(example: str, name: str, *, team: str, cls: str, gpu: int, config: dict) -> dict:
    """The example's own spec.yaml, renamed, with a one-worker gang and a short config."""
    s = yaml.safe_load((USER_CODE / example / "spec.yaml").read_text())
    s.update(name=name, team=team, **{"class": cls})
    s["gang"] = {"workers": 1, "resources": {"gpu": gpu, "cpu": 1}}
    s["config"] = {**s["config"], **config}
    s.pop("runtime_estimate", None)
    return s


def preempted_once_and_finished(env, example: str, name: str, config: dict, hold_at: int, expected_steps):
    """Run ``example`` as team-a's pretraining on all 4 GPUs (2 borrowed from team-b), holding at step ``hold_at``
    until team-b's fine-tune reclaims its quota; check it yields there once, resumes and finishes."""
    a_spec = example_spec(example, name, team="team-a", cls="pretrain", gpu=4,
                          config={**config, "fault": {"hold_at_step": hold_at}})
    a_job = submit_job(env, a_spec, name, working_dir=USER_CODE / example)
    a = record_of_job(env, a_job).id
    wait_for(lambda: hold_at in [s for s, _ in metric_history(env, a, "loss", must=False)[1]], timeout=300,
             every=0.5, what=f"{name} holding at step {hold_at}")
    b = reclaiming_lease(env, f"{name}-b")
    placed(env, b, timeout=300)
    finish_lease(env, b)
    assert str(finished(env, a_job, timeout=300)).endswith("SUCCEEDED")

    ra = env["ctl"].explain(a)
    assert ra.state is State.SUCCEEDED and ra["preemptions"] == 1 and ra["restarts"] == 0, ra["journal"]
    requeued = [e for e in ra["journal"] if e["kind"] == "requeued"]
    assert len(requeued) == 1 and "yielded" in requeued[0]["note"] and requeued[0].get("step") == hold_at, requeued
    run, hist = metric_history(env, a, "loss")
    steps = [s for s, _ in hist]
    # Every report once: the steps after the resume continue from the checkpoint, none repeated.
    assert steps == list(expected_steps), hist
    assert run.data.tags["raylane.preemptions"] == "1"
    assert run.info.status == "FINISHED"
    rb = env["ctl"].explain(b)
    assert rb.state is State.SUCCEEDED and not [e for e in rb["journal"] if e["kind"] == "requeued"], rb["journal"]
    return hist


def test_lightning_example_is_preempted_once_resumes_and_finishes(env):
    # One worker, 64 per batch: 1437 training images make 22 steps an epoch; each epoch ends with a checkpoint.
    hist = preempted_once_and_finished(env, "lightning-digits", "lit-a", {"max_epochs": 3, "batch_size": 64},
                                       hold_at=22, expected_steps=[22, 44, 66])
    assert hist[-1][1] < hist[0][1]  # the epoch's training loss went down across the resume


def test_transformers_example_is_preempted_once_resumes_and_finishes(env):
    config = {"max_steps": 40, "save_steps": 10, "log_every": 10, "batch_size": 8, "corpus_bytes": 30_000}
    hist = preempted_once_and_finished(env, "transformers-gpt2", "hf-a", config, hold_at=10,
                                       expected_steps=[10, 20, 30, 40])
    assert hist[-1][1] < hist[0][1]
