"""`make demo`: Raylane's main job on an embedded local cluster.

1. `raylane up`: a local Ray cluster (a CPU head and two nodes with 2 logical GPUs each, feature-tagged) and the
   control actor, with policies/local.yaml, a fresh journal and authentication on: `raylane up` writes an operator
   token to ~/.raylane/credentials (mode 0600), and the operator creates a member token for each team (alice on
   team-a, bob on team-b).
2. Team A's preemptible pretraining gang (2 workers x 2 GPUs: it borrows 2 GPUs of team B's quota) is submitted
   by alice with plain `ray job submit` (her token travels with the job as a py_modules entry,
   ``raylane.jobs.with_credential``) and starts training. Bob, of team B, sees where it stands in the queue, not its
   spec, and may not cancel it.
3. Team B's higher-class fine-tuning gang arrives; its spec names A's latest checkpoint
   (``init_from: {workload: pretrain-tiny-lm, step: latest}``), resolved when B starts and kept safe from A's
   checkpoint retention until B has loaded it. B is within its nominal quota, so it reclaims what A borrowed: A
   checkpoints at its current step, yields and waits in the queue; B runs.
4. When B (bob's) is done, A is admitted again, resumes from its checkpoint and finishes.
5. The queue, A's journal (admission, preemption, resume), the MLflow runs and the audit trail are shown; then
   `raylane down`.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path


REPO = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent
RAYLANE = str(VENV_BIN / "raylane")
RAY = str(VENV_BIN / "ray")
HOME = Path(os.environ.get("RAYLANE_HOME", Path.home() / ".raylane"))
STORAGE = HOME / "runs"
MLFLOW_URI = f"sqlite:///{HOME / 'mlflow.db'}"
TOKEN_TTL_S = 6 * 3600.0  # the demo's users' tokens outlive the demo, not the day
USERS = {"alice": ["team-a"], "bob": ["team-b"]}  # each a member of these teams


def sh(*cmd, check=True, quiet=False):
    p = subprocess.run([str(c) for c in cmd], text=True, capture_output=True)
    if not quiet and p.stdout.strip():
        print(p.stdout.rstrip())
    if check and p.returncode != 0:
        print(p.stderr[-3000:], file=sys.stderr)
        raise SystemExit(f"demo: `{' '.join(map(str, cmd[:4]))}` failed ({p.returncode})")
    return p.stdout


def banner(text):
    print(f"\n=== {text} " + "=" * max(0, 100 - len(text)), flush=True)


def ray_job_submit(spec_path: Path, token: str) -> str:
    """Plain `ray job submit`; the driver acts with ``token``, which travels with the job as a py_modules entry (on no
    command line, in no environment variable or job info)."""
    from raylane import localcluster
    from raylane.jobs import with_credential

    runtime_env = with_credential({"env_vars": {"RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0",
                                                "RAYLANE_MLFLOW_URI": MLFLOW_URI}}, token)
    out = sh(RAY, "job", "submit", "--address", localcluster.dashboard(), "--no-wait",
             "--runtime-env-json", json.dumps(runtime_env),
             "--", sys.executable, "-m", "raylane.run", spec_path, "--storage-path", STORAGE,
             "--tracking-uri", MLFLOW_URI, quiet=True)
    job = re.search(r"raysubmit_[A-Za-z0-9]+", out).group(0)
    JOBS.append(job)
    return job


def show_queue(title):
    banner(title)
    sh(RAYLANE, "queue", "--all")


JOBS = []


def jobs():
    from ray.job_submission import JobSubmissionClient

    from raylane import localcluster

    return JobSubmissionClient(localcluster.dashboard(), headers=localcluster.auth_headers())


def wait(pred, timeout, what):
    t0 = time.time()
    while time.time() - t0 < timeout:
        got = pred()
        if got:
            return got
        failed = [j for j in JOBS if str(jobs().get_job_status(j)).endswith("FAILED")]
        if failed:
            for j in failed:
                print(jobs().get_job_logs(j)[-4000:])
            raise SystemExit(f"demo: ray job {', '.join(failed)} failed while waiting for {what}")
        time.sleep(1.0)
    raise SystemExit(f"demo: timed out waiting for {what}")


_CTL = None


def ctl():
    """The operator's client (the token `raylane up` wrote to the credentials file), through this process's own Ray
    connection (polling via the CLI would be slow)."""
    global _CTL
    if _CTL is None:
        import ray

        from raylane import localcluster
        from raylane.control.client import ControlClient

        ray.init(address=localcluster.address(), namespace="raylane", logging_level="ERROR", log_to_driver=False)
        _CTL = ControlClient.connect()
    return _CTL


def queue():
    return ctl().queue(include_done=True)


def state(wid):
    return next(r for r in queue() if r.id == wid)


def workload_of(job_id):
    rec = ctl().find_job(job_id)
    return rec.id if rec else None


def users():
    """The operator creates a member token for each team's user; returns {user: token}."""
    from raylane import credentials

    me = ctl().whoami()
    print(f"operator: {me['user']} (token {me['token_id']}, written by `raylane up` to {credentials.default_file()}, "
          f"mode 0600)")
    made = {}
    for user, teams in USERS.items():
        t = ctl().token_create(user, teams, "member", ttl_s=TOKEN_TTL_S, note=f"make demo: {', '.join(teams)}")
        made[user] = t["token"]
        print(f"{user}: {t['role']} of {', '.join(teams)}, token {t['id']} (shown once; the control plane keeps its "
              f"salted digest only)")
    sh(RAYLANE, "token", "list")
    return made


def refused_to_another_team(wid, token):
    """What a member of another team may and may not do with ``wid``."""
    from raylane.errors import PermissionDeniedError

    other = ctl().as_user(token)
    who = other.whoami()["user"]
    seen = other.explain(wid)
    hidden = [k for k in ("spec", "config", "owner", "journal") if k not in seen]
    print(f"{who} sees {wid}: {seen.state.value}, position {seen.position or '-'}; hidden from {who}: "
          f"{', '.join(hidden)}")
    try:
        other.cancel(wid)
    except PermissionDeniedError as exc:
        print(f"{who} cancels {wid}: refused: {exc}")
    else:
        raise SystemExit(f"demo: {who} cancelled {wid} of another team")
    if state(wid).state.terminal:
        raise SystemExit(f"demo: {wid} ended after a refused cancel")


def latest_checkpoint(wid):
    """The newest complete checkpoint of ``wid`` (one being written is skipped)."""
    from workloads.checkpoint import is_checkpoint

    run_dir = STORAGE / wid
    cps = [p for p in sorted(run_dir.glob("checkpoint_*")) if is_checkpoint(p)] if run_dir.is_dir() else []
    return str(cps[-1]) if cps else None


def main():
    from raylane import localcluster
    from raylane.control.client import State

    # The demo acts with the tokens `raylane up` and its operator make, never with one from the caller's shell.
    os.environ.pop("RAYLANE_TOKEN", None)
    os.environ["RAYLANE_MLFLOW_URI"] = MLFLOW_URI
    t0 = time.time()
    banner("raylane up: local Ray cluster with logical GPUs + the control actor, authentication on")
    sh(RAYLANE, "down", check=False, quiet=True)
    sh(RAYLANE, "up", "--fresh", "--policy", REPO / "policies" / "local.yaml")
    # Ray's own token for this process and the commands it runs (ray job submit, raylane), before Ray is touched.
    localcluster.use_client_env()
    try:
        banner("identities: the operator creates a member token for each team")
        tokens = users()

        banner("alice (team A) submits pretraining with `ray job submit -- python -m raylane.run ...`")
        a_job = ray_job_submit(REPO / "examples/specs/pretrain-team-a.yaml", tokens["alice"])
        a = wait(lambda: workload_of(a_job), 180, "A registered")
        print(f"ray job {a_job} -> workload {a}, owner {ctl().status(a).owner}")
        wait(lambda: latest_checkpoint(a), 240, "A's first checkpoint")
        show_queue("A is training (4 GPUs: 2 nominal + 2 borrowed from team B)")

        banner("bob (team B) and team A's workload: positions and reasons yes, spec no, cancel no")
        refused_to_another_team(a, tokens["bob"])

        banner("bob (team B) submits a higher-class fine-tuning gang that starts from A's latest checkpoint")
        b_job = ray_job_submit(REPO / "examples/specs/finetune-team-b.yaml", tokens["bob"])
        b = wait(lambda: workload_of(b_job), 180, "B registered")
        print(f"ray job {b_job} -> workload {b}, owner {ctl().status(b).owner}")
        wait(lambda: state(a)["preemptions"] >= 1, 120, "A preempted")
        wait(lambda: state(a).state is State.PENDING, 120, "A back in the queue")
        show_queue("A was preempted: it checkpointed at its current step and waits; B takes the GPUs")

        wait(lambda: state(b).terminal, 600, "B to finish")
        wait(lambda: state(a).state is State.RUNNING or state(a).terminal, 300, "A to resume")
        show_queue("B finished; A was admitted again and resumes from its checkpoint")
        wait(lambda: state(a).terminal, 900, "A to finish")
        show_queue("both finished")

        banner(f"events of {a}")
        sh(RAYLANE, "explain", a)
        banner(f"events of {b} (the checkpoint of A it was promised, pinned, loaded, released)")
        sh(RAYLANE, "explain", b)
        banner("MLflow runs (one per logical workload)")
        show_mlflow([a, b])
        banner("evaluation of A's final model")
        from workloads.eval_lm import evaluate

        print(json.dumps(evaluate(latest_checkpoint(a)), indent=1))
        banner("the audit trail (operators): every privileged call and every refusal")
        sh(RAYLANE, "audit")
        ok = state(a).state is State.SUCCEEDED and state(b).state is State.SUCCEEDED
        print(f"\ndemo {'OK' if ok else 'FAILED'} in {time.time() - t0:.0f}s; MLflow store {MLFLOW_URI}; "
              f"browse with: mlflow ui --backend-store-uri {MLFLOW_URI}")
        print(f"state kept in {HOME} (journal.db: the control plane's journal, started afresh by each demo; runs/: "
              f"checkpoints by workload id; mlflow.db: MLflow runs). A later demo adds to it and is not disturbed "
              f"by it; clear it with: rm -rf {HOME}")
        if not ok:
            raise SystemExit(1)
    finally:
        import ray

        ray.shutdown()
        if not os.environ.get("RAYLANE_DEMO_KEEP"):
            banner("raylane down")
            sh(RAYLANE, "down", check=False)


def show_mlflow(wids):
    from raylane.tracking import client_for

    client = client_for(MLFLOW_URI)
    exps = [e.experiment_id for e in client.search_experiments()]
    for wid in wids:
        for run in client.search_runs(exps, f"tags.`raylane.workload_id` = '{wid}'"):
            hist = client.get_metric_history(run.info.run_id, "loss")
            steps = [m.step for m in hist]
            t = run.data.tags
            print(f"{wid}: run {run.info.run_id} {run.info.status}; loss {hist[0].value:.3f} -> {hist[-1].value:.3f}"
                  f" over steps {min(steps)}..{max(steps)} ({len(steps)} points); preemptions="
                  f"{t.get('raylane.preemptions')} restarts={t.get('raylane.restarts')}; "
                  f"code {run.data.params.get('raylane.code_version', '?')}")


if __name__ == "__main__":
    main()
