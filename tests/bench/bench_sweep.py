"""GPU-seconds of an ASHA sweep against the same trials under FIFO: what early stopping saves.

Scene: a local Ray cluster (one node of 2 logical GPUs) and the control actor with policies/local.yaml. The same
sweep of the small LM runs twice through ``raylane.launchers.tune.run_sweep``: same search space (learning rate,
log-uniform over 1e-5..3e-2), same search algorithm and seed (Tune's random generator, so both draw the same
configs in the same order), same budget (``--steps`` steps, a report and checkpoint every 20), 1 logical GPU per
trial, 2 at a time. The baseline is FIFO (every trial runs the whole budget); the other is ASHA (eta 2, grace 20:
rungs at 20, 40, 80).

Printed, for each: GPU-seconds used (seconds between a trial's results times its GPUs, summed: the compute of
training and evaluation; actor start-up is not counted, and both sweeps start the same number of trials), trial
steps trained, wall time, trials stopped early and the best validation loss; then ASHA / FIFO ratios, and ASHA's own
estimate of the full-budget cost (what the MLflow parent run records) against FIFO's measured cost.

    python -m tests.bench.bench_sweep [--trials 8] [--steps 160]
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

# Big enough that a report's 20 steps outweigh its fixed costs (evaluation, checkpoint, Tune's round trip).
LM = {"batch_size": 16, "warmup_steps": 5, "eval_windows": 8, "corpus": {"max_bytes": 100_000},
      "model": {"d_model": 64, "n_layers": 2, "n_heads": 4, "context": 64}}


def sweep(name: str, scheduler: dict, trials: int, steps: int) -> dict:
    return {"name": name, "team": "team-a", "class": "sweep", "kind": "tune", "config": dict(LM),
            "run": {"intent": "benchmark: ASHA against FIFO", "owner": "bench"},
            "sweep": {"trainable": "workloads.ray_tune:lm_trainable",
                      "space": {"lr": {"type": "loguniform", "low": 1e-5, "high": 3e-2}},
                      "search": {"algorithm": "random", "seed": 0},
                      "budget": {"max": steps, "report_every": 20}, "scheduler": scheduler,
                      "metric": "val_loss", "mode": "min", "trials": trials, "max_concurrent": 2,
                      "resources": {"gpu": 1, "cpu": 0.5}}}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=8)
    ap.add_argument("--steps", type=int, default=160)
    args = ap.parse_args(argv)
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

    import ray

    from raylane.control.client import start_control, stop_control
    from raylane.launchers.tune import run_sweep
    from tests.raytest import local_policy, start_cluster

    tmp = Path(tempfile.mkdtemp(prefix="raylane-bench-sweep-"))
    cluster = start_cluster(gpu_nodes=(("gpu-a", ["gpu-sim"]),), gpus=2, cpus=4, head_cpus=1)
    ray.init(address=cluster.address, namespace="raylane", log_to_driver=False)
    out = {}
    try:
        ctl = start_control(local_policy(sweep={"min_runtime": 0}), str(tmp / "journal.db"), tick_s=0.2)
        for label, scheduler in (("fifo", {"type": "fifo"}), ("asha", {"type": "asha", "eta": 2, "grace_period": 20})):
            t0 = time.time()
            rec = run_sweep(sweep(f"bench-{label}", scheduler, args.trials, args.steps), ctl=ctl,
                            storage_path=str(tmp / "runs"), tracking_uri=f"sqlite:///{tmp / 'mlflow.db'}", verbose=0)
            rec["wall_s"] = time.time() - t0
            rec["configs"] = sorted(round(r.config["lr"], 12) for r in rec.pop("results"))
            out[label] = rec
    finally:
        stop_control()
        ray.shutdown()
        cluster.shutdown()

    fifo, asha = out["fifo"], out["asha"]
    assert fifo["configs"] == asha["configs"], "the two sweeps drew different configs"
    print(f"\nASHA vs FIFO: {args.trials} trials of the small LM, budget {args.steps} steps, same space and seed "
          f"(lr: {', '.join(f'{x:.2g}' for x in fifo['configs'])})")
    print(f"{'':<6}{'GPU-s used':>12}{'steps':>8}{'wall s':>9}{'stopped early':>15}{'best val_loss':>15}")
    for label, r in (("FIFO", fifo), ("ASHA", asha)):
        print(f"{label:<6}{r['gpu_seconds']['gpu_seconds_used']:>12.1f}{r['trained_steps']:>8}{r['wall_s']:>9.1f}"
              f"{r['stopped_early']:>15}{r['best']['val_loss']:>15.4f}")
    used = asha["gpu_seconds"]["gpu_seconds_used"] / fifo["gpu_seconds"]["gpu_seconds_used"]
    print(f"ratio ASHA/FIFO: GPU-seconds {used:.2f} (saved {100 * (1 - used):.0f}%), steps "
          f"{asha['trained_steps'] / fifo['trained_steps']:.2f}, wall {asha['wall_s'] / fifo['wall_s']:.2f}")
    print(f"ASHA's estimate of its full-budget cost (MLflow parent): {asha['gpu_seconds']['gpu_seconds_full_budget']:.1f}"
          f" GPU-s, saved {asha['gpu_seconds']['gpu_seconds_saved']:.1f}; FIFO measured "
          f"{fifo['gpu_seconds']['gpu_seconds_used']:.1f}")


if __name__ == "__main__":
    main()
