"""The control plane's logic without Ray: ``ControlState`` driven by a fake clock and a fake host
(``tests/controltest.py``), its effects read as the record of what Ray would have been asked to do.

Submission and admission into a reservation pinned to the chosen nodes, readiness once it is placed, the hand-over,
quota refusals with reason and position, refusals at submit, cancel, reclaiming borrowed GPUs (graceful, yielded,
forced), the hold on a resize until the gang is heard from, lost and draining nodes, health probes, the watch on Ray's
jobs and the MLflow runs it closes, checkpoint references, and recovery from the journal. The cluster is the Ray
tests' (``tests/raytest.start_cluster``): a head without GPUs and two nodes of 2 GPUs, ``gpu-a`` (nvlink) and
``gpu-b`` (ssd); the policy is ``policies/local.yaml`` (team-a and team-b: 2 GPUs nominal each, 2 borrowable).
"""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from raylane.control import effects as fx
from raylane.control import ends
from raylane.control.journal import Journal
from raylane.control.records import State
from raylane.control.state import JOB_WATCH_S
from raylane.errors import (AuthenticationError, ConflictError, InfeasibleError, NotFoundError,
                            PermissionDeniedError, ValidationError)
from tests.controltest import T0, Harness, node_id
from tests.raytest import REPO, local_policy, spec

A, B = node_id("gpu-a"), node_id("gpu-b")
GRACE_S = 20.0  # every class's grace period in policies/local.yaml


@pytest.fixture
def make(tmp_path):
    """``make(policy=None, **harness options)``: a harness on a journal of its own, closed after the test."""
    made = []

    def make_(policy=None, **kw):
        h = Harness(str(tmp_path / f"journal-{len(made)}.db"), policy or local_policy(), **kw)
        made.append(h)
        return h

    yield make_
    for h in made:
        h.close()


def submit(h, *args, job_id=None, **kw) -> str:
    extra = {"job_id": job_id} if job_id else {}
    return h.call("submit", spec=spec(*args, **kw), **extra)["id"]


def submit_as(h, credential, *args, **kw) -> str:
    return h.call("submit", credential, spec=spec(*args, **kw))["id"]


def run(h, wid, **kw):
    """The driver hands its reservation over to Ray Train."""
    return h.call("report", workload_id=wid, kind="running", **kw)


def elastic(name, team, lo, hi):
    s = spec(name, team, "pretrain")
    s["gang"]["workers"] = {"min": lo, "max": hi}
    return s


# ------------------------------------------------------------------------------------------------ no Ray
def test_the_state_machine_and_its_harness_run_without_ray(tmp_path):
    # In a process of its own: in a whole test session another module has imported Ray long before.
    code = textwrap.dedent(f"""
        import sys
        import tests.control.test_control_state as t
        assert "ray" not in sys.modules, "imported by the test module's imports"
        h = t.Harness({str(tmp_path / "journal.db")!r}, t.local_policy())
        wid = h.call("submit", spec=t.spec("x", "team-a", "pretrain"))["id"]
        h.tick()
        h.call("report", workload_id=wid, kind="running")
        h.clock.advance(60)
        h.host.kill_node("gpu-a")
        h.host.kill_node("gpu-b")
        h.tick()
        assert h.record(wid).state.value == "PENDING"
        h.close()
        print(sorted(m for m in sys.modules if m == "ray" or m.startswith("ray.")))
    """)
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


# --------------------------------------------------------------------------------------- submit and admit
@pytest.mark.parametrize("placement, features, nodes, strategy", [
    (None, ["nvlink"], [A, A], "PACK"),          # the only node with the feature
    (None, ["ssd"], [B, B], "PACK"),
    ("strict-spread", [], sorted([A, B]), "STRICT_SPREAD"),
])
def test_submit_is_admitted_on_the_tick_into_a_reservation_pinned_to_the_chosen_nodes(make, placement, features,
                                                                                     nodes, strategy):
    h = make()
    wid = submit(h, "feat", "team-a", "pretrain", workers=2, features=features, placement=placement)
    assert h.record(wid).state is State.PENDING and h.cs.wants_cycle
    assert h.take() == []  # nothing is reserved before a cycle decides
    h.tick()
    rec = h.record(wid)
    assert rec.state is State.ADMITTED and sorted(rec.placement) == nodes
    assert h.take() == [fx.Reserve(wid, f"raylane-{wid}.1", {"CPU": 0.5, "GPU": 1.0}, strategy, rec.placement),
                        fx.Wake(wid)]
    assert h.kinds(wid) == ["submitted", "admitted"]


def test_admission_is_ready_only_once_the_reservation_is_placed(make):
    h = make(placing="later")
    wid = submit(h, "next", "team-b", "finetune", gpu=2)
    h.tick()
    got = h.call("wait_admission", workload_id=wid, timeout_s=0.0)
    assert got["state"] == "ADMITTED" and got["ready"] is False
    assert h.cs.awaits_admission(wid)
    assert h.take(fx.Wake) == []  # a driver waiting for it is not woken
    h.place(f"raylane-{wid}.1")
    assert h.take(fx.Wake) == [fx.Wake(wid)]
    assert h.call("wait_admission", workload_id=wid)["ready"] is True
    assert not h.cs.awaits_admission(wid)


@pytest.mark.parametrize("examined, admitted_at_once", [(2, False), (3, True)])
def test_a_cycle_between_full_ticks_looks_at_the_head_of_the_queue_only(make, monkeypatch, examined,
                                                                        admitted_at_once):
    # A release runs a cycle at once; past CHANGE_EXAMINED workloads, what it freed waits for the next full tick.
    from raylane.control import state as control_state

    monkeypatch.setattr(control_state, "CHANGE_EXAMINED", examined)
    policy = local_policy()
    policy["teams"] = {"team-a": {"quotas": {"gpu": {"nominal": 4}}}}
    h = make(policy)
    held = [submit(h, f"{f}{i}", "team-a", "pretrain", features=[f]) for f in ("nvlink", "ssd") for i in range(2)]
    h.tick()
    heads = [submit(h, f"x{i}", "team-a", "pretrain", features=["nvlink"]) for i in range(2)]  # gpu-a only
    deep = submit(h, "y", "team-a", "pretrain")  # fits on gpu-b, third in the queue
    h.tick()
    before = h.record(deep).reason
    assert before and h.record(deep).state is State.PENDING
    h.call("release", workload_id=held[2], outcome="finished", state="SUCCEEDED")  # one GPU free on gpu-b
    h.tick(full=False)
    assert h.record(deep).state is (State.ADMITTED if admitted_at_once else State.PENDING)
    assert all(h.record(x).state is State.PENDING for x in heads)
    if not admitted_at_once:
        assert h.record(deep).reason == before  # not looked at: it keeps the reason shown
        h.tick()
        assert h.record(deep).state is State.ADMITTED and h.record(deep).placement == (B,)


@pytest.mark.parametrize("users", [None, {"order": "fair"}], ids=["queue order", "users share fairly"])
def test_a_submission_queued_behind_what_a_change_cycle_looks_at_asks_for_none(make, monkeypatch, users):
    # A change cycle looks at the first CHANGE_EXAMINED of each queue; one queued behind them would repeat the last
    # cycle, so it is not asked for. A team whose users share it fairly is read whole by its snapshot: always asked.
    from raylane.control import state as control_state

    monkeypatch.setattr(control_state, "CHANGE_EXAMINED", 2)
    policy = local_policy(pretrain={"min_runtime": 0})
    policy["teams"] = {"team-a": {"quotas": {"gpu": {"nominal": 4}}, **({"users": users} if users else {})}}
    h = make(policy)
    for i in range(4):
        submit(h, f"held{i}", "team-a", "pretrain")
    h.tick()
    asked = []
    for i in range(3):
        submit(h, f"wait{i}", "team-a", "pretrain")
        asked.append(h.cs.wants_cycle)
        h.tick(full=False)
    assert asked == [True, True, users is not None]
    # What the cycle would have been: nothing admitted, preempted or told.
    h.take()
    assert h.tick(full=False) is None and h.take() == []
    # A workload that sorts ahead of the ones looked at (a higher priority) is asked for.
    submit(h, "ahead", "team-a", "finetune")
    assert h.cs.wants_cycle


def test_readiness_reads_rays_table_of_groups_only_for_a_reservation_made_before_a_restart(make):
    # Drivers ask for their admission again and again while it is placed; the table lists every group in Ray.
    h = make(placing="later")
    reads = []
    table = h.host.placement_groups
    h.host.placement_groups = lambda: reads.append(1) or table()
    wid = submit(h, "asked", "team-a", "pretrain")
    h.tick()
    h.host.pgs[f"raylane-{wid}.1"] = "CREATED"  # placed in Ray, not reported to the control plane yet
    assert h.call("wait_admission", workload_id=wid, timeout_s=0.0)["ready"] is False
    assert h.cs.awaits_admission(wid) and reads == []
    h.place(f"raylane-{wid}.1")
    assert h.call("wait_admission", workload_id=wid)["ready"] is True and reads == []
    h.restart()  # made before the restart: only Ray's table tells
    h.host.placement_groups = lambda: reads.append(1) or table()
    assert h.call("wait_admission", workload_id=wid)["ready"] is True and reads


def test_a_reservation_that_cannot_be_placed_is_rolled_back_to_the_queue(make):
    h = make(placing="fail")
    wid = submit(h, "unlucky", "team-a", "pretrain")
    h.tick()
    rec = h.record(wid)
    assert rec.state is State.PENDING and rec.attempts == 1 and rec.pg_name is None
    assert h.kinds(wid) == ["submitted", "admitted", "requeued"]
    assert h.journal(wid)[-1][1]["note"] == "admission rolled back: test: the group could not be placed"
    assert not h.call("wait_admission", workload_id=wid)["ready"]
    h.tick()  # tried again on the next cycle
    assert h.record(wid).attempts == 2


def test_the_running_report_hands_the_reservation_over(make):
    h = make()
    wid = submit(h, "gang", "team-a", "pretrain", workers=2)
    early = submit(h, "early", "team-a", "pretrain", workers=2, gpu=2)  # cannot be admitted: quota
    h.tick()
    h.take()
    assert run(h, wid, job_id="raysubmit_1") == {"stop": False, "state": "RUNNING"}
    rec = h.record(wid)
    assert rec.state is State.RUNNING and rec.job_id == "raysubmit_1"
    assert h.take() == [fx.RemoveReservation(f"raylane-{wid}.1")]
    # The lease stays booked while Train builds its own group: the team's quota is still used.
    assert h.call("explain", workload_id=early)["team_quota"]["gpu"]["used"] == 2
    # A driver starting a gang that is not admitted is told to stop, and nothing is journaled.
    assert run(h, early) == {"stop": True, "state": "PENDING"}
    assert h.kinds(early) == ["submitted"]


# ------------------------------------------------------------------------------------------ refusals
def test_quota_refusal_gives_reason_and_position(make):
    h = make()
    ids = [submit(h, f"q{i}", "team-a", "pretrain", workers=2) for i in range(4)]
    h.tick()
    h.tick()  # positions are those of the queue as the last cycle saw it
    assert [h.record(i).state for i in ids] == [State.ADMITTED] * 2 + [State.PENDING] * 2
    third, fourth = h.record(ids[2]), h.record(ids[3])
    assert (third.position, fourth.position) == (1, 2)
    # team-a: nominal 2 + borrowing 2 = 4 GPUs, all used by the first two gangs.
    assert third.reason == "team team-a uses 4 of 2 GPU nominal + 0 borrowable; this gang needs 2"
    explained = h.call("explain", workload_id=ids[2])
    assert explained["reason_data"]["type"] == "QuotaExceeded"
    assert explained["team_quota"]["gpu"] == {"used": 4.0, "nominal": 2.0, "borrowing_limit": 2.0,
                                              "lending_limit": None}
    assert [(r["id"], r["position"]) for r in h.call("queue") if r["state"] == "PENDING"] == [(ids[2], 1),
                                                                                              (ids[3], 2)]


def test_infeasible_and_invalid_specs_are_refused_at_submit(make):
    h = make()
    with pytest.raises(InfeasibleError, match="fits no set of nodes"):
        submit(h, "big", "team-a", "pretrain", workers=3, placement="strict-pack")
    (big,) = [r for r in h.call("queue", include_done=True) if r["id"].startswith("big-")]
    assert big["state"] == "REJECTED" and "fits no set of nodes" in big["reason"]
    assert h.kinds(big["id"]) == ["submitted", "rejected"]
    assert h.take() == []
    before = len(list(h.cs.journal.replay()))
    with pytest.raises(ValidationError) as err:
        submit(h, "nope", "team-zzz", "pretrain")
    assert "team" in str(err.value) and "team-zzz" in str(err.value)
    # An invalid spec is not a workload: nothing but the refusal's audit is journaled.
    (audit,) = list(h.cs.journal.replay())[before:]
    assert audit.kind == "audit" and audit.data["outcome"] == "refused" and audit.data["action"] == "submit"
    assert not [wid for wid in h.cs.records if wid.startswith("nope")]
    with pytest.raises(NotFoundError):
        h.call("status", workload_id="no-such-workload")


def test_a_burst_of_one_shape_is_judged_once_until_the_nodes_change(make, monkeypatch):
    # ``feasible`` remembers a verdict per gang, team and data snapshot while the nodes are the same: a burst of
    # one shape runs ``check_feasible`` once; a node that appears (read on the tick, or at a refusal) is judged anew.
    import raylane.control.state_scale as state_scale

    h = make()
    judged = []
    real = state_scale.check_feasible
    monkeypatch.setattr(state_scale, "check_feasible", lambda w, *a: judged.append(w.id) or real(w, *a))
    for i in range(5):
        submit(h, f"same{i}", "team-a", "pretrain", gpu=1)
    assert len(judged) == 1
    for _ in range(2):  # nodes of 2 GPUs
        with pytest.raises(InfeasibleError, match="fits no set of nodes"):
            submit(h, "four", "team-a", "pretrain", gpu=4)
    assert len(judged) == 2  # refused twice, judged once (the refusal re-read Ray's table: no new node)
    h.host.add_node("gpu-c", gpus=4, features=["gpu-sim"])
    assert h.cs.records[submit(h, "four", "team-a", "pretrain", gpu=4)].state is State.PENDING
    assert len(judged) == 3  # refused on the old nodes as remembered, judged again on Ray's table with gpu-c


def test_an_id_in_use_is_refused_before_anything_is_written(tmp_path, monkeypatch):
    # A journal that already holds a rejected workload, with a source of randomness that draws its id again.
    from raylane import ids

    taken = "burst-0123456789ab"
    path = str(tmp_path / "journal.db")
    j = Journal(path)
    j.append("submitted", taken, spec=spec("burst", "team-a", "eval", gpu=0), submit_time=T0, owner="a")
    j.append("rejected", taken, reason="the earlier one")
    j.close()
    h = Harness(path, local_policy())

    def rows(kind_is_audit=False):
        return [(e.seq, e.kind, e.workload_id, e.data) for e in h.cs.journal.replay()
                if (e.kind == "audit") == kind_is_audit]

    try:
        before = rows()
        rec = h.record(taken)
        monkeypatch.setattr(ids, "suffix", lambda: taken.rsplit("-", 1)[1])
        with pytest.raises(ConflictError) as err:
            h.call("submit", spec=spec("burst", "team-a", "eval", gpu=0))
        assert err.value.errors[0][:2] == ("id", taken)
        # No journal row but the refusal's audit, no record change: the earlier workload is as it was.
        assert rows() == before
        assert [(d["outcome"], d["reason"].split(":")[0]) for *_, d in rows(True)] == [("refused", "ConflictError")]
        assert list(h.cs.records) == [taken] and h.record(taken) is rec
        assert (rec.state, rec.reason) == (State.REJECTED, "the earlier one")
        # A pipeline id is the caller's choice: one a workload goes by is refused the same way.
        with pytest.raises(ConflictError) as err:
            h.call("pipeline_submit", spec={"name": "p"}, pipeline_id=taken, storage_path=str(tmp_path))
        assert err.value.errors[0][:2] == ("pipeline_id", taken)
        assert rows() == before
    finally:
        h.close()


def test_a_burst_of_one_spec_name_keeps_every_workload(make):
    # Ids drawn with 6 hex digits collided 3 times in 10,000 submissions of one name: a record was overwritten and
    # the journal held two rows under one id. Every submission here must stay a workload of its own.
    h = make()
    n = 100
    wids = [submit(h, "burst", "team-a", "eval") for _ in range(n)]
    assert len(set(wids)) == n
    assert {r["id"] for r in h.call("queue", include_done=True)} == set(wids)
    submitted = [e.workload_id for e in h.cs.journal.replay() if e.kind == "submitted"]
    assert sorted(submitted) == sorted(wids)


# -------------------------------------------------------------------------------------------- cancel
def test_cancel_frees_the_lease_and_the_next_is_admitted(make):
    h = make()
    first = [submit(h, f"c{i}", "team-a", "pretrain", workers=2) for i in range(2)]
    h.tick()
    waiting = submit(h, "c-wait", "team-a", "pretrain", workers=2)
    h.tick()
    assert h.record(waiting).state is State.PENDING
    h.take()
    assert h.call("cancel", workload_id=first[0])["state"] == "CANCELLED"
    assert fx.RemoveReservation(f"raylane-{first[0]}.1") in h.take()
    assert f"raylane-{first[0]}.1" not in h.host.pgs
    h.tick()
    assert h.record(waiting).state is State.ADMITTED
    assert h.record(first[1]).state is State.ADMITTED
    # Cancelling what has ended changes nothing.
    assert h.call("cancel", workload_id=first[0])["state"] == "CANCELLED"
    assert h.kinds(first[0]).count("cancelled") == 1


# ---------------------------------------------------------------------------------------- preemption
def borrowed_and_reclaimed(make, *, started=True):
    """team-a's two gangs of 2 hold all 4 GPUs (2 borrowed from team-b), started by their drivers (or not), with
    their workers registered; then team-b asks for its 2 GPUs back with a higher class. -> (harness, team-a's ids,
    team-b's id), at the time of team-b's submission."""
    h = make()  # pretrain's min_runtime is 5 s
    a = [submit(h, f"p{i}", "team-a", "pretrain", workers=2) for i in range(2)]
    h.tick()
    for i, wid in enumerate(a):
        if started:
            run(h, wid)
        h.call("register_workers", workload_id=wid, handles=[f"worker-{i}-0", f"worker-{i}-1"])
    h.clock.advance(2)
    b = submit(h, "ft", "team-b", "finetune", workers=2)
    h.take()
    return h, a, b


def test_a_higher_class_of_another_team_preempts_one_borrowed_gang_after_its_min_runtime(make):
    h, a, b = borrowed_and_reclaimed(make)
    h.tick()
    assert [h.record(w).state for w in a] == [State.RUNNING] * 2  # 2 s in: within pretrain's min_runtime
    h.clock.advance(3)
    h.tick()
    states = sorted(h.record(w).state.value for w in a)
    assert states == ["PREEMPTING", "RUNNING"]  # exactly one victim
    victim = next(w for w in a if h.record(w).state is State.PREEMPTING)
    rec = h.record(victim)
    assert rec.stop_deadline == h.clock() + GRACE_S and rec.preemptions == 1
    assert h.kinds(victim)[-1] == "preempting" and f"preempted: {b} (team-b/finetune" in rec.events[-1][1]
    # The gang hears it at its next poll; the other does not; nothing is killed yet.
    assert h.call("should_stop", workload_id=victim) is True
    assert h.call("should_stop", workload_id=next(w for w in a if w != victim)) is False
    assert h.take() == []
    assert h.record(b).state is State.PENDING and h.record(b).reason == f"waiting for preempted {victim} to stop"


def test_a_yielded_release_requeues_the_victim_and_the_preemptor_is_admitted(make):
    h, a, b = borrowed_and_reclaimed(make)
    h.clock.advance(5)
    h.tick()
    victim = next(w for w in a if h.record(w).state is State.PREEMPTING)
    submitted_at = h.record(victim).submit_time
    h.clock.advance(4)
    assert h.call("release", workload_id=victim, outcome="yielded", step=7)["state"] == "PENDING"
    rec = h.record(victim)
    assert (rec.step, rec.submit_time, rec.stop_deadline) == (7, submitted_at, None)
    assert rec.events[-1][1] == "back in the queue (yielded at step 7)"
    assert h.take(fx.KillWorkers) == []  # it stopped by itself
    h.tick()
    assert h.record(b).state is State.ADMITTED
    assert h.record(victim).state is State.PENDING  # team-a is back to its nominal quota


def test_past_the_grace_period_the_victim_is_stopped_by_force(make):
    h, a, b = borrowed_and_reclaimed(make)
    h.clock.advance(5)
    h.tick()
    victim = next(w for w in a if h.record(w).state is State.PREEMPTING)
    i = a.index(victim)
    h.clock.advance(GRACE_S - 0.1)
    h.tick()
    assert h.record(victim).state is State.PREEMPTING and h.take() == []
    h.clock.advance(0.1)
    h.tick()
    effects = h.take()
    assert effects[:2] == [fx.KillWorkers(victim, (f"worker-{i}-0", f"worker-{i}-1")),
                           fx.RemoveReservation(f"raylane-{victim}.1")]
    rec = h.record(victim)
    assert rec.state is State.PENDING
    assert rec.events[-1][1] == "back in the queue (stopped by force after the grace period)"
    # The preemptor is admitted in the same tick.
    assert h.record(b).state is State.ADMITTED and fx.Reserve in {type(e) for e in effects}


def test_a_late_yield_of_the_attempt_stopped_by_force_leaves_the_new_admission_alone(make):
    # The victim's driver tells of its stopped attempt only after the control plane took the lease back by force and
    # admitted the workload again (seen in CI when the preemptor ended at once): that yield is not the new lease's.
    h, a, b = borrowed_and_reclaimed(make)
    h.clock.advance(5)
    h.tick()
    victim = next(w for w in a if h.record(w).state is State.PREEMPTING)
    h.clock.advance(GRACE_S)
    h.tick()
    assert h.record(victim).state is State.PENDING and h.record(b).state is State.ADMITTED
    h.call("release", workload_id=b, outcome="finished", state="SUCCEEDED")
    h.clock.advance(1)
    h.tick()
    rec = h.record(victim)
    assert rec.state is State.ADMITTED
    h.take()
    assert h.call("release", workload_id=victim, outcome="yielded", step=7)["state"] == "ADMITTED"
    rec = h.record(victim)
    assert rec.state is State.ADMITTED and victim in h.cs.state.leases and rec.preemptions == 1
    assert h.take(fx.RemoveReservation) == []  # its reservation, being made, is left alone
    assert "yielded at step 7; that lease was taken back already" in rec.events[-1][1]
    assert h.kinds(victim).count("requeued") == 1


def test_each_reservation_has_a_name_of_its_own_so_late_news_of_an_earlier_one_changes_nothing(make):
    h = make()
    wid = submit(h, "named", "team-a", "pretrain")
    h.tick()
    first = h.record(wid).pg_name
    assert first == f"raylane-{wid}.1"
    h.cs.reservation_failed(wid, first, "placement group could not be created: test")
    assert h.record(wid).state is State.PENDING and "admission rolled back" in h.record(wid).events[-1][1]
    h.tick()
    second = h.record(wid).pg_name
    assert h.record(wid).state is State.ADMITTED and second == f"raylane-{wid}.2"
    # What Ray says late of the first group (its failure, or its being placed after all) is not the second's.
    h.cs.reservation_failed(wid, first, "reservation not ready in 30s (TaskPlacementGroupRemoved)")
    h.cs.reservation_ready(wid, first)
    assert h.record(wid).state is State.ADMITTED and h.kinds(wid).count("requeued") == 1
    assert fx.RemoveReservation(second) not in h.take() and h.host.pgs.get(second) == "CREATED"
    assert h.call("wait_admission", workload_id=wid)["ready"] is True


def test_a_victim_whose_gang_has_not_started_is_released_at_once(make):
    h, a, b = borrowed_and_reclaimed(make, started=False)
    h.clock.advance(5)
    h.tick()
    requeued = [w for w in a if h.record(w).state is State.PENDING]
    assert len(requeued) == 1
    (victim,) = requeued
    assert h.kinds(victim)[-2:] == ["preempting", "requeued"] and h.record(victim).preemptions == 1
    assert fx.RemoveReservation(f"raylane-{victim}.1") in h.take()
    assert f"raylane-{victim}.1" not in h.host.pgs
    h.tick()
    assert h.record(b).state is State.ADMITTED


# ----------------------------------------------------------------------------------------------- resize
@pytest.mark.parametrize("heard", ["should_stop", "checkpoint_saved", "grace period"])
def test_a_resize_waits_until_the_gang_is_heard_from_after_its_hand_over(make, heard):
    # Ray Train takes many seconds to start a gang's workers after the driver hands the reservation over; the loop
    # hears a stop only at its checkpoints once it runs. A resize asked before that would run out its grace period
    # and be forced, so it waits until the gang polls or checkpoints, or a grace period after the hand-over.
    policy = local_policy(pretrain={"min_runtime": 0})
    policy["scheduler"]["resize_interval"] = "1s"
    h = make(policy)
    other = submit(h, "hold-b", "team-b", "pretrain", workers=2)
    h.tick()
    wid = h.call("submit", spec=elastic("elastic", "team-a", 2, 4))["id"]
    h.tick()
    assert h.record(wid).workers == 2
    run(h, wid)
    handed_over = h.clock()
    h.call("cancel", workload_id=other)
    for t in (1, 5, GRACE_S - 0.5):  # the core asks for growth into the freed GPUs every cycle
        h.clock.t = handed_over + t
        h.tick()
        assert h.record(wid).state is State.RUNNING
    assert "resizing" not in h.kinds(wid)
    if heard == "should_stop":
        assert h.call("should_stop", workload_id=wid) is False  # the loop's first poll: it runs
    elif heard == "checkpoint_saved":
        h.call("checkpoint_saved", workload_id=wid, path="/runs/elastic/checkpoint_00000005", metrics={"step": 5})
    else:
        h.clock.t = handed_over + GRACE_S
    h.tick()
    rec = h.record(wid)
    assert rec.state is State.RESIZING and rec.stop_deadline == h.clock() + GRACE_S
    assert [(d["from_workers"], d["to_workers"]) for k, d in h.journal(wid) if k == "resizing"] == [(2, 4)]
    assert h.call("should_stop", workload_id=wid) is True
    h.take()
    assert h.call("release", workload_id=wid, outcome="yielded", step=5)["state"] == "ADMITTED"
    rec = h.record(wid)
    assert (rec.workers, rec.resizes) == (4, 1)
    reserve = h.take(fx.Reserve)[-1]
    # a name of its own: what Ray says late of the first reservation is never taken for this one's
    assert reserve.pg_name == f"raylane-{wid}.2" and sorted(reserve.placement) == sorted([A, A, B, B])


# ------------------------------------------------------------------------------------------------ nodes
def test_a_lost_node_requeues_its_leases_kills_the_gang_and_a_new_node_takes_it(make):
    h = make()
    wid = submit(h, "lossy", "team-a", "pretrain", workers=2, gpu=2)  # one worker on each node
    h.tick()
    run(h, wid)
    h.call("register_workers", workload_id=wid, handles=["w0", "w1"])
    submitted_at = h.record(wid).submit_time
    h.take()
    h.clock.advance(10)
    h.host.kill_node("gpu-b")
    h.tick()
    rec = h.record(wid)
    assert rec.state is State.PENDING and rec.submit_time == submitted_at
    kind, data = h.journal(wid)[-1]
    assert kind == "requeued" and data["lost_node"] == B and "was lost" in data["note"]
    assert data["attained_gpu_s"] == 4 * 10.0  # 4 GPUs for 10 s
    assert h.take(fx.KillWorkers) == [fx.KillWorkers(wid, ("w0", "w1"))]
    assert rec.restarts == 0  # a lost node is not the gang's failure
    rows = {r["id"]: r for r in h.call("node_list", include_lost=True)}
    assert rows[B]["state"] == "lost" and not rows[B]["alive"] and rows[B]["leases"] == []
    assert rows[A]["gpus_free"] == 2.0  # its lease went back at once
    assert "the capacity it ran on is gone (a node was lost)" in rec.reason
    assert h.record(wid).reason_data["type"] == "CapacityLost"
    c = h.host.add_node("gpu-c", gpus=2)
    h.tick()
    assert h.record(wid).state is State.ADMITTED and sorted(h.record(wid).placement) == sorted([A, c])
    assert h.kinds(wid) == ["submitted", "admitted", "running", "requeued", "admitted"]


def test_a_lost_node_removes_the_reservation_of_a_gang_not_yet_started(make):
    h = make()
    wid = submit(h, "lossy", "team-a", "pretrain", workers=2, gpu=2)
    h.tick()
    assert h.host.pgs == {f"raylane-{wid}.1": "CREATED"}
    h.take()
    h.host.kill_node("gpu-b")
    h.tick()
    assert h.record(wid).state is State.PENDING
    # Its group still holds the bundle on gpu-a (and its name, which the next admission of the workload reuses).
    assert fx.RemoveReservation(f"raylane-{wid}.1") in h.take()


@pytest.mark.parametrize("started", [True, False])
def test_a_drain_notice_preempts_what_runs_there_and_the_node_is_drained_once_empty(make, started):
    h = make(local_policy(pretrain={"min_runtime": 0}))
    on_b = submit(h, "on-b", "team-a", "pretrain", gpu=2, features=["ssd"])
    on_a = submit(h, "on-a", "team-b", "pretrain", gpu=2, features=["nvlink"])
    h.tick()
    if started:
        run(h, on_b)
    h.take()
    h.host.drains[B] = 1_700_000_600_000
    h.tick()
    rows = {r["id"]: r for r in h.call("node_list")}
    assert h.record(on_a).state is State.ADMITTED and rows[A]["state"] == "ready"
    preempting = next(d for k, d in h.journal(on_b) if k == "preempting")
    assert preempting["reason"] == (f"node {B[:12]} is draining: "
                                    "Ray is draining the node by deadline 1700000600 (unix s)")
    if started:  # it checkpoints and stops within its grace period; the node is drained once it has
        assert h.record(on_b).state is State.PREEMPTING and rows[B]["state"] == "draining"
        h.call("release", workload_id=on_b, outcome="yielded", step=3)
        h.tick()
    assert h.record(on_b).state is State.PENDING  # it can only run on gpu-b: it waits
    assert f"raylane-{on_b}.1" not in h.host.pgs
    events = [e.data["event"] for e in h.cs.journal.entries_for("@nodes") if e.data["node"] == B]
    assert events == ["joined", "ray_draining", "drained"]
    # Nothing is placed on a drained node; Ray's notice, still there, starts no second drain.
    h.tick()
    assert h.record(on_b).state is State.PENDING
    assert [e.data["event"] for e in h.cs.journal.entries_for("@nodes") if e.data["node"] == B] == events


def test_node_list_shows_every_node_and_only_operators_change_one(make):
    h = make(auth={"enabled": True})
    op = h.cs.gate.add_token(user="olga", teams=[], role="operator", created_by="test")
    member = h.cs.gate.add_token(user="carol", teams=["team-a"], role="member", created_by="test")
    h.tick()
    rows = h.call("node_list", op)
    gpu_rows = [r for r in rows if r["gpus_total"] > 0]
    assert {r["id"] for r in gpu_rows} == {A, B}
    assert all(r["state"] == "ready" and r["alive"] and r["gpus_free"] == 2.0 for r in gpu_rows)
    assert {r["id"]: r["features"] for r in gpu_rows} == {A: ["gpu-sim", "nvlink"], B: ["gpu-sim", "ssd"]}
    assert h.call("node_list", member) == rows  # a member may read the list
    with pytest.raises(PermissionDeniedError, match="only operators"):
        h.call("node_cordon", member, node=B[:10])
    with pytest.raises(ValidationError, match="node"):
        h.call("node_cordon", op, node="ffffffffff")
    assert h.call("node_cordon", op, node=B[:10], reason="test")["state"] == "cordoned"
    wid = submit_as(h, member, "after-cordon", "team-a", "pretrain", gpu=2)
    h.tick()
    assert h.record(wid).placement == (A,)  # nothing new on a cordoned node


# ----------------------------------------------------------------------------------------------- probes
@pytest.mark.parametrize("probe_failures", [1, 3])
def test_probes_run_every_interval_and_failures_quarantine_per_the_policy(make, probe_failures):
    policy = local_policy(pretrain={"min_runtime": 0})
    policy["health"] = {"probe_interval": "10s", "probe_failures": probe_failures}
    h = make(policy)
    wid = submit(h, "on-b", "team-a", "pretrain", gpu=2, features=["ssd"])
    h.tick()
    run(h, wid)
    h.take()
    h.clock.advance(9.9)
    h.tick()
    assert h.take(fx.RunProbes) == []
    h.clock.advance(0.1)
    h.tick()
    (probes,) = h.take(fx.RunProbes)
    ids = tuple(sorted([A, B, node_id("head")]))
    assert probes.node_ids == ids and probes.probe == "raylane.health:default_probe"
    assert probes.gpus == tuple(2.0 if n in (A, B) else 0.0 for n in ids)
    h.clock.advance(10)
    h.tick()
    assert h.take(fx.RunProbes) == []  # one at a time: its verdicts are not back
    for n in range(1, probe_failures + 1):
        # The head could not be probed (None): no verdict on its health.
        h.probed({A: (True, "ok"), B: (False, "ECC errors on GPU 1"), node_id("head"): None})
        rows = {r["id"]: r for r in h.call("node_list")}
        assert rows[B]["probe"]["consecutive_failures"] == n and rows[B]["probe"]["ok"] is False
        assert rows[B]["state"] == ("quarantined" if n == probe_failures else "ready")
        assert rows[A]["state"] == rows[node_id("head")]["state"] == "ready"
        h.clock.advance(10)
        h.tick()
        assert len(h.take(fx.RunProbes)) == 1  # the verdicts are back: the next round runs
    assert rows[B]["reason"] == f"probe failed {probe_failures} times in a row: ECC errors on GPU 1"
    assert h.record(wid).state is State.PREEMPTING
    assert h.journal(wid)[-1][1]["reason"].startswith(f"node {B[:12]} is quarantined: probe failed")
    other = submit(h, "after-q", "team-a", "pretrain", gpu=2)
    h.tick()
    assert h.record(other).placement == (A,)  # nothing new lands on a quarantined node


# --------------------------------------------------------------------------------------------- job watch
@pytest.mark.parametrize("status, state, outcome, run_status", [
    ("JobStatus.FAILED", State.FAILED, "ray job failed", "FAILED"),
    ("STOPPED", State.CANCELLED, "ray job stopped", "KILLED"),
    (None, State.CANCELLED, "ray job gone", "KILLED"),  # no longer listed: the cluster it ran on was stopped
])
@pytest.mark.parametrize("mlflow_run", ["run1", None])
def test_the_job_watch_ends_a_workload_whose_job_ended_and_closes_its_run(make, status, state, outcome, run_status,
                                                                          mlflow_run):
    h = make()
    wid = submit(h, "watched", "team-a", "eval", job_id="raysubmit_w")
    live = submit(h, "live", "team-a", "eval", job_id="raysubmit_l")
    h.tick()
    for w, job in ((wid, "raysubmit_w"), (live, "raysubmit_l")):
        run(h, w, job_id=job, **({"mlflow_run_id": mlflow_run} if mlflow_run else {}))
        h.host.jobs[job] = "JobStatus.RUNNING"
    if status is None:
        del h.host.jobs["raysubmit_w"]
    else:
        h.host.jobs["raysubmit_w"] = status
    h.take()
    h.clock.advance(JOB_WATCH_S)
    h.host.jobs = None  # Ray does not answer: nothing is decided
    h.tick()
    assert h.record(wid).state is State.RUNNING
    h.host.jobs = {"raysubmit_l": "JobStatus.RUNNING", **({"raysubmit_w": status} if status else {})}
    h.clock.advance(JOB_WATCH_S)
    h.tick()
    if status is None:  # a job not listed yet may be one `raylane submit` is about to start
        assert h.record(wid).state is State.RUNNING
        h.clock.t = T0 + 60
        h.tick()
    rec = h.record(wid)
    assert (rec.state, rec.outcome) == (state, outcome)
    assert h.record(live).state is State.RUNNING
    assert h.take(ends.CloseRun) == []  # the run is closed once the job is seen over, at the next watch
    h.clock.advance(JOB_WATCH_S)
    h.tick()
    closes = h.take(ends.CloseRun)
    if mlflow_run is None:
        assert closes == []
        h.clock.advance(JOB_WATCH_S)
        h.tick()
        assert h.take(ends.CloseRun) == []
        return
    (close,) = closes
    assert (close.workload_id, close.run_id, close.status) == (wid, mlflow_run, run_status)
    assert close.reason.startswith(rec.events[-1][1])
    h.clock.advance(JOB_WATCH_S)
    h.tick()
    assert h.take(ends.CloseRun) == []  # one try at a time
    h.run_closed(wid, None)  # the try failed: tried again at the next watch
    h.clock.advance(JOB_WATCH_S)
    h.tick()
    assert h.take(ends.CloseRun) == [close]
    h.run_closed(wid, "ended MLflow run run1 with status " + run_status)
    assert h.journal(wid)[-1] == ("event", {"mlflow_run_closed": True,
                                            "note": "ended MLflow run run1 with status " + run_status})
    assert not h.record(wid).run_to_close
    h.clock.advance(JOB_WATCH_S)
    h.tick()
    assert h.take(ends.CloseRun) == []


def test_a_cancelled_workload_whose_driver_outlives_the_grace_period_has_its_job_stopped(make):
    h = make()
    wid = submit(h, "stuck", "team-a", "eval", job_id="raysubmit_s")
    h.tick()
    run(h, wid, job_id="raysubmit_s")
    h.host.jobs["raysubmit_s"] = "JobStatus.RUNNING"
    h.call("cancel", workload_id=wid)
    assert h.record(wid).job_stop_at == h.clock() + ends.CANCEL_GRACE_S
    h.clock.advance(ends.CANCEL_GRACE_S - 1)
    h.tick()
    assert h.take(fx.StopJob) == []
    h.clock.advance(5)
    h.tick()
    assert h.take(fx.StopJob) == [fx.StopJob("raysubmit_s")]
    assert h.journal(wid)[-1][1]["job_stopped"] is True


# -------------------------------------------------------------------------------------- checkpoint refs
def _checkpoint(run_dir, step):
    d = run_dir / f"checkpoint_{step:08d}"
    d.mkdir(parents=True)
    (d / "state.pt").write_bytes(f"weights at {step}".encode())
    (d / "meta.json").write_text(f'{{"step": {step}}}')
    return str(d)


def _rotate(h, wid, run_dir, step, keep=3):
    """The source's gang writes a checkpoint and Ray Train's retention deletes all but the newest ``keep``."""
    import shutil

    path = _checkpoint(run_dir, step)
    for old in sorted(run_dir.glob("checkpoint_*"))[:-keep]:
        shutil.rmtree(old)
    h.call("checkpoint_saved", workload_id=wid, path=path, metrics={"step": step})
    return path


def test_checkpoint_reference_is_pinned_against_retention_until_loaded(make, tmp_path):
    h = make()
    runs = tmp_path / "runs" / "src"
    src = submit(h, "src", "team-a", "pretrain", config={"max_steps": 200, "checkpoint_every": 10})
    for step in (10, 20):
        _rotate(h, src, runs, step)
    # Waits for a step still to come: held out of the queue with the reason, not admitted.
    later = submit(h, "ft-later", "team-b", "finetune", config={"init_from": {"workload": "src", "step": 40}})
    # Names a step on disk now: pinned (copied) at once.
    now = submit(h, "ft-now", "team-b", "finetune", config={"init_from": {"workload": src, "step": 20}})
    h.tick()
    assert h.record(later).reason == f"waiting for {src}'s checkpoint at step 40 (last checkpoint at step 20)"
    assert h.record(later).state is State.PENDING
    for step in (30, 40, 50, 60, 70):  # the source trains on; its retention deletes 20 and 40 meanwhile
        _rotate(h, src, runs, step)
    assert not (runs / "checkpoint_00000020").exists() and not (runs / "checkpoint_00000040").exists()
    h.tick()
    assert h.record(later).state is State.ADMITTED
    for wid, step in ((now, 20), (later, 40)):
        got = h.call("resolve_checkpoint", workload_id=wid)
        assert got == {"path": str(runs / "_pinned" / f"checkpoint_{step:08d}"), "step": step, "source": src}
        assert (runs / "_pinned" / f"checkpoint_{step:08d}" / "state.pt").read_bytes() == f"weights at {step}".encode()
    # A consumer's own first checkpoint means it has loaded what it was promised: the copy goes.
    _checkpoint(tmp_path / "runs" / later, 5)
    h.call("checkpoint_saved", workload_id=later, path=str(tmp_path / "runs" / later / "checkpoint_00000005"),
           metrics={"step": 5})
    assert not (runs / "_pinned" / "checkpoint_00000040").exists()
    assert (runs / "_pinned" / "checkpoint_00000020").exists()
    h.call("cancel", workload_id=now)  # ended without loading: its copy goes too
    assert not (runs / "_pinned" / "checkpoint_00000020").exists()
    kinds = h.kinds(later)
    assert kinds[:4] == ["submitted", "pinned", "pinned", "admitted"] and "unpinned" in kinds


def test_checkpoint_reference_that_can_never_resolve_is_refused_or_failed(make, tmp_path):
    h = make()
    runs = tmp_path / "runs" / "src2"
    src = submit(h, "src2", "team-a", "pretrain", config={"max_steps": 100, "checkpoint_every": 10})
    for step in (10, 20, 30, 40):
        _rotate(h, src, runs, step)
    refused = {
        "nobody": "which is not known to the control plane",
        ("src2", 10): "was deleted by its retention",
        ("src2", 500): "trains to step 100 only",
        ("src2", 45): "checkpoints every 10 steps",
    }
    for target, why in refused.items():
        name, step = (target, "latest") if isinstance(target, str) else target
        with pytest.raises(InfeasibleError, match=why):
            submit(h, "ft-bad", "team-b", "finetune", config={"init_from": {"workload": name, "step": step}})
    with pytest.raises(ValidationError, match="config.init_from.step"):
        submit(h, "ft-bad", "team-b", "finetune", config={"init_from": {"workload": "src2", "step": -1}})
    # Promised a step, then the source ends before writing it: the consumer fails with the reason, unqueued.
    waiting = submit(h, "ft-wait", "team-b", "finetune", config={"init_from": {"workload": "src2", "step": 90}})
    h.call("release", workload_id=src, outcome="failed", state="FAILED", detail="crashed")
    h.tick()
    rec = h.record(waiting)
    assert rec.state is State.FAILED
    assert any("failed: config.init_from src2@90: " in note and "ended without a checkpoint at step 90" in note
               for _, note in rec.events), rec.events
    assert rec.attempts == 0


def test_a_pinned_copy_is_an_effect_and_one_that_fails_is_journaled_and_made_again(make, tmp_path, monkeypatch):
    # The state journals the pin, then asks for the copy (PinCheckpoint), which the actor makes once the pin is
    # committed. A copy that fails is journaled on the consumer; resolving its checkpoint pins it again from the
    # original, while that is on disk.
    from raylane.control import checkpoints as ckrefs

    h = make()
    runs = tmp_path / "runs" / "src3"
    src = submit(h, "src3", "team-a", "pretrain", config={"max_steps": 100, "checkpoint_every": 10})
    _rotate(h, src, runs, 10)
    real = ckrefs.copy_pin
    monkeypatch.setattr(ckrefs, "copy_pin", lambda source, path: "OSError: no space left on device")
    ft = submit(h, "ft-copy", "team-b", "finetune", config={"init_from": {"workload": src, "step": 10}})
    pinned = str(runs / "_pinned" / "checkpoint_00000010")
    assert h.take(fx.PinCheckpoint) == [fx.PinCheckpoint(ft, str(runs / "checkpoint_00000010"), pinned)]
    (kind, data), = h.journal(ft)[-1:]
    assert kind == "event" and "OSError: no space left on device" in data["note"] and pinned in data["note"]
    monkeypatch.setattr(ckrefs, "copy_pin", real)
    assert h.call("resolve_checkpoint", workload_id=ft) == {"path": pinned, "step": 10, "source": src}
    assert (runs / "_pinned" / "checkpoint_00000010" / "state.pt").read_bytes() == b"weights at 10"
    assert h.kinds(ft) == ["submitted", "pinned", "pinned", "event", "pinned"]
    h.call("cancel", workload_id=ft)  # no consumer holds the copy any more: it goes
    assert h.take(fx.DropPin) == [fx.DropPin(pinned)] and not (runs / "_pinned" / "checkpoint_00000010").exists()


# --------------------------------------------------------------------------------------------- recovery
def test_a_restart_keeps_the_queue_and_the_leases_whose_groups_exist(make):
    h = make()
    job = submit(h, "driven", "team-b", "eval", job_id="raysubmit_d")
    kept, lost = (submit(h, f"k{i}", "team-a", "pretrain") for i in range(2))
    waiting = submit(h, "two", "team-a", "pretrain", workers=2)  # team-b lends only 1 of its 2 GPUs
    h.tick()
    run(h, job, job_id="raysubmit_d")  # handed over: its reservation is gone, its job is what stays
    h.host.jobs["raysubmit_d"] = "JobStatus.RUNNING"
    assert [h.record(w).state for w in (kept, lost, waiting)] == [State.ADMITTED, State.ADMITTED, State.PENDING]
    before = {w: h.record(w).public() for w in (job, kept, lost, waiting)}
    del h.host.pgs[f"raylane-{lost}.1"]  # its group went while the control plane was down
    h.restart()
    assert h.record(kept).state is State.ADMITTED and h.record(kept).placement == before[kept]["placement"]
    assert h.call("wait_admission", workload_id=kept)["ready"] is True  # its group is placed
    assert h.record(job).state is State.RUNNING
    assert h.record(waiting).state is State.PENDING
    assert h.record(lost).state is State.PENDING
    assert h.journal(lost)[-1] == ("requeued", {"attained_gpu_s": 0.0, "note": "reservation lost while the control "
                                                                               "plane was down; back in the queue"})
    h.tick()
    # The requeued lease goes first, at its original submit time; the recovered leases still hold their GPUs.
    assert h.record(lost).state is State.ADMITTED and h.record(waiting).state is State.PENDING
    assert h.record(lost).submit_time == before[lost]["submit_time"]
    h.call("cancel", workload_id=kept)
    h.tick()
    assert h.record(waiting).state is State.ADMITTED


def test_a_restart_removes_the_groups_whose_removal_was_journaled_but_not_carried_out(make):
    # The actor removes groups on threads of its own after the commit: it may go down in between.
    h = make()
    done, handed, kept = (submit(h, f"g{i}", "team-a", "pretrain") for i in range(3))
    h.tick()
    h.call("release", workload_id=done, outcome="finished", state="SUCCEEDED")
    run(h, handed)
    left = {f"raylane-{done}.1", f"raylane-{handed}.1"}
    for name in left:
        h.host.pgs[name] = "CREATED"  # the removals the effects asked for never reached Ray
    h.host.pgs["raylane-someone-else"] = "CREATED"  # not a reservation of this control plane
    h.take()
    h.restart()
    assert set(h.take(fx.RemoveReservation)) == {fx.RemoveReservation(n) for n in left}
    assert h.host.pgs == {f"raylane-{kept}.1": "CREATED", "raylane-someone-else": "CREATED"}
    assert h.record(kept).state is State.ADMITTED and h.call("wait_admission", workload_id=kept)["ready"] is True


def test_a_restart_keeps_a_started_gang_that_has_no_job_id(make):
    h = make()
    wid = submit(h, "direct", "team-a", "pretrain", workers=2)  # a driver run outside a Ray job
    h.tick()
    run(h, wid)
    h.restart()
    assert h.record(wid).state is State.RUNNING
    assert "requeued" not in h.kinds(wid)


# ------------------------------------------------------------------------------------------------ clock
def test_journal_times_come_from_the_injected_clock(make):
    h = make()
    wid = submit(h, "timed", "team-a", "pretrain")
    h.clock.advance(3)
    h.tick()
    assert [(e.kind, e.ts) for e in h.cs.journal.entries_for(wid)] == [("submitted", T0), ("audit", T0),
                                                                        ("admitted", T0 + 3)]
    assert h.record(wid).admitted_at == T0 + 3
    assert next(r for r in h.call("queue") if r["id"] == wid)["waited_s"] == 3


def test_a_token_expires_by_the_injected_clock(make):
    h = make(auth={"enabled": True})
    op = h.cs.gate.add_token(user="olga", teams=[], role="operator", created_by="test", now=T0)
    short = h.call("token_create", op, user="sam", teams=["team-a"], ttl_s=60.0)["token"]
    assert h.call("whoami", short)["user"] == "sam"
    h.clock.advance(120)
    with pytest.raises(AuthenticationError):
        h.call("whoami", short)


# ------------------------------------------------------------------------------------------------ queue ETA
def test_a_pending_workload_gets_an_eta_after_the_lease_it_waits_for(make):
    # Team A fills the cluster with a 4-GPU gang estimated at 10 minutes; team A's next one waits for it: its forecast
    # start is that gang's end, shown in the queue and explained; the metric exports the wait.
    from raylane import metrics

    h = make()
    big = spec("big", "team-a", "pretrain", workers=2, gpu=2)
    big["runtime_estimate"] = "10m"
    first = h.call("submit", spec=big)["id"]
    h.tick()
    run(h, first)
    h.clock.advance(60)
    nxt = spec("next", "team-a", "pretrain", workers=1, gpu=2)
    nxt["runtime_estimate"] = "5m"
    second = h.call("submit", spec=nxt)["id"]
    h.tick()
    start = h.cs.records[first].admitted_at
    (row,) = [r for r in h.call("queue") if r["id"] == second]
    assert row["eta_start"] == pytest.approx(start + 600) and row["eta_finish"] == pytest.approx(start + 900)
    out = h.call("explain", workload_id=second)
    assert out["eta_start"] == pytest.approx(start + 600) and first in out["eta_text"]
    waits = {dict(k[1])["team"]: v for k, v in metrics.snapshot("raylane_queue_eta_wait_seconds").items()
             if dict(k[1]).get("workload_class") == "pretrain"}
    assert waits["team-a"] == pytest.approx(start + 600 - h.clock())
    # Recomputed at most every ETA_EVERY_S: a cancel of the lease it waits for shows once the cache is old.
    h.call("cancel", workload_id=first)
    h.tick()
    assert [r for r in h.call("queue") if r["id"] == second][0]["state"] == "ADMITTED"
    # The gauge of the next tick still reads that forecast, where the admitted workload had the longest wait: it
    # shows no wait for the team and class now.
    h.tick()
    assert second in h.cs.queue_etas.last
    waits = {dict(k[1])["team"]: v for k, v in metrics.snapshot("raylane_queue_eta_wait_seconds").items()
             if dict(k[1]).get("workload_class") == "pretrain"}
    assert waits["team-a"] == -1


def test_a_workload_queued_since_the_last_forecast_gets_one_within_a_second(make):
    h = make()
    first = submit(h, "big", "team-a", "pretrain", workers=2, gpu=2)
    h.tick()
    run(h, first)
    assert h.cs.etas() == {}  # nothing pending: nothing forecast, and that answer is kept a while
    h.clock.advance(0.5)
    second = submit(h, "next", "team-a", "pretrain", workers=1, gpu=2)
    assert second not in h.cs.etas()  # within a second of the last forecast: kept
    h.clock.advance(0.6)
    assert h.cs.etas()[second].start == pytest.approx(h.cs.records[first].admitted_at + 600)  # 10m class default


@pytest.mark.parametrize("restart", [False, True], ids=["running", "after a restart"])
def test_the_victim_that_just_checkpointed_is_chosen_also_after_a_restart(make, restart):
    # Two sweeps of team-a: s1 started first but checkpointed 10 s ago, s2 never did (it would lose 110 s). A
    # restart rebuilds the leases from the journal, their last checkpoints included, so the choice is the same.
    h = make()
    for i in range(2):
        submit(h, f"b{i}", "team-b", "pretrain")
    s1 = submit(h, "s1", "team-a", "sweep")
    h.tick()
    h.clock.advance(10)
    s2 = submit(h, "s2", "team-a", "sweep")
    h.tick()
    h.clock.advance(100)
    h.call("checkpoint_saved", workload_id=s1, path="/runs/s1/checkpoint_00000003", metrics={"step": 3})
    h.clock.advance(10)
    if restart:
        h.restart()
    submit(h, "f", "team-a", "finetune")
    h.tick()
    assert ("preempting" in h.kinds(s1), "preempting" in h.kinds(s2)) == (True, False)
