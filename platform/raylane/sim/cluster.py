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
  - name: a100-spot     # a growable group (``raylane.sim.autoscaled``): starts at count (default min)
    min: 0
    max: 40
    gpus: 8
    node_type: a100-spot
    price: 1.2          # per GPU-hour (per node-hour for a node with no GPUs)
    spot: true          # may be reclaimed (SimOptions.spot_reclaim_per_hour)
    startup: 3m         # from the request to the node taking work (default DEFAULT_STARTUP_S)
```

``min``, ``max``, ``price``, ``spot`` and ``startup`` mean what they mean in the platform's cluster files
(``raylane.config.cluster.NodeGroup``), and are checked by that model's rules (a group with ``min`` needs ``max``,
``count`` between them, a ``node_type`` no other growable group has), so the two formats cannot drift apart.

Errors are raised together as one ``ValidationError`` naming each field, the bad value and what is allowed.
"""
from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Optional, Sequence, Union

import pydantic
from pydantic import BaseModel, ConfigDict, Field

from raylane.config.cluster import COUNT_ALLOWED, ClusterFile, NodeGroup
from raylane.config.loader import MISSING, pydantic_errors, read_yaml
from raylane.config.fields import Duration, Memory, Name
from raylane.errors import ValidationError
from raylane.scheduling.autoscale import ScaleGroup
from raylane.scheduling.types import Node, Resources

__all__ = ["NodeGroupSpec", "ClusterSpec", "load_cluster", "cluster_from_flags"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, frozen=True)


# The fields of a group that ``raylane.config.cluster.NodeGroup`` checks for the simulator (sizes and growth).
_GROWTH_FIELDS = ("count", "node_type", "min", "max", "price", "spot", "startup")


class NodeGroupSpec(_Model):
    name: Name
    # Required for a fixed group; a growable group starts at ``min`` when it is left out (``load_cluster``).
    count: Optional[int] = Field(default=None, ge=0)
    gpus: int = Field(ge=0)
    cpus: float = Field(default=0.0, ge=0)
    memory: Memory = 0.0
    features: List[str] = Field(default_factory=list)
    node_type: str = ""
    labels: Dict[str, str] = Field(default_factory=dict)
    rack_size: Optional[int] = Field(default=None, ge=1)
    # Growth (module docstring): the fewest and most nodes, price per GPU-hour, spot, start-up time in seconds.
    min: Optional[int] = Field(default=None, ge=0)
    max: Optional[int] = Field(default=None, ge=0)
    price: Optional[float] = Field(default=None, ge=0)
    spot: bool = False
    startup: Optional[Duration] = None

    @property
    def growable(self) -> bool:
        return self.max is not None

    @property
    def lo(self) -> int:
        """The fewest nodes the group may have (``count`` for a fixed group)."""
        return (self.count or 0) if self.max is None else (self.min or 0)

    @property
    def hi(self) -> int:
        """The most nodes the group may have (``count`` for a fixed group)."""
        return (self.count or 0) if self.max is None else self.max

    @property
    def capacity(self) -> Resources:
        return Resources(float(self.gpus), float(self.cpus), float(self.memory))

    def node(self, i: int) -> Node:
        """The group's ``i``-th node, empty: id ``<name>-<i>`` (zero-padded to at least 3 digits)."""
        width = max(3, len(str(max(self.count or 0, self.hi) - 1)))
        labels = dict(self.labels)
        if self.rack_size:
            labels["rack"] = f"{self.name}-r{i // self.rack_size}"
        cap = self.capacity
        # One GPU device per GPU: a job asking a share of a GPU takes part of one (raylane.scheduling.types).
        return Node(f"{self.name}-{i:0{width}d}", cap, cap, frozenset(self.features), labels, self.node_type,
                    devices=(1.0,) * self.gpus)

    def nodes(self) -> List[Node]:
        """The nodes the group starts with."""
        return [self.node(i) for i in range(self.count or 0)]

    def scale_group(self, count: int) -> ScaleGroup:
        """The group as scale-up demand reads it (``raylane.scheduling.autoscale``), with ``count`` nodes now."""
        return ScaleGroup(self.name, self.capacity, count, self.hi, self.node_type, frozenset(self.features),
                          dict(self.labels), self.price, self.spot, self.startup)


class ClusterSpec(_Model):
    name: str = ""
    node_groups: List[NodeGroupSpec] = Field(min_length=1)

    def nodes(self) -> List[Node]:
        """The nodes the cluster starts with."""
        return [n for g in self.node_groups for n in g.nodes()]

    def nodes_at_max(self) -> List[Node]:
        """Every node the cluster may ever have (each group at ``hi``): what decides whether a job can ever run."""
        return [g.node(i) for g in self.node_groups for i in range(max(g.count or 0, g.hi))]

    @property
    def growable(self) -> bool:
        return any(g.growable for g in self.node_groups)

    @property
    def elastic(self) -> bool:
        """Whether a replay follows its nodes' lives and cost (``raylane.sim.autoscaled``): a group grows, has a
        price or is spot. A cluster of fixed, unpriced on-demand groups replays and reports as it always has."""
        return any(g.growable or g.price is not None or g.spot for g in self.node_groups)

    @property
    def total_gpus(self) -> int:
        """GPUs of the nodes the cluster starts with."""
        return sum((g.count or 0) * g.gpus for g in self.node_groups)

    @property
    def max_node_gpus(self) -> int:
        return max(g.gpus for g in self.node_groups)

    def describe(self) -> str:
        parts = [(f"{g.lo}..{g.hi} (from {g.count})" if g.growable else f"{g.count}") + f" x {g.gpus} GPU"
                 + (f" [{', '.join(g.features)}]" if g.features else "") + (" spot" if g.spot else "")
                 for g in self.node_groups]
        return f"{self.name or 'cluster'}: " + " + ".join(parts) + f" = {self.total_gpus} GPUs" + (
            " to start" if self.growable else "")


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
    counts = _growth_errors(data, errors) if isinstance(data, dict) else None
    if spec is not None:
        names = [g.name for g in spec.node_groups]
        errors += [(f"node_groups[{i}].name", n, "a name no other node group has")
                   for i, n in enumerate(names) if n in names[:i]]
    if errors:
        raise ValidationError(str(path), errors)
    if counts:
        spec = spec.model_copy(update={"node_groups": [g.model_copy(update={"count": n})
                                                       for g, n in zip(spec.node_groups, counts)]})
    return spec


def _growth_errors(data: dict, errors: list) -> Optional[List[int]]:
    """Check each group's sizes and growth fields with the platform's model (``raylane.config.cluster``), adding
    to ``errors`` those not already reported for the same field; the count each group starts with (a growable
    group without ``count`` starts at ``min``), or None when the file has no such fields or is not valid."""
    groups = data.get("node_groups")
    if not isinstance(groups, list) or not all(isinstance(g, dict) for g in groups):
        return None
    subsets = []
    known = {e[0] for e in errors}
    for i, g in enumerate(groups):
        sub = {k: g[k] for k in _GROWTH_FIELDS if k in g}
        if "count" not in g and g.get("max") is None and g.get("min") is None:
            path = f"node_groups[{i}].count"
            if path not in known:
                known.add(path)
                errors.append((path, MISSING, "required for a group without min and max: " + COUNT_ALLOWED))
        # The platform's names are stricter than the simulator's: the checks do not read it, messages do.
        name = g.get("name")
        sub["name"] = name if isinstance(name, str) and _platform_name(name) else f"group-{i}"
        subsets.append(sub)
    try:
        checked = ClusterFile.model_validate({"nodes": subsets})
    except pydantic.ValidationError as exc:
        for path, value, allowed in pydantic_errors(exc, ClusterFile):
            path = "node_groups" + path[len("nodes"):] if path.startswith("nodes") else path
            if path not in known:
                known.add(path)
                errors.append((path, value, allowed))
        return None
    return [g.count for g in checked.nodes]


def _platform_name(name: str) -> bool:
    try:
        NodeGroup.model_validate({"name": name})
        return True
    except pydantic.ValidationError:
        return False


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
