"""The discrete-event simulator: a second driver of ``raylane.scheduling.cycle``, with a simulated clock and nodes.

This module owns the simulated world: the clock, the event queue, each job's true remaining work, its attempts and
what a preemption costs it. It keeps no scheduling logic of its own: every decision (what starts, where, what is
preempted) comes from ``cycle`` on a ``ClusterState`` snapshot, exactly as in the control actor; the simulator only
plays the executor (a lease runs until its work is done or it is told to stop).

Words
- *instant*: all events with the same timestamp. They are applied together, then cycles run until the state is
  quiet (nothing admitted or preempted, or the cycle's admission budget not used up).
- *work*: seconds of uninterrupted running a job needs (the trace's duration). A preempted job keeps the work up
  to its last checkpoint (every ``checkpoint_interval_s`` of run time, counted from the attempt's start; 0 means
  it restarts from scratch) and loses the rest.
- *estimate*: what the policy is told a job's runtime is (``Workload.runtime_estimate_s``): nothing (``none``),
  the true duration (``exact``), the duration times a log-normal factor (``noisy``), or what the trace declared
  (``declared``, generic format).
- *service*: ``Workload.attained_gpu_s`` of a requeued job is the GPU-seconds it ran, lost work included (what
  LAS counts, as in Tiresias). A requeued job's estimate grows by the work it lost, so that estimate minus service
  stays its true remaining time under ``exact`` estimates (SRTF is then an oracle).
- *tick*: a cycle the clock triggers with no event, so that policies whose decisions change with time alone (a
  lease demoted by LAS, a lease past its minimum runtime) are re-evaluated. Needed only when the preemption policy
  can preempt: without preemption nothing can start unless an event frees capacity or adds work.
- *outage*: a node failure or a drain (``raylane.sim.outages``). A failed node leaves the state
  (``ClusterState.remove_node``) with every lease on it, each requeued having lost the work since its last
  checkpoint; it is added back, empty, once repaired. A draining node is unschedulable and its leases are stopped
  as the scheduler's victims are. A lease's *requeue* has a cause: ``preemption`` (the scheduler's), ``drain`` or
  ``failure``.
- *stranded GPUs*: ``raylane.scheduling.fragmentation`` on the state after each instant, held until the next.
- *elastic job*: a trace job with ``min_workers < max_workers`` (its class must be resizable). Its work is its
  duration at its requested size (``workers``, the size it is submitted at); at n workers it progresses at
  speedup(n) / speedup(requested) seconds of work per second, with the job's curve (trace column ``speedup``) or
  its class's (``SimOptions.elastic_speedup``). ``remaining`` is kept in seconds of work at the requested size.
- *resize*: a ``Resize`` of the cycle's result. The lease is given back and taken again at the new size and
  placement (so the state's books, usage and fair-share charge follow the size, and the lease's start is the
  resize: a resize is a restart). The work done so far is kept (the job checkpoints as it is resized, as a
  graceful stop does) and the job then makes no progress for ``resize_overhead_s`` (the restart: processes
  started, the checkpoint loaded) while it holds the new size. Checkpoints count from the end of that overhead.
  A requeued job goes back to its queue at its requested size.

Speed: a cycle runs only after an instant that changed something; bookkeeping is in flat lists indexed by job;
checkpoints of running leases are told to the state lazily, just before a cycle, and only when preemption is on
(the core reads them only to price victims).
"""
from __future__ import annotations

import heapq
import math
import random
import time
from dataclasses import dataclass, field, replace
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from raylane.errors import FatalError
from raylane.scheduling import PLACEMENTS, ClusterState, check_feasible, cycle
from raylane.scheduling.cycle import MAX_EXAMINED
from raylane.scheduling.fragmentation import admissible, fragmentation, takes_any_gpu
from raylane.scheduling.gcpace import gc_paused
from raylane.scheduling.types import (
    Gang, LeaseState, Node, Resources, SchedulerConfig, Team, Workload, WorkloadClass, gpu_request_error,
)
from raylane.sim.outages import Outages, next_failure, node_rng
from raylane.sim.traces import SPEEDUP_ALLOWED, Speedup, Trace, TraceJob, parse_speedup

__all__ = ["ESTIMATES", "DEFAULT_CLASS", "SimOptions", "SimResult", "SimulationError", "Simulator", "gang_for",
           "simulate", "speedup_table"]

ESTIMATES = ("none", "exact", "noisy", "declared")

# The class of trace jobs that name none: preemptible training with a checkpoint every 5 minutes, whose elastic
# jobs (min_workers < max_workers) may be resized.
DEFAULT_CLASS = WorkloadClass("train", priority=100, preemptible=True, min_runtime_s=0.0, checkpoint_interval_s=300.0,
                              grace_period_s=0.0, resizable=True)

# Seconds an elastic job makes no progress after a resize (its restart at the new size), by default.
DEFAULT_RESIZE_OVERHEAD_S = 60.0

# Seconds between clock-triggered cycles when preemption is on and ``tick_s`` is left to the simulator.
DEFAULT_TICK_S = 300.0

_FINISH, _STOPPED, _TICK, _NODE = 0, 1, 2, 3
# Why a lease went back to its queue.
CAUSES = ("preemption", "drain", "failure")


class SimulationError(FatalError):
    """The replay cannot go on (e.g. the cycles at one instant never settle)."""


ELASTIC_SPEEDUP_ALLOWED = ("a curve for every class, or CLASS=CURVE entries separated by commas with at most one "
                           "bare CURVE for the other classes (like amdahl:0.05 or pretrain=amdahl:0.05,linear); "
                           f"a curve is {SPEEDUP_ALLOWED}")


def speedup_table(text: str) -> Tuple[Speedup, Dict[str, Speedup]]:
    """(the default curve, class -> curve) from ``SimOptions.elastic_speedup``; FatalError naming the bad part."""
    default, by_class = None, {}
    for part in (p.strip() for p in (text or "").split(",")):
        cls, sep, curve = part.rpartition("=") if "=" in part else ("", "", part)
        try:
            s = parse_speedup(curve)
        except ValueError:
            raise FatalError(f"elastic speedup {text!r}: {part!r} is not a curve; allowed: "
                             f"{ELASTIC_SPEEDUP_ALLOWED}") from None
        if sep:
            if not cls.strip() or cls.strip() in by_class:
                raise FatalError(f"elastic speedup {text!r}: {part!r}: allowed: {ELASTIC_SPEEDUP_ALLOWED} (each "
                                 "class once)")
            by_class[cls.strip()] = s
        elif default is not None:
            raise FatalError(f"elastic speedup {text!r}: two curves for the other classes; allowed: "
                             f"{ELASTIC_SPEEDUP_ALLOWED}")
        else:
            default = s
    return default or Speedup(), by_class


@dataclass(frozen=True)
class SimOptions:
    estimates: str = "none"
    # Sigma of the log-normal factor of ``noisy`` estimates (0.5: half of them within about x0.7..x1.4).
    noise_sigma: float = 0.5
    seed: int = 0
    # Seconds from a preemption decision to the victim's resources being free (the sim's stand-in for the grace).
    stop_delay_s: float = 0.0
    # Seconds between clock-triggered cycles; None: DEFAULT_TICK_S when preemption is on, else none.
    tick_s: Optional[float] = None
    max_examined: int = MAX_EXAMINED
    # A guard against cycles that never settle at one instant (that would be a bug in a policy).
    max_cycles_per_instant: int = 10_000
    # Node failures and drains to play (none by default).
    outages: Outages = Outages()
    # The placement strategy of jobs whose trace names none.
    placement: str = "pack"
    # Speedup curves of elastic jobs whose trace row names none: one curve, or per class (``speedup_table``).
    elastic_speedup: str = "linear"
    # Seconds of no progress after each resize (the restart at the new size; see the module's *resize*).
    resize_overhead_s: float = DEFAULT_RESIZE_OVERHEAD_S

    def __post_init__(self):
        if self.estimates not in ESTIMATES:
            raise FatalError(f"estimates {self.estimates!r}: allowed: {', '.join(ESTIMATES)}")
        if self.placement not in PLACEMENTS:
            raise FatalError(f"placement {self.placement!r}: allowed: {', '.join(PLACEMENTS.names())}")
        speedup_table(self.elastic_speedup)
        o = self.resize_overhead_s
        if not (isinstance(o, (int, float)) and math.isfinite(o) and o >= 0):
            raise FatalError(f"resize overhead {o!r}: allowed: seconds >= 0")


@dataclass
class SimResult:
    """What a replay leaves behind: per-job outcomes (lists indexed like ``jobs``) and the time series."""

    jobs: List[TraceJob]
    config: SchedulerConfig
    options: SimOptions
    teams: Mapping[str, Team]
    total_gpus: float
    first_start: List[float]
    finish: List[float]
    preemptions: List[int]
    # Seconds of work lost to preemptions (multiply by the job's GPUs for GPU-seconds).
    lost_work: List[float]
    # GPU-seconds each team's leases held (useful and lost work alike).
    team_gpu_s: Dict[str, float]
    # Sampled after every instant: time, GPUs held by leases, pending workloads, running leases.
    times: List[float]
    busy: List[float]
    queued: List[int]
    running: List[int]
    rejected: List[Tuple[TraceJob, str]] = field(default_factory=list)
    cycles: int = 0
    instants: int = 0
    wall_s: float = 0.0
    # Wall seconds of each scheduling cycle (the core's ``cycle()``, timed as the control actor times it for
    # ``raylane_cycle_seconds``), and the pending workloads in the snapshot it was given.
    cycle_wall: List[float] = field(default_factory=list)
    cycle_pending: List[int] = field(default_factory=list)
    partial: bool = False
    # Simulated time the replay stopped at (the last completion, or where it was interrupted).
    end_time: float = 0.0
    cluster_name: str = ""
    trace_source: str = ""
    # The tick the replay used (``options.tick_s`` resolved).
    tick_s: float = 0.0
    # Stranded GPUs after each instant (beside ``times``).
    stranded: List[float] = field(default_factory=list)
    # Requeues and GPU-seconds of work lost, by cause (CAUSES).
    requeues: Dict[str, int] = field(default_factory=lambda: {c: 0 for c in CAUSES})
    lost_gpu_s: Dict[str, float] = field(default_factory=lambda: {c: 0.0 for c in CAUSES})
    # Outages: each failure (node, time); each drain (node, start, drained at: None when it never emptied).
    failures: List[Tuple[str, float]] = field(default_factory=list)
    drains: List[Tuple[str, float, Optional[float]]] = field(default_factory=list)
    # GPU-seconds of capacity that was down (failed and not yet repaired).
    down_gpu_s: float = 0.0
    # Resizes of each job (beside ``jobs``), and the GPU-seconds their restart overheads held without progress.
    resizes: List[int] = field(default_factory=list)
    resize_overhead_gpu_s: float = 0.0


def gang_for(job: TraceJob, max_node_gpus: int, placement: str = "pack") -> Gang:
    """The gang a trace job asks for. Without a worker count: one worker if it fits a node, else equal workers of
    the largest GPU count that divides the job's GPUs and fits a node (16 GPUs on 8-GPU nodes: 2 x 8). Placed with
    the trace's strategy, else ``placement``. An elastic job's gang is at that size, with its bounds."""
    if job.workers:
        workers = job.workers
    elif job.gpus > 1 and job.gpus != int(job.gpus):
        raise SimulationError(f"job {job.id}: gpus {job.gpus:g} with no worker count: allowed: a whole number, "
                              "below 1 (a share of one GPU), or a worker count that splits it into shares below 1 "
                              "or whole GPUs per worker")
    elif job.gpus <= max_node_gpus or max_node_gpus <= 0:
        workers = 1
    else:
        total = int(job.gpus)
        per = max(d for d in range(1, max_node_gpus + 1) if total % d == 0)
        workers = total // per
    g = job.gpus / workers
    why = gpu_request_error(g)
    if why is not None:
        raise SimulationError(f"job {job.id}: {job.gpus:g} GPUs over {workers} workers is {g:g} per worker; "
                              f"allowed: {why}")
    per_worker = Resources(g, job.cpus / workers, job.memory / workers)
    lo = workers if job.min_workers is None else job.min_workers
    hi = workers if job.max_workers is None else job.max_workers
    if not lo <= workers <= hi:
        raise SimulationError(f"job {job.id}: {workers} workers, outside min_workers {lo} .. max_workers {hi}; "
                              "allowed: bounds that hold the job's worker count (given, or derived from its GPUs)")
    elastic = lo < hi
    return Gang(workers, per_worker, job.placement or placement, job.features,
                min_workers=lo if elastic else None, max_workers=hi if elastic else None)


class Simulator:
    """One replay of ``trace`` on ``nodes`` under ``config``. ``run()`` once; it returns a ``SimResult``."""

    def __init__(
        self,
        trace: Trace,
        nodes: Sequence[Node],
        teams: Mapping[str, Team],
        config: SchedulerConfig,
        *,
        classes: Mapping[str, WorkloadClass] = (),
        default_class: WorkloadClass = DEFAULT_CLASS,
        options: SimOptions = SimOptions(),
        cluster_name: str = "",
    ):
        self.trace = trace
        self.nodes = list(nodes)
        self.config = config
        self.options = options
        self.cluster_name = cluster_name
        self.classes = dict(classes or {})
        self.default_class = default_class
        teams = dict(teams)
        for name in trace.teams:
            teams.setdefault(name, Team(name, {}))
        self.teams = teams
        self.total_gpus = sum(n.capacity.gpu for n in self.nodes)
        max_node_gpus = int(max((n.capacity.gpu for n in self.nodes), default=0))

        rng = random.Random(options.seed)
        feasible: Dict[Tuple, Optional[str]] = {}
        self.jobs: List[TraceJob] = []
        self.workloads: List[Workload] = []
        self.rejected: List[Tuple[TraceJob, str]] = []
        gangs: Dict[Tuple, Gang] = {}
        default_curve, class_curves = speedup_table(options.elastic_speedup)
        self.curves: List[Speedup] = []
        for job in trace.jobs:
            cls = self._class(job)
            key = (job.gpus, job.workers, job.cpus, job.memory, job.placement, job.features, job.min_workers,
                   job.max_workers)
            gang = gangs.get(key)
            if gang is None:
                gang = gangs[key] = gang_for(job, max_node_gpus, options.placement)
            if gang.elastic and not cls.resizable:
                raise SimulationError(f"job {job.id}: min_workers {gang.lo}, max_workers {gang.hi} on class "
                                      f"{cls.name}, which is not resizable; allowed: a fixed size (no bounds, or "
                                      "equal ones) or a class with resizable: true")
            w = Workload(job.id, job.team, cls, gang, job.submit, self._estimate(job, rng))
            fkey = (gang, job.team)
            if fkey not in feasible:
                why = check_feasible(w, self.nodes, self.teams, config.admission)
                feasible[fkey] = None if why is None else str(why)
            if feasible[fkey] is not None:
                self.rejected.append((job, feasible[fkey]))
                continue
            self.jobs.append(job)
            self.workloads.append(w)
            try:
                curve = parse_speedup(job.speedup) if job.speedup else class_curves.get(cls.name, default_curve)
            except ValueError as exc:
                raise SimulationError(f"job {job.id}: {exc}") from None
            self.curves.append(curve)

    def _class(self, job: TraceJob) -> WorkloadClass:
        if job.cls is None:
            return self.default_class
        cls = self.classes.get(job.cls)
        if cls is None:
            raise SimulationError(f"job {job.id}: workload class {job.cls!r} is not in the policy; known: "
                                  + ", ".join(sorted(self.classes) or ["(none)"]))
        return cls

    def _estimate(self, job: TraceJob, rng: random.Random) -> Optional[float]:
        mode = self.options.estimates
        if mode == "exact":
            return job.duration
        if mode == "noisy":
            return job.duration * rng.lognormvariate(0.0, self.options.noise_sigma)
        if mode == "declared":
            return job.estimate
        return None

    # ------------------------------------------------------------------------------------------------ replay
    def run(self, progress: Optional[Callable[[float, int, int], None]] = None,
            should_stop: Optional[Callable[[], bool]] = None) -> SimResult:
        """Replay to the last completion. ``progress(now, done, total)`` is called now and then. The replay stops
        early, with its result marked partial, when ``should_stop()`` turns true (checked between instants: the
        CLI's Ctrl-C handler sets it) or on a ``KeyboardInterrupt``."""
        opts, cfg = self.options, self.config
        n = len(self.jobs)
        jobs, wl = self.jobs, list(self.workloads)
        state = ClusterState(self.nodes, self.teams, cfg)
        index = {w.id: j for j, w in enumerate(wl)}
        # The queued gang's GPUs (its requested size): what ``quiet`` and the stranded-GPU shapes count.
        gpus = [w.gang.total.gpu for w in wl]
        ckpt_every = [w.cls.checkpoint_interval_s for w in wl]
        # Seconds of work at the requested size (see *elastic job*).
        remaining = [job.duration for job in jobs]
        # The running lease's size, GPUs held, work per second, and seconds of no progress from ``start_at`` (a
        # resize's restart; 0 for an attempt's start). ``gang0``: the gang as submitted, what a requeue goes back to.
        gang0 = [w.gang for w in wl]
        size = [w.gang.workers for w in wl]
        held = list(gpus)
        rate = [1.0] * n
        ovh = [0.0] * n
        curves = self.curves
        resizes = [0] * n
        resize_overhead = opts.resize_overhead_s
        resize_overhead_gpu_s = 0.0
        elastic_running = 0
        start_at = [-1.0] * n
        stop_req = [-1.0] * n
        first_start = [-1.0] * n
        finish = [-1.0] * n
        preemptions = [0] * n
        lost = [0.0] * n
        attempt = [0] * n
        team_gpu_s: Dict[str, float] = {t: 0.0 for t in self.teams}
        times: List[float] = []
        busy_s: List[float] = []
        queued_s: List[int] = []
        running_s: List[int] = []

        can_preempt = cfg.preemption != "none"
        tick = opts.tick_s if opts.tick_s is not None else (DEFAULT_TICK_S if can_preempt else 0.0)
        track_ckpt = can_preempt
        budget = cfg.max_admissions_per_cycle
        max_examined = opts.max_examined
        stop_delay = opts.stop_delay_s
        decay_every = cfg.fair_share_half_life_s / 100.0
        last_decay = -math.inf

        events: List[Tuple[float, int, int, int]] = []
        ckpts: List[Tuple[float, int, int]] = []
        heappush, heappop = heapq.heappush, heapq.heappop
        submits = [w.submit_time for w in wl]
        total_gpus = self.total_gpus
        pending_gpus: Dict[float, int] = {}
        busy = 0.0
        nrunning = 0
        done = 0
        cycles = 0
        cycle_wall: List[float] = []
        cycle_pending: List[int] = []
        instants = 0
        tick_at = math.inf
        t = 0.0
        partial = False
        wall0 = time.perf_counter()

        # Outages and what they cost.
        outages = opts.outages
        base_nodes = {nd.id: nd for nd in self.nodes}
        present_gpus = total_gpus  # capacity of the nodes that are up
        node_events: List[Tuple[str, str, object]] = []  # (kind, node id, argument); heap entries index this
        down: Dict[str, float] = {}  # failed node -> since
        cordoned: Dict[str, int] = {}  # draining node -> its drain (index in ``drains``)
        drains: List[List] = []  # [node, start, drained at]
        failures: List[Tuple[str, float]] = []
        requeues = {c: 0 for c in CAUSES}
        lost_gpu_s = {c: 0.0 for c in CAUSES}
        stop_cause = ["preemption"] * n
        down_gpu_s = 0.0
        rngs = {}
        redraw: set = set()  # nodes whose drawn failure came while they were down

        def push_node(at: float, kind: str, nid: str, arg: object = None) -> None:
            node_events.append((kind, nid, arg))
            heappush(events, (at, _NODE, len(node_events) - 1, 0))

        for f in outages.failures:
            push_node(f.at, "fail", f.node, (f.down_for, False))
        for d in outages.drains:
            push_node(d.at, "drain", d.node, d.down_for)
        if outages.mtbf_s:
            for nd in self.nodes:
                rngs[nd.id] = node_rng(opts.seed, nd.id)
                push_node(next_failure(rngs[nd.id], 0.0, outages.mtbf_s), "fail", nd.id, (outages.repair_s, True))

        # Stranded GPUs: the distinct (team, gang) shapes pending, counted as workloads enter and leave the queues.
        # (Jobs of one shape share one Gang object: keyed by its id, not by its value, which is slower to hash.)
        shape_of: List[int] = []
        shape_ids: Dict[Tuple[str, int], int] = {}
        shapes: List[Tuple[str, Gang]] = []
        for w in wl:
            key = (w.team, id(w.gang))
            s_id = shape_ids.get(key)
            if s_id is None:
                s_id = shape_ids[key] = len(shapes)
                shapes.append((w.team, w.gang))
            shape_of.append(s_id)
        shape_count = [0] * len(shapes)
        waiting_shapes: Dict[int, None] = {}
        # Shapes of one worker of one GPU, waiting: when the free GPU counts are whole numbers (whole nodes, whole
        # GPUs per worker), one of these that its quota admits could take any free GPU, so nothing is stranded.
        any_gpu = [takes_any_gpu(g) for _, g in shapes]
        waiting_any_gpu: Dict[int, None] = {}
        whole_gpus = (all(nd.capacity.gpu % 1 == 0 for nd in self.nodes)
                      and all(g.per_worker.gpu % 1 == 0 for _, g in shapes))
        stranded_s: List[float] = []
        stranded_now = 0.0

        def queued(j: int, k: int) -> None:
            s_id = shape_of[j]
            c = shape_count[s_id] = shape_count[s_id] + k
            if c == 0:
                del waiting_shapes[s_id]
                waiting_any_gpu.pop(s_id, None)
            elif c == k == 1:
                waiting_shapes[s_id] = None
                if any_gpu[s_id]:
                    waiting_any_gpu[s_id] = None

        def stranded() -> float:
            if not waiting_shapes or present_gpus - busy <= 1e-9:
                return 0.0  # nothing waits, or no GPU is free
            if whole_gpus and waiting_any_gpu:
                per_team = {}
                for s_id in waiting_any_gpu:
                    per_team.setdefault(shapes[s_id][0], []).append(shapes[s_id][1])
                if admissible(per_team, state.teams, state.usage, cfg.admission):
                    return 0.0
            per_team: Dict[str, List[Gang]] = {}
            for s_id in waiting_shapes:
                team, gang = shapes[s_id]
                per_team.setdefault(team, []).append(gang)
            gangs = admissible(per_team, state.teams, state.usage, cfg.admission)
            return fragmentation(state.nodes.values(), gangs).total

        def start(adm, now: float) -> None:
            nonlocal busy, nrunning, elastic_running
            w = adm.workload
            j = index[w.id]
            # The size is the lease's, as the state booked it: the gang as queued, at the size admitted.
            g = state.start(adm, now).workload.gang
            pending_gpus[gpus[j]] -= 1
            queued(j, -1)
            start_at[j] = now
            stop_req[j] = -1.0
            if first_start[j] < 0:
                first_start[j] = now
            attempt[j] += 1
            size[j], held[j], ovh[j] = g.workers, g.total.gpu, 0.0
            rate[j] = curves[j].rate(g.workers, gang0[j].workers)
            heappush(events, (now + remaining[j] / rate[j], _FINISH, j, attempt[j]))
            if track_ckpt and ckpt_every[j] > 0:
                heappush(ckpts, (now + ckpt_every[j], j, attempt[j]))
            busy += held[j]
            nrunning += 1
            if g.elastic:
                elastic_running += 1

        def resize(rz, now: float) -> None:
            """Apply a ``Resize``: keep the work done, take the lease again at the new size and placement, then
            no progress for the restart overhead (see *resize*)."""
            nonlocal busy, resize_overhead_gpu_s
            j = index.get(rz.workload.id)
            if j is None or start_at[j] < 0 or stop_req[j] >= 0:
                raise SimulationError(f"resize of {rz.workload.id} at t={now:.0f}s: allowed only for a running "
                                      "lease that is not stopping")
            try:
                # The state checks the sizes and keeps the gang's service so far (what it held, for how long).
                w2 = state.resize(rz, now).workload
            except ValueError as e:
                raise SimulationError(f"at t={now:.0f}s: {e}") from None
            to = rz.to_workers
            run = now - start_at[j]
            remaining[j] = max(0.0, remaining[j] - max(0.0, run - ovh[j]) * rate[j])
            team_gpu_s[jobs[j].team] += held[j] * run
            wl[j] = w2
            busy += w2.gang.total.gpu - held[j]
            size[j], held[j], ovh[j] = to, w2.gang.total.gpu, resize_overhead
            rate[j] = curves[j].rate(to, gang0[j].workers)
            resize_overhead_gpu_s += resize_overhead * held[j]
            resizes[j] += 1
            start_at[j] = now
            attempt[j] += 1  # the old finish and checkpoint events no longer hold
            heappush(events, (now + resize_overhead + remaining[j] / rate[j], _FINISH, j, attempt[j]))
            if track_ckpt and ckpt_every[j] > 0:
                heappush(ckpts, (now + resize_overhead + ckpt_every[j], j, attempt[j]))

        def release(j: int, now: float):
            lease = state.finish(wl[j].id, now)
            ended(j, now)
            return lease

        def ended(j: int, now: float) -> None:
            """Job ``j``'s lease ended at ``now`` (the state already gave its resources back)."""
            nonlocal busy, nrunning, elastic_running
            busy -= held[j]
            nrunning -= 1
            team_gpu_s[jobs[j].team] += held[j] * (now - start_at[j])
            if wl[j].gang.elastic:
                elastic_running -= 1

        def stopped(j: int, now: float) -> None:
            lease = release(j, now)
            back(j, lease, now, stop_req[j] - start_at[j], stop_cause[j])

        def back(j: int, lease, now: float, run: float, cause: str) -> None:
            """Requeue job ``j``, whose lease ran ``run`` seconds, keeping the work up to its last checkpoint (the
            checkpoints of a resized lease count from the end of its restart overhead)."""
            every = ckpt_every[j]
            prog = max(0.0, run - ovh[j])  # seconds of progress, at ``rate[j]``
            # 1e-9: a run that ends on a checkpoint keeps it, though float sums of the times fall just short.
            kept = math.floor(prog / every + 1e-9) * every if every > 0 else 0.0
            kept = min(max(kept, 0.0), remaining[j] / rate[j], prog)
            lost[j] += prog - kept
            lost_gpu_s[cause] += (prog - kept) * held[j]
            requeues[cause] += 1
            remaining[j] -= kept * rate[j]
            if cause == "preemption":
                preemptions[j] += 1
            attempt[j] += 1
            w = lease.workload
            if w.gang is not gang0[j]:
                w = replace(w, gang=gang0[j])  # back in its queue at its requested size
            if w.runtime_estimate_s is not None:
                # The lost work must be done again: the runtime still needed is the estimate plus what was lost,
                # so that estimate minus service received stays the remaining time.
                w = replace(w, runtime_estimate_s=w.runtime_estimate_s + prog - kept)
            if w is not lease.workload:
                lease = replace(lease, workload=w)
            wl[j] = state.requeue(lease, now, attained_gpu_s=w.attained_gpu_s + held[j] * run)
            pending_gpus[gpus[j]] += 1
            queued(j, 1)
            start_at[j] = stop_req[j] = -1.0

        def stop(j: int, now: float, cause: str, stops: List[int]) -> None:
            """Tell job ``j``'s lease to stop; it stops after the stop delay (now: appended to ``stops``)."""
            state.mark_terminating(wl[j].id)
            stop_req[j] = now
            stop_cause[j] = cause
            if stop_delay > 0:
                heappush(events, (now + stop_delay, _STOPPED, j, attempt[j]))
            else:
                stops.append(j)

        def evict(nid: str, now: float) -> None:
            """Stop every running lease on node ``nid`` (a drain)."""
            stops: List[int] = []
            for lease in list(state.leases.values()):
                if nid in lease.placement and lease.state is LeaseState.RUNNING:
                    stop(index[lease.id], now, "drain", stops)
            for j in stops:
                stopped(j, now)

        def node_event(k: int, now: float) -> None:
            nonlocal present_gpus, down_gpu_s
            kind, nid, arg = node_events[k]
            cap = base_nodes[nid].capacity.gpu
            if kind == "fail":
                down_for, drawn = arg
                if nid in down:
                    if drawn:
                        redraw.add(nid)  # draw its next failure once it is back
                    return  # already down: this failure changes nothing
                for lease in state.remove_node(nid, now):
                    j = index[lease.id]
                    ended(j, now)
                    end = stop_req[j] if stop_req[j] >= 0 else now
                    back(j, lease, now, end - start_at[j], "failure")
                down[nid] = now
                present_gpus -= cap
                failures.append((nid, now))
                if down_for is not None:
                    push_node(now + down_for, "up", nid, drawn)
            elif kind == "up":
                down_gpu_s += cap * (now - down.pop(nid))
                base = base_nodes[nid]
                state.add_node(replace(base, free=base.capacity, schedulable=nid not in cordoned))
                present_gpus += cap
                if (arg or nid in redraw) and outages.mtbf_s:
                    redraw.discard(nid)
                    push_node(next_failure(rngs[nid], now, outages.mtbf_s), "fail", nid, (outages.repair_s, True))
            elif kind == "drain":
                if nid in cordoned:
                    return  # already draining
                cordoned[nid] = len(drains)
                drains.append([nid, now, None])
                if nid in state.nodes:
                    state.set_schedulable(nid, False)
                deadline = outages.drain_deadline_s
                if deadline == 0:
                    evict(nid, now)
                elif deadline is not None:
                    push_node(now + deadline, "deadline", nid, cordoned[nid])
                if arg is not None:
                    push_node(now + arg, "undrain", nid, cordoned[nid])
            elif kind == "deadline":
                if cordoned.get(nid) == arg and drains[arg][2] is None:
                    evict(nid, now)
            elif kind == "undrain":
                if cordoned.get(nid) == arg:
                    del cordoned[nid]
                    if nid in state.nodes:
                        state.set_schedulable(nid, True)

        def check_drained(now: float) -> None:
            for nid, d in cordoned.items():
                if drains[d][2] is None:
                    nd = state.nodes.get(nid)
                    if nd is None or _empty(nd):
                        drains[d][2] = now

        def quiet() -> bool:
            # A cycle can change nothing with no work pending, nor, without preemption, when the smallest pending
            # gang needs more GPUs than are free in all (an admission takes its whole gang's GPUs now).
            if elastic_running and present_gpus - busy > 1e-9:
                return False  # a running elastic gang may grow into the free GPUs
            if not state.pending_count():
                return True
            if can_preempt:
                return False
            smallest = min((g for g, c in pending_gpus.items() if c), default=0.0)
            return smallest > present_gpus - busy + 1e-9

        def run_cycles(now: float) -> None:
            nonlocal cycles, last_decay
            for _ in range(opts.max_cycles_per_instant):
                if quiet():
                    return
                if track_ckpt:
                    while ckpts and ckpts[0][0] <= now:
                        _, j, a = heappop(ckpts)
                        if a != attempt[j] or stop_req[j] >= 0 or finish[j] >= 0:
                            continue
                        every = ckpt_every[j]
                        base = start_at[j] + ovh[j]
                        # 1e-9: (now - start) / every just short of a whole number at a checkpoint due now must
                        # count it, or the same checkpoint is queued again at now forever.
                        last = base + math.floor((now - base) / every + 1e-9) * every
                        state.checkpointed(wl[j].id, last)
                        heappush(ckpts, (last + every, j, a))
                if now - last_decay >= decay_every:
                    state.decay(now)
                    last_decay = now
                snap = state.snapshot(limit=max_examined)
                pending_now = state.pending_count()
                c0 = time.perf_counter()
                with gc_paused():  # as the control actor runs it: no collection inside a cycle
                    result = cycle(snap, now, max_examined=max_examined)
                cycle_wall.append(time.perf_counter() - c0)
                cycle_pending.append(pending_now)
                cycles += 1
                for adm in result.admitted:
                    start(adm, now)
                for rz in result.resized:
                    resize(rz, now)
                stops: List[int] = []
                for p in result.preempted:
                    for vid in p.victims:
                        j = index[vid]
                        if stop_req[j] >= 0 or start_at[j] < 0:
                            continue
                        stop(j, now, "preemption", stops)
                for j in stops:
                    stopped(j, now)
                # Go again at this instant while the last cycle may have left work undone: it stopped leases, used
                # its whole admission budget, or admitted and then ran out of workloads to examine.
                admitted = len(result.admitted)
                if not (stops or result.resized or admitted >= budget
                        or (admitted and admitted + len(result.pending) >= max_examined)):
                    return
            raise SimulationError(
                f"the cycles at t={now:.0f}s did not settle after {opts.max_cycles_per_instant} rounds "
                f"(admissions and preemptions keep undoing each other)")

        order = sorted(range(n), key=submits.__getitem__)
        i = 0
        try:
            if progress is not None:
                progress(0.0, 0, n)
            while True:
                if i >= n and not nrunning and not state.pending_count():
                    break  # all done: outages still to come change nothing
                t_arr = submits[order[i]] if i < n else math.inf
                t_ev = events[0][0] if events else math.inf
                t = t_arr if t_arr < t_ev else t_ev
                if t == math.inf:
                    break  # nothing runs and nothing arrives: time alone changes nothing now
                if t > tick_at:
                    t = tick_at
                changed = False
                if t == tick_at:
                    tick_at = math.inf
                    changed = state.pending_count() > 0
                while i < n and submits[order[i]] == t:
                    j = order[i]
                    state.enqueue(wl[j])
                    pending_gpus[gpus[j]] = pending_gpus.get(gpus[j], 0) + 1
                    queued(j, 1)
                    i += 1
                    changed = True
                while events and events[0][0] == t:
                    _, kind, j, a = heappop(events)
                    if kind == _NODE:
                        node_event(j, t)
                        changed = True
                        continue
                    if a != attempt[j] or finish[j] >= 0:
                        continue  # an event of an attempt that was stopped since
                    if kind == _FINISH:
                        release(j, t)
                        remaining[j] = 0.0
                        finish[j] = t
                        start_at[j] = -1.0
                        done += 1
                    else:
                        stopped(j, t)
                    changed = True
                if changed:
                    run_cycles(t)
                    if cordoned:
                        check_drained(t)
                    stranded_now = stranded()
                instants += 1
                pending = state.pending_count()
                times.append(t)
                busy_s.append(busy)
                stranded_s.append(stranded_now)
                queued_s.append(pending)
                running_s.append(nrunning)
                if tick > 0 and pending and tick_at == math.inf:
                    tick_at = (math.floor(t / tick) + 1) * tick
                if progress is not None and not instants & 1023:
                    progress(t, done, n)
                if should_stop is not None and should_stop():
                    partial = True
                    break
        except KeyboardInterrupt:
            partial = True
        if t == math.inf:
            t = times[-1] if times else 0.0
        for j in range(n):  # leases still running when the replay stopped
            if start_at[j] >= 0:
                team_gpu_s[jobs[j].team] += held[j] * (t - start_at[j])
        for nid, since in down.items():  # nodes still down
            down_gpu_s += base_nodes[nid].capacity.gpu * max(0.0, t - since)
        if progress is not None and not partial:
            progress(t, done, n)
        return SimResult(
            jobs=jobs, config=cfg, options=opts, teams=dict(state.teams), total_gpus=self.total_gpus,
            first_start=first_start, finish=finish, preemptions=preemptions, lost_work=lost, team_gpu_s=team_gpu_s,
            times=times, busy=busy_s, queued=queued_s, running=running_s, rejected=list(self.rejected),
            cycles=cycles, instants=instants, wall_s=time.perf_counter() - wall0, partial=partial,
            cycle_wall=cycle_wall, cycle_pending=cycle_pending,
            end_time=t, cluster_name=self.cluster_name,
            trace_source=self.trace.source, tick_s=tick, stranded=stranded_s, requeues=requeues,
            lost_gpu_s=lost_gpu_s, failures=failures, drains=[tuple(d) for d in drains], down_gpu_s=down_gpu_s,
            resizes=resizes, resize_overhead_gpu_s=resize_overhead_gpu_s,
        )


def _empty(node: Node) -> bool:
    f, c = node.free, node.capacity
    return f.gpu >= c.gpu - 1e-9 and f.cpu >= c.cpu - 1e-9 and f.memory >= c.memory - 1e-9


def simulate(trace: Trace, nodes: Sequence[Node], config: SchedulerConfig, *, teams: Mapping[str, Team] = (),
             options: SimOptions = SimOptions(), **kw) -> SimResult:
    """Convenience: build a ``Simulator`` and run it."""
    return Simulator(trace, nodes, dict(teams or {}), config, options=options, **kw).run()
