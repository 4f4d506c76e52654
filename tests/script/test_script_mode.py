"""Script mode (``raylane.script``): a user's existing Ray Train script, run unchanged as
``python -m raylane.run --team T --class C train.py ARGS``, has each ``trainer.fit()`` queued, admitted, preempted,
resumed and tracked as a Raylane workload, and gets back the ``ray.train.Result`` its ``fit()`` would have.

The mapping from a trainer to a spec, the names, the refusals and the driver's arguments are tested without Ray;
the scenarios on a real local cluster (one for the module, tests/jobtest.py) are marked ``ray``."""
from __future__ import annotations

import json
import re
import sys
import textwrap

import pytest

from raylane.errors import ValidationError

GIB = 1 << 30

# A user's script as it was before Raylane: plain Ray Train, its own argparse and ray.init(), two workers of one
# (logical) GPU, a checkpoint every epoch, resumed from ray.train.get_checkpoint().
USER_SCRIPT = textwrap.dedent('''
    import argparse, json, os, tempfile, time

    import ray
    import ray.train
    import torch
    from ray.train import Checkpoint, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer


    def train_func(config):
        torch.manual_seed(0)
        model = torch.nn.Linear(1, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        start = 0
        ckpt = ray.train.get_checkpoint()
        if ckpt is not None:
            with ckpt.as_directory() as d:
                state = torch.load(os.path.join(d, "state.pt"))
            model.load_state_dict(state["model"])
            start = state["epoch"]
        x = torch.linspace(0, 1, 32).unsqueeze(1)
        for epoch in range(start + 1, config["epochs"] + 1):
            loss = torch.nn.functional.mse_loss(model(x), 2 * x + 1)
            opt.zero_grad()
            loss.backward()
            opt.step()
            time.sleep(config["sleep_s"])
            with tempfile.TemporaryDirectory() as d:
                torch.save({"model": model.state_dict(), "epoch": epoch}, os.path.join(d, "state.pt"))
                ray.train.report({"step": epoch, "loss": loss.item()}, checkpoint=Checkpoint.from_directory(d))
        return {"trained_to": config["epochs"]}


    if __name__ == "__main__":
        p = argparse.ArgumentParser()
        p.add_argument("--epochs", type=int, default=3)
        p.add_argument("--sleep", type=float, default=0.0)
        p.add_argument("--gpus", type=float, default=1)
        p.add_argument("--fits", type=int, default=1)
        args = p.parse_args()
        ray.init()
        for _ in range(args.fits):
            trainer = TorchTrainer(
                train_func,
                train_loop_config={"epochs": args.epochs, "sleep_s": args.sleep},
                scaling_config=ScalingConfig(num_workers=2, use_gpu=True,
                                             resources_per_worker={"CPU": 0.5, "GPU": args.gpus}),
                run_config=RunConfig(name="my-run"),
            )
            result = trainer.fit()
            assert result.metrics["step"] == args.epochs, result.metrics
            assert result.checkpoint is not None
            print("RESULT " + json.dumps({"metrics": result.metrics, "value": result.return_value}), flush=True)
''')


# ----------------------------------------------------------------------------------------------- without Ray

def _ctx(**kw):
    from raylane.script.context import ScriptContext

    base = dict(team="team-a", class_name="pretrain", name=None, script="/p/train.py", argv=[], ctl=None)
    return ScriptContext(**{**base, **kw})


def _scaling(**kw):
    from ray.train import ScalingConfig

    return ScalingConfig(**kw)


GANGS = [  # (case, ScalingConfig, the spec's gang)
    ("use_gpu alone: 1 GPU and no CPU, as Ray reserves", dict(num_workers=2, use_gpu=True),
     {"workers": 2, "resources": {"gpu": 1.0}}),
    ("cpu only", dict(num_workers=3), {"workers": 3, "resources": {"cpu": 1.0}}),
    ("resources per worker", dict(num_workers=2, use_gpu=True,
                                  resources_per_worker={"CPU": 2, "GPU": 2, "memory": 4 * GIB}),
     {"workers": 2, "resources": {"cpu": 2.0, "gpu": 2.0, "memory": 4.0}}),
    ("spread", dict(num_workers=2, placement_strategy="SPREAD"),
     {"workers": 2, "resources": {"cpu": 1.0}, "placement": "spread"}),
    ("strict pack", dict(num_workers=2, placement_strategy="STRICT_PACK"),
     {"workers": 2, "resources": {"cpu": 1.0}, "placement": "strict-pack"}),
    ("strict spread", dict(num_workers=2, placement_strategy="STRICT_SPREAD"),
     {"workers": 2, "resources": {"cpu": 1.0}, "placement": "strict-spread"}),
    ("elastic", dict(num_workers=(1, 3), use_gpu=True), {"workers": {"min": 1, "max": 3}, "resources": {"gpu": 1.0}}),
]


@pytest.mark.parametrize("scaling, gang", [c[1:] for c in GANGS], ids=[c[0] for c in GANGS])
def test_a_scaling_config_becomes_the_gang_ray_would_have_reserved(scaling, gang):
    from raylane.script.trainer import gang_of

    assert gang_of(_scaling(**scaling)) == gang


def test_settings_the_spec_cannot_express_are_all_named_at_once():
    from raylane.script.trainer import gang_of

    with pytest.raises(ValidationError) as caught:
        gang_of(_scaling(num_workers=2, resources_per_worker={"CPU": 1, "fast_disk": 1},
                         label_selector={"zone": "a"}, accelerator_type="A100"))
    fields = {path for path, _, _ in caught.value.errors}
    assert fields == {"scaling_config.resources_per_worker.fast_disk", "scaling_config.label_selector",
                      "scaling_config.accelerator_type"}
    with pytest.raises(ValidationError, match="num_workers"):
        gang_of(_scaling(num_workers=0))


def test_names_come_from_the_flag_then_the_run_config_then_the_script_and_are_unique_per_script():
    from raylane.script.trainer import workload_name

    ctx = _ctx(script="/p/My_Train.v2.py")
    auto = "ray_train_run-2026-12-01_10-00-00"  # what RunConfig() names a run it was given no name for
    assert [workload_name(ctx, auto), workload_name(ctx, None), workload_name(ctx, "Run_A"),
            workload_name(ctx, "run-a")] == ["my-train-v2", "my-train-v2-2", "run-a", "run-a-2"]
    flagged = _ctx(name="nightly")
    assert [workload_name(flagged, "ignored"), workload_name(flagged, None)] == ["nightly", "nightly-2"]
    assert len(workload_name(_ctx(), "x" * 200)) <= 55


def test_the_spec_of_a_fit_is_a_valid_training_spec_of_the_flags_team_and_class():
    from ray.train import RunConfig
    from ray.train.torch import TorchTrainer

    from raylane.config.loader import load_spec_from_dict
    from raylane.script.trainer import spec_for

    trainer = TorchTrainer(lambda: None, scaling_config=_scaling(num_workers=2, use_gpu=True),
                           run_config=RunConfig(name="r"))
    s = spec_for(_ctx(), trainer, "r", owner="alice")
    load_spec_from_dict(s, "spec")
    assert (s["team"], s["class"], s["kind"], s["gang"]["workers"], s["run"]["owner"]) == \
        ("team-a", "pretrain", "train", 2, "alice")


@pytest.fixture
def hooked():
    from raylane import script

    script.install(_ctx())
    try:
        yield
    finally:
        script.uninstall()


def test_a_trainer_type_it_does_not_know_is_refused_by_name_not_run(hooked):
    from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer

    from raylane.script.trainer import UnsupportedTrainerError

    ran = []

    class MyTrainer(DataParallelTrainer):
        pass

    trainer = MyTrainer(lambda: ran.append(1), scaling_config=_scaling(num_workers=1))
    with pytest.raises(UnsupportedTrainerError, match="MyTrainer") as caught:
        trainer.fit()
    assert "TorchTrainer" in str(caught.value) and not ran


def test_the_hook_is_removed_by_uninstall_and_bypassed_inside_unmanaged():
    from ray.train.torch import TorchTrainer
    from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer

    from raylane import script
    from raylane.script import trainer as hook

    original = DataParallelTrainer.fit
    script.install(_ctx())
    try:
        assert DataParallelTrainer.fit is not original and hook.installed()
        with hook.unmanaged():  # Ray's own fit: local mode (num_workers=0) runs in this process, no Ray
            result = TorchTrainer(lambda: {"ok": 1}, scaling_config=_scaling(num_workers=0)).fit()
        assert result.return_value == {"ok": 1}
    finally:
        script.uninstall()
    assert DataParallelTrainer.fit is original and not hook.installed()


def test_a_workload_that_did_not_succeed_raises_a_training_failed_error_chained_from_the_attempt():
    from ray.train import TrainingFailedError

    from raylane.control.client import WorkloadView
    from raylane.script.trainer import WorkloadFailedError, _answer

    attempt = RuntimeError("boom")
    rec = WorkloadView({"id": "w-1", "state": "FAILED", "detail": "gang failed the same way on 2 attempts"})
    with pytest.raises(TrainingFailedError) as caught:
        _answer(rec, None, attempt)
    assert isinstance(caught.value, WorkloadFailedError) and caught.value.__cause__ is attempt
    assert "w-1 FAILED: gang failed the same way" in str(caught.value)


def test_the_driver_takes_a_script_with_its_own_arguments_and_no_longer_a_spec_on_its_command_line(capsys):
    from raylane.run import _parser, main

    args = _parser(script=True).parse_args(["--team", "t", "--class", "c", "train.py", "--epochs", "2", "--name", "x"])
    assert (args.spec, args.script_args, args.name) == ("train.py", ["--epochs", "2", "--name", "x"], None)
    for bad in (["--team", "t", "train.py"], ["--class", "c", "train.py"], ["--team", "t", "--class", "c"],
                ["spec.yaml", "--spec-json", "{}"], ["spec.yaml", "extra"]):
        with pytest.raises(SystemExit) as caught:
            main(bad)
        assert caught.value.code == 2, bad
    assert "--spec-json" not in capsys.readouterr().out


# ----------------------------------------------------------------------------------------------- on Ray

@pytest.fixture(scope="module")
def env(tmp_path_factory):
    from tests.jobtest import module_env

    yield from module_env(tmp_path_factory, "script", pretrain={"min_runtime": "1s", "grace_period": "60s"})


@pytest.fixture
def project(env, tmp_path):
    (tmp_path / "train.py").write_text(USER_SCRIPT)
    return tmp_path


def _submit_script(env, project, script: str, *args: str) -> str:
    import shlex

    from raylane.jobs import submit_job, with_credential
    from tests.jobtest import job_env, operator_token

    runtime_env = with_credential({"env_vars": job_env(env), "working_dir": str(project)}, operator_token(env))
    entry = (f"{sys.executable} -m raylane.run --storage-path {env['storage']} --tracking-uri {env['uri']} "
             f"--team team-a --class pretrain {shlex.quote(script)} " + " ".join(map(shlex.quote, args)))
    job = submit_job(env["client"], entrypoint=entry, runtime_env=runtime_env)
    env["jobs"].append(job)
    return job


def _workloads_of(env, job, logs: str):
    """The workloads the job's driver says it submitted, in order, as the control plane shows them."""
    ids = re.findall(rf"workload (\S+) submitted \(job {re.escape(job)}\)", logs)
    return [env["ctl"].explain(wid) for wid in ids]


def _results(logs: str):
    return [json.loads(m) for m in re.findall(r"^RESULT (.*)$", logs, re.M)]


@pytest.mark.ray
@pytest.mark.e2e
def test_an_unchanged_script_runs_each_fit_as_a_tracked_workload_and_gets_its_result(env, project):
    from tests.jobtest import finished, mlflow_run

    job = _submit_script(env, project, "train.py", "--epochs", "2", "--fits", "2")
    assert str(finished(env, job, timeout=300)).endswith("SUCCEEDED")
    logs = env["client"].get_job_logs(job)
    results = _results(logs)
    assert [(r["metrics"]["step"], r["value"]) for r in results] == [(2, {"trained_to": 2})] * 2, logs[-3000:]
    wls = _workloads_of(env, job, logs)
    assert [view["spec"]["name"] for view in wls] == ["my-run", "my-run-2"]  # one workload per fit(), named uniquely
    for view in wls:
        assert view["state"] == "SUCCEEDED" and view["team"] == "team-a" and view["class"] == "pretrain"
        assert view.get("job_id") == job
        gang = view["spec"]["gang"]  # the trainer's ScalingConfig, as the control plane holds it
        assert (gang["workers"], gang["resources"]["gpu"], gang["resources"]["cpu"]) == (2, 1.0, 0.5)
        run = mlflow_run(env, view["id"])
        assert run.info.status == "FINISHED" and run.data.metrics["step"] == 2


@pytest.mark.ray
@pytest.mark.e2e
def test_a_script_mode_gang_is_preempted_resumed_and_its_fit_returns_normally(env, project):
    from tests.jobtest import finish_lease, finished, placed, reclaiming_lease
    from tests.raytest import wait_for

    # 2 workers x 2 GPUs: team-a's 2 GPUs and the 2 it borrows from team-b, which team-b then reclaims.
    epochs = 14
    job = _submit_script(env, project, "train.py", "--epochs", str(epochs), "--sleep", "1", "--gpus", "2")
    wid = wait_for(lambda: env["ctl"].find_job(job), timeout=240, what="the script's workload")["id"]
    wait_for(lambda: (env["ctl"].status(wid).get("step") or 0) >= 2, timeout=240, what="a checkpoint past step 2")
    b = reclaiming_lease(env, "reclaimer")
    wait_for(lambda: env["ctl"].status(wid)["preemptions"] == 1, timeout=120, what="the gang preempted")
    placed(env, b)
    finish_lease(env, b)
    assert str(finished(env, job, timeout=300)).endswith("SUCCEEDED")
    logs = env["client"].get_job_logs(job)
    assert [r["metrics"]["step"] for r in _results(logs)] == [epochs], logs[-3000:]
    view = env["ctl"].explain(wid)
    assert view["state"] == "SUCCEEDED" and view["preemptions"] == 1 and view["restarts"] == 0
    requeued = [e for e in view["journal"] if e["kind"] == "requeued"]
    assert len(requeued) == 1 and 2 <= requeued[0]["step"] < epochs, requeued


@pytest.mark.ray
@pytest.mark.e2e
def test_rays_own_torch_example_runs_unchanged_as_a_script(env, tmp_path):
    from ray.train.examples.pytorch import torch_linear_example

    from tests.jobtest import finished, mlflow_run

    job = _submit_script(env, tmp_path, torch_linear_example.__file__, "--num-workers", "2", "--use-gpu",
                         "--epochs", "2")
    assert str(finished(env, job, timeout=300)).endswith("SUCCEEDED")
    logs = env["client"].get_job_logs(job)
    assert re.search(r"^\{'loss': [0-9.e-]+\}$", logs, re.M), logs[-3000:]  # the example's print(result.metrics)
    (wl,) = _workloads_of(env, job, logs)
    assert wl["spec"]["name"] == "torch-linear-example" and wl["state"] == "SUCCEEDED"
    assert mlflow_run(env, wl["id"]).info.status == "FINISHED"


def test_raylane_submit_script_builds_the_driver_command_and_refuses_what_it_cannot_submit(tmp_path):
    from typer.testing import CliRunner

    from raylane.cli import app
    from raylane.cli.cluster import script_entrypoint

    assert script_entrypoint("/py", "src/train.py", ["--lr", "1e-3", "a b"], team="team-a", class_name="pretrain",
                             name="nightly") == \
        "/py -m raylane.run --team team-a --class pretrain --name nightly src/train.py --lr 1e-3 'a b'"
    (tmp_path / "train.py").write_text("print('hi')\n")
    outside = tmp_path.parent / f"{tmp_path.name}-elsewhere.py"
    cases = [(["--script", "train.py", "--class", "pretrain"], "--team"),
             (["--script", "train.py", "--team", "team-a"], "--class"),
             (["--script", "missing.py", "--team", "team-a", "--class", "pretrain"], "--script"),
             (["--script", str(outside), "--team", "team-a", "--class", "pretrain"], "--script"),
             (["--team", "team-a", "spec.yaml"], "--script with --team")]
    for args, named in cases:
        r = CliRunner().invoke(app, ["submit", "--working-dir", str(tmp_path), *args, "--", "--epochs", "2"])
        assert r.exit_code == 1 and named in r.output, (args, r.output)


def test_the_users_loop_config_and_run_config_parts_are_kept_and_ray_defaults_are_not_taken_for_choices():
    from ray.train import CheckpointConfig, RunConfig
    from ray.train.constants import DEFAULT_STORAGE_PATH
    from ray.train.torch import TorchTrainer

    from raylane.script.trainer import _storage_of, _user_parts

    keep = CheckpointConfig(num_to_keep=1)
    mine = TorchTrainer(lambda c: None, train_loop_config={"lr": 0.1}, scaling_config=_scaling(num_workers=1),
                        run_config=RunConfig(name="r", storage_path="/data/ckpt", checkpoint_config=keep))
    parts = _user_parts(mine)
    assert (parts.train_loop_config, parts.checkpoint_config, _storage_of(_ctx(), mine)) == \
        ({"lr": 0.1}, keep, "/data/ckpt")
    plain = TorchTrainer(lambda: None, scaling_config=_scaling(num_workers=1))
    assert plain.run_config.storage_path == DEFAULT_STORAGE_PATH  # Ray's default: not the user's choice
    assert _user_parts(plain).checkpoint_config is None
    assert _storage_of(_ctx(storage_path="/platform/runs"), plain) == "/platform/runs"


def test_a_scripts_job_token_submits_each_fit_and_is_retired_when_its_ray_job_ends(tmp_path):
    """``raylane submit --script`` asks for a script's job token (``JobToken.script``): it submits a workload per
    ``fit()`` (train or tune, its team only), outlives the end of one fit's workload, and is retired once its
    workloads have ended and so has their Ray job (the control plane's job watch). Ray-free: the state machine."""
    from raylane.control import gate as gate_mod
    from raylane.control.state import JOB_WATCH_S
    from raylane.errors import PermissionDeniedError
    from tests.controltest import Harness
    from tests.raytest import local_policy, spec

    h = Harness(str(tmp_path / "journal.db"), local_policy(pretrain={"min_runtime": 0}), auth={"enabled": True})
    try:
        bob = h.cs.gate.add_token(user="bob", teams=["team-b"], role="member", created_by="test")
        tok = h.call("job_token", bob, note="script", script=True)["token"]
        plain = h.call("job_token", bob, note="one workload")["token"]
        h.host.jobs = {"raysubmit_script": "RUNNING"}
        first = h.call("submit", tok, spec=spec("fit-1", "team-b", "pretrain"), job_id="raysubmit_script")["id"]
        h.call("submit", plain, spec=spec("one", "team-b", "pretrain"))
        with pytest.raises(PermissionDeniedError, match="submits once"):  # a plain job token: one workload
            h.call("submit", plain, spec=spec("two", "team-b", "pretrain"))
        with pytest.raises(PermissionDeniedError):  # a script's: its team only
            h.call("submit", tok, spec=spec("elsewhere", "team-a", "pretrain"))
        h.tick()
        h.call("report", tok, workload_id=first, kind="running", job_id="raysubmit_script")
        h.call("release", tok, workload_id=first, outcome="finished", state="SUCCEEDED")
        h.clock.advance(JOB_WATCH_S + 1)
        h.tick()  # its job still runs: the script goes on to its next fit()
        tid = tok.split("_")[1]
        assert h.cs.gate.scopes[tid].retired is None
        second = h.call("submit", tok, spec=spec("fit-2", "team-b", "pretrain"), job_id="raysubmit_script")["id"]
        h.call("cancel", tok, workload_id=second)
        h.host.jobs["raysubmit_script"] = "SUCCEEDED"  # the script exits
        h.clock.advance(JOB_WATCH_S + 1)
        h.tick()
        assert h.cs.gate.scopes[tid].retired is not None
        assert h.cs.gate.store.tokens[tid].expires <= h.clock() + gate_mod.AFTER_END_S
        with pytest.raises(PermissionDeniedError, match="its workloads have ended"):
            h.call("submit", tok, spec=spec("fit-3", "team-b", "pretrain"))
    finally:
        h.close()
