"""Pipelines, nodes and networks refuse bad input with the field, the value and what is allowed."""
import pytest

from raylane.errors import UnknownNameError, ValidationError
from raylane.planning import PLANNERS, Network, Pipeline, PlanNode, Stage, feasible_nodes
from tests.planning.gen import worked_example


def st(name, needs=(), **kw):
    kw.setdefault("cpu", 1)
    kw.setdefault("memory_gb", 1)
    kw.setdefault("duration_h", 1)
    return Stage(name, needs=needs, **kw)


def test_cycle_is_named():
    with pytest.raises(ValidationError) as e:
        Pipeline((st("a", ("c",)), st("b", ("a",)), st("c", ("b",)), st("d")))
    [(path, value, allowed)] = e.value.errors
    assert path == "stages.needs" and "acyclic" in allowed
    assert value in ("a -> b -> c -> a", "b -> c -> a -> b", "c -> a -> b -> c")


def test_unknown_need_and_duplicate_name_reported_together():
    with pytest.raises(ValidationError) as e:
        Pipeline((st("a"), st("a"), st("b", ("zz",))))
    assert ("stages.name", "a", "a name used by one stage only") in e.value.errors
    assert ("stages.b.needs", "zz", "one of: a, b") in e.value.errors


def test_bad_numbers_named():
    with pytest.raises(ValidationError) as e:
        Stage("a", cpu=-1, memory_gb=1, duration_h=0, durations_h={"gpu": -2})
    paths = [p for p, _, _ in e.value.errors]
    assert paths == ["stages.a.cpu", "stages.a.duration_h", "stages.a.durations_h.gpu"]
    with pytest.raises(ValidationError) as e:
        Network(default_gb_per_h=0, links={("x", "y"): -1})
    assert {p for p, _, _ in e.value.errors} == {"network.links.x-y", "network.default_gb_per_h"}
    with pytest.raises(ValidationError) as e:
        PlanNode("n1", "cpu", 1, 1, storage_gbps=-1)
    assert e.value.errors == [("nodes.n1.storage_gbps", -1, "a finite number of GB/s >= 0 (0: no limit)")]
    with pytest.raises(ValidationError) as e:
        Network(10, storage_gb_per_h={"n1": -3})
    assert [p for p, _, _ in e.value.errors] == ["network.storage_gb_per_h.n1"]


def test_network_built_without_storage_limits_links_only():
    net = Network(10, links={("a", "b"): 20})
    assert net.rate("a", "b") == 20 and net.transfer_h(40, "b", "a") == 2 and net.bottleneck("a", "b") == "link"
    nodes = [PlanNode("a", "x", 1, 1, storage_gbps=2 / 3600), PlanNode("b", "x", 1, 1)]  # 2 GB/h on a
    slow = net.with_storage(nodes)
    assert slow.rate("a", "b") == pytest.approx(2) and slow.transfer_h(40, "b", "a") == pytest.approx(20)
    assert slow.bottleneck("b", "a") == "storage of a" and slow.with_storage(nodes) is slow
    assert net.with_storage([PlanNode("a", "x", 1, 1)]) is net  # 0: no limit


def test_stage_no_node_can_hold_is_named_with_what_it_needs():
    pipeline, nodes, network = worked_example()
    no_ssd = [n for n in nodes if n.name != "ssd-1"]
    with pytest.raises(ValidationError) as e:
        PLANNERS.get("heft").plan(pipeline, no_ssd, network)
    [(path, value, allowed)] = e.value.errors
    assert path == "stages.T3" and value == "16 cpu, 64 GB memory, 0 gpu, features ssd"
    assert "cpu-1 lacks feature(s) ssd (has: none)" in allowed
    big = Pipeline((st("huge", cpu=64, memory_gb=1),))
    with pytest.raises(ValidationError) as e:
        feasible_nodes(big, nodes)
    assert "gpu-1 holds too little: cpu 64 > 32" in e.value.errors[0][2]


def test_per_node_type_durations():
    s = st("a", duration_h=4, durations_h={"gpu": 1.5})
    assert s.duration_on(PlanNode("g", "gpu", 8, 8)) == 1.5 and s.duration_on(PlanNode("c", "cpu", 8, 8)) == 4


def test_registry_names_and_unknown_planner():
    assert PLANNERS.names() == ["best", "cpsat", "heft", "olb"] and PLANNERS.default == "best"
    with pytest.raises(UnknownNameError, match="unknown planner policy 'ga'; known: best, cpsat, heft, olb"):
        PLANNERS.get("ga")


def test_cpsat_options_named():
    from raylane.planning import CpSatPlanner

    with pytest.raises(ValidationError) as e:
        CpSatPlanner(time_limit_s=0, workers=0, resolution_min=1.5)
    assert [p for p, _, _ in e.value.errors] == ["time_limit_s", "workers", "resolution_min"]
