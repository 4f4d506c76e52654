"""The control plane as a Ray-free state machine: ``ControlState``, the composition root of its roles.

It holds the books (the journal, where every change is appended before it is acted on; the workload records; the
``ClusterState`` that the pure scheduling cycle reads; the node book; the pipeline book; the gate, with tokens and
audit; the runtime book) and the roles that keep them, one object each, every one handed only the books and the
callables it needs:

- ``leases.Leases``: admission into a reservation, preemption, resize, grace deadlines, release, cancel;
- ``state_nodes.NodeService``: Ray's node table, node events, drains, probes, the node calls;
- ``state_jobs.JobWatch``: Ray's jobs that ended without a word, and what an end left to do;
- ``state_pins.Pins``: workloads held for a checkpoint or their pipeline inputs, pinned checkpoints;
- ``state_pipelines.Pipelines``: the pipeline calls, stage gates, the pipelines' service and re-plans;
- ``state_scale.ScaleUp``: the nodes asked of Ray's autoscaler for waiting gangs;
- ``state_limits.RunLimits``: a class's ``max_runtime``;
- ``state_reasons.Reasons``: each pending workload's position and reason after a cycle;
- ``state_etas.QueueEtas``, ``state_costs.Costs``, ``state_gauges.Gauges``: ETAs, cost, gauges;
- ``state_requests.Requests`` (``check``, ``handle`` and the workload calls), ``state_views.Views`` (read calls),
  ``state_admin.Admin`` (callers, teams, tokens, audit, policy reload).

This module builds and wires them, replays the journal at the start (``_recover``), runs the tick (``tick``: the roles
in order, around one scheduling cycle) and keeps the public face the actor and the tests use. It imports no Ray and
reads no clock of its own: time comes from the injected ``clock``, and what it knows of the world from a ``Host``:

- **Events in.** A call (``handle(principal, request)``, after ``check``), a tick (``tick(full)``), a reservation
  placed or failed (``reservation_ready`` / ``reservation_failed``), probe verdicts (``probed``), an MLflow run
  closed (``run_closed``), a checkpoint's pinned copy made (``pin_copied``). Reads of the world go through the host:
  Ray's node table and drain notices, the job table, the placement groups that exist (at recovery and for readiness).
- **Effects out.** What Ray must do, in order, after the journal entries that decided it are committed: reserve or
  remove a placement group, kill a gang's workers, stop a job, close a run, run the health probes, wake a driver that
  waits for its admission, copy or remove a pinned checkpoint (``raylane.control.effects``). ``take_effects()`` hands
  them over; ``wants_cycle`` says a change wants a scheduling cycle soon.

The detached control actor (``raylane.control.actor``) is a thin shell around it: its loop, ``request()`` dispatch,
the Ray host, and carrying out effects. Tests drive it with a fake clock and a fake host, without Ray
(``tests/controltest.py``); replaying the journal at start goes through the same records and books as live operation.

Words: *reservation* is the placement group named ``raylane-<workload id>.<n>`` (``leases.pg_name_for``); *release* is
a workload telling the control plane it has stopped (done, failed, or yielded after a preemption); *owner* the
authenticated user that submitted it.
"""
from __future__ import annotations

from dataclasses import replace
import logging
from time import perf_counter
from typing import Any, Callable, Dict, List, Optional

from raylane import metrics
from raylane.config.loader import load_policy_from_dict, load_spec_from_dict
from raylane.auth import Principal
from raylane.control import api
from raylane.control.archive import Compactor, Records, load_nodes, load_runtimes, relearn
from raylane.control import effects as fx
from raylane.control import ends
from raylane.control.gate import Gate
from raylane.control.host import Host
from raylane.control.journal import Journal, Kind
from raylane.control.learned import RuntimeBook
from raylane.control.leases import Leases, bundle_for, pg_workload
from raylane.control.nodes import HealthRules, NodeBook
from raylane.control.pipelines import PipelineBook
from raylane.control.records import Record, State
from raylane.control.state_admin import Admin
from raylane.control.state_costs import Costs
from raylane.control.state_etas import QueueEtas
from raylane.control.state_gauges import Gauges
from raylane.control.state_jobs import JOB_WATCH_S, JobWatch
from raylane.control.state_limits import RunLimits
from raylane.control.state_nodes import GiB, NodeService
from raylane.control.state_pins import Pins
from raylane.control.state_pipelines import Pipelines
from raylane.control.state_reasons import Reasons
from raylane.control.state_requests import Requests
from raylane.control.state_scale import ScaleUp
from raylane.control.state_views import Views
from raylane.scheduling import Admit, ClusterState, cycle, lifecycle
from raylane.scheduling.apply import CYCLE_AGAIN_MAX
from raylane.scheduling.cycle import MAX_EXAMINED
from raylane.scheduling.gcpace import gc_paused

# Also here for the modules that import them from here (launchers, tests): GiB, bundle_for, Host, JOB_WATCH_S.
__all__ = ["ControlState", "Host", "GiB", "bundle_for", "JOB_WATCH_S", "CHANGE_EXAMINED", "SLOW_TICK_S"]

log = logging.getLogger("raylane.control")

# A tick that takes longer is logged with the time each of its parts took (ControlState.tick).
SLOW_TICK_S = 0.25
# Pending workloads a cycle between full ticks looks at, at most (a full tick: the core's MAX_EXAMINED). Such a cycle
# runs on a change, a release or a submission, often one per release: what a change lets in is at the head of the
# queue, while a cycle's cost grows with what it examines (with a full cluster, every workload past the admitted ones
# is tried and fails). What lies further waits for the next full tick, which also refreshes every reason shown.
# Such a cycle stops no running lease (``cycle``'s ``stops``): a preemption, which loses work, is decided by a full
# tick, on the whole queue, so that a window of it never stops what the full view would keep (and the full tick
# then lets the victim back in: a stop for nothing).
# Read when a ``ControlState`` is made (a submission asks for a cycle only if it lands within it) and on each tick.
CHANGE_EXAMINED = 64


def health_rules(policy) -> HealthRules:
    h = policy.health
    return HealthRules(h.probe_failures, h.gang_failures, h.gang_failure_window)


class ControlState:
    """The control plane's state machine: its books, its roles and the tick that runs them (module docstring)."""

    def __init__(self, policy: Dict[str, Any], journal: Journal, host: Optional[Host] = None,
                 clock: Callable[[], float] = None, tick_s: float = 1.0, auth: Optional[Dict[str, Any]] = None,
                 cancel_grace_s: float = ends.CANCEL_GRACE_S, cluster: Optional[Dict[str, Any]] = None):
        """``journal``: opened by the caller (the actor opens it batched: one commit per turn of its loop).
        ``clock``: seconds since the epoch (``time.time`` live, a fake one in tests). ``auth``: ``{"enabled": bool,
        "bootstrap": {"user", "id", "salt", "digest"}}``, the first operator token (its digest only;
        ``raylane.control.client.start_control`` keeps the token). Default: enabled, and no token but those already
        journaled. ``cluster``: the cluster file (its growable node groups: ``state_scale``). The journal is replayed
        here; what recovery decided is journaled but not committed (``take_effects`` then commit, as after any
        event)."""
        auth = auth or {}
        if clock is None:
            import time

            clock = time.time
        self.clock = clock
        self.host = host or Host()
        self.policy = load_policy_from_dict(policy, "control policy")
        self.tick_s = tick_s
        self.cancel_grace_s = cancel_grace_s
        self.journal = journal
        journal.clock = clock  # entries are timed by the same clock as the decisions
        self.effects: List[fx.Effect] = []  # what Ray must do, in order (take_effects)
        self.wants_cycle = False  # a change wants a scheduling cycle (take_effects clears it)
        self._change_cycles = 0  # cycles a change asked for since the last full tick (``_poke``)
        self.cycles = 0

        # ---- the books
        self.gate = Gate(self.journal, enabled=auth.get("enabled", True), teams=self.policy.teams.keys(),
                         clock=clock)
        # The live records; an archived one is read back by id (raylane.control.archive).
        self.records: Dict[str, Record] = Records(journal)
        self.nodes = NodeBook(health_rules(self.policy))
        self.pipes = PipelineBook()
        self.state = ClusterState([], self.policy.core_teams(), self.policy.to_scheduler_config())
        # Runtimes learned from every workload that ended (raylane.control.learned): as the last compaction left
        # the model (the workloads it archived are in it), else learned again from the archive; the replay in
        # ``_recover`` then learns the live tail's ends in journal order, as they happened.
        self.runtimes = load_runtimes(journal)
        if self.runtimes is None:
            self.runtimes = RuntimeBook()
            relearn(journal, self.runtimes)
        self._started = self.clock()

        # ---- the roles, each handed what it needs. The ClusterState and the policy are handed as getters (a policy
        # reload replaces both); a role that needs one built after it gets a callable that reaches it through here.
        books = dict(records=self.records, state=lambda: self.state)
        act = dict(append=self._append, emit=self._emit, poke=self._poke)
        policy_now = lambda: self.policy  # noqa: E731
        self.reasons = Reasons(**books)
        self.limits = RunLimits(**books, **act, policy=policy_now, pipes=self.pipes, cancel_grace_s=cancel_grace_s,
                                remove_pg=lambda rec: self.leases.remove_pg(rec))
        self.leases = Leases(**books, **act, policy=policy_now, clock=clock, host=self.host, limits=self.limits)
        self.node_service = NodeService(
            **books, **act, policy=policy_now, host=self.host, clock=clock, journal=journal, nodes=self.nodes,
            leases=self.leases, reasons=self.reasons,
            replan_for_node=lambda nid, now: self.pipelines.replan_for_node(nid, now))
        self.scale = ScaleUp(cluster, **books, policy=policy_now, journal=journal, emit=self._emit,
                             month_spend=lambda now: self.costs.month_spend(now), reason_of=self.reasons.shown)
        self.pins = Pins(**books, **act, core=self._core, may_go=lambda rec: self.pipelines.may_go(rec))
        self.pipelines = Pipelines(
            **books, **act, policy=policy_now, journal=journal, gate=self.gate, pipes=self.pipes,
            runtimes=self.runtimes, clock=clock, refresh_nodes=self.node_service.refresh,
            feasible=self.scale.feasible, hold=self.pins.hold, core=self._core, cancel=self.leases.cancel)
        self.jobs = JobWatch(**books, append=self._append, emit=self._emit, host=self.host, pipes=self.pipes,
                             gate=self.gate, leases=self.leases, pipelines=self.pipelines)
        self.queue_etas = QueueEtas(**books, clock=clock, host=self.host)
        self.gauges = Gauges(**books, nodes=self.nodes, pins=self.pins)

        self._policy_data, self._journaled_policy = policy, None
        nodes_snapshot = self._recover()
        if self._journaled_policy != self._policy_data:
            # The policy it starts with, journaled (``at_start``: a later start with another file is not overridden
            # by it, as a reload is), so that ``raylane sim --from-journal`` replays under it without ``--policy``.
            self.journal.append(Kind.POLICY, "@policy", policy=self._policy_data, by="start", at_start=True)
        # Cost accounting (raylane.cost): a ledger that follows the journal, from what recovery left on.
        self.costs = Costs(journal=journal, clock=clock, policy=policy_now, tick_s=tick_s, started=self._started,
                           nodes_snapshot=nodes_snapshot)
        views = Views(**books, clock=clock, journal=journal, pipes=self.pipes, gate=self.gate, etas=self.queue_etas,
                      pipeline_view=self.pipelines.view, gauges=self.gauges, cycles=lambda: self.cycles,
                      started=self._started)
        admin = Admin(**books, clock=clock, journal=journal, gate=self.gate, adopt_policy=self._adopt_policy)
        self.requests = Requests(
            **books, **act, journal=journal, gate=self.gate, policy=policy_now, pipes=self.pipes,
            runtimes=self.runtimes, clock=clock, cancel_grace_s=cancel_grace_s, change_examined=CHANGE_EXAMINED,
            leases=self.leases, node_service=self.node_service, scale=self.scale, pins=self.pins,
            pipelines=self.pipelines, views=views, admin=admin, costs=self.costs)
        # Compaction after a commit, every policy.journal.compact_every entries (raylane.control.archive).
        self.compactor = Compactor(journal, self.records, lambda: self.runtimes, lambda: self.pipes,
                                   lambda: self.policy.journal, clock, before=self.costs.sync, gate=self.gate,
                                   nodes=lambda: self.nodes, ledger=lambda: self.costs.ledger)
        journal.after_commit = self.compactor
        boot = auth.get("bootstrap")
        if boot:
            self.gate.bootstrap(boot["user"], boot["id"], boot["salt"], boot["digest"])

    # ------------------------------------------------------------------------------------------- effects
    def _emit(self, effect: "fx.Effect") -> None:
        self.effects.append(effect)

    def _poke(self) -> None:
        """A change wants a cycle soon; past ``CYCLES_PER_TICK`` cycles asked for since the last full tick, it waits
        for the next one (``CYCLE_AGAIN_MAX`` of raylane.scheduling.apply: a loop of cycles that undo each other,
        a flip-flop, runs at most that often a tick, never in a tight loop)."""
        if self._change_cycles < CYCLE_AGAIN_MAX:
            self.wants_cycle = True

    def take_effects(self) -> List["fx.Effect"]:
        """The effects decided since the last call, in order; the caller commits the journal before carrying
        them out (what decided them is then on disk)."""
        out, self.effects = self.effects, []
        return out

    def _append(self, kind: Kind, rec: Record, **data):
        """Journal an entry of ``rec`` and apply it to the record, then tell the books that follow the records: the
        runtime book, the job watch (an end with something left to do) and, once it has ended, the pins (it is
        held no more, its pin goes) and the gate (its job token may die with it)."""
        e = self.journal.append(kind, rec.id, **data)
        rec.apply(e)
        self.runtimes.seen(rec)
        self.jobs.noted(rec)
        if rec.state.terminal:
            self.pins.ended(rec)
            # Its job token dies with its scope's last workload (raylane.control.gate: retired).
            self.gate.workload_ended(rec.id, self.clock(),
                                     live=lambda w: (r := self.records.get(w)) is not None and not r.state.terminal)
        return e

    # ------------------------------------------------------------------------------------------- recovery
    def _recover(self) -> Optional[Dict[str, Any]]:
        """Replay the journal into the books, then make the scheduler's state from the records. Returns the node
        book as the last compaction left it (its node presence feeds the cost ledger), or None."""
        nodes_snapshot = load_nodes(self.journal)  # the node book as the last compaction left it
        if nodes_snapshot is not None:
            self.nodes.load(nodes_snapshot["book"])
        for e in self.journal.replay():
            if e.kind == Kind.TOKEN:
                self.gate.apply(e)
                continue
            if e.kind == Kind.POLICY:
                self._journaled_policy = e.data["policy"]
                if not e.data.get("at_start"):  # a reload: it outlasts restarts
                    self._policy_data = e.data["policy"]
                    self._set_policy(e.data["policy"])
                continue
            if e.kind == Kind.NODE:
                self.nodes.apply(e)
                continue
            if e.kind == Kind.PIPELINE:
                self.pipes.apply(e)
                continue
            if e.kind == Kind.SCALE:
                self.scale.apply(e)
                continue
            if e.kind == Kind.SUBMITTED:
                self.records[e.workload_id] = Record(e.workload_id, e.data["spec"], e.data["submit_time"],
                                                     job_id=e.data.get("job_id"))
            rec = self.records.live(e.workload_id)
            if rec is not None:
                rec.apply(e)
                self.runtimes.seen(rec)
        self.jobs.recovered()
        self._rebuild_state(recovering=True)
        return nodes_snapshot

    def _set_policy(self, data: Dict[str, Any]) -> None:
        self.policy = load_policy_from_dict(data, "control policy")
        self.gate.teams = set(self.policy.teams.keys())
        self.nodes.rules = health_rules(self.policy)

    def _adopt_policy(self, data: Dict[str, Any]) -> None:
        """A reloaded policy (journaled already: ``Admin.reload_policy``) in force: the scheduler's state is made
        again under it."""
        self._policy_data = self._journaled_policy = data
        self._set_policy(data)
        self._rebuild_state()
        self._poke()

    def _rebuild_state(self, recovering: bool = False) -> None:
        """The scheduler's state from the records: pending work queued, leases held (on restart, a lease whose
        reservation is gone goes back to the queue). Used on recovery and after a policy reload. This actor carries
        out every decision the core makes, resizes of running elastic gangs included (``Leases.resize``)."""
        self.state = ClusterState([], self.policy.core_teams(), self.policy.to_scheduler_config())
        self.node_service.reset()
        self.pins.clear()
        self.node_service.refresh()
        existing = self.host.placement_groups() if recovering else {}
        for rec in self.records.values():
            if rec.state.terminal:
                continue
            if rec.state is State.PENDING and (self.pins.ref_of(rec) is not None or self.pipes.stage_of(rec.id)):
                self.pins.hold(rec, try_now=False)  # enqueued by the first tick once its inputs and checkpoint exist
                continue
            w = self._core(rec)
            self.state.enqueue(w)
            if rec.state.holds_lease:
                gone = [nid for nid in rec.placement if nid not in self.node_service.ids]
                if gone:
                    self.leases.remove_pg(rec)
                    self._append(Kind.REQUEUED, rec, attained_gpu_s=rec.attained_gpu_s, lost_node=gone[0],
                                 note=f"node {gone[0][:12]} was lost while the control plane was down; back in "
                                      f"the queue")
                    self.reasons.capacity_lost(rec.id)
                    self.state.dequeue(rec.id)
                    self.state.enqueue(self._core(rec))
                    continue
                # A gang handed over to Ray Train runs in Train's own group (its reservation was removed then).
                if not recovering or rec.pg_name in existing or rec.job_id or rec.state is not State.ADMITTED:
                    # The devices journaled with the admission (none in older journals: Ray's rule again).
                    lifecycle.admit(self.state, Admit(w, rec.placement, devices=rec.devices),
                                    rec.admitted_at or self.clock())
                    if rec.last_checkpoint is not None:
                        # What a stop would lose prices the victims (preemption.victim_cost); one from an earlier
                        # attempt counts as none (the cost counts from the start then).
                        self.state.checkpointed(rec.id, rec.last_checkpoint)
                    if rec.state is State.PREEMPTING or (
                            rec.state is State.RESIZING and rec.resize["to_workers"] < rec.resize["from_workers"]):
                        lifecycle.begin_stop(self.state, rec.id)  # a shrink keeps the whole gang booked until it stops
                else:
                    self._append(Kind.REQUEUED, rec, attained_gpu_s=rec.attained_gpu_s,
                                 note="reservation lost while the control plane was down; back in the queue")
                    self.state.dequeue(rec.id)
                    self.state.enqueue(self._core(rec))
        # A reservation whose removal was journaled but not carried out before the control plane went down (the
        # actor removes groups on threads of its own, after the commit): only an admission not yet handed over holds
        # one, so the group of a workload in any other state is removed now.
        # So is an earlier reservation of a workload admitted again since.
        for name in existing:
            wid = pg_workload(name)
            rec = self.records.get(wid) if wid is not None else None
            if rec is not None and (rec.state is not State.ADMITTED or rec.pg_name != name):
                self._emit(fx.RemoveReservation(name))

    def _core(self, rec: Record):
        """``rec``'s core workload under the policy now, with its learned runtime and its stage's node preference."""
        spec = load_spec_from_dict(rec.spec, f"workload {rec.id}", policy=self.policy)
        # Its user (``Workload.user``, which a team's user rule reads) is the spec's ``run.owner``: under the gate the
        # record's owner, whom submit wrote there; without it, who the spec says (every caller is then anonymous).
        w = spec.to_core(rec.id, self.policy, rec.submit_time)
        w = replace(w, attained_gpu_s=rec.attained_gpu_s, predicted=self.runtimes.predict(rec))
        return self.pipelines.stage_prefer(rec, w)

    # -------------------------------------------------------------------------------------------- ticks
    def tick(self, full: bool = True) -> None:
        """One scheduling cycle, its decisions journaled and their effects emitted; with ``full``, first the periodic
        work too (Ray's node table, node service, jobs, pipelines, grace deadlines, run limits) and after it the
        gauges, ETAs, costs and scale-up. A tick over ``SLOW_TICK_S`` is logged with the time each part took."""
        self.wants_cycle = False
        self._change_cycles = 0 if full else self._change_cycles + 1
        now = self.clock()
        took: Dict[str, float] = {}
        mark = perf_counter()

        def lap(part: str) -> None:
            nonlocal mark
            t = perf_counter()
            took[part] = took.get(part, 0.0) + t - mark
            mark = t

        # 1. What the world says: Ray's nodes, node service and probes, Ray's jobs.
        if full:
            self.node_service.refresh()
            lap("nodes")
            self.node_service.service(now)
            lap("node service")
            self.jobs.watch(now)
            lap("jobs")
        # 2. What time and the last events let go: held workloads, pipelines, grace deadlines, run limits.
        self.pins.release_ready()
        if full:
            self.pipelines.service(now)
            self.leases.enforce_deadlines(now)
            self.limits.enforce(now)  # a class's max_runtime (state_limits)
        lap("waiting, pipelines, deadlines")
        # 3. One cycle on the heads of the queues (a cycle decides exactly as on them all).
        self.state.decay(now)
        examined = MAX_EXAMINED if full else CHANGE_EXAMINED
        snap = self.state.snapshot(limit=examined)
        if self.scale.hold:  # gangs that wait for a new node before they preempt (raylane.control.state_scale)
            snap = replace(snap, scale_wait=self.scale.hold)
        if self.scale.groups:  # the node types scale-up could add (flavor quotas read them)
            snap = replace(snap, growable_types=frozenset(g.node_type for g in self.scale.groups))
        lap("snapshot")
        t0 = perf_counter()
        with gc_paused():  # no garbage collection inside a cycle (raylane.scheduling.gcpace)
            result = cycle(snap, now, max_examined=examined, stops=full)
        metrics.CYCLE_SECONDS.observe(perf_counter() - t0)
        lap("cycle")
        self.cycles += 1
        # 4. Its decisions carried out: victims asked to stop, resizes begun, admissions reserved.
        self.leases.apply(result, now)
        lap("decisions")
        # 5. What the pending show: positions and reasons.
        self.reasons.show(result, full, self.scale.potential_nodes)
        lap("reasons")
        # 6. A full tick's exports, and scale-up (after the costs: it reads each team's spend).
        if full:
            self.gauges.export()
            lap("gauges")
            self.queue_etas.export()
            lap("etas")
            self.costs.export(now)
            lap("costs")
            self.scale.plan(result.pending, now)
            lap("scale-up")
        total = sum(took.values())
        if total > SLOW_TICK_S:
            log.warning("slow %s tick: %.0f ms (%s); %d pending, %d leases", "full" if full else "cycle-only",
                        total * 1e3, ", ".join(f"{k} {v * 1e3:.0f} ms" for k, v in took.items() if v >= 0.001),
                        self.state.pending_count(), len(self.state.leases))

    # ------------------------------------------------------------------------------------ events, calls
    def handle(self, p: Principal, req: api.Request) -> Any:
        """Event: a call, checked by ``check``, run with the caller's principal (``Requests.handle``)."""
        return self.requests.handle(p, req)

    def check(self, credential: Any, call: Any, args: Any = None):
        """``(principal, request)`` of a call (``Gate.check``); a refusal is audited and raised."""
        return self.requests.check(credential, call, args)

    def reservation_ready(self, wid: str, pg_name: str) -> None:
        """Event: the reservation ``pg_name`` of ``wid`` is placed."""
        self.leases.reservation_ready(wid, pg_name)

    def reservation_failed(self, wid: str, pg_name: str, why: str) -> None:
        """Event: the reservation ``pg_name`` could not be made or placed (the actor removed what it made)."""
        self.leases.reservation_failed(wid, pg_name, why)

    def probed(self, verdicts: Dict[str, Any]) -> None:
        """Event: the verdicts of a ``RunProbes`` (``NodeService.probed``)."""
        self.node_service.probed(verdicts)

    def run_closed(self, wid: str, note: Optional[str]) -> None:
        """Event: the try at closing ``wid``'s MLflow run is over (``JobWatch.run_closed``)."""
        self.jobs.run_closed(wid, note)

    def pin_copied(self, wid: str, path: str, error: Optional[str]) -> None:
        """Event: the actor carried out a ``PinCheckpoint`` of ``wid``'s checkpoint to ``path``; ``error``: what
        stopped it, or None (``Pins.pin_copied``)."""
        self.pins.pin_copied(wid, path, error)

    def awaits_admission(self, wid: str) -> bool:
        """Whether a driver asking for ``wid``'s admission has to wait for a ``Wake`` (``Requests``)."""
        return self.requests.awaits_admission(wid)

    def etas(self) -> Dict[str, Any]:
        """The queue's ETAs as last forecast, a new forecast started when one is due (``QueueEtas.current``)."""
        return self.queue_etas.current()
