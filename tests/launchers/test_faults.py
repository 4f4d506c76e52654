"""Fault drills (raylane.faults), without Ray: they act on the reports of any loop (raylane.train calls
them from the wrapped ``ray.train.report``); the end-to-end preemption tests rely on them to be independent of the
machine's speed."""
import pytest

from raylane.errors import ValidationError
from raylane.faults import Faults, InjectedCrash


def test_a_crash_fires_on_rank_0_at_its_step_in_the_first_n_attempts_only(tmp_path):
    markers = str(tmp_path / "markers")
    for attempt in (1, 2):
        f = Faults(marker_dir=markers, crash_at_step=5, times=2)
        f.before_report(4, 0)
        f.before_report(5, 1)  # other ranks never crash
        with pytest.raises(InjectedCrash, match=f"step 5 \\({attempt} of 2\\)"):
            f.before_report(5, 0)
    Faults(marker_dir=markers, crash_at_step=5, times=2).before_report(5, 0)  # the third attempt gets through


def test_hold_applies_to_a_fresh_attempt_at_its_step_only():
    f = Faults(marker_dir="", hold_at_step=10)
    assert f.holds_at(10, resumed=False)
    assert not f.holds_at(9, resumed=False) and not f.holds_at(10, resumed=True)


def test_hold_at_steps_holds_each_attempt_at_its_own_step_counting_the_stops(tmp_path):
    markers = str(tmp_path / "markers")
    first = Faults(marker_dir=markers, hold_at_steps=[20, 40, 60])
    assert not first.holds_at(20, resumed=False, checkpointed=False)  # it holds where it can yield: the checkpoint
    assert first.holds_at(20, resumed=False, checkpointed=True) and not first.holds_at(40, False, True)
    assert first.on_stop_answer(True, rank=1) and first.on_stop_answer(True) and first.on_stop_answer(True)
    second = Faults(marker_dir=markers, hold_at_steps=[20, 40, 60])  # one stop counted, once, by rank 0
    assert second.holds_at(40, resumed=True, checkpointed=True) and not second.holds_at(20, True, True)
    second.on_stop_answer(True)  # asked at step 30, before its hold: the next attempt holds at 60
    third = Faults(marker_dir=markers, hold_at_steps=[20, 40, 60])
    assert third.holds_at(60, resumed=True, checkpointed=True) and not third.holds_at(40, True, True)
    third.on_stop_answer(True)
    last = Faults(marker_dir=markers, hold_at_steps=[20, 40, 60])
    assert not any(last.holds_at(k, resumed=True, checkpointed=True) for k in (20, 40, 60, 80))
    assert not Faults(marker_dir="").holds_at(20, resumed=False, checkpointed=True)


def test_ignore_stop_hides_the_request_and_the_first_report_time_is_written_once(tmp_path):
    path = tmp_path / "first"
    f = Faults(marker_dir="", ignore_stop=True, first_step_file=str(path))
    assert f.on_stop_answer(True) is False and f.on_stop_answer(False) is False
    assert Faults(marker_dir="").on_stop_answer(True) is True
    f.before_report(1, 0)
    first = path.read_text()
    f.before_report(2, 0)
    assert path.read_text() == first and float(first) > 0


def test_bad_drills_are_refused_naming_the_field():
    with pytest.raises(ValidationError) as err:
        Faults(marker_dir="", crash_at_step=0, times="2", hang_on_stop="yes", hold_at_steps=[10, 0])
    assert [e[0] for e in err.value.errors] == ["config.fault.hold_at_steps", "config.fault.crash_at_step",
                                                 "config.fault.times", "config.fault.hang_on_stop"]
