"""``--estimates predicted``: the simulator learns runtimes as the live plane does, from what has ended, and nothing
else. No Ray."""
from __future__ import annotations

import random
from dataclasses import replace

import pytest

from raylane.runtimes import RuntimeModel
from raylane.scheduling.types import SchedulerConfig
from raylane.sim import SimOptions, Simulator, apply_preset, cluster_from_flags, get_preset
from tests.sim.builders import job, trace


class Recording(RuntimeModel):
    """A runtime model that keeps what it was asked and told, in order."""

    def __init__(self):
        super().__init__()
        self.calls = []  # ("predict", features, answer) or ("observe", features, runtime)

    def predict(self, f, estimate_s=None):
        d = super().predict(f, estimate_s)
        self.calls.append(("predict", f, d))
        return d

    def observe(self, f, runtime_s, estimate_s=None):
        self.calls.append(("observe", f, runtime_s))
        super().observe(f, runtime_s, estimate_s)


def _trace(durations):
    rng = random.Random(3)
    jobs = []
    for i, d in enumerate(durations):
        jobs.append(job(f"j{i:02d}").at(i * 400.0).runs(d).gpus(rng.choice([1, 2, 4]))
                    .user(f"u{i % 3}"))
    return trace(*jobs)


def _run(tr, preset="qssf"):
    cfg, opts = apply_preset(get_preset(preset), SchedulerConfig(admission="none"), SimOptions())
    sim = Simulator(tr, cluster_from_flags(1, 8).nodes(), {}, cfg, options=opts)
    model = sim.runtime_model = Recording()
    return sim.run(), model


DURATIONS = [random.Random(5).choice([300.0, 900.0, 3600.0, 7200.0]) for _ in range(40)]


@pytest.mark.parametrize("preset", ["qssf", "gittins", "srtf-predicted"])
def test_no_later_duration_reaches_a_prediction(preset):
    # The same trace with some jobs' durations changed: every prediction made before the first changed job could
    # have ended in either run (so the two worlds are the same until then) is the same; a prediction that read a
    # job's duration before its end would differ.
    changed = {7, 15, 22}
    longer = [d * 7 if i in changed else d for i, d in enumerate(DURATIONS)]
    r1, m1 = _run(_trace(DURATIONS), preset)
    r2, m2 = _run(_trace(longer), preset)
    ends = {j.id: r1.finish[k] for k, j in enumerate(r1.jobs)}
    cut = min(ends[f"j{i:02d}"] for i in changed)
    arrivals = sorted(j.submit for j in r1.jobs)
    p1 = [c[2] for c in m1.calls if c[0] == "predict"]
    p2 = [c[2] for c in m2.calls if c[0] == "predict"]
    before = [k for k, t in enumerate(arrivals) if t < cut]
    assert len(before) >= 10  # enough predictions before the cut to mean something
    assert [p1[k] for k in before] == [p2[k] for k in before]
    # ... and the changed durations did reach predictions made after they ended.
    assert p1 != p2


def test_the_model_is_told_only_what_has_ended_with_the_service_it_had():
    r, m = _run(_trace(DURATIONS))
    observed = [c for c in m.calls if c[0] == "observe"]
    assert len(observed) == len(r.jobs)
    # Without preemption a job's service is its duration; each is told once, in the order the jobs finished.
    by_end = sorted(range(len(r.jobs)), key=lambda k: (r.finish[k], k))
    assert sorted(c[2] for c in observed) == sorted(DURATIONS)
    # Before the first end, nothing is known: the first arrivals are predicted nothing.
    first_end = min(r.finish)
    first = [c for c in m.calls if c[0] == "predict"][0]
    assert first[2] is None and r.jobs[by_end[0]].submit + DURATIONS[by_end[0]] <= first_end + 1e-6


def test_predicted_estimates_are_refused_nowhere_and_named_in_the_options():
    with pytest.raises(Exception, match="predicted"):
        SimOptions(estimates="guessed")
    assert replace(SimOptions(), estimates="predicted").estimates == "predicted"


def test_a_journal_replay_learns_from_the_journals_own_history(tmp_path):
    # Three runs of one name end on the live plane; the journal's replay predicts the fourth from them, by the same
    # keys (owner and name, code and config) the control plane's model used.
    from raylane.config.loader import load_policy_from_dict
    from raylane.control.learned import features_of
    from raylane.sim.journal import trace_from_journal
    from tests.controltest import Harness
    from tests.raytest import local_policy, spec

    policy = local_policy(pretrain={"min_runtime": 0})
    h = Harness(str(tmp_path / "journal.db"), policy)
    try:
        for s in (600, 1200, 2400, 900):
            wid = h.call("submit", spec=spec("pretrain-x", "team-a", "pretrain", workers=2, gpu=2))["id"]
            h.tick()
            h.call("report", workload_id=wid, kind="running")
            h.clock.advance(s)
            h.call("release", workload_id=wid, outcome="finished", state="SUCCEEDED")
            h.tick()
        live = features_of(h.record(wid))
    finally:
        h.close()
    pol = load_policy_from_dict(policy, "test")
    # The journal records the policy the control plane started with: no --policy needed.
    assert trace_from_journal(str(tmp_path / "journal.db")).policy == policy
    replay = trace_from_journal(str(tmp_path / "journal.db"), pol)
    jobs = replay.trace.jobs
    assert [(j.user, j.name, j.entry) for j in jobs] == [(live.user, live.name, live.entry)] * 4
    cfg = pol.to_scheduler_config()
    sim = Simulator(replay.trace, replay.nodes, pol.core_teams(), cfg,
                    classes={n: pol.workload_class(n) for n in pol.classes},
                    options=SimOptions(estimates="predicted-declared"))
    model = sim.runtime_model = Recording()
    sim.run()
    last = [c[2] for c in model.calls if c[0] == "predict"][-1]
    assert last.describe().startswith("3 runs of ")
    assert last.basis_at(0).level == "user-name"
