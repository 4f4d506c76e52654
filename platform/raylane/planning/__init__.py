"""Raylane's pure pipeline planner: places a DAG of stages on heterogeneous nodes, and checks any plan.

No Ray import, no clock, no randomness. Planners are looked up by name in ``PLANNERS`` (best, the default: HEFT and
OLB, then CP-SAT to improve or prove their plan; heft, olb, cpsat);
``verify`` checks a plan from anywhere and measures its gap; ``exhaustive_plan`` proves optima of tiny pipelines;
``explain`` says why each stage is where it is and gives the critical path; ``write_gantt`` charts a plan (and a run).
See docs/pipelines.md.
"""
from raylane.planning import _best, _cpsat, _heft, _olb  # noqa: F401  (registration)
from raylane.planning._best import BestPlanner
from raylane.planning._cpsat import CpSatPlanner
from raylane.planning._heft import HeftPlanner, upward_ranks
from raylane.planning._olb import OlbPlanner
from raylane.planning.base import PLANNERS, Planner
from raylane.planning.exhaustive import exhaustive_plan
from raylane.planning.explain import Explanation, critical_path, explain
from raylane.planning.gantt import write_gantt
from raylane.planning.model import (
    Network, Pipeline, Placement, Plan, PlanNode, PlanStatus, Stage, feasible_nodes,
)
from raylane.planning.verify import Report, Violation, ViolationKind, verify

__all__ = [
    "PLANNERS", "Planner", "BestPlanner", "HeftPlanner", "OlbPlanner", "CpSatPlanner", "upward_ranks",
    "exhaustive_plan", "Network", "Pipeline", "Placement", "Plan", "PlanNode", "PlanStatus", "Stage",
    "feasible_nodes", "Report", "Violation", "ViolationKind", "verify", "Explanation", "critical_path", "explain",
    "write_gantt",
]
