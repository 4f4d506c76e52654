"""Pipeline and cluster YAML files load into the planning types; bad files are refused with a named error."""
import pytest

from raylane.planning.yamlio import LoadError, load_cluster, load_pipeline
from tests.planning.gen import worked_example

EX = "examples/pipelines/"


def test_worked_example_files_equal_the_python_example():
    pipeline, nodes, network = worked_example()
    assert load_pipeline(EX + "worked-example.yaml") == pipeline
    got_nodes, got_net = load_cluster(EX + "cluster-3node.yaml")
    assert got_nodes == nodes
    assert got_net.default_gb_per_h == network.default_gb_per_h
    assert dict(got_net.links) == dict(network.links)


@pytest.mark.parametrize("body,needle", [
    ("kind: pipeline\nname: x\nstages:\n  A: {cpu: 1, memory: 1, duration: 1h, needs: [B]}\n", "B"),
    ("kind: pipeline\nname: x\nstages:\n  A: {cpu: 1, memory: 1, duration: 1h, colour: red}\n", "colour"),
    ("kind: pipeline\nname: x\nstages:\n  A: {cpu: 1, memory: 1, duration: soon}\n", "soon"),
])
def test_bad_pipeline_named(tmp_path, body, needle):
    p = tmp_path / "p.yaml"
    p.write_text(body)
    with pytest.raises(LoadError) as e:
        load_pipeline(p)
    assert str(p) in str(e.value) and needle in str(e.value)


def test_plan_round_trip(tmp_path):
    from raylane.planning import PLANNERS
    from raylane.planning.yamlio import dump_plan, load_plan
    plan = PLANNERS.get("heft").plan(*worked_example())
    p = tmp_path / "plan.yaml"
    p.write_text(dump_plan(plan))
    got = load_plan(p)
    assert got.placements == plan.placements and got.makespan_h == plan.makespan_h
