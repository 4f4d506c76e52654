"""The control plane's calls (a role of ``raylane.control.state.ControlState``): ``check`` and ``handle``, and the
calls a workload's life goes through.

``check`` is the gate's (``raylane.control.gate``: arguments, credential, authorization; a refusal is audited and
raised); ``handle`` runs a checked call with the caller's principal through the table of handlers keyed by the
request type (``raylane.control.api.CALLS``), each the method of the role that answers it, and audits it if it is
privileged. The calls answered here: submit, cancel, release, report, register workers, should stop, wait for
admission, class info, and the checkpoint calls (the pins are ``state_pins``'); read calls are ``state_views``', node
calls ``state_nodes``', pipeline calls ``state_pipelines``', admin calls ``state_admin``', the ``cost`` call
``state_costs``'.

Handed the records, the journal, the gate, the ``ClusterState`` and the policy (getters: a policy reload replaces
both), the pipeline book, the runtime book, the clock, the cancel grace period, ``change_examined`` (how deep a
cycle between full ticks looks into each queue), ``append``, ``emit``, ``poke``, and the roles it asks or routes to.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable, Dict

from raylane.auth import Principal
from raylane.config.loader import load_spec_from_dict
from raylane.control import api
from raylane.control import checkpoints as ckrefs
from raylane.control import effects as fx
from raylane.control.checkpoints import ref_key
from raylane.control.gate import target_team
from raylane.control.journal import Kind
from raylane.control.records import Record, State
from raylane.errors import InfeasibleError, NotFoundError, RaylaneError
from raylane.ids import new_id


def record_of(records, wid: str) -> Record:
    """The record of ``wid``; raises NotFoundError for an unknown id."""
    rec = records.get(wid)
    if rec is None:
        raise NotFoundError(f"no workload {wid!r}")
    return rec


def journal_submitted(journal, rec: Record, data, now, job_id, p: Principal) -> None:
    """Journal ``rec``'s submission (its spec as checked, ``data``) and apply it to the record."""
    e = journal.append(Kind.SUBMITTED, rec.id, spec=data, submit_time=now, job_id=job_id, owner=p.user,
                       token_id=p.token_id, note=f"submitted by {p.user}: {data.get('run', {}).get('intent', '')}")
    rec.apply(e)


class Requests:
    """``check``, ``handle`` and the workload calls (module docstring). The roles: ``leases``, ``node_service``
    (``state_nodes.NodeService``), ``scale`` (``state_scale.ScaleUp``), ``pins`` (``state_pins.Pins``),
    ``pipelines``; and, for the calls they answer, ``views``, ``admin`` and ``costs``."""

    def __init__(self, *, records, journal, gate, state: Callable[[], Any], policy: Callable[[], Any], pipes,
                 runtimes, clock: Callable[[], float], cancel_grace_s: float, change_examined: int,
                 append: Callable[..., Any], emit: Callable[[fx.Effect], None], poke: Callable[[], None],
                 leases, node_service, scale, pins, pipelines, views, admin, costs):
        self.records, self.journal, self.gate, self.pipes, self.runtimes = records, journal, gate, pipes, runtimes
        self._state, self._policy, self.clock = state, policy, clock
        self.cancel_grace_s, self.change_examined = cancel_grace_s, change_examined
        self._append, self._emit, self._poke = append, emit, poke
        self.leases, self.node_service, self.scale, self.pins, self.pipelines = (leases, node_service, scale, pins,
                                                                                 pipelines)
        # The handler of each call, keyed by its request type (raylane.control.api.CALLS): ``handle``.
        self.handlers: Dict[type, Callable[[Principal, Any], Any]] = {
            api.Submit: self.submit,
            api.Cancel: self.cancel,
            api.Release: self.release,
            api.Report: self.report,
            api.CheckpointSaved: self.checkpoint_saved,
            api.RegisterWorkers: self.register_workers,
            api.ShouldStop: self.should_stop,
            api.ResolveCheckpoint: self.resolve_checkpoint,
            api.Status: views.status,
            api.Explain: views.explain,
            api.WaitAdmission: self.wait_admission,
            api.FindJob: views.find_job,
            api.Queue: views.queue,
            api.ClassInfo: self.class_info,
            api.Info: views.info,
            api.WhoAmI: admin.whoami,
            api.Teams: admin.teams,
            api.Cohorts: admin.cohorts,
            api.TokenCreate: admin.token_create,
            api.JobToken: admin.job_token,
            api.TokenRotate: admin.token_rotate,
            api.TokenRevoke: admin.token_revoke,
            api.TokenList: admin.token_list,
            api.Audit: admin.audit,
            api.ReloadPolicy: admin.reload_policy,
            api.Cost: costs.cost,
            api.NodeList: node_service.node_list,
            api.NodeCordon: node_service.node_cordon,
            api.NodeUncordon: node_service.node_uncordon,
            api.NodeDrain: node_service.node_drain,
            api.PipelineSubmit: pipelines.submit,
            api.PipelineStatus: pipelines.status,
            api.PipelineOutput: pipelines.output,
        }

    @property
    def state(self):
        return self._state()

    @property
    def policy(self):
        return self._policy()

    # ---------------------------------------------------------------------------------------- check, handle
    def handle(self, p: Principal, req: api.Request) -> Any:
        """Event: a call, checked by ``gate.check``, run with the caller's principal; audited if it is
        privileged (refused or not). Raises what the call raises."""
        name = api.CALL_NAMES[type(req)]
        try:
            out = self.handlers[type(req)](p, req)
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
            rec = record_of(self.records, wid)
            return rec.team, rec.owner

        return target_team(req, find)

    # -------------------------------------------------------------------------------------------- submit
    def _id_taken(self, wid: str) -> bool:
        """Whether a workload or pipeline already goes by ``wid`` (records hold every workload ever submitted,
        ended ones included, so an id is never reused)."""
        return wid in self.records or wid in self.pipes.runs

    def submit(self, p: Principal, req: api.Submit) -> Dict[str, Any]:
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
        why = self.scale.feasible(w)
        if why is not None and self.node_service.refresh():
            why = self.scale.feasible(w)
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
                verdict = self.pins.judge(ref, source)
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
        journal_submitted(self.journal, rec, data, now, job_id, p)
        self.gate.bind(p, [wid], team=data.get("team"), kind=data.get("kind"), now=now)  # a job token's scope
        self.scale.hold_for_scale_up(wid, now)
        if ref is not None:
            # A step is pinned now (copied at once if it is already written); `latest` is pinned at the start.
            self._append(Kind.PINNED, rec, source=source.id, step=ref.step,
                         note=f"starts from {source.id}'s checkpoint at "
                              f"{'the latest step when it starts' if ref.step is None else f'step {ref.step}'}")
            self.pins.hold(rec)
            self._poke()
        elif self.state.in_snapshot(w.team, self.state.enqueue(replace(w, predicted=self.runtimes.predict(rec))),
                                    self.change_examined):
            # A change cycle looks at the first CHANGE_EXAMINED of each queue: a workload queued behind them changes
            # none of its inputs, and the cycle would only repeat the last one (what time alone changes waits for the
            # full tick, as it does when nothing is submitted). In a burst of 3,000 into a full cluster: 429 change
            # cycles -> 29, the state machine's CPU per submission 0.8 -> 0.5 ms (the live actor's rate, bounded by
            # Ray's per-call work, did not move; docs/operations.md).
            self._poke()
        return rec.public()

    # ---------------------------------------------------------------------------------- a workload's life
    def cancel(self, p: Principal, req: api.Cancel) -> Dict[str, Any]:
        wid = req.workload_id
        if wid in self.pipes.runs:  # a whole pipeline: every stage not ended, and its driver's job
            run = self.pipes.runs[wid]
            self.pipelines.cancel_stages(run, f"pipeline cancelled by {p.user}")
            if run.job_id:
                self._emit(fx.StopJob(run.job_id))
            self._poke()
            return self.pipelines.view(p, run)
        rec = record_of(self.records, wid)
        if rec.state.terminal:
            return rec.public()
        # Its driver sees the cancel, ends its MLflow run KILLED and exits non-zero, so that its job (and `ray job
        # submit`) says the workload did not succeed; the job is stopped only if the driver is still there after
        # the grace period (raylane.control.ends). A stage's job is its pipeline's driver: it goes on.
        own_job = bool(rec.job_id) and self.pipes.stage_of(wid) is None
        self.leases.cancel(rec, p.user, f"cancelled by {p.user}",
                           job_stop_at=self.clock() + self.cancel_grace_s if own_job else None)
        self._poke()
        return rec.public()

    def release(self, p: Principal, req: api.Release) -> Dict[str, Any]:
        """The workload stopped. ``outcome``: finished, failed or yielded (after a preemption)."""
        wid, outcome, state, step, detail = (req.workload_id, req.outcome.value, req.state.value, req.step,
                                             req.detail)
        rec = record_of(self.records, wid)
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
            self.leases.finish_resize(rec, now, how=f"yielded at step {step}", step=step)
        elif yielded:
            self.leases.release_lease(rec, now, outcome=f"yielded at step {step}", step=step)
        else:
            self.leases.applier.ended(wid, now)  # its lease, if it holds one, is over
            self.leases.remove_pg(rec)
            self._append(Kind.FINISHED, rec, state=state, outcome=outcome, step=step,
                         note=f"{state.lower()}: {detail or outcome}")
        self._poke()
        return rec.public()

    def report(self, p: Principal, req: api.Report) -> Dict[str, Any]:
        """Progress from a running workload: kind running (with job_id) or event (a note, progress detail)."""
        wid, kind = req.workload_id, Kind(req.kind.value)
        data = req.model_dump(exclude={"workload_id", "kind"}, exclude_none=True)
        rec = record_of(self.records, wid)
        if kind is Kind.RUNNING and rec.state is not State.ADMITTED:
            return {"stop": True, "state": rec.state.value}  # preempted or cancelled before the gang started
        self._append(kind, rec, **data)
        if req.restart and rec.placement:
            # A crash the driver retries: attributed to every node the gang ran on (raylane.control.nodes).
            self.node_service.gang_failed(rec.placement, wid, self.clock())
        if kind is Kind.RUNNING:
            # Hand-over: Train builds its own group of the same shape, pinned to the same nodes. The ledger keeps
            # counting the capacity, so nothing else is admitted into it meanwhile.
            self.leases.remove_pg(rec)
            self.leases.handed_over(wid, self.clock())
        return {"stop": rec.state.stopping, "state": rec.state.value}

    def register_workers(self, p: Principal, req: api.RegisterWorkers) -> None:
        """The actors of a running gang, so that a preemption past its grace period can stop them."""
        self.leases.register_workers(req.workload_id, req.handles)

    def class_info(self, p: Principal, req: api.ClassInfo) -> Dict[str, Any]:
        c = self.policy.workload_class(req.name)
        return {k: getattr(c, k) for k in c.__dataclass_fields__}

    def should_stop(self, p: Principal, req: api.ShouldStop) -> bool:
        self.leases.heard(req.workload_id)  # its loop runs: it hears a stop at its next checkpoint
        rec = self.records.get(req.workload_id)
        return rec is None or rec.state.stopping or rec.state is State.CANCELLED

    def awaits_admission(self, wid: str) -> bool:
        """Whether a driver asking for ``wid``'s admission has to wait (for a ``Wake``): it is pending, or admitted
        with its reservation not placed yet. Raises NotFoundError for an unknown id."""
        rec = record_of(self.records, wid)
        return rec.state in (State.PENDING, State.ADMITTED) and not self.leases.ready(rec)

    def wait_admission(self, p: Principal, req: api.WaitAdmission) -> Dict[str, Any]:
        """The workload's record and whether its reservation is ready; the actor waits up to ``timeout_s`` for a
        ``Wake`` first (``awaits_admission``). A reservation placed before the driver asked (the usual case on an
        idle cluster) is answered at once."""
        rec = record_of(self.records, req.workload_id)
        out = self.gate.view(p, rec.public())
        out["ready"] = self.leases.ready(rec)
        return out

    # ------------------------------------------------------------------------------------- checkpoints
    def checkpoint_saved(self, p: Principal, req: api.CheckpointSaved) -> None:
        """A gang's checkpoint is written and registered (Ray Train's report callback, on the driver's node)."""
        wid, path, metrics = req.workload_id, req.path, req.metrics
        rec = record_of(self.records, wid)
        step = ckrefs.step_of(path, metrics)
        if step is None:
            return
        self._append(Kind.CHECKPOINTED, rec, step=step, path=path)
        self.leases.heard(wid)
        if wid in self.state.leases:
            self.state.checkpointed(wid, self.clock())
        self.pins.checkpoint_saved(rec, step, path)

    def resolve_checkpoint(self, p: Principal, req: api.ResolveCheckpoint) -> Dict[str, Any]:
        """The directory a starting consumer loads (pinned for it); raises NotFoundError if it can never resolve."""
        return self.pins.resolve(record_of(self.records, req.workload_id))
