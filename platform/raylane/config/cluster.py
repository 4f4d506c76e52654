"""Cluster files: the nodes of a cluster as groups (count x GPUs, CPUs, memory, feature tags, node type, labels).

One model serves the local cluster that ``raylane up`` starts, the simulator's simulated nodes and the Ray
cluster-launcher/KubeRay examples in ``deploy/``. ``EMBEDDED`` is the default small local cluster: a CPU-only head
for the control actor and drivers, and two worker nodes with two logical GPUs each, tagged differently so feature
placement is visible.

Words
- *fixed group*: a group without ``min`` and ``max``: exactly ``count`` nodes, as every group was before groups could
  grow.
- *growable group*: a group with ``max`` (and ``min``, default 0): the autoscaler may add nodes up to ``max`` for
  gangs that wait for capacity and remove idle ones down to ``min`` (``raylane.scheduling.autoscale``). ``count`` is
  how many it starts with (default ``min``). Its ``node_type`` is required and no other growable group's: scale-up
  requests select nodes by it.
- *price*: of one GPU-hour of a node of the group (of one node-hour for a node with no GPUs), in the currency of the
  policy's ``prices``, the unit ``raylane.cost`` reads them in; null: unpriced.
"""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Dict, List, Mapping, Optional, Tuple, Union

import pydantic
from pydantic import Field, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError
from pydantic_core import ValidationError as CoreValidationError

from raylane.config.fields import Allowed, Duration, Memory
from raylane.config.fields import StrictModel as _Model
from raylane.scheduling.autoscale import ScaleGroup
from raylane.scheduling.types import SPOT_LABEL, Node, Resources

MAX_NODES = 100_000
COUNT_ALLOWED = (f"an integer from 0 to {MAX_NODES}: the group's nodes (at least 1 for a group without min and "
                 f"max; where a group with max starts)")
BOUND_ALLOWED = f"an integer from 0 to {MAX_NODES}"
PRICE_ALLOWED = ("a number >= 0: the price of one GPU-hour of a node of this group (of one node-hour for a node with "
                 "no GPUs), in the currency of the policy's prices")
_INT = pydantic.TypeAdapter(int)


def _problem(loc: Tuple[Any, ...], value: Any, allowed: str) -> InitErrorDetails:
    # A raylane_ error: the loader reports its message as what is allowed (raylane.config.loader.pydantic_errors).
    return InitErrorDetails(type=PydanticCustomError("raylane_cluster", allowed.replace("{", "(").replace("}", ")")),
                            loc=loc, input=value)


class NodeGroup(_Model):
    """One group of identical nodes: fixed at ``count``, or growable between ``min`` and ``max`` (module words)."""

    name: str = Field(min_length=1, max_length=40, pattern=r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$")
    count: Annotated[int, Field(ge=0, le=MAX_NODES), Allowed(COUNT_ALLOWED)] = 1
    gpus: int = Field(default=0, ge=0, le=64)
    cpus: int = Field(default=8, ge=1, le=1024)
    memory: Memory = 32.0
    features: List[str] = Field(default_factory=list)
    node_type: str = ""
    labels: Dict[str, str] = Field(default_factory=dict)
    datasets: List[str] = Field(default_factory=list)
    # The fewest and most nodes a growable group may have; both null: a fixed group.
    min: Optional[Annotated[int, Field(ge=0, le=MAX_NODES), Allowed(BOUND_ALLOWED)]] = None
    max: Optional[Annotated[int, Field(ge=0, le=MAX_NODES), Allowed(BOUND_ALLOWED)]] = None
    price: Optional[Annotated[float, Field(ge=0), Allowed(PRICE_ALLOWED)]] = None
    # Spot (preemptible) nodes: cheaper, and the cloud may take them back.
    spot: bool = False
    # Typical time from asking for a node to it taking work; null: not known.
    startup: Optional[Duration] = None

    @model_validator(mode="before")
    @classmethod
    def _starts_at_min(cls, data: Any) -> Any:
        """A growable group that does not say ``count`` starts with ``min`` nodes (0 without ``min``)."""
        if not isinstance(data, Mapping) or "count" in data or data.get("max") is None:
            return data
        try:
            lo = _INT.validate_python(data.get("min") if data.get("min") is not None else 0)
        except pydantic.ValidationError:
            return data  # min's own error is reported; the default count is not checked against it
        return {**data, "count": lo} if 0 <= lo <= MAX_NODES else data

    @model_validator(mode="after")
    def _sizes(self) -> "NodeGroup":
        bad: List[InitErrorDetails] = []
        if self.max is None:
            if self.min is not None:
                bad.append(_problem(("max",), None, f"required when min is given: the most nodes the group may grow "
                                                    f"to, an integer >= {max(1, self.min)}"))
            elif self.count < 1:
                bad.append(_problem(("count",), self.count, "an integer >= 1: the group's size (a group with min "
                                                            "and max may start with 0 nodes)"))
        else:
            lo = self.min or 0
            if self.max < max(1, lo):
                bad.append(_problem(("max",), self.max, f"an integer >= min ({lo})" if lo >= 1 else
                                    "an integer >= 1: the most nodes the group may grow to"))
            elif not lo <= self.count <= self.max:
                bad.append(_problem(("count",), self.count, f"an integer from min ({lo}) to max ({self.max}): the "
                                                            f"nodes the group starts with"))
            if not self.node_type:
                bad.append(_problem(("node_type",), self.node_type, "a node type name: required for a group with "
                                                                    "max (scale-up requests select nodes by it)"))
        if bad:
            raise CoreValidationError.from_exception_data("NodeGroup", bad)
        return self

    @property
    def growable(self) -> bool:
        return self.max is not None

    @property
    def lo(self) -> int:
        """The fewest nodes the group may have (``count`` for a fixed group)."""
        return self.count if self.max is None else (self.min or 0)

    @property
    def hi(self) -> int:
        """The most nodes the group may have (``count`` for a fixed group)."""
        return self.count if self.max is None else self.max

    def node_labels(self) -> Dict[str, str]:
        """The labels the core sees on a node of the group: its own, and ``SPOT_LABEL`` on a spot group's."""
        return {**self.labels, SPOT_LABEL: "true"} if self.spot else dict(self.labels)

    def scale_group(self, count: Optional[int] = None) -> ScaleGroup:
        """The group as scale-up demand reads it, with ``count`` nodes now (default: the nodes it starts with)."""
        return ScaleGroup(self.name, Resources(float(self.gpus), float(self.cpus), float(self.memory)),
                          self.count if count is None else count, self.hi, self.node_type, frozenset(self.features),
                          dict(self.labels), self.price, self.spot, self.startup)


class HeadNode(_Model):
    cpus: int = Field(default=4, ge=1, le=1024)
    gpus: int = Field(default=0, ge=0, le=64)
    memory: Optional[Memory] = None


class ClusterFile(_Model):
    name: str = "local"
    head: HeadNode = Field(default_factory=HeadNode)
    nodes: List[NodeGroup] = Field(min_length=1)

    @model_validator(mode="after")
    def _node_types_select_one_group(self) -> "ClusterFile":
        seen: Dict[str, str] = {}
        bad: List[InitErrorDetails] = []
        for i, g in enumerate(self.nodes):
            if not g.growable:
                continue
            if g.node_type in seen:
                bad.append(_problem(("nodes", i, "node_type"), g.node_type,
                                    f"a node type no other group with max has (group {seen[g.node_type]} has it): "
                                    f"scale-up requests select nodes by node type"))
            else:
                seen[g.node_type] = g.name
        if bad:
            raise CoreValidationError.from_exception_data("ClusterFile", bad)
        return self

    def core_nodes(self) -> List[Node]:
        """Simulated nodes, named ``<group>-<i>``, all free."""
        out = []
        for g in self.nodes:
            cap = Resources(float(g.gpus), float(g.cpus), float(g.memory))
            for i in range(g.count):
                out.append(Node(f"{g.name}-{i}", cap, cap, frozenset(g.features), g.node_labels(), g.node_type,
                                frozenset(g.datasets)))
        return out

    @property
    def total_gpus(self) -> int:
        return sum(g.gpus * g.count for g in self.nodes)

    def scale_groups(self, counts: Optional[Mapping[str, int]] = None) -> Tuple[ScaleGroup, ...]:
        """Every group as scale-up demand reads it, with ``counts[name]`` nodes now (default: what it starts with)."""
        counts = counts or {}
        return tuple(g.scale_group(counts.get(g.name)) for g in self.nodes)


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
