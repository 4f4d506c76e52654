"""Simulated clusters: node groups from a YAML cluster file or from command-line flags, as the core's ``Node``s.

This module owns the cluster file format. A cluster file lists node groups; every node of a group is alike:

```yaml
name: philly-560
node_groups:
  - name: gpu           # node ids are <name>-000, <name>-001, ...
    count: 70
    gpus: 8
    cpus: 64            # 0: CPUs are not modelled (a job asking for CPUs then fits nowhere)
    memory: 512Gi       # GiB, or 512Gi / 1Ti
    features: [p100]    # tags a job may require
    node_type: p100-8x
    labels: {zone: a}   # node labels (the ``group`` placement reads them)
    rack_size: 10       # optional: label nodes rack=<name>-r0, -r1, ... in runs of this many
```

Errors are raised together as one ``ValidationError`` naming each field, the bad value and what is allowed.
"""
from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Optional, Sequence, Union

import pydantic
from pydantic import BaseModel, ConfigDict, Field

from raylane.config.loader import pydantic_errors, read_yaml
from raylane.config.models import Memory, Name
from raylane.errors import ValidationError
from raylane.scheduling.types import Node, Resources

__all__ = ["NodeGroupSpec", "ClusterSpec", "load_cluster", "cluster_from_flags"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, frozen=True)


class NodeGroupSpec(_Model):
    name: Name
    count: int = Field(ge=1)
    gpus: int = Field(ge=0)
    cpus: float = Field(default=0.0, ge=0)
    memory: Memory = 0.0
    features: List[str] = Field(default_factory=list)
    node_type: str = ""
    labels: Dict[str, str] = Field(default_factory=dict)
    rack_size: Optional[int] = Field(default=None, ge=1)

    def nodes(self) -> List[Node]:
        cap = Resources(float(self.gpus), float(self.cpus), float(self.memory))
        feats = frozenset(self.features)
        out = []
        width = max(3, len(str(self.count - 1)))
        for i in range(self.count):
            labels = dict(self.labels)
            if self.rack_size:
                labels["rack"] = f"{self.name}-r{i // self.rack_size}"
            # One GPU device per GPU: a job asking a share of a GPU takes part of one (raylane.scheduling.types).
            out.append(Node(f"{self.name}-{i:0{width}d}", cap, cap, feats, labels, self.node_type,
                            devices=(1.0,) * self.gpus))
        return out


class ClusterSpec(_Model):
    name: str = ""
    node_groups: List[NodeGroupSpec] = Field(min_length=1)

    def nodes(self) -> List[Node]:
        return [n for g in self.node_groups for n in g.nodes()]

    @property
    def total_gpus(self) -> int:
        return sum(g.count * g.gpus for g in self.node_groups)

    @property
    def max_node_gpus(self) -> int:
        return max(g.gpus for g in self.node_groups)

    def describe(self) -> str:
        parts = [f"{g.count} x {g.gpus} GPU" + (f" [{', '.join(g.features)}]" if g.features else "")
                 for g in self.node_groups]
        return f"{self.name or 'cluster'}: " + " + ".join(parts) + f" = {self.total_gpus} GPUs"


def load_cluster(path: Union[str, Path]) -> ClusterSpec:
    """The cluster in a YAML file; ``ValidationError`` with every problem, ``NotFoundError`` if it is missing."""
    data, dups = read_yaml(path, "cluster file")
    errors = list(dups)
    spec = None
    if not isinstance(data, dict):
        errors.append(("(top level)", data, "a mapping with fields name, node_groups"))
    else:
        try:
            spec = ClusterSpec.model_validate(data)
        except pydantic.ValidationError as exc:
            errors.extend(pydantic_errors(exc, ClusterSpec))
    if spec is not None:
        names = [g.name for g in spec.node_groups]
        errors += [(f"node_groups[{i}].name", n, "a name no other node group has")
                   for i, n in enumerate(names) if n in names[:i]]
    if errors:
        raise ValidationError(str(path), errors)
    return spec


def cluster_from_flags(nodes: int, gpus_per_node: int, *, cpus_per_node: float = 0.0, memory_per_node: float = 0.0,
                       features: Sequence[str] = (), name: str = "") -> ClusterSpec:
    errors = []
    if nodes < 1:
        errors.append(("--nodes", nodes, "an integer >= 1"))
    if gpus_per_node < 0:
        errors.append(("--gpus-per-node", gpus_per_node, "an integer >= 0"))
    if errors:
        raise ValidationError("flags", errors)
    group = NodeGroupSpec(name="node", count=nodes, gpus=gpus_per_node, cpus=cpus_per_node, memory=memory_per_node,
                          features=list(features))
    return ClusterSpec(name=name or f"{nodes}x{gpus_per_node}", node_groups=[group])
