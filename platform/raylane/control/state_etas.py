"""The queue's ETAs in the control plane (a role of ``raylane.control.state.ControlState``; docs/eta.md).

``raylane.forecast`` from the live state at most every ``ETA_EVERY_S``: the live cycle replayed while at most
``ETA_REPLAY_MAX_PENDING`` workloads are pending, a reservation plan beyond that, and none past ``ETA_MAX_PENDING``;
run on the host (``Host.forecast``: the actor's on a thread of its own) over a copy of the state. ``export`` keeps
the ETA gauges; ``eta_fields`` is what a queue row or an explain says of the future.

Owns the last forecast's ETAs, when it started, its CPU time, whether one is under way and its starts sorted per team
and class (for the gauges). Handed the clock, the records, the ``ClusterState`` (getter: a policy reload replaces it)
and the host.
"""
from __future__ import annotations

from typing import Any, Callable, Dict

from raylane import metrics
from raylane.control.records import State
from raylane.control.state_gauges import GaugeKeys
from raylane.forecast.types import DEFAULT_HORIZON_S, expected_end, knows_runtime
from raylane.scheduling.types import LeaseState

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


class QueueEtas:
    """The queue's ETAs, as last forecast (module docstring)."""

    def __init__(self, *, clock: Callable[[], float], records, state: Callable[[], Any], host):
        self.clock, self.records, self._state, self.host = clock, records, state, host
        self._etas: Dict[str, Any] = {}  # pending workload id -> its raylane.forecast.Eta (``current``)
        self._etas_at = None
        self._eta_cpu_s = 0.0  # the CPU time of the last forecast (``current``: the next waits in proportion)
        self._eta_running = False  # a forecast is under way on the host (``current``)
        self._eta_starts = None  # (the ETAs, their starts per team and class, latest first): ``export``
        self._keys = GaugeKeys()

    @property
    def state(self):
        return self._state()

    @property
    def last(self) -> Dict[str, Any]:
        """The ETAs of the last forecast, starting none."""
        return self._etas

    def current(self) -> Dict[str, Any]:
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

    def export(self) -> None:
        """The longest forecast wait per team and class (``raylane_queue_eta_wait_seconds``), and the longest with
        every runtime at its 10th and 90th percentile (``..._low_seconds``, ``..._high_seconds``: ``Eta.start_low``,
        ``start_high``; a 90th-percentile start past the forecast's horizon counts as the horizon); -1 where none
        (and for the interval, where no runtime is learned).

        Per forecast, each team and class's starts are sorted once, latest first; a tick then reads down each list
        to the first workload still pending (those admitted since the forecast are skipped), so that it costs about
        one look per team and class and gauge, not one per pending workload."""
        gauges = (("start", metrics.QUEUE_ETA_WAIT, "eta"),
                  ("low", metrics.QUEUE_ETA_WAIT_LOW, "eta_low"),
                  ("high", metrics.QUEUE_ETA_WAIT_HIGH, "eta_high"))
        now = self.clock()
        etas = self.current()
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
            for (team, cls), v in self._keys(longest, last).items():
                gauge.set(v if (team, cls) in longest else -1, team=team, workload_class=cls)


def eta_fields(eta, lease=None, now: float = 0.0, *, basis: bool = True, low: float = 0.1,
               high: float = 0.9) -> Dict[str, Any]:
    """What a queue row says of the future. A pending workload's ETA (``eta``): ``eta_start``, ``eta_finish``
    and, where runtimes are learned, ``eta_start_low``, ``eta_start_high`` and ``eta_basis``. A ``lease``'s
    expected end seen at ``now`` (``raylane.forecast.types.expected_end``, the forecast's own rule), where its runtime
    is known (an estimate or a learned prediction): ``predicted_end`` and, where learned, ``predicted_end_low`` and
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
