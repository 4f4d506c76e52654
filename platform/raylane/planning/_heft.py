"""HEFT (Topcuoglu, Hariri and Wu, 2002), with capacity and features.

1. Upward rank of each stage: its mean duration over the nodes that can hold it, plus the largest, over its
   consumers, of the mean transfer time of its output between two different nodes plus the consumer's rank
   (transfers at ``Network.rate``: the link or a slower node's storage).
2. Stages in decreasing rank (a topological order: a producer's rank exceeds its consumers').
3. Each stage goes to the feasible node with the earliest finish, inserting it into the first gap where its inputs
   have arrived and the node's cpu, memory and gpu stay within capacity for its whole duration (ties: node order).
"""
from __future__ import annotations

from typing import Dict, List, Sequence

from raylane.planning.base import PLANNERS, Planner
from raylane.planning.model import Network, Pipeline, Plan, PlanNode, feasible_nodes
from raylane.planning.timeline import list_schedule


def mean_inverse_bandwidth(nodes: Sequence[PlanNode], network: Network) -> float:
    """Mean of 1 / rate over ordered pairs of different nodes: a transfer of g GB takes g times this on average."""
    if len(nodes) < 2:
        return 0.0
    network = network.with_storage(nodes)
    names = [n.name for n in nodes]
    total = sum(1.0 / network.rate(a, b) for a in names for b in names if a != b)
    return total / (len(names) * (len(names) - 1))


def upward_ranks(pipeline: Pipeline, nodes: Sequence[PlanNode], network: Network,
                 feasible: Dict[str, List[PlanNode]]) -> Dict[str, float]:
    succ = pipeline.successors()
    inv_bw = mean_inverse_bandwidth(nodes, network)
    stages = {s.name: s for s in pipeline.stages}
    rank: Dict[str, float] = {}
    for name in reversed(pipeline.topological_order()):
        s = stages[name]
        cands = feasible[name]
        w = sum(s.duration_on(n) for n in cands) / len(cands)
        comm = s.output_gb * inv_bw
        rank[name] = w + max((comm + rank[c] for c in succ[name]), default=0.0)
    return rank


@PLANNERS.register("heft")
class HeftPlanner(Planner):
    name = "heft"

    def plan(self, pipeline: Pipeline, nodes: Sequence[PlanNode], network: Network) -> Plan:
        feasible = feasible_nodes(pipeline, nodes)
        network = network.with_storage(nodes)
        rank = upward_ranks(pipeline, nodes, network, feasible)
        topo = {n: i for i, n in enumerate(pipeline.topological_order())}
        order = sorted(topo, key=lambda n: (-rank[n], topo[n]))
        return list_schedule(pipeline, nodes, network, feasible, order, key=lambda p: p.finish_h, planner=self.name)
