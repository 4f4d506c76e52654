"""Speed of the simulator, and every preset on Philly and on generated workload mixes beside the goals of issue 14.

Part 1, speed: the full Philly trace (82,247 jobs) replayed under FIFO on one shared cluster.

Scene: ``examples/traces/philly.csv.gz``, all of it, sorted by submit time; 70 nodes x 8 GPUs (the cluster of
``deploy/clusters/philly-560.yaml``); the ``fifo`` preset (strict order, no backfill, no preemption) on one shared
cluster (admission none). The target is a replay under 30 s on the project's 2-core machine.

Printed: trace load time, replay wall and CPU time (other processes on a shared machine inflate the wall clock), cycles and instants, cycles per second, and where the replay's time
went: inside the core's ``cycle``, inside ``ClusterState.snapshot``, and the rest (the simulator's event loop and
the ``ClusterState`` updates it makes). The same replay at the live cycle depth (``max_examined`` = the core's
``MAX_EXAMINED``) runs as the baseline on the first week of October (``--baseline-days``), as a ratio.

Part 2, presets across workload mixes (``mixes``): every preset of ``COMPARISON``, plus ``las-easy`` as it was
before issue 14 (the baseline: no hysteresis, queues at 1 and 10 GPU-hours instead of the ladder), on
- ``philly``: the Philly jobs submitted on 2017-10-09 (1,352 jobs; ``--philly-start/--philly-end``) on 16 nodes
  x 8 GPUs (``--philly-nodes``): the scene of ``tests/sim/test_regression.py``, overloaded as October is on the
  whole 560-GPU cluster, and a few seconds per replay (two months on 560 GPUs take 15 minutes per preset; their
  figures are in ``docs/simulator.md``);
- each mix of ``raylane.sim.generate`` (heavy-tail, shared-burst, big-gangs): ``--mix-jobs`` jobs (2,000) drawn
  from ``--seed`` (0) at load 1.1 (``--mix-load``; below 1 a 256-GPU cluster barely queues and every policy
  looks alike) on 32 nodes x 8 GPUs,
all on one shared cluster (admission none), default class (preemptible, checkpoint every 5 minutes). Printed per
scene: avg JCT and its ratio to the SRTF oracle, utilization, preemptions per job-hour (mean and largest) and the
jobs over one per hour; then each goal beside its figure and baseline:
- a duration-blind policy within 1.3x of the SRTF oracle's average JCT on every scene (``las-easy``, and the best
  duration-blind preset);
- no job preempted more than once per hour of its runtime under the LAS presets (without the hysteresis: beside);
- ``las-easy``'s average JCT within 5% of the baseline's (las-easy before issue 14), both measured in this run.

    python -m tests.bench.bench_sim [--part all|speed|mixes] [--preset fifo] [--nodes 70] [--start DATE --end DATE]
        [--profile] [--philly-start DATE --philly-end DATE --philly-nodes N] [--mix-jobs N] [--mix-load X] [--seed N]
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
from raylane.sim.generate import MIXES, generate
from raylane.sim.presets import COMPARISON, PRESETS

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
    ap.add_argument("--part", choices=("all", "speed", "mixes"), default="all")
    ap.add_argument("--preset", default="fifo")
    ap.add_argument("--nodes", type=int, default=70)
    ap.add_argument("--start", default=None)
    ap.add_argument("--end", default=None)
    ap.add_argument("--baseline-days", type=int, default=7, help="0: no baseline run")
    ap.add_argument("--profile", action="store_true", help="also print the top functions of a profiled replay")
    ap.add_argument("--philly-start", default=PHILLY_WINDOW[0])
    ap.add_argument("--philly-end", default=PHILLY_WINDOW[1])
    ap.add_argument("--philly-nodes", type=int, default=PHILLY_NODES)
    ap.add_argument("--mix-jobs", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--mix-load", type=float, default=1.1)
    args = ap.parse_args(argv)
    if args.part in ("all", "speed"):
        speed(args)
    if args.part in ("all", "mixes"):
        mixes(args)


def speed(args) -> None:
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


# ------------------------------------------------------------------------------------ presets across mixes

# The Philly scene of part 2 (see the module docstring).
PHILLY_WINDOW = ("2017-10-09", "2017-10-10")
PHILLY_NODES = 16
MIX_NODES = 32
BASELINE = "las-easy before issue 14"
GOAL_RATIO, GOAL_RATE, GOAL_JCT = 1.3, 1.0, 1.05


def scene_runs() -> List[tuple]:
    """(label, preset, config overrides) of every run of a scene: the presets, then the baseline (before issue 14)."""
    runs = [(name, name, {}) for name in COMPARISON]
    runs.append((BASELINE, "las-easy", dict(hysteresis_min_run_s=0.0, hysteresis_service_fraction=0.0,
                                            las_thresholds=(3600.0, 36000.0))))
    return runs


def run_scene(trace, nodes: int) -> Dict[str, dict]:
    out = {}
    for label, preset, overrides in scene_runs():
        cfg, opts = apply_preset(get_preset(preset), SchedulerConfig(admission="none"), SimOptions())
        r = Simulator(trace, cluster_from_flags(nodes, 8).nodes(), {}, replace(cfg, **overrides), options=opts).run()
        out[label] = summarize(r)
    return out


def print_scene(name: str, runs: Dict[str, dict]) -> None:
    oracle = runs["srtf-oracle"]["jct"]["mean"]
    print(f"{'policy':<26} {'durations':>9} {'avg JCT s':>10} {'/oracle':>8} {'util':>6} {'pre/job-h':>9} "
          f"{'max/job-h':>9} {'>1/h':>5} {'replay s':>8}")
    for label, s in runs.items():
        knows = PRESETS[label].knows_durations if label in PRESETS else False
        p = s["preemptions"]["per_hour"]
        print(f"{label:<26} {'yes' if knows else 'no':>9} {s['jct']['mean']:>10,.0f} "
              f"{s['jct']['mean'] / oracle:>7.2f}x {s['utilization']['mean']:>6.1%} {p['mean']:>9.3f} "
              f"{p['max']:>9.2f} {p['over_one']:>5} {s['replay']['wall_s']:>8.1f}", flush=True)


def goals(scenes: Dict[str, Dict[str, dict]]) -> None:
    """Each goal beside its figure and baseline, per scene."""
    print("\ngoals (figure / goal / baseline = las-easy before issue 14: no hysteresis, queues at 1 and 10 GPU-hours; same run):")
    for name, runs in scenes.items():
        oracle = runs["srtf-oracle"]["jct"]["mean"]
        blind = {k: v["jct"]["mean"] / oracle for k, v in runs.items()
                 if k in PRESETS and not PRESETS[k].knows_durations}
        best = min(blind, key=blind.get)
        le, base = runs["las-easy"], runs[BASELINE]
        rate = max(runs[k]["preemptions"]["per_hour"]["max"] for k in ("las", "las-easy"))
        jct = le["jct"]["mean"] / base["jct"]["mean"]
        print(f"  {name}: las-easy JCT / oracle {blind['las-easy']:.2f}x, best duration-blind {best} "
              f"{blind[best]:.2f}x (goal <= {GOAL_RATIO}x: {'met' if blind[best] <= GOAL_RATIO else 'NOT met'}; "
              f"baseline {base['jct']['mean'] / oracle:.2f}x)")
        worst = le["preemptions"]["per_hour"]["worst"]
        print(f"  {name}: most preemptions per job-hour under las/las-easy {rate:.2f} (goal <= {GOAL_RATE:g}: "
              f"{'met' if rate <= GOAL_RATE else 'NOT met'}; baseline {base['preemptions']['per_hour']['max']:.2f}, "
              f"{base['preemptions']['per_hour']['over_one']} jobs over 1/h, most preemptions of one job "
              f"{base['preemptions']['max']} vs {le['preemptions']['max']})"
              + (f"; worst now: {worst['id']} {worst['preemptions']} in {worst['runtime_h']:.2f} h" if worst else ""))
        print(f"  {name}: las-easy avg JCT {le['jct']['mean']:,.0f} s vs baseline {base['jct']['mean']:,.0f} s: "
              f"{jct:.3f}x (goal <= {GOAL_JCT:g}x: {'met' if jct <= GOAL_JCT else 'NOT met'})")
    # One duration-blind policy on every scene: each preset's worst ratio over the scenes.
    worst = {k: max(runs[k]["jct"]["mean"] / runs["srtf-oracle"]["jct"]["mean"] for runs in scenes.values())
             for k in PRESETS if not PRESETS[k].knows_durations}
    best = min(worst, key=worst.get)
    print(f"  all scenes: one duration-blind preset within {GOAL_RATIO}x of the oracle on every scene: best {best}, "
          f"worst scene {worst[best]:.2f}x ({'met' if worst[best] <= GOAL_RATIO else 'NOT met'}); las-easy "
          f"{worst['las-easy']:.2f}x")


def mixes(args) -> None:
    scenes: Dict[str, Dict[str, dict]] = {}
    philly = load_trace(PHILLY, start=args.philly_start, end=args.philly_end)
    t0 = time.perf_counter()
    scenes["philly"] = run_scene(philly, args.philly_nodes)
    print(f"\nphilly {args.philly_start}..{args.philly_end}: {len(philly.jobs):,} jobs on {args.philly_nodes} x 8 GPUs "
          f"({time.perf_counter() - t0:.0f} s)")
    print_scene("philly", scenes["philly"])
    for mix in MIXES:
        tr = generate(mix, seed=args.seed, jobs=args.mix_jobs, cluster_gpus=MIX_NODES * 8, load=args.mix_load)
        t0 = time.perf_counter()
        scenes[mix] = run_scene(tr, MIX_NODES)
        print(f"\n{mix} (seed {args.seed}, {len(tr.jobs):,} jobs, {tr.gpu_seconds() / 3600:,.0f} GPU-hours, "
              f"load {args.mix_load:g}) "
              f"on {MIX_NODES} x 8 GPUs ({time.perf_counter() - t0:.0f} s)")
        print_scene(mix, scenes[mix])
    goals(scenes)


if __name__ == "__main__":
    main()
