"""Garbage collection is paused inside a scheduling cycle and restored after it (raylane.scheduling.gcpace)."""
import gc

import pytest

from raylane.scheduling.gcpace import gc_paused


def test_collection_is_off_inside_and_restored_after_even_on_error():
    assert gc.isenabled()
    with gc_paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(RuntimeError):
        with gc_paused():
            raise RuntimeError("a cycle that fails")
    assert gc.isenabled()


def test_a_collector_that_was_off_stays_off():
    gc.disable()
    try:
        with gc_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_garbage_made_inside_is_collected_after():
    class Cycle:
        pass

    def count():
        return sum(type(o) is Cycle for o in gc.get_objects())  # type(): no __getattr__ of lazy modules

    gc.collect()
    before = count()
    with gc_paused():
        for _ in range(200):
            a, b = Cycle(), Cycle()
            a.other, b.other = b, a  # reference cycles: only the collector frees them
        del a, b
        assert count() == before + 400  # nothing collected inside
    gc.collect()
    assert count() == before
