"""The simulator decides as the live control plane does, job for job (issue 46, item 3). Ray-free.

A generated trace (a few hundred jobs at 1/30 of their times) runs twice under ``policies/default.yaml`` (four teams
with quotas and cohort borrowing, classes of several priorities and grace periods; its training classes made
resizable, and a share of their gangs elastic), on four 8-GPU nodes, one of which is lost part-way:

- **live**: through the control plane's state machine (``tests.controltest.Harness``), whose gangs are played by
  ``tests.gangdriver.Live`` as real ones behave: Ray Train's hand-over after each admission, a checkpoint every
  class interval of run, a stop asked answered (with a checkpoint) a few seconds later, a release when the work is
  done; the actor's loop: a full tick every second and a cycle after each change;
- **simulated**: the journal the live run left, read as a trace (``raylane.sim.journal``) with each job's true work,
  replayed by the simulator with ``fidelity="live"`` and the gangs' hand-over and stop delay.

Both must admit, preempt, resize, requeue and end every job at the same times. The driver's cycle after a change
comes at once here (the actor waits 20 ms: ``CYCLE_SPACING_S``), so that the two clocks read alike.
"""
from __future__ import annotations

import random
from dataclasses import replace

import pytest
import yaml

from raylane.config.loader import load_policy_from_dict
from raylane.sim.generate import generate
from raylane.sim.journal import simulate_journal, trace_from_journal
from tests.controltest import Harness
from tests.gangdriver import Job, Live
from tests.raytest import REPO, spec

TEAMS = ["nlp", "vision", "research", "platform"]
CLASSES = ["pretrain", "finetune", "sweep", "eval", "batch-inference"]
RESIZABLE = ("pretrain", "finetune", "sweep")
SCALE = 1 / 30
HANDOVER_S, STOP_S = 20.0, 5.0
NODES = 4


def policy_dict():
    pol = yaml.safe_load((REPO / "policies" / "default.yaml").read_text())
    for name in RESIZABLE:
        pol["classes"][name]["resizable"] = True
    return pol


def jobs_of(mix: str, seed: int, n: int, pol):
    classes = load_policy_from_dict(pol, "policy")
    trace = generate(mix, seed=seed, jobs=n, cluster_gpus=8 * NODES, load=1.1, teams=len(TEAMS))
    rng = random.Random(seed)
    out = []
    for j in trace.jobs:
        w = j.workers or 1
        cls = rng.choice(CLASSES)
        s = spec(j.id, TEAMS[int(j.team.split("-")[1])], cls, workers=w, gpu=j.gpus / w, cpu=1)
        size, work = w, max(60.0, round(j.duration * SCALE))
        if cls in RESIZABLE and rng.random() < 0.5:
            # elastic: it asks for its smallest size (the core's ``workers``), its work counted at that size; long
            # enough to be running when the queue drains (it then grows) or a higher class needs room (it shrinks)
            size, work = max(1, w // 2), max(work, 900.0)
            s["gang"]["workers"] = {"min": size, "max": max(2, 2 * size)}
        out.append(Job(j.id, s, j.submit * SCALE, work, size,
                       checkpoint_s=classes.workload_class(cls).checkpoint_interval_s))
    return out


def live_run(tmp_path, mix, seed, n):
    pol = policy_dict()
    h = Harness(str(tmp_path / "journal.db"), pol,
                nodes=[(f"n{i}", {"gpus": 8, "cpus": 96, "memory_gib": 1024}) for i in range(NODES)])
    # The queue forecast (ETAs: a view, not a decision) is not run: at a full tick a second it would be most of the
    # test's time.
    h.host.forecast = lambda run, done: done(None, 0.0, 0.0)
    jobs = jobs_of(mix, seed, n, pol)
    span = max(j.submit for j in jobs)
    lose_at = round(jobs[0].submit + span / 2)
    live = Live(h, jobs, handover_s=HANDOVER_S, stop_s=STOP_S, spacing_s=0.0, max_cycles_per_change=20,
                events=[(lose_at, lambda h: h.host.kill_node("n1"))])
    live.run()
    return h, live, pol


def outcomes_live(h, live, rep):
    """Per job: its first admission (the journal's, from the trace's origin: its first submission), its end and its
    preemptions."""
    first = min(j.submit for j in live.jobs if j.wid)
    return {j.wid: (round(rep.starts[j.wid], 3), round(j.end - first, 3), h.record(j.wid).preemptions)
            for j in live.jobs if j.wid}


def outcomes_sim(r):
    return {job.id: (round(r.first_start[k], 3), round(r.finish[k], 3), r.preemptions[k])
            for k, job in enumerate(r.jobs)}


@pytest.mark.parametrize("mix,seed,n", [("shared-burst", 0, 150), ("shared-burst", 1, 200), ("heavy-tail", 1, 100)])
def test_the_simulator_decides_as_the_live_plane_job_for_job(tmp_path, mix, seed, n):
    h, live, pol = live_run(tmp_path, mix, seed, n)
    try:
        rep = trace_from_journal(str(tmp_path / "journal.db"))
        work = {j.wid: j.work for j in live.jobs if j.wid}
        rep.trace = replace(rep.trace, jobs=[replace(tj, duration=work[tj.id]) for tj in rep.trace.jobs])
        r = simulate_journal(rep, load_policy_from_dict(pol, "policy"), fidelity="live", handover_s=HANDOVER_S,
                             stop_delay_s=STOP_S, resize_overhead_s=HANDOVER_S)
        want, got = outcomes_live(h, live, rep), outcomes_sim(r)
        # times to the millisecond: the driver sums each gang's work piecewise, the simulator in one step
        differ = {k: (want[k], got.get(k)) for k in want
                  if got.get(k) is None or want[k][2] != got[k][2]
                  or any(abs(a - b) > 2e-3 for a, b in zip(want[k][:2], got[k][:2]))}
        kinds = [k for j in live.jobs if j.wid for k, d in h.journal(j.wid)
                 if k in ("resized", "preempting") or (k == "requeued" and d.get("lost_node"))]
        # the scenario preempts, resizes and loses a node under running leases (else it tests little)
        assert kinds.count("preempting") >= 3 and kinds.count("resized") >= 1 and kinds.count("requeued") >= 1, kinds
        assert not differ, f"{len(differ)} of {len(want)} jobs differ (live, sim): " + str(
            sorted(differ.items(), key=lambda kv: kv[1][0][0] or 0)[:5])
    finally:
        h.close()
