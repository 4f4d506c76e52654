"""The discrete-event simulator: a driver of ``raylane.scheduling.cycle``, with a simulated clock and nodes.

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
  (``declared``, generic format); or a runtime *predicted* from the jobs that ended before it arrived
  (``predicted``: ``raylane.runtimes.RuntimeModel`` trained online on each end, as the control plane's is, and
  nothing else; ``predicted-declared``: the same, with the trace's declared estimates folded in by the model).
  A prediction is made when a job arrives (``Workload.predicted``) and read conditional on the service it has
  had; the model is ``Simulator.runtime_model``.
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

The simulator's modules: ``types`` (its options, result and error), this one (the trace's jobs made workloads, and
the loop over instants), ``replay`` (the world of one replay in progress: events, jobs, outages, series) and
``stranded`` (the stranded-GPU figure). The replay changes the ``ClusterState`` only through
``raylane.scheduling.lifecycle``, as the control plane does.
"""
from __future__ import annotations

import math
import random
import time
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from raylane.runtimes import RuntimeModel
from raylane.scheduling import ClusterState, check_feasible, cycle
from raylane.scheduling.types import (
    Gang, Node, Resources, SchedulerConfig, Team, Workload, WorkloadClass, gpu_request_error,
)
from raylane.sim.cluster import ClusterSpec
from raylane.sim.replay import Replay
from raylane.sim.traces import Speedup, Trace, TraceJob, parse_speedup
from raylane.sim.types import (
    CAUSES, DEFAULT_CLASS, DEFAULT_RESIZE_OVERHEAD_S, DEFAULT_TICK_S, ELASTIC_SPEEDUP_ALLOWED, ESTIMATES, SimOptions,
    SimResult, SimulationError, speedup_table,
)

# The replay's words (raylane.sim.types) are re-exported here, where callers have always found them.
__all__ = ["ESTIMATES", "DEFAULT_CLASS", "DEFAULT_RESIZE_OVERHEAD_S", "DEFAULT_TICK_S", "CAUSES",
           "ELASTIC_SPEEDUP_ALLOWED", "SimOptions", "SimResult", "SimulationError", "Simulator", "gang_for",
           "simulate", "speedup_table"]


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
    """One replay of ``trace`` on ``nodes`` under ``config``. ``run()`` once; it returns a ``SimResult``.

    ``cluster``: the cluster file ``nodes`` come from; when its groups grow, have a price or are spot
    (``ClusterSpec.elastic``), the replay follows its nodes' lives and cost (``raylane.sim.autoscaled``), and a job
    is checked against the cluster at its largest (every group at ``max``)."""

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
        cluster: Optional["ClusterSpec"] = None,
    ):
        self.trace = trace
        self.nodes = list(nodes)
        self.cluster = cluster if cluster is not None and cluster.elastic else None
        self.config = config
        self.options = options
        # What the replay learns runtimes with under ``predicted`` estimates (a test may put its own here).
        self.runtime_model: Optional[RuntimeModel] = (
            RuntimeModel() if options.estimates.startswith("predicted") else None)
        self.cluster_name = cluster_name
        self.classes = dict(classes or {})
        self.default_class = default_class
        teams = dict(teams)
        for name in trace.teams:
            teams.setdefault(name, Team(name, {}))
        self.teams = teams
        self.total_gpus = sum(n.capacity.gpu for n in self.nodes)
        largest = self.cluster.nodes_at_max() if self.cluster is not None else self.nodes
        max_node_gpus = int(max((n.capacity.gpu for n in largest), default=0))

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
            w = Workload(job.id, job.team, cls, gang, job.submit, self._estimate(job, rng), user=job.user)
            fkey = (gang, job.team)
            if fkey not in feasible:
                why = check_feasible(w, largest, self.teams, config.admission)
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
        if mode == "predicted-declared":
            return job.estimate
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
        # The core's state and cycle, as this module names them (a test may patch ``cycle`` here).
        replay = Replay(self, ClusterState(self.nodes, self.teams, self.config), cycle)
        next_instant, apply_instant, settle, sample = (replay.next_instant, replay.apply_instant, replay.settle,
                                                       replay.sample)
        n, t = replay.n, 0.0
        wall0 = time.perf_counter()
        try:
            if progress is not None:
                progress(0.0, 0, n)
            while True:
                nxt = next_instant()
                if nxt is None:
                    break  # all done: outages still to come change nothing
                t = nxt
                if t == math.inf:
                    break  # nothing runs and nothing arrives: time alone changes nothing now
                if apply_instant(t):
                    settle(t)
                sample(t)
                if progress is not None and not replay.instants & 1023:
                    progress(t, replay.done, n)
                if should_stop is not None and should_stop():
                    replay.partial = True
                    break
        except KeyboardInterrupt:
            replay.partial = True
        if t == math.inf:
            t = replay.times[-1] if replay.times else 0.0
        if progress is not None and not replay.partial:
            progress(t, replay.done, n)
        return replay.result(t, time.perf_counter() - wall0)


def simulate(trace: Trace, nodes: Sequence[Node], config: SchedulerConfig, *, teams: Mapping[str, Team] = (),
             options: SimOptions = SimOptions(), **kw) -> SimResult:
    """Convenience: build a ``Simulator`` and run it."""
    return Simulator(trace, nodes, dict(teams or {}), config, options=options, **kw).run()
