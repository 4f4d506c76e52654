"""The README's own commands on a fresh HOME, from a shell whose PATH does not have the venv (issue 26, items 1 and
7): `.venv/bin/raylane up`, then the README's plain `ray job submit` line, word for word but for the spec, for a
small training run; its script-mode line, word for word but for the team, class, script and arguments, for a small
unchanged Ray Train script (issue 45); and the ends a user sees: a workload cancelled with `raylane cancel` makes its
`ray job submit` exit non-zero with its MLflow run KILLED, and a run left open when the cluster went down is closed,
KILLED with the reason, once `raylane up` starts the next cluster on the same journal.

One cluster for the module (the last test stops it and starts the next one), on the README's fixed ports; skipped
when another Ray session holds them."""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml

from tests.conftest import SESSION_KEY
from tests.raytest import LM_ENTRYPOINT, wait_for

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.e2e]
REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent  # the venv's bin folder: .venv/bin
TRAIN = {"max_steps": 6, "checkpoint_every": 3, "batch_size": 4, "warmup_steps": 1, "eval_every": 0,
         "corpus": {"max_bytes": 100_000}, "model": {"d_model": 16, "n_layers": 1, "n_heads": 2, "context": 16}}


# How long a driver may take from its submit to its gang holding at step 3. `make test` runs this module beside
# test_train_e2e, whose three side-by-side gangs start about when this module's last test does: in a fresh-clone CI
# run the machine's load average reached 34 then, the driver took 129 s from its admission to its gang's start
# (60 s and less before and after), and the gang had not reached step 3 within the 180 s this wait had then.
GANG_S = 480.0


def readme_submit_lines() -> str:
    """The README's plain submit lines ("Using it"), from the `export` of the cluster's token to the submit."""
    text = (REPO / "README.md").read_text()
    start = text.index("export RAY_AUTH_MODE=token")
    end = text.index("\n", text.index("python -m raylane.run examples/specs/pretrain-team-a.yaml", start))
    return text[start:end]


SCRIPT_ARGS = "--team T --class C train.py ARGS"  # the README's placeholders in its script-mode line

# A plain Ray Train script, nothing of Raylane in it: one worker of one (logical) GPU, a checkpoint every epoch.
TINY_SCRIPT = """\
import argparse, os, tempfile

import ray.train
import torch
from ray.train import Checkpoint, RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer


def train_func(config):
    model = torch.nn.Linear(1, 1)
    x = torch.linspace(0, 1, 16).unsqueeze(1)
    for epoch in range(1, config["epochs"] + 1):
        loss = torch.nn.functional.mse_loss(model(x), 2 * x)
        with tempfile.TemporaryDirectory() as d:
            torch.save(model.state_dict(), os.path.join(d, "model.pt"))
            ray.train.report({"step": epoch, "loss": loss.item()}, checkpoint=Checkpoint.from_directory(d))


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=1)
    args = p.parse_args()
    result = TorchTrainer(train_func, train_loop_config={"epochs": args.epochs},
                          scaling_config=ScalingConfig(num_workers=1, use_gpu=True),
                          run_config=RunConfig(name="readme-script")).fit()
    print("SCRIPT RESULT step", result.metrics["step"], flush=True)
"""


def readme_script_lines() -> str:
    """The README's script-mode submit ("Using it"), after the same `export` of the cluster's token."""
    text = (REPO / "README.md").read_text()
    start = text.index("export RAY_AUTH_MODE=token")
    export = text[start:text.index("\n", start)]
    at = text.index(f"python -m raylane.run {SCRIPT_ARGS}", start)
    first = text.rindex(".venv/bin/ray job submit", start, at)
    return export + "\n" + text[first:text.index("\n", at)]


def tiny_spec(path: Path, name: str, **config) -> Path:
    path.write_text(yaml.safe_dump({
        "name": name, "team": "team-a", "class": "pretrain", "kind": "train", "entrypoint": LM_ENTRYPOINT,
        "gang": {"workers": 1, "resources": {"gpu": 1, "cpu": 1}}, "config": {**TRAIN, **config},
        "run": {"intent": f"README check {name}", "owner": "pytest"}}))
    return path


@pytest.fixture(scope="module")
def user(tmp_path_factory):
    """A new user's shell: an empty HOME, PATH without the venv; the cluster started from it with `raylane up`."""
    for port in (6390, 8265, 10001):
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                pytest.skip(f"port {port} is taken (another Ray session): `raylane up` needs it")
    home = tmp_path_factory.mktemp("home")
    # Short, whatever TMPDIR the suite runs under: Ray's sockets live under it (the dashboard's modules listen on
    # <tmp>/ray/session_<...>/sockets/dash_<Module>, refused past 107 characters: under CI's TMPDIR they were).
    tmp = tempfile.mkdtemp(prefix="rl-", dir="/tmp")
    env = {"HOME": str(home), "PATH": "/usr/bin:/bin", "TMPDIR": tmp, "LANG": "C.UTF-8",
           SESSION_KEY: os.environ[SESSION_KEY]}
    u = {"home": home, "env": env, "specs": tmp_path_factory.mktemp("specs"),
         "uri": f"sqlite:///{home / '.raylane' / 'mlflow.db'}"}
    try:
        raylane(u, "up", "--no-console", timeout=240)
        yield u
    finally:
        raylane(u, "down", timeout=120, check=False)
        shutil.rmtree(tmp, ignore_errors=True)


def raylane(u, *args, timeout=60, check=True) -> subprocess.CompletedProcess:
    out = subprocess.run([str(BIN / "raylane"), *args], env=u["env"], cwd=REPO, capture_output=True, text=True,
                         timeout=timeout)
    assert not check or out.returncode == 0, f"raylane {' '.join(args)}: {out.stdout}\n{out.stderr}"
    return out


def submit(u, spec: Path) -> subprocess.Popen:
    """The README's lines in the user's shell, with ``spec`` for the README's example spec; waits, as written."""
    script = readme_submit_lines().replace("examples/specs/pretrain-team-a.yaml", str(spec))
    # A session of its own: a test that gives up kills the shell and its `ray job submit` together (``stop``).
    # Unbuffered, as on the user's terminal: `ray job submit` into a pipe holds the job's log lines back otherwise.
    return subprocess.Popen(["bash", "-c", script], env={**u["env"], "PYTHONUNBUFFERED": "1"}, cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate()


def workload_of(proc: subprocess.Popen, lines: list, timeout: float = GANG_S) -> str:
    """The workload id the driver prints, reading the job's log as `ray job submit` tails it. What is read is kept in
    ``lines`` (the text as it came, a line not yet ended included), for ``proc.communicate()``'s rest to follow.

    The pipe is read with ``os.read``, not ``readline``: a readline after ``select`` reads all that has come into the
    file object's buffer and returns its first line, and ``select`` does not see the lines left there. The line
    with the id, printed a moment after the one before it, then waited there for the next output (CI missed it so,
    in 180 s, while the driver held its gang quietly at step 3)."""
    import selectors

    deadline = time.time() + timeout
    fd, pending = proc.stdout.fileno(), b""
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        while time.time() < deadline:
            if not sel.select(timeout=1.0):
                continue
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                break
            *ended, pending = (pending + chunk).split(b"\n")
            new = "".join(raw.decode(errors="replace") + "\n" for raw in ended)
            lines.append(new)
            m = re.search(r"\[raylane\] workload (\S+) submitted", new)
            if m:
                lines.append(pending.decode(errors="replace"))
                return m.group(1)
    raise AssertionError("no workload id in the job's output:\n" + "".join(lines) + pending.decode(errors="replace"))


def mlflow_run(u, wid: str):
    from raylane.tracking import client_for

    client = client_for(u["uri"])
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()],
                              f"tags.`raylane.workload_id` = '{wid}'")
    assert len(runs) <= 1
    return runs[0] if runs else None


def holding(u, wid: str) -> bool:
    """Whether the gang holds at its checkpointed step 3 (``hold_at_step``), as the control plane records it."""
    rec = json.loads(raylane(u, "explain", wid, "--json").stdout)
    return rec["state"] == "RUNNING" and (rec.get("step") or 0) >= 3


def test_readme_plain_submit_runs_in_the_venv_from_a_shell_without_it(user):
    assert str(BIN) not in user["env"]["PATH"]
    proc = submit(user, tiny_spec(user["specs"] / "ok.yaml", "readme-ok"))
    out, _ = proc.communicate(timeout=GANG_S)
    assert proc.returncode == 0, out[-4000:]
    wid = re.search(r"\[raylane\] workload (\S+) submitted", out).group(1)
    assert re.search(rf"{re.escape(wid)}: SUCCEEDED", out), out[-4000:]
    assert mlflow_run(user, wid).info.status == "FINISHED"


def test_readme_script_mode_submit_runs_an_unchanged_script(user, tmp_path):
    (tmp_path / "train.py").write_text(TINY_SCRIPT)
    script = readme_script_lines()
    assert "--working-dir . " in script
    script = script.replace("--working-dir . ", f"--working-dir {tmp_path} ").replace(
        SCRIPT_ARGS, "--team team-a --class pretrain train.py --epochs 2")
    proc = subprocess.Popen(["bash", "-c", script], env={**user["env"], "PYTHONUNBUFFERED": "1"}, cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=GANG_S)
    finally:
        if proc.poll() is None:
            stop(proc)
    assert proc.returncode == 0, out[-4000:]
    assert re.search(r"^SCRIPT RESULT step 2$", out, re.M), out[-4000:]  # fit()'s Result, in the script
    wid = re.search(r"\[raylane\] workload (\S+) submitted", out).group(1)
    assert mlflow_run(user, wid).info.status == "FINISHED"
    assert json.loads(raylane(user, "explain", wid, "--json").stdout)["state"] == "SUCCEEDED"


def test_cancelled_workload_fails_its_job_and_its_run_is_killed(user):
    proc = submit(user, tiny_spec(user["specs"] / "cancel.yaml", "readme-cancel", max_steps=400,
                                  fault={"hold_at_step": 3}))
    lines: list = []
    try:
        wid = workload_of(proc, lines)
        wait_for(lambda: holding(user, wid), timeout=GANG_S, every=5.0, what="the gang at step 3")
        raylane(user, "cancel", wid)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            stop(proc)
    out = "".join(lines) + out
    assert proc.returncode != 0, out[-4000:]  # `ray job submit` says the workload did not succeed
    assert "CANCELLED" in out, out[-4000:]
    run = mlflow_run(user, wid)
    assert run.info.status == "KILLED"
    journal = raylane(user, "explain", wid).stdout
    assert "stopping its Ray job" not in journal  # the driver exited on its own: no forced stop


def test_run_left_open_by_a_stopped_cluster_is_closed_at_the_next_start(user):
    proc = submit(user, tiny_spec(user["specs"] / "down.yaml", "readme-down", max_steps=400,
                                  fault={"hold_at_step": 3}))
    lines: list = []
    try:
        wid = workload_of(proc, lines)
        wait_for(lambda: holding(user, wid), timeout=GANG_S, every=5.0, what="the gang at step 3")
        raylane(user, "down", timeout=120)
        proc.wait(timeout=60)
    finally:
        stop(proc)
    t0 = time.time()
    raylane(user, "up", "--no-console", timeout=240)  # the same journal (~/.raylane/journal.db)
    run = wait_for(lambda: (r := mlflow_run(user, wid)).info.status != "RUNNING" and r, timeout=120, every=0.5,
                   what="the run closed after the restart")
    assert run.info.status == "KILLED"
    reason = run.data.tags.get("raylane.end_reason", "")  # only the control plane's close writes it
    assert reason, run.data.tags
    print(f"run closed {time.time() - t0:.1f}s after `raylane up` began: {reason}")
