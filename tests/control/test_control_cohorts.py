"""The quota tree in the control plane, without Ray (``tests/controltest.py``): two departments with two teams each
on the Ray tests' two nodes of 2 GPUs (4 GPUs; each team 1 GPU nominal). A department's idle quota goes first to its
sibling team and is reclaimed when its owner submits; ``teams``, ``cohorts``, ``explain``, the console's teams view
and the ``raylane_cohort_gpus`` gauge show the tree."""
from __future__ import annotations

import pytest

from raylane import metrics
from raylane.console import views
from raylane.control.records import State
from tests.controltest import Harness
from tests.raytest import local_policy, spec


def tree_policy() -> dict:
    p = local_policy(pretrain={"min_runtime": 0})
    p["cohorts"] = {"org": {}, "dept-1": {"parent": "org"}, "dept-2": {"parent": "org"}}
    p["teams"] = {t: {"cohort": d, "quotas": {"gpu": {"nominal": 1}}}
                  for d, ts in (("dept-1", ("a1", "a2")), ("dept-2", ("b1", "b2"))) for t in ts}
    return p


@pytest.fixture
def h(tmp_path):
    harness = Harness(str(tmp_path / "journal.db"), tree_policy())
    yield harness
    harness.close()


def submit(h, name, team, gpu=1) -> str:
    return h.call("submit", spec=spec(name, team, "pretrain", gpu=gpu, cpu=0.5))["id"]


def gauge(cohort: str, what: str) -> float:
    return metrics.snapshot("raylane_cohort_gpus")[("raylane_cohort_gpus", (("cohort", cohort), ("what", what)))]


def test_a_departments_idle_quota_goes_to_the_sibling_team_and_is_reclaimed_when_its_owner_submits(h):
    # dept-2's teams hold their own GPUs; a1 takes its own and its idle sibling a2's: dept-1's quota, nothing
    # borrowed from dept-2. The cluster is full.
    bs = [submit(h, f"{t}-own", t) for t in ("b1", "b2")]
    wide = submit(h, "a1-wide", "a1", gpu=2)
    h.tick()
    assert all(h.record(w).state is State.ADMITTED for w in bs + [wide])
    rows = {c["cohort"]: c for c in h.call("cohorts")}
    assert (rows["dept-1"]["used"]["gpu"], rows["dept-1"]["nominal"]["gpu"], rows["dept-1"]["borrowed"]["gpu"]) \
        == (2, 2, 0)
    assert rows["dept-1"]["parent"] == "org" and rows["org"]["parent"] is None
    assert (gauge("dept-1", "used"), gauge("dept-1", "borrowed"), gauge("dept-2", "lendable")) == (2, 0, 0)
    # a2, within its nominal, takes its GPU back from its own department's borrower; dept-2 is not touched.
    own = submit(h, "a2-own", "a2")
    h.tick()
    assert h.record(wide).state is not State.ADMITTED  # preempted for a2
    assert all(h.record(w).state is State.ADMITTED for w in bs)
    h.tick()
    assert h.record(own).state is State.ADMITTED


def test_teams_explain_and_the_console_show_the_tree(h):
    wid = submit(h, "a1-job", "a1")
    h.tick()
    teams = {t["team"]: t for t in h.call("teams")}
    assert teams["a1"]["cohorts"] == ["org", "dept-1"] and teams["b2"]["cohorts"] == ["org", "dept-2"]
    out = h.call("explain", workload_id=wid)
    assert [c["cohort"] for c in out["team_cohorts"]] == ["org", "dept-1"]
    assert out["team_cohorts"][1]["used"]["gpu"] == 1

    class Client:  # the console's client, answering from the state machine
        def __getattr__(self, name):
            return lambda **kw: h.call(name, **kw)

    view = views.teams(Client(), None)
    assert view["cohorts"][0]["cohort"] == "org"  # top-down: a parent before its children
    assert sorted(c["cohort"] for c in view["cohorts"]) == ["dept-1", "dept-2", "org"]
    assert {t["team"]: t["cohorts"][-1] for t in view["teams"]} == {"a1": "dept-1", "a2": "dept-1",
                                                                    "b1": "dept-2", "b2": "dept-2"}


def test_a_flat_policy_has_no_cohorts_and_exports_none(tmp_path):
    flat = Harness(str(tmp_path / "flat.db"), local_policy())
    try:
        assert flat.call("cohorts") == []
        assert all(t["cohorts"] == [] for t in flat.call("teams"))
        assert "team_cohorts" not in flat.call("explain", workload_id=submit(flat, "x", "team-a"))
    finally:
        flat.close()


def test_the_queue_footer_shows_each_cohorts_gpus(h):
    from raylane.cli.cluster import cohorts_footer

    submit(h, "a1-wide", "a1", gpu=2)
    h.tick()
    line = cohorts_footer(h.call("cohorts"))
    assert line.startswith("cohorts, GPUs held/nominal: org 2/4 (lends 2)")
    assert "dept-1 2/2" in line and "dept-2 0/2 (lends 2)" in line
