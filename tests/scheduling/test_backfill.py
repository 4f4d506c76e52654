"""Backfill: what may start behind a gang that waits for capacity.

Common scene (``now`` = 100): n1 is held until t=1000 by ``r1`` (estimate 1000 s); n2 is free; the head ``H`` needs
both nodes whole, so its shadow time is 1000 and it is planned on n1 and n2."""
import pytest

from raylane.scheduling import BehindHead, BlockedByReservation, NoCapacity, Reserved

from .builders import decide, node, nodes, running, team, wl

TEAMS = [team("nlp"), team("cv")]
R1 = running(wl("r1").gpus(8).est(1000), on=["n1"], since=0)
HEAD = wl("H").gpus(8).workers(2).at(0)


def scene(backfill, *behind, extra_nodes=(), extra_running=()):
    return decide(nodes(2) + list(extra_nodes), TEAMS, [R1, *extra_running], [HEAD, *behind], now=100,
                  backfill=backfill, preemption="none")


def test_none_blocks_everything_behind_the_head():
    out = scene("none", wl("S").team("cv").gpus(1).est(10).at(1))
    assert out.admitted == {}
    assert isinstance(out.pending["H"], NoCapacity)
    assert out.pending["S"] == BehindHead("H")
    assert str(out.pending["S"]) == "waits behind H (no backfill)"


def test_none_lets_work_ahead_of_the_head_run():
    out = scene("none", wl("A").gpus(1).at(-1))
    assert set(out.admitted) == {"A"}
    assert out.positions["H"] == 2


def test_easy_reserves_the_head_at_the_shadow_time():
    out = scene("easy")
    r = out.pending["H"]
    assert isinstance(r, Reserved) and r.start == 1000
    assert r.inner.workers == 2 and r.inner.best_node == "n2"


@pytest.mark.parametrize("est,starts", [
    (100, True),    # ends at 200, long before 1000
    (900, True),    # ends exactly at the shadow time
    (901, False),   # would still hold n2 when H starts
    (None, False),  # no estimate: may only use what H leaves spare, and H needs all of n2
])
def test_easy_short_jobs_start_before_the_shadow_time(est, starts):
    out = scene("easy", wl("S").team("cv").gpus(1).est(est).at(1))
    assert ("S" in out.admitted) is starts
    if not starts:
        assert out.pending["S"] == BlockedByReservation("H", 1000)
    assert isinstance(out.pending["H"], Reserved)


def test_easy_long_job_on_a_node_the_head_does_not_need_starts():
    # n3 is held by r2 (4 GPUs, until t=5000): H is planned on n1+n2, so a long job on n3's spare 4 GPUs is harmless.
    out = scene("easy", wl("L").team("cv").gpus(2).est(10_000).at(1),
                extra_nodes=[node("n3")], extra_running=[running(wl("r2").gpus(4).est(5000), on=["n3"])])
    assert out.admitted == {"L": ("n3",)}


def test_easy_spare_is_consumed_by_backfilled_work():
    # H needs 2 x 6: at t=1000 it leaves 2 GPUs spare on each of n1, n2. Three long 1-GPU jobs on n2: two fit in
    # the spare (2), the third would eat into H's 6.
    head = wl("H").gpus(6).workers(2).at(0)
    pend = [head] + [wl(f"L{i}").team("cv").gpus(1).at(i) for i in range(1, 4)]
    out = decide(nodes(2), TEAMS, [R1], pend, now=100, backfill="easy", preemption="none")
    assert set(out.admitted) == {"L1", "L2"}
    assert out.pending["L3"] == BlockedByReservation("H", 1000)


def test_easy_head_with_unknown_start_blocks_its_nodes():
    # r1 is terminating-free but runs with no estimate: default_runtime_s decides the shadow time.
    r1 = running(wl("r1").gpus(8), on=["n1"], since=0)
    out = decide(nodes(2), TEAMS, [r1], [HEAD, wl("S").team("cv").gpus(1).est(3600).at(1)], now=100,
                 backfill="easy", preemption="none", default_runtime_s=7200)
    assert out.pending["H"].start == 7200
    assert set(out.admitted) == {"S"}


def test_greedy_starts_anything_that_fits():
    out = scene("greedy", wl("L").team("cv").gpus(8).est(10_000).at(1), wl("S").gpus(1).at(2))
    assert set(out.admitted) == {"L"}  # L took n2; S finds nothing left
    assert type(out.pending["H"]) is NoCapacity
    assert type(out.pending["S"]) is NoCapacity


def test_positions_follow_queue_order_through_backfill():
    out = scene("easy", wl("S1").team("cv").gpus(1).est(10).at(1), wl("S2").team("cv").gpus(1).est(5000).at(2))
    assert out.positions == {"H": 1, "S2": 3}
    assert set(out.admitted) == {"S1"}
