"""OLB, opportunistic load balancing: the large-scale baseline.

Stages in topological order (declaration order among the ready); each goes to the feasible node where it can
start earliest (its inputs arrived, capacity free for its whole run), whatever its duration there; ties: node
order. It looks at no rank and no finish time, so it is fast and blind to slow nodes and to locality.
"""
from __future__ import annotations

from typing import Dict, Sequence

from raylane.planning.base import PLANNERS, Planner
from raylane.planning.model import Network, Pipeline, Placement, Plan, PlanNode, PlanStatus, feasible_nodes
from raylane.planning.timeline import Timeline, data_ready_h


@PLANNERS.register("olb")
class OlbPlanner(Planner):
    name = "olb"

    def plan(self, pipeline: Pipeline, nodes: Sequence[PlanNode], network: Network) -> Plan:
        feasible = feasible_nodes(pipeline, nodes)
        stages = {s.name: s for s in pipeline.stages}
        timelines = {n.name: Timeline(n) for n in nodes}
        placed: Dict[str, Placement] = {}
        for name in pipeline.topological_order():
            s = stages[name]
            best = None
            for node in feasible[name]:
                dur = s.duration_on(node)
                start = timelines[node.name].earliest_start(
                    data_ready_h(s, node.name, placed, stages, network), dur, s.demand)
                if best is None or start < best.start_h - 1e-12:
                    best = Placement(name, node.name, start, start + dur)
            timelines[best.node].add(best.start_h, best.finish_h, s.demand)
            placed[name] = best
        ordered = tuple(placed[s.name] for s in pipeline.stages)
        return Plan(ordered, max(p.finish_h for p in ordered), planner=self.name, status=PlanStatus.HEURISTIC)
