"""The control plane's pipeline calls and pipeline service (a role of ``raylane.control.state.ControlState``; see
docs/pipelines.md).

``pipeline_submit`` checks a ``kind: pipeline`` spec whole (its shape, its DAG, every stage's workload against the
policy and the cluster: one stage that could never run refuses the pipeline, named), plans it on the nodes in
service (``raylane.planning``), journals the pipeline and then one record per stage. A stage that declares no
duration is planned with the median of the runtime its record would be predicted (``self.runtimes``, the control
plane's ``RuntimeBook``), and the plan's explanation (the pipeline's ``planner`` text) names each such stage and what
the prediction rests on; with no history to predict from, the pipeline is refused, naming the stage. Every stage
is held (``state_pins.Pins``, as a consumer of a checkpoint is) until the stages it needs have succeeded
(``may_go``); then it queues like any workload, under its team's quota, preferring its planned node and then the
nodes that hold its inputs. Each full tick ``service`` ends pipelines whose stages have all ended, and re-plans the
stages not started when a stage runs longer than ``pipelines.overrun`` times its estimate (a predicted one: the
seconds journaled at submit); a lost node re-plans at once (``replan_for_node``).
"""
from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any, Callable, Dict, Optional

from raylane.auth import Principal
from raylane.config.loader import load_spec_from_dict
from raylane.control import api
from raylane.control import checkpoints as ckrefs
from raylane.control import effects as fx
from raylane.control import pipelines as pl
from raylane.control.journal import Kind
from raylane.control.records import Record, State
from raylane.control.state_requests import journal_submitted
from raylane.errors import ConflictError, InfeasibleError, NotFoundError, ValidationError
from raylane.runtimes import human_s

log = logging.getLogger("raylane.control")


class Pipelines:
    """Pipelines in the control plane: their calls, their stages' gate and node preference, their service.

    Its book is the ``PipelineBook`` (``pipes``). Handed the records, the journal, the ``ClusterState`` and the policy
    (getters: a policy reload replaces both), the gate (owners and what a caller may read), the runtime book (a stage
    with no declared duration is planned with its prediction), the clock, ``append``, ``emit``, ``poke``, and what
    it asks of the other roles: ``refresh_nodes`` (Ray's node table read now: ``NodeService.refresh``), ``feasible``
    (``ScaleUp.feasible``), ``hold`` (a stage held until its inputs are done: ``Pins.hold``), ``core`` (a record's
    core workload, with its stage's node preference) and ``cancel`` (``Leases.cancel``)."""

    def __init__(self, *, records, journal, state: Callable[[], Any], policy: Callable[[], Any], gate, pipes,
                 runtimes, clock: Callable[[], float], append: Callable[..., Any],
                 emit: Callable[[fx.Effect], None], poke: Callable[[], None], refresh_nodes: Callable[[], bool],
                 feasible: Callable[[Any], Any], hold: Callable[[Record], None], core: Callable[[Record], Any],
                 cancel: Callable[..., None]):
        self.records, self.journal, self.gate, self.pipes, self.runtimes = records, journal, gate, pipes, runtimes
        self._state, self._policy, self.clock = state, policy, clock
        self._append, self._emit, self._poke = append, emit, poke
        self._refresh_nodes, self._feasible, self._hold = refresh_nodes, feasible, hold
        self._core, self._cancel = core, cancel

    @property
    def state(self):
        return self._state()

    @property
    def policy(self):
        return self._policy()

    # ------------------------------------------------------------------------------------------------ calls
    def submit(self, p: Principal, req: api.PipelineSubmit) -> Dict[str, Any]:
        from raylane.config import pipeline as ps
        from raylane.planning import PLANNERS, CpSatPlanner

        data = dict(req.spec)
        pid = req.pipeline_id
        # The caller chooses the id: one in use (a pipeline's, a workload's, or a prefix of a stage's) is refused
        # before anything is journaled.
        if pid in self.pipes.runs or pid in self.records or any(w.startswith(pid + "-") for w in self.records):
            raise ConflictError("pipeline", [("pipeline_id", pid, "an id no pipeline or workload has used")])
        if self.gate.enabled:  # the owner is who asked, whatever the spec says
            data["run"] = {**(data.get("run") if isinstance(data.get("run"), dict) else {}), "owner": p.user}
        spec = ps.load_pipeline_spec(data, f"pipeline {data.get('name', '?')}")
        specs = ps.expand(spec, pid, req.storage_path, req.parent_run_id)
        ids = ps.stage_ids(pid, spec)
        self._refresh_nodes()
        errors, infeasible, parsed = [], [], {}
        now = self.clock()
        for stage, s in specs.items():
            try:
                parsed[stage] = load_spec_from_dict(s, f"stage {stage}", policy=self.policy)
                w = parsed[stage].to_core(ids[stage], self.policy, now)
            except ValidationError as exc:
                errors += [(f"stages.{stage}.workload.{f}", v, a) for f, v, a in exc.errors]
                continue
            why = self._feasible(w)
            if why is not None:
                infeasible.append(f"stage {stage}: {why}")
            ref = ckrefs.parse_ref(parsed[stage].config.get(ckrefs.ref_key(s)), f"config.{ckrefs.ref_key(s)}")
            if ref is not None and ref.workload not in ids.values():
                source = ckrefs.find_source(ref, self.records.values())
                if source is None:
                    infeasible.append(f"stage {stage}: config.{ckrefs.ref_key(s)} names workload {ref.workload!r}, "
                                      f"which is not known to the control plane")
        if errors:
            raise ValidationError(f"pipeline {spec.name}", errors)
        if infeasible:
            raise InfeasibleError(f"pipeline {spec.name} rejected: " + "; ".join(infeasible))
        cleans = {stage: parsed[stage].model_dump(by_alias=True, mode="json", exclude_none=True) for stage in specs}
        predicted = self._predict_undeclared(spec, cleans, ids, now, p)
        nodes = ps.plan_nodes(self.state.nodes.values())
        problem, network = ps.planning_problem(spec, specs, nodes, self.policy.pipelines.bandwidth_gb_per_h,
                                               predicted_s={s: v["seconds"] for s, v in predicted.items()})
        solver = spec.planner or self.policy.pipelines.planner
        planner = CpSatPlanner(time_limit_s=5.0) if solver == "cpsat" else PLANNERS.get(solver)
        plan = planner.plan(problem, nodes, network)
        stored = {x.stage: {"node": x.node, "start_h": x.start_h, "finish_h": x.finish_h} for x in plan.placements}
        explanation = f"{plan.planner} ({plan.status.value})" + (f": {plan.note}" if plan.note else "")
        if predicted:
            explanation += "; durations predicted from past runs: " + "; ".join(
                f"{s} {human_s(v['seconds'])} ({v['basis']})" for s, v in predicted.items())
        # Journal first: the pipeline, then each stage's record (held until its inputs are done).
        e = self.journal.append(
            "pipeline", pid, event="submitted", spec=data, stages=ids,
            needs={s: list(st.needs) for s, st in spec.stages.items()}, plan=stored, makespan_h=plan.makespan_h,
            planner=explanation, owner=p.user, job_id=req.job_id,
            parent_run_id=req.parent_run_id, storage=req.storage_path, predicted=predicted,
            estimates_s={s: predicted[s]["seconds"] if s in predicted else ps.estimate_s(st)
                         for s, st in spec.stages.items()},
            output_gb={s: float(st.output) for s, st in spec.stages.items()})
        self.pipes.apply(e)
        for stage, s in specs.items():
            clean = cleans[stage]
            rec = Record(ids[stage], clean, now)
            self.records[rec.id] = rec
            journal_submitted(self.journal, rec, clean, now, None, p)
            self._hold(rec)
        self._poke()
        return self.view(p, self.pipes.runs[pid], specs=specs)

    def _predict_undeclared(self, spec, cleans: Dict[str, Dict[str, Any]], ids: Dict[str, str], now: float,
                            p: Principal) -> Dict[str, Dict[str, Any]]:
        """Stage -> {seconds, basis} for each stage that declares no duration: the median of the runtime its record
        will be predicted (the runtime book's model, as any queued workload's), and what that rests on
        (``RuntimeDist.describe``). Refuses, naming every such stage at once, where there is no history at all."""
        from raylane.config import pipeline as ps

        out, missing = {}, []
        for stage in ps.undeclared(spec):
            # Owned as its record will be (Record.apply): who asked, else what the spec says.
            owner = p.user or (cleans[stage].get("run") or {}).get("owner") or ""
            dist = self.runtimes.predict(Record(ids[stage], cleans[stage], now, owner=owner))
            if dist is None or not dist.runtime(0.5) > 0:
                missing.append(stage)
                continue
            out[stage] = {"seconds": dist.runtime(0.5), "basis": dist.describe()}
        if missing:
            raise ValidationError(f"pipeline {spec.name}", [
                (f"stages.{s}.duration", None, "declare duration (90s, 10m, 2h) or workload.runtime_estimate: no "
                                               "finished run of this stage, its team and class or the cluster to "
                                               "predict one from") for s in missing])
        return out

    def status(self, p: Principal, req: api.PipelineStatus) -> Dict[str, Any]:
        return self.view(p, self._pipeline(req.workload_id))

    def output(self, p: Principal, req: api.PipelineOutput) -> None:
        run = self._pipeline(req.workload_id)
        if req.stage not in run.stages:
            raise ValidationError("pipeline output", [("stage", req.stage, f"one of {', '.join(run.stages)}")])
        self.pipes.apply(self.journal.append(Kind.PIPELINE, run.id, event="output", stage=req.stage, path=req.path,
                                             bytes=req.bytes, node=req.node))

    def _pipeline(self, pid: str) -> pl.PipelineRun:
        run = self.pipes.runs.get(pid)
        if run is None:
            raise NotFoundError(f"no pipeline {pid!r}")
        return run

    def view(self, p: Principal, run: pl.PipelineRun, specs: Optional[Dict[str, Any]] = None):
        stages = []
        for stage, wid in run.stages.items():
            rec = self.records.get(wid)
            started = next((ts for ts, note in (rec.events if rec else []) if note.startswith("admitted")), None)
            stages.append({
                "stage": stage, "workload_id": wid, "needs": run.needs.get(stage, []),
                "state": rec.state.value if rec else "?", "reason": rec.reason if rec else "",
                "planned": run.plan.get(stage, {}), "placement": list(rec.placement) if rec else [],
                "admitted_at": rec.admitted_at if rec else None, "first_admitted_at": started,
                "ended_at": rec.ended_at if rec else None, "output": run.outputs.get(stage),
                "estimate_s": run.estimates_s.get(stage), "attempts": rec.attempts if rec else 0,
                "estimate": "declared" if _declares(run.spec, stage) else "predicted",
            })
        out = {"id": run.id, "name": run.name, "team": run.team, "owner": run.owner, "state": run.state,
               "submitted_at": run.submitted_at, "ended_at": run.ended_at, "planner": run.planner,
               "makespan_h": run.makespan_h, "replans": run.replans, "parent_run_id": run.parent_run_id,
               "job_id": run.job_id, "stages": stages, "spec": run.spec}
        if specs is not None:
            out["stage_specs"] = specs
        if not self.gate.may_read(p, run.team):
            return {k: out[k] for k in ("id", "name", "team", "state", "submitted_at", "ended_at")} | {
                "redacted": True}
        return out

    # ------------------------------------------------------------------------------------------- service
    def may_go(self, rec: Record) -> bool:
        """For a held record: False while it is a stage whose inputs are not done (its reason says which), or
        once it failed because one never will be (its end lets go of its hold); True when it may go on (not a stage,
        or its inputs are done)."""
        got = self.pipes.stage_of(rec.id)
        if got is None:
            return True
        run, stage = got
        verdict, why = pl.gate(run, stage, {w: self.records[w].state.value for w in run.stages.values()
                                            if w in self.records})
        if verdict == "ready":
            return True
        if verdict == "never":
            self._append(Kind.FINISHED, rec, state=State.FAILED, outcome="pipeline input failed",
                         note=f"failed without running: {why}")
            self._emit(fx.Wake(rec.id))
            return False
        rec.reason, rec.position, rec.reason_data = why, None, {"type": "WaitingForInputs"}
        return False

    def stage_prefer(self, rec: Record, w):
        """``w`` preferring its stage's planned node, then those that hold its inputs (not a stage: ``w``)."""
        got = self.pipes.stage_of(rec.id)
        if got is None:
            return w
        run, stage = got
        placements = {wid: self.records[wid].placement for wid in run.stages.values() if wid in self.records}
        prefer = pl.preferred_nodes(run, stage, placements)
        return replace(w, gang=replace(w.gang, prefer=prefer)) if prefer else w

    def service(self, now: float) -> None:
        """A full tick: pipelines whose stages have all ended end; a stage that overruns re-plans the rest."""
        for run in self.pipes.active():
            states = {w: self.records[w].state.value for w in run.stages.values() if w in self.records}
            end = pl.end_state(run, states)
            if end is not None:
                self.pipes.apply(self.journal.append(Kind.PIPELINE, run.id, event="finished", state=end,
                                                     note=f"pipeline {end.lower()}"))
                continue
            since = {s: self.records[w].admitted_at for s, w in run.stages.items()
                     if w in self.records and self.records[w].state is State.RUNNING and self.records[w].admitted_at}
            late = pl.overrunning(run, since, now, self.policy.pipelines.overrun)
            if late:
                self._replan(run, now, f"stage {', '.join(late)} ran over {self.policy.pipelines.overrun:g}x its "
                                       f"estimate", overrun=late)

    def replan_for_node(self, node_id: str, now: float) -> None:
        """The node ``node_id`` was lost: re-plan each pipeline that counted on it."""
        for run in self.pipes.active():
            started = {s for s, w in run.stages.items() if w in self.records and self.records[w].admitted_at}
            if any((run.plan.get(s) or {}).get("node") == node_id for s in run.stages if s not in started) or any(
                    node_id in self.records[w].placement for s, w in run.stages.items()
                    if w in self.records and not self.records[w].state.terminal):
                self._replan(run, now, f"node {node_id[:12]} was lost")

    def _replan(self, run: pl.PipelineRun, now: float, reason: str, overrun=()) -> None:
        """Plan again the stages that have not started, the others fixed where they ran (``replan_problem``)."""
        from raylane.config import pipeline as ps
        from raylane.planning import PLANNERS

        spec = ps.load_pipeline_spec(run.spec, f"pipeline {run.id}")
        specs = {s: self.records[w].spec for s, w in run.stages.items() if w in self.records}
        nodes = ps.plan_nodes(self.state.nodes.values())
        if not nodes or len(specs) != len(run.stages):
            return
        # Stages planned with a predicted duration keep it: the one journaled at submit.
        predicted = {s: run.estimates_s[s] for s in ps.undeclared(spec) if s in run.estimates_s}
        try:
            problem, network = ps.planning_problem(spec, specs, nodes, self.policy.pipelines.bandwidth_gb_per_h,
                                                   predicted_s=predicted)
        except ValidationError as exc:
            log.warning("re-plan of pipeline %s failed: %s", run.id, exc)
            return
        done, running = {}, {}
        for s, w in run.stages.items():
            rec = self.records[w]
            node = next(iter(rec.placement), None)
            if rec.state is State.SUCCEEDED or rec.state.terminal:
                done[s] = (run.outputs.get(s) or {}).get("node") or node
            elif rec.state.holds_lease and rec.admitted_at:
                est = run.estimates_s.get(s, 0.0)
                elapsed = now - rec.admitted_at
                # An overrunning stage is assumed to need as long again as it has run; others their estimate's rest.
                left = elapsed if s in overrun else max(est - elapsed, 0.1 * est)
                running[s] = (node, left / ps.H)
        try:
            reduced, pinned = ps.replan_problem(problem, nodes, done, running)
            plan = PLANNERS.get("heft").plan(reduced, pinned, network)
        except ValidationError as exc:  # e.g. no node in service holds a stage any more: the queue says so
            log.warning("re-plan of pipeline %s failed: %s", run.id, exc)
            return
        new = {x.stage: {"node": x.node, "start_h": x.start_h, "finish_h": x.finish_h}
               for x in plan.placements if x.stage not in done and x.stage not in running}
        self.pipes.apply(self.journal.append(
            "pipeline", run.id, event="replanned", plan=new, makespan_h=plan.makespan_h, reason=reason,
            overrun=list(overrun), note=f"re-planned {len(new)} stage(s) not started: {reason}"))
        log.info("pipeline %s re-planned (%s): %s", run.id, reason, {s: v["node"][:8] for s, v in new.items()})
        # Stages waiting in the queue take their new first preference now.
        for s in new:
            rec = self.records.get(run.stages[s])
            if rec is not None and self.state.is_pending(rec.id):
                self.state.dequeue(rec.id)
                self.state.enqueue(self._core(rec))
        self._poke()

    def cancel_stages(self, run: pl.PipelineRun, why: str) -> None:
        """Cancel every stage of ``run`` not ended."""
        for w in run.stages.values():
            rec = self.records.get(w)
            if rec is not None and not rec.state.terminal:
                self._cancel(rec, "pipeline", f"cancelled: {why}")



def _declares(spec: Dict[str, Any], stage: str) -> bool:
    """Whether a journaled pipeline spec states the stage's duration (``raylane.config.pipeline.declared``)."""
    st = (spec.get("stages") or {}).get(stage) or {}
    return st.get("duration") is not None or (st.get("workload") or {}).get("runtime_estimate") is not None
