"""One replay in progress: the simulated world that ``Simulator.run`` steps through, instant by instant.

This module owns what changes while a trace replays: the clock's event queue, each job's true remaining work and
attempts (``Jobs``), what preemptions, failures and drains cost, the time series, and the ``ClusterState`` the
core's ``cycle`` decides on. It changes that state only through ``raylane.scheduling.lifecycle`` (and, for what
only a simulated world does, through the state's node, checkpoint and decay methods), and plays the executor:
a lease runs until its work is done or it is told to stop. The words (*instant*, *work*, *service*, *tick*,
*outage*, *elastic job*, *resize*) are those of ``raylane.sim.engine``.

Events on the heap are ``(time, kind, job index, attempt)``: an event of an attempt that has since been stopped,
resized or finished is stale and skipped. A job of a class with a ``max_runtime`` has an event when its attempt
reaches it (``raylane.scheduling.runlimit``, the control plane's rule): it is then stopped as a preemption's victim
is, and requeued (cause ``run_limit``, not a preemption) or, for ``on_max_runtime: stop``, ended unfinished. Node events carry an index into ``node_events`` instead of a job's.

A cluster with growable, priced or spot groups (``ClusterSpec.elastic``) also has a ``Fleet``
(``raylane.sim.autoscaled``): after the cycles of each instant settle, the last cycle's ``Pending`` decisions make
the scale-up demand, and the nodes it launches join, go idle, are removed or reclaimed as node events here.

Speed: a cycle runs only after an instant that changed something; checkpoints of running leases are told to the
state lazily, just before a cycle, and only when preemption is on (the core reads them only to price victims).
"""
from __future__ import annotations

import heapq
import math
import time
from dataclasses import replace
from typing import Callable, Dict, List, Optional, Tuple

from raylane.runtimes import RunFeatures
from raylane.scheduling import lifecycle, runlimit
from raylane.scheduling.apply import CYCLE_AGAIN_MAX, LIVE, SETTLE, Applier
from raylane.scheduling.flavors import flavor_rooms
from raylane.scheduling.gcpace import gc_paused
from raylane.scheduling.state import ClusterState
from raylane.scheduling.types import Admit, Lease, LeaseState, Node, Resize, Workload
from raylane.sim.autoscaled import REARM, REMOVE, Fleet
from raylane.sim.outages import next_failure, node_rng
from raylane.sim.stranded import StrandedShapes
from raylane.sim.traces import Speedup, TraceJob
from raylane.sim.types import (CAUSES, DEFAULT_TICK_S, LIVE_CHANGE_EXAMINED, LIVE_TICK_S, ReplayInputs, SimResult,
                               SimulationError)

__all__ = ["Jobs", "Replay"]

# Kinds of heap events, in the order they are applied at one time (work that ends as its limit falls due ends).
_FINISH, _STOPPED, _LIMIT, _NODE = 0, 1, 2, 3

heappush, heappop = heapq.heappush, heapq.heappop

# The stop cause of a job ended by its class's ``on_max_runtime: stop`` (it is not requeued).
_LIMIT_STOP = "run_limit_stop"


class Jobs:
    """Each trace job's life in the replay, one list per field, indexed like the simulator's ``jobs``. Columns, not
    an object per job: tens of thousands of small objects would slow every garbage collection during the replay
    (+0.3 s, 2%, on a month of Philly)."""

    __slots__ = ("job", "w", "gang0", "gpus", "ckpt_every", "curve", "shape", "remaining", "held", "rate", "ovh",
                 "start_at", "stop_req", "stop_cause", "first_start", "finish", "preemptions", "lost", "attempt",
                 "resizes", "attempt_at", "ran_before", "live_at", "forced")

    def __init__(self, jobs: List[TraceJob], workloads: List[Workload], curves: List[Speedup], shapes: List[int]):
        n = len(workloads)
        self.job = jobs
        self.w = list(workloads)  # each workload as the state knows it (queued, or as its last resize left it)
        self.gang0 = [w.gang for w in workloads]  # the gang as submitted: what a requeue goes back to
        self.gpus = [w.gang.total.gpu for w in workloads]  # the queued gang's GPUs: what ``quiet`` counts
        self.ckpt_every = [w.cls.checkpoint_interval_s for w in workloads]
        self.curve = curves
        self.shape = shapes  # each job's shape in ``StrandedShapes``
        self.remaining = [job.duration for job in jobs]  # seconds of work at the requested size (*elastic job*)
        # The running lease's GPUs, work per second, and seconds of no progress from ``start_at`` (a resize's
        # restart; 0 for an attempt's start).
        self.held = list(self.gpus)
        self.rate = [1.0] * n
        self.ovh = [0.0] * n
        # -1: not (yet).
        self.start_at = [-1.0] * n
        self.stop_req = [-1.0] * n
        self.first_start = [-1.0] * n
        self.finish = [-1.0] * n
        self.stop_cause = ["preemption"] * n
        self.preemptions = [0] * n
        self.lost = [0.0] * n  # seconds of work lost to requeues
        self.attempt = [0] * n
        self.resizes = [0] * n
        # Run limits: when the current attempt was admitted (a resize does not change it), and the seconds the
        # earlier attempts held their leases.
        self.attempt_at = [-1.0] * n
        self.ran_before = [0.0] * n
        # ``live`` fidelity: when the current attempt's gang runs (its admission plus the hand-over), and whether
        # the stop it was asked for runs past its grace period (it is then stopped by force).
        self.live_at = [-1.0] * n
        self.forced = [False] * n


class Replay:
    """The world of one replay of ``sim``'s jobs on ``state``, deciding with ``cycle`` (the core's, as the engine
    names it). ``Simulator.run`` steps it: ``next_instant``, ``apply_instant``, ``settle``, ``sample``; ``result``."""

    def __init__(self, sim: ReplayInputs, state: ClusterState, cycle: Callable):
        opts, cfg = sim.options, sim.config
        self.sim, self.state, self.cycle, self.opts = sim, state, cycle, opts
        self.model = sim.runtime_model
        self.stranded = StrandedShapes(sim.workloads, sim.nodes, cfg.admission)
        self.jobs = Jobs(sim.jobs, sim.workloads, sim.curves, self.stranded.shape_of)
        self.index = {w.id: j for j, w in enumerate(sim.workloads)}
        self.n = len(sim.workloads)
        self.submits = [w.submit_time for w in sim.workloads]
        self.order = sorted(range(self.n), key=self.submits.__getitem__)  # arrivals, in submit order
        self.arrived = 0

        self.can_preempt = cfg.preemption != "none"
        self.live = opts.fidelity == "live"
        if opts.tick_s is not None:
            self.tick = opts.tick_s
        else:
            self.tick = LIVE_TICK_S if self.live else (DEFAULT_TICK_S if self.can_preempt else 0.0)
        self.change_cycles = 0  # ``live``: cycles changes asked for since the last tick
        self.ticked = False  # the instant being settled is a tick (``live``: its first cycle looks at the whole depth)
        self.decay_every = cfg.fair_share_half_life_s / 100.0
        self.last_decay = -math.inf
        self.tick_at = math.inf

        # Carries out each cycle's result (raylane.scheduling.apply), with this replay's hooks below.
        self.resizes_at_once = not self.live  # (read by the Applier as it is made)
        self.apply = Applier(state, self, rule=LIVE if self.live else SETTLE, max_examined=opts.max_examined)
        self.events: List[Tuple[float, int, int, int]] = []
        self.ckpts: List[Tuple[float, int, int]] = []  # (due, job, attempt), kept only when preemption is on
        self.pending_gpus: Dict[float, int] = {}  # queued gang GPUs -> pending workloads of that size
        self.busy = 0.0  # GPUs held by leases
        self.nrunning = self.elastic_running = self.done = self.cycles = self.instants = 0
        self.partial = False
        self.team_gpu_s: Dict[str, float] = {t: 0.0 for t in sim.teams}
        self.requeues = {c: 0 for c in CAUSES}
        self.lost_gpu_s = {c: 0.0 for c in CAUSES}
        self.resize_overhead_gpu_s = 0.0
        # Run limits, only when a class has one (a replay without reports as it always has): requeues and work lost
        # by cause ``run_limit``, and the jobs ended by ``on_max_runtime: stop``.
        self.limits = any(w.cls.max_runtime_s is not None for w in sim.workloads)
        self.run_limit_stops = 0
        if self.limits:
            self.requeues["run_limit"] = 0
            self.lost_gpu_s["run_limit"] = 0.0
        # Sampled after every instant (see ``SimResult``), and each cycle's wall time and pending workloads.
        self.times: List[float] = []
        self.busy_s: List[float] = []
        self.queued_s: List[int] = []
        self.running_s: List[int] = []
        self.stranded_s: List[float] = []
        self.stranded_now = 0.0
        self.cycle_wall: List[float] = []
        self.cycle_pending: List[int] = []
        self._init_outages()
        self._init_fleet()

    def _init_outages(self) -> None:
        outages, nodes = self.opts.outages, self.sim.nodes
        self.outages = outages
        self.base_nodes = {nd.id: nd for nd in nodes}
        self.present_gpus = self.sim.total_gpus  # capacity of the nodes that are up
        self.node_events: List[Tuple[str, str, object]] = []  # (kind, node id, argument); heap entries index this
        self.down: Dict[str, float] = {}  # failed node -> since
        self.cordoned: Dict[str, int] = {}  # draining node -> its drain (index in ``drains``)
        self.drains: List[List] = []  # [node, start, drained at]
        self.failures: List[Tuple[str, float]] = []
        self.down_gpu_s = 0.0
        self.rngs = {}
        self.redraw: set = set()  # nodes whose drawn failure came while they were down
        self.on_node = {"fail": self._fail, "up": self._up, "drain": self._drain, "deadline": self._deadline,
                        "undrain": self._undrain}
        for f in outages.failures:
            self._push_node(f.at, "fail", f.node, (f.down_for, False))
        for d in outages.drains:
            self._push_node(d.at, "drain", d.node, d.down_for)
        if outages.mtbf_s:
            for nd in nodes:
                self.rngs[nd.id] = node_rng(self.opts.seed, nd.id)
                self._push_node(next_failure(self.rngs[nd.id], 0.0, outages.mtbf_s), "fail", nd.id,
                                (outages.repair_s, True))

    def _init_fleet(self) -> None:
        cluster = self.sim.cluster
        self.fleet: Optional[Fleet] = None
        if cluster is None or not cluster.elastic:
            return
        self.fleet = Fleet(cluster, self.opts, min(self.submits, default=0.0))
        self.where: Dict[int, Tuple[str, ...]] = {}  # running job -> its lease's nodes
        self.last_pending: tuple = ()  # the last cycle's Pending decisions at this instant
        self.requeues["reclaim"] = 0
        self.lost_gpu_s["reclaim"] = 0.0
        self.on_node.update(join=self._join, idle=self._idle_check, reclaim=self._reclaim)
        self._push_fleet(self.fleet.initial_events())

    # ------------------------------------------------------------------------------------------------ instants
    def next_instant(self) -> Optional[float]:
        """The time of the next instant (``math.inf``: nothing runs and nothing arrives); None once all is done
        (outages still to come change nothing)."""
        i, events, tick_at = self.arrived, self.events, self.tick_at
        if i >= self.n:
            if not self.nrunning and not self.state.pending_count():
                return None
            t_arr = math.inf
        else:
            t_arr = self.submits[self.order[i]]
        t_ev = events[0][0] if events else math.inf
        t = t_arr if t_arr < t_ev else t_ev
        if t == math.inf:
            return t
        return tick_at if t > tick_at else t

    def apply_instant(self, t: float) -> bool:
        """Apply the tick, the arrivals and the events at ``t``; whether anything changed."""
        changed = False
        self.ticked = t == self.tick_at
        if t == self.tick_at:
            self.tick_at = math.inf
            changed = self.state.pending_count() > 0 or (self.live and not self._quiet())
        # With a runtime model, what ends at ``t`` is known to what arrives at ``t`` (as on the live plane, where a
        # release and a submission at one instant come in that order): the arrivals come after the events.
        if self.model is None:
            changed = self._arrivals(t) or changed
        events, c = self.events, self.jobs
        while events and events[0][0] == t:
            _, kind, j, a = heappop(events)
            if kind == _NODE:
                kind, nid, arg = self.node_events[j]
                self.on_node[kind](nid, arg, t)
                changed = True
                continue
            if a != c.attempt[j] or c.finish[j] >= 0:
                continue  # an event of an attempt that was stopped since
            if kind == _FINISH:
                self._finished(j, t)
            elif kind == _LIMIT:
                self._limit(j, t)
            else:
                self._stopped(j, t)
            changed = True
        if self.model is not None:
            changed = self._arrivals(t) or changed
        return changed

    def _arrivals(self, t: float) -> bool:
        order, submits, n, i = self.order, self.submits, self.n, self.arrived
        came = i
        while i < n and submits[order[i]] == t:
            self._arrive(order[i])
            i += 1
        self.arrived = i
        return i > came

    def settle(self, t: float) -> None:
        """After a change at ``t``: cycles until quiet, drains that emptied their node, the stranded GPUs."""
        if self.fleet is not None:
            self.last_pending = ()
            self._run_cycles(t)
            self._rescale(t)
        else:
            self._run_cycles(t)
        if self.cordoned:
            self._check_drained(t)
        self.stranded_now = self.stranded.measure(self.state, self.present_gpus - self.busy)

    def sample(self, t: float) -> None:
        """Record the instant ``t``, and the next tick while work is pending."""
        self.instants += 1
        pending = self.state.pending_count()
        self.times.append(t)
        self.busy_s.append(self.busy)
        self.stranded_s.append(self.stranded_now)
        self.queued_s.append(pending)
        self.running_s.append(self.nrunning)
        if self.fleet is not None:
            self.fleet.sample()
        tick = self.tick
        # (``live``: also while a running elastic gang may grow into free GPUs, as the live plane's ticks grow it)
        if tick > 0 and (pending or (self.live and self.elastic_running)) and self.tick_at == math.inf:
            self.tick_at = (math.floor(t / tick) + 1) * tick

    # ------------------------------------------------------------------------------------------------- cycles
    def _quiet(self) -> bool:
        # A cycle can change nothing with no work pending, nor, without preemption, when the smallest pending
        # gang needs more GPUs than are free in all (an admission takes its whole gang's GPUs now).
        if self.elastic_running and self.present_gpus - self.busy > 1e-9:
            return False  # a running elastic gang may grow into the free GPUs
        if not self.state.pending_count():
            return True
        if self.can_preempt:
            return False
        smallest = min((g for g, c in self.pending_gpus.items() if c), default=0.0)
        return smallest > self.present_gpus - self.busy + 1e-9

    def _run_cycles(self, now: float) -> None:
        state, max_examined = self.state, self.opts.max_examined
        # With a fleet, a cycle runs at every change while work waits: its Pending decisions make the demand.
        fleet = self.fleet is not None
        for k in range(self.opts.max_cycles_per_instant):
            if self._quiet() and not (fleet and k == 0 and state.pending_count()):
                return
            if self.live:
                # As the control plane: a tick's first cycle is its full one; the cycles changes ask for between two
                # ticks are at most CYCLE_AGAIN_MAX, the next waits for the tick.
                if k == 0 and self.ticked:
                    self.change_cycles = 0
                elif self.change_cycles >= CYCLE_AGAIN_MAX:
                    return
                else:
                    self.change_cycles += 1
            if self.can_preempt:
                self._tell_checkpoints(now)
            if now - self.last_decay >= self.decay_every:
                state.decay(now)
                self.last_decay = now
            full = not (self.live and (k > 0 or not self.ticked))
            if not full:
                # A cycle a change asked for (the control plane's cycle-only tick) looks at the queues' heads only,
                # and stops no running lease.
                max_examined = min(self.opts.max_examined, LIVE_CHANGE_EXAMINED)
            snap = state.snapshot(limit=max_examined)
            if self.fleet is not None:  # the node types scale-up could add (flavor quotas read them)
                snap = replace(snap, growable_types=self.fleet.growable_types)
            pending_now = state.pending_count()
            c0 = time.perf_counter()
            with gc_paused():  # as the control actor runs it: no collection inside a cycle
                result = self.cycle(snap, now, max_examined=max_examined, stops=full)
            self.cycle_wall.append(time.perf_counter() - c0)
            self.cycle_pending.append(pending_now)
            self.cycles += 1
            if fleet:
                self.last_pending = result.pending
            if not self._apply(result, now):
                return
        raise SimulationError(
            f"the cycles at t={now:.0f}s did not settle after {self.opts.max_cycles_per_instant} rounds "
            f"(admissions and preemptions keep undoing each other)")

    def _apply(self, result, now: float) -> bool:
        """Carry out a cycle's decisions (``Applier``, the hooks below); whether to cycle again at this instant: the
        cycle may have left work undone (``SETTLE``: it stopped leases, resized, used its whole admission budget, or
        admitted and then ran out of workloads to examine)."""
        try:
            return self.apply.apply(result, now)
        except ValueError as e:  # a resize the state refuses
            raise SimulationError(f"at t={now:.0f}s: {e}") from None

    # The Applier's hooks: what the simulated world does around each step. ``resizes_at_once`` (set in __init__):
    # with ``trace`` fidelity a resize takes its new size at once, then no progress for the restart overhead; with
    # ``live`` it waits for its gang to yield.

    def admitted(self, adm: Admit, lease: Lease, now: float) -> None:
        self._start(adm, lease, now)

    def may_resize(self, rz: Resize, lease: Lease, now: float) -> bool:
        j, c = self.index.get(rz.workload.id), self.jobs
        if j is None or c.start_at[j] < 0 or (c.stop_req[j] >= 0 and not self.live):
            raise SimulationError(f"resize of {rz.workload.id} at t={now:.0f}s: allowed only for a running "
                                  "lease that is not stopping")
        if self.live:
            # As the control plane: not while its gang starts (it could not yield), nor until it has run its
            # grace period or checkpointed since (a stop asked earlier would likely be forced).
            every = c.ckpt_every[j] if c.ckpt_every[j] > 0 else math.inf
            return c.stop_req[j] < 0 and now >= c.live_at[j] + min(lease.workload.cls.grace_period_s, every)
        return True

    def resizing(self, rz: Resize, grown: Optional[Lease], stop, now: float) -> None:
        if stop is None:
            self._resize(rz, grown, now)
            return
        # ``live``: the gang is asked to yield; it goes on at its new size once it has (``resized``).
        if self._ask_stop(self.index[rz.workload.id], stop, now):
            self.apply.stopped(rz.workload.id, now)

    def resized(self, rz: Resize, lease: Lease, stop, now: float) -> None:
        j = self.index[rz.workload.id]
        self.jobs.stop_req[j] = -1.0
        self._resize(rz, lease, now)

    def stopping(self, stop, lease: Lease, now: float) -> bool:
        """A lease told to stop stops after the stop delay (an event), or at once."""
        return self._ask_stop(self.index[stop.workload_id], stop, now)

    def _ask_stop(self, j: int, stop, now: float) -> bool:
        c = self.jobs
        if self.live and stop.cause == "preemption":
            c.preemptions[j] += 1  # a preempted gang whose work is done before it yields ends, preempted once
        c.stop_req[j] = now
        c.stop_cause[j] = stop.cause
        delay = self.opts.stop_delay_s
        if self.live:
            if now < c.live_at[j]:
                return True  # its gang is not running yet: nothing to stop, the lease is freed at once
            left = max(0.0, stop.deadline - now)
            c.forced[j] = delay > left
            delay = min(delay, left)  # stopped by force at its deadline
        if delay > 0:
            heappush(self.events, (now + delay, _STOPPED, j, c.attempt[j]))
            return False
        return True

    def requeue_as(self, lease: Lease, stop, now: float) -> Tuple[Workload, float]:
        j, c = self.index[lease.id], self.jobs
        self._ended(j, now)
        if self.live:  # it worked until it stopped; one that yielded in time saved a checkpoint as it did
            return self._back(j, lease, now, now, c.stop_cause[j], kept_all=not c.forced[j])
        return self._back(j, lease, now, c.stop_req[j], c.stop_cause[j])

    def requeued(self, lease: Lease, w: Workload, stop, now: float, attained: float) -> None:
        c = self.jobs
        j = self.index[lease.id]
        c.w[j] = w
        self.pending_gpus[c.gpus[j]] += 1
        self.stranded.queued(c.shape[j], 1)
        c.start_at[j] = c.stop_req[j] = -1.0

    def _tell_checkpoints(self, now: float) -> None:
        """Tell the state the last checkpoint of each running lease that has taken one since the last cycle."""
        ckpts, c = self.ckpts, self.jobs
        while ckpts and ckpts[0][0] <= now:
            _, j, a = heappop(ckpts)
            if a != c.attempt[j] or c.stop_req[j] >= 0 or c.finish[j] >= 0:
                continue
            every = c.ckpt_every[j]
            base = c.start_at[j] + c.ovh[j]
            # 1e-9: (now - start) / every just short of a whole number at a checkpoint due now must count it, or
            # the same checkpoint is queued again at now forever.
            last = base + math.floor((now - base) / every + 1e-9) * every
            self.state.checkpointed(c.w[j].id, last)
            heappush(ckpts, (last + every, j, a))

    # --------------------------------------------------------------------------------------------- job events
    def _arrive(self, j: int) -> None:
        c = self.jobs
        if self.model is not None:
            # Predicted from what ended before now, and nothing else (engine's *estimate*).
            c.w[j] = replace(c.w[j], predicted=self.model.predict(self._features(j), c.w[j].runtime_estimate_s))
        self.state.enqueue(c.w[j])
        self.pending_gpus[c.gpus[j]] = self.pending_gpus.get(c.gpus[j], 0) + 1
        self.stranded.queued(c.shape[j], 1)

    def _start(self, adm: Admit, lease: Lease, now: float) -> None:
        j = self.index[adm.workload.id]
        c = self.jobs
        # The size is the lease's, as the state booked it: the gang as queued, at the size admitted.
        g = lease.workload.gang
        self.pending_gpus[c.gpus[j]] -= 1
        self.stranded.queued(c.shape[j], -1)
        c.start_at[j] = now
        c.stop_req[j] = -1.0
        if c.first_start[j] < 0:
            c.first_start[j] = now
        c.attempt[j] += 1
        if self.fleet is not None:
            self.where[j] = tuple(adm.placement)
            self.fleet.busy(adm.placement)
        # ``live``: no progress until its gang has started (the hand-over).
        handover = self.opts.handover_s if self.live else 0.0
        c.held[j], c.ovh[j] = g.total.gpu, handover
        c.live_at[j] = now + handover
        c.forced[j] = False
        c.rate[j] = c.curve[j].rate(g.workers, c.gang0[j].workers)
        heappush(self.events, (now + handover + c.remaining[j] / c.rate[j], _FINISH, j, c.attempt[j]))
        if self.can_preempt and c.ckpt_every[j] > 0:
            heappush(self.ckpts, (now + handover + c.ckpt_every[j], j, c.attempt[j]))
        if self.limits:
            c.attempt_at[j] = now
            self._push_limit(j)
        self.busy += c.held[j]
        self.nrunning += 1
        if g.elastic:
            self.elastic_running += 1

    def _resize(self, rz: Resize, grown: Lease, now: float) -> None:
        """A ``Resize`` the state took at once (``grown``: the new lease; the state checked the sizes and kept the
        gang's service so far): keep the work done, go on at the new size and placement, then no progress for the
        restart overhead (see *resize*)."""
        j, c = self.index[rz.workload.id], self.jobs
        w2 = grown.workload
        overhead = self.opts.resize_overhead_s
        run = now - c.start_at[j]
        c.remaining[j] = max(0.0, c.remaining[j] - max(0.0, run - c.ovh[j]) * c.rate[j])
        self.team_gpu_s[c.job[j].team] += c.held[j] * run
        c.w[j] = w2
        self.busy += w2.gang.total.gpu - c.held[j]
        c.held[j], c.ovh[j] = w2.gang.total.gpu, overhead
        c.rate[j] = c.curve[j].rate(rz.to_workers, c.gang0[j].workers)
        self.resize_overhead_gpu_s += overhead * c.held[j]
        c.resizes[j] += 1
        if self.fleet is not None:
            old, self.where[j] = self.where.get(j, ()), tuple(rz.placement)
            self.fleet.busy(rz.placement)
            self._push_fleet(self.fleet.maybe_idle(old, self.state.nodes, now))
        c.start_at[j] = now
        c.attempt[j] += 1  # the old finish and checkpoint events no longer hold
        heappush(self.events, (now + overhead + c.remaining[j] / c.rate[j], _FINISH, j, c.attempt[j]))
        if self.can_preempt and c.ckpt_every[j] > 0:
            heappush(self.ckpts, (now + overhead + c.ckpt_every[j], j, c.attempt[j]))
        if self.limits:
            self._push_limit(j)  # the same attempt goes on: its limit falls due as before

    def _features(self, j: int) -> RunFeatures:
        c = self.jobs
        job, g = c.job[j], c.gang0[j]
        return RunFeatures(job.team, c.w[j].cls.name, g.total.gpu, g.workers, user=job.user, name=job.name,
                           entry=job.entry)

    def _finished(self, j: int, now: float) -> None:
        c = self.jobs
        lease = self.apply.ended(c.w[j].id, now)
        if self.model is not None:
            # Its runtime: the seconds of service it had at its size, over all attempts (``raylane.runtimes``).
            gpus = c.gpus[j]
            ran = lifecycle.attained_gpu_s(lease, now) / gpus if gpus > 0 else now - lease.start_time
            self.model.observe(self._features(j), ran, c.job[j].estimate
                               if self.opts.estimates == "predicted-declared" else None)
        self._ended(j, now)
        c.remaining[j] = 0.0
        c.finish[j] = now
        c.start_at[j] = -1.0
        self.done += 1

    def _ended(self, j: int, now: float) -> None:
        """Job ``j``'s lease ended at ``now`` (the state already gave its resources back)."""
        c = self.jobs
        self.busy -= c.held[j]
        self.nrunning -= 1
        self.team_gpu_s[c.job[j].team] += c.held[j] * (now - c.start_at[j])
        if c.w[j].gang.elastic:
            self.elastic_running -= 1
        if self.limits:
            c.ran_before[j] += now - c.attempt_at[j]
        if self.fleet is not None:
            self._push_fleet(self.fleet.maybe_idle(self.where.pop(j, ()), self.state.nodes, now))

    def _stop(self, j: int, now: float, cause: str, stops: List[int]) -> None:
        """Tell job ``j``'s lease to stop; it stops after the stop delay (now: appended to ``stops``)."""
        if self.apply.stop(self.jobs.w[j].id, now, cause):
            stops.append(j)

    def _stopped(self, j: int, now: float) -> None:
        """Job ``j``'s lease, told to stop, has stopped: it ends and goes back to its queue (or, stopped for its
        class's ``on_max_runtime: stop``, ends unfinished)."""
        c = self.jobs
        if c.stop_cause[j] == _LIMIT_STOP:
            self.apply.ended(c.w[j].id, now)
            self._ended(j, now)
            c.start_at[j] = c.stop_req[j] = -1.0
            c.attempt[j] += 1
            self.run_limit_stops += 1
            self.done += 1
            return
        self.apply.stopped(c.w[j].id, now)  # requeue_as, requeued

    def _push_limit(self, j: int) -> None:
        c = self.jobs
        due = runlimit.due_at(c.w[j].cls, c.attempt_at[j], c.ran_before[j])
        if due is not None:
            heappush(self.events, (due, _LIMIT, j, c.attempt[j]))

    def _limit(self, j: int, now: float) -> None:
        """Job ``j``'s attempt reached its class's ``max_runtime``: it is told to stop, to be requeued (cause
        ``run_limit``) or ended. One stopping already (a preemption, a drain) is left to that stop."""
        c = self.jobs
        w = c.w[j]
        hit = runlimit.reached(w.id, w.cls, now, c.attempt_at[j], c.ran_before[j])
        if c.stop_req[j] >= 0 or hit is None:
            return
        stops: List[int] = []
        self._stop(j, now, "run_limit" if hit.requeues else _LIMIT_STOP, stops)
        for k in stops:
            self._stopped(k, now)

    def _back(self, j: int, lease: Lease, now: float, until: float, cause: str,
              kept_all: bool = False) -> Tuple[Workload, float]:
        """What goes back to the queue for job ``j``, whose lease (ended at ``now``) did its work until ``until`` (a
        stop's request, or a failure), keeping the work up to its last checkpoint (the checkpoints of a resized lease
        count from the end of its restart overhead); and until when its service counts."""
        c = self.jobs
        every = c.ckpt_every[j]
        prog = max(0.0, until - c.start_at[j] - c.ovh[j])  # seconds of progress, at ``c.rate[j]``
        # 1e-9: a run that ends on a checkpoint keeps it, though float sums of the times fall just short.
        kept = math.floor(prog / every + 1e-9) * every if every > 0 else 0.0
        if kept_all and every > 0:
            kept = prog  # a checkpoint saved as it stopped
        kept = min(max(kept, 0.0), c.remaining[j] / c.rate[j], prog)
        c.lost[j] += prog - kept
        self.lost_gpu_s[cause] += (prog - kept) * c.held[j]
        self.requeues[cause] += 1
        c.remaining[j] -= kept * c.rate[j]
        if cause == "preemption" and not self.live:  # (``live``: counted when asked, as the control plane does)
            c.preemptions[j] += 1
        c.attempt[j] += 1
        w = lease.workload
        if w.gang is not c.gang0[j]:
            w = replace(w, gang=c.gang0[j])  # back in its queue at its requested size
        if w.runtime_estimate_s is not None:
            # The lost work must be done again: the runtime still needed is the estimate plus what was lost, so
            # that estimate minus service received stays the remaining time.
            w = replace(w, runtime_estimate_s=w.runtime_estimate_s + prog - kept)
        # Its service counts until it stopped working (a stop's request), lost work included (see *service*).
        return w, until

    # -------------------------------------------------------------------------------------------- node events
    def _push_node(self, at: float, kind: str, nid: str, arg: object = None) -> None:
        self.node_events.append((kind, nid, arg))
        heappush(self.events, (at, _NODE, len(self.node_events) - 1, 0))

    def _fail(self, nid: str, arg, now: float) -> None:
        down_for, drawn = arg
        if nid in self.down:
            if drawn:
                self.redraw.add(nid)  # draw its next failure once it is back
            return  # already down: this failure changes nothing
        if self.fleet is not None and nid not in self.state.nodes:
            return  # an autoscaled node that was removed or reclaimed: there is nothing to fail
        c = self.jobs
        for lease in self.apply.lose_node(nid, now):
            j = self.index[lease.id]
            self._ended(j, now)
            self.apply.requeue(lease, None, now,
                               self._back(j, lease, now, c.stop_req[j] if c.stop_req[j] >= 0 else now, "failure"))
        self.down[nid] = now
        self.present_gpus -= self.base_nodes[nid].capacity.gpu
        self.failures.append((nid, now))
        if down_for is not None:
            self._push_node(now + down_for, "up", nid, drawn)

    def _up(self, nid: str, drawn, now: float) -> None:
        base = self.base_nodes[nid]
        cap = base.capacity.gpu
        self.down_gpu_s += cap * (now - self.down.pop(nid))
        self.state.add_node(replace(base, free=base.capacity, schedulable=nid not in self.cordoned))
        self.present_gpus += cap
        mtbf = self.outages.mtbf_s
        if (drawn or nid in self.redraw) and mtbf:
            self.redraw.discard(nid)
            self._push_node(next_failure(self.rngs[nid], now, mtbf), "fail", nid, (self.outages.repair_s, True))

    def _drain(self, nid: str, drain_for, now: float) -> None:
        if nid in self.cordoned:
            return  # already draining
        d = self.cordoned[nid] = len(self.drains)
        self.drains.append([nid, now, None])
        if nid in self.state.nodes:
            self.state.set_schedulable(nid, False)
        deadline = self.outages.drain_deadline_s
        if deadline == 0:
            self._evict(nid, now)
        elif deadline is not None:
            self._push_node(now + deadline, "deadline", nid, d)
        if drain_for is not None:
            self._push_node(now + drain_for, "undrain", nid, d)

    def _deadline(self, nid: str, d: int, now: float) -> None:
        if self.cordoned.get(nid) == d and self.drains[d][2] is None:
            self._evict(nid, now)

    def _undrain(self, nid: str, d: int, now: float) -> None:
        if self.cordoned.get(nid) == d:
            del self.cordoned[nid]
            if nid in self.state.nodes:
                self.state.set_schedulable(nid, True)

    def _evict(self, nid: str, now: float) -> None:
        """Stop every running lease on node ``nid`` (a drain)."""
        stops: List[int] = []
        for lease in list(self.state.leases.values()):
            if nid in lease.placement and lease.state is LeaseState.RUNNING:
                self._stop(self.index[lease.id], now, "drain", stops)
        for j in stops:
            self._stopped(j, now)

    # ---------------------------------------------------------------------------------------- autoscaled nodes
    def _push_fleet(self, events) -> None:
        for at, kind, nid, arg in events:
            self._push_node(at, kind, nid, arg)

    def _rescale(self, now: float) -> None:
        """The demand of the last cycle's pending gangs: launch the nodes it needs (they join after their group's
        start-up), cancel the starting ones it no longer needs (their join events are then stale)."""
        st = self.state
        launch, _ = self.fleet.rescale(now, self.last_pending, st.nodes,
                                       flavor_rooms(st.teams, st.usage, st.leases.values(), st.nodes.values()))
        for at, nid in launch:
            self._push_node(at, "join", nid)

    def _join(self, nid: str, _arg, now: float) -> None:
        got = self.fleet.join(nid, now)
        if got is None:
            return  # cancelled while it was starting
        node, events = got
        self.state.add_node(node)
        self.present_gpus += node.capacity.gpu
        self._push_fleet(events)

    def _idle_check(self, nid: str, since, now: float) -> None:
        verdict = self.fleet.idle_check(nid, since, self.state.nodes)
        if verdict == REMOVE:
            gpus = self.state.nodes[nid].capacity.gpu
            self.apply.lose_node(nid, now)  # empty: no lease ends
            self.present_gpus -= gpus
            self.fleet.gone(nid, now)
        elif verdict == REARM:
            self._push_node(now + self.opts.idle_timeout_s, "idle", nid, since)

    def _reclaim(self, nid: str, _arg, now: float) -> None:
        """A spot node is taken back: its leases end and are requeued as a failure's are; the node is gone."""
        if not self.fleet.is_joined(nid) or nid not in self.state.nodes:
            return
        gpus = self.state.nodes[nid].capacity.gpu
        c = self.jobs
        for lease in self.apply.lose_node(nid, now):
            j = self.index[lease.id]
            self._ended(j, now)
            self.apply.requeue(lease, None, now,
                               self._back(j, lease, now, c.stop_req[j] if c.stop_req[j] >= 0 else now, "reclaim"))
        self.present_gpus -= gpus
        self.fleet.gone(nid, now, reclaimed=True)

    def _check_drained(self, now: float) -> None:
        for nid, d in self.cordoned.items():
            if self.drains[d][2] is None:
                nd = self.state.nodes.get(nid)
                if nd is None or _empty(nd):
                    self.drains[d][2] = now

    # ------------------------------------------------------------------------------------------------- result
    def result(self, t: float, wall_s: float) -> SimResult:
        """What the replay leaves behind, stopped at ``t``: leases still running and nodes still down are counted
        to ``t``."""
        c = self.jobs
        for j in range(self.n):  # leases still running when the replay stopped
            if c.start_at[j] >= 0:
                self.team_gpu_s[c.job[j].team] += c.held[j] * (t - c.start_at[j])
        for nid, since in self.down.items():  # nodes still down
            self.down_gpu_s += self.base_nodes[nid].capacity.gpu * max(0.0, t - since)
        sim = self.sim
        return SimResult(
            jobs=sim.jobs, config=sim.config, options=self.opts, teams=dict(self.state.teams),
            total_gpus=sim.total_gpus, first_start=c.first_start, finish=c.finish,
            preemptions=c.preemptions, lost_work=c.lost, team_gpu_s=self.team_gpu_s,
            times=self.times, busy=self.busy_s, queued=self.queued_s, running=self.running_s,
            rejected=list(sim.rejected), cycles=self.cycles, instants=self.instants, wall_s=wall_s,
            partial=self.partial, cycle_wall=self.cycle_wall, cycle_pending=self.cycle_pending, end_time=t,
            cluster_name=sim.cluster_name, trace_source=sim.trace.source, tick_s=self.tick,
            stranded=self.stranded_s, requeues=self.requeues, lost_gpu_s=self.lost_gpu_s, failures=self.failures,
            drains=[tuple(d) for d in self.drains], down_gpu_s=self.down_gpu_s,
            resizes=c.resizes, resize_overhead_gpu_s=self.resize_overhead_gpu_s,
            capacity=self.fleet.close(t) if self.fleet is not None else None,
            run_limit_stops=self.run_limit_stops if self.limits else None,
        )


def _empty(node: Node) -> bool:
    f, c = node.free, node.capacity
    return f.gpu >= c.gpu - 1e-9 and f.cpu >= c.cpu - 1e-9 and f.memory >= c.memory - 1e-9
