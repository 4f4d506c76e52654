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
from raylane.scheduling import ClusterState, check_feasible, cycle
from raylane.scheduling.cycle import MAX_EXAMINED
from raylane.scheduling.types import Gang, Node, Resources, SchedulerConfig, Team, Workload, WorkloadClass
from raylane.sim.traces import Trace, TraceJob

__all__ = ["ESTIMATES", "DEFAULT_CLASS", "SimOptions", "SimResult", "SimulationError", "Simulator", "gang_for",
           "simulate"]

ESTIMATES = ("none", "exact", "noisy", "declared")

# The class of trace jobs that name none: preemptible training with a checkpoint every 5 minutes.
DEFAULT_CLASS = WorkloadClass("train", priority=100, preemptible=True, min_runtime_s=0.0, checkpoint_interval_s=300.0,
                              grace_period_s=0.0)

# Seconds between clock-triggered cycles when preemption is on and ``tick_s`` is left to the simulator.
DEFAULT_TICK_S = 300.0

_FINISH, _STOPPED, _TICK = 0, 1, 2


class SimulationError(FatalError):
    """The replay cannot go on (e.g. the cycles at one instant never settle)."""


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

    def __post_init__(self):
        if self.estimates not in ESTIMATES:
            raise FatalError(f"estimates {self.estimates!r}: allowed: {', '.join(ESTIMATES)}")


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
    partial: bool = False
    # Simulated time the replay stopped at (the last completion, or where it was interrupted).
    end_time: float = 0.0
    cluster_name: str = ""
    trace_source: str = ""
    # The tick the replay used (``options.tick_s`` resolved).
    tick_s: float = 0.0


def gang_for(job: TraceJob, max_node_gpus: int) -> Gang:
    """The gang a trace job asks for. Without a worker count: one worker if it fits a node, else equal workers of
    the largest GPU count that divides the job's GPUs and fits a node (16 GPUs on 8-GPU nodes: 2 x 8)."""
    if job.workers:
        workers = job.workers
    elif job.gpus <= max_node_gpus or max_node_gpus <= 0:
        workers = 1
    else:
        per = max(d for d in range(1, max_node_gpus + 1) if job.gpus % d == 0)
        workers = job.gpus // per
    per_worker = Resources(job.gpus / workers, job.cpus / workers, job.memory / workers)
    return Gang(workers, per_worker, job.placement or "pack", job.features)


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
        for job in trace.jobs:
            cls = self._class(job)
            key = (job.gpus, job.workers, job.cpus, job.memory, job.placement, job.features)
            gang = gangs.get(key)
            if gang is None:
                gang = gangs[key] = gang_for(job, max_node_gpus)
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
        gpus = [w.gang.total.gpu for w in wl]
        ckpt_every = [w.cls.checkpoint_interval_s for w in wl]
        remaining = [job.duration for job in jobs]
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
        instants = 0
        tick_at = math.inf
        t = 0.0
        partial = False
        wall0 = time.perf_counter()

        def start(adm, now: float) -> None:
            nonlocal busy, nrunning
            w = adm.workload
            j = index[w.id]
            state.start(adm, now)
            pending_gpus[gpus[j]] -= 1
            start_at[j] = now
            stop_req[j] = -1.0
            if first_start[j] < 0:
                first_start[j] = now
            attempt[j] += 1
            heappush(events, (now + remaining[j], _FINISH, j, attempt[j]))
            if track_ckpt and ckpt_every[j] > 0:
                heappush(ckpts, (now + ckpt_every[j], j, attempt[j]))
            busy += gpus[j]
            nrunning += 1

        def release(j: int, now: float):
            nonlocal busy, nrunning
            lease = state.finish(wl[j].id, now)
            busy -= gpus[j]
            nrunning -= 1
            team_gpu_s[jobs[j].team] += gpus[j] * (now - start_at[j])
            return lease

        def stopped(j: int, now: float) -> None:
            lease = release(j, now)
            run = stop_req[j] - start_at[j]
            every = ckpt_every[j]
            kept = math.floor(run / every) * every if every > 0 else 0.0
            kept = min(max(kept, 0.0), remaining[j])
            lost[j] += run - kept
            remaining[j] -= kept
            preemptions[j] += 1
            attempt[j] += 1
            w = lease.workload
            if w.runtime_estimate_s is not None:
                # The lost work must be done again: the runtime still needed is the estimate plus what was lost,
                # so that estimate minus service received stays the remaining time.
                lease = replace(lease, workload=replace(w, runtime_estimate_s=w.runtime_estimate_s + run - kept))
            wl[j] = state.requeue(lease, now, attained_gpu_s=w.attained_gpu_s + gpus[j] * run)
            pending_gpus[gpus[j]] += 1
            start_at[j] = stop_req[j] = -1.0

        def quiet() -> bool:
            # A cycle can change nothing with no work pending, nor, without preemption, when the smallest pending
            # gang needs more GPUs than are free in all (an admission takes its whole gang's GPUs now).
            if not state.pending_count():
                return True
            if can_preempt:
                return False
            smallest = min((g for g, c in pending_gpus.items() if c), default=0.0)
            return smallest > total_gpus - busy + 1e-9

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
                        last = start_at[j] + math.floor((now - start_at[j]) / every) * every
                        state.checkpointed(wl[j].id, last)
                        heappush(ckpts, (last + every, j, a))
                if now - last_decay >= decay_every:
                    state.decay(now)
                    last_decay = now
                result = cycle(state.snapshot(limit=max_examined), now, max_examined=max_examined)
                cycles += 1
                for adm in result.admitted:
                    start(adm, now)
                stops = []
                for p in result.preempted:
                    for vid in p.victims:
                        j = index[vid]
                        if stop_req[j] >= 0 or start_at[j] < 0:
                            continue
                        state.mark_terminating(vid)
                        stop_req[j] = now
                        if stop_delay > 0:
                            heappush(events, (now + stop_delay, _STOPPED, j, attempt[j]))
                        else:
                            stops.append(j)
                for j in stops:
                    stopped(j, now)
                # Go again at this instant while the last cycle may have left work undone: it stopped leases, used
                # its whole admission budget, or admitted and then ran out of workloads to examine.
                admitted = len(result.admitted)
                if not (stops or admitted >= budget or (admitted and admitted + len(result.pending) >= max_examined)):
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
                    i += 1
                    changed = True
                while events and events[0][0] == t:
                    _, kind, j, a = heappop(events)
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
                instants += 1
                pending = state.pending_count()
                times.append(t)
                busy_s.append(busy)
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
                team_gpu_s[jobs[j].team] += gpus[j] * (t - start_at[j])
        if progress is not None and not partial:
            progress(t, done, n)
        return SimResult(
            jobs=jobs, config=cfg, options=opts, teams=dict(state.teams), total_gpus=self.total_gpus,
            first_start=first_start, finish=finish, preemptions=preemptions, lost_work=lost, team_gpu_s=team_gpu_s,
            times=times, busy=busy_s, queued=queued_s, running=running_s, rejected=list(self.rejected),
            cycles=cycles, instants=instants, wall_s=time.perf_counter() - wall0, partial=partial,
            end_time=t, cluster_name=self.cluster_name,
            trace_source=self.trace.source, tick_s=tick,
        )


def simulate(trace: Trace, nodes: Sequence[Node], config: SchedulerConfig, *, teams: Mapping[str, Team] = (),
             options: SimOptions = SimOptions(), **kw) -> SimResult:
    """Convenience: build a ``Simulator`` and run it."""
    return Simulator(trace, nodes, dict(teams or {}), config, options=options, **kw).run()
