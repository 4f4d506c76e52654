"""The control plane's queue ETAs by method, without Ray: ``ControlState.etas`` forecasts by replay while at most
``ETA_REPLAY_MAX_PENDING`` workloads are pending and by reservation plan beyond (``raylane.control.state_views``),
driven by the fake clock and host of ``tests/controltest.py`` on the Ray tests' cluster (two nodes of 2 GPUs,
``policies/local.yaml``). The threshold is lowered for the test so that a handful of workloads cross it.
"""
from __future__ import annotations

import pytest

import raylane.forecast as fc
from raylane.control import state_views
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
    real = fc.forecast

    def recorded(*args, **kw):
        asked.append(kw.get("method", "replay"))
        return real(*args, **kw)

    monkeypatch.setattr(fc, "forecast", recorded)
    monkeypatch.setattr(state_views, "ETA_REPLAY_MAX_PENDING", 3)
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
