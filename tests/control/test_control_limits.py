"""Run limits in the control plane, without Ray: a class's ``max_runtime`` enforced by ``ControlState`` on its full
ticks (``raylane.control.state_limits``), driven by a fake clock and host (``tests/controltest.py``).

The cluster and policy are ``tests/control/test_control_state.py``'s (``policies/local.yaml``: every class has a 20 s
grace period and, but eval, a checkpoint every 5 s), with a limit given to the ``sweep`` class.
"""
from __future__ import annotations

import pytest

from raylane.control import effects as fx
from raylane.control.records import State
from tests.controltest import Harness, node_id
from tests.raytest import local_policy, spec

GRACE_S = 20.0
REQUEUED_1M = "ran 1m00s since its admission, its class 'sweep' allows max_runtime 1m: requeued after a checkpoint"
STOPPED_1M = "ran 1m00s in all its attempts, its class 'sweep' allows max_runtime 1m: stopped"


@pytest.fixture
def make(tmp_path):
    """``make(on_max_runtime="requeue", max_runtime="1m")``: a harness whose sweep class has that limit."""
    made = []

    def make_(on_max_runtime="requeue", max_runtime="1m", **kw):
        limit = {} if max_runtime is None else {"max_runtime": max_runtime, "on_max_runtime": on_max_runtime}
        h = Harness(str(tmp_path / f"journal-{len(made)}.db"), local_policy(sweep=limit), **kw)
        made.append(h)
        return h

    yield make_
    for h in made:
        h.close()


def started(h, name="s", cls="sweep", job_id=None) -> str:
    """A 1-GPU workload of ``cls`` submitted, admitted and handed over to Ray Train; its workers registered."""
    extra = {"job_id": job_id} if job_id else {}
    wid = h.call("submit", spec=spec(name, "team-a", cls), **extra)["id"]
    h.tick()
    h.call("report", workload_id=wid, kind="running")
    h.call("register_workers", workload_id=wid, handles=[f"{wid}-w0"])
    h.take()
    return wid


def test_requeue_asks_the_gang_to_stop_at_the_limit_and_puts_it_back_at_its_place(make):
    h = make("requeue")
    wid = started(h)
    submitted_at = h.record(wid).submit_time
    h.clock.advance(59.5)
    h.tick()
    assert h.record(wid).state is State.RUNNING and "run_limit" not in h.kinds(wid)
    h.clock.advance(0.5)
    h.tick(full=False)  # a cycle between full ticks does not look at the limits
    assert h.record(wid).state is State.RUNNING
    h.tick()
    rec = h.record(wid)
    assert rec.state is State.PREEMPTING and rec.stop_deadline == h.clock() + GRACE_S
    assert rec.reason == REQUEUED_1M and rec.run_limits == 1 and rec.preemptions == 0
    kind, data = h.journal(wid)[-1]
    assert kind == "run_limit" and (data["action"], data["ran_s"], data["limit_s"]) == ("requeue", 60.0, 60.0)
    assert h.call("should_stop", workload_id=wid) is True
    assert h.take(fx.KillWorkers) == []  # asked, not forced
    h.clock.advance(3)
    assert h.call("release", workload_id=wid, outcome="yielded", step=12)["state"] == "PENDING"
    rec = h.record(wid)
    assert (rec.step, rec.submit_time, rec.preemptions) == (12, submitted_at, 0)
    assert rec.events[-1][1] == f"back in the queue (yielded at step 12): {REQUEUED_1M}"
    out = h.call("explain", workload_id=wid)  # what `raylane explain` shows
    assert [e["kind"] for e in out["journal"]][-2:] == ["run_limit", "requeued"] and out["run_limits"] == 1
    assert out["journal"][-2]["note"] == f"{REQUEUED_1M} (its gang has 20s to save a checkpoint and stop)"
    requeued = [data for kind, data in h.journal(wid) if kind == "requeued"]
    assert requeued[0]["attained_gpu_s"] == 63.0 and requeued[0]["run_limit"] is True  # 1 GPU for 63 s


def test_requeue_gives_each_attempt_a_fresh_limit(make):
    h = make("requeue")
    wid = started(h)
    h.clock.advance(60)
    h.tick()
    h.call("release", workload_id=wid, outcome="yielded", step=1)
    h.tick()  # the cluster is idle: admitted again at once
    h.call("report", workload_id=wid, kind="running")
    h.clock.advance(59)
    h.tick()
    assert h.record(wid).state is State.RUNNING  # 59 s of this attempt, 119 s in all
    h.clock.advance(1)
    h.tick()
    assert h.record(wid).state is State.PREEMPTING and h.record(wid).run_limits == 2
    assert h.kinds(wid) == ["submitted", "admitted", "running", "run_limit", "requeued", "admitted", "running",
                            "run_limit"]


def test_stop_counts_every_attempt_and_ends_the_workload_failed_after_a_forced_stop(make):
    h = make("stop")
    wid = started(h, job_id="raysubmit_s")
    h.host.jobs["raysubmit_s"] = "JobStatus.RUNNING"
    first = h.record(wid).placement[0]
    h.clock.advance(40)
    h.host.kill_node(_name_of(first))
    h.tick()  # its node is lost: requeued, and admitted on the other node in the same tick
    rec = h.record(wid)
    assert rec.state is State.ADMITTED and rec.past_run_s == 40.0 and rec.placement[0] != first
    h.call("report", workload_id=wid, kind="running")
    h.call("register_workers", workload_id=wid, handles=["w-b"])
    h.clock.advance(19.5)
    h.tick()
    assert h.record(wid).state is State.RUNNING  # 59.5 s in all
    h.clock.advance(0.5)
    h.tick()
    rec = h.record(wid)
    assert rec.state is State.PREEMPTING and rec.reason == STOPPED_1M
    h.take()
    h.clock.advance(GRACE_S)
    h.tick()
    rec = h.record(wid)
    assert rec.state is State.FAILED and rec.outcome == "max runtime" and rec.reason == STOPPED_1M
    assert rec.events[-1][1] == f"failed (stopped by force after the grace period): {STOPPED_1M}"
    effects = h.take()
    assert fx.KillWorkers(wid, ("w-b",)) in effects and fx.Wake(wid) in effects
    # As after a cancel: its MLflow run is closed and its job stopped if the driver does not exit.
    assert rec.run_to_close and rec.job_stop_at == h.clock() + h.cs.cancel_grace_s
    assert wid not in h.cs.state.leases and not h.cs.state.is_pending(wid)


def test_stop_after_the_gang_yields_ends_it_and_its_driver_sees_the_end(make):
    h = make("stop")
    wid = started(h)
    h.clock.advance(61)
    h.tick()
    h.call("release", workload_id=wid, outcome="yielded", step=30)
    rec = h.record(wid)
    assert rec.state is State.FAILED and rec.step == 30 and rec.job_stop_at is None  # no job of its own
    assert h.call("wait_admission", workload_id=wid)["state"] == "FAILED"
    assert h.kinds(wid)[-2:] == ["run_limit", "finished"]


def _name_of(nid: str) -> str:
    return next(n for n in ("gpu-a", "gpu-b") if node_id(n) == nid)


def test_a_gang_not_running_yet_is_limited_once_it_runs(make):
    h = make("requeue")
    wid = h.call("submit", spec=spec("slow", "team-a", "sweep"))["id"]
    h.tick()
    h.clock.advance(90)
    h.tick()
    assert h.record(wid).state is State.ADMITTED  # its driver has not handed the reservation over yet
    h.call("report", workload_id=wid, kind="running")
    h.tick()
    rec = h.record(wid)
    assert rec.state is State.PREEMPTING and rec.run_limit["ran_s"] == 90.0  # counted from its admission


def test_a_class_without_a_limit_is_never_stopped_for_one(make):
    h = make(max_runtime=None)
    wid = started(h)
    other = started(h, "p", cls="pretrain")
    for _ in range(3):
        h.clock.advance(10 * 86400)
        h.tick()
    assert [h.record(w).state for w in (wid, other)] == [State.RUNNING] * 2
    assert "run_limit" not in h.kinds(wid) + h.kinds(other)


def test_a_restart_keeps_the_limits_of_running_gangs_and_of_those_stopping(make):
    h = make("requeue")
    wid = started(h)
    h.clock.advance(30)
    h.restart()
    h.clock.advance(30)
    h.tick()
    assert h.record(wid).state is State.PREEMPTING and h.record(wid).reason == REQUEUED_1M
    h.restart()  # stopping for its limit: its deadline holds, and it is forced after it
    assert h.record(wid).state is State.PREEMPTING
    h.clock.advance(GRACE_S)
    h.tick()
    rec = h.record(wid)
    assert rec.state in (State.PENDING, State.ADMITTED) and rec.preemptions == 0
    assert (f"back in the queue (stopped by force after the grace period): {REQUEUED_1M}"
            in [note for _, note in rec.events])


def test_a_policy_reload_that_sets_a_limit_applies_to_running_gangs(make):
    h = make(max_runtime=None)
    wid = started(h)
    h.clock.advance(120)
    h.tick()
    h.call("reload_policy", policy=local_policy(sweep={"max_runtime": "1m", "on_max_runtime": "stop"}))
    assert h.record(wid).state is State.RUNNING
    h.tick()
    rec = h.record(wid)
    assert rec.state is State.PREEMPTING
    assert rec.reason == "ran 2m00s in all its attempts, its class 'sweep' allows max_runtime 1m: stopped"
