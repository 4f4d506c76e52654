"""The control plane's queue ETAs by method, without Ray: ``ControlState.etas`` forecasts by replay while at most
``ETA_REPLAY_MAX_PENDING`` workloads are pending and by reservation plan beyond (``raylane.control.state_etas``),
driven by the fake clock and host of ``tests/controltest.py`` on the Ray tests' cluster (two nodes of 2 GPUs,
``policies/local.yaml``). The threshold is lowered for the test so that a handful of workloads cross it.
"""
from __future__ import annotations

import pytest

import raylane.forecast as fc
import raylane.forecast.replay as fc_replay
from raylane.control import state_etas
from tests.controltest import Harness
from tests.raytest import local_policy, spec


@pytest.fixture
def h(tmp_path):
    harness = Harness(str(tmp_path / "journal.db"), local_policy())
    yield harness
    harness.close()


@pytest.fixture
def methods(monkeypatch):
    """The forecast methods ``etas()`` asked for, in order (the forecast itself runs unchanged)."""
    asked = []
    real = fc_replay.forecast  # replaced where forecast_interval looks it up

    def recorded(*args, **kw):
        asked.append(kw.get("method", "replay"))
        return real(*args, **kw)

    monkeypatch.setattr(fc_replay, "forecast", recorded)
    monkeypatch.setattr(state_etas, "ETA_REPLAY_MAX_PENDING", 3)
    return asked


def _submit(h, name: str, team: str, *, workers: int, gpu: float, estimate: str) -> str:
    s = spec(name, team, "pretrain", workers=workers, gpu=gpu)
    s["runtime_estimate"] = estimate
    return h.call("submit", spec=s)["id"]


@pytest.mark.parametrize("waiting, method", [(2, "replay"), (3, "replay"), (6, "plan")])
def test_etas_use_the_plan_past_the_replay_limit_and_give_every_pending_workload_one(h, methods, waiting, method):
    # A 2 x 2-GPU gang of team-a estimated at 10 minutes fills both nodes; then ``waiting`` 1-GPU workloads of
    # 5 minutes each, alternating teams, wait for it.
    big = _submit(h, "big", "team-a", workers=2, gpu=2, estimate="10m")
    h.tick()
    h.call("report", workload_id=big, kind="running")
    end = h.cs.records[big].admitted_at + 600
    h.clock.advance(30)
    ids = [_submit(h, f"w{i}", ("team-a", "team-b")[i % 2], workers=1, gpu=1, estimate="5m") for i in range(waiting)]
    h.tick()
    assert h.cs.state.pending_count() == waiting

    etas = h.cs.etas()

    assert methods[-1] == method
    assert set(etas) == set(ids)
    starts = [etas[i].start for i in ids]
    assert all(s is not None for s in starts)
    # Nothing starts before the gang's GPUs come back; four fit at once then, the rest when those 5 minutes end.
    assert min(starts) == pytest.approx(end)
    assert max(starts) == pytest.approx(end + (300 if waiting > 4 else 0))
    rows = {r["id"]: r for r in h.call("queue")}
    assert all(rows[i]["eta_start"] == pytest.approx(etas[i].start) for i in ids)


class _HeldForecasts:
    """A host's ``forecast`` as the actor's runs it, on a thread, made explicit: each forecast is held until the
    test finishes it (``finish``), reporting the CPU time it is told to."""

    def __init__(self, h):
        self.held = []
        h.host.forecast = lambda run, done: self.held.append((run, done))

    def finish(self, cpu_s: float = 0.01):
        run, done = self.held.pop(0)
        done(run(), cpu_s, cpu_s)


def _waiting(h, n: int, prefix: str = "w"):
    """A gang that fills both nodes, then ``n`` 1-GPU workloads of its team waiting behind it."""
    if not h.cs.state.leases:
        big = _submit(h, "big", "team-a", workers=2, gpu=2, estimate="10m")
        h.tick()
        h.call("report", workload_id=big, kind="running")
    return [_submit(h, f"{prefix}{i}", "team-a", workers=1, gpu=1, estimate="5m") for i in range(n)]


def _first_forecast(h, n: int, cpu_s: float = 0.01):
    """``n`` workloads waiting (``_waiting``), a second, and a full tick's forecast of them finished, having taken
    ``cpu_s`` of CPU: (the held forecasts, the waiting ids)."""
    held = _HeldForecasts(h)
    ids = _waiting(h, n)
    h.clock.advance(1)
    h.tick()
    held.finish(cpu_s)
    return held, ids


def test_a_forecast_under_way_answers_the_one_before_and_starts_no_other(h):
    held = _HeldForecasts(h)
    first = _waiting(h, 2)
    h.clock.advance(1)
    h.tick()  # a full tick asks for ETAs: one forecast starts, none is done yet
    assert len(held.held) == 1 and h.cs.etas() == {}
    held.finish()
    assert set(h.cs.etas()) == set(first)

    h.clock.advance(2)
    more = _waiting(h, 2, prefix="x")
    h.tick()  # workloads without an ETA, a second since the last: a new forecast, on a copy of the state
    assert len(held.held) == 1
    h.clock.advance(20)
    h.tick()
    h.call("queue")
    assert len(held.held) == 1, "a second forecast started while one was under way"
    rows = {r["id"]: r for r in h.call("queue")}  # meanwhile: the forecast before
    assert all("eta_start" in rows[i] for i in first) and not any("eta_start" in rows[i] for i in more)
    held.finish()
    assert set(h.cs.etas()) == set(first + more)


def test_a_forecast_that_fails_keeps_the_etas_before_it(h):
    held, ids = _first_forecast(h, 2)
    before = h.cs.etas()
    h.clock.advance(state_etas.ETA_EVERY_S)
    h.tick()
    run, done = held.held.pop(0)
    done(None, 0.01, 0.01)  # what the actor's host gives for a forecast that raised
    assert h.cs.etas() is before and set(before) == set(ids)
    h.clock.advance(state_etas.ETA_EVERY_S)
    h.tick()
    assert len(held.held) == 1, "no forecast after a failed one"


def test_forecasts_take_at_most_their_share_of_the_control_planes_time(h):
    # A forecast that took 3 s of CPU: the next waits 3 / ETA_MAX_SHARE = 30 s, past both ETA_EVERY_S and the
    # second after which a workload with no ETA asks for one.
    cost = 3.0
    wait = cost / state_etas.ETA_MAX_SHARE
    assert wait > state_etas.ETA_EVERY_S
    held, _ = _first_forecast(h, 2, cpu_s=cost)
    started = h.clock()
    _waiting(h, 1, prefix="x")
    while h.clock() - started < wait - 1:
        h.clock.advance(1)
        h.tick()
        assert not held.held, f"a forecast started {h.clock() - started:.0f} s after one of {cost:g} s of CPU"
    h.clock.advance(1)
    h.tick()
    assert len(held.held) == 1
    held.finish(cpu_s=0.01)  # a cheap one: the cadence is ETA_EVERY_S again, and a second for a new workload
    h.clock.advance(1)
    _waiting(h, 1, prefix="y")
    h.tick()
    assert len(held.held) == 1


def test_a_workload_admitted_since_the_last_forecast_shows_no_eta(h):
    _, ids = _first_forecast(h, 1)
    assert ids[0] in h.cs.etas()
    big = next(r["id"] for r in h.call("queue") if r["state"] != "PENDING")
    h.call("release", workload_id=big, outcome="finished", state="SUCCEEDED")
    h.tick()  # the waiting workload takes the freed GPUs; the forecast, not redone yet, still names it
    assert ids[0] in h.cs.etas()
    rows = {r["id"]: r for r in h.call("queue")}
    assert rows[ids[0]]["state"] != "PENDING" and "eta_start" not in rows[ids[0]]


# ------------------------------------------------------------------- running leases' ends and the interval gauges
def _gauge(name: str, team: str = "team-a", cls: str = "pretrain") -> float:
    from raylane import metrics

    return metrics.snapshot(name)[(name, (("team", team), ("workload_class", cls)))]


def _history(h, *seconds: float, name: str = "pretrain-x") -> None:
    """Whole-cluster gangs of ``name`` that ran ``seconds`` each and succeeded: what the runtime model learns."""
    for s in seconds:
        wid = h.call("submit", spec=spec(name, "team-a", "pretrain", workers=2, gpu=2))["id"]
        h.tick()
        h.call("report", workload_id=wid, kind="running")
        h.clock.advance(s)
        h.call("release", workload_id=wid, outcome="finished", state="SUCCEEDED")
        h.tick()


@pytest.fixture
def learned(tmp_path):
    """Three runs of 10, 20 and 40 minutes learned; a fourth running on the whole cluster for a minute now, a fifth
    waiting behind it: (harness, running id, waiting id)."""
    harness = Harness(str(tmp_path / "journal.db"), local_policy(pretrain={"min_runtime": 0}))
    _history(harness, 600, 1200, 2400)
    running = harness.call("submit", spec=spec("pretrain-x", "team-a", "pretrain", workers=2, gpu=2))["id"]
    harness.tick()
    harness.call("report", workload_id=running, kind="running")
    harness.clock.advance(60)
    waiting = harness.call("submit", spec=spec("pretrain-x", "team-a", "pretrain", workers=2, gpu=2))["id"]
    harness.tick()
    yield harness, running, waiting
    harness.close()


def test_a_running_leases_row_carries_its_predicted_end_with_the_interval_and_basis(learned):
    h, running, waiting = learned
    now = h.clock()
    dist = h.cs.state.leases[running].workload.predicted
    rows = {r["id"]: r for r in h.call("queue")}
    run, wait = rows[running], rows[waiting]
    # What it has left given the minute it ran: the 10th, 50th and 90th percentile of the runs longer than that.
    assert run["predicted_end"] == pytest.approx(now + dist.remaining(60, 0.5))
    assert run["predicted_end_low"] == pytest.approx(now + dist.remaining(60, 0.1))
    assert run["predicted_end_high"] == pytest.approx(now + dist.remaining(60, 0.9))
    assert now < run["predicted_end_low"] < run["predicted_end"] < run["predicted_end_high"] <= now + 2400
    assert run["predicted_basis"] == dist.describe(60)
    assert run["predicted_basis"].startswith("3 runs of pytest/pretrain-x: median 20m")
    # The one waiting behind it starts when it ends, at each end of the interval too: one rule for both rows.
    assert wait["eta_start"] == pytest.approx(run["predicted_end"], abs=5)
    assert wait["eta_start_low"] == pytest.approx(run["predicted_end_low"], abs=5)
    assert wait["eta_start_high"] == pytest.approx(run["predicted_end_high"], abs=5)
    assert "predicted_end" not in wait and not any(k.startswith("eta_") for k in run)


def test_a_lease_whose_runtime_nobody_knows_has_no_predicted_end_and_a_declared_one_its_estimate(h):
    unknown = h.call("submit", spec=spec("u", "team-a", "pretrain", workers=1, gpu=2))["id"]
    declared = _submit(h, "d", "team-b", workers=1, gpu=2, estimate="10m")
    h.tick()
    for wid in (unknown, declared):
        h.call("report", workload_id=wid, kind="running")
    h.clock.advance(120)
    rows = {r["id"]: r for r in h.call("queue")}
    assert not any(k.startswith("predicted_") for k in rows[unknown])
    end = h.cs.records[declared].admitted_at + 600
    assert rows[declared]["predicted_end"] == pytest.approx(end)
    assert rows[declared]["predicted_end_low"] == pytest.approx(end) == rows[declared]["predicted_end_high"]


def test_another_teams_rows_carry_the_forecast_but_not_what_it_rests_on(tmp_path):
    # The basis names the owner ("3 runs of alice/pretrain-x"), which another team's member does not see.
    h = Harness(str(tmp_path / "journal.db"), local_policy(pretrain={"min_runtime": 0}), auth={"enabled": True})
    try:
        alice = h.cs.gate.add_token(user="alice", teams=["team-a"], role="member", created_by="test")
        bob = h.cs.gate.add_token(user="bob", teams=["team-b"], role="member", created_by="test")
        for s in (600, 1200, 2400):
            wid = h.call("submit", alice, spec=spec("pretrain-x", "team-a", "pretrain", workers=2, gpu=2))["id"]
            h.tick()
            h.call("report", alice, workload_id=wid, kind="running")
            h.clock.advance(s)
            h.call("release", alice, workload_id=wid, outcome="finished", state="SUCCEEDED")
            h.tick()
        running = h.call("submit", alice, spec=spec("pretrain-x", "team-a", "pretrain", workers=2, gpu=2))["id"]
        h.tick()
        h.call("report", alice, workload_id=running, kind="running")
        h.clock.advance(60)
        waiting = h.call("submit", alice, spec=spec("pretrain-x", "team-a", "pretrain", workers=2, gpu=2))["id"]
        h.tick()
        mine = {r["id"]: r for r in h.call("queue", alice)}
        theirs = {r["id"]: r for r in h.call("queue", bob)}
        assert "alice/pretrain-x" in mine[running]["predicted_basis"] and "alice" in mine[waiting]["eta_basis"]
        for wid in (running, waiting):
            assert not {"predicted_basis", "eta_basis", "owner"} & set(theirs[wid])
        assert theirs[running]["predicted_end_high"] == mine[running]["predicted_end_high"]
        assert theirs[waiting]["eta_start_low"] == mine[waiting]["eta_start_low"]
    finally:
        h.close()


def test_the_interval_gauges_export_the_longest_wait_at_each_end(learned):
    h, running, waiting = learned
    h.clock.advance(state_etas.ETA_EVERY_S)
    h.tick()  # a new forecast, and the gauges from it
    now = h.clock()
    e = h.cs.etas()[waiting]
    assert e.start_low < e.start < e.start_high
    assert _gauge("raylane_queue_eta_wait_seconds") == pytest.approx(e.start - now)
    assert _gauge("raylane_queue_eta_wait_low_seconds") == pytest.approx(e.start_low - now)
    assert _gauge("raylane_queue_eta_wait_high_seconds") == pytest.approx(e.start_high - now)
    # The lease ends early: the waiting one is admitted, and the gauges read -1 before the next forecast.
    h.call("release", workload_id=running, outcome="finished", state="SUCCEEDED")
    h.tick()
    assert h.record(waiting).state.value != "PENDING"
    for name in ("raylane_queue_eta_wait_seconds", "raylane_queue_eta_wait_low_seconds",
                 "raylane_queue_eta_wait_high_seconds"):
        assert _gauge(name) == -1, name


def test_without_a_learned_or_declared_runtime_the_interval_gauges_read_minus_one(h):
    # No estimate and no history: the forecast takes the class's runtime and has no interval.
    first = h.call("submit", spec=spec("big", "team-b", "pretrain", workers=2, gpu=2))["id"]
    h.tick()
    h.call("report", workload_id=first, kind="running")
    h.clock.advance(1.1)
    h.call("submit", spec=spec("next", "team-b", "pretrain", workers=1, gpu=2))
    h.tick()
    assert _gauge("raylane_queue_eta_wait_seconds", "team-b") > 0
    assert _gauge("raylane_queue_eta_wait_low_seconds", "team-b") == -1
    assert _gauge("raylane_queue_eta_wait_high_seconds", "team-b") == -1


def test_a_high_end_past_the_horizon_counts_as_the_horizon(h, monkeypatch):
    # As forecast_interval gives it when the 90th-percentile forecast does not start the workload within the
    # horizon: a start and a low end, no high end.
    from dataclasses import replace

    from raylane.forecast.types import DEFAULT_HORIZON_S

    real = fc.forecast_interval
    monkeypatch.setattr(fc, "forecast_interval", lambda *a, **kw: {
        wid: replace(e, start_low=e.start, start_high=None) for wid, e in real(*a, **kw).items()})
    ids = _waiting(h, 1)
    h.clock.advance(1.1)
    h.tick()
    eta = h.cs.etas()[ids[0]]
    assert eta.start is not None and eta.start_high is None
    assert _gauge("raylane_queue_eta_wait_high_seconds") == pytest.approx(DEFAULT_HORIZON_S)
    assert _gauge("raylane_queue_eta_wait_low_seconds") == pytest.approx(eta.start - h.clock())
