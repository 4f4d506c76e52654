"""Runtimes learned by the control plane (``raylane.control.learned``), without Ray: every workload that ends
teaches the model, a restart rebuilds it from the journal, and the queue's ETAs carry the interval and the basis
(``forecast_interval``). Driven by the fake clock and host of ``tests/controltest.py`` on two nodes of 2 GPUs."""
from __future__ import annotations

import pytest

from raylane.cli.cluster import eta_cell, explain_lines, queue_cells
from tests.controltest import Harness
from tests.raytest import local_policy, spec


@pytest.fixture
def h(tmp_path):
    harness = Harness(str(tmp_path / "journal.db"), local_policy(pretrain={"min_runtime": 0}))
    yield harness
    harness.close()


def _run(h, name: str, seconds: float, *, gpu: float = 2, workers: int = 2, state="SUCCEEDED") -> str:
    """Submit ``name`` (a whole-cluster gang by default), let it run ``seconds`` and end in ``state``."""
    wid = h.call("submit", spec=spec(name, "team-a", "pretrain", workers=workers, gpu=gpu))["id"]
    h.tick()
    assert h.record(wid).state.value == "ADMITTED"
    h.call("report", workload_id=wid, kind="running")
    h.clock.advance(seconds)
    h.call("release", workload_id=wid, outcome="finished" if state == "SUCCEEDED" else "failed", state=state)
    h.tick()
    return wid


def test_ends_teach_the_model_and_the_next_run_is_predicted_from_them(h):
    for s in (1200, 1800, 2400):
        _run(h, "pretrain-x", s)
    wid = h.call("submit", spec=spec("pretrain-x", "team-a", "pretrain", workers=2, gpu=2))["id"]
    rec = h.record(wid)
    d = h.cs.runtimes.predict(rec)
    assert h.cs.runtimes.model.observed == 3
    assert d.level == "user-name" and d.runtime() == pytest.approx(1800, abs=2)
    assert d.describe() == "3 runs of pytest/pretrain-x: median 30m"
    # The queued workload carries it: what the scheduling core and the forecast read.
    assert h.cs.state.leases.get(wid) is None
    assert next(w for w in h.cs.state.pending() if w.id == wid).predicted == d


def test_a_cancelled_workload_teaches_nothing(h):
    wid = h.call("submit", spec=spec("c", "team-a", "pretrain", workers=2, gpu=2))["id"]
    h.tick()
    h.call("report", workload_id=wid, kind="running")
    h.clock.advance(100)
    h.call("cancel", workload_id=wid)
    h.tick()
    assert h.cs.runtimes.model.observed == 0


def test_a_restart_rebuilds_the_model_from_the_journal(h):
    for s in (600, 900, 4000):
        _run(h, "pretrain-x", s)
    before = h.cs.runtimes.model.predict(_features(h))
    h.restart()
    assert h.cs.runtimes.model.observed == 3
    assert h.cs.runtimes.model.predict(_features(h)) == before


def _features(h):
    from raylane.control.learned import features_of
    rec = next(r for r in h.cs.records.values() if r.spec["name"] == "pretrain-x")
    return features_of(rec)


def _running_after_history(h) -> str:
    """Runs of pretrain-x of 10, 20 and 40 minutes, then one more on the whole cluster, running for a minute now."""
    for s in (600, 1200, 2400):
        _run(h, "pretrain-x", s)
    wid = h.call("submit", spec=spec("pretrain-x", "team-a", "pretrain", workers=2, gpu=2))["id"]
    h.tick()
    h.call("report", workload_id=wid, kind="running")
    h.clock.advance(60)
    return wid


def test_queue_etas_carry_an_interval_and_what_they_rest_on(h):
    # Three runs of 10, 20 and 40 minutes; a fourth runs now on the whole cluster, a fifth waits behind it.
    _running_after_history(h)
    waiting = h.call("submit", spec=spec("pretrain-x", "team-a", "pretrain", workers=2, gpu=2))["id"]
    h.tick()
    etas = h.cs.etas()
    e = etas[waiting]
    now = h.clock()
    # It starts when the running one ends: the median of the runs longer than the minute it has run, less it.
    assert e.start == pytest.approx(now + 1200 - 60, abs=5)
    assert e.start_low < e.start < e.start_high
    assert e.start_low >= now and e.start_high <= now + 2400
    assert e.basis == "3 runs of pytest/pretrain-x: median 20m"
    row = next(r for r in h.call("queue") if r["id"] == waiting)
    assert row["eta_start_low"] == pytest.approx(e.start_low) and row["eta_basis"] == e.basis
    # The CLI's cell and explain's words.
    assert eta_cell(row["eta_start"], now, row["eta_start_low"], row["eta_start_high"]) == "~19m (11m-35m)"
    assert [c for c in queue_cells([row]) if c[0] == waiting]  # the queue's cells take the row as it is
    text = "\n".join(str(x) for x in explain_lines(h.call("explain", workload_id=waiting)))
    assert "3 runs of pytest/pretrain-x: median 20m" in text and "between" in text


@pytest.mark.parametrize("start, low, high, text", [
    (2400, 1200, 5400, "~40m (20m-1.5h)"),
    (2400, None, None, "~40m"),
    (2400, 30, None, "~40m (now-?)"),
    (30, 0, 30, "now"),
])
def test_the_eta_cell_shows_the_interval(start, low, high, text):
    assert eta_cell(start, 0.0, low, high) == text


def test_explain_says_when_a_running_workload_is_expected_to_end_and_why(h):
    from raylane.cli.cluster import end_text

    wid = _running_after_history(h)
    out = h.call("explain", workload_id=wid)
    now = h.clock()
    assert out["predicted_end"] == pytest.approx(now + 1200 - 60)
    assert out["predicted_end_low"] < out["predicted_end"] < out["predicted_end_high"]
    assert end_text(out, now) == ("expected to end in ~19m (11m-35m); its runtime: 3 runs of pytest/pretrain-x: "
                                  "median 20m; 3 of them ran longer than its 60s")
