"""A workload that waits for a node being added for it preempts nobody until its wait is over
(``Snapshot.scale_wait``, kept by the control plane from a class's ``wait_for_scale_up``). Pure: no Ray."""
from dataclasses import replace

import pytest

from raylane.scheduling import cycle
from tests.scheduling.builders import FINETUNE, PRETRAIN, make_state, node, running, summarize, team, wl

NOW = 1000.0


def state():
    """One node of 8 GPUs, held by a pretrain gang; a finetune gang of the same team (a higher class) waits."""
    return make_state([node("n1").gpus(8)], [team("nlp", gpu=16)],
                      running=[running(wl("low").gpus(8).cls(PRETRAIN).at(0), on=("n1",), since=0)],
                      pending=[wl("high").gpus(8).cls(FINETUNE).at(10)])


@pytest.mark.parametrize("scale_wait,preempts", [
    (None, True),  # no wait kept: it preempts at once
    ({}, True),
    ({"high": NOW + 60}, False),  # waiting for a node: nobody is stopped
    ({"high": NOW}, True),  # its wait is over
    ({"other": NOW + 60}, True),  # another workload's wait
])
def test_a_workload_waiting_for_scale_up_preempts_nobody_until_its_wait_is_over(scale_wait, preempts):
    snap = replace(state().snapshot(), scale_wait=scale_wait)
    out = summarize(cycle(snap, NOW))
    assert ("high" in out.preempted) is preempts
    if not preempts:
        # It waits for capacity (what makes scale-up demand), not for preemption.
        assert out.reason_type("high") in ("NoCapacity", "Reserved")
        assert out.victims == set()


def test_a_wait_for_scale_up_does_not_hold_back_a_quota_reclaim():
    """Quota is not capacity: a team that takes back its nominal quota from a borrower does so at once, waiting or
    not (a new node would not change what the borrower holds beyond its own quota)."""
    st = make_state([node("n1").gpus(8)], [team("nlp", gpu=8), team("cv", gpu=0, borrow=8)],
                    running=[running(wl("borrowed").team("cv").gpus(8).cls(PRETRAIN).at(0), on=("n1",), since=0)],
                    pending=[wl("owner").team("nlp").gpus(8).cls(PRETRAIN).at(10)])
    plain = summarize(cycle(st.snapshot(), NOW))
    waiting = summarize(cycle(replace(st.snapshot(), scale_wait={"owner": NOW + 60}), NOW))
    assert plain.preempted == {"owner": ("borrowed",)}
    assert waiting.preempted == plain.preempted
