"""The control plane as a Ray-free state machine: ``ControlState``.

It owns the journal (every change is appended before it is acted on), the workload records, the ``ClusterState``
that the pure scheduling cycle reads, checkpoint pins and pipeline gating, the node book, resizes and grace
deadlines, the gate (tokens, audit) and the cost ledger. It imports no Ray and reads no clock of its own: time comes
from the injected ``clock``, and what it knows of the world from a ``Host``:

- **Events in.** A call (``handle(principal, request)``, after ``gate.check``), a tick (``tick(full)``), a
  reservation placed or failed (``reservation_ready`` / ``reservation_failed``), probe verdicts (``probed``), an MLflow
  run closed (``run_closed``). Reads of the world go through the host: Ray's node table and drain notices, the job
  table, the placement groups that exist (at recovery and for readiness).
- **Effects out.** What Ray must do, in order, after the journal entries that decided it are committed: reserve or
  remove a placement group, kill a gang's workers, stop a job, close a run, run the health probes, wake a driver that
  waits for its admission (``raylane.control.effects``). ``take_effects()`` hands them over; ``wants_cycle`` says a
  change wants a scheduling cycle soon.

The detached control actor (``raylane.control.actor``) is a thin shell around it: its loop, ``request()`` dispatch,
the Ray host, and carrying out effects. Tests drive it with a fake clock and a fake host, without Ray
(``tests/controltest.py``); replaying the journal at start goes through the same records and books as live operation.

Words: *reservation* is the placement group named ``raylane-<workload id>``; *release* is a workload telling the
control plane it has stopped (done, failed, or yielded after a preemption); *owner* the authenticated user that
submitted it.
"""
from __future__ import annotations

from dataclasses import replace
import logging
import os
from time import perf_counter
from typing import Any, Callable, Dict, List, Optional

from raylane import metrics
from raylane.config.loader import load_policy_from_dict, load_spec_from_dict
from raylane.auth import Principal
from raylane.control import api
from raylane.control.archive import Compactor, Records, load_nodes, load_runtimes, relearn
from raylane.control import checkpoints as ckrefs
from raylane.control.checkpoints import ref_key
from raylane.control import effects as fx
from raylane.control import ends
from raylane.control.gate import Gate, target_team
from raylane.control.host import Host
from raylane.control.journal import Journal, Kind
from raylane.control.learned import RuntimeBook
from raylane.control.state_admin import AdminCalls
from raylane.control.state_limits import RunLimitCalls
from raylane.control.state_nodes import GiB, NodeCalls
from raylane.control.state_pipelines import PipelineCalls
from raylane.control.state_scale import ScaleCalls
from raylane.control.state_views import ViewCalls
from raylane.control.nodes import HealthRules, NodeBook, NodeState
from raylane.control.pipelines import PipelineBook
from raylane.control.records import Record, State
from raylane.cost import Ledger
from raylane.errors import InfeasibleError, NotFoundError, RaylaneError
from raylane.ids import new_id
from raylane.scheduling import Admit, ClusterState, RAY_STRATEGY, check_feasible, cycle, lifecycle
from raylane.scheduling.cycle import MAX_EXAMINED
from raylane.scheduling.cohorts import cohort_usage
from raylane.scheduling.fragmentation import stranded_gpus
from raylane.scheduling.gcpace import gc_paused
from raylane.scheduling.types import SPOT_LABEL, Resize, Resources

log = logging.getLogger("raylane.control")

# A workload queued with a job id the jobs API does not know yet is not taken for gone this long after its submit:
# `raylane submit` queues it first and submits its driver's job right after (cli_cluster.submit).
JOB_SUBMIT_GRACE_S = 60.0
# Ray's job table is read at most this often (``_watch_jobs``).
JOB_WATCH_S = 5.0
# A tick that takes longer is logged with the time each of its parts took (ControlState.tick).
SLOW_TICK_S = 0.25
# Pending workloads a cycle between full ticks looks at, at most (a full tick: the core's MAX_EXAMINED). Such a cycle
# runs on a change, a release or a submission, often one per release: what a change lets in is at the head of the
# queue, while a cycle's cost grows with what it examines (with a full cluster, every workload past the admitted ones
# is tried and fails). What lies further waits for the next full tick, which also refreshes every reason shown.
CHANGE_EXAMINED = 64
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


def health_rules(policy) -> HealthRules:
    h = policy.health
    return HealthRules(h.probe_failures, h.gang_failures, h.gang_failure_window)


def bundle_for(per_worker: Resources) -> Dict[str, float]:
    b = {"CPU": per_worker.cpu, "GPU": per_worker.gpu, "memory": int(per_worker.memory * GiB)}
    b = {k: v for k, v in b.items() if v}
    return b or {"CPU": 0.001}


class ControlState(NodeCalls, ViewCalls, AdminCalls, PipelineCalls, ScaleCalls,
                   RunLimitCalls):
    def __init__(self, policy: Dict[str, Any], journal: Journal, host: Optional[Host] = None,
                 clock: Callable[[], float] = None, tick_s: float = 1.0, auth: Optional[Dict[str, Any]] = None,
                 cancel_grace_s: float = ends.CANCEL_GRACE_S, cluster: Optional[Dict[str, Any]] = None):
        """``journal``: opened by the caller (the actor opens it batched: one commit per turn of its loop).
        ``clock``: seconds since the epoch (``time.time`` live, a fake one in tests). ``auth``: ``{"enabled": bool,
        "bootstrap": {"user", "id", "salt", "digest"}}``, the first operator token (its digest only;
        ``raylane.control.client.start_control`` keeps the token). Default: enabled, and no token but those already
        journaled. The journal is replayed here; what recovery decided is journaled but not committed
        (``take_effects`` then commit, as after any event)."""
        auth = auth or {}
        if clock is None:
            import time

            clock = time.time
        self.clock = clock
        self.host = host or Host()
        self.policy = load_policy_from_dict(policy, "control policy")
        self.tick_s = tick_s
        self.cancel_grace_s = cancel_grace_s
        # Ended workloads with something left to do once their Ray job is over (``ends.pending``), and those whose
        # MLflow run a task is closing now (raylane.control.ends).
        self._ends: set = set()
        self._closing: set = set()
        self.journal = journal
        journal.clock = clock  # entries are timed by the same clock as the decisions
        self.effects: List[fx.Effect] = []  # what Ray must do, in order (take_effects)
        self.wants_cycle = False  # a change wants a scheduling cycle (take_effects clears it)
        self.gate = Gate(self.journal, enabled=auth.get("enabled", True), teams=self.policy.teams.keys(),
                         clock=clock)
        # The live records; an archived one is read back by id (raylane.control.archive).
        self.records: Dict[str, Record] = Records(journal)
        self.nodes = NodeBook(health_rules(self.policy))
        self.pipes = PipelineBook()
        self.state = ClusterState([], self.policy.core_teams(), self._scheduler_config())
        self._addresses: Dict[str, str] = {}
        self._probing = False  # a RunProbes effect is out and its verdicts are not back (``probed``)
        self._probed_at = self.clock()  # the first probes one interval after the start
        # Workloads requeued because a node they ran on was lost: their pending reason says the capacity is gone
        # while the nodes in service could never hold them.
        self._lost_capacity: set = set()
        self._stranded, self._stranded_memo = None, {}  # the last tick's stranded GPUs; pending_gangs' memo
        self._node_ids: set = set()
        # Workloads whose current admission's reservation the actor saw placed (``reservation_ready``), so that
        # readiness needs no call to Ray; cleared by each new admission.
        self._confirmed: set = set()
        # Workloads with a reservation asked for in this run and not yet reported placed or failed: the actor reports
        # it (``reservation_ready``), so readiness does not read Ray's table of every group meanwhile (``_ready``).
        self._reserving: set = set()
        self._workers: Dict[str, list] = {}
        # Gangs handed over to Ray Train and not heard from since (no stop poll or checkpoint yet): wid -> the time
        # of the hand-over. A resize waits until the gang is heard, so that it can yield (``_resize``).
        self._starting: Dict[str, float] = {}
        self._preemptor_cls: Dict[str, str] = {}
        self._jobs_checked = 0.0
        self._reason_of: Dict[str, Any] = {}  # pending workload id -> the core's reason its record shows (tick)
        self._etas: Dict[str, Any] = {}  # pending workload id -> its raylane.forecast.Eta (``etas``)
        self._etas_at: Optional[float] = None
        self._eta_cpu_s = 0.0  # the CPU time of the last forecast (``etas``: the next waits in proportion)
        self._eta_running = False  # a forecast is under way on the host (``etas``)
        self._eta_starts = None  # (the ETAs, their starts per team and class, latest first): ``_export_etas``
        # Pending workloads held out of the queue until the checkpoint they start from exists (checkpoints.py).
        self._waiting: set = set()
        self._started = self.clock()
        self.cycles = 0
        self._init_scale(cluster)  # the growable node groups of ``cluster`` (the cluster file), if any
        # Runtimes learned from every workload that ended (raylane.control.learned), rebuilt by the replay below.
        self.runtimes = RuntimeBook()
        self._policy_data, self._journaled_policy = policy, None
        self._recover()
        if self._journaled_policy != self._policy_data:
            # The policy it starts with, journaled (``at_start``: a later start with another file is not overridden
            # by it, as a reload is), so that ``raylane sim --from-journal`` replays under it without ``--policy``.
            self.journal.append(Kind.POLICY, "@policy", policy=self._policy_data, by="start", at_start=True)
        # Cost accounting (raylane.cost): a ledger that follows the journal; the counters export what accrued
        # since the last export, from this start on.
        self._ledger = Ledger(history=self.journal.archived_entries)  # archived workloads: read when asked for
        if self._nodes_snapshot is not None:  # node presence the last compaction archived the entries of
            self._ledger.load_node_spans(self._nodes_snapshot["spans"])
        self._cost_sync()
        # Compaction after a commit, every policy.journal.compact_every entries (raylane.control.archive).
        self.compactor = Compactor(journal, self.records, lambda: self.runtimes, lambda: self.pipes,
                                   lambda: self.policy.journal, clock, before=self._cost_sync, gate=self.gate,
                                   nodes=lambda: self.nodes, ledger=lambda: self._ledger)
        journal.after_commit = self.compactor
        self._cost_exported_at = self._started
        self._month_spend: Optional[tuple] = None  # (month start, prices, team -> spend this month)
        boot = auth.get("bootstrap")
        if boot:
            self.gate.bootstrap(boot["user"], boot["id"], boot["salt"], boot["digest"])

    # ------------------------------------------------------------------------------------------- effects
    def _emit(self, effect: "fx.Effect") -> None:
        self.effects.append(effect)

    def _poke(self) -> None:
        self.wants_cycle = True

    def take_effects(self) -> List["fx.Effect"]:
        """The effects decided since the last call, in order; the caller commits the journal before carrying
        them out (what decided them is then on disk)."""
        out, self.effects = self.effects, []
        return out

    # ------------------------------------------------------------------------------------------- recovery
    def _recover(self) -> None:
        # The runtime model as the last compaction left it (the workloads it archived are in it), else learned
        # again from the archive; then the live tail, whose ends it learns in journal order as they happened.
        book = load_runtimes(self.journal)
        if book is not None:
            self.runtimes = book
        else:
            relearn(self.journal, self.runtimes)
        self._nodes_snapshot = load_nodes(self.journal)  # the node book as the last compaction left it
        if self._nodes_snapshot is not None:
            self.nodes.load(self._nodes_snapshot["book"])
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
                self._scale_apply(e)
                continue
            if e.kind == Kind.SUBMITTED:
                self.records[e.workload_id] = Record(e.workload_id, e.data["spec"], e.data["submit_time"],
                                                     job_id=e.data.get("job_id"))
            rec = self.records.live(e.workload_id)
            if rec is not None:
                rec.apply(e)
                self.runtimes.seen(rec)
        self._ends = {wid for wid, rec in self.records.items() if ends.pending(rec)}
        self._rebuild_state(recovering=True)

    def _set_policy(self, data: Dict[str, Any]) -> None:
        self.policy = load_policy_from_dict(data, "control policy")
        self.gate.teams = set(self.policy.teams.keys())
        self.nodes.rules = health_rules(self.policy)

    def _scheduler_config(self):
        """The policy's scheduler settings. This actor carries out every decision the core makes, resizes of
        running elastic gangs included (``_resize``)."""
        return self.policy.to_scheduler_config()

    def _rebuild_state(self, recovering: bool = False) -> None:
        """The scheduler's state from the records: pending work queued, leases held (on restart, a lease whose
        reservation is gone goes back to the queue). Used on recovery and after a policy reload."""
        self.state = ClusterState([], self.policy.core_teams(), self._scheduler_config())
        self._node_ids = set()
        self._waiting = set()
        self._refresh_nodes()
        existing = self.host.placement_groups() if recovering else {}
        for rec in self.records.values():
            if rec.state.terminal:
                continue
            if rec.state is State.PENDING and (self._init_ref(rec) is not None or self.pipes.stage_of(rec.id)):
                self._waiting.add(rec.id)  # enqueued by the first tick once its inputs and checkpoint exist
                continue
            w = self._core(rec)
            self.state.enqueue(w)
            if rec.state.holds_lease:
                gone = [nid for nid in rec.placement if nid not in self._node_ids]
                if gone:
                    self._remove_pg(rec)
                    self._append(Kind.REQUEUED, rec, attained_gpu_s=rec.attained_gpu_s, lost_node=gone[0],
                                 note=f"node {gone[0][:12]} was lost while the control plane was down; back in "
                                      f"the queue")
                    self._lost_capacity.add(rec.id)
                    self.state.dequeue(rec.id)
                    self.state.enqueue(self._core(rec))
                    continue
                # A gang handed over to Ray Train runs in Train's own group (its reservation was removed then).
                if not recovering or rec.pg_name in existing or rec.job_id or rec.state is not State.ADMITTED:
                    # The devices journaled with the admission (none in older journals: Ray's rule again).
                    lifecycle.admit(self.state, Admit(w, rec.placement, devices=rec.devices), rec.admitted_at or self.clock())
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
        spec = load_spec_from_dict(rec.spec, f"workload {rec.id}", policy=self.policy)
        # Its user (``Workload.user``, which a team's user rule reads) is the spec's ``run.owner``: under the gate the
        # record's owner, whom submit wrote there; without it, who the spec says (every caller is then anonymous).
        w = spec.to_core(rec.id, self.policy, rec.submit_time)
        w = replace(w, attained_gpu_s=rec.attained_gpu_s, predicted=self.runtimes.predict(rec))
        return self._stage_prefer(rec, w)

    def _append(self, kind: Kind, rec: Record, **data):
        e = self.journal.append(kind, rec.id, **data)
        rec.apply(e)
        self.runtimes.seen(rec)
        if ends.pending(rec):
            self._ends.add(rec.id)
        else:
            self._ends.discard(rec.id)
        if rec.state.terminal:
            self._waiting.discard(rec.id)
            self._unpin(rec, f"{rec.id} ended")
            # Its job token dies with its scope's last workload (raylane.control.gate: retired).
            self.gate.workload_ended(rec.id, self.clock(),
                                     live=lambda w: (r := self.records.get(w)) is not None and not r.state.terminal)
        return e

    # -------------------------------------------------------------------------------------------- ticks
    def tick(self, full: bool = True) -> None:
        """One scheduling cycle, its decisions journaled and their effects emitted; with ``full``, first the periodic
        work too (Ray's node table, node service, jobs, pipelines, grace deadlines) and after it the gauges and
        costs. A tick over ``SLOW_TICK_S`` is logged with the time each part took."""
        self.wants_cycle = False
        now = self.clock()
        took: Dict[str, float] = {}
        mark = perf_counter()

        def lap(part: str) -> None:
            nonlocal mark
            t = perf_counter()
            took[part] = took.get(part, 0.0) + t - mark
            mark = t

        if full:
            self._refresh_nodes()
            lap("nodes")
            self._service_nodes(now)
            lap("node service")
            self._watch_jobs(now)
            lap("jobs")
        for wid in list(self._waiting):
            self._release_if_ready(self.records[wid])
        if full:
            self._service_pipelines(now)
            self._enforce_deadlines(now)
            self._enforce_run_limits(now)  # a class's max_runtime (state_limits)
        lap("waiting, pipelines, deadlines")
        self.state.decay(now)
        examined = MAX_EXAMINED if full else CHANGE_EXAMINED
        snap = self.state.snapshot(limit=examined)  # the heads of the queues: a cycle decides exactly as on them all
        if self.scale_hold:  # gangs that wait for a new node before they preempt (raylane.control.state_scale)
            snap = replace(snap, scale_wait=self.scale_hold)
        if self.scale_groups:  # the node types scale-up could add (flavor quotas read them)
            snap = replace(snap, growable_types=frozenset(g.node_type for g in self.scale_groups))
        lap("snapshot")
        t0 = perf_counter()
        with gc_paused():  # no garbage collection inside a cycle (raylane.scheduling.gcpace)
            result = cycle(snap, now, max_examined=examined)
        metrics.CYCLE_SECONDS.observe(perf_counter() - t0)
        lap("cycle")
        self.cycles += 1
        for p in result.preempted:
            for vid in p.victims:
                self._preempt(vid, p.reason, now, p.preemptor.cls.name)
        for rz in result.resized:
            self._resize(rz, now)
        for a in result.admitted:
            self._admit(a, now)
        for a in result.admitted:
            self._lost_capacity.discard(a.workload.id)
        lap("decisions")
        in_service = None
        shown = self._reason_of
        for p in result.pending:
            rec = self.records[p.workload.id]
            rec.position = p.position
            if shown.get(rec.id) == p.reason and rec.id not in self._lost_capacity:
                continue  # the reason it already shows (formatting thousands of them a cycle is most of its cost)
            rec.reason = str(p.reason)
            rec.reason_data = {"type": type(p.reason).__name__, **_fields(p.reason)}
            if rec.id in self._lost_capacity:
                in_service = in_service if in_service is not None else [
                    n for n in self.state.nodes.values() if n.schedulable] + self.potential_nodes()
                why = check_feasible(p.workload, in_service, self.state.teams, self.state.config.admission)
                if why is not None:
                    rec.reason = (f"the capacity it ran on is gone (a node was lost) and the nodes in service "
                                  f"could never hold it: {why.detail}; it "
                                  f"waits for nodes to join or return to service")
                    rec.reason_data = {"type": "CapacityLost", "detail": str(why)}
        # The reasons shown now: a full tick's cycle gives every examined workload's; a shorter one's, those of the
        # heads it looked at (the others keep theirs until the next full tick).
        reasons = {p.workload.id: p.reason for p in result.pending}
        if full:
            self._reason_of = reasons
        else:
            shown.update(reasons)
            for a in result.admitted:
                shown.pop(a.workload.id, None)
        lap("reasons")
        if full:
            self._export_gauges()
            lap("gauges")
            self._export_etas()
            lap("etas")
            self._export_costs(now)
            lap("costs")
            self._plan_scale(result.pending, now)  # after the costs: it reads each team's spend
            lap("scale-up")
        total = sum(took.values())
        if total > SLOW_TICK_S:
            log.warning("slow %s tick: %.0f ms (%s); %d pending, %d leases", "full" if full else "cycle-only",
                        total * 1e3, ", ".join(f"{k} {v * 1e3:.0f} ms" for k, v in took.items() if v >= 0.001),
                        self.state.pending_count(), len(self.state.leases))

    def _export_gauges(self) -> None:
        # The queue lengths are the scheduler's counts, kept as workloads come and go; the leases and the workloads
        # waiting for their inputs are counted (not every record the journal ever held): a tick's work grows with
        # what runs and what changed, not with the length of the queue.
        waiting: Dict[tuple, int] = self.state.pending_counts()
        held: Dict[tuple, int] = {}
        for wid in self._waiting:
            rec = self.records[wid]
            if rec.state is State.PENDING and not self.state.is_pending(wid):
                waiting[(rec.team, rec.cls)] = waiting.get((rec.team, rec.cls), 0) + 1
        for lease in self.state.leases.values():
            key = (lease.workload.team, lease.workload.cls.name)
            held[key] = held.get(key, 0) + 1
        for (team, cls), n in self._gauge_keys(waiting, "_last_waiting").items():
            metrics.QUEUE_LENGTH.set(n, team=team, workload_class=cls)
        for (team, cls), n in self._gauge_keys(held, "_last_held").items():
            metrics.LEASES_RUNNING.set(n, team=team, workload_class=cls)
        states = {(st.id, st.node_type or "-", s.value): float(st.state is s)
                  for st in self.nodes.nodes.values() if st.state is not NodeState.LOST for s in NodeState
                  if s is not NodeState.LOST}
        for (nid, ntype, sv), v in self._gauge_keys(states, "_last_node_states").items():
            metrics.NODE_STATE.set(v, node=nid, node_type=ntype, state=sv)
        self._stranded = stranded_gpus(self.state.snapshot(), self._stranded_memo)
        for ntype, v in self._gauge_keys(dict(self._stranded.stranded), "_last_stranded").items():
            metrics.STRANDED_GPUS.set(v, node_type=ntype)
        cohorts = {(c.name, what): getattr(c, what).gpu
                   for c in cohort_usage(self.state.teams, self.state.usage).values()
                   for what in ("nominal", "used", "borrowed", "lendable")}
        for (name, what), v in self._gauge_keys(cohorts, "_last_cohorts").items():
            metrics.COHORT_GPUS.set(v, cohort=name, what=what)
        for name, team in self.state.teams.items():
            q = team.quotas.get("gpu")
            metrics.GPUS_HELD.set(self.state.usage.get(name, Resources()).gpu, team=name, what="held")
            if q is not None:
                metrics.GPUS_HELD.set(q.nominal, team=name, what="nominal")
                metrics.GPUS_HELD.set(q.ceiling if q.ceiling != float("inf") else -1, team=name, what="ceiling")

    def _gauge_keys(self, now_counts: Dict[tuple, int], attr: str) -> Dict[tuple, int]:
        """Current counts, plus zeros for label sets seen before, so a drained queue reads 0 rather than stale."""
        seen = getattr(self, attr, set())
        out = {k: 0 for k in seen}
        out.update(now_counts)
        setattr(self, attr, set(out))
        return out

    def _admit(self, a: Admit, now: float) -> None:
        rec = self.records[a.workload.id]
        pg_name = pg_name_for(rec)
        self._confirmed.discard(rec.id)
        # Journal first, then act; roll back if the reservation cannot be made.
        choice = self._flavor_choice(a)
        self._append(Kind.ADMITTED, rec, placement=list(a.placement), pg_name=pg_name, borrowing=a.borrowing,
                     devices=[list(d) for d in a.devices], **(choice or {}),
                     note=f"admitted on {', '.join(n[:8] for n in a.placement)}"
                          + (" (borrowing)" if a.borrowing else "") + (f": {choice['why']}" if choice else ""))
        lifecycle.admit(self.state, a, now)
        self._track_run_limit(rec)  # when its class's max_runtime falls due (state_limits)
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
            lease = lifecycle.end(self.state, rec.id, self.clock())
            self._append(Kind.REQUEUED, rec, attained_gpu_s=rec.attained_gpu_s, note=f"admission rolled back: {why}")
            lifecycle.requeue(self.state, lease, self.clock(), rec.attained_gpu_s)
        self._poke()

    def _preempt(self, wid: str, reason: str, now: float, preemptor_class: str = "") -> None:
        rec = self.records[wid]
        if rec.state is State.PREEMPTING:
            return
        self._preemptor_cls[wid] = preemptor_class
        started = rec.state in (State.RUNNING, State.RESIZING)
        grace = self.policy.workload_class(rec.cls).grace_period_s
        if rec.state is State.RESIZING:
            # Stopping already for a resize: it now stops for good (back to the queue), keeping its deadline.
            grace = max(0.0, (rec.stop_deadline or now + grace) - now)
        self._append(Kind.PREEMPTING, rec, deadline=now + grace, reason=reason, note=f"preempted: {reason}")
        lifecycle.begin_stop(self.state, wid)
        if not started:
            # Nothing runs on the reservation yet: there is nothing to checkpoint, release at once.
            self._release_lease(rec, now, outcome="preempted before start")

    def _resize(self, rz: Resize, now: float) -> None:
        """Carry out a ``Resize`` of a running elastic gang: journal it, ask the gang to save a checkpoint and stop
        (as for a preemption, within its class's grace period), and restart it at the new size once it has stopped
        (``_finish_resize``). Growth books the new workers' capacity at once, so nothing else is admitted into it
        meanwhile; a shrink keeps the whole gang booked until it has stopped, so what it frees is never promised
        twice (the preemptor it shrinks for waits for it, as for a stop)."""
        rec = self.records.get(rz.workload.id)
        if rec is None or rec.state is not State.RUNNING or rec.id not in self.state.leases:
            # Not started yet (its driver is handing the reservation over to Ray Train) or stopping already: the
            # core decides again on the next cycle, from the books as they are then.
            return
        grace = self.policy.workload_class(rec.cls).grace_period_s
        handed = self._starting.get(rec.id)
        if handed is not None and now - handed < grace:
            # Ray Train is still starting its workers: the loop hears a stop only once it runs (at its checkpoints),
            # so a resize asked now would likely run out its grace period and be forced. The core decides again
            # next cycle; once the gang is heard from, or a grace period after the hand-over, it goes ahead.
            return
        grow = rz.to_workers > rz.from_workers
        attained = rec.attained_gpu_s
        grown = lifecycle.begin_resize(self.state, rz, now)  # a shrink keeps the whole gang booked until it stops
        if grown is not None:
            attained = grown.workload.attained_gpu_s
        self._append(Kind.RESIZING, rec, from_workers=rz.from_workers, to_workers=rz.to_workers,
                     placement=list(rz.placement), devices=[list(d) for d in rz.devices], reason=rz.reason,
                     deadline=now + grace, attained_gpu_s=attained, note=f"resizing: {rz.reason}")
        metrics.RESIZES.inc(team=rec.team, workload_class=rec.cls, direction="grow" if grow else "shrink")

    def _finish_resize(self, rec: Record, now: float, how: str, step: Optional[int] = None) -> None:
        """The gang stopped for its resize: the lease goes on at the new size on the nodes the core chose (a new
        reservation, handed over to Ray Train as at an admission); the driver restarts the gang from its checkpoint."""
        rz = rec.resize
        lease = self.state.leases[rec.id]  # fails loudly if the lease is gone
        lease = lifecycle.finish_shrink(self.state, Resize(
            lease.workload, lease.workload.gang.workers, rz["to_workers"], tuple(rz["placement"]),
            tuple(tuple(d) for d in rz["devices"]), rz["reason"]), now)
        self._confirmed.discard(rec.id)
        self._remove_pg(rec)
        self._append(Kind.RESIZED, rec, from_workers=rz["from_workers"], to_workers=rz["to_workers"],
                     placement=list(rz["placement"]), devices=rz["devices"], pg_name=pg_name_for(rec),
                     attained_gpu_s=lease.workload.attained_gpu_s, step=step if step is not None else rec.step,
                     note=f"resized from {rz['from_workers']} to {rz['to_workers']} workers ({how}); restarts from "
                          f"its checkpoint on {', '.join(n[:8] for n in rz['placement'])}")
        self._reserve(rec, lease.workload, rec.placement)
        self._poke()

    def _enforce_deadlines(self, now: float) -> None:
        """Gangs asked to stop whose grace period is over are stopped by force. Only a lease can be stopping, so
        this looks at the leases, not at every record the journal ever held."""
        for wid in list(self.state.leases):
            rec = self.records.get(wid)
            if rec is not None and rec.state.stopping and rec.stop_deadline is not None and now >= rec.stop_deadline:
                self._kill_gang(rec)
                if rec.state is State.RESIZING:
                    self._finish_resize(rec, now, how="stopped by force after the grace period")
                else:
                    self._release_lease(rec, now, outcome="stopped by force after the grace period")

    def _kill_gang(self, rec: Record) -> None:
        """Kill the gang's registered workers and remove its reservation."""
        handles = self._workers.pop(rec.id, [])
        if handles:
            self._emit(fx.KillWorkers(rec.id, tuple(handles)))
        self._remove_pg(rec)

    def _release_lease(self, rec: Record, now: float, outcome: str, step: Optional[int] = None) -> None:
        """A preempted lease is over: free it and put the workload back at its original place."""
        if rec.id not in self.state.leases:
            return
        if self._end_run_limited(rec, now, outcome, step):  # it stopped for its run limit, not a preemption
            return
        lease = lifecycle.end(self.state, rec.id, now)
        metrics.PREEMPTIONS.inc(team=rec.team, workload_class=rec.cls,
                                preemptor_class=self._preemptor_cls.pop(rec.id, ""),
                                outcome="forced" if "by force" in outcome else "graceful")
        attained = lifecycle.attained_gpu_s(lease, now)
        self._remove_pg(rec)
        self._append(Kind.REQUEUED, rec, attained_gpu_s=attained, step=step if step is not None else rec.step,
                     note=f"back in the queue ({outcome})")
        lifecycle.requeue(self.state, lease, now, attained)
        self._poke()

    def _remove_pg(self, rec: Record) -> None:
        """Remove the lease's reservation (once what ended it is committed, as every effect)."""
        if rec.pg_name:
            self._emit(fx.RemoveReservation(rec.pg_name))

    # ------------------------------------------------------------------------------------------- requests
    def handle(self, p: Principal, req: api.Request) -> Any:
        """Event: a call, checked by ``gate.check``, run with the caller's principal; audited if it is
        privileged (refused or not). Raises what the call raises."""
        name = api.CALL_NAMES[type(req)]
        try:
            out = HANDLERS[type(req)](self, p, req)
        except RaylaneError as exc:
            if req.audited:
                self.gate.record(p, name, req.target(), "refused", f"{type(exc).__name__}: {exc}")
            raise
        if req.audited:
            target = req.target() or (out.get("id") if isinstance(out, dict) else None)
            self.gate.record(p, name, target, "ok")
        return out

    def check(self, credential: Any, call: Any, args: Any = None):
        """``(principal, request)`` of a call (``Gate.check``: arguments, credential, authorization); a refusal is
        audited and raised."""
        return self.gate.check(credential, call, args, team_of=self._team_of, now=self.clock())

    def _team_of(self, req: api.Request):
        def find(wid):
            if wid in self.pipes.runs:
                return self.pipes.runs[wid].team, self.pipes.runs[wid].owner
            rec = self._get(wid)
            return rec.team, rec.owner

        return target_team(req, find)

    def _id_taken(self, wid: str) -> bool:
        """Whether a workload or pipeline already goes by ``wid`` (records hold every workload ever submitted,
        ended ones included, so an id is never reused)."""
        return wid in self.records or wid in self.pipes.runs

    def _api_submit(self, p: Principal, req: api.Submit) -> Dict[str, Any]:
        """Validate, check feasibility, journal and enqueue. Raises ValidationError or InfeasibleError."""
        spec, job_id = dict(req.spec), req.job_id
        if self.gate.enabled:  # the owner is who asked, whatever the spec says
            spec["run"] = {**(spec.get("run") if isinstance(spec.get("run"), dict) else {}), "owner": p.user}
        parsed = load_spec_from_dict(spec, f"spec {spec.get('name', '?')}", policy=self.policy)
        # Drawn before anything is journaled or recorded: an id in use is drawn again, and a generator that keeps
        # repeating is refused (ConflictError) with nothing written, never journaled twice under one id.
        wid = new_id(parsed.name, self._id_taken)
        now = self.clock()
        w = parsed.to_core(wid, self.policy, now)
        # The nodes as the last tick read them (Ray's node table is read once a tick, not per submission); a
        # request they could never hold is checked again against Ray's table now before it is refused.
        why = self.feasible(w)
        if why is not None and self._refresh_nodes():
            why = self.feasible(w)
        data = parsed.model_dump(by_alias=True, mode="json", exclude_none=True)
        key = ref_key(data)
        ref = ckrefs.parse_ref(parsed.config.get(key), f"config.{key}")
        source, verdict = None, None
        if why is None and ref is not None:
            # Any team's checkpoint may be named (a pretraining team's model is another team's starting point);
            # the consumer's journal records which one it pinned.
            source = ckrefs.find_source(ref, self.records.values())
            if source is None:
                why = f"config.{key} names workload {ref.workload!r}, which is not known to the control plane"
            else:
                verdict = self._judge(ref, source)
                if verdict.never:
                    why = f"config.{key} {ref}: {verdict.reason}"
        if why is not None:
            rec = Record(wid, data, now)
            self.records[wid] = rec
            rec.apply(self.journal.append(Kind.SUBMITTED, wid, spec=data, submit_time=now, owner=p.user,
                                          token_id=p.token_id))
            self.gate.bind(p, [wid], team=data.get("team"), kind=data.get("kind"), now=now)  # its one submit
            self._append(Kind.REJECTED, rec, reason=str(why), note=f"rejected at submit: {why}")
            raise InfeasibleError(f"{wid} rejected: {why}")
        rec = Record(wid, data, now, job_id=job_id)
        self.records[wid] = rec
        self._append_submitted(rec, data, now, job_id, p)
        self.gate.bind(p, [wid], team=data.get("team"), kind=data.get("kind"), now=now)  # a job token's scope
        self.hold_for_scale_up(wid, now)
        if ref is not None:
            # A step is pinned now (copied at once if it is already written); `latest` is pinned at the start.
            self._append(Kind.PINNED, rec, source=source.id, step=ref.step,
                         note=f"starts from {source.id}'s checkpoint at "
                              f"{'the latest step when it starts' if ref.step is None else f'step {ref.step}'}")
            self._waiting.add(wid)
            self._release_if_ready(rec)
            self._poke()
        elif self.state.in_snapshot(w.team, self.state.enqueue(replace(w, predicted=self.runtimes.predict(rec))),
                                    CHANGE_EXAMINED):
            # A change cycle looks at the first CHANGE_EXAMINED of each queue: a workload queued behind them changes
            # none of its inputs, and the cycle would only repeat the last one (what time alone changes waits for the
            # full tick, as it does when nothing is submitted). In a burst of 3,000 into a full cluster: 429 change
            # cycles -> 29, the state machine's CPU per submission 0.8 -> 0.5 ms (the live actor's rate, bounded by
            # Ray's per-call work, did not move; docs/operations.md).
            self._poke()
        return rec.public()

    # ------------------------------------------------------------------------------ checkpoint references
    def _init_ref(self, rec: Record):
        key = ref_key(rec.spec)
        return ckrefs.parse_ref((rec.spec.get("config") or {}).get(key), f"config.{key}")

    def _judge(self, ref, source: Record, rec: Optional[Record] = None):
        max_step, every = ckrefs.source_limits(source.spec)
        pinned = (rec.pin.get("path") if rec is not None and rec.pin.get("step") == ref.step else None)
        return ckrefs.judge(ref, source_id=source.id, source_ended=source.state.terminal, max_step=max_step,
                            cadence=every, written=source.checkpoints, pinned=pinned)

    def _pin_now(self, rec: Record, source: Record, step: int, path: str) -> str:
        """Copy ``source``'s checkpoint at ``step`` out of its retention's reach; journal it on ``rec``."""
        if rec.pin.get("path") and rec.pin.get("step") == step and os.path.isdir(rec.pin["path"]):
            return rec.pin["path"]
        dst = ckrefs.pin_copy(path, ckrefs.pin_dir(path, step))
        self._append(Kind.PINNED, rec, source=source.id, step=step, path=dst,
                     note=f"pinned {source.id}'s checkpoint at step {step}: {dst}")
        return dst

    def _release_if_ready(self, rec: Record) -> None:
        """Queue a held-back consumer once its checkpoint exists; fail it if it never can."""
        if rec.id not in self._waiting:
            return
        if rec.state is not State.PENDING:
            self._waiting.discard(rec.id)
            return
        if not self._pipeline_gate(rec):  # a pipeline's stage whose inputs are not done (state_pipelines)
            return
        ref = self._init_ref(rec)
        if ref is None:  # a stage with no checkpoint to wait for
            self._waiting.discard(rec.id)
            self.state.enqueue(self._core(rec))
            self._poke()
            return
        source = ckrefs.find_source(ref, self.records.values()) if ref is not None else None
        if source is None:
            verdict = ckrefs.Verdict(never=True, reason=f"workload {ref.workload if ref else '?'} is gone")
        else:
            verdict = self._judge(ref, source, rec)
        if verdict.never:
            self._append(Kind.FINISHED, rec, state=State.FAILED, outcome="checkpoint reference",
                         note=f"failed: config.{ref_key(rec.spec)} {ref}: {verdict.reason}")
            self._emit(fx.Wake(rec.id))
            return
        if verdict.ready:
            if ref.step is not None:
                self._pin_now(rec, source, verdict.step, verdict.path)
            self._waiting.discard(rec.id)
            self.state.enqueue(self._core(rec))
            self._poke()
            return
        rec.reason, rec.position, rec.reason_data = verdict.reason, None, {"type": "WaitingForCheckpoint"}

    def _unpin(self, rec: Record, why: str) -> None:
        """``rec`` no longer needs its pinned checkpoint; the copy goes once no other consumer holds it."""
        if not rec.pin or rec.pin.get("released"):
            return
        path = rec.pin.get("path")
        self._append(Kind.UNPINNED, rec, note=f"released its pin on {rec.pin['source']}'s checkpoint ({why})")
        held = any(r.pin.get("path") == path and not r.pin.get("released") for r in self.records.values())
        if path and not held:
            ckrefs.drop_copy(path)

    def _api_checkpoint_saved(self, p: Principal, req: api.CheckpointSaved) -> None:
        """A gang's checkpoint is written and registered (Ray Train's report callback, on the driver's node)."""
        wid, path, metrics = req.workload_id, req.path, req.metrics
        rec = self._get(wid)
        step = ckrefs.step_of(path, metrics)
        if step is None:
            return
        self._append(Kind.CHECKPOINTED, rec, step=step, path=path)
        self._starting.pop(wid, None)
        if wid in self.state.leases:
            self.state.checkpointed(wid, self.clock())
        # It has a checkpoint of its own: a resume starts from that, so whatever it pinned has been loaded.
        self._unpin(rec, "loaded: it wrote a checkpoint of its own")
        for other in list(self.records.values()):
            if other.pin.get("source") == wid and not other.pin.get("released") and other.pin.get("step") == step:
                self._pin_now(other, rec, step, path)
            if other.id in self._waiting:
                self._release_if_ready(other)

    def _api_resolve_checkpoint(self, p: Principal, req: api.ResolveCheckpoint) -> Dict[str, Any]:
        """The directory a starting consumer loads (pinned for it); raises NotFoundError if it can never resolve."""
        wid = req.workload_id
        rec = self._get(wid)
        ref = self._init_ref(rec)
        if ref is None:
            return {"path": None}
        pinned = rec.pin.get("path")
        if pinned and os.path.isdir(pinned):
            return {"path": pinned, "step": rec.pin.get("step"), "source": rec.pin.get("source")}
        source = ckrefs.find_source(ref, self.records.values())
        verdict = self._judge(ref, source, rec) if source is not None else ckrefs.Verdict(
            never=True, reason=f"workload {ref.workload} is gone")
        if not verdict.ready:
            raise NotFoundError(f"config.{ref_key(rec.spec)} {ref}: {verdict.reason}")
        path = self._pin_now(rec, source, verdict.step, verdict.path)
        return {"path": path, "step": verdict.step, "source": source.id}

    def _append_submitted(self, rec: Record, data, now, job_id, p: Principal) -> None:
        e = self.journal.append(Kind.SUBMITTED, rec.id, spec=data, submit_time=now, job_id=job_id, owner=p.user,
                                token_id=p.token_id,
                                note=f"submitted by {p.user}: {data.get('run', {}).get('intent', '')}")
        rec.apply(e)

    def _api_cancel(self, p: Principal, req: api.Cancel) -> Dict[str, Any]:
        wid = req.workload_id
        if wid in self.pipes.runs:  # a whole pipeline: every stage not ended, and its driver's job
            run = self.pipes.runs[wid]
            self._cancel_pipeline_stages(run, f"pipeline cancelled by {p.user}")
            if run.job_id:
                self._stop_job(run.job_id)
            self._poke()
            return self._pipeline_view(p, run)
        rec = self._get(wid)
        if rec.state.terminal:
            return rec.public()
        # Its driver sees the cancel, ends its MLflow run KILLED and exits non-zero, so that its job (and `ray job
        # submit`) says the workload did not succeed; the job is stopped only if the driver is still there after
        # the grace period (raylane.control.ends). A stage's job is its pipeline's driver: it goes on.
        own_job = bool(rec.job_id) and self.pipes.stage_of(wid) is None
        self._cancel(rec, p.user, f"cancelled by {p.user}",
                     job_stop_at=self.clock() + self.cancel_grace_s if own_job else None)
        self._poke()
        return rec.public()

    def _cancel(self, rec: Record, by: str, note: str, job_stop_at: Optional[float] = None) -> None:
        """Out of the queue or off its lease, journaled as cancelled, its gang stopped, its waiters woken.
        ``job_stop_at``: when its Ray job is stopped if its driver has not exited by then."""
        if self.state.is_pending(rec.id):
            self.state.dequeue(rec.id)
        elif rec.id in self.state.leases:
            lifecycle.end(self.state, rec.id, self.clock())
            self._remove_pg(rec)
        self._append(Kind.CANCELLED, rec, by=by, note=note, job_stop_at=job_stop_at, close_run=True)
        self._kill_gang(rec)
        self._emit(fx.Wake(rec.id))

    def _api_release(self, p: Principal, req: api.Release) -> Dict[str, Any]:
        """The workload stopped. ``outcome``: finished, failed or yielded (after a preemption)."""
        wid, outcome, state, step, detail = (req.workload_id, req.outcome.value, req.state.value, req.step,
                                             req.detail)
        rec = self._get(wid)
        now = self.clock()
        if rec.state.terminal:
            return rec.public()
        yielded = req.outcome is api.Outcome.YIELDED
        if yielded and rec.state is State.ADMITTED:
            # An admission its driver has not taken over yet (it reports running at the hand-over) was never asked to
            # stop: this yield is an earlier attempt's, whose lease was taken back by force when its grace period ran
            # out, the workload being admitted again since. Ending the new lease would requeue the admission the
            # driver is about to take (and remove its reservation while it is being made).
            self._append(Kind.EVENT, rec, note=f"its earlier attempt's driver reported it yielded at step {step}; that "
                                               f"lease was taken back already: the new admission stands")
            return rec.public()
        if yielded and rec.state is State.RESIZING:
            self._finish_resize(rec, now, how=f"yielded at step {step}", step=step)
        elif yielded:
            self._release_lease(rec, now, outcome=f"yielded at step {step}", step=step)
        else:
            if wid in self.state.leases:
                lifecycle.end(self.state, wid, now)
            self._remove_pg(rec)
            self._append(Kind.FINISHED, rec, state=state, outcome=outcome, step=step,
                         note=f"{state.lower()}: {detail or outcome}")
        self._poke()
        return rec.public()

    def _api_report(self, p: Principal, req: api.Report) -> Dict[str, Any]:
        """Progress from a running workload: kind running (with job_id) or event (a note, progress detail)."""
        wid, kind = req.workload_id, Kind(req.kind.value)
        data = req.model_dump(exclude={"workload_id", "kind"}, exclude_none=True)
        rec = self._get(wid)
        if kind is Kind.RUNNING and rec.state is not State.ADMITTED:
            return {"stop": True, "state": rec.state.value}  # preempted or cancelled before the gang started
        self._append(kind, rec, **data)
        if req.restart and rec.placement:
            # A crash the driver retries: attributed to every node the gang ran on (raylane.control.nodes).
            self._node_events(self.nodes.on_gang_failure(rec.placement, wid, self.clock()))
        if kind is Kind.RUNNING:
            # Hand-over: Train builds its own group of the same shape, pinned to the same nodes. The ledger keeps
            # counting the capacity, so nothing else is admitted into it meanwhile.
            self._remove_pg(rec)
            self._starting[wid] = self.clock()
        return {"stop": rec.state.stopping, "state": rec.state.value}

    def _api_register_workers(self, p: Principal, req: api.RegisterWorkers) -> None:
        """The actors of a running gang, so that a preemption past its grace period can stop them."""
        self._workers[req.workload_id] = list(req.handles)

    def _api_class_info(self, p: Principal, req: api.ClassInfo) -> Dict[str, Any]:
        c = self.policy.workload_class(req.name)
        return {k: getattr(c, k) for k in c.__dataclass_fields__}

    def _stop_job(self, job_id: str) -> None:
        self._emit(fx.StopJob(job_id))

    def _watch_jobs(self, now: float) -> None:
        """A workload whose Ray job ended without telling us (driver killed, job stopped, or gone with the Ray
        cluster it ran on) ends and releases its lease; what an end left to do (stop a driver that outlived a
        cancel, close the MLflow run a driver left open) is done once the job is over (``raylane.control.ends``)."""
        if now - self._jobs_checked < JOB_WATCH_S:
            return
        self._jobs_checked = now
        live = [r for r in self.records.values() if r.job_id and not r.state.terminal]
        pipes = [r for r in self.pipes.active() if r.job_id]
        ended = [self.records[wid] for wid in sorted(self._ends - self._closing)]
        scripts = [s for s in self.gate.script_scopes() if all(self._over(w) for w in s.members)]
        if not live and not pipes and not ended and not scripts:
            return
        # One listing of Ray's jobs per watch, not a request per workload: a queue of thousands of `raylane submit`
        # workloads each has a job.
        table = self.host.job_table()
        if table is None:  # no answer (no dashboard): nothing is decided from it
            return
        for rec in live:
            job, status = _listed_state(table, rec.job_id)
            if job is ends.JobState.LIVE or job is None:
                continue
            if job is ends.JobState.GONE and now - rec.submit_time < JOB_SUBMIT_GRACE_S:
                continue  # `raylane submit` queues the workload first, then submits the job that drives it
            if rec.id in self.state.leases:
                lifecycle.end(self.state, rec.id, now)
            elif self.state.is_pending(rec.id):
                self.state.dequeue(rec.id)
            self._remove_pg(rec)
            if job is ends.JobState.GONE:
                self._append(Kind.CANCELLED, rec, by="control plane", outcome="ray job gone", close_run=True,
                             note=f"its Ray job {rec.job_id} no longer exists: the Ray cluster it ran on was "
                                  f"stopped")
                continue
            kind = Kind.CANCELLED if status == "STOPPED" else Kind.FINISHED
            self._append(kind, rec, state=State.FAILED, outcome=f"ray job {status.lower()}", close_run=True,
                         note=f"its Ray job {rec.job_id} ended ({status}) without releasing")
        for rec in ended:
            job = _listed_state(table, rec.job_id)[0] if rec.job_id else None
            self._after_end(ends.after_end(rec, job, now))
        for scope in scripts:  # a script's job token: retired once its workloads and their Ray job are over
            jobs = {self.records[w].job_id for w in scope.members if w in self.records and self.records[w].job_id}
            states = [_listed_state(table, j)[0] for j in sorted(jobs)]
            if all(s is not ends.JobState.LIVE for s in states):
                self.gate.retire(scope.token_id, now, "its script's workloads have ended, and so has their Ray job "
                                                      f"({', '.join(sorted(jobs)) or 'none'})")
        for run in pipes:  # a pipeline whose driver's job ended: no one runs its stages any more
            job, status = _listed_state(table, run.job_id)
            if job is not ends.JobState.LIVE and job is not None:
                self._cancel_pipeline_stages(run, f"its driver's Ray job {run.job_id} ended ({status})")

    def _over(self, wid: str) -> bool:
        rec = self.records.get(wid)
        return rec is None or rec.state.terminal

    def _after_end(self, action: Optional[ends.Action]) -> None:
        """Carry out what ``ends.after_end`` decided for an ended workload."""
        if action is None:
            return
        rec = self.records[action.workload_id]
        if isinstance(action, ends.Settled):
            self._ends.discard(rec.id)
        elif isinstance(action, ends.StopJob):
            self._append(Kind.EVENT, rec, job_stopped=True, note=action.note)
            self._stop_job(action.job_id)
        elif isinstance(action, ends.CloseRun):
            self._closing.add(rec.id)
            self._emit(action)

    def run_closed(self, wid: str, note: Optional[str]) -> None:
        """Event: the actor's try at closing ``wid``'s MLflow run (a ``CloseRun``) is over: ``note`` says what was
        done, journaled; None: the try failed, and the next watch tries again."""
        self._closing.discard(wid)
        if note is not None:
            self._append(Kind.EVENT, self.records[wid], mlflow_run_closed=True, note=note)

    def _api_should_stop(self, p: Principal, req: api.ShouldStop) -> bool:
        self._starting.pop(req.workload_id, None)  # its loop runs: it hears a stop at its next checkpoint
        rec = self.records.get(req.workload_id)
        return rec is None or rec.state.stopping or rec.state is State.CANCELLED

    def awaits_admission(self, wid: str) -> bool:
        """Whether a driver asking for ``wid``'s admission has to wait (for a ``Wake``): it is pending, or admitted
        with its reservation not placed yet. Raises NotFoundError for an unknown id."""
        rec = self._get(wid)
        return rec.state in (State.PENDING, State.ADMITTED) and not self._ready(rec)

    def _api_wait_admission(self, p: Principal, req: api.WaitAdmission) -> Dict[str, Any]:
        """The workload's record and whether its reservation is ready; the actor waits up to ``timeout_s`` for a
        ``Wake`` first (``awaits_admission``). A reservation placed before the driver asked (the usual case on an
        idle cluster) is answered at once."""
        rec = self._get(req.workload_id)
        out = self.gate.view(p, rec.public())
        out["ready"] = self._ready(rec)
        return out

    def _ready(self, rec: Record) -> bool:
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

    def _get(self, wid: str) -> Record:
        rec = self.records.get(wid)
        if rec is None:
            raise NotFoundError(f"no workload {wid!r}")
        return rec


def _listed_state(table: Dict[str, str], job_id: str):
    """(``ends.JobState``, Ray's status name or ``gone``) of a job, from the host's job table: a job Ray does not
    list is one it never had (gone)."""
    status = table.get(job_id)
    if status is None:
        return ends.JobState.GONE, "gone"
    return ends.job_state(status), status.rsplit(".", 1)[-1]


def _fields(reason) -> Dict[str, Any]:
    fields = getattr(reason, "__dataclass_fields__", {})
    out = {}
    for k in fields:
        v = getattr(reason, k)
        out[k] = str(v) if hasattr(v, "__dataclass_fields__") else v
    return out


# The handler of each call, keyed by its request type (raylane.control.api.CALLS): ``ControlState.handle``.
HANDLERS: Dict[type, Callable[[ControlState, Principal, api.Request], Any]] = {
    api.Submit: ControlState._api_submit,
    api.Cancel: ControlState._api_cancel,
    api.Release: ControlState._api_release,
    api.Report: ControlState._api_report,
    api.CheckpointSaved: ControlState._api_checkpoint_saved,
    api.RegisterWorkers: ControlState._api_register_workers,
    api.ShouldStop: ControlState._api_should_stop,
    api.ResolveCheckpoint: ControlState._api_resolve_checkpoint,
    api.Status: ControlState._api_status,
    api.Explain: ControlState._api_explain,
    api.WaitAdmission: ControlState._api_wait_admission,
    api.FindJob: ControlState._api_find_job,
    api.Queue: ControlState._api_queue,
    api.ClassInfo: ControlState._api_class_info,
    api.Info: ControlState._api_info,
    api.WhoAmI: ControlState._api_whoami,
    api.Teams: ControlState._api_teams,
    api.Cohorts: ControlState._api_cohorts,
    api.TokenCreate: ControlState._api_token_create,
    api.JobToken: ControlState._api_job_token,
    api.TokenRotate: ControlState._api_token_rotate,
    api.TokenRevoke: ControlState._api_token_revoke,
    api.TokenList: ControlState._api_token_list,
    api.Audit: ControlState._api_audit,
    api.ReloadPolicy: ControlState._api_reload_policy,
    api.Cost: ControlState._api_cost,
    api.NodeList: ControlState._api_node_list,
    api.NodeCordon: ControlState._api_node_cordon,
    api.NodeUncordon: ControlState._api_node_uncordon,
    api.NodeDrain: ControlState._api_node_drain,
    api.PipelineSubmit: ControlState._api_pipeline_submit,
    api.PipelineStatus: ControlState._api_pipeline_status,
    api.PipelineOutput: ControlState._api_pipeline_output,
}
