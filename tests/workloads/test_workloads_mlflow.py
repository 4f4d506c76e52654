"""workloads.mlflow_log: the reference LM's per-step metrics in the run MLflow names (MLFLOW_RUN_ID), against a
real MLflow sqlite store (no Ray), and a real short training run across a yield and a resume."""
from __future__ import annotations

import pickle
from typing import Mapping, Optional

import pytest
from mlflow import MlflowClient

from raylane.tracking import RunTracker
from workloads.errors import ConfigError
from workloads.mlflow_log import StepLogger, from_environment
from workloads.train_lm import LocalHooks, TrainHooks, train

SPEC = {"name": "pretrain-tiny-lm", "team": "team-a", "class": "batch", "kind": "train",
        "gang": {"workers": 1, "resources": {"gpu": 1, "cpu": 1}},
        "run": {"intent": "step logger tests", "owner": "alice", "code_version": "abc123"}}
# As in tests/workloads/test_workloads.py, with a small corpus: a step takes ~10 ms on two cores.
SMALL = {"batch_size": 8, "num_threads": 2, "model": {"d_model": 32}, "corpus": {"max_bytes": 100_000}}


def client(uri: str) -> MlflowClient:
    return MlflowClient(tracking_uri=uri)


def steps(uri: str, run_id: str, key: str = "loss") -> list[int]:
    return [m.step for m in sorted(client(uri).get_metric_history(run_id, key), key=lambda m: (m.step, m.timestamp))]


class FakeRunner(TrainHooks):
    """Inner hooks that record what reached them."""

    def __init__(self, rank: int = 0):
        self.world_rank = rank
        self.calls: list[tuple] = []

    def report(self, step: int, metrics: Mapping[str, float]) -> None:
        self.calls.append(("report", step))

    def save_checkpoint(self, dir_path: Optional[str], step: int, metrics: Mapping[str, float]) -> None:
        self.calls.append(("save", step))


def metrics(loss: float) -> dict[str, float]:
    return {"loss": loss, "lr": 1e-3, "step_time_s": 0.01, "samples_per_s": 800.0}


def started(uri: str, spec=SPEC) -> RunTracker:
    t = RunTracker(workload_id="pretrain-tiny-lm-1a2b3c", spec=spec, tracking_uri=uri)
    t.start()
    return t


def test_rank0_logs_against_global_steps_and_a_resume_adds_no_duplicates(uri):
    run_id = started(uri).run_id
    # Attempt 1: checkpoint at step 4, metrics up to 6 written, then the worker dies.
    first = StepLogger(FakeRunner(), run_id=run_id, tracking_uri=uri, flush_every=20)
    for step in range(1, 7):
        first.report(step, metrics(float(step)))
        if step == 4:
            first.save_checkpoint(None, step, metrics(float(step)))
    first.close()
    # Attempt 2 resumes from step 4: it re-runs 5 and 6, then goes on.
    second = StepLogger(FakeRunner(), run_id=run_id, tracking_uri=uri, flush_every=3)
    for step in range(5, 10):
        second.report(step, metrics(100.0 + step))
    second.save_checkpoint(None, 9, metrics(109.0))
    history = {m.step: m.value for m in client(uri).get_metric_history(run_id, "loss")}
    assert steps(uri, run_id) == list(range(1, 10))  # each global step once
    assert history == {**{s: float(s) for s in range(1, 7)}, **{s: 100.0 + s for s in range(7, 10)}}
    assert steps(uri, run_id, "samples_per_s") == list(range(1, 10))
    assert client(uri).get_run(run_id).data.tags["raylane.metrics_step"] == "9"


def test_other_ranks_forward_everything_and_write_nothing(uri):
    run_id = started(uri).run_id
    runner = FakeRunner(rank=1)
    hooks = StepLogger(runner, run_id=run_id, tracking_uri=uri, flush_every=1)
    for step in range(1, 4):
        hooks.report(step, metrics(1.0))
    hooks.save_checkpoint(None, 3, metrics(1.0))
    hooks.close()
    assert runner.calls == [("report", 1), ("report", 2), ("report", 3), ("save", 3)]
    assert hooks._client is None and client(uri).get_run(run_id).data.metrics == {}


def test_the_buffered_tail_is_flushed_at_checkpoints_and_close(uri):
    run_id = started(uri).run_id
    hooks = StepLogger(FakeRunner(), run_id=run_id, tracking_uri=uri, flush_every=20)
    for step in range(1, 8):
        hooks.report(step, metrics(float(step)))
    assert steps(uri, run_id) == []  # still buffered
    hooks.save_checkpoint(None, 7, metrics(7.0))
    assert steps(uri, run_id) == list(range(1, 8))
    for step in range(8, 11):
        hooks.report(step, metrics(float(step)))
    hooks.close()
    assert steps(uri, run_id) == list(range(1, 11))


def test_log_every_thins_steps_but_keeps_eval_and_checkpoint_steps(uri):
    run_id = started(uri).run_id
    hooks = StepLogger(FakeRunner(), run_id=run_id, tracking_uri=uri, log_every=5)
    for step in range(1, 13):
        m = metrics(float(step))
        if step == 3:
            m["val_loss"] = 2.0
        hooks.report(step, m)
        if step == 12:
            hooks.save_checkpoint(None, step, m)
    assert steps(uri, run_id) == [3, 5, 10, 12]
    assert steps(uri, run_id, "val_loss") == [3]


def test_a_failed_flush_keeps_the_metrics_for_the_next_one(uri, monkeypatch, caplog):
    run_id = started(uri).run_id
    hooks = StepLogger(FakeRunner(), run_id=run_id, tracking_uri=uri, flush_every=2)
    real = hooks._get_client

    def down():
        raise ConnectionError("store unreachable")

    monkeypatch.setattr(hooks, "_get_client", down)
    for step in (1, 2, 3):
        hooks.report(step, metrics(1.0))  # the flush at step 2 fails without raising
    assert hooks.failed_flushes == 1 and "store unreachable" in caplog.text
    monkeypatch.setattr(hooks, "_get_client", real)
    hooks.save_checkpoint(None, 3, metrics(1.0))
    assert steps(uri, run_id) == [1, 2, 3]


def test_the_run_comes_from_the_environment_and_the_logger_is_picklable(uri, monkeypatch):
    run_id = started(uri).run_id
    monkeypatch.delenv("MLFLOW_RUN_ID", raising=False)
    assert from_environment() is None
    monkeypatch.setenv("MLFLOW_RUN_ID", run_id)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    assert from_environment() == (run_id, uri)
    hooks = StepLogger(FakeRunner(), run_id=run_id, tracking_uri=uri)
    hooks.report(1, metrics(1.0))
    hooks.close()
    copy = pickle.loads(pickle.dumps(hooks))  # the client stays behind
    assert copy._client is None and copy.run_id == run_id
    assert steps(uri, run_id) == [1]
    with pytest.raises(ConfigError) as err:
        StepLogger(FakeRunner(), run_id=run_id, tracking_uri=uri, log_every=0, flush_every=True)
    assert [e[0] for e in err.value.errors] == ["log_every", "flush_every"]


def test_steps_named_by_flush_at_are_written_before_they_go_on(uri):
    run_id = started(uri).run_id
    seen = []

    class Forwarder(FakeRunner):
        def report(self, step, m):  # what a report logger would find in the run when the step reaches it
            seen.append((step, steps(uri, run_id)[-1:] ))

    hooks = StepLogger(Forwarder(), run_id=run_id, tracking_uri=uri, flush_at=lambda s: s % 3 == 0)
    for step in range(1, 7):
        hooks.report(step, metrics(float(step)))
    assert [s for s, last in seen if last == [s]] == [3, 6]


# --- a real training run ---------------------------------------------------------------------------------------


def test_a_real_training_run_reaches_mlflow_across_a_yield_and_resume(uri, tmp_path):
    tracker = started(uri, spec={**SPEC, "config": SMALL})

    def wrap(hooks):
        return StepLogger(hooks, run_id=tracker.run_id, tracking_uri=uri)

    config = {**SMALL, "max_steps": 6, "checkpoint_every": 3}
    first = train(config, hooks=wrap(LocalHooks(tmp_path / "ckpt", stop_at_step=4)))
    assert (first.status, first.step) == ("yielded", 4)
    tracker.event("preempted", "yielded at step 4", step=4)
    local = LocalHooks(tmp_path / "ckpt")
    second = train(config, hooks=wrap(local))
    assert (second.status, second.step, second.resumed_from_step) == ("finished", 6, 4)
    tracker.finish("FINISHED")

    run = client(uri).get_run(tracker.run_id)
    history = {m.step: m.value for m in client(uri).get_metric_history(tracker.run_id, "loss")}
    assert steps(uri, tracker.run_id) == [1, 2, 3, 4, 5, 6]
    assert history[6] == pytest.approx(local.losses()[6]) and history[5] == pytest.approx(local.losses()[5])
    assert run.data.params["batch_size"] == "8"
    assert run.info.status == "FINISHED" and run.data.tags["raylane.preemptions"] == "1"
