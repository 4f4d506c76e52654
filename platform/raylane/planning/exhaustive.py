"""Exhaustive search for tiny pipelines: the proven optimal makespan that tests compare the planners against.

Among the plans of minimal makespan there is an *active* one (no stage can start earlier without delaying
another), and every active plan is what the serial schedule-generation scheme builds from some order of the
stages and some node per stage: take the stages one at a time in a topological order, each at the earliest instant
its inputs have arrived and its node has room for its whole run. The search enumerates every (order, nodes) pair
depth first, cutting a branch once its latest finish reaches the best makespan found. Exact (float hours, no
rounding); exponential, so it refuses more than ``MAX_STAGES`` stages.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence

from raylane.errors import ValidationError
from raylane.planning.model import EPS, Network, Pipeline, Placement, Plan, PlanNode, PlanStatus, feasible_nodes
from raylane.planning.timeline import Timeline, data_ready_h

MAX_STAGES = 7


def exhaustive_plan(pipeline: Pipeline, nodes: Sequence[PlanNode], network: Network) -> Plan:
    if len(pipeline.stages) > MAX_STAGES:
        raise ValidationError("exhaustive search", [
            ("stages", len(pipeline.stages), f"at most {MAX_STAGES} stages (the search is exponential)")])
    feasible = feasible_nodes(pipeline, nodes)
    network = network.with_storage(nodes)
    stages = {s.name: s for s in pipeline.stages}
    succ = pipeline.successors()
    timelines = {n.name: Timeline(n) for n in nodes}
    placed: Dict[str, Placement] = {}
    waiting = {s.name: len(s.needs) for s in pipeline.stages}
    best: List[Optional[object]] = [float("inf"), None]
    seen = set()

    def dfs(current: float) -> None:
        if len(placed) == len(stages):
            if current < best[0] - EPS:
                best[0], best[1] = current, dict(placed)
            return
        # Two orders that reach the same partial plan continue identically.
        key = frozenset((p.stage, p.node, round(p.start_h, 9)) for p in placed.values())
        if key in seen:
            return
        seen.add(key)
        for name in [n for n, w in waiting.items() if w == 0 and n not in placed]:
            s = stages[name]
            for node in feasible[name]:
                dur = s.duration_on(node)
                tl = timelines[node.name]
                start = tl.earliest_start(data_ready_h(s, node.name, placed, stages, network), dur, s.demand)
                finish = start + dur
                if max(current, finish) >= best[0] - EPS:
                    continue
                tl.add(start, finish, s.demand)
                placed[name] = Placement(name, node.name, start, finish)
                for c in succ[name]:
                    waiting[c] -= 1
                dfs(max(current, finish))
                for c in succ[name]:
                    waiting[c] += 1
                del placed[name]
                tl.pop()

    dfs(0.0)
    plan = best[1]
    ordered = tuple(plan[s.name] for s in pipeline.stages)
    return Plan(ordered, best[0], planner="exhaustive", status=PlanStatus.OPTIMAL, bound_h=best[0])
