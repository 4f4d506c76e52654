"""The control plane's short cycles against its full ticks (issue 46's flip-flop). Ray-free.

A preemptor keeps what it freed across the short cycles, and a short cycle stops no running gang (the full tick
decides every stop).

The control plane runs a full cycle each tick (``MAX_EXAMINED`` pending workloads looked at) and, after a change, a
shorter one (``CHANGE_EXAMINED``). A workload that the short cycle's window does not reach can preempt, at a full
tick, a gang that has not started yet: that gang is released at once and requeued ahead of it, and the short cycle
its release asks for admitted it again in the room freed for the preemptor, which preempted it again at the next
tick: a gang preempted and re-admitted every second, and the preemptor waiting for ever. Now the preemptor is
*nominated* (``raylane.scheduling.apply``) and every cycle examines it, past its window too.

The scenario: one node of 2 GPUs. Team ``a`` (nominal 1 GPU, may borrow 1) runs ``a-hold`` (1 GPU, not
preemptible) and ``a-extra`` (1 GPU, borrowed, not preemptible, ends at 30 s). Team ``b`` (nominal 1 GPU) queues
more borrowers than a short cycle examines (2-GPU gangs that cannot start while ``a-hold`` runs) ahead of ``b-low``
(1 GPU, the lowest class): the short cycles never reach it. When ``a-extra`` ends, the short cycle admits ``a-eval``
(``a``'s, eval: no minimum runtime), borrowing; at the next tick ``b-low``, within its team's nominal quota,
reclaims it.
"""
from __future__ import annotations

from raylane.control.state import CHANGE_EXAMINED
from tests.controltest import Harness
from tests.gangdriver import Job, Live
from tests.raytest import spec

POLICY = {
    "scheduler": {"ordering": "priority", "backfill": "none", "preemption": "default"},
    "classes": {
        "pinned": {"priority": 300, "preemptible": False},
        "eval": {"priority": 150, "preemptible": True, "min_runtime": 0, "grace_period": "30s"},
        "wide": {"priority": 100, "preemptible": True, "grace_period": "30s"},
        "sweep": {"priority": 50, "preemptible": True, "min_runtime": 0, "grace_period": "30s"},
    },
    "teams": {
        "a": {"quotas": {"gpu": {"nominal": 1, "borrowing_limit": 1}}},
        "b": {"quotas": {"gpu": {"nominal": 1, "borrowing_limit": 1}}},
    },
}


def test_a_gang_preempted_before_it_started_is_not_readmitted_in_the_room_freed_for_its_preemptor(tmp_path):
    h = Harness(str(tmp_path / "journal.db"), POLICY, nodes=[("n0", {"gpus": 2, "cpus": 96, "memory_gib": 1024})])
    h.host.forecast = lambda run, done: done(None, 0.0, 0.0)
    jobs = [Job("a-hold", spec("a-hold", "a", "pinned"), 0.0, 10_000.0, 1),
            Job("a-extra", spec("a-extra", "a", "pinned"), 0.0, 30.5, 1)]
    jobs += [Job(f"b-wide-{i}", spec(f"b-wide-{i}", "b", "wide", gpu=2), 1.0 + i / 1000, 600.0, 1)
             for i in range(CHANGE_EXAMINED + 2)]
    jobs += [Job("b-low", spec("b-low", "b", "sweep"), 2.0, 600.0, 1),
             Job("a-eval", spec("a-eval", "a", "eval"), 3.0, 600.0, 1)]
    # Ray Train takes 20 s to start a gang: the eval gang is preempted before it has started.
    live = Live(h, jobs, handover_s=20.0, stop_s=5.0, spacing_s=0.02)
    live.run(until=120.0)
    by = {j.id: j for j in live.jobs}
    low, ev = by["b-low"], by["a-eval"]
    stories = f"a-eval: {ev.story}; b-low: {low.story}"
    # b-low is admitted into the GPU freed for it just after the tick that freed it (a-extra ends at 50.5 s: its
    # 20 s hand-over and 30.5 s of work; a-eval is admitted then and preempted at the tick at 51 s)
    admitted = [t for t, what in low.story if what == "admitted"]
    assert admitted and admitted[0] <= 51.0 + 0.1, stories
    # and a-eval was admitted once, by the short cycle after a-extra's end, and preempted once, not once a tick
    assert ev.admissions <= 2, stories
    assert h.record(ev.wid).preemptions <= 1, stories
    # and no change asked for more than a few cycles in a row (the driver fails past 50: ``Churn``)
    assert live.most_quiet <= 3, live.most_quiet
    h.close()


def test_a_cycle_between_full_ticks_stops_no_running_gang_the_next_full_tick_does(tmp_path):
    from raylane.control.records import State

    h = Harness(str(tmp_path / "journal.db"), POLICY, nodes=[("n0", {"gpus": 2, "cpus": 96, "memory_gib": 1024})])
    h.host.forecast = lambda run, done: done(None, 0.0, 0.0)
    low = h.call("submit", spec=spec("b-low", "b", "sweep", gpu=2))["id"]
    h.tick(full=True)
    h.call("report", workload_id=low, kind="running", job_id=f"raysubmit_{low}")
    high = h.call("submit", spec=spec("b-eval", "b", "eval", gpu=2))["id"]
    h.clock.advance(0.02)
    h.tick(full=False)  # the cycle the submission asks for
    assert h.record(low).state is State.RUNNING and h.record(high).state is State.PENDING
    h.clock.advance(0.98)
    h.tick(full=True)
    assert h.record(low).state is State.PREEMPTING
    h.close()
