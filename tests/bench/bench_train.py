"""Training through Raylane against bare Ray Train on the same local cluster, both submitted as Ray jobs:

1. submit-to-first-step of a user's own Ray Train loop (tests/bench/user_loop, submitted with --working-dir):
   `python -m raylane.run SPEC` (checks the entrypoint, registers, is admitted, hands the lease over to a
   TorchTrainer) against a job running the same loop in a bare TorchTrainer; ratio Raylane / bare.
2. preemption decision to GPUs free: a running gang is preempted by a higher-class gang of another team; the time
   from the control actor's decision (its journal entry) to Ray reporting the GPUs available again.

    python -m tests.bench.bench_train [--runs N]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.2")
os.environ.setdefault("RAY_TRAIN_ENABLE_PREEMPTION_WATCHER", "0")

TRAIN = {"max_steps": 30, "checkpoint_every": 10, "batch_size": 8, "warmup_steps": 2,
         "corpus": {"max_bytes": 200_000}, "model": {"d_model": 32, "n_layers": 1, "n_heads": 2, "context": 32}}
ENV = {"env_vars": {"RAY_AUTH_MODE": "disabled", "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.2",
                    "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0"}}
LOOP = Path(__file__).parent / "user_loop"
LOOP_ENV = {**ENV, "working_dir": str(LOOP)}


def _wait_file(path: Path, timeout: float = 300) -> float:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if path.exists() and path.read_text():
            return float(path.read_text())
        time.sleep(0.05)
    raise TimeoutError(path)


def _wait_job(client, job_id, timeout=300):
    deadline = time.time() + timeout
    while time.time() < deadline:
        s = str(client.get_job_status(job_id))
        if s.endswith(("SUCCEEDED", "FAILED", "STOPPED")):
            return s
        time.sleep(0.5)
    raise TimeoutError(job_id)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=2)
    args = ap.parse_args(argv)

    import ray
    import yaml
    from ray.job_submission import JobSubmissionClient

    from raylane.control.client import start_control, stop_control
    from raylane.jobs import submit_job, with_credential
    from tests.raytest import local_policy, spec, start_cluster, stop_cluster

    tmp = Path(tempfile.mkdtemp(prefix="raylane-bench-train-"))
    storage = str(tmp / "runs")
    cluster = start_cluster(gpu_nodes=(("gpu-a", ["gpu-sim"]),), gpus=4, cpus=4, dashboard=True)
    ray.init(address=cluster.address, namespace="raylane", log_to_driver=False)
    try:
        ctl = start_control(local_policy(pretrain={"min_runtime": 0}), str(tmp / "journal.db"), tick_s=0.2)
        # Raylane's drivers act as the operator; the credential is uploaded with each job, as `raylane submit` does.
        token = ctl.credential.token
        client = JobSubmissionClient("http://" + ray._private.worker.get_dashboard_url())
        bare, lane = [], []
        for i in range(args.runs):
            marker = tmp / f"bare-{i}.t"
            cfg = {"steps": 20, "checkpoint_every": 10, "first_step_file": str(marker)}
            t0 = time.time()
            job = submit_job(client, entrypoint=f"{sys.executable} bench_loop.py '{json.dumps(cfg)}' {storage} "
                                               f"bare-{i}", runtime_env=LOOP_ENV)
            bare.append(_wait_file(marker) - t0)
            _wait_job(client, job)

            marker = tmp / f"lane-{i}.t"
            s = spec(f"lane-{i}", "team-a", "pretrain", gpu=1, cpu=1, entrypoint="bench_loop:train_loop_per_worker",
                     config={"steps": 20, "checkpoint_every": 10, "first_step_file": str(marker)})
            path = tmp / f"lane-{i}.yaml"
            path.write_text(yaml.safe_dump(s))
            t0 = time.time()
            job = submit_job(client, entrypoint=f"{sys.executable} -m raylane.run {path} --storage-path {storage} "
                                               f"--tracking-uri sqlite:///{tmp / 'mlflow.db'}",
                             runtime_env=with_credential(LOOP_ENV, token))
            lane.append(_wait_file(marker) - t0)
            _wait_job(client, job)
        b, l = statistics.median(bare), statistics.median(lane)
        print(f"submit-to-first-step of a user's Ray Train loop, median of {args.runs}: bare TorchTrainer job {b:.2f} s, "
              f"through Raylane {l:.2f} s; ratio {l / b:.2f} (target <= 1.1)")
        print(f"  bare runs: {', '.join(f'{x:.2f}' for x in bare)}; raylane runs: {', '.join(f'{x:.2f}' for x in lane)}")

        # Preemption decision -> GPUs free.
        a = spec("victim", "team-a", "pretrain", gpu=4, cpu=1, config=dict(TRAIN, max_steps=100000, report_every=1))
        marker = tmp / "victim.t"
        a["config"]["fault"] = {"first_step_file": str(marker)}
        (tmp / "victim.yaml").write_text(yaml.safe_dump(a))
        vjob = submit_job(client, entrypoint=f"{sys.executable} -m raylane.run {tmp / 'victim.yaml'} "
                                            f"--storage-path {storage} --tracking-uri sqlite:///{tmp / 'mlflow.db'}",
                                 runtime_env=with_credential(ENV, token))
        _wait_file(marker)
        victim = ctl.find_job(vjob).id
        b_spec = spec("reclaimer", "team-b", "finetune", gpu=2, cpu=1)
        ctl.submit(b_spec)  # a reservation: admitted as soon as the GPUs are free
        deadline = time.time() + 120
        decided = freed = None
        while time.time() < deadline:
            ex = ctl.explain(victim)
            pre = [e for e in ex["journal"] if e["kind"] == "preempting"]
            if pre and decided is None:
                decided = pre[0]["ts"]
            if decided is not None and ray.available_resources().get("GPU", 0) >= 2:
                freed = time.time()
                break
            time.sleep(0.02)
        if decided is None or freed is None:
            print("preemption decision to GPUs free: not observed within 120 s")
        else:
            print(f"preemption decision to GPUs free (graceful yield: checkpoint, release, Train group removed): "
                  f"{freed - decided:.2f} s")
        client.stop_job(vjob)
    finally:
        stop_control()
        stop_cluster(cluster)


if __name__ == "__main__":
    main()
