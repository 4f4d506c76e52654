"""raylane.tracking against a real MLflow sqlite store (no Ray): one run per workload across restarts, the event
log and its counters, rank-0 metric logging against global steps across resumes, and a real short training run.

Creating an MLflow database runs its migrations (~3 s), so one is made per test process and copied for each test
(conftest ``uri``, ``tests.raytest.empty_store``)."""
from __future__ import annotations

import json
import pickle
import subprocess
from pathlib import Path

import pytest
from mlflow import MlflowClient

from raylane.errors import FatalError, NotFoundError, ValidationError
from raylane.tracking import MetricLogger, RunTracker, code_version, spec_params, tracking_uri

SPEC = {
    "name": "pretrain-tiny-lm",
    "team": "team-a",
    "class": "batch",
    "kind": "train",
    "gang": {"workers": 2, "resources": {"gpu": 1, "cpu": 1, "memory": "512Mi"}},
    "config": {"lr": 0.003, "model": {"d_model": 64}, "suites": ["a", "b"]},
    "run": {"intent": "Baseline for the weekly report", "owner": "alice", "code_version": "abc123"},
}





def client(uri: str) -> MlflowClient:
    return MlflowClient(tracking_uri=uri)


def steps(uri: str, run_id: str, key: str = "loss") -> list[int]:
    return [m.step for m in sorted(client(uri).get_metric_history(run_id, key), key=lambda m: (m.step, m.timestamp))]


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


# --- metrics of the training loop's reports (raylane.train logs them from rank 0) --------------------------------


def test_reports_are_logged_against_their_steps_and_a_resume_adds_no_duplicates(uri):
    run_id = started(uri).run_id
    # Attempt 1: reports up to step 6 (a checkpoint at 4, flushed before it), then the worker dies.
    first = MetricLogger(run_id, uri, flush_every=20)
    for step in range(1, 7):
        first.log(step, {**metrics(float(step)), "epoch": 0, "note": "text is skipped", "done": True})
        if step == 4:
            first.flush()
    first.flush()
    # Attempt 2 resumes from step 4: it re-reports 5 and 6, then goes on.
    second = MetricLogger(run_id, uri, flush_every=3)
    for step in range(5, 10):
        second.log(step, metrics(100.0 + step))
    second.flush()
    history = {m.step: m.value for m in client(uri).get_metric_history(run_id, "loss")}
    assert steps(uri, run_id) == list(range(1, 10))  # each step once
    assert history == {**{s: float(s) for s in range(1, 7)}, **{s: 100.0 + s for s in range(7, 10)}}
    assert steps(uri, run_id, "done") == list(range(1, 7)) and "note" not in client(uri).get_run(run_id).data.metrics
    assert client(uri).get_run(run_id).data.tags["raylane.metrics_step"] == "9"


def test_steps_another_writer_logged_first_are_not_logged_again(uri):
    from mlflow.entities import Metric, RunTag

    run_id = started(uri).run_id
    # A loop that logs its own metrics to the run (as the reference LM does) moves the mark first.
    client(uri).log_batch(run_id, metrics=[Metric("loss", 1.0, 0, s) for s in range(1, 6)],
                          tags=[RunTag("raylane.metrics_step", "5")])
    logger = MetricLogger(run_id, uri)
    logger.log(5, metrics(5.0))
    logger.log(6, metrics(6.0))
    logger.flush()
    assert steps(uri, run_id) == [1, 2, 3, 4, 5, 6]


def test_a_failed_flush_keeps_the_metrics_for_the_next_one(uri, monkeypatch, caplog):
    run_id = started(uri).run_id
    logger = MetricLogger(run_id, uri, flush_every=2)
    real = logger._get_client

    def down():
        raise ConnectionError("store unreachable")

    monkeypatch.setattr(logger, "_get_client", down)
    for step in (1, 2, 3):
        logger.log(step, metrics(1.0))  # the flush at step 2 fails without raising
    assert logger.failed_flushes == 1 and "store unreachable" in caplog.text
    monkeypatch.setattr(logger, "_get_client", real)
    logger.flush()
    assert steps(uri, run_id) == [1, 2, 3]


def test_the_logger_is_picklable_and_validates_its_options(uri):
    run_id = started(uri).run_id
    logger = MetricLogger(run_id, uri)
    logger.log(1, metrics(1.0))
    logger.flush()
    copy = pickle.loads(pickle.dumps(logger))  # the client stays behind
    assert copy._client is None and copy.run_id == run_id
    with pytest.raises(ValidationError) as err:
        MetricLogger("", uri, flush_every=True, flush_interval_s=0)
    assert [e[0] for e in err.value.errors] == ["run_id", "flush_every", "flush_interval_s"]


def test_rank_zero_logs_reports_made_before_its_logger_was_built_in_order(uri, monkeypatch):
    """raylane.train builds rank 0's MetricLogger in a background thread (MLflow's import is off the way to the
    first step): reports made meanwhile are kept and logged in order, and a flush waits for the logger."""
    import threading

    import raylane.tracking
    from raylane.train import _DeferredLogger

    gate = threading.Event()

    class SlowLogger(MetricLogger):
        def __init__(self, *a, **kw):
            gate.wait(30)
            super().__init__(*a, **kw)

    monkeypatch.setattr(raylane.tracking, "MetricLogger", SlowLogger)
    run_id = started(uri).run_id
    deferred = _DeferredLogger(run_id, uri)
    for step in (1, 2, 3):
        deferred.log(step, metrics(float(step)))
    assert deferred._logger is None and len(deferred._early) == 3  # not built yet: kept
    gate.set()
    deferred.log(4, metrics(4.0))  # may or may not find it built; either way nothing is lost
    deferred.flush()
    assert steps(uri, run_id) == [1, 2, 3, 4]
    assert {m.step: m.value for m in client(uri).get_metric_history(run_id, "loss")} == {1: 1.0, 2: 2.0, 3: 3.0,
                                                                                          4: 4.0}


# --- the run started in a child process beside the driver's start-up (raylane.runstart) ---------------------------


def test_a_run_started_by_the_child_is_the_one_the_driver_s_tracker_finds(uri):
    from raylane.runstart import LateTracker, RunStarter

    starter = RunStarter(team=SPEC["team"], tracking_uri=uri)
    starter.ask(workload_id="pretrain-child-1", spec=SPEC)
    started_run = starter.result()
    assert started_run.tracking_uri == uri and not started_run.resumed
    run = client(uri).get_run(started_run.run_id)
    assert run.data.tags["raylane.workload_id"] == "pretrain-child-1" and run.info.status == "RUNNING"
    # The driver's own tracker, built on first use, lands on the same run; a second child finds it too.
    late = LateTracker(lambda: RunTracker(workload_id="pretrain-child-1", spec=SPEC, tracking_uri=uri))
    assert late.run_id == started_run.run_id
    again = RunStarter(team=SPEC["team"], tracking_uri=uri)
    again.ask(workload_id="pretrain-child-1", spec=SPEC)
    assert again.result().run_id == started_run.run_id


def test_the_child_s_errors_reach_the_driver_typed_with_the_field_named(tmp_path):
    from raylane.runstart import RunStarter

    starter = RunStarter(team=SPEC["team"], tracking_uri=f"file://{tmp_path}/mlruns")
    starter.ask(workload_id="pretrain-child-2", spec=SPEC)
    with pytest.raises(ValidationError) as err:
        starter.result()
    assert "tracking_uri" in str(err.value) and "file://" in str(err.value) and "sqlite" in str(err.value)


def test_a_pending_run_names_the_run_from_its_thread_and_gives_it_to_the_driver(uri):
    from raylane.runstart import PendingRun, RunStarter

    named, failed = [], []
    starter = RunStarter(team=SPEC["team"], tracking_uri=uri)
    starter.ask(workload_id="pretrain-child-3", spec=SPEC)
    pending = PendingRun(starter, announce=named.append, fail=failed.append)
    started = pending.result()
    assert pending.done() and pending.announced and named == [started] and not failed
    assert client(uri).get_run(started.run_id).data.tags["raylane.workload_id"] == "pretrain-child-3"
    starter.close()  # the driver's own close, after the thread took the answer: nothing left to do


def test_a_pending_run_that_fails_says_why_and_raises_the_child_s_error_to_the_driver(tmp_path):
    from raylane.runstart import PendingRun, RunStarter

    failed = []
    starter = RunStarter(team=SPEC["team"], tracking_uri=f"file://{tmp_path}/mlruns")
    starter.ask(workload_id="pretrain-child-4", spec=SPEC)
    pending = PendingRun(starter, announce=lambda s: pytest.fail("announced a run that failed"), fail=failed.append)
    with pytest.raises(ValidationError) as err:
        pending.result()
    assert failed == [err.value] and "tracking_uri" in str(err.value) and not pending.announced


def test_a_pending_run_whose_announcement_fails_is_still_answered():
    from raylane.runstart import PendingRun, StartedRun

    class Starter:  # a child's answer, already in; the control actor unreachable when told
        def result(self):
            return StartedRun("r1", "sqlite:///x.db", False)

    def announce(started):
        raise ConnectionError("control actor restarting")

    pending = PendingRun(Starter(), announce=announce, fail=lambda exc: None)
    assert pending.result().run_id == "r1" and not pending.announced  # the driver names it again (launchers.train)


def test_a_driver_refuses_a_store_mlflow_refuses_before_anything_queues(tmp_path):
    from raylane.run import run_workload

    spec = dict(SPEC, entrypoint="workloads.ray_train:train_loop_per_worker")
    with pytest.raises(ValidationError) as err:  # before Ray is touched or the spec's code is imported
        run_workload(spec, tracking_uri=f"file://{tmp_path}/mlruns")
    assert "tracking_uri" in str(err.value) and "file://" in str(err.value) and "sqlite" in str(err.value)


class _Control:
    """The control actor as a worker sees the workload's record: a status per call (pure: no Ray)."""

    def __init__(self, *records):
        self.records, self.calls, self.credential = list(records), 0, None

    def status(self, workload_id, timeout=None):
        from raylane.control.client import WorkloadView

        self.calls += 1
        rec = self.records[min(self.calls, len(self.records)) - 1]
        if isinstance(rec, BaseException):
            raise rec
        return WorkloadView(rec)

    def reconnect(self):
        return self


def _opts(control):
    from raylane.train import LoopOptions

    return LoopOptions(workload_id="w-1", control=control, awaits_run=True)


def test_rank_0_waits_for_the_run_its_driver_names_asking_again_while_the_actor_restarts():
    from raylane.train import _await_run_name

    running = {"state": "RUNNING", "mlflow_run_id": None}
    ctl = _Control(running, ConnectionError("actor restarting"), running, dict(running, mlflow_run_id="abc"))
    assert _await_run_name(_opts(ctl), timeout_s=30) == ("abc", None) and ctl.calls == 4


def test_rank_0_gives_up_with_why_the_run_is_missing():
    from raylane.errors import NotFoundError
    from raylane.train import _await_run_name

    failed = _Control({"state": "RUNNING", "mlflow_run_error": "ValidationError: tracking_uri"})
    assert _await_run_name(_opts(failed), timeout_s=30) == (
        None, "the workload's MLflow run could not be started: ValidationError: tracking_uri")
    ended = _Control({"state": "CANCELLED"})
    assert _await_run_name(_opts(ended), timeout_s=30) == (None, "w-1 ended (CANCELLED) before its MLflow run was named")
    gone = _Control(NotFoundError("no such workload"))
    assert _await_run_name(_opts(gone), timeout_s=30) == (None, "the control plane no longer knows w-1")
    silent = _Control({"state": "RUNNING"})
    assert _await_run_name(_opts(silent), timeout_s=0.3) == (
        None, "the driver did not name the MLflow run of w-1 within 0.3s")


def test_a_starter_closed_before_asking_creates_no_run(uri):
    from raylane.runstart import RunStarter

    starter = RunStarter(team=SPEC["team"], tracking_uri=uri)
    starter.close()
    found = client(uri).get_experiment_by_name(f"raylane/{SPEC['team']}")
    assert found is None or not client(uri).search_runs([found.experiment_id])


@pytest.mark.parametrize("environ, cpus, child", [
    ({}, 2, False), ({}, 4, True), ({}, 64, True),
    ({"RAYLANE_RUN_START": "child"}, 1, True), ({"RAYLANE_RUN_START": "inline"}, 64, False),
    ({"RAYLANE_RUN_START": " Child "}, 2, True), ({"RAYLANE_RUN_START": ""}, 8, True),
])
def test_a_driver_starts_its_run_in_a_child_only_on_spare_cpus_unless_told(environ, cpus, child):
    from raylane.runstart import use_child

    assert use_child(environ, cpus=cpus) is child


def test_a_bad_run_start_setting_names_the_variable_and_what_is_allowed():
    from raylane.errors import ValidationError
    from raylane.runstart import use_child

    with pytest.raises(ValidationError) as err:
        use_child({"RAYLANE_RUN_START": "thread"}, cpus=8)
    assert ("RAYLANE_RUN_START", "thread") == err.value.errors[0][:2] and "child, inline" in err.value.errors[0][2]
