"""What the control plane knows about each node's health and service state, rebuilt from the journal (Ray-free).

``NodeBook`` owns one ``NodeStatus`` per node the control plane has seen: its service state, why and since when, the
last probe, and the gang failures attributed to it. It changes by applying journal entries of kind ``node``
(workload id ``@nodes``), so the live actor and a restart replaying the journal build the same book; the one
exception is a passing probe that ends no run of failures, which is not journaled (a probe every 30 s per node would
fill the journal) and only updates the last probe shown (``note_probe``). Its decisions
(``on_probe``, ``on_gang_failure``, ``on_ray_draining``) are pure: they return the events to journal; the actor
journals them, applies them, and acts (placement stops, running gangs are preempted). A compaction snapshots the
book (``snapshot``; ``raylane.control.archive``) and moves its entries to the node archive: a restart loads the
snapshot (``load``) and applies the entries since.

States (Kubernetes' words, as operators know them):
- ``ready``: schedulable.
- ``cordoned``: an operator said so; what runs there keeps running, nothing new is placed there.
- ``draining``: cordoned, and every lease there is preempted gracefully (checkpoint, requeue, resume elsewhere);
  set by ``raylane node drain`` or by Ray's own drain notice (a spot reclaim, the autoscaler).
- ``drained``: a drain is complete, the node holds no lease; stays unschedulable until uncordoned.
- ``quarantined``: taken out of service automatically (its probe failed ``probe_failures`` times in a row, or gangs
  of ``gang_failures`` different workloads failed on it within ``gang_failure_window``); drained like ``draining``.
- ``lost``: Ray reports the node dead; its leases went back to the queue. Ray node ids are never reused, so this
  is final.
Only ``ready`` is schedulable; ``uncordon`` returns any state but ``lost`` to ``ready``.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Optional

from raylane.control.journal import Entry

NODES_ID = "@nodes"


class NodeState(str, enum.Enum):
    READY = "ready"
    CORDONED = "cordoned"
    DRAINING = "draining"
    DRAINED = "drained"
    QUARANTINED = "quarantined"
    LOST = "lost"

    @property
    def schedulable(self) -> bool:
        return self is NodeState.READY

    @property
    def evicts(self) -> bool:
        """Whether the leases there are to be preempted."""
        return self in (NodeState.DRAINING, NodeState.QUARANTINED)


# event -> the state it puts the node in (None: the state does not change)
EVENT_STATE: Dict[str, Optional[NodeState]] = {
    "joined": NodeState.READY,
    "lost": NodeState.LOST,
    "cordoned": NodeState.CORDONED,
    "uncordoned": NodeState.READY,
    "draining": NodeState.DRAINING,
    "ray_draining": NodeState.DRAINING,
    "drained": NodeState.DRAINED,
    "quarantined": NodeState.QUARANTINED,
    "probe_failed": None,
    "probe_ok": None,
    "gang_failed": None,
}


@dataclass
class NodeStatus:
    id: str
    node_type: str = ""
    gpus: float = 0.0
    address: str = ""
    state: NodeState = NodeState.READY
    reason: str = ""
    since: float = 0.0
    by: str = ""
    probe_ok: Optional[bool] = None
    probe_at: Optional[float] = None
    probe_message: str = ""
    probe_fails: int = 0  # consecutive
    # (time, workload id) of gang failures attributed to this node since it was last made ready
    failures: List[tuple] = field(default_factory=list)
    # what its last ``joined`` entry said of it besides the above (cpus, memory_gib, features, spot, ...)
    joined: Dict[str, Any] = field(default_factory=dict)

    def public(self) -> Dict[str, Any]:
        return {"id": self.id, "node_type": self.node_type, "gpus_total": self.gpus, "address": self.address,
                "state": self.state.value, "reason": self.reason, "since": self.since, "by": self.by,
                "alive": self.state is not NodeState.LOST,
                "probe": {"ok": self.probe_ok, "at": self.probe_at, "message": self.probe_message,
                          "consecutive_failures": self.probe_fails}}


@dataclass(frozen=True)
class HealthRules:
    """The thresholds of ``raylane.config.models.HealthSpec`` the book decides with."""

    probe_failures: int = 2
    gang_failures: int = 3
    gang_failure_window_s: float = 3600.0


def _restored(d: Dict[str, Any]) -> NodeStatus:
    return NodeStatus(d["id"], node_type=d.get("node_type", ""), gpus=float(d.get("gpus") or 0.0),
                      address=d.get("address", ""), state=NodeState(d["state"]), reason=d.get("reason", ""),
                      since=float(d.get("since") or 0.0), by=d.get("by", ""), probe_ok=d.get("probe_ok"),
                      probe_at=d.get("probe_at"), probe_message=d.get("probe_message", ""),
                      probe_fails=int(d.get("probe_fails") or 0), failures=[tuple(f) for f in d.get("failures", [])],
                      joined=dict(d.get("joined") or {}))


class NodeBook:
    def __init__(self, rules: HealthRules = HealthRules()):
        self.rules = rules
        self.nodes: Dict[str, NodeStatus] = {}

    # ------------------------------------------------------------------------------------------- applying
    def apply(self, e: Entry) -> None:
        d = e.data
        nid, event = d["node"], d["event"]
        st = self.nodes.get(nid)
        if st is None:
            st = self.nodes[nid] = NodeStatus(nid, since=e.ts)
        for k in ("node_type", "address"):
            if d.get(k):
                setattr(st, k, d[k])
        if d.get("gpus") is not None:
            st.gpus = float(d["gpus"])
        if event == "joined":
            st.joined = {k: v for k, v in d.items() if k not in ("node", "event", "node_type", "address", "gpus")}
        if event in ("probe_failed", "probe_ok"):
            st.probe_ok, st.probe_at, st.probe_message = event == "probe_ok", e.ts, d.get("reason", "")
            st.probe_fails = 0 if event == "probe_ok" else st.probe_fails + 1
        elif event == "gang_failed":
            st.failures.append((e.ts, d.get("workload", "")))
        new = EVENT_STATE.get(event)
        if new is None or st.state is NodeState.LOST:
            return
        if event == "joined" and st.state is not NodeState.READY:
            return  # a restart seeing the node again keeps its cordon
        st.state, st.since, st.by = new, e.ts, d.get("by", "")
        st.reason = d.get("reason", "")
        if new is NodeState.READY:
            st.failures, st.probe_fails = [], 0

    # ------------------------------------------------------------------------------------------ snapshots
    def snapshot(self, now: float, forget_lost_before: float) -> List[Dict[str, Any]]:
        """The book as data (``load`` takes it back): every node but those lost before ``forget_lost_before``
        (lost is final: nothing is decided about them again), their gang failures cut to the window."""
        out = []
        for st in self.nodes.values():
            if st.state is NodeState.LOST and st.since < forget_lost_before:
                continue
            failures = [list(f) for f in st.failures if now - f[0] <= self.rules.gang_failure_window_s]
            out.append({"id": st.id, "node_type": st.node_type, "gpus": st.gpus, "address": st.address,
                        "state": st.state.value, "reason": st.reason, "since": st.since, "by": st.by,
                        "probe_ok": st.probe_ok, "probe_at": st.probe_at, "probe_message": st.probe_message,
                        "probe_fails": st.probe_fails, "failures": failures, "joined": dict(st.joined)})
        return out

    def load(self, data: Iterable[Dict[str, Any]]) -> None:
        """Start from a snapshot (``snapshot``) instead of the entries it was taken from."""
        self.nodes = {d["id"]: _restored(d) for d in data}

    def note_probe(self, node_id: str, ok: bool, message: str, at: float) -> None:
        """The last probe's result, as shown by ``node list`` (its journaled events were applied already)."""
        st = self.nodes.get(node_id)
        if st is not None:
            st.probe_ok, st.probe_at, st.probe_message = ok, at, message

    # ------------------------------------------------------------------------------------------- queries
    def get(self, node_id: str) -> Optional[NodeStatus]:
        return self.nodes.get(node_id)

    def schedulable(self, node_id: str) -> bool:
        st = self.nodes.get(node_id)
        return st is None or st.state.schedulable

    def evicting(self) -> List[NodeStatus]:
        return [st for st in self.nodes.values() if st.state.evicts]

    def resolve(self, ref: str, include_lost: bool = False) -> List[str]:
        """Node ids matching a full id or a prefix of one."""
        return [nid for nid, st in self.nodes.items()
                if nid.startswith(ref) and (include_lost or st.state is not NodeState.LOST)]

    # ------------------------------------------------------------------------------------------ decisions
    def on_probe(self, node_id: str, ok: bool, message: str) -> List[Dict[str, Any]]:
        """Events for one probe result: a failure is journaled every time (it counts), a success only when it
        ends a run of failures; the ``probe_failures``-th failure in a row quarantines a node in service."""
        st = self.nodes.get(node_id)
        if st is None or st.state is NodeState.LOST:
            return []
        if ok:
            return [{"node": node_id, "event": "probe_ok", "reason": message}] if st.probe_fails else []
        out = [{"node": node_id, "event": "probe_failed", "reason": message}]
        n = self.rules.probe_failures
        if n and st.probe_fails + 1 >= n and st.state is not NodeState.QUARANTINED:
            out.append({"node": node_id, "event": "quarantined", "by": "health",
                        "reason": f"probe failed {st.probe_fails + 1} times in a row: {message}"})
        return out

    def on_gang_failure(self, node_ids: Iterable[str], workload_id: str, now: float) -> List[Dict[str, Any]]:
        """Events for a gang that failed on ``node_ids`` (one attribution per node). A node is quarantined when
        gangs of ``gang_failures`` different workloads failed on it within the window: one workload crashing
        again and again is its own bug, several workloads failing on the same node point at the node."""
        out = []
        for nid in dict.fromkeys(node_ids):
            st = self.nodes.get(nid)
            if st is None or st.state is NodeState.LOST:
                continue
            out.append({"node": nid, "event": "gang_failed", "workload": workload_id,
                        "reason": f"a gang of {workload_id} failed with a worker here"})
            n = self.rules.gang_failures
            if not n or st.state is NodeState.QUARANTINED:
                continue
            recent = {w for t, w in st.failures if now - t <= self.rules.gang_failure_window_s} | {workload_id}
            if len(recent) >= n:
                out.append({"node": nid, "event": "quarantined", "by": "health",
                            "reason": f"gangs of {len(recent)} workloads failed here within "
                                      f"{self.rules.gang_failure_window_s:g}s: {', '.join(sorted(recent))}"})
        return out

    def on_ray_draining(self, draining: Dict[str, int]) -> List[Dict[str, Any]]:
        """Events for Ray's drain notices (``{node id: deadline in ms}``) on nodes still taking or holding work."""
        out = []
        for nid, deadline_ms in draining.items():
            st = self.nodes.get(nid)
            if st is None or st.state in (NodeState.DRAINING, NodeState.DRAINED, NodeState.QUARANTINED,
                                          NodeState.LOST):
                continue
            when = f" by deadline {deadline_ms / 1000:.0f} (unix s)" if deadline_ms else ""
            out.append({"node": nid, "event": "ray_draining", "by": "ray",
                        "reason": f"Ray is draining the node{when}"})
        return out
