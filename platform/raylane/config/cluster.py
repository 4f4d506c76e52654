"""Cluster files: the nodes of a cluster as groups (count x GPUs, CPUs, memory, feature tags, node type, labels).

One model serves the local cluster that ``raylane up`` starts, the simulator's simulated nodes and the Ray
cluster-launcher/KubeRay examples in ``deploy/``. ``EMBEDDED`` is the default small local cluster: a CPU-only head
for the control actor and drivers, and two worker nodes with two logical GPUs each, tagged differently so feature
placement is visible.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Optional, Union

from pydantic import Field

from raylane.config.models import Memory, _Model
from raylane.scheduling.types import Node, Resources


class NodeGroup(_Model):
    name: str = Field(min_length=1, max_length=40, pattern=r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$")
    count: int = Field(default=1, ge=1, le=100_000)
    gpus: int = Field(default=0, ge=0, le=64)
    cpus: int = Field(default=8, ge=1, le=1024)
    memory: Memory = 32.0
    features: List[str] = Field(default_factory=list)
    node_type: str = ""
    labels: Dict[str, str] = Field(default_factory=dict)
    datasets: List[str] = Field(default_factory=list)


class HeadNode(_Model):
    cpus: int = Field(default=4, ge=1, le=1024)
    gpus: int = Field(default=0, ge=0, le=64)
    memory: Optional[Memory] = None


class ClusterFile(_Model):
    name: str = "local"
    head: HeadNode = Field(default_factory=HeadNode)
    nodes: List[NodeGroup] = Field(min_length=1)

    def core_nodes(self) -> List[Node]:
        """Simulated nodes, named ``<group>-<i>``, all free."""
        out = []
        for g in self.nodes:
            cap = Resources(float(g.gpus), float(g.cpus), float(g.memory))
            for i in range(g.count):
                out.append(Node(f"{g.name}-{i}", cap, cap, frozenset(g.features), dict(g.labels), g.node_type,
                                frozenset(g.datasets)))
        return out

    @property
    def total_gpus(self) -> int:
        return sum(g.gpus * g.count for g in self.nodes)


EMBEDDED: Dict[str, Any] = {
    "name": "local",
    "head": {"cpus": 4, "gpus": 0},
    "nodes": [
        {"name": "gpu-a", "gpus": 2, "cpus": 4, "memory": "6Gi", "features": ["gpu-sim", "nvlink"],
         "node_type": "local", "labels": {"rack": "r1"}},
        {"name": "gpu-b", "gpus": 2, "cpus": 4, "memory": "6Gi", "features": ["gpu-sim", "ssd"],
         "node_type": "local", "labels": {"rack": "r2"}},
    ],
}


def load_cluster(path: Union[str, Path, None] = None) -> ClusterFile:
    """The cluster file at ``path``, or the embedded default. Raises ``ValidationError`` with every problem."""
    from raylane.config.loader import _validate, read_yaml

    if path is None:
        return _validate(ClusterFile, EMBEDDED, "embedded cluster", [])
    data, dups = read_yaml(Path(path), "cluster file")
    return _validate(ClusterFile, data, str(path), list(dups))
