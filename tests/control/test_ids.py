"""Ids of workloads, pipelines and sweeps (``raylane.ids``): drawn fresh, drawn again when in use, refused typed when
the source of randomness keeps repeating. (The control plane's refusal of an id in use, with nothing written, is in
``tests/control/test_control.py``: its actor needs a Ray cluster to start.)"""
import pickle
import re

import pytest

from raylane import ids
from raylane.errors import ConflictError, ValidationError

TAKEN = "pretrain-a-0123456789ab"


def test_ids_keep_the_name_and_twelve_hex_digits():
    wid = ids.new_id("pretrain-team-a")
    assert re.fullmatch(r"pretrain-team-a-[0-9a-f]{12}", wid)


def test_a_burst_of_one_name_draws_no_repeat():
    # The burst that collided 3 times with 6 hex digits.
    drawn = [ids.new_id("pretrain-team-a") for _ in range(10_000)]
    assert len(set(drawn)) == len(drawn)


def test_an_id_in_use_is_drawn_again():
    draws = iter(["0123456789ab", "0123456789ab", "ba9876543210"])
    assert ids.new_id("pretrain-a", {TAKEN}.__contains__, draw=lambda: next(draws)) == "pretrain-a-ba9876543210"


def test_a_generator_that_keeps_repeating_is_refused_typed():
    with pytest.raises(ConflictError) as err:
        ids.new_id("pretrain-a", {TAKEN}.__contains__, draw=lambda: "0123456789ab")
    assert isinstance(err.value, ValidationError)  # callers that show validation errors show this one too
    assert err.value.errors[0][:2] == ("id", TAKEN) and "no workload has used" in err.value.errors[0][2]


def test_the_refusal_crosses_a_process_boundary_intact():
    exc = pickle.loads(pickle.dumps(ConflictError("pipeline", [("pipeline_id", "p-1", "an unused id")])))
    assert type(exc) is ConflictError and exc.errors == [("pipeline_id", "p-1", "an unused id")]
