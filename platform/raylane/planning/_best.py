"""The default planner, ``best``: the list heuristics for an upper bound at once, then CP-SAT to improve or prove it.

1. HEFT and OLB (milliseconds); the shorter of their plans is the incumbent (ties: HEFT).
2. When OR-Tools is installed and the model is small enough to build quickly (``max_model_terms``: one per stage
   and feasible node, one per dependency and pair of feasible nodes), CP-SAT within ``time_limit_s``, hinted with
   the incumbent (``CpSatPlanner.solve``).
3. Each candidate is checked by ``verify``; the shortest valid one is returned (ties: the earlier, so a CP-SAT plan
   only replaces a heuristic's when it is strictly shorter), with ``planner="best"``, the status CP-SAT proved
   (``OPTIMAL`` when it proved the optimum, else ``FEASIBLE`` with its bound, or ``HEURISTIC`` when CP-SAT did not
   run), and a ``note`` naming which planner's plan it is and why.

Why not HEFT alone: on small pipelines whose outputs are large beside their links (locality-heavy), HEFT's greedy
earliest finish moves outputs it should have waited for; ``tests/bench/bench_planner.py`` measures both against the
proven optimum. Where CP-SAT proves an optimum within the limit, this planner returns it; elsewhere it is never worse
than HEFT or OLB.

Words: *incumbent*, the best valid plan so far; *proven*, CP-SAT's status OPTIMAL on an exact model
(``_cpsat``: every duration and transfer a whole number of ticks).
"""
from __future__ import annotations

from dataclasses import replace
from typing import List, Sequence

from raylane.errors import ValidationError
from raylane.planning._cpsat import CpSatPlanner
from raylane.planning._heft import HeftPlanner
from raylane.planning._olb import OlbPlanner
from raylane.planning.base import PLANNERS, Planner
from raylane.planning.model import EPS, Network, Pipeline, Plan, PlanNode, PlanStatus, feasible_nodes
from raylane.planning.verify import verify

#: Above this many model terms, CP-SAT's model takes longer to build than it can gain in the time limit.
MAX_MODEL_TERMS = 50_000


def ortools_available() -> bool:
    try:
        import ortools.sat.python.cp_model  # noqa: F401
    except ImportError:
        return False
    return True


def model_terms(pipeline: Pipeline, feasible) -> int:
    """The size of CP-SAT's model: a Boolean per (stage, feasible node), an implication per (edge, node pair)."""
    return (sum(len(v) for v in feasible.values())
            + sum(len(feasible[p]) * len(feasible[c]) for p, c in pipeline.edges()))


@PLANNERS.register("best")
class BestPlanner(Planner):
    name = "best"

    def __init__(self, *, time_limit_s: float = 2.0, workers: int = 2, seed: int = 0,
                 max_model_terms: int = MAX_MODEL_TERMS):
        if not (isinstance(max_model_terms, int) and not isinstance(max_model_terms, bool) and max_model_terms >= 0):
            raise ValidationError("best planner", [("max_model_terms", max_model_terms, "an integer >= 0")])
        self.cpsat = CpSatPlanner(time_limit_s=time_limit_s, workers=workers, seed=seed)  # checks the others
        self.max_model_terms = max_model_terms

    def plan(self, pipeline: Pipeline, nodes: Sequence[PlanNode], network: Network) -> Plan:
        feasible = feasible_nodes(pipeline, nodes)  # refuses an impossible stage before anything runs

        # 1. The heuristics: an upper bound in milliseconds.
        candidates: List[Plan] = [HeftPlanner().plan(pipeline, nodes, network),
                                  OlbPlanner().plan(pipeline, nodes, network)]
        incumbent = min(candidates, key=lambda p: p.makespan_h)  # min keeps the first of equals: HEFT

        # 2. CP-SAT, when it can run and its model is small enough to pay.
        terms = model_terms(pipeline, feasible)
        why_not = ("OR-Tools is not installed" if not ortools_available() else
                   f"the CP-SAT model would have {terms:,} terms (limit {self.max_model_terms:,})"
                   if terms > self.max_model_terms else "")
        exact = None
        if not why_not:
            exact = self.cpsat.solve(pipeline, nodes, network, hint=incumbent)
            candidates.append(exact)

        # 3. The shortest plan the verifier accepts.
        valid = [p for p in candidates if verify(pipeline, nodes, network, p).ok]
        if not valid:  # a bug in every planner at once: say so rather than return an invalid plan
            report = verify(pipeline, nodes, network, candidates[0]).render()
            raise RuntimeError(f"no planner's plan passed the verifier; HEFT's: {report}")
        chosen = min(valid, key=lambda p: p.makespan_h)
        return replace(chosen, planner=self.name, **self._verdict(chosen, exact, incumbent, why_not))

    def _verdict(self, chosen: Plan, exact, incumbent: Plan, why_not: str) -> dict:
        """Status, bound and note of the returned plan: which planner's it is and what CP-SAT proved. ``chosen`` is
        ``exact`` only when CP-SAT's plan is strictly shorter than the incumbent (ties keep the incumbent)."""
        if exact is None:
            return {"status": PlanStatus.HEURISTIC, "bound_h": None,
                    "note": f"{incumbent.planner}'s plan; CP-SAT not run: {why_not}"}
        source = (f"CP-SAT's plan ({incumbent.planner}'s was {_gap(incumbent.makespan_h, chosen.makespan_h)} longer)"
                  if chosen is exact else f"{chosen.planner}'s plan (CP-SAT found none shorter)")
        bound = exact.bound_h
        if exact.status is PlanStatus.OPTIMAL or (bound is not None and bound >= chosen.makespan_h - EPS):
            return {"status": PlanStatus.OPTIMAL, "bound_h": bound, "note": f"{source}, proven optimal by CP-SAT"}
        if bound is None:
            proof = "no proven bound (a duration or transfer is not a whole minute)"
        elif bound > 0:
            proof = f"at most {_gap(chosen.makespan_h, bound)} above the optimum (CP-SAT's bound {bound:g} h)"
        else:
            proof = "CP-SAT proved no bound above 0 h"
        return {"status": PlanStatus.FEASIBLE, "bound_h": bound,
                "note": f"{source}, not proven optimal within {self.cpsat.time_limit_s:g} s: {proof}"}


def _gap(h: float, best_h: float) -> str:
    return f"{(h - best_h) / best_h:.1%}" if best_h > 0 else "0.0%"
