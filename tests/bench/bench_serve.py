"""Serving scale-up through Raylane: a replica that reclaims its GPU from preemptible training against one that lands
on a GPU already free, both in the same burst of the same run; and request latency during the burst.

Setup (one local Ray cluster, logical GPUs): a GPU node of 4. The serving app (team-b, class serving, 1 to 3
replicas of 1 GPU, target 2 ongoing requests per replica) holds 1 GPU; team-a's pretraining gang holds 2 (team-a
borrows 1 of them: this policy gives team-a 1 GPU nominal and team-b 3); 1 GPU is free. A burst of closed-loop
clients on localhost makes the autoscaler want 3 replicas at once: one replica lease is admitted on the free GPU,
the other preempts the training gang (graceful: it checkpoints and yields first).

Printed, per round:
- demand (the lease submitted) to the first request answered by the new replica, for the free and the reclaim
  replica, and their ratio (reclaim / free; the issue's target is at most 1.5), with the driver's breakdown:
  demand -> lease granted (admission, the preemption included) -> replica RUNNING -> first answer;
- p50 / p99 request latency over the whole burst, before and after the new replicas serve.

    python -m tests.bench.bench_serve [--rounds N] [--clients C] [--token-delay-ms MS]

Timings are printed, not asserted (CONVENTIONS: benchmarks print figures and ratios against a baseline of the same
run).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.2")
os.environ.setdefault("RAY_TRAIN_ENABLE_PREEMPTION_WATCHER", "0")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")

SHAPE = {"d_model": 32, "n_layers": 1, "n_heads": 2, "context": 32}
TRAIN = {"max_steps": 1_000_000, "checkpoint_every": 1000, "batch_size": 8, "warmup_steps": 2, "eval_every": 0,
         "corpus": {"max_bytes": 200_000}, "model": SHAPE}


def _policy() -> dict:
    from tests.raytest import local_policy

    p = local_policy(pretrain={"min_runtime": "2s"})
    p["teams"]["team-a"]["quotas"]["gpu"] = {"nominal": 1, "borrowing_limit": 3}
    p["teams"]["team-b"]["quotas"]["gpu"] = {"nominal": 3, "borrowing_limit": 1}
    return p


def _serve_spec(checkpoint: str, token_delay_ms: float, downscale_s: float) -> dict:
    return {
        "name": "lm", "team": "team-b", "class": "serving", "kind": "serve",
        "serve": {
            "model": {"deployment": "workloads.serve_lm:LMServer",
                      "args": {"checkpoint": checkpoint, "max_new_tokens": 8, "token_delay_ms": token_delay_ms}},
            "route_prefix": "/lm",
            "replica": {"resources": {"gpu": 1, "cpu": 0.5}, "max_ongoing_requests": 64},
            "autoscaling": {"min_replicas": 1, "max_replicas": 3, "target_ongoing_requests": 2,
                            "upscale_delay": "1s", "downscale_delay": downscale_s},
            "latency_objective_ms": 1000,
        },
        "run": {"intent": "benchmark: reclaim vs free scale-up", "owner": "bench"},
    }


def _ms(values):
    from tests.loadgen import percentile

    lat = [v * 1000 for v in values]
    if not lat:
        return "-"
    return f"p50 {percentile(lat, 50):7.0f} ms  p99 {percentile(lat, 99):7.0f} ms  (n={len(lat)})"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="python -m tests.bench.bench_serve", description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--clients", type=int, default=6)
    ap.add_argument("--token-delay-ms", type=float, default=20.0)
    ap.add_argument("--serve-after-s", type=float, default=8.0, help="burst length once all replicas serve")
    args = ap.parse_args(argv)

    import ray
    import yaml
    from ray import serve
    from ray.cluster_utils import Cluster

    from raylane.control.client import State, start_control, stop_control
    from raylane.launchers.serve import ServingDriver
    from tests.loadgen import LoadGen
    from tests.raytest import free_port, spec, wait_for
    from workloads.train_lm import LocalHooks, train

    tmp = Path(tempfile.mkdtemp(prefix="bench-serve-"))
    hooks = LocalHooks(tmp / "lm")
    train(dict(TRAIN, max_steps=4, checkpoint_every=4), hooks=hooks)
    downscale_s = 4.0

    t0 = time.perf_counter()
    cluster = Cluster(initialize_head=True, connect=False,
                      head_node_args={"num_cpus": 2, "num_gpus": 0, "include_dashboard": False})
    cluster.add_node(num_cpus=4, num_gpus=4)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, namespace="raylane", log_to_driver=False)
    ctl = start_control(_policy(), str(tmp / "journal.db"), tick_s=0.2)
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    print(f"cluster, control actor and Serve up in {time.perf_counter() - t0:.1f} s; logs under {tmp}")

    stop = threading.Event()
    driver = ServingDriver(_serve_spec(hooks.latest_checkpoint(), args.token_delay_ms, downscale_s), ctl=ctl,
                           poll_s=0.25, say=lambda m: None)
    th = threading.Thread(target=driver.run, args=(stop,), daemon=True)
    th.start()
    wait_for(lambda: driver.url and driver.running >= 1, timeout=180, what="the serving app")
    url = driver.url

    # Training, as its own driver process (python -m raylane.run), takes 2 of the 3 other GPUs.
    train_spec = spec("pre-a", "team-a", "pretrain", workers=1, gpu=2, cpu=1, config=TRAIN)
    (tmp / "train.yaml").write_text(yaml.safe_dump(train_spec))
    log = open(tmp / "train.log", "w")
    trainer = subprocess.Popen(
        [sys.executable, "-m", "raylane.run", str(tmp / "train.yaml"), "--storage-path", str(tmp / "runs"),
         "--tracking-uri", f"sqlite:///{tmp / 'mlflow.db'}"],
        # A driver started by hand (not a Ray job) finds its credential in RAYLANE_TOKEN: the operator's here.
        env=dict(os.environ, RAY_ADDRESS=cluster.address, RAYLANE_TOKEN=ctl.credential.token), stdout=log,
        stderr=subprocess.STDOUT)

    def training():
        return next((r for r in ctl.queue() if r.id.startswith("pre-a-")), None)

    def steps_logged() -> int:
        from raylane.tracking import client_for

        r = next((r for r in ctl.queue(include_done=True) if r.id.startswith("pre-a-")), None)
        if r is None:
            return 0
        mlf = client_for(f"sqlite:///{tmp / 'mlflow.db'}")
        runs = mlf.search_runs([e.experiment_id for e in mlf.search_experiments()],
                               f"tags.`raylane.workload_id` = '{r['id']}'")
        return len(mlf.get_metric_history(runs[0].info.run_id, "loss")) if runs else 0

    try:
        for rnd in range(1, args.rounds + 1):
            # The gang is training (steps logged since its last start), past its class's minimum runtime.
            mark = steps_logged()
            wait_for(lambda: (r := training()) and r.state is State.RUNNING and steps_logged() >= mark + 50,
                     timeout=240, every=0.5, what="training stepping")
            time.sleep(2.0)
            free = ray.available_resources().get("GPU", 0)
            print(f"\nround {rnd}: training holds 2 GPUs, serving 1, free {free:g}")
            n_before = len(driver.leases)
            gen = LoadGen(url, clients=args.clients, max_requests=100_000, deadline_s=300).start()
            new = wait_for(lambda: len(driver.leases) >= n_before + 2 and driver.leases[n_before:],
                           timeout=60, what="two replica demands")
            wait_for(lambda: all(l.replica_id and gen.first_answer_by(l.replica_id) for l in new), timeout=180,
                     every=0.1, what="both new replicas answering")
            time.sleep(args.serve_after_s)
            results = gen.stop()
            bad = [r for r in results if r.status != 200]
            by_path = {l.path: l for l in new}
            print(f"  burst: {len(results)} requests, {len(bad)} not answered 200, "
                  f"{len(gen.replicas())} replicas answered")
            rows = {}
            for path in ("free", "reclaim"):
                l = by_path.get(path)
                if l is None:
                    print(f"  {path:8s}: no such replica this round (paths: {sorted(by_path)})")
                    continue
                first = gen.first_answer_by(l.replica_id)
                rows[path] = first - l.demand_at
                print(f"  {path:8s}: demand -> first answer {rows[path]:6.2f} s   "
                      f"(granted +{l.granted_at - l.demand_at:5.2f} s, RUNNING +{l.serving_at - l.demand_at:5.2f} s"
                      f", first answer +{first - l.demand_at:5.2f} s)"
                      + (f"  reclaimed {l.reclaimed_gpus:g} GPU(s) from {', '.join(l.reclaimed_from)}"
                         if l.reclaimed_from else ""))
                if l.reclaimed_from:
                    j = {e["kind"]: e["ts"] for e in ctl.explain(l.reclaimed_from[0])["journal"]
                         if e["ts"] >= l.demand_at}
                    if "preempting" in j and "requeued" in j:
                        print(f"            reclaim: preemption decided +{j['preempting'] - l.demand_at:5.2f} s, "
                              f"training yielded and released +{j['requeued'] - l.demand_at:5.2f} s, "
                              f"lease granted +{l.granted_at - l.demand_at:5.2f} s")
            if len(rows) == 2:
                print(f"  ratio reclaim / free: {rows['reclaim'] / rows['free']:.2f}  (target <= 1.5)")
            serving_from = max(gen.first_answer_by(l.replica_id) for l in new)
            lat_all = [r.latency_s for r in results if r.status == 200]
            print(f"  request latency, whole burst:        {_ms(lat_all)}")
            print(f"  request latency, 1 replica serving:  "
                  f"{_ms([r.latency_s for r in results if r.status == 200 and r.sent_at < new[0].demand_at])}")
            print(f"  request latency, 3 replicas serving: "
                  f"{_ms([r.latency_s for r in results if r.status == 200 and r.sent_at >= serving_from])}")
            print(f"  latency objective (p99): {driver.sv.latency_objective_ms:g} ms")
            # Lull: the two replicas go back after the downscale delay and the training resumes.
            wait_for(lambda: all(l.state == "released" for l in new), timeout=120, what="replicas given back")
            back = max(l.released_at for l in new)
            r = wait_for(lambda: (r := training()) and r.state is State.RUNNING and r, timeout=120,
                         what="training admitted again")
            held = min(l.released_at - l.granted_at for l in new)
            print(f"  lull: replicas given back after >= {held:.1f} s held (downscale delay {downscale_s:g} s); "
                  f"training running again {time.time() - back:.1f} s later (preemptions {r['preemptions']})")
    finally:
        stop.set()
        th.join(120)
        r = training()
        if r is not None:
            ctl.cancel(r.id)
        trainer.terminate()
        try:
            trainer.wait(30)
        except subprocess.TimeoutExpired:
            trainer.kill()
        log.close()
        try:
            serve.shutdown()
        except Exception:  # noqa: BLE001
            pass
        stop_control()
        ray.shutdown()
        cluster.shutdown()
    print(f"\n[bench_serve: {time.perf_counter() - t0:.1f} s]")


if __name__ == "__main__":
    main()
