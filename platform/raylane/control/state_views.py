"""The control plane's read calls (a role of ``raylane.control.state.ControlState``): ``find_job``, ``status``,
``queue`` (workloads and pipelines, with their ETAs), ``explain`` (a workload's journal, its ETA in words, its team's
quota) and ``info``. The ETAs themselves are ``state_etas``'.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable, Dict, List, Optional

from raylane.auth import Principal
from raylane.control import api
from raylane.control.journal import Kind
from raylane.control.records import State
from raylane.control.state_etas import eta_fields
from raylane.control.state_requests import record_of
from raylane.scheduling.cohorts import cohort_path, cohort_row, cohort_usage
from raylane.scheduling.types import Resources

# The rows whose lease's expected end the queue shows (``eta_fields``).
_ENDING = (State.ADMITTED, State.RUNNING)


def _gang_text(spec: Dict[str, Any]) -> str:
    g = spec.get("gang", {})
    r = g.get("resources", {})
    parts = [f"{r[k]:g} {k.upper() if k != 'memory' else 'GiB'}" for k in ("gpu", "cpu", "memory") if r.get(k)]
    return f"{g.get('workers', 1)} x ({', '.join(parts) or '-'})"


class Views:
    """The read calls. Handed the clock, the journal, the records, the ``ClusterState`` (getter: a policy reload
    replaces it), the pipeline book, the gate (what a caller may read), the queue's ETAs (``state_etas.QueueEtas``),
    ``pipeline_view`` (``Pipelines.view``), the gauges (the stranded GPUs of the last tick), ``cycles`` (how many
    cycles have run) and when the control plane started."""

    def __init__(self, *, clock: Callable[[], float], journal, records, state: Callable[[], Any], pipes, gate, etas,
                 pipeline_view: Callable[..., Dict[str, Any]], gauges, cycles: Callable[[], int], started: float):
        self.clock, self.journal, self.records, self._state = clock, journal, records, state
        self.pipes, self.gate, self.etas, self._pipeline_view = pipes, gate, etas, pipeline_view
        self.gauges, self._cycles, self._started = gauges, cycles, started

    @property
    def state(self):
        return self._state()

    def find_job(self, p: Principal, req: api.FindJob) -> Optional[Dict[str, Any]]:
        """The workload a Ray job registered, if any."""
        for rec in self.records.values():
            if rec.job_id == req.job_id and self.pipes.stage_of(rec.id) is None:
                return self.gate.view(p, rec.public())
        for run in self.pipes.runs.values():  # a pipeline's driver (raylane.pipelines)
            if run.job_id == req.job_id:
                return {**self._pipeline_view(p, run), "kind": "pipeline"}
        return None

    def status(self, p: Principal, req: api.Status) -> Dict[str, Any]:
        return self.gate.view(p, record_of(self.records, req.workload_id).public())

    def queue(self, p: Principal, req: api.Queue) -> List[Dict[str, Any]]:
        include_done = req.include_done
        now = self.clock()
        etas = self.etas.current()
        rows = []
        for rec in self.records.values():
            if rec.state.terminal and not include_done:
                continue
            readable = self.gate.may_read(p, rec.team)
            rows.append({
                "id": rec.id, "team": rec.team, "class": rec.cls, "kind": rec.spec.get("kind", "train"),
                "state": rec.state.value, "resources": _gang_text(rec.spec),
                "waited_s": (rec.admitted_at or now) - rec.submit_time if rec.state is not State.REJECTED else 0,
                "position": rec.position, "reason": rec.reason, "preemptions": rec.preemptions,
                "resizes": rec.resizes, "workers": rec.workers, "detail": rec.detail,
                **({"owner": rec.owner} if readable else {}),
                **eta_fields(etas.get(rec.id) if rec.state is State.PENDING else None,
                             self.state.leases.get(rec.id) if rec.state in _ENDING else None, now, basis=readable),
            })
            got = self.pipes.stage_of(rec.id)
            if got is not None:
                rows[-1].update(pipeline=got[0].id, stage=got[1])
        rows.sort(key=lambda r: (r["position"] is None, r["position"] or 0, r["state"], r["id"]))
        for run in self.pipes.runs.values():
            if run.terminal and not include_done:
                continue
            states = [self.records[w].state.value for w in run.stages.values() if w in self.records]
            running = [s for s, w in run.stages.items() if w in self.records and self.records[w].state.holds_lease]
            rows.append({
                "id": run.id, "team": run.team, "class": run.spec.get("class") or "-", "kind": "pipeline",
                "state": run.state, "resources": f"{len(run.stages)} stages",
                "waited_s": (run.ended_at or now) - run.submitted_at, "position": None,
                "reason": f"{states.count('SUCCEEDED')}/{len(run.stages)} stages done"
                          + (f"; running {', '.join(running)}" if running else ""),
                "preemptions": 0,
                "detail": f"planned makespan {run.makespan_h * 60:.1f} min ({run.planner})"
                          + (f", re-planned {len(run.replans)}x" if run.replans else ""),
                **({"owner": run.owner} if self.gate.may_read(p, run.team) else {}),
            })
        return rows

    def explain(self, p: Principal, req: api.Explain) -> Dict[str, Any]:
        wid = req.workload_id
        rec = record_of(self.records, wid)
        out = self.gate.view(p, rec.public())
        if self.gate.may_read(p, rec.team):
            out["journal"] = [{"ts": e.ts, "kind": e.kind, **e.data} for e in self.journal.entries_for(wid)
                              if e.kind != Kind.AUDIT]
        if rec.state is State.PENDING:
            from raylane.forecast import describe

            eta = self.etas.current().get(wid)
            if eta is not None:
                # What its runtime rests on names its owner: for its team and operators only.
                readable = self.gate.may_read(p, rec.team)
                if not readable:
                    eta = replace(eta, basis="")
                out.update(eta_fields(eta, basis=readable))
                out["eta_text"] = describe(eta, self.clock())
        lease = self.state.leases.get(wid)
        if lease is not None:  # when it is expected to end, and what that rests on
            out.update(eta_fields(None, lease, self.clock(), basis=self.gate.may_read(p, rec.team)))
        team = self.state.teams.get(rec.team)
        if team is not None:
            used = self.state.usage.get(rec.team, Resources())
            out["team_quota"] = {r: {"used": used.get(r), "nominal": q.nominal, "borrowing_limit": q.borrowing_limit,
                                     "lending_limit": q.lending_limit} for r, q in team.quotas.items()}
            if team.flavors:  # its GPUs per node type, against each flavor quota
                from raylane.scheduling.flavors import flavor_usage

                held = flavor_usage(self.state.leases.values(), self.state.nodes.values(),
                                    {rec.team: team}).get(rec.team, {})
                out["team_flavors"] = {t: {"used": held.get(t, 0.0), "nominal": q.nominal,
                                           "borrowing_limit": q.borrowing_limit, "lending_limit": q.lending_limit}
                                       for t, q in sorted(team.flavors.items())}
            path = cohort_path(team)
            if path:  # the cohorts it borrows through, nearest last, each with its numbers now
                rows = cohort_usage(self.state.teams, self.state.usage)
                out["team_cohorts"] = [cohort_row(rows[c]) for c in path if c in rows]
        return out

    def info(self, p: Principal, req: api.Info) -> Dict[str, Any]:
        stranded = self.gauges.stranded
        return {"auth": self.gate.enabled, "cycles": self._cycles(), "nodes": len(self.state.nodes),
                "pending": self.state.pending_count(), "leases": len(self.state.leases), "journal": self.journal.path,
                "started": self._started,
                "stranded_gpus": dict(stranded.stranded) if stranded else {},
                "free_gpus": dict(stranded.free) if stranded else {},
                "scheduler": self.state.config.__dict__ if hasattr(self.state.config, "__dict__") else
                {k: getattr(self.state.config, k) for k in self.state.config.__dataclass_fields__}}
