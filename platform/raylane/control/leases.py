"""Leases in the control plane: admission into a reservation, preemption, resize, grace deadlines and release (a role
of ``raylane.control.state.ControlState``).

``apply`` carries out what one scheduling cycle decided through ``raylane.scheduling.apply.Applier`` (the one place
every driver of the core carries out a cycle: its order, stops, deadlines, resizes, requeues and the LIVE
cycle-again rule), this role being the Applier's driver: its hooks journal each step and emit its effects. The
other methods carry a lease through its life: admitted (journaled, booked in the ``ClusterState``, its
reservation asked for), placed (``reservation_ready``) or rolled back and requeued (``reservation_failed``), asked
to save a checkpoint and stop within its class's grace period (a preemption, or a resize whose gang restarts at the
new size: ``finish_resize``), stopped by force once that deadline has passed (``enforce_deadlines``), released back
to the queue at its original place (``release_lease``) or cancelled.

It owns which reservations are asked for and which are placed, the worker handles each gang registered, the gangs
handed over to Ray Train and not heard from since, and the class of each victim's preemptor. It is handed the
records, the ``ClusterState`` and the policy (through getters: a policy reload replaces both), the clock, the host
(Ray's placement groups, read only for a reservation made before a restart), ``append`` (journal an entry and apply
it to its record), ``emit`` (an effect), ``poke`` (cycle again soon) and the run limits (``state_limits.RunLimits``:
an admission is indexed there, and a gang that stopped for its limit ends as its class says).

Words: a *reservation* is the placement group named ``raylane-<workload id>.<n>`` (``pg_name_for``) that holds an
admitted gang's capacity in Ray until its driver hands it over to Ray Train (``running``).
"""
from __future__ import annotations

from typing import Any, Callable, Dict, Optional

from raylane import metrics
from raylane.control import effects as fx
from raylane.control.journal import Kind
from raylane.control.records import Record, State
from raylane.control.state_nodes import GiB
from raylane.scheduling import Admit, RAY_STRATEGY
from raylane.scheduling.apply import LIVE, Applier, Stop
from raylane.scheduling.types import SPOT_LABEL, Lease, Resize, Resources, Workload

# A workload's reservation (Ray placement group) is named after it and the lease it holds: PG_PREFIX + its id + "." +
# the number of its admissions and resizes so far (``pg_name_for``). A name is never used twice: what Ray says late of
# an earlier reservation (made, placed, failed) can never be taken for the current one's, and a group left behind
# cannot block the next one by its name.
PG_PREFIX = "raylane-"


def pg_name_for(rec: Record) -> str:
    """The name of the next reservation of ``rec`` (before its ADMITTED or RESIZED entry is applied)."""
    return f"{PG_PREFIX}{rec.id}.{rec.attempts + rec.resizes + 1}"


def pg_workload(name: str) -> Optional[str]:
    """The workload id in a reservation's name (None for a group of another kind, such as a one-shot run's); the
    unnumbered names of older versions too."""
    if not name.startswith(PG_PREFIX):
        return None
    rest = name[len(PG_PREFIX):]
    wid, dot, n = rest.rpartition(".")
    return wid if dot and n.isdigit() else rest


def bundle_for(per_worker: Resources) -> Dict[str, float]:
    b = {"CPU": per_worker.cpu, "GPU": per_worker.gpu, "memory": int(per_worker.memory * GiB)}
    b = {k: v for k, v in b.items() if v}
    return b or {"CPU": 0.001}


class Leases:
    """The leases' life in the control plane (module docstring). ``state`` and ``policy``: getters of the
    ``ClusterState`` and the policy now; ``limits``: the run limits (``track``, ``end_run_limited``)."""

    def __init__(self, *, records, state: Callable[[], Any], policy: Callable[[], Any], clock: Callable[[], float],
                 host, append: Callable[..., Any], emit: Callable[[fx.Effect], None], poke: Callable[[], None],
                 limits):
        self.records = records
        self._state, self._policy = state, policy
        self.clock, self.host = clock, host
        self._append, self._emit, self._poke = append, emit, poke
        self.limits = limits
        # Workloads whose current admission's reservation the actor saw placed (``reservation_ready``), so that
        # readiness needs no call to Ray; cleared by each new admission.
        self._confirmed: set = set()
        # Workloads with a reservation asked for in this run and not yet reported placed or failed: the actor reports
        # it (``reservation_ready``), so readiness does not read Ray's table of every group meanwhile (``ready``).
        self._reserving: set = set()
        self._workers: Dict[str, list] = {}  # wid -> the actor handles its gang registered (``register_workers``)
        # Gangs handed over to Ray Train and not heard from since (no stop poll or checkpoint yet): wid -> the time
        # of the hand-over. A resize waits until the gang is heard, so that it can yield (``resize``).
        self._starting: Dict[str, float] = {}
        self._preemptor_cls: Dict[str, str] = {}  # victim id -> its preemptor's class (the preemptions metric)
        self._ap: Optional[Applier] = None  # the Applier of the ClusterState now (``applier``)
        # What the release under way journals (``release_lease``, ``finish_resize``, ``_rollback``): read by the
        # Applier's hooks ``requeued`` and ``resized``.
        self._release: Dict[str, Any] = {}

    @property
    def state(self):
        """The ``ClusterState`` now (a policy reload makes a new one)."""
        return self._state()

    @property
    def policy(self):
        return self._policy()

    @property
    def applier(self) -> Applier:
        """The Applier of the ``ClusterState`` now; made anew for a new state (a restart, a policy reload), its book
        of stops read from the records (a gang asked to stop, with its deadline; a resize, with its new size)."""
        st = self.state
        if self._ap is None or self._ap.state is not st:
            ap = self._ap = Applier(st, self, rule=LIVE)
            for wid, lease in st.leases.items():
                rec = self.records.get(wid)
                if rec is None or not rec.state.stopping or rec.stop_deadline is None:
                    continue
                rz = None
                if rec.state is State.RESIZING and rec.resize:
                    r = rec.resize
                    rz = Resize(lease.workload, r["from_workers"], r["to_workers"], tuple(r["placement"]),
                                tuple(tuple(d) for d in r["devices"]), r.get("reason", ""))
                ap.stops[wid] = Stop(wid, rec.stop_deadline, rec.stop_deadline,
                                     cause="resize" if rz is not None else "preemption", resize=rz)
        return self._ap

    # ------------------------------------------------------------------------------------- a cycle's result
    def apply(self, result, now: float) -> bool:
        """Carry out a cycle's decisions (``Applier.apply``): its admissions reserved, its resizes begun, its
        victims asked to stop (those not started yet released at once). Whether to cycle again at once."""
        return self.applier.apply(result, now)

    # The Applier's hooks.
    resizes_at_once = False  # a resize waits for its gang to yield

    def admitted(self, a: Admit, lease: Lease, now: float) -> None:
        self.admit(a, now)

    def may_resize(self, rz: Resize, lease: Lease, now: float) -> bool:
        rec = self.records.get(rz.workload.id)
        if rec is None or rec.state is not State.RUNNING:
            # Not started yet (its driver is handing the reservation over to Ray Train) or stopping already: the
            # core decides again on the next cycle, from the books as they are then.
            return False
        grace = self.policy.workload_class(rec.cls).grace_period_s
        handed = self._starting.get(rec.id)
        # Ray Train is still starting its workers: the loop hears a stop only once it runs (at its checkpoints), so
        # a resize asked now would likely run out its grace period and be forced. The core decides again next
        # cycle; once the gang is heard from, or a grace period after the hand-over, it goes ahead.
        return handed is None or now - handed >= grace

    def resizing(self, rz: Resize, grown: Optional[Lease], stop: Optional[Stop], now: float) -> None:
        rec = self.records[rz.workload.id]
        attained = grown.workload.attained_gpu_s if grown is not None else rec.attained_gpu_s
        self._append(Kind.RESIZING, rec, from_workers=rz.from_workers, to_workers=rz.to_workers,
                     placement=list(rz.placement), devices=[list(d) for d in rz.devices], reason=rz.reason,
                     deadline=stop.deadline, attained_gpu_s=attained, note=f"resizing: {rz.reason}")
        metrics.RESIZES.inc(team=rec.team, workload_class=rec.cls,
                            direction="grow" if rz.to_workers > rz.from_workers else "shrink")

    def stopping(self, stop: Stop, lease: Lease, now: float) -> bool:
        rec = self.records[stop.workload_id]
        started = rec.state in (State.RUNNING, State.RESIZING)
        self._preemptor_cls[rec.id] = stop.preemptor.cls.name if stop.preemptor is not None else stop.cause
        self._append(Kind.PREEMPTING, rec, deadline=stop.deadline, reason=stop.reason,
                     note=f"preempted: {stop.reason}")
        if not started:
            # Nothing runs on the reservation yet: there is nothing to checkpoint, release at once.
            self._release = {"outcome": "preempted before start"}
        return not started

    def requeued(self, lease: Lease, w: Workload, stop: Optional[Stop], now: float, attained: float) -> None:
        rec = self.records[lease.id]
        how, self._release = self._release, {}
        if "rollback" in how:
            self._append(Kind.REQUEUED, rec, attained_gpu_s=rec.attained_gpu_s,
                         note=f"admission rolled back: {how['rollback']}")
            return
        outcome, step = how.get("outcome", "stopped"), how.get("step")
        metrics.PREEMPTIONS.inc(team=rec.team, workload_class=rec.cls,
                                preemptor_class=self._preemptor_cls.pop(rec.id, ""),
                                outcome="forced" if "by force" in outcome else "graceful")
        self.remove_pg(rec)
        self._append(Kind.REQUEUED, rec, attained_gpu_s=attained, step=step if step is not None else rec.step,
                     note=f"back in the queue ({outcome})")
        self._poke()

    def resized(self, rz: Resize, lease: Lease, stop: Stop, now: float) -> None:
        rec = self.records[lease.id]
        how, self._release = self._release, {}
        step = how.get("step")
        r = rec.resize
        self._confirmed.discard(rec.id)
        self.remove_pg(rec)
        self._append(Kind.RESIZED, rec, from_workers=r["from_workers"], to_workers=r["to_workers"],
                     placement=list(r["placement"]), devices=r["devices"], pg_name=pg_name_for(rec),
                     attained_gpu_s=lease.workload.attained_gpu_s, step=step if step is not None else rec.step,
                     note=f"resized from {r['from_workers']} to {r['to_workers']} workers ({how.get('how', '')}); "
                          f"restarts from its checkpoint on {', '.join(n[:8] for n in r['placement'])}")
        self._reserve(rec, lease.workload, rec.placement)
        self._poke()

    # ------------------------------------------------------------------------------- admission, reservation
    def admit(self, a: Admit, now: float) -> None:
        """Journal an admission the Applier booked in the state, and ask for its reservation."""
        rec = self.records[a.workload.id]
        pg_name = pg_name_for(rec)
        self._confirmed.discard(rec.id)
        # Journal first, then act; roll back if the reservation cannot be made.
        choice = self._flavor_choice(a)
        self._append(Kind.ADMITTED, rec, placement=list(a.placement), pg_name=pg_name, borrowing=a.borrowing,
                     devices=[list(d) for d in a.devices], **(choice or {}),
                     note=f"admitted on {', '.join(n[:8] for n in a.placement)}"
                          + (" (borrowing)" if a.borrowing else "") + (f": {choice['why']}" if choice else ""))
        self.limits.track(rec)  # when its class's max_runtime falls due (state_limits)
        w = a.workload
        metrics.ADMISSIONS.inc(team=w.team, workload_class=w.cls.name, borrowing=str(a.borrowing).lower())
        metrics.QUEUE_WAIT.observe(max(0.0, now - (rec.queued_since or rec.submit_time)), team=w.team,
                                   workload_class=w.cls.name)
        self._reserve(rec, w, a.placement)

    def _flavor_choice(self, a: Admit) -> Optional[Dict[str, Any]]:
        """For a gang that names node types or whose class prefers or avoids spot nodes: the node type and the kind
        of node (spot or on-demand) it was admitted on, and why, as the admission journals it; None otherwise."""
        g = a.workload.gang
        if not g.node_types and g.spot == "allow":
            return None
        nodes = [self.state.nodes.get(nid) for nid in a.placement]
        ntype = nodes[0].node_type if nodes and nodes[0] is not None else ""
        spot = bool(nodes) and all(n is not None and n.labels.get(SPOT_LABEL) == "true" for n in nodes)
        kind = "spot" if spot else "on-demand"
        if g.node_types:
            rank = g.node_types.index(ntype) if ntype in g.node_types else 0
            why = f"on {kind} {ntype} nodes, {'its first choice' if rank == 0 else f'choice {rank + 1}'} of " \
                  f"{', '.join(g.node_types)}" + (f" (no room on {', '.join(g.node_types[:rank])} now)" if rank else "")
        else:
            why = f"on {kind} nodes (its class's spot: {g.spot})"
        return {"node_type": ntype, "spot": spot, "why": why}

    def _reserve(self, rec: Record, w, placement) -> None:
        """Hold the lease's capacity in Ray: a detached placement group, one bundle per worker pinned to its node,
        until the driver hands it over to Ray Train (``running``); rolled back if it cannot be placed
        (``reservation_failed``)."""
        self._reserving.add(rec.id)
        self._emit(fx.Reserve(rec.id, rec.pg_name, bundle_for(w.gang.per_worker),
                              RAY_STRATEGY.get(w.gang.strategy, "PACK"), tuple(placement)))

    def reservation_ready(self, wid: str, pg_name: str) -> None:
        """Event: the reservation ``pg_name`` of ``wid`` is placed."""
        rec = self.records.get(wid)
        if rec is None or rec.pg_name != pg_name:
            return
        self._reserving.discard(wid)
        self._confirmed.add(wid)
        self._emit(fx.Wake(wid))

    def reservation_failed(self, wid: str, pg_name: str, why: str) -> None:
        """Event: the reservation ``pg_name`` could not be made or placed (the actor removed what it made)."""
        rec = self.records.get(wid)
        if rec is not None and rec.pg_name == pg_name:
            self._reserving.discard(wid)
            self._rollback(rec, why)

    def _rollback(self, rec: Record, why: str) -> None:
        if rec.id in self.state.leases:
            now = self.clock()
            lease = self.applier.ended(rec.id, now)
            self._release = {"rollback": why}
            # back with the service it had when admitted (none of this lease's)
            self.applier.requeue(lease, None, now, (lease.workload, lease.start_time))
        self._poke()

    def ready(self, rec: Record) -> bool:
        """Whether the workload's reservation is placed, not only decided. A lease freed by a forced stop is admitted
        to the preemptor at once, while the stopped gang's own placement group holds the GPUs until Ray Train tears
        it down; a driver that started then would hand over (remove) a reservation never placed, and the admission
        would be rolled back under its running gang. Ray's table of groups (every group, a round trip) is read only
        for a reservation made before a restart: one asked for in this run is reported (``reservation_ready``), and
        its drivers ask again and again while they wait."""
        if rec.pg_name is None:
            return False
        if rec.state is State.RUNNING:
            return True
        if rec.state is not State.ADMITTED or rec.id in self._reserving:
            return False
        return rec.id in self._confirmed or self.host.placement_groups().get(rec.pg_name) == "CREATED"

    # ------------------------------------------------------------------------------------- the gang's side
    def register_workers(self, wid: str, handles) -> None:
        """The actors of a running gang, so that a stop past its grace period can kill them (``kill_gang``)."""
        self._workers[wid] = list(handles)

    def handed_over(self, wid: str, now: float) -> None:
        """Its driver handed the reservation over to Ray Train (``running``): not heard from yet."""
        self._starting[wid] = now

    def heard(self, wid: str) -> None:
        """Its gang's loop runs (a stop poll or a checkpoint): it hears a stop at its next checkpoint."""
        self._starting.pop(wid, None)

    def forget_preemptor(self, wid: str) -> None:
        """Its lease ended otherwise than by the preemption it was asked to stop for (its node was lost)."""
        self._preemptor_cls.pop(wid, None)

    # -------------------------------------------------------------------------------- preemption, resize
    def preempt(self, wid: str, reason: str, now: float, preemptor_class: str = "") -> None:
        """Ask ``wid``'s gang to stop (a drain, a node out of service): as a cycle's victim is (``Applier.stop``);
        one not started yet is released at once."""
        rec = self.records[wid]
        if rec.state is State.PREEMPTING or wid not in self.state.leases:
            return
        ap = self.applier
        if ap.stop(wid, now, preemptor_class or "preemption", reason=reason):
            ap.stopped(wid, now)

    def finish_resize(self, rec: Record, now: float, how: str, step: Optional[int] = None) -> None:
        """The gang stopped for its resize (``Applier.stopped``): the lease goes on at the new size on the nodes the
        core chose (a new reservation, handed over to Ray Train as at an admission: ``resized``); the driver
        restarts the gang from its checkpoint."""
        if rec.id not in self.state.leases:
            raise KeyError(rec.id)  # fails loudly if the lease is gone
        self._release = {"how": how, "step": step}
        self.applier.stopped(rec.id, now)

    # ------------------------------------------------------------------------------- deadlines, release
    def enforce_deadlines(self, now: float) -> None:
        """Gangs asked to stop whose grace period is over are stopped by force. Only a lease can be stopping, so
        this looks at the leases, not at every record the journal ever held."""
        for wid in list(self.state.leases):
            rec = self.records.get(wid)
            if rec is not None and rec.state.stopping and rec.stop_deadline is not None and now >= rec.stop_deadline:
                self.kill_gang(rec)
                if rec.state is State.RESIZING:
                    self.finish_resize(rec, now, how="stopped by force after the grace period")
                else:
                    self.release_lease(rec, now, outcome="stopped by force after the grace period")

    def kill_gang(self, rec: Record) -> None:
        """Kill the gang's registered workers and remove its reservation."""
        handles = self._workers.pop(rec.id, [])
        if handles:
            self._emit(fx.KillWorkers(rec.id, tuple(handles)))
        self.remove_pg(rec)

    def release_lease(self, rec: Record, now: float, outcome: str, step: Optional[int] = None) -> None:
        """A preempted lease is over: free it and put the workload back at its original place."""
        if rec.id not in self.state.leases:
            return
        if self.limits.end_run_limited(rec, now, outcome, step):  # it stopped for its run limit, not a preemption
            self.applier.stops.pop(rec.id, None)
            return
        self._release = {"outcome": outcome, "step": step}
        self.applier.stopped(rec.id, now)  # ends, requeues (``requeued``)

    def cancel(self, rec: Record, by: str, note: str, job_stop_at: Optional[float] = None) -> None:
        """Out of the queue or off its lease, journaled as cancelled, its gang stopped, its waiters woken.
        ``job_stop_at``: when its Ray job is stopped if its driver has not exited by then."""
        if self.state.is_pending(rec.id):
            self.state.dequeue(rec.id)
        elif rec.id in self.state.leases:
            self.applier.ended(rec.id, self.clock())
            self.remove_pg(rec)
        self._append(Kind.CANCELLED, rec, by=by, note=note, job_stop_at=job_stop_at, close_run=True)
        self.kill_gang(rec)
        self._emit(fx.Wake(rec.id))

    def remove_pg(self, rec: Record) -> None:
        """Remove the lease's reservation (once what ended it is committed, as every effect)."""
        if rec.pg_name:
            self._emit(fx.RemoveReservation(rec.pg_name))
