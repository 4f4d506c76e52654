"""What early stopping saves: ASHA against FIFO on the same trials, over several search seeds.

Scene: a local Ray cluster (one node of 2 logical GPUs) and the control actor with policies/local.yaml. For each
seed, the same sweep of the small LM runs twice through ``raylane.launchers.tune.run_sweep``: same search space
(learning rate, log-uniform over 1e-5..3e-2), same search algorithm and seed (Tune's random generator, so both draw
the same configs in the same order), same budget (``--steps``, a report and checkpoint every ``--report-every``),
1 logical GPU per trial, 2 at a time. The baseline is FIFO (every trial runs the whole budget); the other is ASHA
(eta ``--eta``, grace one report: rungs at 1/8, 1/4, 1/2 of the budget by default) with synchronous rungs
(``scheduler: {asha, synchronous: true}``, ``raylane.sweeps.rungs``): each rung is decided once over every trial
that must reach it, so which trials stop depends on their results only, not on the order they report in.
``--asynchronous`` measures Tune's own ASHA instead, whose decisions do depend on that order.

Printed per seed, then the median and range over the seeds, each beside the goal (the sweeps issue's measurement,
0.46x GPU-seconds and 0.33x steps, one async run of 8 trials x 160 steps):
- GPU-seconds used (seconds between a trial's results times its GPUs, summed: training, evaluation, checkpoints and
  the set-up before a start's first result; actor start-up is not counted) and the ratio ASHA/FIFO: timing-dependent
  (machine load); split into *steady* GPU-seconds (results other than the first of a start: what scales with the
  steps) and *set-up* (the first result of each start: importing torch, loading the corpus, building the model,
  restoring a checkpoint), which FIFO pays once per trial and synchronous ASHA again for each promoted trial that
  waited at a rung (its actor stopped; it restarts from its checkpoint);
- trial steps trained and the ratio, the steps saved, and how many trials each rung stopped: where the savings
  come from; with synchronous rungs these follow from the trials' results alone;
- whether ASHA's best trial is FIFO's best (the same learning rate);
- whether the trials ASHA stopped are those the same rungs pick on FIFO's curves (``Halving`` replayed on the
  validation losses FIFO recorded at the rung steps; the LM's training is deterministic, so a timing-independent
  scheduler must agree).

    python -m tests.bench.bench_sweep [--seeds 3] [--trials 8] [--steps 80] [--report-every 10] [--eta 2]
                                      [--asynchronous]

``--seeds N`` runs seeds 0..N-1; ``--seeds 3,7,11`` runs those.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Dict, List

# The sweeps issue's figures (docs/sweeps.md before synchronous rungs): one asynchronous run, 8 trials x 160 steps.
GOAL = {"gpu_seconds": 0.46, "steps": 0.33}

# Big enough that a report's steps outweigh its fixed costs (evaluation, checkpoint, Tune's round trip).
LM = {"batch_size": 16, "warmup_steps": 5, "eval_windows": 8, "corpus": {"max_bytes": 100_000},
      "model": {"d_model": 64, "n_layers": 2, "n_heads": 4, "context": 64}}
METRIC = "val_loss"


def sweep(name: str, scheduler: dict, args, seed: int) -> dict:
    return {"name": name, "team": "team-a", "class": "sweep", "kind": "tune", "config": dict(LM),
            "run": {"intent": "benchmark: ASHA against FIFO", "owner": "bench"},
            "sweep": {"trainable": "workloads.ray_tune:lm_trainable",
                      "space": {"lr": {"type": "loguniform", "low": 1e-5, "high": 3e-2}},
                      "search": {"algorithm": "random", "seed": seed},
                      "budget": {"max": args.steps, "report_every": args.report_every}, "scheduler": scheduler,
                      "metric": METRIC, "mode": "min", "trials": args.trials, "max_concurrent": 2,
                      "resources": {"gpu": 1, "cpu": 0.5}}}


def children(uri: str, rec: dict) -> None:
    """Add to ``rec`` what the sweep's MLflow child runs (the complete record of its results) tell: ``curves``
    (trial id -> step -> the metric), ``steady_gpu_s`` and ``steady_steps`` (results other than the first of a
    start) and ``starts`` (a trial's first start and each restart from a checkpoint: one first result each)."""
    from mlflow import MlflowClient

    from raylane.sweeps.tracking import STEADY_GPU_SECONDS, STEADY_STEPS, TAG_TRIAL_ID, child_runs

    client = MlflowClient(uri)
    experiment_id = client.get_run(rec["mlflow_run_id"]).info.experiment_id
    runs = child_runs(client, experiment_id, rec["id"])
    rec["curves"] = {run.data.tags[TAG_TRIAL_ID]: {int(p.step): p.value for p in
                                                   client.get_metric_history(run.info.run_id, METRIC)} for run in runs}
    rec["steady_gpu_s"] = sum(float(run.data.metrics.get(STEADY_GPU_SECONDS, 0.0)) for run in runs)
    rec["steady_steps"] = sum(int(run.data.metrics.get(STEADY_STEPS, 0)) for run in runs)
    # Every start's first result covers one report's steps.
    rec["starts"] = round((rec["trained_steps"] - rec["steady_steps"]) / rec["report_every"])


def replay(fifo_curves: Dict[str, Dict[int, float]], rungs: List[int], eta: int, top: int) -> Dict[str, int]:
    """The last step of each trial under synchronous rungs, decided on FIFO's curves (trial id -> step)."""
    from raylane.sweeps.rungs import Halving

    h = Halving(rungs=rungs, eta=eta, expected=len(fifo_curves), max_t=top)
    for t in fifo_curves:
        h.add(t)
    for k, step in enumerate(rungs):
        for t in sorted(fifo_curves):
            if h.level.get(t) == k and t not in h.stopped:
                h.on_result(t, step, fifo_curves[t].get(step))
    return {t: (rungs[h.stopped[t]] if t in h.stopped else top) for t in fifo_curves}


def measure(run_sweep, ctl, tmp: Path, uri: str, label: str, scheduler: dict, args, seed: int) -> dict:
    t0 = time.time()
    rec = run_sweep(sweep(f"bench-{label}-s{seed}", scheduler, args, seed), ctl=ctl,
                    storage_path=str(tmp / "runs"), tracking_uri=uri, verbose=0)
    rec["wall_s"] = time.time() - t0
    results = rec.pop("results")
    rec["lr"] = {r.metrics["trial_id"]: round(r.config["lr"], 12) for r in results}
    rec["last_step"] = {r.metrics["trial_id"]: int(r.metrics["step"]) for r in results}
    rec["best_lr"] = round(float(rec["best"]["config"]["lr"]), 12)
    rec["report_every"] = args.report_every
    children(uri, rec)
    return rec


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", default="3", help="how many seeds (0..N-1), or a comma-separated list")
    ap.add_argument("--trials", type=int, default=8)
    ap.add_argument("--steps", type=int, default=80)
    ap.add_argument("--report-every", type=int, default=10)
    ap.add_argument("--eta", type=int, default=2)
    ap.add_argument("--asynchronous", action="store_true", help="Tune's asynchronous ASHA instead of synchronous "
                                                                 "rungs")
    args = ap.parse_args(argv)
    seeds = ([int(s) for s in args.seeds.split(",")] if "," in args.seeds else list(range(int(args.seeds))))
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

    import ray

    from raylane.config.loader import load_spec_from_dict
    from raylane.control.client import start_control, stop_control
    from raylane.launchers.tune import run_sweep
    from raylane.sweeps.build import asha_rungs
    from tests.raytest import local_policy, start_cluster, stop_cluster

    asha = {"type": "asha", "eta": args.eta, "grace_period": args.report_every,
            **({} if args.asynchronous else {"synchronous": True})}
    rungs = asha_rungs(load_spec_from_dict(sweep("bench", asha, args, 0)).sweep)
    kind = "asynchronous (Tune's)" if args.asynchronous else "synchronous rungs"
    tmp = Path(tempfile.mkdtemp(prefix="raylane-bench-sweep-"))
    uri = f"sqlite:///{tmp / 'mlflow.db'}"
    cluster = start_cluster(gpu_nodes=(("gpu-a", ["gpu-sim"]),), gpus=2, cpus=4, head_cpus=1)
    rows = []
    try:
        ray.init(address=cluster.address, namespace="raylane", log_to_driver=False)
        ctl = start_control(local_policy(sweep={"min_runtime": 0}), str(tmp / "journal.db"), tick_s=0.2)
        try:
            for seed in seeds:
                fifo = measure(run_sweep, ctl, tmp, uri, "fifo", {"type": "fifo"}, args, seed)
                ash = measure(run_sweep, ctl, tmp, uri, "asha", asha, args, seed)
                if sorted(fifo["lr"].values()) != sorted(ash["lr"].values()):
                    raise RuntimeError(f"seed {seed}: the two sweeps drew different configs")
                by_lr = {lr: t for t, lr in fifo["lr"].items()}
                predicted = replay(fifo["curves"], rungs, args.eta, args.steps)
                actual = {by_lr[ash["lr"][t]]: s for t, s in ash["last_step"].items()}
                rows.append({"seed": seed, "fifo": fifo, "asha": ash, "replay_ok": predicted == actual,
                             "stopped": {r: sum(s == r for s in actual.values()) for r in rungs}})
        finally:
            stop_control()
    finally:
        stop_cluster(cluster)
        shutil.rmtree(tmp, ignore_errors=True)
    report(rows, args, rungs, kind)


def report(rows, args, rungs, kind) -> None:
    print(f"\nASHA ({kind}, eta {args.eta}, rungs {rungs}) vs FIFO: {args.trials} trials of the small LM, budget "
          f"{args.steps} steps, a report every {args.report_every}, 2 at a time; learning rate drawn by seed")
    print("stopped: trials each rung stopped (count@step); starts: first starts + restarts from a checkpoint; "
          "by steps / by starts: the GPU-s ASHA's fewer steps save at FIFO's steady cost per step, and what its extra "
          "starts cost at FIFO's set-up per start (measured: used - steady steps x cost per step, over its starts)")
    print(f"{'seed':>4} {'FIFO GPU-s':>10} {'ASHA GPU-s':>10} {'ratio':>6} {'FIFO steps':>10} {'ASHA steps':>10} "
          f"{'ratio':>6} {'saved':>6} {'stopped':>16} {'starts':>7} {'by steps':>8} {'by starts':>9} {'wall':>5} "
          f"{'same best':>9} {'= replay':>8}")
    ratios = {"gpu": [], "steps": [], "wall": []}
    for r in rows:
        f, a = r["fifo"], r["asha"]
        used_f, used_a = f["gpu_seconds"]["gpu_seconds_used"], a["gpu_seconds"]["gpu_seconds_used"]
        g, s, w = used_a / used_f, a["trained_steps"] / f["trained_steps"], a["wall_s"] / f["wall_s"]
        for key, x in (("gpu", g), ("steps", s), ("wall", w)):
            ratios[key].append(x)
        per_step = f["steady_gpu_s"] / f["steady_steps"] if f["steady_steps"] else float("nan")
        per_start = (used_f - per_step * f["trained_steps"]) / f["starts"]
        by_steps = -(f["trained_steps"] - a["trained_steps"]) * per_step
        by_starts = (a["starts"] - f["starts"]) * per_start
        per_rung = " ".join(f"{n}@{rung}" for rung, n in r["stopped"].items())
        print(f"{r['seed']:>4} {used_f:>10.1f} {used_a:>10.1f} {g:>6.2f} {f['trained_steps']:>10} "
              f"{a['trained_steps']:>10} {s:>6.2f} {f['trained_steps'] - a['trained_steps']:>6} {per_rung:>16} "
              f"{str(f['starts']) + '/' + str(a['starts']):>7} {by_steps:>+8.1f} {by_starts:>+9.1f} {w:>5.2f} "
              f"{'yes' if a['best_lr'] == f['best_lr'] else 'no':>9} {'yes' if r['replay_ok'] else 'no':>8}")
        r["per_step"], r["per_start"] = per_step, per_start
    n = len(rows)
    for what, key, goal in (("GPU-seconds used", "gpu", GOAL["gpu_seconds"]), ("steps trained", "steps", GOAL["steps"]),
                            ("wall time", "wall", None)):
        xs = ratios[key]
        print(f"ASHA/FIFO {what}: median {statistics.median(xs):.2f}x (range {min(xs):.2f}-{max(xs):.2f} over {n} "
              f"seed(s)); baseline FIFO 1.00x" + (f"; goal {goal:.2f}x (the sweeps issue's one async run)"
                                                   if goal is not None else ""))
    print(f"FIFO's steady cost per step: median {statistics.median(r['per_step'] for r in rows):.3f} GPU-s; its "
          f"set-up per start: median {statistics.median(r['per_start'] for r in rows):.1f} GPU-s")
    same = sum(r["asha"]["best_lr"] == r["fifo"]["best_lr"] for r in rows)
    agree = sum(r["replay_ok"] for r in rows)
    print(f"best trial = FIFO's best in {same} of {n} seed(s); stopped trials = the rungs replayed on FIFO's curves "
          f"in {agree} of {n} seed(s)")


if __name__ == "__main__":
    main()
