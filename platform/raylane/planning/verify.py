"""The verifier: checks any proposed plan (a planner's, a person's, an LLM's draft) against a pipeline and cluster.

It trusts nothing in the plan: stage and node names may be unknown, stages missing or placed twice, times wrong.
Each violation carries its numbers (which stage, which node, by how much); the report then gives the makespan it
computes, the data moved between nodes and the gap to a best known makespan when one is given. It shares no code
with the planners beyond the value types, so a planner's bug cannot hide behind the same bug here.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

from raylane.planning.model import EPS, RESOURCE_LABELS, Network, Pipeline, Plan, PlanNode

TOL = 1e-6  # hours; plans written by hand round to seconds at best


class ViolationKind(enum.Enum):
    UNPLACED = "unplaced"  # a pipeline stage with no placement
    DUPLICATE = "duplicate"  # a stage placed more than once
    UNKNOWN_STAGE = "unknown-stage"
    UNKNOWN_NODE = "unknown-node"
    FEATURES = "features"  # the node lacks a feature the stage needs
    DURATION = "duration"  # finish - start differs from the stage's duration on that node, or a start before 0
    DEPENDENCY = "dependency"  # a stage starts before an input has arrived
    CAPACITY = "capacity"  # a node's cpu, memory or gpu exceeded over some window
    MAKESPAN = "makespan"  # the claimed makespan is not the computed one


@dataclass(frozen=True)
class Violation:
    kind: ViolationKind
    stage: str
    node: str
    amount: float  # by how much: hours early/late, units of a resource over, hours of makespan error
    message: str

    def __str__(self) -> str:
        return f"[{self.kind.value}] {self.message}"


@dataclass(frozen=True)
class Report:
    violations: Tuple[Violation, ...]
    makespan_h: float  # computed from the placements (latest finish)
    claimed_makespan_h: float
    data_moved_gb: float  # outputs read on another node than their producer's, summed per dependency
    best_known_h: Optional[float] = None

    @property
    def ok(self) -> bool:
        return not self.violations

    @property
    def gap(self) -> Optional[float]:
        """(makespan - best known) / best known; None without a best known makespan."""
        if not self.best_known_h:
            return None
        return (self.makespan_h - self.best_known_h) / self.best_known_h

    def of_kind(self, kind: ViolationKind) -> List[Violation]:
        return [v for v in self.violations if v.kind is kind]

    def render(self) -> str:
        lines = [str(v) for v in self.violations] or ["plan is valid"]
        lines.append(f"makespan {self.makespan_h:g} h (claimed {self.claimed_makespan_h:g} h), "
                     f"data moved {self.data_moved_gb:g} GB")
        if self.gap is not None:
            lines.append(f"gap to best known {self.best_known_h:g} h: {self.gap:+.1%}")
        return "\n".join(lines)


def verify(pipeline: Pipeline, nodes: Sequence[PlanNode], network: Network, plan: Plan,
           best_known_h: Optional[float] = None) -> Report:
    out: List[Violation] = []
    network = network.with_storage(nodes)  # transfers run at Network.rate: the link or a slower node's storage
    stages = {s.name: s for s in pipeline.stages}
    by_node = {n.name: n for n in nodes}

    # 1. Every stage placed exactly once, on a known node.
    seen: Dict[str, object] = {}
    for pl in plan.placements:
        if pl.stage not in stages:
            out.append(Violation(ViolationKind.UNKNOWN_STAGE, pl.stage, pl.node, 0.0,
                                 f"{pl.stage} is not a stage of the pipeline (stages: {', '.join(stages)})"))
            continue
        if pl.stage in seen:
            out.append(Violation(ViolationKind.DUPLICATE, pl.stage, pl.node, 0.0,
                                 f"{pl.stage} placed again on {pl.node} (first on {seen[pl.stage].node})"))
            continue
        if pl.node not in by_node:
            out.append(Violation(ViolationKind.UNKNOWN_NODE, pl.stage, pl.node, 0.0,
                                 f"{pl.stage} on {pl.node}: no such node (nodes: {', '.join(by_node)})"))
        seen[pl.stage] = pl
    for name in stages:
        if name not in seen:
            out.append(Violation(ViolationKind.UNPLACED, name, "", 0.0, f"{name} is not placed"))
    placed = {name: pl for name, pl in seen.items() if pl.node in by_node}

    # 2. Features and durations.
    for name, pl in placed.items():
        s, node = stages[name], by_node[pl.node]
        missing = sorted(s.features - node.features)
        if missing:
            out.append(Violation(ViolationKind.FEATURES, name, pl.node, float(len(missing)),
                                 f"{name} needs {', '.join(missing)}; {pl.node} has "
                                 f"{', '.join(sorted(node.features)) or 'no features'}"))
        want = s.duration_on(node)
        if abs((pl.finish_h - pl.start_h) - want) > TOL:
            out.append(Violation(ViolationKind.DURATION, name, pl.node, pl.finish_h - pl.start_h - want,
                                 f"{name} on {pl.node} runs {pl.start_h:g}-{pl.finish_h:g} h "
                                 f"({pl.finish_h - pl.start_h:g} h); it takes {want:g} h on a {node.node_type} node"))
        if pl.start_h < -TOL:
            out.append(Violation(ViolationKind.DURATION, name, pl.node, pl.start_h,
                                 f"{name} on {pl.node} starts at {pl.start_h:g} h; the pipeline starts at 0 h"))

    # 3. Dependencies and transfers.
    moved = 0.0
    for p, c in pipeline.edges():
        if p not in placed or c not in placed:
            continue
        pp, pc = placed[p], placed[c]
        gb = stages[p].output_gb
        if pp.node != pc.node:
            moved += gb
        xfer = network.transfer_h(gb, pp.node, pc.node)
        arrives = pp.finish_h + xfer
        if pc.start_h < arrives - TOL:
            how = (f"{gb:g} GB from {pp.node} take {xfer:g} h" if pp.node != pc.node else "same node, no transfer")
            if pp.node != pc.node and network.bottleneck(pp.node, pc.node) != "link":
                how += f" at {network.rate(pp.node, pc.node):g} GB/h, the {network.bottleneck(pp.node, pc.node)}"
            out.append(Violation(ViolationKind.DEPENDENCY, c, pc.node, arrives - pc.start_h,
                                 f"{c} starts at {pc.start_h:g} h on {pc.node}, before {p}'s output arrives at "
                                 f"{arrives:g} h ({p} finishes {pp.finish_h:g} h on {pp.node}; {how}): "
                                 f"{arrives - pc.start_h:g} h early"))

    # 4. Capacity over time: usage is constant between consecutive starts/finishes on a node.
    for node in nodes:
        mine = [pl for pl in placed.values() if pl.node == node.name]
        times = sorted({t for pl in mine for t in (pl.start_h, pl.finish_h)})
        for r, label in enumerate(RESOURCE_LABELS):
            cap = node.capacity[r]
            reported = None
            for a, b in zip(times, times[1:]):
                if b - a <= TOL:
                    continue  # float noise (36.3667 vs 36.3667 + 1e-14), not a window anything runs in
                running = [pl for pl in mine if pl.start_h <= a + EPS and pl.finish_h >= b - EPS]
                used = sum(stages[pl.stage].demand[r] for pl in running)
                if used > cap + EPS:
                    key = tuple(sorted(pl.stage for pl in running))
                    if reported and reported[0] == key and reported[1].node == node.name:
                        continue  # the same set over the next window: one violation
                    v = Violation(ViolationKind.CAPACITY, ",".join(key), node.name, used - cap,
                                  f"{node.name} {label}: {used:g} used by {', '.join(key)} from {a:g} h to "
                                  f"{b:g} h, capacity {cap:g}: over by {used - cap:g}")
                    out.append(v)
                    reported = (key, v)
                else:
                    reported = None

    # 5. The claimed makespan.
    makespan = max((pl.finish_h for pl in placed.values()), default=0.0)
    if abs(makespan - plan.makespan_h) > TOL:
        out.append(Violation(ViolationKind.MAKESPAN, "", "", plan.makespan_h - makespan,
                             f"claimed makespan {plan.makespan_h:g} h, computed {makespan:g} h "
                             f"(off by {plan.makespan_h - makespan:+g} h)"))
    return Report(tuple(out), makespan, plan.makespan_h, moved, best_known_h)
