"""Throughput and latency of the pure scheduling core, driven like the control actor drives it.

Scene: 1,000 nodes of 8 GPUs, 50 teams whose nominal quotas sum to the cluster (some may borrow without limit,
some up to a limit, some lend only part), mixed classes (critical, prod, finetune, pretrain, sweep), and about
10,000 single-GPU workloads waiting at all times. A simulated clock advances ``STEP_S`` per cycle: leases end after
random durations, victims stop after a grace period and are requeued, and new workloads arrive to keep the queue
full. Each cycle the driver takes ``ClusterState.snapshot()``, calls ``cycle`` and applies the decisions.

Printed: admissions per second of time spent in ``cycle`` (admitted / total cycle wall time), cycle latency p50/p99
(wall clock, and the thread's CPU time beside it: on a shared machine other processes inflate the wall clock),
snapshot build time p50/p99, and the same for baselines run in the same process, as ratios:
- ``one-per-cycle``: ``max_admissions_per_cycle=1`` once the cluster is full (same warm-up): what a cycle costs
  when it stops at the first admission;
- ``naive-sort``: a naive scheduler that, each cycle, sorts every pending workload by the ordering's key and places
  them first-fit on a fresh copy of the nodes (no per-team sorted queues, no preemption, no backfill).
The main run is repeated with the driver collecting garbage between cycles (``idle GC``): with ~100,000 live
objects a full collection takes tens of milliseconds, and where it falls inside a cycle it sets the p99.

``--fractional P``: a share P of the workloads asks a share of a GPU (0.25 or 0.5) instead of a whole one, so that
the cost of counting GPUs per device shows (the default scene has whole GPUs only).

    python -m tests.bench.bench_core [--cycles N] [--ordering NAME] [--fractional P] [--profile]
"""
from __future__ import annotations

import argparse
import cProfile
import gc
import math
import os
import pstats
import random
import time
from dataclasses import dataclass, field, replace
from typing import Callable, Dict, List, Optional

from raylane.scheduling import (
    ADMISSIONS,
    Admit,
    Capacity,
    ClusterState,
    CycleResult,
    Gang,
    Node,
    ORDERINGS,
    Pending,
    Quota,
    Resources,
    SchedulerConfig,
    Team,
    Workload,
    WorkloadClass,
    cycle,
    place,
)
from raylane.scheduling.apply import Applier
from raylane.scheduling.admission import QuotaLedger
from raylane.scheduling.gcpace import gc_paused

N_NODES = 1000
GPUS_PER_NODE = 8
N_TEAMS = 50
N_PENDING = 10_000
STEP_S = 5.0
# The share of workloads that ask a share of a GPU (--fractional).
FRACTIONAL = 0.0
GRACE_S = 10.0

CLASSES = [
    (WorkloadClass("critical", 100, preemptible=False), 0.05),
    (WorkloadClass("prod", 50, preemptible=True, min_runtime_s=60), 0.15),
    (WorkloadClass("finetune", 30, preemptible=True, checkpoint_interval_s=300), 0.30),
    (WorkloadClass("pretrain", 20, preemptible=True, checkpoint_interval_s=1800), 0.30),
    (WorkloadClass("sweep", 5, preemptible=True), 0.20),
]


def make_cluster(rng: random.Random):
    cap = Resources(gpu=GPUS_PER_NODE, cpu=96, memory=1024)
    nodes = [Node(f"node-{i:04d}", cap, cap, frozenset({"h100"}) if i % 10 == 0 else frozenset(),
                  {"rack": f"r{i // 32}"}) for i in range(N_NODES)]
    total = N_NODES * GPUS_PER_NODE
    weights = [rng.uniform(0.5, 2.0) for _ in range(N_TEAMS)]
    nominals = [math.floor(total * w / sum(weights)) for w in weights]
    nominals[0] += total - sum(nominals)  # quotas sum exactly to the cluster
    teams = {}
    for i, nominal in enumerate(nominals):
        kind = i % 5
        borrow = None if kind in (0, 1) else (0.0 if kind == 2 else float(nominal // 2))
        lend = float(nominal // 2) if kind == 4 else None
        name = f"team-{i:02d}"
        teams[name] = Team(name, {"gpu": Quota(float(nominal), borrow, lend)}, weight=weights[i])
    return nodes, teams


class Feed:
    """New single-GPU workloads with a class, a team, a true duration and (half the time) an exact estimate."""

    def __init__(self, rng: random.Random, teams: List[str]):
        self.rng, self.teams, self.n = rng, teams, 0
        self.classes = [c for c, _ in CLASSES]
        self.weights = [p for _, p in CLASSES]
        self.duration: Dict[str, float] = {}

    def new(self, now: float) -> Workload:
        self.n += 1
        wid = f"w{self.n:07d}"
        dur = max(STEP_S, self.rng.expovariate(1 / 900.0))
        self.duration[wid] = dur
        gpu = 1.0
        if FRACTIONAL and self.rng.random() < FRACTIONAL:  # no extra draw in the default scene
            gpu = self.rng.choice((0.25, 0.5))
        return Workload(
            id=wid, team=self.rng.choice(self.teams), cls=self.rng.choices(self.classes, self.weights)[0],
            gang=Gang(1, Resources(gpu=gpu, cpu=8 * gpu, memory=64 * gpu)), submit_time=now,
            runtime_estimate_s=dur if self.rng.random() < 0.5 else None,
        )


@dataclass
class Stats:
    name: str
    cycle_s: List[float] = field(default_factory=list)
    cycle_cpu_s: List[float] = field(default_factory=list)
    snapshot_s: List[float] = field(default_factory=list)
    gc_s: List[float] = field(default_factory=list)
    admitted: int = 0
    preempted: int = 0
    finished: int = 0

    def pct(self, xs, q):
        xs = sorted(xs)
        return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")

    @property
    def per_s(self) -> float:
        return self.admitted / max(sum(self.cycle_s), 1e-12)

    @property
    def per_cpu_s(self) -> float:
        return self.admitted / max(sum(self.cycle_cpu_s), 1e-12)

    def line(self) -> str:
        ms, p = 1e3, self.pct
        return (f"{self.name:<14} {self.per_s:>7,.0f} adm/s ({self.per_cpu_s:>7,.0f} per cpu-s)  cycle p50 {p(self.cycle_s, .5) * ms:6.2f} p99 "
                f"{p(self.cycle_s, .99) * ms:6.2f} ms (cpu p50 {p(self.cycle_cpu_s, .5) * ms:6.2f} p99 "
                f"{p(self.cycle_cpu_s, .99) * ms:6.2f})  snapshot p50 {p(self.snapshot_s, .5) * ms:5.2f} p99 "
                f"{p(self.snapshot_s, .99) * ms:5.2f} ms  [{len(self.cycle_s)} cycles, {self.admitted:,} admitted, "
                f"{self.preempted:,} preempted]")


class _Gangs:
    """The ``Applier``'s driver: an admitted gang ends after its duration; one told to stop stops ``GRACE_S``
    later (``drive`` then calls ``Applier.stopped``, which requeues it)."""

    def __init__(self, ends: Dict[str, float], stops: Dict[str, float], duration: Dict[str, float]):
        self.ends, self.stops, self.duration = ends, stops, duration

    def admitted(self, a, lease, now: float) -> None:
        self.ends[a.workload.id] = now + self.duration[a.workload.id]

    def stopping(self, stop, lease, now: float) -> bool:
        self.ends.pop(stop.workload_id, None)
        self.stops[stop.workload_id] = now + GRACE_S
        return False


def drive(name: str, config: SchedulerConfig, cycles: int, warmup: int, seed: int = 7,
          scheduler: Callable = cycle, gc_mode: str = "default",
          measure_config: Optional[SchedulerConfig] = None) -> Stats:
    """Run the scene and time it. ``gc_mode`` "paused": collection is paused inside each cycle and runs when the
    driver next allocates (``raylane.scheduling.gcpace.gc_paused``, what the control actor and the simulator do);
    "idle": the driver turns automatic garbage collection off and
    collects between cycles (as a latency-minded control loop can in its idle time), so no collection pauses a
    cycle; the time those collections take is reported beside. ``measure_config``: the configuration of the
    measured cycles, after a warm-up under ``config`` (so that a baseline starts from the same full cluster)."""
    rng = random.Random(seed)
    nodes, teams = make_cluster(rng)
    st = ClusterState(nodes, teams, config)
    feed = Feed(rng, sorted(teams))
    for _ in range(N_PENDING):
        st.enqueue(feed.new(0.0))
    ends: Dict[str, float] = {}
    stops: Dict[str, float] = {}
    applier = Applier(st, _Gangs(ends, stops, feed.duration))
    stats = Stats(name)
    now = 0.0
    if gc_mode == "idle":
        gc.disable()
    try:
        for i in range(warmup + cycles):
            measured = i >= warmup
            st.decay(now)
            t0 = time.perf_counter()
            snap = st.snapshot()
            if measured and measure_config is not None:
                snap = replace(snap, config=measure_config)
            t1, c1 = time.perf_counter(), time.thread_time()
            if gc_mode == "paused":  # as the control actor and the simulator run it (raylane.scheduling.gcpace)
                with gc_paused():
                    res = scheduler(snap, now)
            else:
                res = scheduler(snap, now)
            t2, c2 = time.perf_counter(), time.thread_time()
            if measured:
                stats.snapshot_s.append(t1 - t0)
                stats.cycle_s.append(t2 - t1)
                stats.cycle_cpu_s.append(c2 - c1)
                stats.admitted += len(res.admitted)
                stats.preempted += sum(len(p.victims) for p in res.preempted)
            # Apply the decisions (as every driver does: ``Applier``), then let the simulated clock run one step.
            applier.apply(res, now)
            now += STEP_S
            for wid in [w for w, t in ends.items() if t <= now]:
                del ends[wid]
                applier.ended(wid, now)
                stats.finished += measured
            for wid in [w for w, t in stops.items() if t <= now]:
                del stops[wid]
                applier.stopped(wid, now)
            while st.pending_count() < N_PENDING:
                st.enqueue(feed.new(now))
            if gc_mode == "idle":
                t3 = time.perf_counter()
                gc.collect(2 if i % 20 == 0 else 1)
                if measured:
                    stats.gc_s.append(time.perf_counter() - t3)
    finally:
        gc.enable()
    return stats


def naive_sort_cycle(snapshot, now) -> CycleResult:
    """Baseline: sort all pending by the ordering's queue key, first-fit each on a fresh capacity, quota checked."""
    cfg = snapshot.config
    order = ORDERINGS.get(cfg.ordering)
    admission = ADMISSIONS.get(cfg.admission)
    cap = Capacity(snapshot.nodes)
    usage: Dict[str, Resources] = {}
    for l in snapshot.leases:
        usage[l.team] = usage.get(l.team, Resources()) + l.workload.gang.total
    ledger = QuotaLedger(snapshot.teams, usage)
    pending = sorted(snapshot.pending(), key=lambda w: order.queue_key(w, cfg))
    admitted, waiting = [], []
    for pos, w in enumerate(pending[:500], 1):
        if len(admitted) >= cfg.max_admissions_per_cycle:
            break
        reason = admission.check(ledger, w.team, w.gang.total)
        plan = None if reason else place(w.gang, cap, w.data_snapshot)
        if plan is None:
            waiting.append(Pending(w, reason, pos))
            continue
        cap.take_placement(plan, w.gang.per_worker)
        ledger.add(w.team, w.gang.total)
        admitted.append(Admit(w, plan))
    return CycleResult(tuple(admitted), (), tuple(waiting))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cycles", type=int, default=600)
    ap.add_argument("--warmup", type=int, default=150, help="cycles not measured (the cluster fills up)")
    ap.add_argument("--ordering", default="priority", choices=ORDERINGS.names())
    ap.add_argument("--profile", action="store_true", help="cProfile the main run and print the top functions")
    ap.add_argument("--fractional", type=float, default=0.0, metavar="P",
                    help="share of workloads asking 0.25 or 0.5 GPU (default 0: whole GPUs only)")
    args = ap.parse_args(argv)
    if not 0.0 <= args.fractional <= 1.0:
        ap.error(f"--fractional: got {args.fractional:g}; allowed: a share between 0 and 1")
    global FRACTIONAL
    FRACTIONAL = args.fractional

    cfg = SchedulerConfig(ordering=args.ordering, admission="quota", backfill="easy", preemption="default")
    print(f"bench_core: {N_NODES} nodes x {GPUS_PER_NODE} GPUs, {N_TEAMS} teams, ~{N_PENDING:,} pending, "
          f"{cfg.ordering}/{cfg.admission}/{cfg.backfill}/{cfg.preemption}, {args.cycles} cycles after "
          f"{args.warmup} warm-up, {STEP_S:g} s per cycle, max {cfg.max_admissions_per_cycle} admissions per cycle"
          + (f", {FRACTIONAL:.0%} of workloads on a share of a GPU" if FRACTIONAL else ""))
    if args.profile:
        prof = cProfile.Profile()
        prof.enable()
    main_run = drive("cycle", cfg, args.cycles, args.warmup)
    if args.profile:
        prof.disable()
        pstats.Stats(prof).sort_stats("cumulative").print_stats(30)
    paused = drive("cycle, GC paused", cfg, args.cycles, args.warmup, gc_mode="paused")
    idle = drive("cycle, idle GC", cfg, args.cycles, args.warmup, gc_mode="idle")
    one = drive("one-per-cycle", cfg, args.cycles, args.warmup,
                measure_config=replace(cfg, max_admissions_per_cycle=1))
    naive = drive("naive-sort", cfg, args.cycles, args.warmup, scheduler=naive_sort_cycle)
    for s in (main_run, paused, idle, one, naive):
        print("  " + s.line())
    load = os.getloadavg()
    print(f"  machine: {os.cpu_count()} CPUs, load average {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} (1/5/15 min) "
          "at the end; above the CPU count, wall times include waiting for a CPU (cpu times do not)")
    print(f"  idle GC: the driver's collections between cycles took p50 {idle.pct(idle.gc_s, .5) * 1e3:.2f} ms, "
          f"p99 {idle.pct(idle.gc_s, .99) * 1e3:.2f} ms, max {max(idle.gc_s, default=0) * 1e3:.2f} ms; same "
          f"decisions: {idle.admitted == main_run.admitted and idle.preempted == main_run.preempted}")
    # Ratios on CPU time: the runs follow each other, and on a shared machine the load changes between them.
    p99 = main_run.pct(main_run.cycle_cpu_s, .99)
    print(f"  ratios (cpu time): cycle vs one-per-cycle {main_run.per_cpu_s / max(one.per_cpu_s, 1e-9):.1f}x adm per "
          f"cpu-s; cycle vs naive-sort {main_run.per_cpu_s / max(naive.per_cpu_s, 1e-9):.1f}x adm per cpu-s, "
          f"p99 {naive.pct(naive.cycle_cpu_s, .99) / max(p99, 1e-12):.1f}x lower, p50 "
          f"{naive.pct(naive.cycle_cpu_s, .5) / max(main_run.pct(main_run.cycle_cpu_s, .5), 1e-12):.1f}x lower")
    print(f"  GC paused in cycles (the actor's and the simulator's way) vs default collector: p99 wall "
          f"{main_run.pct(main_run.cycle_s, .99) / max(paused.pct(paused.cycle_s, .99), 1e-12):.1f}x lower; same "
          f"decisions: {paused.admitted == main_run.admitted and paused.preempted == main_run.preempted}")
    for s in (main_run, paused, idle):
        ok = s.per_s >= 1000 and s.pct(s.cycle_s, .99) < 0.010
        print(f"  targets (>= 1,000 adm/s, p99 cycle < 10 ms), {s.name}: {'met' if ok else 'NOT met'} "
              f"({s.per_s:,.0f} adm/s, p99 {s.pct(s.cycle_s, .99) * 1e3:.2f} ms wall, "
              f"{s.pct(s.cycle_cpu_s, .99) * 1e3:.2f} ms cpu)")


if __name__ == "__main__":
    main()
