"""Synchronous successive halving (``raylane.sweeps.rungs``) without Ray: the same trials' results give the same
stopped set whatever order the trials reach the rungs in (Tune's asynchronous ASHA does not: the contrast case), the
cohort rules (trials not drawn yet, trials that end early, ties, NaN), the Tune shell on a fake controller, and the
quota plug-in not counting a trial that waits at a rung (else a sweep with fewer slots than trials deadlocks)."""
from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Dict, List

import pytest
from ray.tune.experiment import Trial
from ray.tune.schedulers import TrialScheduler

from raylane.sweeps import quota
from raylane.sweeps.rungs import Halving, RungDecision, SynchronousHalvingScheduler, Verdict

# Eight trials; the score at a step is ``base + 1/step`` (lower is better), so the ranking is the same at every rung
# except where a curve crosses another (t5 starts bad and ends best: the late bloomer).
CURVES: Dict[str, Dict[int, float]] = {
    t: {s: base + 1.0 / s for s in (10, 20, 40, 80)}
    for t, base in {"t0": 0.9, "t1": 0.5, "t2": 0.7, "t3": 0.2, "t4": 0.8, "t6": 0.4, "t7": 0.6}.items()
}
CURVES["t5"] = {10: 1.5, 20: 1.0, 40: 0.1, 80: 0.05}
RUNGS, ETA, TOP = (10, 20, 40), 2, 80
# By hand: rung 10 ranks t3 t6 t1 t7 | t2 t4 t0 t5 -> 4 go on; rung 20: t3 t6 | t1 t7; rung 40: t3 (0.225) vs t6
# (0.425) -> t3. The late bloomer t5 is dropped at 10 (successive halving does not wait for it).
EXPECTED_STOPPED = {"t2": 10, "t4": 10, "t0": 10, "t5": 10, "t1": 20, "t7": 20, "t6": 40}
EXPECTED_STEPS = 8 * 10 + 4 * 10 + 2 * 20 + 1 * 40  # 200 of 640


def simulate(halving: Halving, curves, order_seed: int, report_every: int = 10, concurrency: int = 3):
    """Drive ``halving`` like Tune would, with trials taking turns in a random (seeded) order: at most
    ``concurrency`` run at once, a waiting trial frees its place, a promoted one resumes when a place is free.
    Returns (trial -> last step trained, rung decisions)."""
    rng = random.Random(order_seed)
    todo = sorted(curves)
    rng.shuffle(todo)  # the order the search draws them is fixed in Tune; here even that moves
    step = {t: 0 for t in curves}
    running: List[str] = []
    waiting: set = set()
    done: set = set()
    while len(done) < len(curves):
        while len(running) < concurrency and (todo or any(not halving.waiting(t) for t in waiting)):
            resumable = sorted(t for t in waiting if not halving.waiting(t) and t not in done)
            t = resumable[0] if resumable else todo.pop()
            waiting.discard(t)
            halving.add(t)
            running.append(t)
        t = rng.choice(running)  # whoever reports next: timing
        step[t] += report_every
        outcome = halving.on_result(t, step[t], curves[t][step[t]] if step[t] in curves[t] else 0.0)
        for d in outcome.decided:
            for s in d.stopped:
                if s != t and s in waiting:
                    waiting.discard(s)
                    done.add(s)
                    halving.on_end(s)
        if outcome.verdict is Verdict.WAIT:
            running.remove(t)
            waiting.add(t)
        elif outcome.verdict is Verdict.STOP:
            running.remove(t)
            done.add(t)
            halving.on_end(t)
        if not running and not todo and all(halving.waiting(w) for w in waiting) and waiting:
            raise AssertionError(f"deadlock: {sorted(waiting)} wait and nothing runs")
    return step, halving.decisions


def new_halving(**kw) -> Halving:
    return Halving(rungs=kw.pop("rungs", RUNGS), eta=kw.pop("eta", ETA), expected=kw.pop("expected", len(CURVES)),
                   max_t=kw.pop("max_t", TOP), **kw)


@pytest.mark.parametrize("order_seed", range(40))
def test_the_stopped_set_does_not_depend_on_the_order_trials_reach_the_rungs(order_seed):
    steps, decisions = simulate(new_halving(), CURVES, order_seed)
    stopped = {t: s for t, s in steps.items() if s < TOP}
    assert stopped == EXPECTED_STOPPED
    assert sum(steps.values()) == EXPECTED_STEPS
    assert [(d.step, d.promoted) for d in decisions] == [(10, ("t3", "t6", "t1", "t7")), (20, ("t3", "t6")),
                                                         (40, ("t3",))]


def test_tunes_asynchronous_asha_does_depend_on_the_order():
    """The contrast, on Ray Tune's own bracket: the first trials at a rung are never stopped."""
    from ray.tune.schedulers.async_hyperband import _Bracket

    def stopped_at_first_rung(order):
        bracket = _Bracket(min_t=10, max_t=TOP, reduction_factor=ETA, s=0)
        return {t for t in order if bracket.on_result(_T(t), 10, -CURVES[t][10]) == TrialScheduler.STOP}

    worst_first = sorted(CURVES, key=lambda t: -CURVES[t][10])
    best_first = list(reversed(worst_first))
    assert stopped_at_first_rung(worst_first) != stopped_at_first_rung(best_first)


@dataclass
class _T:
    trial_id: str


# ------------------------------------------------------------------------------------------ cohort rules


def test_the_first_rung_waits_for_trials_the_search_has_not_drawn():
    h = new_halving(expected=3)
    for t in ("a", "b"):
        assert h.on_result(t, 10, 1.0).verdict is Verdict.WAIT
    assert h.decisions == [] and h.waiting("a") and h.waiting("b")
    out = h.on_result("c", 10, 0.5)
    assert out.verdict is Verdict.CONTINUE  # the best of three: max(1, 3 // 2) = 1 goes on
    assert out.decided == (RungDecision(0, 10, ("c",), ("a", "b")),)
    assert not h.waiting("a") and h.stopped == {"a": 0, "b": 0}


def test_a_trial_that_ends_before_its_rung_leaves_the_cohort():
    h = new_halving(expected=4)
    for t, score in (("a", 3.0), ("b", 1.0), ("c", 2.0)):
        assert h.on_result(t, 10, score).verdict is Verdict.WAIT
    decided = h.on_end("d")  # errored at step 5
    assert decided == (RungDecision(0, 10, ("b",), ("c", "a")),)
    assert h.on_result("b", 20, 1.0).verdict is Verdict.CONTINUE  # alone at rung 20: decided at once
    assert h.on_result("b", 80, 0.5).verdict is Verdict.STOP  # the budget's end


def test_a_promoted_trial_that_ended_does_not_hold_the_next_rung():
    h = new_halving(expected=4, eta=2)
    for t, score in (("a", 1.0), ("b", 2.0), ("c", 3.0)):
        h.on_result(t, 10, score)
    h.on_end("a")  # reached rung 10 and ended there (its trainable returned)
    assert h.on_result("d", 10, 4.0).verdict is Verdict.STOP
    assert h.decisions[0].promoted == ("a", "b")
    assert h.on_result("b", 20, 2.0).verdict is Verdict.CONTINUE  # a will not come: b decides rung 20 alone


TIES = [
    ("ties go to the lower trial id", "min", {"t2": 1.0, "t1": 1.0, "t3": 1.0, "t0": 1.0}, ("t0", "t1")),
    ("NaN is worst", "min", {"a": math.nan, "b": 5.0, "c": 4.0, "d": None}, ("c", "b")),
    ("mode max", "max", {"a": 1.0, "b": 4.0, "c": 3.0, "d": 2.0}, ("b", "c")),
]


@pytest.mark.parametrize("mode, scores, promoted", [c[1:] for c in TIES], ids=[c[0] for c in TIES])
def test_ranking(mode, scores, promoted):
    h = new_halving(expected=len(scores), mode=mode)
    for t, s in scores.items():
        h.on_result(t, 10, s)
    assert h.decisions[0].promoted == promoted


def test_rungs_are_checked():
    with pytest.raises(ValueError, match="increasing"):
        Halving(rungs=(20, 10), eta=2, expected=4)
    with pytest.raises(ValueError, match="eta"):
        Halving(rungs=(10,), eta=1, expected=4)


# ------------------------------------------------------------------------------- the Tune shell, the quota


@dataclass
class FakeTrial:
    trial_id: str
    status: str = Trial.RUNNING
    config: dict = field(default_factory=dict)
    is_saving: bool = False


class FakeController:
    def __init__(self, trials):
        self.trials = trials
        self.stopped: List[str] = []

    def get_trials(self):
        return list(self.trials)

    def stop_trial(self, trial):
        self.stopped.append(trial.trial_id)
        trial.status = Trial.TERMINATED


def test_the_tune_shell_pauses_at_a_rung_stops_the_dropped_and_resumes_the_promoted():
    sched = SynchronousHalvingScheduler(time_attr="step", rungs=(10,), eta=2, trials=3, max_t=20)
    sched.set_search_properties("loss", "min")
    trials = {t: FakeTrial(t) for t in ("a", "b", "c")}
    tc = FakeController(list(trials.values()))
    for t in trials.values():
        sched.on_trial_add(tc, t)
    assert sched.on_trial_result(tc, trials["a"], {"step": 10, "loss": 3.0}) == TrialScheduler.PAUSE
    trials["a"].status = Trial.PAUSED
    assert sched.on_trial_result(tc, trials["b"], {"step": 10, "loss": 1.0}) == TrialScheduler.PAUSE
    trials["b"].status = Trial.PAUSED
    assert sched.waiting("a") and sched.choose_trial_to_run(tc) is None  # both wait; c runs
    assert sched.on_trial_result(tc, trials["c"], {"step": 10, "loss": 2.0}) == TrialScheduler.STOP
    assert tc.stopped == ["a"]  # the waiting one the rung dropped; c is answered STOP
    assert sched.choose_trial_to_run(tc) is trials["b"]  # the promoted one resumes from its checkpoint
    assert sched.on_trial_result(tc, trials["b"], {"step": 20, "loss": 0.5}) == TrialScheduler.STOP


def test_a_trial_waiting_at_a_rung_holds_no_slot_in_the_grant():
    """Two slots, four trials: the two first wait at rung 10, so the search must draw the next two (a sweep whose
    waiting trials counted against the grant would wait forever)."""
    inner = SynchronousHalvingScheduler(time_attr="step", rungs=(10,), eta=2, trials=4, max_t=20)
    inner.set_search_properties("loss", "min")
    key = "rungs-test-grant"
    g = quota.register(key, quota.Grant(2))
    g.set_slots(2, 2)
    sched = quota.QuotaScheduler(inner, key)
    trials = [FakeTrial("a"), FakeTrial("b")]
    tc = FakeController(trials)
    for t in trials:
        sched.on_trial_add(tc, t)
    assert g.claiming() == 2
    assert sched.on_trial_result(tc, trials[0], {"step": 10, "loss": 1.0}) == TrialScheduler.PAUSE
    trials[0].status = Trial.PAUSED
    g.observe(tc.get_trials())
    assert g.trials()["a"].paused_by == "rung" and g.claiming() == 1
    assert draws(key)  # b runs, a waits: one slot is free for the next trial
    # A trial paused because its slot was reclaimed still claims one (it resumes first), and so does one that
    # another scheduler paused (PBT): only waiting at a rung frees the place.
    g.note_paused("b", "quota")
    trials[1].status = Trial.PAUSED
    g.observe(tc.get_trials())
    assert g.claiming() == 1 and draws(key)
    g.note_paused("a", "scheduler")
    assert g.claiming() == 2 and not draws(key)


def draws(key: str) -> bool:
    """Whether both gates on new trials (Optuna's and Tune's variant generator) would draw one now."""
    from ray import tune
    from ray.tune.search import Searcher

    class One(Searcher):
        def suggest(self, trial_id):
            return {"x": 1}

    limiter = quota.GrantLimiter(One(metric="loss", mode="min"), max_concurrent=4, grant_key=key)
    gen = quota.GrantedVariantGenerator(key, random_state=0)
    gen.add_configurations({"e": {"run": lambda config: None, "config": {"x": tune.uniform(0, 1)}, "num_samples": 3}})
    by_limiter, by_gen = limiter.suggest("new") is not None, gen.next_trial() is not None
    assert by_limiter == by_gen
    return by_limiter


def test_a_resumed_experiment_adds_its_finished_trials_and_they_do_not_hold_the_first_rung():
    sched = SynchronousHalvingScheduler(time_attr="step", rungs=(10, 20), eta=2, trials=3, max_t=40)
    sched.set_search_properties("loss", "min")
    trials = [FakeTrial("a", Trial.TERMINATED), FakeTrial("b", Trial.PENDING), FakeTrial("c", Trial.PENDING)]
    tc = FakeController(trials)
    for t in trials:
        sched.on_trial_add(tc, t)
    assert sched.on_trial_result(tc, trials[1], {"step": 10, "loss": 2.0}) == TrialScheduler.PAUSE
    assert sched.on_trial_result(tc, trials[2], {"step": 10, "loss": 1.0}) == TrialScheduler.CONTINUE
    assert tc.stopped == ["b"]
