"""Cluster files and flags become the core's nodes; every error of a file is reported at once."""
from __future__ import annotations

from pathlib import Path

import pytest

from raylane.errors import ValidationError
from raylane.sim.cluster import cluster_from_flags, load_cluster

REPO = Path(__file__).resolve().parents[2]


def test_example_cluster_files_load():
    c = load_cluster(REPO / "deploy" / "clusters" / "philly-560.yaml")
    assert c.total_gpus == 560 and len(c.nodes()) == 70
    assert c.nodes()[0].labels["rack"] == "gpu-r0" and c.nodes()[69].labels["rack"] == "gpu-r6"
    mixed = load_cluster(REPO / "deploy" / "clusters" / "mixed-example.yaml")
    l4 = [n for n in mixed.nodes() if n.node_type == "l4-4x"]
    assert len(l4) == 2 and l4[0].capacity.gpu == 4 and l4[0].capacity.memory == 256
    assert "gpu-l4" in l4[0].features and l4[0].free == l4[0].capacity


def test_flags():
    c = cluster_from_flags(3, 4, features=["a100"])
    assert [n.id for n in c.nodes()] == ["node-000", "node-001", "node-002"]
    assert c.total_gpus == 12 and c.nodes()[0].features == frozenset({"a100"})
    with pytest.raises(ValidationError) as e:
        cluster_from_flags(0, -1)
    assert [p for p, _, _ in e.value.errors] == ["--nodes", "--gpus-per-node"]


def test_every_error_of_a_file_at_once(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("name: x\nnode_groups:\n  - {name: a, count: 0, gpus: 8, colour: red}\n"
                 "  - {name: a, count: 1, gpus: 8, memory: 16G}\n  - {name: b, count: 1, gpus: 8}\n"
                 "  - {name: b, count: 1, gpus: 4}\n")
    with pytest.raises(ValidationError) as e:
        load_cluster(p)
    paths = {path: (value, allowed) for path, value, allowed in e.value.errors}
    assert paths["node_groups[0].count"][0] == 0
    assert "allowed fields" in paths["node_groups[0].colour"][1]
    assert paths["node_groups[1].memory"] == ("16G", paths["node_groups[1].memory"][1])
    assert "Gi" in paths["node_groups[1].memory"][1]
    # The duplicate name check needs a valid model; it is reported once the others are fixed.
    p.write_text("node_groups:\n  - {name: b, count: 1, gpus: 8}\n  - {name: b, count: 1, gpus: 4}\n")
    with pytest.raises(ValidationError) as e:
        load_cluster(p)
    assert e.value.errors == [("node_groups[1].name", "b", "a name no other node group has")]


def test_nodes_have_one_device_per_gpu():
    nodes = cluster_from_flags(2, 4).nodes()
    assert [n.devices for n in nodes] == [(1.0,) * 4] * 2
    assert cluster_from_flags(1, 0).nodes()[0].devices == ()
