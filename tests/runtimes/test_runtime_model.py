"""The runtime model (``raylane.runtimes``): learning, bases, conditioning on service, estimates, bounds. No Ray."""
from __future__ import annotations

import math
import random

import pytest

from raylane.runtimes import MIN_TAIL, Basis, RunFeatures, RuntimeDist, RuntimeModel, point, quantile

ALICE_X = RunFeatures("a", "batch", 8.0, 1, user="alice", name="pretrain-x", entry="train.py#c1")
ALICE_Y = RunFeatures("a", "batch", 8.0, 1, user="alice", name="pretrain-y", entry="train.py#c2")
BOB = RunFeatures("b", "batch", 1.0, 1, user="bob", name="eval")


def test_quantile_interpolates_like_numpy():
    assert quantile((1.0, 2.0, 3.0, 4.0), 0.5) == 2.5
    assert quantile((1.0, 2.0, 3.0, 4.0), 0.0) == 1.0 and quantile((1.0, 2.0, 3.0, 4.0), 1.0) == 4.0
    assert quantile((7.0,), 0.9) == 7.0


@pytest.mark.parametrize("history, target, level", [
    # (runs seen, whose runtime is asked, the level that answers)
    ([(ALICE_X, 3600)] * 3, ALICE_X, "user-name"),
    ([(ALICE_X, 3600)] * 2, ALICE_X, "cluster"),  # two runs: too few for every level but the cluster's
    ([(ALICE_X, 3600)] * 3, RunFeatures("a", "batch", 8.0, 1, user="carol", name="z", entry="train.py#c1"), "entry"),
    ([(ALICE_X, 3600)] * 3, ALICE_Y, "team-class-shape"),
    ([(ALICE_X, 3600)] * 3, RunFeatures("c", "batch", 2.0, 2), "class"),
    ([(ALICE_X, 3600)] * 3, RunFeatures("c", "serve", 2.0, 2), "cluster"),
])
def test_the_most_specific_basis_with_enough_runs_answers(history, target, level):
    m = RuntimeModel()
    for f, s in history:
        m.observe(f, s)
    d = m.predict(target)
    assert d is not None and d.level == level


def test_nothing_seen_and_nothing_declared_predicts_nothing():
    assert RuntimeModel().predict(ALICE_X) is None


def test_the_basis_is_said_in_words():
    m = RuntimeModel()
    for s in (6000, 7560, 9000):
        m.observe(ALICE_X, s)
    assert m.predict(ALICE_X).describe() == "3 runs of alice/pretrain-x: median 2.1h"


def test_remaining_is_conditional_on_service_had():
    # Half the runs take 10 minutes, half 5 hours: at the start the median is between; after 1 h only the long
    # ones are left, and what remains is 4 h.
    d = RuntimeDist((Basis("user-name", "k", tuple(sorted([600.0] * 5 + [18000.0] * 5))),))
    assert d.remaining(0.0) == pytest.approx((600 + 18000) / 2)
    assert d.remaining(3600.0) == pytest.approx(18000 - 3600)
    assert d.remaining(3600.0, 0.1) == pytest.approx(18000 - 3600)


def test_past_a_basis_the_next_one_with_longer_runs_answers_then_the_tail():
    own = Basis("user-name", "alice/x", (100.0, 110.0, 120.0))
    cls = Basis("class", "class batch", (50.0, 500.0, 1000.0, 2000.0, 4000.0))
    d = RuntimeDist((own, cls))
    assert d.basis_at(0.0) is own
    assert d.basis_at(130.0) is cls and d.remaining(130.0) == pytest.approx(1500.0 - 130.0)
    # Longer than every run: a Pareto tail of index 1 (as long again at the median; q/(1-q) of it at q).
    assert d.basis_at(5000.0) is None
    assert d.remaining(5000.0) == pytest.approx(5000.0)
    assert d.remaining(5000.0, 0.9) == pytest.approx(45000.0)
    assert "longer than every similar run" in d.describe(5000.0)


def test_a_declared_estimate_answers_while_it_is_not_yet_reached():
    d = point(3600.0)
    assert d.remaining(0.0) == 3600.0 and d.remaining(600.0) == pytest.approx(3000.0)
    assert d.remaining(4000.0) == pytest.approx(4000.0)  # past it: the tail


def test_learn_rule_corrects_a_users_estimates_by_their_past_errors():
    m = RuntimeModel(estimate_rule="learn")
    for _ in range(4):  # alice asks for 4 h and uses 1 h
        m.observe(ALICE_X, 3600.0, estimate_s=4 * 3600.0)
    d = m.predict(ALICE_Y, estimate_s=8 * 3600.0)
    assert d.level == "declared" and d.runtime() == pytest.approx(2 * 3600.0)
    # A user with no estimates of their own yet is corrected by everyone's errors; once they have some, by theirs.
    carol = RunFeatures("a", "batch", 8.0, 1, user="carol", name="q")
    d = m.predict(carol, estimate_s=8 * 3600.0)
    assert d.runtime() == pytest.approx(2 * 3600.0) and "by anyone" in d.describe()
    for _ in range(3):  # carol's estimates are right
        m.observe(carol, 3600.0, estimate_s=3600.0)
    assert m.predict(carol, estimate_s=8 * 3600.0).runtime() == pytest.approx(8 * 3600.0)


def test_learn_rule_without_errors_known_shapes_the_estimate_as_similar_runs():
    m = RuntimeModel(estimate_rule="learn")
    for s in (1000.0, 2000.0, 4000.0):
        m.observe(BOB, s)  # no estimates given: no errors known
    d = m.predict(BOB, estimate_s=600.0)
    assert d.runtime() == pytest.approx(600.0)
    assert d.runtime(0.1) == pytest.approx(600.0 * 1200.0 / 2000.0) and d.runtime(0.9) > 600.0


@pytest.mark.parametrize("rule, expected", [("trust", 4 * 3600.0), ("learn", 3600.0), ("cap", 3600.0)])
def test_estimate_rules(rule, expected):
    m = RuntimeModel(estimate_rule=rule)
    for _ in range(4):
        m.observe(ALICE_X, 3600.0, estimate_s=4 * 3600.0)
    assert m.predict(ALICE_X, estimate_s=4 * 3600.0).runtime() == pytest.approx(expected)


def test_cap_rule_never_predicts_past_the_estimate():
    m = RuntimeModel(estimate_rule="cap")
    for s in (100.0, 5000.0, 9000.0):
        m.observe(BOB, s)
    d = m.predict(BOB, estimate_s=1000.0)
    assert d.runtime(0.9) <= 1000.0


def test_memory_is_bounded_by_window_and_keys():
    m = RuntimeModel(window=8, max_keys=50)
    rng = random.Random(0)
    for i in range(5000):
        f = RunFeatures(f"t{i % 7}", "batch", 1.0, 1, user=f"u{i % 300}", name=f"n{i % 900}", entry=f"e{i}")
        m.observe(f, rng.uniform(1, 1000), estimate_s=100.0)
    # levels: user-name, entry, team-class-shape, class, cluster, plus the users' estimate errors
    assert m.observed == 5000 and m.size() <= 8 * 50 * 6


def test_the_window_keeps_the_latest_runs():
    m = RuntimeModel(window=3)
    for s in (10.0, 20.0, 30.0, 1000.0, 1000.0, 1000.0):
        m.observe(BOB, s)
    assert m.predict(BOB).runtime() == 1000.0


@pytest.mark.parametrize("kw, field", [(dict(window=0), "window"), (dict(max_keys=0), "max_keys"),
                                       (dict(min_runs=0), "min_runs"), (dict(estimate_rule="guess"), "estimate_rule")])
def test_bad_settings_are_named(kw, field):
    with pytest.raises(ValueError, match=field):
        RuntimeModel(**kw)


@pytest.mark.parametrize("value", [-1.0, math.inf, math.nan])
def test_a_bad_runtime_is_refused(value):
    with pytest.raises(ValueError, match="runtime_s"):
        RuntimeModel().observe(BOB, value)


def test_gittins_index_prefers_the_job_likely_to_end_soon():
    # 9 of 10 runs end in a minute, one runs a day: a fresh job's index is high; once it has run 2 minutes only
    # the day-long run is like it (past the basis: the tail's 1/ran).
    runs = tuple(sorted([60.0] * 9 + [86400.0] * 3))
    d = RuntimeDist((Basis("class", "c", runs),))
    fresh, old = d.gittins(0.0), d.gittins(120.0)
    assert fresh > old > 0
    assert fresh == pytest.approx(max((k + 1) / (sum(runs[:k]) + runs[k] * (len(runs) - k)) for k in range(len(runs))))
    # A quantum shorter than any run: no chance of ending within it.
    assert d.gittins(0.0, quantum=30.0) == 0.0
    assert RuntimeDist((Basis("class", "c", (10.0,) * MIN_TAIL),)).gittins(20.0) == pytest.approx(1 / 20.0)
