"""Speed of the simulator: the full Philly trace (82,247 jobs) replayed under FIFO on one shared cluster.

Scene: ``examples/traces/philly.csv.gz``, all of it, sorted by submit time; 70 nodes x 8 GPUs (the cluster of
``deploy/clusters/philly-560.yaml``); the ``fifo`` preset (strict order, no backfill, no preemption) on one shared
cluster (admission none). The target is a replay under 30 s on the project's 2-core machine.

Printed: trace load time, replay wall and CPU time (other processes on a shared machine inflate the wall clock), cycles and instants, cycles per second, and where the replay's time
went: inside the core's ``cycle``, inside ``ClusterState.snapshot``, and the rest (the simulator's event loop and
the ``ClusterState`` updates it makes). The same replay at the live cycle depth (``max_examined`` = the core's
``MAX_EXAMINED``) runs as the baseline on the first week of October (``--baseline-days``), as a ratio.

    python -m tests.bench.bench_sim [--preset fifo] [--nodes 70] [--start DATE --end DATE] [--profile]
"""
from __future__ import annotations

import argparse
import cProfile
import pstats
import time
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Dict, List, Optional

import raylane.sim.engine as engine
from raylane.scheduling.cycle import MAX_EXAMINED
from raylane.scheduling.state import ClusterState
from raylane.scheduling.types import SchedulerConfig
from raylane.sim import SimOptions, Simulator, apply_preset, cluster_from_flags, get_preset, load_trace, summarize

PHILLY = str(Path(__file__).resolve().parents[2] / "examples" / "traces" / "philly.csv.gz")


@contextmanager
def timed_core(acc: Dict[str, float]):
    """Time ``cycle`` and ``ClusterState.snapshot`` as the engine calls them (a few µs of overhead per call)."""
    real_cycle, real_snapshot = engine.cycle, ClusterState.snapshot
    clock = time.perf_counter

    def cycle(*a, **kw):
        t = clock()
        try:
            return real_cycle(*a, **kw)
        finally:
            acc["cycle"] += clock() - t

    def snapshot(self, limit=None):
        t = clock()
        try:
            return real_snapshot(self, limit)
        finally:
            acc["snapshot"] += clock() - t

    engine.cycle, ClusterState.snapshot = cycle, snapshot
    try:
        yield acc
    finally:
        engine.cycle, ClusterState.snapshot = real_cycle, real_snapshot


def replay(trace, nodes: int, preset: str, max_examined: Optional[int] = None, split: bool = False,
           profile: bool = False):
    cfg, opts = apply_preset(get_preset(preset), SchedulerConfig(admission="none"), SimOptions())
    if max_examined is not None:
        opts = replace(opts, max_examined=max_examined)
    sim = Simulator(trace, cluster_from_flags(nodes, 8).nodes(), {}, cfg, options=opts)
    acc = {"cycle": 0.0, "snapshot": 0.0}
    prof = cProfile.Profile() if profile else None
    if split:
        with timed_core(acc):
            r = sim.run()
    elif prof is not None:
        prof.enable()
        r = sim.run()
        prof.disable()
    else:
        cpu = time.process_time()
        r = sim.run()
        acc["cpu"] = time.process_time() - cpu
    return r, acc, prof


def main(argv: Optional[List[str]] = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="fifo")
    ap.add_argument("--nodes", type=int, default=70)
    ap.add_argument("--start", default=None)
    ap.add_argument("--end", default=None)
    ap.add_argument("--baseline-days", type=int, default=7, help="0: no baseline run")
    ap.add_argument("--profile", action="store_true", help="also print the top functions of a profiled replay")
    args = ap.parse_args(argv)

    t0 = time.perf_counter()
    trace = load_trace(PHILLY, start=args.start, end=args.end)
    load_s = time.perf_counter() - t0
    print(f"trace: {len(trace.jobs):,} jobs loaded in {load_s:.2f} s; cluster {args.nodes} x 8 GPUs; "
          f"preset {args.preset}")

    r, acc, _ = replay(trace, args.nodes, args.preset)
    s = summarize(r)
    print(f"replay: {r.wall_s:.1f} s wall, {acc['cpu']:.1f} s CPU, for {len(r.jobs):,} jobs ({r.cycles:,} cycles, "
          f"{r.instants:,} instants, {r.cycles / r.wall_s:,.0f} cycles/s); target < 30 s wall: "
          f"{'met' if r.wall_s < 30 else 'NOT met'} (CPU time is what a quiet machine's wall time would be)")
    print(f"figures: avg JCT {s['jct']['mean']:,.0f} s, p95 queueing {s['queueing']['p95']:,.0f} s, "
          f"utilization {s['utilization']['mean']:.1%}")

    r2, acc, _ = replay(trace, args.nodes, args.preset, split=True)
    rest = r2.wall_s - acc["cycle"] - acc["snapshot"]
    print(f"where the time goes (timed replay, {r2.wall_s:.1f} s): cycle() {acc['cycle']:.1f} s "
          f"({acc['cycle'] / r2.wall_s:.0%}), ClusterState.snapshot() {acc['snapshot']:.1f} s "
          f"({acc['snapshot'] / r2.wall_s:.0%}), event loop + state updates {rest:.1f} s ({rest / r2.wall_s:.0%})")

    if args.baseline_days:
        week = load_trace(PHILLY, start="2017-10-01", end=f"2017-10-{1 + args.baseline_days:02d}")
        fast, _, _ = replay(week, args.nodes, args.preset)
        live, _, _ = replay(week, args.nodes, args.preset, max_examined=MAX_EXAMINED)
        print(f"baseline, first {args.baseline_days} days of October ({len(week.jobs):,} jobs): preset depth "
              f"{fast.options.max_examined}: {fast.wall_s:.1f} s; live depth {MAX_EXAMINED}: {live.wall_s:.1f} s "
              f"({live.wall_s / fast.wall_s:.1f}x); avg JCT {summarize(fast)['jct']['mean']:,.0f} vs "
              f"{summarize(live)['jct']['mean']:,.0f} s")

    if args.profile:
        _, _, prof = replay(trace, args.nodes, args.preset, profile=True)
        pstats.Stats(prof).sort_stats("tottime").print_stats(15)


if __name__ == "__main__":
    main()
