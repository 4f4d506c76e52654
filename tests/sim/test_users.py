"""Per-user fairness in the simulator: a trace's user column, the ``user_fairness`` figures, and a team's user rule
on vs off on the same trace (one user's sweep queued before a teammate's single run)."""
from __future__ import annotations

import pytest

from raylane.scheduling.types import Quota, Team, UserRule
from raylane.sim.metrics import summarize
from raylane.sim.traces import load_trace
from tests.sim.builders import job, replay, trace

# One 2-GPU node: alice submits six 100 s jobs at 0..5, bob one at 6.
SWEEP = trace(*[job(f"a{i}").user("alice").at(i).runs(100).team("nlp") for i in range(6)],
              job("b").user("bob").at(6).runs(100).team("nlp"))


def run(rule):
    teams = {"nlp": Team("nlp", {"gpu": Quota(2)}, users=rule)}
    return summarize(replay(SWEEP, gpus=2, teams=teams, config=dict(ordering="priority", admission="quota",
                                                                     backfill="greedy")))


def test_the_rule_lets_the_teammate_in_and_narrows_the_spread():
    off, on = run(None)["user_fairness"], run(UserRule(fair=True))["user_fairness"]
    # Off: bob waits for the whole sweep (starts at 300, JCT 394); on: he goes after alice's first (starts at 100).
    assert off["per_user"]["nlp/bob"]["slowdown"] == pytest.approx(394 / 100)
    assert on["per_user"]["nlp/bob"]["slowdown"] == pytest.approx(194 / 100)
    assert on["slowdown_spread"] < off["slowdown_spread"]
    assert off["users"] == on["users"] == 2
    assert on["within_team_spread"] == pytest.approx(on["slowdown_spread"])  # one team


def test_no_users_no_section():
    r = replay(trace(job("a").at(0).runs(10), job("b").at(1).runs(10)))
    assert "user_fairness" not in summarize(r)


def test_user_column_of_a_trace(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text("timestamp,duration,num_gpus,gpu_time,cluster,user\n"
                 "2017-10-09 07:00:00,60,1,60,vc1,u1\n2017-10-09 07:00:01,60,1,60,vc1,\n")
    assert [j.user for j in load_trace(p).jobs] == ["u1", None]
    assert [j.user for j in load_trace(p, user_column="none").jobs] == [None, None]
    with pytest.raises(Exception, match="user column"):
        load_trace(p, user_column="owner")
