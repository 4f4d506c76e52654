"""OLB, opportunistic load balancing: the large-scale baseline.

Stages in topological order (declaration order among the ready); each goes to the feasible node where it can
start earliest (its inputs arrived, capacity free for its whole run), whatever its duration there; ties: node
order. It looks at no rank and no finish time, so it is fast and blind to slow nodes and to locality.
"""
from __future__ import annotations

from typing import Sequence

from raylane.planning.base import PLANNERS, Planner
from raylane.planning.model import Network, Pipeline, Plan, PlanNode, feasible_nodes
from raylane.planning.timeline import list_schedule


@PLANNERS.register("olb")
class OlbPlanner(Planner):
    name = "olb"

    def plan(self, pipeline: Pipeline, nodes: Sequence[PlanNode], network: Network) -> Plan:
        return list_schedule(pipeline, nodes, network.with_storage(nodes), feasible_nodes(pipeline, nodes),
                             pipeline.topological_order(),
                             key=lambda p: p.start_h, planner=self.name)
