"""The plug-ins that keep a Ray Tune sweep within its grant, driven by a fake Tune controller (no Ray session):
which trial may start or resume, when a running one is paused, when a new one may be drawn, and the invariant
record (running trials never above leased slots). Tables of named cases."""
from __future__ import annotations

from dataclasses import dataclass, field
from itertools import count

import pytest
from ray.tune.experiment import Trial
from ray.tune.schedulers import FIFOScheduler, TrialScheduler
from ray.tune.search import Searcher

from raylane.sweeps import quota

RUNNING, PENDING, PAUSED, DONE = Trial.RUNNING, Trial.PENDING, Trial.PAUSED, Trial.TERMINATED
_keys = count()


@dataclass
class FakeTrial:
    trial_id: str
    status: str
    config: dict = field(default_factory=dict)


class FakeController:
    def __init__(self, trials):
        self.trials = trials

    def get_trials(self):
        return list(self.trials)


class Fixed(TrialScheduler):
    """A wrapped scheduler that answers ``decision`` to every result and chooses like FIFO."""

    def __init__(self, decision):
        super().__init__()
        self.decision = decision

    def on_trial_result(self, tune_controller, trial, result):
        return self.decision

    def choose_trial_to_run(self, tune_controller):
        return FIFOScheduler().choose_trial_to_run(tune_controller)

    def on_trial_add(self, *a):
        pass


def setup(granted, trials, inner=None, leased=None, paused_by=None):
    key = f"quota-test-{next(_keys)}"
    g = quota.register(key, quota.Grant(4))
    g.set_slots(granted, granted if leased is None else leased)
    tc = FakeController([FakeTrial(t, s) for t, s in trials])
    g.observe(tc.get_trials())
    for tid, by in (paused_by or {}).items():
        g.note_paused(tid, by)
    return quota.QuotaScheduler(inner or FIFOScheduler(), key), tc, g


CHOOSE = [
    ("grant full", 1, [("a", RUNNING), ("b", PAUSED)], {}, None),
    ("nothing granted", 0, [("a", PENDING)], {}, None),
    ("starting trials count", 2, [("a", RUNNING), ("b", PENDING), ("c", PAUSED)], {}, None),
    ("quota-paused resume first", 2, [("a", RUNNING), ("b", PAUSED), ("c", PAUSED)], {"c": "quota"}, "c"),
    ("else the scheduler's choice", 2, [("a", RUNNING), ("b", PAUSED), ("c", PAUSED)], {"c": "scheduler"}, "b"),
    ("grew back: paused one resumes", 2, [("a", DONE), ("b", RUNNING), ("c", PAUSED)], {"c": "quota"}, "c"),
]


@pytest.mark.parametrize("granted, trials, paused_by, expected", [c[1:] for c in CHOOSE], ids=[c[0] for c in CHOOSE])
def test_choose_trial_to_run_keeps_to_the_grant(granted, trials, paused_by, expected):
    sched, tc, _ = setup(granted, trials, paused_by=paused_by)
    chosen = sched.choose_trial_to_run(tc)
    assert (chosen.trial_id if chosen else None) == expected


RESULT = [
    ("within the grant", 2, [("a", RUNNING), ("b", RUNNING)], TrialScheduler.CONTINUE, TrialScheduler.CONTINUE, None),
    ("over the grant: pause", 1, [("a", RUNNING), ("b", RUNNING)], TrialScheduler.CONTINUE, TrialScheduler.PAUSE,
     "quota"),
    ("a stop frees the slot anyway", 1, [("a", RUNNING), ("b", RUNNING)], TrialScheduler.STOP, TrialScheduler.STOP,
     None),
    ("the scheduler's own pause", 2, [("a", RUNNING), ("b", RUNNING)], TrialScheduler.PAUSE, TrialScheduler.PAUSE,
     "scheduler"),
    ("nothing granted at all", 0, [("a", RUNNING)], TrialScheduler.CONTINUE, TrialScheduler.PAUSE, "quota"),
]


@pytest.mark.parametrize("granted, trials, inner, expected, paused_by", [c[1:] for c in RESULT],
                         ids=[c[0] for c in RESULT])
def test_on_trial_result_pauses_a_trial_over_the_grant(granted, trials, inner, expected, paused_by):
    sched, tc, g = setup(granted, trials, inner=Fixed(inner), leased=len(trials))
    assert sched.on_trial_result(tc, tc.trials[0], {"step": 10}) == expected
    view = g.trials()["a"]
    assert view.paused_by == paused_by and view.step == 10


def test_end_of_a_trial_is_recorded_before_tune_sets_its_status():
    sched, tc, g = setup(1, [("a", RUNNING)])
    sched.on_trial_complete(tc, tc.trials[0], {"step": 40})
    view = g.trials()["a"]
    assert view.status == DONE and view.step == 40


class Counting(Searcher):
    def __init__(self):
        super().__init__(metric="loss", mode="min")
        self.asked = 0

    def suggest(self, trial_id):
        self.asked += 1
        return {"x": self.asked}


@pytest.mark.parametrize("granted, trials, draws", [
    (2, [], True),
    (2, [("a", RUNNING)], True),
    (2, [("a", RUNNING), ("b", PAUSED)], False),  # a paused trial holds its place: it resumes before a new one
    (2, [("a", RUNNING), ("b", DONE)], True),
    (0, [], False),
])
def test_new_trials_are_drawn_only_within_the_grant(granted, trials, draws):
    _, tc, g = setup(granted, trials)
    key = next(k for k, v in quota._GRANTS.items() if v is g)
    limiter = quota.GrantLimiter(Counting(), max_concurrent=4, grant_key=key)
    assert (limiter.suggest("new") is not None) == draws
    gen = quota.GrantedVariantGenerator(key, random_state=0)

    def f(config):
        pass

    from ray import tune

    gen.add_configurations({"e": {"run": f, "config": {"x": tune.uniform(0, 1)}, "num_samples": 3}})
    assert (gen.next_trial() is not None) == draws


def test_stopper_ends_trials_at_the_budget_and_the_sweep_on_request():
    key = f"quota-test-{next(_keys)}"
    g = quota.register(key, quota.Grant(1))
    stopper = quota.GrantStopper(key, budget_max=40)
    assert not stopper("t", {"step": 30}) and stopper("t", {"step": 40}) and not stopper("t", {})
    assert not stopper.stop_all()
    g.request_stop()
    assert stopper.stop_all()


def test_the_grant_records_running_trials_above_leased_slots():
    _, tc, g = setup(2, [("a", RUNNING), ("b", RUNNING)])
    assert g.over == 0
    g.set_slots(1, 2)  # a slot reclaimed: granted drops at once, the lease stays until a trial paused
    assert g.over == 0
    g.set_slots(1, 1)  # released too early: two trials on one leased slot
    assert g.over == 1
    assert [h[1:] for h in g.history] == [(2, 2, 0), (2, 2, 2), (1, 2, 2), (1, 1, 2)]


def test_unregistered_grant_lets_nothing_run():
    assert quota.grant_for("never-registered").granted == 0


def test_a_generator_that_drew_every_trial_says_so_even_with_no_slot_left():
    """Tune asks the search algorithm for a trial until it says it is finished. Once every trial was drawn, the
    grant's gate must not hide that: a sweep whose last slot was given back (its trials all ended) would wait for a
    trial that never comes (seen: a script sweep whose 2 trials failed hung in Tune's blocking wait)."""
    from ray import tune

    from raylane.sweeps.quota import GrantedSearch

    def f(config):
        pass

    for make in (lambda key: quota.GrantedVariantGenerator(key, random_state=0),
                 lambda key: GrantedSearch(quota.BasicVariantGenerator(random_state=0), key)):
        _, tc, g = setup(1, [])
        key = next(k for k, v in quota._GRANTS.items() if v is g)
        gen = make(key)
        gen.add_configurations({"e": {"run": f, "config": {"x": tune.uniform(0, 1)}, "num_samples": 2}})
        drawn = []
        for _ in range(2):
            t = gen.next_trial()
            assert t is not None
            drawn.append(t)
            g.note_ended(t, Trial.ERROR)
        g.set_slots(0, 0)  # its slot given back: no trial left for it
        assert gen.next_trial() is None and gen.is_finished()
