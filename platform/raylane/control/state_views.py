"""The control plane's read calls (a mixin of ``ControlState``): ``find_job``, ``status``, ``queue`` (workloads and
pipelines, with their ETAs), ``explain`` (a workload's journal, its ETA in words, its team's quota) and ``info``;
and the queue's ETAs themselves (``raylane.forecast`` from the live state at most every ``ETA_EVERY_S``: the live
cycle replayed while at most ``ETA_REPLAY_MAX_PENDING`` workloads are pending, a reservation plan beyond that, and
none past ``ETA_MAX_PENDING``; docs/eta.md).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Dict, List, Optional

from raylane import metrics
from raylane.auth import Principal
from raylane.control import api
from raylane.control.journal import Kind
from raylane.control.records import State
from raylane.forecast.types import DEFAULT_HORIZON_S, expected_end, knows_runtime
from raylane.scheduling.cohorts import cohort_path, cohort_row, cohort_usage
from raylane.scheduling.types import LeaseState, Resources

# Queue ETAs (raylane.forecast) are recomputed at most this often, when a full tick, a queue or an explain call asks
# for them, off the actor's loop (``Host.forecast``; docs/eta.md).
ETA_EVERY_S = 10.0
# Up to this many pending, the replay (method "replay"): it runs the live cycle forward, so it plays what the live
# policy does (preemption, quota reclaim, in-quota work first, EASY backfill), but it runs about one cycle per workload
# it sees start: about 0.1 s of CPU at 100 pending on 100 nodes under the default policy. Beyond, the reservation plan
# (method "plan", raylane.forecast.plan): EASY planning up to its EASY_MAX_PENDING (400; about 0.1 to 0.3 s there),
# conservative backfill beyond (tens of ms for 1,000 pending on 100 nodes), with no preemption: under quotas and
# preemption its ETAs are further from what the live policy then does (docs/eta.md measures both).
ETA_REPLAY_MAX_PENDING = 100
# No forecast past this many pending: the plan's 5,000 cost about a quarter of a second every ETA_EVERY_S.
ETA_MAX_PENDING = 5000
# The forecasts' share of the control plane's time at most: after one that took c seconds of CPU, the next starts no
# sooner than c / ETA_MAX_SHARE after it (a burst of submissions would otherwise start one every second).
ETA_MAX_SHARE = 0.1
# The rows whose lease's expected end the queue shows (``_eta_fields``).
_ENDING = (State.ADMITTED, State.RUNNING)


def _gang_text(spec: Dict[str, Any]) -> str:
    g = spec.get("gang", {})
    r = g.get("resources", {})
    parts = [f"{r[k]:g} {k.upper() if k != 'memory' else 'GiB'}" for k in ("gpu", "cpu", "memory") if r.get(k)]
    return f"{g.get('workers', 1)} x ({', '.join(parts) or '-'})"


class ViewCalls:
    """Needs of the state machine: ``clock``, ``journal``, ``records``, ``state``, ``pipes``, ``gate``, ``cycles``,
    ``_started``, ``_stranded``, ``_etas``, ``_etas_at``, ``_gauge_keys``, ``_get``, ``_pipeline_view``."""

    def _api_find_job(self, p: Principal, req: api.FindJob) -> Optional[Dict[str, Any]]:
        """The workload a Ray job registered, if any."""
        for rec in self.records.values():
            if rec.job_id == req.job_id and self.pipes.stage_of(rec.id) is None:
                return self.gate.view(p, rec.public())
        for run in self.pipes.runs.values():  # a pipeline's driver (raylane.pipelines)
            if run.job_id == req.job_id:
                return {**self._pipeline_view(p, run), "kind": "pipeline"}
        return None

    def _api_status(self, p: Principal, req: api.Status) -> Dict[str, Any]:
        return self.gate.view(p, self._get(req.workload_id).public())

    def _api_queue(self, p: Principal, req: api.Queue) -> List[Dict[str, Any]]:
        include_done = req.include_done
        now = self.clock()
        etas = self.etas()
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
                "resizes": rec.resizes, "workers": rec.workers, "detail": rec.detail, **({"owner": rec.owner} if readable else {}),
                **self._eta_fields(etas.get(rec.id) if rec.state is State.PENDING else None,
                                   self.state.leases.get(rec.id) if rec.state in _ENDING else None, now,
                                   basis=readable),
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

    def etas(self) -> Dict[str, Any]:
        """The queue's ETAs (``raylane.forecast``) from the live state, as last forecast: by replay while at most
        ``ETA_REPLAY_MAX_PENDING`` workloads are pending, else by reservation plan, and none while more than
        ``ETA_MAX_PENDING`` are pending. A new forecast starts when this is asked for (a full tick, ``queue``,
        ``explain``) and none is under way: ``ETA_EVERY_S`` after the last one started, or a second after when a
        workload queued since has none; never sooner than the last one's CPU time over ``ETA_MAX_SHARE``. It runs
        on the host (``Host.forecast``) over a copy of the state: the actor's host runs it on a thread of its own,
        and until it is done this answers the forecast before it."""
        now = self.clock()
        n = self.state.pending_count()
        if self._eta_running:
            return self._etas
        if self._etas_at is not None:
            since, least = now - self._etas_at, self._eta_cpu_s / ETA_MAX_SHARE
            if since < max(ETA_EVERY_S, least) and not (
                    # A workload queued since the last forecast has none yet: forecast again, at most once a second.
                    since >= max(1.0, least) and n <= ETA_MAX_PENDING
                    and any(w.id not in self._etas for w in self.state.pending())):
                return self._etas
        self._etas_at = now
        if not 0 < n <= ETA_MAX_PENDING:
            self._etas = {}
            return self._etas
        from raylane.forecast import forecast_interval

        state = self.state.copy()
        method = "replay" if n <= ETA_REPLAY_MAX_PENDING else "plan"
        stopping = {wid: self.records[wid].stop_deadline for wid in self.state.leases
                    if wid in self.records and self.records[wid].stop_deadline is not None}
        self._eta_running = True
        try:
            self.host.forecast(lambda: forecast_interval(state, now, method=method, stopping_ends=stopping),
                               self._forecast_done)
        except BaseException:
            self._eta_running = False
            raise
        return self._etas

    def _forecast_done(self, etas: Dict[str, Any], wall_s: float, cpu_s: float) -> None:
        """Event: a forecast ``etas`` started has given its ETAs (``Host.forecast``; None: it failed, the ETAs
        before it stay), in ``wall_s`` seconds and ``cpu_s`` of CPU."""
        self._eta_running = False
        self._eta_cpu_s = cpu_s
        if etas is not None:
            self._etas = etas
        metrics.ETA_SECONDS.observe(wall_s)

    def _export_etas(self) -> None:
        """The longest forecast wait per team and class (``raylane_queue_eta_wait_seconds``), and the longest with
        every runtime at its 10th and 90th percentile (``..._low_seconds``, ``..._high_seconds``: ``Eta.start_low``,
        ``start_high``; a 90th-percentile start past the forecast's horizon counts as the horizon); -1 where none
        (and for the interval, where no runtime is learned).

        Per forecast, each team and class's starts are sorted once, latest first; a tick then reads down each list
        to the first workload still pending (those admitted since the forecast are skipped), so that it costs about
        one look per team and class and gauge, not one per pending workload."""
        gauges = (("start", metrics.QUEUE_ETA_WAIT, "_last_eta"),
                  ("low", metrics.QUEUE_ETA_WAIT_LOW, "_last_eta_low"),
                  ("high", metrics.QUEUE_ETA_WAIT_HIGH, "_last_eta_high"))
        now = self.clock()
        etas = self.etas()
        made = self._eta_starts
        if made is None or made[0] is not etas:
            by_key: Dict[str, Dict[tuple, list]] = {name: {} for name, _, _ in gauges}
            for wid, eta in etas.items():
                rec = self.records.get(wid)
                if rec is None or eta.start is None:
                    continue
                key = (rec.team, rec.cls)
                by_key["start"].setdefault(key, []).append((eta.start, wid))
                if eta.start_low is not None:  # an interval: runtimes are learned (forecast_interval)
                    high = eta.start_high if eta.start_high is not None else now + DEFAULT_HORIZON_S
                    by_key["low"].setdefault(key, []).append((eta.start_low, wid))
                    by_key["high"].setdefault(key, []).append((high, wid))
            for lists in by_key.values():
                for starts in lists.values():
                    starts.sort(reverse=True)
            made = self._eta_starts = (etas, by_key)
        waiting: Dict[tuple, float] = {}
        for name, gauge, last in gauges:
            # The interval's gauges read -1 for a team and class that waits without one.
            longest: Dict[tuple, float] = dict.fromkeys(waiting, -1.0)
            for key, starts in made[1][name].items():
                for start, wid in starts:
                    rec = self.records.get(wid)
                    if rec is not None and rec.state is State.PENDING:  # else admitted since the forecast
                        longest[key] = max(0.0, start - now)
                        break
            if name == "start":
                waiting = longest
            for (team, cls), v in self._gauge_keys(longest, last).items():
                gauge.set(v if (team, cls) in longest else -1, team=team, workload_class=cls)

    @staticmethod
    def _eta_fields(eta, lease=None, now: float = 0.0, *, basis: bool = True, low: float = 0.1,
                    high: float = 0.9) -> Dict[str, Any]:
        """What a queue row says of the future. A pending workload's ETA (``eta``): ``eta_start``, ``eta_finish``
        and, where runtimes are learned, ``eta_start_low``, ``eta_start_high`` and ``eta_basis``. A ``lease``'s
        expected end seen at ``now`` (``raylane.forecast.types.expected_end``, the forecast's own rule), where its runtime is
        known (an estimate or a learned prediction): ``predicted_end`` and, where learned, ``predicted_end_low`` and
        ``predicted_end_high`` (its end if it runs for the ``low`` and ``high`` quantiles of what it has left, as
        ``forecast_interval``'s) and ``predicted_basis`` (what that rests on). Without ``basis`` (a row of another
        team's workload) no basis: it names the owner ("3 runs of alice/pretrain-x")."""
        out: Dict[str, Any] = {}
        if eta is not None:
            out.update(eta_start=eta.start, eta_finish=eta.finish)
            if eta.start_low is not None or eta.basis:
                out.update(eta_start_low=eta.start_low, eta_start_high=eta.start_high)
                if basis:
                    out["eta_basis"] = eta.basis
        if lease is not None and lease.state is LeaseState.RUNNING and knows_runtime(lease.workload):
            w = lease.workload
            # default_runtime_s is not read: the runtime is known.
            out["predicted_end"] = expected_end(lease, now, default_runtime_s=0.0)
            if w.predicted is not None:
                ran = w.ran_s + max(0.0, now - lease.start_time)
                out.update(predicted_end_low=expected_end(lease, now, default_runtime_s=0.0, q=low),
                           predicted_end_high=expected_end(lease, now, default_runtime_s=0.0, q=high))
                if basis:
                    out["predicted_basis"] = w.predicted.describe(ran)
        return out

    def _api_explain(self, p: Principal, req: api.Explain) -> Dict[str, Any]:
        wid = req.workload_id
        rec = self._get(wid)
        out = self.gate.view(p, rec.public())
        if self.gate.may_read(p, rec.team):
            out["journal"] = [{"ts": e.ts, "kind": e.kind, **e.data} for e in self.journal.entries_for(wid)
                              if e.kind != Kind.AUDIT]
        if rec.state is State.PENDING:
            from raylane.forecast import describe

            eta = self.etas().get(wid)
            if eta is not None:
                # What its runtime rests on names its owner: for its team and operators only.
                readable = self.gate.may_read(p, rec.team)
                if not readable:
                    eta = replace(eta, basis="")
                out.update(self._eta_fields(eta, basis=readable))
                out["eta_text"] = describe(eta, self.clock())
        lease = self.state.leases.get(wid)
        if lease is not None:  # when it is expected to end, and what that rests on
            out.update(self._eta_fields(None, lease, self.clock(), basis=self.gate.may_read(p, rec.team)))
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

    def _api_info(self, p: Principal, req: api.Info) -> Dict[str, Any]:
        return {"auth": self.gate.enabled, "cycles": self.cycles, "nodes": len(self.state.nodes), "pending": self.state.pending_count(),
                "leases": len(self.state.leases), "journal": self.journal.path, "started": self._started,
                "stranded_gpus": dict(self._stranded.stranded) if self._stranded else {},
                "free_gpus": dict(self._stranded.free) if self._stranded else {},
                "scheduler": self.state.config.__dict__ if hasattr(self.state.config, "__dict__") else
                {k: getattr(self.state.config, k) for k in self.state.config.__dataclass_fields__}}
