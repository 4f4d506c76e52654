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
        Faults(marker_dir="", crash_at_step=0, times="2", hang_on_stop="yes")
    assert [e[0] for e in err.value.errors] == ["config.fault.crash_at_step", "config.fault.times",
                                                 "config.fault.hang_on_stop"]
