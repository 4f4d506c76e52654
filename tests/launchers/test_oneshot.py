"""One-shot workloads (raylane.launchers.oneshot): kind eval and kind batch.

Pure tests first (no Ray): the config checks that refuse a bad spec before it queues, every problem named; paths and
formats; evaluation results; the batch example's own model. Then end to end through Ray's jobs API on a local
cluster with logical GPUs (one cluster for the module): digits-cnn trains, an eval of its checkpoint records its
metrics in a child of the training run, a batch job classifies the held-out digits with the same checkpoint and
writes them as parquet, a crashed batch attempt restarts within the retry budget with every map worker inside the
lease, and a preempted eval is stopped at once, requeued, and reruns.
"""
from __future__ import annotations

import importlib.util
import json
import os
import sys

import pytest
import yaml

from raylane.errors import ValidationError
from raylane.launchers.oneshot import command_argv, metrics_of, plan
from tests.raytest import REPO

USER_CODE = REPO / "examples" / "user-code"
EVAL_DIR, BATCH_DIR, CNN_DIR = USER_CODE / "eval-digits", USER_CODE / "batch-digits", USER_CODE / "digits-cnn"


def example_spec(folder) -> dict:
    return yaml.safe_load((folder / "spec.yaml").read_text())


def oneshot(kind="batch", *, workers=1, gpu=1, cpu=1, config=None, command=None) -> dict:
    s = {"name": f"{kind}-x", "team": "team-a", "class": "eval", "kind": kind,
         "gang": {"workers": workers, "resources": {"gpu": gpu, "cpu": cpu}}, "config": config or {},
         "run": {"intent": "test", "owner": "pytest"}}
    if command:
        s["command"] = command
    else:
        s["entrypoint"] = "mod:fn"
    return s


def module_from(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # while it runs: pydantic resolves the module's annotations through it
    try:
        spec.loader.exec_module(mod)
    finally:
        del sys.modules[name]
    return mod


def problems(s, tmp_path, working_dir=None):
    with pytest.raises(ValidationError) as info:
        plan(s, storage_path=str(tmp_path / "runs"), working_dir=str(working_dir or tmp_path))
    return {path: allowed for path, _, allowed in info.value.errors}


# ------------------------------------------------------------------------------------------------ pure


def test_the_examples_plan_as_their_readmes_say(tmp_path):
    (tmp_path / "digits.parquet").write_bytes(b"")
    ev = plan(example_spec(EVAL_DIR), storage_path=str(tmp_path / "runs"), working_dir=str(EVAL_DIR))
    assert (ev.kind, ev.workers, ev.bundle, str(ev.checkpoint_ref)) == ("eval", 1, {"CPU": 1.0, "GPU": 1.0},
                                                                         "digits-cnn@latest")
    b = plan(example_spec(BATCH_DIR), storage_path=str(tmp_path / "runs"), working_dir=str(tmp_path))
    # The input is found in the job's working directory; a relative output goes under the storage path.
    assert (b.input, b.input_format) == (str(tmp_path / "digits.parquet"), "parquet")
    assert b.output == str(tmp_path / "runs" / "batch-digits" / "predictions")
    assert (b.workers, b.batch_size, b.overwrite, b.uses_ray_data) == (2, 64, True, True)
    assert b.config["input"] == b.input and b.config["model"]["hidden"] == 64


BAD = {
    # name: (spec changes, the fields named)
    "batch without input or output": (dict(config={}), {"config.input", "config.output"}),
    "missing input file": (dict(config={"input": "nope.parquet", "output": "o"}), {"config.input"}),
    "glob matching nothing": (dict(config={"input": "data/*.csv", "output": "o"}), {"config.input"}),
    "format unknown": (dict(config={"input": "in.parquet", "input_format": "avro", "output": "o"}),
                       {"config.input_format"}),
    "names that say no format": (dict(config={"input": "in.bin", "output": "o"}), {"config.input_format"}),
    "output exists": (dict(config={"input": "in.parquet", "output": "full"}), {"config.output"}),
    "bad knobs": (dict(config={"input": "in.parquet", "output": "o", "overwrite": "yes", "batch_size": 0,
                               "batch_format": "arrow"}),
                  {"config.overwrite", "config.batch_size", "config.batch_format"}),
    "bad checkpoint reference": (dict(config={"input": "in.parquet", "output": "o",
                                              "checkpoint": {"workload": "w", "step": 0}}),
                                 {"config.checkpoint.step"}),
    "checkpoint neither reference nor directory": (dict(config={"input": "in.parquet", "output": "o",
                                                                "checkpoint": 7}), {"config.checkpoint"}),
    "missing checkpoint directory": (dict(config={"input": "in.parquet", "output": "o", "checkpoint": "ck"}),
                                     {"config.checkpoint"}),
    "fault drill unknown": (dict(config={"input": "in.parquet", "output": "o",
                                         "fault": {"crash_times": -1, "hang": True}}),
                            {"config.fault.crash_times", "config.fault.hang"}),
    "batch slot without a CPU for Ray Data's I/O": (dict(cpu=0.5, config={"input": "in.parquet", "output": "o"}),
                                                    {"gang.resources.cpu"}),
    "eval on two slots": (dict(kind="eval", workers=2), {"gang.workers"}),
    "eval with batch keys": (dict(kind="eval", config={"output": "o", "batch_size": 8}),
                             {"config.output", "config.batch_size"}),
    "a command on two slots": (dict(workers=2, command=["python", "x.py"]), {"gang.workers"}),
}


@pytest.mark.parametrize("name", BAD)
def test_bad_config_is_refused_with_every_field_named(name, tmp_path):
    changes, fields = BAD[name]
    (tmp_path / "in.parquet").write_bytes(b"")
    (tmp_path / "in.bin").write_bytes(b"")
    (tmp_path / "runs" / "full").mkdir(parents=True)
    (tmp_path / "runs" / "full" / "part-0.parquet").write_bytes(b"")
    got = problems(oneshot(**changes), tmp_path)
    assert set(got) == fields, got


def test_errors_say_what_is_allowed(tmp_path):
    got = problems(oneshot(cpu=0.5, config={"input": "in.csv", "output": "o", "batch_format": "arrow"}), tmp_path)
    assert "no such file or directory: " + str(tmp_path / "in.csv") in got["config.input"]
    assert "one of numpy, pandas, pyarrow" == got["config.batch_format"]
    assert "Ray Data's read and write tasks run in the lease" in got["gang.resources.cpu"]


def test_inputs_a_directory_or_a_glob_and_their_format(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    for i in range(3):
        (data / f"part-{i}.csv").write_text("x\n1\n")
    (data / "_SUCCESS").write_text("")
    for raw, files in (("data", str(data)), ("data/part-*.csv", [str(data / f"part-{i}.csv") for i in range(3)])):
        job = plan(oneshot(config={"input": raw, "output": str(tmp_path / "out")}), storage_path=str(tmp_path),
                   working_dir=str(tmp_path))
        assert (job.input, job.input_format) == (files, "csv")
    (data / "extra.json").write_text("{}")
    assert set(problems(oneshot(config={"input": "data", "output": "o"}), tmp_path)) == {"config.input_format"}
    job = plan(oneshot(config={"input": "s3://bucket/x/", "input_format": "json", "output": "s3://bucket/y"}),
               storage_path=str(tmp_path), working_dir=str(tmp_path))
    assert (job.input, job.output) == ("s3://bucket/x/", "s3://bucket/y")


def test_an_existing_output_is_taken_with_overwrite(tmp_path):
    (tmp_path / "in.json").write_text("{}")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "old.parquet").write_bytes(b"")
    cfg = {"input": "in.json", "output": str(tmp_path / "out"), "overwrite": True}
    assert plan(oneshot(config=cfg), storage_path=str(tmp_path), working_dir=str(tmp_path)).overwrite


def test_a_finished_output_replaces_the_old_one_in_one_rename(tmp_path):
    from raylane.launchers.oneshot import _publish

    out, staged = tmp_path / "out", tmp_path / "out.partial"
    out.mkdir()
    (out / "old").write_text("old")
    staged.mkdir()
    (staged / "new").write_text("new")
    with pytest.raises(ValidationError, match="config.output"):
        _publish(str(staged), str(out), overwrite=False)
    _publish(str(staged), str(out), overwrite=True)
    assert sorted(os.listdir(out)) == ["new"] and not staged.exists()


def test_evaluation_results_must_be_numbers():
    assert metrics_of({"accuracy": 0.5, "n": 3}) == {"accuracy": 0.5, "n": 3.0}
    with pytest.raises(ValidationError) as info:
        metrics_of({"accuracy": "high", "loss": float("nan"), "ok": True, "fine": 1})
    assert [p for p, _, _ in info.value.errors] == ["accuracy", "loss", "ok"]
    for bad in ([0.5], {}, None):
        with pytest.raises(ValidationError, match="result of evaluate"):
            metrics_of(bad)


def test_python_in_a_command_is_the_jobs_interpreter():
    import sys

    assert command_argv(["python", "-c", "pass"]) == [sys.executable, "-c", "pass"]
    assert command_argv(["./eval.sh", "python"]) == ["./eval.sh", "python"]


def test_the_reference_key_is_checkpoint_for_one_shot_kinds():
    from raylane.control.checkpoints import ref_key

    assert [ref_key({"kind": k}) for k in ("eval", "batch", "train")] == ["checkpoint", "checkpoint", "init_from"]
    assert ref_key({}) == "init_from"


def test_the_batch_example_fits_its_model_from_config_and_classifies_the_digits(tmp_path):
    import numpy as np
    import pyarrow.parquet as pq

    make_input = module_from(BATCH_DIR / "make_input.py", "make_input_under_test")
    classify = module_from(BATCH_DIR / "classify_digits.py", "classify_digits_under_test")
    assert make_input.write_input(str(tmp_path / "digits.parquet")) == 360
    rows = pq.read_table(tmp_path / "digits.parquet").to_pydict()
    model = classify.DigitsClassifier({"model": {"hidden": 64, "epochs": 40, "lr": 1e-2, "seed": 0}})
    out = model({"id": np.array(rows["id"]), "label": np.array(rows["label"]),
                 "pixels": np.array(rows["pixels"], dtype=object)})
    assert sorted(out) == ["confidence", "id", "label", "prediction"]
    assert (out["prediction"] == out["label"]).mean() > 0.9


# ------------------------------------------------------------------------------------------------ end to end


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    from tests.jobtest import module_env

    yield from module_env(tmp_path_factory, "oneshot", pretrain={"min_runtime": 0})


@pytest.fixture(scope="module")
def source(env):
    """digits-cnn, short: one worker, one checkpoint at step 80. Submitted once; the tests that use its checkpoint
    are queued behind it until the checkpoint exists."""
    from tests.jobtest import submit_job

    s = example_spec(CNN_DIR)
    s["gang"]["workers"] = 1
    s["config"].update(max_steps=80, checkpoint_every=80, log_every=20)
    job = submit_job(env, s, "digits-cnn", working_dir=str(CNN_DIR))
    return {"job": job, "id": workload_id(env, job)}


@pytest.fixture(scope="module")
def probe(env, tmp_path_factory):
    """A batch job of a user project of its own (a map class that reports where it ran), csv files in, crashing in
    its first attempt. Submitted with the source so the two run side by side."""
    from tests.jobtest import submit_job

    tmp = tmp_path_factory.mktemp("probe")
    (tmp / "project").mkdir()
    (tmp / "project" / "probe.py").write_text(PROBE)
    (tmp / "in").mkdir()
    for i in range(4):
        (tmp / "in" / f"part-{i}.csv").write_text("x\n" + "".join(f"{50 * i + j}\n" for j in range(50)))
    s = oneshot("batch", workers=2, gpu=1, cpu=1, config={"input": str(tmp / "in"), "output": str(tmp / "out"),
                                                          "batch_size": 10, "scale": 3, "fault": {"crash_times": 1}})
    s["name"], s["entrypoint"] = "probe", "probe:Probe"
    return {"job": submit_job(env, s, "probe", working_dir=str(tmp / "project")), "out": tmp / "out"}


PROBE = '''
import numpy as np
import ray


class Probe:
    def __init__(self, config):
        self.scale = config["scale"]

    def __call__(self, batch):
        n = len(batch["x"])
        group = ray.util.get_current_placement_group()
        return {"x": batch["x"], "y": batch["x"] * self.scale,
                "group": np.array([group.id.hex() if group else ""] * n),
                "node": np.array([ray.get_runtime_context().get_node_id()] * n),
                "gpus": np.array([",".join(str(g) for g in ray.get_gpu_ids())] * n)}
'''


def workload_id(env, job) -> str:
    """The id of the workload job ``job`` registered (its logs printed if it never does)."""
    from tests.jobtest import record_of_job

    try:
        return record_of_job(env, job, timeout=180)["id"]
    except AssertionError:
        print(f"----- logs of {job} -----\n" + env["client"].get_job_logs(job)[-4000:])
        raise


def checkpoint_of(env, wid):
    written = env["ctl"].status(wid)["checkpoints"]
    step = max(written, key=int)
    with open(os.path.join(written[step], "meta.json")) as f:
        return int(step), json.load(f)


def succeeded(env, job):
    from ray.job_submission import JobStatus

    from tests.jobtest import finished

    assert finished(env, job, timeout=300) == JobStatus.SUCCEEDED
    return env["ctl"].status(workload_id(env, job))


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.e2e
def test_an_eval_records_its_metrics_next_to_the_run_it_evaluates(env, source, probe):
    from tests.jobtest import mlflow_run, submit_job

    s = example_spec(EVAL_DIR)
    s["config"]["checkpoint"] = {"workload": source["id"], "step": "latest"}  # queued until the checkpoint exists
    job = submit_job(env, s, "eval-digits", working_dir=str(EVAL_DIR))
    assert succeeded(env, source["job"])["state"] == "SUCCEEDED"
    rec = succeeded(env, job)
    step, meta = checkpoint_of(env, source["id"])
    run, trained = mlflow_run(env, rec["id"]), mlflow_run(env, source["id"])
    # The evaluation scores the held-out images the training run scored at its last checkpoint.
    assert step == 80 and run.data.metrics["examples"] == 360
    assert abs(run.data.metrics["accuracy"] - meta["test_accuracy"]) <= 1 / 360
    assert run.data.tags["mlflow.parentRunId"] == trained.info.run_id
    assert (run.data.tags["raylane.checkpoint.workload"], run.data.tags["raylane.checkpoint.step"]) == (
        source["id"], "80")
    assert run.info.status == "FINISHED" and run.info.experiment_id == trained.info.experiment_id


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.e2e
def test_a_batch_job_writes_predictions_with_a_trained_checkpoint(env, source, tmp_path):
    import pandas as pd

    from tests.jobtest import mlflow_run, submit_job

    make_input = module_from(BATCH_DIR / "make_input.py", "make_input_e2e")
    make_input.write_input(str(tmp_path / "digits.parquet"))
    s = example_spec(BATCH_DIR)
    s["config"].pop("model")
    s["config"].update(input=str(tmp_path / "digits.parquet"), output=str(tmp_path / "predictions"),
                       checkpoint={"workload": source["id"], "step": "latest"})
    rec = succeeded(env, submit_job(env, s, "batch-digits", working_dir=str(BATCH_DIR)))
    out = pd.read_parquet(tmp_path / "predictions")
    expected = pd.read_parquet(tmp_path / "digits.parquet")
    assert sorted(out["id"]) == sorted(expected["id"]) and len(out) == 360
    _, meta = checkpoint_of(env, source["id"])
    accuracy = float((out["prediction"] == out["label"]).mean())
    assert accuracy > 0.6 and abs(accuracy - meta["test_accuracy"]) <= 2 / 360, (accuracy, meta["test_accuracy"])
    run = mlflow_run(env, rec["id"])
    assert (run.data.metrics["rows_in"], run.data.metrics["rows_out"]) == (360, 360)
    assert run.data.tags["raylane.output"] == str(tmp_path / "predictions")
    assert run.data.tags["mlflow.parentRunId"] == mlflow_run(env, source["id"]).info.run_id
    assert not (tmp_path / "predictions.partial").exists()


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.e2e
def test_a_crashed_attempt_restarts_and_every_map_worker_runs_inside_the_lease(env, probe):
    import pandas as pd
    import ray

    from tests.jobtest import mlflow_run

    rec = succeeded(env, probe["job"])
    assert (rec["restarts"], rec["attempts"], rec["preemptions"]) == (1, 1, 0)
    out = pd.read_parquet(probe["out"])
    assert sorted(out["x"]) == list(range(200)) and (out["y"] == 3 * out["x"]).all()
    groups = {pg_id: v for pg_id, v in ray.util.placement_group_table().items()
              if v.get("name") == f"raylane-{rec['id']}-run"}
    assert len(groups) == 2 and all(v["state"] == "REMOVED" for v in groups.values())  # one per attempt
    assert set(out["group"]) <= set(groups) and len(set(out["group"])) == 1
    assert set(out["node"]) <= set(rec["placement"])
    assert all(out["gpus"] != "") and set(out["gpus"]) <= {"0", "1", "2", "3"}
    run = mlflow_run(env, rec["id"])
    assert run.data.tags["raylane.restarts"] == "1"
    assert (run.data.metrics["rows_in"], run.data.metrics["rows_out"]) == (200, 200)


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.e2e
def test_a_preempted_eval_is_stopped_at_once_requeued_and_rerun(env, source, probe, tmp_path):
    from raylane.control.client import State
    from tests.jobtest import mlflow_run, submit_job, wait_for
    from tests.raytest import spec

    for job in (source["job"], probe["job"]):  # the GPUs to itself, so that team-b's arrival finds them taken
        succeeded(env, job)
    marker = tmp_path / "first-attempt.pid"
    code = ("import json, os, time\n"
            "cfg = json.loads(os.environ['RAYLANE_CONFIG'])\n"
            "first = not os.path.exists(cfg['marker'])\n"
            "if first:\n"
            "    open(cfg['marker'], 'w').write(str(os.getpid()))\n"
            "    time.sleep(300)\n"
            "json.dump({'score': 0.75}, open(os.environ['RAYLANE_METRICS_FILE'], 'w'))\n")
    # Three GPUs: one more than team-a's nominal quota, so team-b may reclaim it.
    s = oneshot("eval", gpu=3, cpu=0.5, command=["python", "-c", code], config={"marker": str(marker)})
    s["name"] = "eval-held"
    job = submit_job(env, s, "eval-held")
    wid = workload_id(env, job)
    pid = int(wait_for(lambda: marker.exists() and marker.read_text(), timeout=120, what="the command to start"))
    reclaim = env["ctl"].submit(spec("reclaim", "team-b", "finetune", gpu=2)).id
    wait_for(lambda: env["ctl"].status(reclaim).state is State.ADMITTED, timeout=60,
             what="team-b admitted on the reclaimed GPUs")
    rec = env["ctl"].status(wid)
    assert rec.state is State.PENDING and rec["preemptions"] == 1
    # Stopped at once, not after the class's 20 s grace period: its program is gone too.
    grace = env["ctl"].class_info("eval")["grace_period_s"]
    wait_for(lambda: not _alive(pid), timeout=10, what="the first attempt's program to be gone")
    requeued = next(e["ts"] for e in env["ctl"].explain(wid)["journal"] if e["kind"] == "requeued")
    preempting = next(e["ts"] for e in env["ctl"].explain(wid)["journal"] if e["kind"] == "preempting")
    assert requeued - preempting < grace / 2
    env["ctl"].cancel(reclaim)
    rec = succeeded(env, job)
    assert (rec["preemptions"], rec["restarts"], rec["attempts"]) == (1, 0, 2)
    run = mlflow_run(env, wid)
    assert run.data.metrics["score"] == 0.75 and run.data.tags["raylane.preemptions"] == "1"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie has exited
        return f.read().split()[2] != "Z"
