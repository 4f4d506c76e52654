"""The control plane's gauges, brought up to date on each full tick (a role of
``raylane.control.state.ControlState``; the metrics themselves are ``raylane.metrics``'s).

Queue lengths and leases per team and class, each node's service state, stranded GPUs per node type, each cohort's
GPUs, each team's GPUs held against its quota. The queue lengths are the scheduler's counts, kept as workloads come
and go; the leases and the workloads held for their inputs are counted (not every record the journal ever held): a
tick's work grows with what runs and what changed, not with the length of the queue.

``GaugeKeys`` is the rule every exporter here follows (this role, the ETAs', the costs'): a label set seen before and
not counted now reads 0 (or what the exporter says), rather than its last value.
"""
from __future__ import annotations

from typing import Any, Callable, Dict

from raylane import metrics
from raylane.control.nodes import NodeState
from raylane.control.records import State
from raylane.scheduling.cohorts import cohort_usage
from raylane.scheduling.fragmentation import stranded_gpus
from raylane.scheduling.types import Resources


class GaugeKeys:
    """The label sets each gauge was set for, so that one no longer counted reads 0 rather than stale."""

    def __init__(self):
        self._seen: Dict[str, set] = {}

    def __call__(self, now_counts: Dict[tuple, Any], gauge: str) -> Dict[tuple, Any]:
        """Current counts of ``gauge``, plus zeros for the label sets seen before."""
        out = {k: 0 for k in self._seen.get(gauge, set())}
        out.update(now_counts)
        self._seen[gauge] = set(out)
        return out


class Gauges:
    """Owns the last tick's stranded GPUs (``info`` shows them) and its memo. Handed the records, the
    ``ClusterState`` (getter: a policy reload replaces it), the node book and the checkpoint pins (the workloads
    held for their inputs count as waiting)."""

    def __init__(self, *, records, state: Callable[[], Any], nodes, pins):
        self.records, self._state, self.nodes, self.pins = records, state, nodes, pins
        self.stranded = None  # the last tick's stranded GPUs (raylane.scheduling.fragmentation)
        self._stranded_memo: Dict = {}
        self._keys = GaugeKeys()

    @property
    def state(self):
        return self._state()

    def export(self) -> None:
        waiting: Dict[tuple, int] = self.state.pending_counts()
        held: Dict[tuple, int] = {}
        for wid in self.pins.held:
            rec = self.records[wid]
            if rec.state is State.PENDING and not self.state.is_pending(wid):
                waiting[(rec.team, rec.cls)] = waiting.get((rec.team, rec.cls), 0) + 1
        for lease in self.state.leases.values():
            key = (lease.workload.team, lease.workload.cls.name)
            held[key] = held.get(key, 0) + 1
        for (team, cls), n in self._keys(waiting, "waiting").items():
            metrics.QUEUE_LENGTH.set(n, team=team, workload_class=cls)
        for (team, cls), n in self._keys(held, "held").items():
            metrics.LEASES_RUNNING.set(n, team=team, workload_class=cls)
        states = {(st.id, st.node_type or "-", s.value): float(st.state is s)
                  for st in self.nodes.nodes.values() if st.state is not NodeState.LOST for s in NodeState
                  if s is not NodeState.LOST}
        for (nid, ntype, sv), v in self._keys(states, "node_states").items():
            metrics.NODE_STATE.set(v, node=nid, node_type=ntype, state=sv)
        self.stranded = stranded_gpus(self.state.snapshot(), self._stranded_memo)
        for ntype, v in self._keys(dict(self.stranded.stranded), "stranded").items():
            metrics.STRANDED_GPUS.set(v, node_type=ntype)
        cohorts = {(c.name, what): getattr(c, what).gpu
                   for c in cohort_usage(self.state.teams, self.state.usage).values()
                   for what in ("nominal", "used", "borrowed", "lendable")}
        for (name, what), v in self._keys(cohorts, "cohorts").items():
            metrics.COHORT_GPUS.set(v, cohort=name, what=what)
        for name, team in self.state.teams.items():
            q = team.quotas.get("gpu")
            metrics.GPUS_HELD.set(self.state.usage.get(name, Resources()).gpu, team=name, what="held")
            if q is not None:
                metrics.GPUS_HELD.set(q.nominal, team=name, what="nominal")
                metrics.GPUS_HELD.set(q.ceiling if q.ceiling != float("inf") else -1, team=name, what="ceiling")
