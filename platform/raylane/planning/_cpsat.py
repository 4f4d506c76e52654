"""An exact planner: a CP-SAT model (Google OR-Tools) of the whole pipeline, minimising the makespan.

Time is integer, in ticks of ``resolution_min`` minutes (default 1): each duration and transfer is rounded up to
whole ticks, so every plan of the model is feasible for the true durations. Resources are integers in thousandths
(demands rounded up, capacities down). When nothing was rounded the model is the problem itself and OPTIMAL is a
proof; otherwise the plan is reported as FEASIBLE without a bound (the proof holds for the rounded problem only).

The model
- per stage ``i``: ``start_i``, ``end_i``; per node ``k`` that can hold it, a Boolean ``x_ik`` and an optional
  interval ``[start_i, start_i + d_ik)`` present iff ``x_ik``; exactly one ``x_ik`` per stage.
- per node and resource (cpu, memory, gpu): a cumulative over the optional intervals that could land there, with
  the node's capacity (skipped where even all of them together fit).
- per dependency ``p -> c``: ``start_c >= end_p``, and for each pair of different nodes ``k, l``:
  ``start_c >= end_p + transfer_kl`` enforced if ``x_pk and x_cl``: the delay depends on the assignment
  (``Network.rate``: the link or a slower node's storage).
- ``makespan >= end_i``; minimise ``makespan``.

HEFT's plan is the solver's hint (a first solution at once); ``solve`` takes any other valid plan as the hint (the
``best`` planner hands it the better of HEFT's and OLB's). When CP-SAT finds no plan within the time limit, or only
one that rounding to ticks makes longer than the hint, the hint is returned as FEASIBLE with the solver's bound and a
``note`` saying so: the planner always returns a plan.
"""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Dict, Sequence

from raylane.errors import ValidationError
from raylane.planning._heft import HeftPlanner
from raylane.planning.base import PLANNERS, Planner
from raylane.planning.model import (
    EPS, Network, Pipeline, Placement, Plan, PlanNode, PlanStatus, feasible_nodes,
)

RESOURCE_SCALE = 1000


@PLANNERS.register("cpsat")
class CpSatPlanner(Planner):
    name = "cpsat"

    def __init__(self, *, time_limit_s: float = 10.0, workers: int = 2, resolution_min: int = 1, seed: int = 0):
        errors = []
        if not (isinstance(time_limit_s, (int, float)) and time_limit_s > 0):
            errors.append(("time_limit_s", time_limit_s, "a number of seconds > 0"))
        for key, v in (("workers", workers), ("resolution_min", resolution_min)):
            if not (isinstance(v, int) and not isinstance(v, bool) and v >= 1):
                errors.append((key, v, "an integer >= 1"))
        if errors:
            raise ValidationError("cpsat planner", errors)
        self.time_limit_s = time_limit_s
        self.workers = workers
        self.resolution_min = resolution_min
        self.seed = seed

    def _ticks(self, hours: float) -> int:
        return int(math.ceil(hours * 60.0 / self.resolution_min - 1e-6))

    def _exact(self, hours: float) -> bool:
        return abs(self._ticks(hours) * self.resolution_min / 60.0 - hours) <= 1e-6

    def plan(self, pipeline: Pipeline, nodes: Sequence[PlanNode], network: Network) -> Plan:
        return self.solve(pipeline, nodes, network, hint=HeftPlanner().plan(pipeline, nodes, network))

    def solve(self, pipeline: Pipeline, nodes: Sequence[PlanNode], network: Network, *, hint: Plan) -> Plan:
        """``plan`` with ``hint`` (a valid plan of this problem) as the first solution and the fallback."""
        from ortools.sat.python import cp_model  # a heavy import, needed by this planner only

        feasible = feasible_nodes(pipeline, nodes)
        network = network.with_storage(nodes)
        stages = {s.name: s for s in pipeline.stages}
        edges = pipeline.edges()
        exact = True

        dur: Dict[tuple, int] = {}
        for s in pipeline.stages:
            for n in feasible[s.name]:
                h = s.duration_on(n)
                exact &= self._exact(h)
                dur[s.name, n.name] = self._ticks(h)
        xfer: Dict[tuple, int] = {}
        for p, c in edges:
            for k in feasible[p]:
                for l in feasible[c]:
                    if k.name != l.name:
                        h = network.transfer_h(stages[p].output_gb, k.name, l.name)
                        exact &= self._exact(h)
                        xfer[p, c, k.name, l.name] = self._ticks(h)
        horizon = sum(max(dur[s.name, n.name] for n in feasible[s.name]) for s in pipeline.stages)
        horizon += sum(max((xfer[p, c, k.name, l.name] for k in feasible[p] for l in feasible[c]
                            if k.name != l.name), default=0) for p, c in edges)

        m = cp_model.CpModel()
        start = {s: m.new_int_var(0, horizon, f"start_{s}") for s in stages}
        end = {s: m.new_int_var(0, horizon, f"end_{s}") for s in stages}
        x: Dict[tuple, object] = {}
        per_node: Dict[str, list] = {n.name: [] for n in nodes}
        for s in pipeline.stages:
            for n in feasible[s.name]:
                b = x[s.name, n.name] = m.new_bool_var(f"x_{s.name}_{n.name}")
                iv = m.new_optional_interval_var(start[s.name], dur[s.name, n.name], end[s.name], b,
                                                 f"iv_{s.name}_{n.name}")
                per_node[n.name].append((iv, s))
            m.add_exactly_one(x[s.name, n.name] for n in feasible[s.name])
        for n in nodes:
            for r, cap in enumerate(n.capacity):
                items = per_node[n.name]
                demands = [int(math.ceil(s.demand[r] * RESOURCE_SCALE - 1e-6)) for _, s in items]
                capacity = int(math.floor(cap * RESOURCE_SCALE + 1e-6))
                exact &= all(abs(d - s.demand[r] * RESOURCE_SCALE) <= 1e-6 for d, (_, s) in zip(demands, items))
                exact &= abs(capacity - cap * RESOURCE_SCALE) <= 1e-6
                if sum(demands) > capacity:
                    m.add_cumulative([iv for iv, _ in items], demands, capacity)
        for p, c in edges:
            m.add(start[c] >= end[p])
            for k in feasible[p]:
                for l in feasible[c]:
                    t = xfer.get((p, c, k.name, l.name), 0)
                    if t > 0:
                        m.add(start[c] >= end[p] + t).only_enforce_if([x[p, k.name], x[c, l.name]])
        makespan = m.new_int_var(0, horizon, "makespan")
        m.add_max_equality(makespan, list(end.values()))
        m.minimize(makespan)

        # The hint: a first solution at once on pipelines too large to solve from scratch in time.
        for pl in hint.placements:
            for n in feasible[pl.stage]:
                m.add_hint(x[pl.stage, n.name], n.name == pl.node)
            node = next(n for n in feasible[pl.stage] if n.name == pl.node)
            m.add_hint(start[pl.stage], self._ticks(pl.start_h))
            m.add_hint(end[pl.stage], self._ticks(pl.start_h) + dur[pl.stage, node.name])
        m.add_hint(makespan, max(self._ticks(pl.start_h) + dur[pl.stage, pl.node] for pl in hint.placements))

        solver = cp_model.CpSolver()
        solver.parameters.max_time_in_seconds = self.time_limit_s
        solver.parameters.num_workers = self.workers
        solver.parameters.random_seed = self.seed
        status = solver.solve(m)
        # A lower bound on the true makespan only when the model is exact (no rounding up).
        bound = solver.best_objective_bound * self.resolution_min / 60.0 + 0.0 if exact else None
        if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            return replace(hint, planner=self.name, status=PlanStatus.FEASIBLE, bound_h=bound,
                           note=f"CP-SAT found no plan within {self.time_limit_s:g} s "
                                f"({solver.status_name(status)}); this is its hint ({hint.planner}'s plan)")

        tick_h = self.resolution_min / 60.0
        by_name = {n.name: n for n in nodes}
        placements = []
        for s in pipeline.stages:
            node = next(n.name for n in feasible[s.name] if solver.boolean_value(x[s.name, n.name]))
            st = solver.value(start[s.name]) * tick_h
            placements.append(Placement(s.name, node, st, st + s.duration_on(by_name[node])))
        makespan_h = max(p.finish_h for p in placements)
        if hint.makespan_h < makespan_h - EPS:  # only when rounding to ticks cost more than the hint's lead
            return replace(hint, planner=self.name, status=PlanStatus.FEASIBLE, bound_h=bound,
                           note=f"CP-SAT's best plan, in whole ticks, was longer than its hint; this is the hint "
                                f"({hint.planner}'s plan)")
        proven = status == cp_model.OPTIMAL and exact
        return Plan(tuple(placements), makespan_h, planner=self.name,
                    status=PlanStatus.OPTIMAL if proven else PlanStatus.FEASIBLE, bound_h=bound)
