"""raylane.tracking against a real MLflow sqlite store (no Ray): one run per workload across restarts, the event
log and its counters, rank-0 metric logging against global steps across resumes, and a real short training run.

Creating an MLflow database runs its migrations (~3 s), so one is made per module and copied for each test."""
from __future__ import annotations

import json
import pickle
import shutil
import subprocess
from pathlib import Path
from typing import Mapping, Optional

import pytest
from mlflow import MlflowClient

from raylane.errors import FatalError, NotFoundError, ValidationError
from raylane.tracking import MlflowHooks, RunTracker, code_version, spec_params, tracking_uri, wrap_hooks_factory
from workloads.train_lm import LocalHooks, TrainHooks, train

SPEC = {
    "name": "pretrain-tiny-lm",
    "team": "team-a",
    "class": "batch",
    "kind": "train",
    "gang": {"workers": 2, "resources": {"gpu": 1, "cpu": 1, "memory": "512Mi"}},
    "config": {"lr": 0.003, "model": {"d_model": 64}, "suites": ["a", "b"]},
    "run": {"intent": "Baseline for the weekly report", "owner": "alice", "code_version": "abc123"},
}

# As in tests/test_workloads.py, with a small corpus: a step takes ~10 ms on two cores.
SMALL = {"batch_size": 8, "num_threads": 2, "model": {"d_model": 32}, "corpus": {"max_bytes": 100_000}}


@pytest.fixture(scope="module")
def template_db(tmp_path_factory) -> Path:
    db = tmp_path_factory.mktemp("mlflow-template") / "mlflow.db"
    MlflowClient(tracking_uri=f"sqlite:///{db}").search_experiments()  # creates the tables
    return db


@pytest.fixture
def uri(template_db, tmp_path) -> str:
    db = tmp_path / "store" / "mlflow.db"
    db.parent.mkdir()
    shutil.copy(template_db, db)
    return f"sqlite:///{db}"


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


def started(uri: str, workload_id: str = "pretrain-tiny-lm-1a2b3c", spec=SPEC) -> RunTracker:
    t = RunTracker(workload_id=workload_id, spec=spec, tracking_uri=uri)
    t.start()
    return t


# --- where the store is ----------------------------------------------------------------------------------------


def test_tracking_uri_prefers_argument_then_environment_then_home_default(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("RAYLANE_MLFLOW_URI", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert tracking_uri() == f"sqlite:///{tmp_path}/home/.raylane/mlflow.db"
    assert (tmp_path / "home" / ".raylane").is_dir()  # created for sqlite
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://mlflow:5000")
    assert tracking_uri() == "http://mlflow:5000"
    monkeypatch.setenv("RAYLANE_MLFLOW_URI", f"sqlite:///{tmp_path}/env/x.db")
    assert tracking_uri() == f"sqlite:///{tmp_path}/env/x.db" and (tmp_path / "env").is_dir()
    assert tracking_uri("http://other:5000") == "http://other:5000"
    assert tracking_uri(str(tmp_path / "bare" / "m.db")) == f"sqlite:///{tmp_path}/bare/m.db"


@pytest.mark.parametrize("bad", ["file:///tmp/mlruns", "/tmp/mlruns"])
def test_tracking_uri_refuses_file_stores_naming_what_is_allowed(bad):
    with pytest.raises(ValidationError) as err:
        tracking_uri(bad)
    assert err.value.errors[0][:2] == ("tracking_uri", bad) and "sqlite:///" in err.value.errors[0][2]


# --- code version ----------------------------------------------------------------------------------------------


def test_code_version_is_head_then_dirty_and_unknown_outside_git(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    subprocess.run([*git, "init", "-q"], check=True)
    (repo / "a.py").write_text("x = 1\n")
    subprocess.run([*git, "add", "a.py"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "a"], check=True)
    head = subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout.strip()
    assert code_version(repo) == head
    (repo / "a.py").write_text("x = 2\n")
    assert code_version(repo) == head + "-dirty"
    outside = tmp_path / "plain"
    outside.mkdir()
    assert code_version(outside) == "unknown"
    assert code_version(tmp_path / "missing") == "unknown"


# --- params ----------------------------------------------------------------------------------------------------


def test_spec_params_flatten_config_unprefixed_and_platform_keys_under_raylane():
    params = spec_params({**SPEC, "run": {**SPEC["run"], "data_snapshot": "snap-1"}}, "abc123")
    assert params == {
        "lr": "0.003",
        "model.d_model": "64",
        "suites": '["a", "b"]',
        "raylane.gang.workers": "2",
        "raylane.gang.resources.gpu": "1",
        "raylane.gang.resources.cpu": "1",
        "raylane.gang.resources.memory": "512Mi",
        "raylane.class": "batch",
        "raylane.kind": "train",
        "raylane.code_version": "abc123",
        "raylane.data_snapshot": "snap-1",
    }


# --- the run of a workload -------------------------------------------------------------------------------------


def test_new_run_records_params_tags_and_artifacts(uri, tmp_path):
    t = started(uri)
    run = client(uri).get_run(t.run_id)
    assert t.resumed is False and run.info.status == "RUNNING" and run.info.run_name == "pretrain-tiny-lm"
    assert client(uri).get_experiment(run.info.experiment_id).name == "raylane/team-a"
    assert run.data.params["lr"] == "0.003" and run.data.params["raylane.code_version"] == "abc123"
    assert "raylane.data_snapshot" not in run.data.params
    tags = run.data.tags
    assert {k: tags[k] for k in ("raylane.workload_id", "raylane.team", "raylane.class", "raylane.kind",
                                 "raylane.owner", "raylane.preemptions", "raylane.restarts")} == {
        "raylane.workload_id": "pretrain-tiny-lm-1a2b3c", "raylane.team": "team-a", "raylane.class": "batch",
        "raylane.kind": "train", "raylane.owner": "alice", "raylane.preemptions": "0", "raylane.restarts": "0"}
    assert tags["raylane.intent"] == tags["mlflow.note.content"] == "Baseline for the weekly report"
    assert tags["mlflow.source.git.commit"] == "abc123"
    # Artifacts land in a real directory next to the database.
    artifacts = Path(run.info.artifact_uri.removeprefix("file://"))
    assert artifacts.is_relative_to(tmp_path / "store" / "mlartifacts")
    assert (artifacts / "config" / "spec.yaml").read_text().startswith("name: pretrain-tiny-lm")
    assert "mlflow==" in (artifacts / "environment" / "pip_freeze.txt").read_text()
    env = json.loads((artifacts / "environment" / "platform.json").read_text())
    assert {"python", "torch", "ray", "mlflow", "hostname", "cpu_count"} <= env.keys() and env["mlflow"]


def test_a_second_tracker_for_the_same_workload_finds_the_same_run(uri):
    assert RunTracker(workload_id="pretrain-tiny-lm-1a2b3c", spec=SPEC, tracking_uri=uri).find() is None
    first = started(uri)
    assert RunTracker(workload_id="pretrain-tiny-lm-1a2b3c", spec=SPEC, tracking_uri=uri).find() == first.run_id
    again = RunTracker(workload_id="pretrain-tiny-lm-1a2b3c", spec=SPEC, tracking_uri=uri)
    assert again.start() == first.run_id and again.resumed is True
    assert again.start() == first.run_id  # idempotent
    other = started(uri, workload_id="pretrain-tiny-lm-ffffff")
    assert other.run_id != first.run_id
    runs = client(uri).search_runs([client(uri).get_run(first.run_id).info.experiment_id])
    assert len(runs) == 2


def test_start_completes_a_run_whose_creator_died_before_logging_its_params(uri):
    c = client(uri)
    artifacts = Path(uri.removeprefix("sqlite:///")).parent / "mlartifacts"
    exp = c.create_experiment("raylane/team-a", artifact_location=str(artifacts))
    half = c.create_run(exp, tags={"raylane.workload_id": "w-half"}).info.run_id
    t = started(uri, workload_id="w-half")
    run = c.get_run(half)
    assert t.run_id == half and run.data.params["lr"] == "0.003" and run.data.tags["raylane.initialised"] == "1"
    assert {f.path for f in c.list_artifacts(half)} == {"config", "environment"}


def test_methods_need_start_and_bad_input_names_the_field(uri):
    with pytest.raises(FatalError, match="start"):
        RunTracker(workload_id="w", spec=SPEC, tracking_uri=uri).run_id
    with pytest.raises(ValidationError) as err:
        RunTracker(workload_id="it's", spec={"config": {}}, tracking_uri=uri)
    assert [e[0] for e in err.value.errors] == ["workload_id", "spec.team"]


def test_events_bump_the_counters_and_keep_their_order_across_drivers(uri):
    t = started(uri)
    t.event("preempted", "for serve-chat", victim_of="serve-chat", step=40)
    t.event("restarted", "attempt 2")
    t.event("yielded", "quota reclaimed")
    later = started(uri)  # a new driver continues the log
    later.event("preempted", "node drained")
    tags = client(uri).get_run(t.run_id).data.tags
    assert (tags["raylane.preemptions"], tags["raylane.restarts"]) == ("2", "1")
    assert tags["raylane.last_event"] == "preempted: node drained"
    events = started(uri).events()
    assert [(e["seq"], e["kind"]) for e in events] == [
        (1, "preempted"), (2, "restarted"), (3, "yielded"), (4, "preempted")]
    assert events[0]["data"] == {"victim_of": "serve-chat", "step": 40} and events[0]["detail"] == "for serve-chat"


def test_params_are_write_once_and_tags_and_snapshot_can_come_later(uri):
    t = started(uri)
    t.log_params({"lr": 0.003, "extra": 1})  # repeating a logged value is fine
    with pytest.raises(ValidationError) as err:
        t.log_params({"lr": 0.1})
    assert err.value.errors[0][:2] == ("lr", "0.1")
    t.set_tags({"raylane.attempt": 2})
    t.log_data_snapshot("snap-9")
    t.log_data_snapshot("snap-9")
    run = client(uri).get_run(t.run_id)
    assert run.data.params["extra"] == "1" and run.data.params["raylane.data_snapshot"] == "snap-9"
    assert run.data.tags["raylane.attempt"] == "2"


def test_finish_sets_the_status_and_a_restart_reopens_the_run(uri, tmp_path):
    t = started(uri)
    model = tmp_path / "model"
    model.mkdir()
    (model / "weights.bin").write_bytes(b"\0" * 8)
    t.log_model_dir(model)
    with pytest.raises(NotFoundError):
        t.log_model_dir(tmp_path / "none")
    with pytest.raises(ValidationError):
        t.finish("yielded")
    t.finish("FAILED")
    assert client(uri).get_run(t.run_id).info.status == "FAILED"
    assert [f.path for f in client(uri).list_artifacts(t.run_id, "model")] == ["model/weights.bin"]
    again = started(uri)
    assert again.run_id == t.run_id and client(uri).get_run(t.run_id).info.status == "RUNNING"
    again.finish("FINISHED")
    assert client(uri).get_run(t.run_id).info.status == "FINISHED"
    for state, status in (("SUCCEEDED", "FINISHED"), ("CANCELLED", "KILLED"), ("REJECTED", "FAILED")):
        started(uri).finish(state)  # the control plane's words
        assert client(uri).get_run(t.run_id).info.status == status


# --- metrics from the training gang ----------------------------------------------------------------------------


def test_rank0_logs_against_global_steps_and_a_resume_adds_no_duplicates(uri):
    run_id = started(uri).run_id
    # Attempt 1: checkpoint at step 4, metrics up to 6 written, then the worker dies.
    first = MlflowHooks(FakeRunner(), run_id=run_id, tracking_uri=uri, flush_every=20)
    for step in range(1, 7):
        first.report(step, metrics(float(step)))
        if step == 4:
            first.save_checkpoint(None, step, metrics(float(step)))
    first.close()
    # Attempt 2 resumes from step 4: it re-runs 5 and 6, then goes on.
    second = MlflowHooks(FakeRunner(), run_id=run_id, tracking_uri=uri, flush_every=3)
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
    hooks = MlflowHooks(runner, run_id=run_id, tracking_uri=uri, flush_every=1)
    for step in range(1, 4):
        hooks.report(step, metrics(1.0))
    hooks.save_checkpoint(None, 3, metrics(1.0))
    hooks.close()
    assert runner.calls == [("report", 1), ("report", 2), ("report", 3), ("save", 3)]
    assert hooks._client is None and client(uri).get_run(run_id).data.metrics == {}


def test_the_buffered_tail_is_flushed_at_checkpoints_and_close(uri):
    run_id = started(uri).run_id
    hooks = MlflowHooks(FakeRunner(), run_id=run_id, tracking_uri=uri, flush_every=20)
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
    hooks = MlflowHooks(FakeRunner(), run_id=run_id, tracking_uri=uri, log_every=5)
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
    hooks = MlflowHooks(FakeRunner(), run_id=run_id, tracking_uri=uri, flush_every=2)
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


def test_hooks_factory_is_picklable_and_hooks_validate_their_options(uri):
    run_id = started(uri).run_id
    factory = pickle.loads(pickle.dumps(wrap_hooks_factory(run_id, uri, data_snapshot="snap-3")))
    hooks = factory(FakeRunner())
    assert isinstance(hooks, MlflowHooks) and (hooks.run_id, hooks.tracking_uri) == (run_id, uri)
    hooks.report(1, metrics(1.0))
    hooks.close()
    copy = pickle.loads(pickle.dumps(hooks))  # the client stays behind
    assert copy._client is None and copy.run_id == run_id
    assert client(uri).get_run(run_id).data.params["raylane.data_snapshot"] == "snap-3"
    with pytest.raises(ValidationError) as err:
        MlflowHooks(FakeRunner(), run_id=run_id, tracking_uri=uri, log_every=0, flush_every=True)
    assert [e[0] for e in err.value.errors] == ["log_every", "flush_every"]


# --- a real training run ---------------------------------------------------------------------------------------


def test_a_real_training_run_reaches_mlflow_across_a_yield_and_resume(uri, tmp_path):
    tracker = started(uri, spec={**SPEC, "config": SMALL})
    wrap = wrap_hooks_factory(tracker.run_id, uri)
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
    assert run.data.params["raylane.data_snapshot"] == second.data_snapshot  # read from the first checkpoint
    assert run.data.params["batch_size"] == "8"
    assert run.info.status == "FINISHED" and run.data.tags["raylane.preemptions"] == "1"
