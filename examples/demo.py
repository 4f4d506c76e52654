"""`make demo`: Raylane's main job on an embedded local cluster.

1. `raylane up`: a local Ray cluster (a CPU head and two nodes with 2 logical GPUs each, feature-tagged) and the
   control actor, with policies/local.yaml and a fresh journal.
2. Team A's preemptible pretraining gang (2 workers x 2 GPUs: it borrows 2 GPUs of team B's quota) is submitted
   with plain `ray job submit` and starts training.
3. Team B's higher-class fine-tuning gang arrives; its spec names A's latest checkpoint
   (``init_from: {workload: pretrain-tiny-lm, step: latest}``), resolved when B starts and kept safe from A's
   checkpoint retention until B has loaded it. B is within its nominal quota, so it reclaims what A borrowed: A
   checkpoints at its current step, yields and waits in the queue; B runs.
4. When B is done, A is admitted again, resumes from its checkpoint and finishes.
5. The queue, A's journal (admission, preemption, resume) and the MLflow runs are shown; then `raylane down`.
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


def ray_job_submit(spec_path: Path) -> str:
    out = sh(RAY, "job", "submit", "--address", "http://127.0.0.1:8265", "--no-wait",
             "--runtime-env-json", json.dumps({"env_vars": {"RAY_AUTH_MODE": "disabled",
                                                            "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0",
                                                            "RAYLANE_MLFLOW_URI": MLFLOW_URI}}),
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

    return JobSubmissionClient("http://127.0.0.1:8265")


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
    """The control actor, through this process's own Ray connection (polling via the CLI would be slow)."""
    global _CTL
    if _CTL is None:
        import ray

        from raylane.control.client import get_control

        ray.init(address="127.0.0.1:6390", namespace="raylane", logging_level="ERROR", log_to_driver=False)
        _CTL = get_control()
    return _CTL


def queue():
    from raylane.control.client import call

    return call(ctl(), "queue", True)


def state(wid):
    return next(r for r in queue() if r["id"] == wid)


def workload_of(job_id):
    from raylane.control.client import call

    rec = call(ctl(), "find_job", job_id)
    return rec["id"] if rec else None


def latest_checkpoint(wid):
    """The newest complete checkpoint of ``wid`` (one being written is skipped)."""
    from workloads.checkpoint import is_checkpoint

    run_dir = STORAGE / wid
    cps = [p for p in sorted(run_dir.glob("checkpoint_*")) if is_checkpoint(p)] if run_dir.is_dir() else []
    return str(cps[-1]) if cps else None


def main():
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ["RAYLANE_MLFLOW_URI"] = MLFLOW_URI
    t0 = time.time()
    banner("raylane up: local Ray cluster with logical GPUs + the control actor")
    sh(RAYLANE, "down", check=False, quiet=True)
    sh(RAYLANE, "up", "--fresh", "--policy", REPO / "policies" / "local.yaml")
    try:
        banner("team A submits pretraining with `ray job submit -- python -m raylane.run ...`")
        a_job = ray_job_submit(REPO / "examples/specs/pretrain-team-a.yaml")
        a = wait(lambda: workload_of(a_job), 180, "A registered")
        print(f"ray job {a_job} -> workload {a}")
        wait(lambda: latest_checkpoint(a), 240, "A's first checkpoint")
        show_queue("A is training (4 GPUs: 2 nominal + 2 borrowed from team B)")

        banner("team B submits a higher-class fine-tuning gang that starts from A's latest checkpoint")
        b_job = ray_job_submit(REPO / "examples/specs/finetune-team-b.yaml")
        b = wait(lambda: workload_of(b_job), 180, "B registered")
        wait(lambda: state(a)["preemptions"] >= 1, 120, "A preempted")
        wait(lambda: state(a)["state"] == "PENDING", 120, "A back in the queue")
        show_queue("A was preempted: it checkpointed at its current step and waits; B takes the GPUs")

        wait(lambda: state(b)["state"] in ("SUCCEEDED", "FAILED"), 600, "B to finish")
        wait(lambda: state(a)["state"] in ("RUNNING", "SUCCEEDED", "FAILED"), 300, "A to resume")
        show_queue("B finished; A was admitted again and resumes from its checkpoint")
        wait(lambda: state(a)["state"] in ("SUCCEEDED", "FAILED"), 900, "A to finish")
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
        ok = state(a)["state"] == state(b)["state"] == "SUCCEEDED"
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
