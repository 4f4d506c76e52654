"""Issue 13's worked example: the planners, the exhaustive optimum and the verifier on hand-made bad plans."""
from dataclasses import replace

import pytest

from raylane.planning import PLANNERS, Pipeline, Placement, Plan, PlanStatus, ViolationKind, exhaustive_plan, verify
from tests.planning.gen import worked_example

OPTIMUM_H = 9.25  # T1, T2 on gpu-1; T3, T4 on ssd-1; T4 waits 0.25 h for T2's 5 GB over the 20 GB/h link


@pytest.fixture(scope="module")
def example():
    return worked_example()


@pytest.fixture(scope="module")
def optimum(example):
    return exhaustive_plan(*example)


def _plan(rows, makespan):
    return Plan(tuple(Placement(*r) for r in rows), makespan)


def test_exhaustive_optimum_and_cpsat_proves_the_same(example, optimum):
    assert optimum.makespan_h == pytest.approx(OPTIMUM_H)
    plan = PLANNERS.get("cpsat").plan(*example)
    assert plan.status is PlanStatus.OPTIMAL
    assert plan.makespan_h == pytest.approx(optimum.makespan_h)
    assert plan.bound_h == pytest.approx(optimum.makespan_h)
    assert verify(*example, plan).ok


@pytest.mark.parametrize("name", ["heft", "olb"])
def test_heuristic_plan_and_gap(example, optimum, name):
    plan = PLANNERS.get(name).plan(*example)
    report = verify(*example, plan, best_known_h=optimum.makespan_h)
    print(f"\n{name}: " + ", ".join(f"{p.stage}@{p.node} {p.start_h:g}-{p.finish_h:g} h" for p in plan.placements))
    print(report.render())
    assert report.ok, report.render()
    where = {p.stage: p.node for p in plan.placements}
    assert where["T1"] == "gpu-1" and where["T3"] == "ssd-1"
    # T3's 20 GB stays where it was written: moving it to T4 costs 1-2 h and saves nothing.
    assert where["T4"] == "ssd-1"
    assert report.gap == pytest.approx(0.0)
    assert report.data_moved_gb == 5


def test_verifier_flags_t4_before_t3_output_arrives(example):
    # T4 on cpu-1: T3's 20 GB from ssd-1 at 10 GB/h arrive at 7 h; T4 starts at 5.5 h (after T2's 0.5 h transfer).
    plan = _plan([("T1", "gpu-1", 0, 3), ("T2", "gpu-1", 3, 5), ("T3", "ssd-1", 0, 5),
                  ("T4", "cpu-1", 5.5, 9.5)], 9.5)
    report = verify(*example, plan)
    [v] = report.violations
    assert (v.kind, v.stage, v.node) == (ViolationKind.DEPENDENCY, "T4", "cpu-1")
    assert v.amount == pytest.approx(1.5)
    assert "before T3's output arrives at 7 h" in v.message and "20 GB from ssd-1 take 2 h" in v.message
    assert report.data_moved_gb == 25


def test_verifier_flags_t3_on_a_node_without_ssd(example):
    plan = _plan([("T1", "gpu-1", 0, 3), ("T2", "gpu-1", 3, 5), ("T3", "cpu-1", 0, 5),
                  ("T4", "cpu-1", 5.5, 9.5)], 9.5)
    report = verify(*example, plan)
    [v] = report.violations
    assert (v.kind, v.stage, v.node) == (ViolationKind.FEATURES, "T3", "cpu-1")
    assert "T3 needs ssd; cpu-1 has no features" == v.message


def test_verifier_flags_a_wrong_claimed_makespan(example, optimum):
    report = verify(*example, replace(optimum, makespan_h=8.0))
    [v] = report.violations
    assert v.kind is ViolationKind.MAKESPAN and v.amount == pytest.approx(-1.25)
    assert "claimed makespan 8 h, computed 9.25 h" in v.message
    assert report.makespan_h == pytest.approx(9.25)


def test_verifier_flags_capacity_unplaced_and_unknowns(example):
    # cpu-1 holds 16 CPU: T2 (4) and T3 (16) together from 3 h to 5 h exceed it by 4; T4 is missing.
    plan = _plan([("T1", "gpu-1", 0, 3), ("T2", "cpu-1", 4, 6), ("T3", "cpu-1", 0, 5), ("T9", "gpu-1", 0, 1),
                  ("T1", "nope", 0, 3)], 6)
    report = verify(*example, plan)
    kinds = {v.kind for v in report.violations}
    assert kinds == {ViolationKind.CAPACITY, ViolationKind.FEATURES, ViolationKind.UNPLACED,
                     ViolationKind.UNKNOWN_STAGE, ViolationKind.DUPLICATE}
    cpu = [v for v in report.of_kind(ViolationKind.CAPACITY) if v.message.startswith("cpu-1 cpu")]
    assert len(cpu) == 1 and cpu[0].amount == pytest.approx(4) and "from 4 h to 5 h" in cpu[0].message
    assert [v.stage for v in report.of_kind(ViolationKind.UNPLACED)] == ["T4"]


def test_verifier_flags_a_wrong_duration(example, optimum):
    rows = [(p.stage, p.node, p.start_h, p.finish_h) for p in optimum.placements]
    rows[0] = ("T1", "gpu-1", 0, 2)
    [v] = verify(*example, _plan(rows, optimum.makespan_h)).violations
    assert v.kind is ViolationKind.DURATION and v.stage == "T1" and v.amount == pytest.approx(-1)
    assert v.message == "T1 on gpu-1 runs 0-2 h (2 h); it takes 3 h on a gpu node"


def test_moving_t3_output_when_it_pays(example):
    # T4 takes 2 h on a GPU node: moving T3's 20 GB to gpu-1 (1 h over the 20 GB/h link) now saves 1.25 h.
    pipeline, nodes, network = example
    faster = Pipeline(tuple(replace(s, durations_h={"gpu": 2}) if s.name == "T4" else s for s in pipeline.stages))
    best = exhaustive_plan(faster, nodes, network)
    assert best.makespan_h == pytest.approx(8.0)
    for name, expect_h, t4_on in (("cpsat", 8.0, "gpu-1"), ("heft", 8.0, "gpu-1"), ("olb", 9.25, "ssd-1")):
        plan = PLANNERS.get(name).plan(faster, nodes, network)
        report = verify(faster, nodes, network, plan, best_known_h=best.makespan_h)
        assert report.ok and plan.makespan_h == pytest.approx(expect_h), name
        assert plan.by_stage()["T4"].node == t4_on, name  # OLB starts T4 where it can start first, ignoring 4 h vs 2 h


def test_cpsat_off_its_minute_grid_claims_no_proof(example):
    pipeline, nodes, network = example
    odd = Pipeline(tuple(replace(s, duration_h=0.01) if s.name == "T4" else s for s in pipeline.stages))  # 36 s
    plan = PLANNERS.get("cpsat").plan(odd, nodes, network)
    assert plan.status is PlanStatus.FEASIBLE and plan.bound_h is None
    assert verify(odd, nodes, network, plan).ok and plan.makespan_h == pytest.approx(5.26)


def test_verifier_flags_a_start_before_zero(example, optimum):
    rows = [(p.stage, p.node, p.start_h - (1 if p.stage == "T3" else 0), p.finish_h - (1 if p.stage == "T3" else 0))
            for p in optimum.placements]
    [v] = verify(*example, _plan(rows, optimum.makespan_h)).violations
    assert v.kind is ViolationKind.DURATION and v.stage == "T3" and v.amount == -1
    assert v.message == "T3 on ssd-1 starts at -1 h; the pipeline starts at 0 h"


def test_slow_storage_binds_and_changes_the_transfer_and_the_plan(example):
    # T4 takes 2 h on a GPU node, so at link speed T4 goes to gpu-1 (8.0 h, test above). With gpu-1's storage at
    # 5 GB/h (below its 20 GB/h link), T3's 20 GB take 4 h instead of 1 h to reach it, and T2's 5 GB 1 h instead of
    # 0.25 h to leave it: T4 on ssd-1 from 6 h to 10 h is now the optimum.
    pipeline, nodes, network = example
    faster = Pipeline(tuple(replace(s, durations_h={"gpu": 2}) if s.name == "T4" else s for s in pipeline.stages))
    slow = [replace(n, storage_gbps=5 / 3600) if n.name == "gpu-1" else n for n in nodes]
    net = network.with_storage(slow)
    assert network.transfer_h(20, "ssd-1", "gpu-1") == pytest.approx(1.0)
    assert net.transfer_h(20, "ssd-1", "gpu-1") == pytest.approx(4.0)
    assert net.bottleneck("ssd-1", "gpu-1") == "storage of gpu-1"
    assert net.transfer_h(20, "ssd-1", "cpu-1") == pytest.approx(2.0) and net.bottleneck("ssd-1", "cpu-1") == "link"
    best = exhaustive_plan(faster, slow, network)  # planners apply the nodes' storage themselves
    assert best.makespan_h == pytest.approx(10.0)
    for name in ("cpsat", "heft"):
        plan = PLANNERS.get(name).plan(faster, slow, network)
        assert plan.makespan_h == pytest.approx(10.0) and plan.by_stage()["T4"] == Placement("T4", "ssd-1", 6, 10), name
        assert verify(faster, slow, network, plan).ok
    # The verifier applies the same rate: the link-speed plan (T4 on gpu-1 at 6 h) now starts 3 h early.
    fast_plan = PLANNERS.get("cpsat").plan(faster, nodes, network)
    [v] = verify(faster, slow, network, fast_plan).of_kind(ViolationKind.DEPENDENCY)
    assert (v.stage, v.node) == ("T4", "gpu-1") and v.amount == pytest.approx(3.0)
    assert "20 GB from ssd-1 take 4 h at 5 GB/h, the storage of gpu-1" in v.message
