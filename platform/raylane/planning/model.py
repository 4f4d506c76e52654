"""The words of pipeline planning: stages, pipelines, plan nodes, the network, placements and plans.

This module owns the immutable value types every planner reads and the verifier checks, and the validation of a
pipeline against a cluster. Nothing here imports Ray, reads a clock or draws random numbers.

Glossary
- *stage*: one step of a pipeline; it holds ``cpu``/``memory_gb``/``gpu`` on one node for its whole duration, needs
  the node to carry every one of its ``features`` and writes ``output_gb`` that every stage that ``needs`` it reads.
- *duration*: ``duration_h`` hours, or ``durations_h[node_type]`` on a node of that type when given.
- *transfer*: a consumer on another node than its producer starts no earlier than the producer's finish plus
  ``output_gb / rate``; on the same node the output is already there (no transfer).
- *rate*: a transfer between two nodes runs at the lowest of the link's bandwidth and the storage rates of the two
  nodes (``PlanNode.storage_gbps`` x 3600 GB/h; 0 = no limit). ``Network.rate`` is the one place that says so;
  planners and the verifier take ``network.with_storage(nodes)`` first. Transfers do not share a link or a disk
  (no contention is modelled).
- *capacity*: several stages may run on one node at once while their cpu, memory and gpu sums stay within the
  node's at every instant.
- *makespan*: the latest finish of any stage (the pipeline starts at 0 h).
- *plan*: one placement (node, start, finish) per stage and the makespan the planner claims for it.
"""
from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field
from typing import Dict, FrozenSet, List, Mapping, Optional, Sequence, Tuple

from raylane.errors import ValidationError

#: Slack on float comparisons of hours and resources (sums such as 0.1 + 0.2).
EPS = 1e-9


def _frozen_features(value) -> FrozenSet[str]:
    if isinstance(value, str):
        return frozenset([value])
    return frozenset(value or ())


@dataclass(frozen=True)
class Stage:
    """One stage. ``durations_h`` maps a node type to this stage's hours there; other types take ``duration_h``."""

    name: str
    cpu: float
    memory_gb: float
    duration_h: float
    gpu: float = 0.0
    features: FrozenSet[str] = frozenset()
    output_gb: float = 0.0
    needs: Tuple[str, ...] = ()
    durations_h: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self):
        object.__setattr__(self, "features", _frozen_features(self.features))
        needs = (self.needs,) if isinstance(self.needs, str) else tuple(self.needs)
        object.__setattr__(self, "needs", needs)
        object.__setattr__(self, "durations_h", dict(self.durations_h))
        errors = []
        for fname in ("cpu", "memory_gb", "gpu", "output_gb"):
            v = getattr(self, fname)
            if not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                errors.append((f"stages.{self.name}.{fname}", v, "a finite number >= 0"))
        for key, v in [("duration_h", self.duration_h)] + [
            (f"durations_h.{t}", d) for t, d in sorted(self.durations_h.items())
        ]:
            if not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                errors.append((f"stages.{self.name}.{key}", v, "a finite number of hours > 0"))
        if errors:
            raise ValidationError("stage", errors)

    def __hash__(self):  # durations_h is a dict; the name identifies a stage inside a pipeline
        return hash(self.name)

    def duration_on(self, node: "PlanNode") -> float:
        return self.durations_h.get(node.node_type, self.duration_h)

    @property
    def demand(self) -> Tuple[float, float, float]:
        """(cpu, memory_gb, gpu), the order of ``PlanNode.capacity``."""
        return (self.cpu, self.memory_gb, self.gpu)


@dataclass(frozen=True)
class PlanNode:
    """A node as the planner sees it. ``storage_gbps``: how fast its storage reads and writes, in GB/s (0: no
    limit); a transfer to or from the node runs no faster (``Network.with_storage``)."""

    name: str
    node_type: str
    cpu: float
    memory_gb: float
    gpu: float = 0.0
    features: FrozenSet[str] = frozenset()
    storage_gbps: float = 0.0

    def __post_init__(self):
        object.__setattr__(self, "features", _frozen_features(self.features))
        v = self.storage_gbps
        if not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            raise ValidationError("node", [(f"nodes.{self.name}.storage_gbps", v, "a finite number of GB/s >= 0 "
                                                                                   "(0: no limit)")])

    @property
    def storage_gb_per_h(self) -> float:
        """The storage rate in GB per hour, ``math.inf`` when unlimited."""
        return self.storage_gbps * 3600.0 if self.storage_gbps > 0 else math.inf

    @property
    def capacity(self) -> Tuple[float, float, float]:
        return (self.cpu, self.memory_gb, self.gpu)

    def why_not(self, stage: Stage) -> Optional[str]:
        """Why ``stage`` can never run here (missing features, more than the node holds), or None if it can."""
        missing = sorted(stage.features - self.features)
        if missing:
            return f"lacks feature(s) {', '.join(missing)} (has: {', '.join(sorted(self.features)) or 'none'})"
        over = [
            f"{label} {want:g} > {have:g}"
            for label, want, have in zip(RESOURCE_LABELS, stage.demand, self.capacity)
            if want > have + EPS
        ]
        return "holds too little: " + ", ".join(over) if over else None


RESOURCE_LABELS: Tuple[str, ...] = ("cpu", "memory_gb", "gpu")


@dataclass(frozen=True)
class Network:
    """Bandwidth between nodes in GB per hour: ``links[(a, b)]`` (either order) or ``default_gb_per_h``; and the
    storage rate of some nodes in GB per hour, ``storage_gb_per_h[name]`` (absent: no limit).

    A transfer from ``a`` to ``b`` runs at ``rate(a, b)``: the lowest of the link and the two storage rates.
    ``math.inf`` means transfers are free. Two stages on one node need no transfer. ``with_storage(nodes)`` adds the
    nodes' ``storage_gbps``; a Network built without storage limits nothing but the links.
    """

    default_gb_per_h: float
    links: Mapping[Tuple[str, str], float] = field(default_factory=dict)
    storage_gb_per_h: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self):
        links = {}
        errors = []
        for (a, b), bw in dict(self.links).items():
            if not isinstance(bw, (int, float)) or not bw > 0:
                errors.append((f"network.links.{a}-{b}", bw, "a bandwidth in GB/h > 0"))
            links[(a, b)] = links[(b, a)] = float(bw)
        if not isinstance(self.default_gb_per_h, (int, float)) or not self.default_gb_per_h > 0:
            errors.append(("network.default_gb_per_h", self.default_gb_per_h, "a bandwidth in GB/h > 0"))
        storage = {}
        for name, rate in dict(self.storage_gb_per_h).items():
            if not isinstance(rate, (int, float)) or not rate >= 0:
                errors.append((f"network.storage_gb_per_h.{name}", rate, "a rate in GB/h >= 0 (0: no limit)"))
            elif rate > 0 and rate != math.inf:
                storage[name] = float(rate)
        if errors:
            raise ValidationError("network", errors)
        object.__setattr__(self, "links", links)
        object.__setattr__(self, "storage_gb_per_h", storage)

    def __hash__(self):
        return hash((self.default_gb_per_h, tuple(sorted(self.links.items())),
                     tuple(sorted(self.storage_gb_per_h.items()))))

    def with_storage(self, nodes: Sequence["PlanNode"]) -> "Network":
        """This network with each node's ``storage_gbps`` as its storage rate (where > 0); idempotent."""
        storage = dict(self.storage_gb_per_h)
        storage.update({n.name: n.storage_gb_per_h for n in nodes if n.storage_gbps > 0})
        if storage == self.storage_gb_per_h:
            return self
        return Network(self.default_gb_per_h, self.links, storage)

    def bandwidth(self, a: str, b: str) -> float:
        """The link alone; ``rate`` is what a transfer gets."""
        return self.links.get((a, b), self.default_gb_per_h)

    def rate(self, a: str, b: str) -> float:
        """GB per hour of a transfer from ``a`` to ``b``: min(link, storage of a, storage of b)."""
        bw = self.links.get((a, b), self.default_gb_per_h)
        if self.storage_gb_per_h:
            bw = min(bw, self.storage_gb_per_h.get(a, math.inf), self.storage_gb_per_h.get(b, math.inf))
        return bw

    def bottleneck(self, a: str, b: str) -> str:
        """What sets ``rate(a, b)``: ``"link"``, or ``"storage of NODE"`` when a node's storage is slower."""
        bw = self.bandwidth(a, b)
        slow = min((self.storage_gb_per_h.get(n, math.inf), n) for n in (a, b))
        return f"storage of {slow[1]}" if slow[0] < bw else "link"

    def transfer_h(self, gb: float, src: str, dst: str) -> float:
        if src == dst or gb <= 0:
            return 0.0
        return gb / self.rate(src, dst)


class PlanStatus(enum.Enum):
    HEURISTIC = "heuristic"  # a list heuristic's plan: feasible, no claim about optimality
    OPTIMAL = "optimal"  # proven optimal (CP-SAT at its time resolution, or exhaustive search)
    FEASIBLE = "feasible"  # the best plan found within a time limit; ``bound_h`` is a lower bound
    DRAFT = "draft"  # written by a person or another tool; checked by ``verify``


@dataclass(frozen=True)
class Placement:
    stage: str
    node: str
    start_h: float
    finish_h: float


@dataclass(frozen=True)
class Plan:
    """Placements and the makespan the planner claims. ``bound_h``: a proven lower bound on any plan's makespan."""

    placements: Tuple[Placement, ...]
    makespan_h: float
    planner: str = ""
    status: PlanStatus = PlanStatus.DRAFT
    bound_h: Optional[float] = None
    note: str = ""  # how it was obtained, when that is not obvious from ``planner`` and ``status``

    def by_stage(self) -> Dict[str, Placement]:
        return {p.stage: p for p in self.placements}


@dataclass(frozen=True)
class Pipeline:
    """A DAG of stages. Refuses duplicate names, unknown ``needs`` and cycles (all errors at once, cycle named)."""

    stages: Tuple[Stage, ...]

    def __post_init__(self):
        stages = tuple(self.stages)
        object.__setattr__(self, "stages", stages)
        errors: List[Tuple[str, object, str]] = []
        names = [s.name for s in stages]
        seen = set()
        for n in names:
            if n in seen:
                errors.append(("stages.name", n, "a name used by one stage only"))
            seen.add(n)
        for s in stages:
            for need in s.needs:
                if need not in seen:
                    errors.append((f"stages.{s.name}.needs", need, f"one of: {', '.join(sorted(seen))}"))
                elif need == s.name:
                    errors.append((f"stages.{s.name}.needs", need, "another stage (a stage cannot need itself)"))
        if not errors:
            cycle = _find_cycle(stages)
            if cycle:
                errors.append(("stages.needs", " -> ".join(cycle), "an acyclic graph (this is a cycle)"))
        if errors:
            raise ValidationError("pipeline", errors)

    def __hash__(self):
        return hash(tuple(s.name for s in self.stages))

    def stage(self, name: str) -> Stage:
        for s in self.stages:
            if s.name == name:
                return s
        raise KeyError(name)

    def edges(self) -> List[Tuple[str, str]]:
        """(producer, consumer) for every ``needs`` entry."""
        return [(p, s.name) for s in self.stages for p in s.needs]

    def successors(self) -> Dict[str, List[str]]:
        out: Dict[str, List[str]] = {s.name: [] for s in self.stages}
        for p, c in self.edges():
            out[p].append(c)
        return out

    def topological_order(self) -> List[str]:
        """Kahn's order; among ready stages, declaration order first (deterministic)."""
        indeg = {s.name: len(s.needs) for s in self.stages}
        succ = self.successors()
        ready = [s.name for s in self.stages if not s.needs]
        order = []
        while ready:
            n = ready.pop(0)
            order.append(n)
            for c in succ[n]:
                indeg[c] -= 1
                if indeg[c] == 0:
                    ready.append(c)
        return order


def _find_cycle(stages: Sequence[Stage]) -> Optional[List[str]]:
    needs = {s.name: s.needs for s in stages}
    color: Dict[str, int] = {}
    stack: List[str] = []

    def visit(n: str) -> Optional[List[str]]:
        color[n] = 1
        stack.append(n)
        for m in needs[n]:
            if color.get(m) == 1:
                return stack[stack.index(m):] + [m]
            if m not in color:
                found = visit(m)
                if found:
                    return found
        stack.pop()
        color[n] = 2
        return None

    for s in stages:
        if s.name not in color:
            found = visit(s.name)
            if found:
                # Written in run order: producer -> consumer.
                return list(reversed(found))
    return None


def feasible_nodes(pipeline: Pipeline, nodes: Sequence[PlanNode]) -> Dict[str, List[PlanNode]]:
    """Per stage, the nodes that can ever hold it. Refuses a stage that no node can hold, saying what it needs."""
    errors = []
    node_names = [n.name for n in nodes]
    if not nodes:
        errors.append(("nodes", [], "at least one node"))
    if len(set(node_names)) != len(node_names):
        dup = sorted({n for n in node_names if node_names.count(n) > 1})
        errors.append(("nodes.name", dup, "a name used by one node only"))
    out: Dict[str, List[PlanNode]] = {}
    for s in pipeline.stages:
        out[s.name] = [n for n in nodes if n.why_not(s) is None]
        if nodes and not out[s.name]:
            want = f"{s.cpu:g} cpu, {s.memory_gb:g} GB memory, {s.gpu:g} gpu"
            if s.features:
                want += f", features {', '.join(sorted(s.features))}"
            reasons = "; ".join(f"{n.name} {n.why_not(s)}" for n in nodes)
            errors.append((f"stages.{s.name}", want, f"a stage some node can hold ({reasons})"))
    if errors:
        raise ValidationError("pipeline on cluster", errors)
    return out

