"""The planner axis: one small base class and the registry ``PLANNERS`` (best, the default; heft, olb, cpsat).

A planner is a pure function of (pipeline, nodes, network) to a ``Plan``: no Ray, no clock, no randomness of its
own; the same input gives the same plan. Planners are stateless after construction and safe to share between
threads. Options (a time limit, worker count) are constructor arguments, so every planner has one signature;
``PLANNERS.get(name)`` gives the default configuration.
"""
from __future__ import annotations

from typing import Sequence

from raylane.planning.model import Network, Pipeline, Plan, PlanNode
from raylane.scheduling.registry import Registry


class Planner:
    """Contract: ``plan`` validates the pipeline against the nodes (``feasible_nodes``), then returns a plan that
    ``verify`` accepts, with its makespan claimed exactly, or raises ``raylane.errors.ValidationError``."""

    name: str = ""

    def plan(self, pipeline: Pipeline, nodes: Sequence[PlanNode], network: Network) -> Plan:
        raise NotImplementedError


#: ``best`` (``_best``): HEFT and OLB, then CP-SAT within a time limit; the optimum wherever CP-SAT proves one.
PLANNERS: Registry[Planner] = Registry("planner", default="best")
