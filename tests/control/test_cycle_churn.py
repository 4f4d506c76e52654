"""The control plane never cycles in a loop: traces through the state machine (``tests.controltest.Harness``) with
gangs that take 30 s to start (Ray Train's hand-over), under the default policy's classes and quotas on a small
cluster where teams borrow and reclaim, preempting admitted gangs before and after they start. Every change asks
for at most a few cycles before something outside the control plane happens again, and no job is admitted over
and over (issue 46: a gang preempted before its hand-over is released at once and asks for another cycle). Ray-free;
the driver is ``tests.gangdriver.Live``."""
from __future__ import annotations

import random

import pytest
import yaml

from raylane.sim.generate import generate
from tests.controltest import Harness
from tests.gangdriver import Job, Live
from tests.raytest import REPO, spec

TEAMS = ["nlp", "vision", "research", "platform"]
CLASSES = ["pretrain", "finetune", "sweep", "eval", "batch-inference"]


SCALE = 1 / 30  # the trace's times, shortened: hours of trace in minutes, a few thousand ticks


def jobs_of(mix: str, seed: int, n: int, gpus: int):
    trace = generate(mix, seed=seed, jobs=n, cluster_gpus=gpus, load=1.1, teams=len(TEAMS))
    rng = random.Random(seed)
    out = []
    for j in trace.jobs:
        w = j.workers or 1
        s = spec(j.id, TEAMS[int(j.team.split("-")[1])], rng.choice(CLASSES), workers=w, gpu=j.gpus / w, cpu=1)
        out.append(Job(j.id, s, j.submit * SCALE, max(60.0, j.duration * SCALE), w))
    return out


@pytest.mark.parametrize("mix,seed", [("shared-burst", 0), ("shared-burst", 1), ("heavy-tail", 0)])
def test_no_change_sets_off_a_loop_of_cycles_and_no_gang_is_admitted_over_and_over(tmp_path, mix, seed):
    policy = yaml.safe_load((REPO / "policies" / "default.yaml").read_text())
    h = Harness(str(tmp_path / "journal.db"), policy,
                nodes=[(f"n{i}", {"gpus": 8, "cpus": 96, "memory_gib": 1024}) for i in range(2)])
    try:
        live = Live(h, jobs_of(mix, seed, 40, 16), handover_s=30.0, stop_s=5.0, max_cycles_per_change=8)
        live.run()
        ended = [j for j in live.jobs if j.end is not None]
        assert len(ended) == len(live.jobs)
        preempted = sum(h.record(j.wid).preemptions for j in live.jobs if j.wid)
        assert preempted >= 1, "the scenario preempts (else it tests nothing)"
        assert live.most_quiet <= 3, live.most_quiet
        for j in live.jobs:
            if j.wid is not None:
                rec = h.record(j.wid)
                assert j.admissions <= rec.preemptions + rec.restarts + 1, (j.id, j.admissions, j.story)
    finally:
        h.close()


def test_the_cycles_changes_ask_for_between_two_ticks_are_bounded(tmp_path):
    # A flip-flop (cycles whose decisions keep undoing each other, each asking for the next) runs at most
    # CYCLE_AGAIN_MAX cycles between two full ticks of the control plane, then waits for the tick.
    from raylane.scheduling.apply import CYCLE_AGAIN_MAX

    h = Harness(str(tmp_path / "j.db"), yaml.safe_load((REPO / "policies" / "default.yaml").read_text()))
    try:
        h.tick(full=True)
        ran = 0
        for _ in range(3 * CYCLE_AGAIN_MAX):
            h.cs._poke()  # what a release at once does
            if not h.cs.wants_cycle:
                break
            h.tick(full=False)
            ran += 1
        assert ran == CYCLE_AGAIN_MAX
        h.tick(full=True)
        h.cs._poke()
        assert h.cs.wants_cycle  # a full tick opens the next window
    finally:
        h.close()
