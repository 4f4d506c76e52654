"""Explanations and the critical path: concrete content on the worked example, and chains that add up on random plans."""
import random
from dataclasses import replace

import pytest

from raylane.errors import ValidationError
from raylane.planning import PLANNERS, Network, Pipeline, Placement, Plan, PlanNode, Stage, exhaustive_plan, verify
from raylane.planning.explain import critical_path, explain
from tests.planning.gen import random_instance, worked_example


@pytest.fixture(scope="module")
def example():
    return worked_example()


def test_t3_explanation_names_ssd_and_the_nodes_lacking_it(example):
    plan = PLANNERS.get("cpsat").plan(*example)
    why = {w.stage: w for w in explain(*example, plan).stages}["T3"]
    assert why.features == ("ssd",) and why.node == "ssd-1"
    assert dict(why.excluded) == {"gpu-1": "lacks feature(s) ssd (has: gpu)",
                                  "cpu-1": "lacks feature(s) ssd (has: none)"}
    assert why.alternatives == () and "no other node can hold it" in why.lines()


def test_t4_locality_and_what_each_other_node_would_give(example):
    plan = PLANNERS.get("cpsat").plan(*example)
    exp = explain(*example, plan)
    why = {w.stage: w for w in exp.stages}["T4"]
    assert [str(i) for i in why.inputs] == ["T2's 5 GB moved from gpu-1 in 0.25 h (20 GB/h, the link)",
                                           "T3's 20 GB read on ssd-1: no transfer"]
    # Given the rest of the plan: on gpu-1 T2's output is local but T3's 20 GB take 1 h over the 20 GB/h link.
    [gpu, cpu] = why.alternatives
    assert (gpu.node, gpu.start_h, gpu.finish_h) == ("gpu-1", 6, 10)
    assert gpu.reason == "T3's 20 GB would take 1 h to move (20 GB/h, the link)"
    assert (cpu.node, cpu.finish_h) == ("cpu-1", 11) and "2 h to move (10 GB/h" in cpu.reason
    text = exp.render()
    assert "on gpu-1 it would finish at 10 h (+0.75 h): T3's 20 GB would take 1 h to move" in text


def test_critical_path_of_the_optimal_plan_ends_with_t4_at_9_25(example):
    plan = PLANNERS.get("cpsat").plan(*example)
    path = critical_path(*example, plan)
    assert path[-1].stage == "T4" and path[-1].finish_h == pytest.approx(9.25)
    assert explain(*example, plan).makespan_h == pytest.approx(9.25)
    assert path[0].reason == "start" and path[0].start_h == 0
    # T4 waits for T2's 5 GB from gpu-1 (0.25 h); T3's output is already on ssd-1 at 5 h.
    assert (path[-1].after, path[-1].reason) == ("T2", "transfer") and "0.25 h" in path[-1].detail
    assert [x.stage for x in path] == ["T1", "T2", "T4"]


def test_capacity_link_idle_and_waiting_for_room():
    # One 16-cpu node: A and B take all of it, so B starts when A finishes. C, on the other node, starts late.
    pipeline = Pipeline((Stage("A", cpu=16, memory_gb=1, duration_h=1), Stage("B", cpu=16, memory_gb=1, duration_h=2),
                         Stage("C", cpu=1, memory_gb=1, duration_h=0.5)))
    nodes = [PlanNode("big", "x", 16, 64), PlanNode("small", "y", 2, 8)]
    net = Network(10)
    plan = Plan((Placement("A", "big", 0, 1), Placement("B", "big", 1, 3), Placement("C", "small", 3, 3.5)), 3.5)
    assert verify(pipeline, nodes, net, plan).ok
    path = critical_path(pipeline, nodes, net, plan)
    assert [(x.stage, x.reason) for x in path] == [("C", "idle")]
    assert "nothing on small kept it waiting" in path[0].detail
    plan = replace(plan, placements=plan.placements[:2] + (Placement("C", "small", 0, 0.5),), makespan_h=3)
    path = critical_path(pipeline, nodes, net, plan)
    assert [(x.stage, x.reason, x.after) for x in path] == [("A", "start", ""), ("B", "capacity", "A")]
    assert path[1].detail == "A finished on big and freed cpu 16 (32 needed, capacity 16)"
    why = {w.stage: w for w in explain(pipeline, nodes, net, plan).stages}
    assert dict(why["B"].excluded) == {"small": "holds too little: cpu 16 > 2"}
    [alt] = why["C"].alternatives  # on big, C waits until A and B are done
    assert (alt.node, alt.start_h, alt.reason) == ("big", 3, "waits for room until 3 h")


def test_storage_bottleneck_is_named(example):
    pipeline, nodes, network = example
    slow = [replace(n, storage_gbps=5 / 3600) if n.name == "gpu-1" else n for n in nodes]
    plan = PLANNERS.get("heft").plan(pipeline, slow, network)
    why = {w.stage: w for w in explain(pipeline, slow, network, plan).stages}["T4"]
    assert why.node == "ssd-1"
    assert str(why.inputs[0]) == "T2's 5 GB moved from gpu-1 in 1 h (5 GB/h, storage of gpu-1 is the bottleneck)"


def test_unplaced_stage_refused(example):
    plan = PLANNERS.get("heft").plan(*example)
    with pytest.raises(ValidationError) as e:
        explain(*example, replace(plan, placements=plan.placements[:3]))
    assert e.value.errors == [("stages.T4", None, "a placement on a known node")]


@pytest.mark.parametrize("tight", [False, True])
def test_critical_path_of_left_shifted_plans_is_a_chain_from_zero_to_the_makespan(tight):
    """HEFT, OLB and exhaustive plans start every stage as early as its inputs and room allow, so the walk back
    always finds a reason and reaches a stage starting at 0 h; each link starts when the one before it ends (plus
    the transfer)."""
    for seed in range(40):
        inst = random_instance(random.Random(seed), tight=tight)
        for plan in (PLANNERS.get("heft").plan(*inst), PLANNERS.get("olb").plan(*inst), exhaustive_plan(*inst)):
            path = critical_path(*inst, plan)
            assert path[0].reason == "start" and path[0].start_h == pytest.approx(0), (seed, path)
            assert path[-1].finish_h == pytest.approx(plan.makespan_h), seed
            for prev, link in zip(path, path[1:]):
                assert link.after == prev.stage and link.reason in ("data", "transfer", "capacity"), (seed, link)
                assert link.start_h >= prev.finish_h - 1e-9, seed
                if link.reason != "transfer":
                    assert link.start_h == pytest.approx(prev.finish_h), seed
