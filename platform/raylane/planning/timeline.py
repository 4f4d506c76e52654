"""What one node holds over time while a plan is built: the intervals placed on it and their demands.

Owned by the list planners (HEFT, OLB) and the exhaustive search; each builds one ``Timeline`` per node and is the
only writer. ``earliest_start`` answers the insertion question of HEFT: the first instant at or after ``ready_h``
from which a stage fits beside everything already placed on the node for its whole duration (it may go into a gap
before stages placed earlier, so long as capacity holds).
"""
from __future__ import annotations

from typing import Callable, Dict, Iterable, List, Sequence, Tuple

from raylane.planning.model import EPS, Placement, Plan, PlanNode, PlanStatus

Demand = Tuple[float, float, float]


class Timeline:
    __slots__ = ("node", "capacity", "intervals")

    def __init__(self, node: PlanNode):
        self.node = node
        self.capacity: Demand = node.capacity
        self.intervals: List[Tuple[float, float, Demand]] = []  # (start_h, finish_h, demand)

    def add(self, start: float, finish: float, demand: Demand) -> None:
        self.intervals.append((start, finish, demand))

    def pop(self) -> None:
        self.intervals.pop()

    def fits(self, start: float, finish: float, demand: Demand) -> bool:
        overlapping = [iv for iv in self.intervals if iv[0] < finish - EPS and iv[1] > start + EPS]
        if not overlapping:
            return True
        # Usage only rises where an interval starts: check at ``start`` and at every start inside the window.
        points = [start] + [iv[0] for iv in overlapping if iv[0] > start]
        for t in points:
            for r in range(3):
                used = demand[r]
                for s, f, d in overlapping:
                    if s <= t + EPS and f > t + EPS:
                        used += d[r]
                if used > self.capacity[r] + EPS:
                    return False
        return True

    def earliest_start(self, ready_h: float, duration_h: float, demand: Demand) -> float:
        """The first instant >= ``ready_h`` at which ``demand`` fits for ``duration_h`` hours.

        Candidates are ``ready_h`` and the finishes of placed intervals after it: capacity only frees up there.
        The stage must fit the empty node (``feasible_nodes`` checks), so the last finish always works.
        """
        candidates = sorted({ready_h} | {f for _, f, _ in self.intervals if f > ready_h})
        for t in candidates:
            if self.fits(t, t + duration_h, demand):
                return t
        raise ValueError(f"{demand} never fits on {self.node.name}")  # unreachable after feasible_nodes


def data_ready_h(stage, node_name: str, placed: dict, stages: dict, network) -> float:
    """When every input of ``stage`` is on ``node_name``: producers' finish plus their transfer (none if local)."""
    ready = 0.0
    for p in stage.needs:
        pl = placed[p]
        ready = max(ready, pl.finish_h + network.transfer_h(stages[p].output_gb, pl.node, node_name))
    return ready


def list_schedule(pipeline, nodes: Sequence[PlanNode], network, feasible: Dict[str, List[PlanNode]],
                  order: Iterable[str], key: Callable[[Placement], float], planner: str) -> Plan:
    """The list scheduling HEFT and OLB share: stages in ``order`` (a topological one), each on the feasible node
    whose placement has the smallest ``key`` (ties: node order), inserted at the earliest instant its inputs have
    arrived and the node has room for its whole run."""
    stages = {s.name: s for s in pipeline.stages}
    timelines = {n.name: Timeline(n) for n in nodes}
    placed: Dict[str, Placement] = {}
    for name in order:
        s = stages[name]
        best = None
        for node in feasible[name]:
            dur = s.duration_on(node)
            start = timelines[node.name].earliest_start(
                data_ready_h(s, node.name, placed, stages, network), dur, s.demand)
            cand = Placement(name, node.name, start, start + dur)
            if best is None or key(cand) < key(best) - 1e-12:
                best = cand
        timelines[best.node].add(best.start_h, best.finish_h, s.demand)
        placed[name] = best
    ordered = tuple(placed[s.name] for s in pipeline.stages)
    return Plan(ordered, max(p.finish_h for p in ordered), planner=planner, status=PlanStatus.HEURISTIC)
