"""Elastic vs fixed gangs (issue 15): the same trace replayed twice under the same policy, once with every job at its
fixed size and once with every job elastic, and the average JCT, utilisation and resizes side by side.

Scenes:
- ``philly``: the Philly jobs submitted on 2017-10-09 (``--philly-start/--philly-end``) on 16 nodes x 8 GPUs, the
  scene of ``tests/sim/test_regression.py``;
- each mix of ``raylane.sim.generate`` named by ``--mixes`` (``--mix-jobs`` jobs from ``--seed`` at load
  ``--mix-load`` on 32 nodes x 8 GPUs).

Elastic version of a job: its GPUs as workers of one GPU each (a share-of-a-GPU job stays fixed), any size from half
its workers (at least one) to twice them (at most ``--max-workers``); its trace duration is its runtime at the size it
asked for, and its rate at n workers follows ``--speedup`` (Amdahl's law with a 5 % serial part by default); each
resize costs ``--resize-overhead`` seconds without progress. The fixed version is the same jobs, same one-GPU
workers, no bounds. Policies: ``--presets`` (one shared cluster, default class: preemptible, resizable,
checkpoint every 5 minutes).

    python -m tests.bench.bench_elastic [--presets fifo las-easy] [--mixes heavy-tail big-gangs] [--mix-jobs 1000]
"""
from __future__ import annotations

import argparse
import time
from dataclasses import replace
from pathlib import Path
from typing import List

from raylane.scheduling.types import SchedulerConfig
from raylane.sim import SimOptions, Simulator, apply_preset, cluster_from_flags, get_preset, load_trace, summarize
from raylane.sim.generate import generate
from raylane.sim.traces import Trace

PHILLY = str(Path(__file__).resolve().parents[2] / "examples" / "traces" / "philly.csv.gz")


def as_workers(trace: Trace, elastic: bool, max_workers: int) -> Trace:
    """``trace`` with each whole-GPU job as one-GPU workers; elastic from half to twice its size when asked."""
    jobs = []
    for j in trace.jobs:
        if j.gpus < 1 or j.gpus != int(j.gpus):
            jobs.append(j)
            continue
        n = int(j.gpus)
        kw = dict(workers=n, placement=j.placement or "pack")
        if elastic:
            hi = max(n, min(2 * n, max_workers))
            kw.update(min_workers=max(1, n // 2), max_workers=hi)
        jobs.append(replace(j, **kw))
    return replace(trace, jobs=jobs)


def replay(trace: Trace, nodes: int, preset: str, args) -> dict:
    cfg, opts = apply_preset(get_preset(preset), SchedulerConfig(), SimOptions())
    opts = replace(opts, elastic_speedup=args.speedup, resize_overhead_s=args.resize_overhead)
    sim = Simulator(trace, cluster_from_flags(nodes, 8).nodes(), {}, cfg, options=opts)
    t0 = time.perf_counter()
    r = sim.run()
    s = summarize(r)
    s["wall_s"] = time.perf_counter() - t0
    return s


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--presets", nargs="+", default=["fifo", "las-easy"])
    ap.add_argument("--mixes", nargs="*", default=["heavy-tail", "big-gangs"])
    ap.add_argument("--philly-start", default="2017-10-09")
    ap.add_argument("--philly-end", default="2017-10-10")
    ap.add_argument("--mix-jobs", type=int, default=1000)
    ap.add_argument("--mix-load", type=float, default=1.1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-workers", type=int, default=64)
    ap.add_argument("--speedup", default="amdahl:0.05")
    ap.add_argument("--resize-overhead", type=float, default=60.0)
    args = ap.parse_args(argv)

    scenes: List[tuple] = [("philly", load_trace(PHILLY, start=args.philly_start, end=args.philly_end), 16)]
    for mix in args.mixes:
        scenes.append((mix, generate(mix, seed=args.seed, jobs=args.mix_jobs, cluster_gpus=256, load=args.mix_load),
                       32))
    print(f"bench_elastic: elastic (half to twice each job's one-GPU workers, speedup {args.speedup}, "
          f"{args.resize_overhead:g} s per resize) vs fixed gangs, same trace and policy")
    print(f"  {'scene':<11} {'preset':<9} {'fixed JCT h':>11} {'elastic JCT h':>13} {'ratio':>6} "
          f"{'util fixed':>10} {'util elastic':>12} {'resizes/job':>11} {'wall s':>7}")
    for name, trace, nodes in scenes:
        for preset in args.presets:
            fixed = replay(as_workers(trace, False, args.max_workers), nodes, preset, args)
            el = replay(as_workers(trace, True, args.max_workers), nodes, preset, args)
            fj, ej = fixed["jct"]["mean"] / 3600, el["jct"]["mean"] / 3600
            print(f"  {name:<11} {preset:<9} {fj:>11.2f} {ej:>13.2f} {ej / fj:>5.2f}x "
                  f"{fixed['utilization']['mean']:>10.1%} {el['utilization']['mean']:>12.1%} "
                  f"{el['resizes']['per_job']:>11.2f} {fixed['wall_s'] + el['wall_s']:>7.1f}")


if __name__ == "__main__":
    main()
