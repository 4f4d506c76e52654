"""The ordering axis: who goes first.

An ordering policy gives two sort keys, smaller first:
- ``queue_key(w, cfg)``: a workload's place inside its team's queue. It must not change while the workload waits
  (drivers keep each team queue sorted by it).
- ``head_key(w, team, cfg)``: how the heads of the team queues compare across teams; the cycle merges the team
  queues by it, re-keying a team after each admission (fair share depends on what the team holds).
``rank(w, attained_gpu_s, cfg)`` compares any two workloads, running or not; the ``ordering`` preemption policy
preempts leases that rank after the waiting workload. Policies are stateless and safe to share between threads.
"""
from __future__ import annotations

from typing import Protocol, Tuple

from raylane.scheduling.registry import Registry
from raylane.scheduling.types import Resources, SchedulerConfig, Team, Workload


class TeamView(Protocol):
    team: Team
    usage: Resources


class OrderingPolicy(Protocol):
    def queue_key(self, w: Workload, cfg: SchedulerConfig) -> Tuple: ...

    def head_key(self, w: Workload, team: TeamView, cfg: SchedulerConfig) -> Tuple: ...

    def rank(self, w: Workload, attained_gpu_s: float, cfg: SchedulerConfig) -> Tuple: ...


ORDERINGS: Registry[OrderingPolicy] = Registry("ordering", default="priority")


class StaticOrdering:
    """Base for orderings where the cross-team key is the queue key (a k-way merge of sorted queues)."""

    def head_key(self, w, team, cfg):
        return self.queue_key(w, cfg)

    def rank(self, w, attained_gpu_s, cfg):
        return self.queue_key(w, cfg)
