"""Fairness between the users of one team in the control plane, without Ray (``tests/controltest.py``): on the
Ray tests' two nodes of 2 GPUs, one user's sweep is queued before a teammate's single run; with the team's user rule
on, the teammate's run starts in the first tick, and a user over its cap waits with the reason shown as text."""
from __future__ import annotations

import pytest

from raylane.control.records import State
from tests.controltest import Harness
from tests.raytest import local_policy, spec


def policy(users=None) -> dict:
    p = local_policy(pretrain={"min_runtime": 0})
    p["teams"] = {"team-a": {"quotas": {"gpu": {"nominal": 4}}, **({"users": users} if users else {})}}
    return p


def submit(h, name, user) -> str:
    s = spec(name, "team-a", "pretrain", gpu=1, cpu=0.5)
    s["run"]["owner"] = user
    return h.call("submit", spec=s)["id"]


@pytest.mark.parametrize("users, teammate_starts", [(None, False), ({"order": "fair"}, True)],
                         ids=["rule off", "order fair"])
def test_a_teammates_run_is_not_starved_behind_a_sweep(tmp_path, users, teammate_starts):
    h = Harness(str(tmp_path / "journal.db"), policy(users))
    try:
        sweep = [submit(h, f"sweep-{i}", "alice") for i in range(6)]
        h.clock.advance(1)
        single = submit(h, "single", "bob")
        h.tick()
        assert (h.record(single).state is State.ADMITTED) is teammate_starts
        assert sum(h.record(w).state is State.ADMITTED for w in sweep) == (3 if teammate_starts else 4)
    finally:
        h.close()


def test_a_user_over_its_cap_waits_with_the_reason(tmp_path):
    h = Harness(str(tmp_path / "journal.db"), policy({"order": "queue", "max_share": 0.5}))
    try:
        sweep = [submit(h, f"sweep-{i}", "alice") for i in range(3)]
        h.tick()
        assert [h.record(w).state is State.ADMITTED for w in sweep] == [True, True, False]
        why = h.call("explain", workload_id=sweep[2])
        assert "user alice holds 2 of team team-a's GPUs; a user may hold at most 2" in str(why)
    finally:
        h.close()
