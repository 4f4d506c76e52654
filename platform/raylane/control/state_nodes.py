"""The control plane's node service as Ray's node table feeds it (a role of ``raylane.control.state.ControlState``;
see docs/operations.md).

Ray's node table (``Host.nodes``) is read into the scheduler's nodes (``nodes_from_ray``: capacity, devices, feature
tags, node type and datasets from the node's labels); a node that joins is journaled, one Ray no longer lists alive
is lost with every lease on it (requeued at its submit time, to resume from its last checkpoint). Each full tick
``service`` turns Ray's drain notices into drains, preempts gracefully what runs on draining and quarantined nodes,
and runs the health probes (``probed`` takes their verdicts). The calls ``node list``, ``cordon``, ``uncordon`` and
``drain`` are here too. The service state of each node is the ``NodeBook``'s (``raylane.control.nodes``): this role
journals its events and carries out what its decisions mean for the leases.
"""
from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any, Callable, Dict, List

from raylane import metrics
from raylane.auth import Principal
from raylane.control import api
from raylane.control import effects as fx
from raylane.control.journal import Kind
from raylane.control.nodes import NODES_ID, NodeState
from raylane.control.records import State
from raylane.errors import ValidationError
from raylane.scheduling import lifecycle
from raylane.scheduling.types import SPOT_LABEL, Resources

log = logging.getLogger("raylane.control")

GiB = 1024 ** 3
FEATURE_LABEL_PREFIX = "feature.raylane.io/"
NODE_TYPE_LABEL = "raylane.io/node-type"
DATASETS_LABEL = "raylane.io/datasets"


def nodes_from_ray(ray_nodes: List[Dict[str, Any]]):
    """Core ``Node``s (capacity only) from ``ray.nodes()``; feature tags come from ``feature.raylane.io/<tag>``. Each
    GPU Ray counts on a node is one device (a fractional request takes a share of one, as in Ray)."""
    from raylane.scheduling.types import Node, device_count

    out = []
    for n in ray_nodes:
        if not n.get("Alive"):
            continue
        res = n.get("Resources", {})
        labels = dict(n.get("Labels") or {})
        cap = Resources(res.get("GPU", 0.0), res.get("CPU", 0.0), res.get("memory", 0.0) / GiB)
        feats = frozenset(k[len(FEATURE_LABEL_PREFIX):] for k, v in labels.items()
                          if k.startswith(FEATURE_LABEL_PREFIX) and v in ("true", "1", "yes"))
        datasets = frozenset(filter(None, labels.get(DATASETS_LABEL, "").split(".")))
        out.append(Node(n["NodeID"], cap, cap, feats, labels, labels.get(NODE_TYPE_LABEL, ""), datasets,
                        devices=(1.0,) * device_count(cap.gpu)))
    return out


class NodeService:
    """Ray's node table in the scheduler's books, node events journaled, node service and probes, the node calls.

    Owns the nodes Ray lists alive as the scheduler has them (``ids``), their addresses, and when the probes last ran.
    Handed the host, the clock, the journal, the records, the ``ClusterState`` and the policy (getters: a policy
    reload replaces both), the ``NodeBook`` (``nodes``), ``append``, ``emit``, ``poke``, the leases (a lost node's
    leases are requeued and their gangs killed; a draining node's are preempted), the pending reasons (a workload
    requeued off a lost node says its capacity is gone) and ``replan_for_node`` (a lost node re-plans the pipelines
    that counted on it)."""

    def __init__(self, *, host, clock: Callable[[], float], journal, records, state: Callable[[], Any],
                 policy: Callable[[], Any], nodes, append: Callable[..., Any], emit: Callable[[fx.Effect], None],
                 poke: Callable[[], None], leases, reasons, replan_for_node: Callable[[str, float], None]):
        self.host, self.clock, self.journal, self.records, self.nodes = host, clock, journal, records, nodes
        self._state, self._policy = state, policy
        self._append, self._emit, self._poke = append, emit, poke
        self.leases, self.reasons, self._replan_for_node = leases, reasons, replan_for_node
        self._addresses: Dict[str, str] = {}
        self._node_ids: set = set()
        self._probing = False  # a RunProbes effect is out and its verdicts are not back (``probed``)
        self._probed_at = clock()  # the first probes one interval after the start

    @property
    def state(self):
        return self._state()

    @property
    def policy(self):
        return self._policy()

    @property
    def ids(self) -> set:
        """The nodes Ray lists alive, as the scheduler has them (read only)."""
        return self._node_ids

    def reset(self) -> None:
        """The scheduler's state is made again (recovery, a policy reload): every node is new to it."""
        self._node_ids = set()

    def refresh(self) -> bool:
        """Bring the scheduler's nodes up to date with Ray's: a new node joins (journaled the first time), a dead
        one is lost with every lease that had a worker on it (``_lose_node``), and each node's service state
        (``raylane.control.nodes``) decides whether it is schedulable."""
        raw = self.host.nodes()
        nodes = nodes_from_ray(raw)
        self._addresses = {n["NodeID"]: n.get("NodeManagerAddress", "") for n in raw}
        ids = {n.id for n in nodes}
        now = self.clock()
        for n in nodes:
            if self.nodes.get(n.id) is None:
                spot = {"spot": True} if n.labels.get(SPOT_LABEL) == "true" else {}
                self.event(n.id, "joined", node_type=n.node_type, gpus=n.capacity.gpu, cpus=n.capacity.cpu,
                           memory_gib=n.capacity.memory, features=sorted(n.features),
                           address=self._addresses.get(n.id, ""), **spot)
        # Nodes the book holds alive that Ray no longer lists alive (also those lost while the control plane was
        # down): lost.
        for nid, st in list(self.nodes.nodes.items()):
            if st.state is not NodeState.LOST and nid not in ids:
                self._lose_node(nid, now)
        changed = ids != self._node_ids
        if changed:
            used: Dict[str, Resources] = {}
            held: Dict[str, Dict[int, float]] = {}  # node -> device -> the share leases hold of it
            for lease in self.state.leases.values():
                g = lease.workload.gang.per_worker.gpu
                for i, nid in enumerate(lease.placement):
                    used[nid] = used.get(nid, Resources()) + lease.workload.gang.per_worker
                    for d in (lease.devices[i] if lease.devices else ()):
                        held.setdefault(nid, {})[d] = held.get(nid, {}).get(d, 0.0) + (g if g < 1 else 1.0)
            for n in nodes:
                if n.id not in self._node_ids:
                    h = held.get(n.id, {})
                    devs = tuple(round(d - h.get(i, 0.0), 9) for i, d in enumerate(n.devices or ()))
                    self.state.add_node(replace(n, free=n.capacity - used.get(n.id, Resources()), devices=devs,
                                                schedulable=self.nodes.schedulable(n.id)))
            self._node_ids = ids
        return changed

    def event(self, node_id: str, event: str, **data) -> None:
        """Journal a node event, then apply it to the book (journal first, then act)."""
        e = self.journal.append(Kind.NODE, NODES_ID, node=node_id, event=event, **data)
        self.nodes.apply(e)
        if node_id in self.state.nodes:
            self.state.set_schedulable(node_id, self.nodes.schedulable(node_id))
        if event == "quarantined":
            metrics.NODE_QUARANTINES.inc(node_type=self.nodes.get(node_id).node_type or "-")
            log.warning("node %s quarantined: %s", node_id, data.get("reason", ""))

    def events(self, events) -> None:
        """Journal and apply the events a ``NodeBook`` decision returned."""
        for ev in events:
            ev = dict(ev)
            self.event(ev.pop("node"), ev.pop("event"), **ev)

    def gang_failed(self, placement, wid: str, now: float) -> None:
        """A gang's crash that its driver retries: attributed to every node it ran on (``NodeBook.on_gang_failure``)."""
        self.events(self.nodes.on_gang_failure(placement, wid, now))

    def _lose_node(self, node_id: str, now: float) -> None:
        """A node died: journal it, then every lease with a worker there goes back to the queue at once, keeping
        its submit time; its gang is stopped (an all-or-nothing gang cannot go on short of a worker) and resumes
        from its last checkpoint wherever the core places it next."""
        self.event(node_id, "lost", reason="Ray reports the node dead")
        lost = self.leases.applier.lose_node(node_id, now)  # (and their stops, if they were asked to stop)
        self._node_ids.discard(node_id)
        for lease in lost:
            rec = self.records[lease.id]
            attained = lifecycle.attained_gpu_s(lease, now)
            # Its gang is stopped and its reservation removed (one not handed over yet still holds bundles on the
            # nodes left) before the requeue clears its name, and before this tick may admit it again under it.
            self.leases.kill_gang(rec)
            self._append(Kind.REQUEUED, rec, attained_gpu_s=attained, step=rec.step, lost_node=node_id,
                         note=f"node {node_id[:12]} was lost; back in the queue, resumes from its last checkpoint")
            self.reasons.capacity_lost(rec.id)
            lifecycle.requeue(self.state, lease, now, attained)
            self.leases.forget_preemptor(rec.id)
        self._replan_for_node(node_id, now)
        self._poke()

    def service(self, now: float) -> None:
        """Ray's drain notices become drains; leases on draining and quarantined nodes are preempted gracefully;
        a draining node with no lease left is drained; probes run every ``health.probe_interval``."""
        draining = self.host.draining()
        self.events(self.nodes.on_ray_draining({k: v for k, v in draining.items() if k in self._node_ids}))
        for st in self.nodes.evicting():
            for lease in [l for l in self.state.leases.values() if st.id in l.placement]:
                if self.records[lease.id].state is not State.PREEMPTING:  # a resize under way becomes a stop
                    self.leases.preempt(lease.id, f"node {st.id[:12]} is {st.state.value}: {st.reason}", now, "node")
            # A reservation not yet started is released at once by its preemption: the node may be empty already.
            if st.state is NodeState.DRAINING and not any(st.id in l.placement for l in self.state.leases.values()):
                self.event(st.id, "drained", by=st.by, reason=f"drained ({st.reason})")
        if now - self._probed_at >= self.policy.health.probe_interval and not self._probing and self._node_ids:
            self._probed_at = now
            self._probing = True
            h = self.policy.health
            ids = tuple(sorted(self._node_ids))
            self._emit(fx.RunProbes(ids, h.probe, h.conditions_dir, h.probe_timeout, tuple(
                self.state.nodes[n].capacity.gpu if n in self.state.nodes else 0.0 for n in ids)))

    def probed(self, verdicts: Dict[str, Any]) -> None:
        """Event: the verdicts of a ``RunProbes``: node id -> ``(ok, message)``, or None where the probe could not
        be placed because Ray places no new work on the node (it is gone or draining: no verdict on its health;
        the node table and Ray's drain notices say what it is)."""
        self._probing = False
        for nid, verdict in verdicts.items():
            st = self.nodes.get(nid)
            if verdict is None or st is None or nid not in self._node_ids:
                continue  # lost or draining meanwhile: its loss or drain is what counts
            ok, message = verdict
            metrics.NODE_PROBES.inc(outcome="ok" if ok else "failed")
            self.events(self.nodes.on_probe(nid, ok, message))
            self.nodes.note_probe(nid, ok, message, self.clock())
        self._poke()

    def node_list(self, p: Principal, req: api.NodeList) -> List[Dict[str, Any]]:
        """Every node with its service state, probe, GPUs and the leases on it (teams' work, not its specs)."""
        self.refresh()
        rows = []
        for st in self.nodes.nodes.values():
            if st.state is NodeState.LOST and not req.include_lost:
                continue
            node = self.state.nodes.get(st.id)
            leases = []
            for lease in self.state.leases.values():
                n = sum(1 for nid in lease.placement if nid == st.id)
                if n:
                    rec = self.records[lease.id]
                    leases.append({"workload": lease.id, "team": rec.team, "class": rec.cls, "workers": n,
                                   "gpus": n * lease.workload.gang.per_worker.gpu, "state": rec.state.value})
            rows.append({**st.public(), "address": self._addresses.get(st.id, st.address),
                         "gpus_free": node.free.gpu if node else 0.0,
                         "features": sorted(node.features) if node else [], "leases": leases})
        rows.sort(key=lambda r: (r["state"] == "lost", r["node_type"], r["id"]))
        return rows

    def _node_ref(self, ref: str) -> str:
        found = self.nodes.resolve(ref)
        if len(found) != 1:
            known = ", ".join(sorted(n[:12] for n in self.nodes.resolve(""))) or "none"
            raise ValidationError("node", [("node", ref, ("a unique prefix (it matches " + ", ".join(
                f[:12] for f in found) + ")") if found else f"the id (or a unique prefix) of a live node: {known}")])
        return found[0]

    def node_cordon(self, p: Principal, req: api.NodeCordon) -> Dict[str, Any]:
        nid = self._node_ref(req.node)
        if self.nodes.get(nid).state is NodeState.READY:
            self.event(nid, "cordoned", by=p.user, reason=req.reason or f"cordoned by {p.user}")
        return self.nodes.get(nid).public()

    def node_uncordon(self, p: Principal, req: api.NodeUncordon) -> Dict[str, Any]:
        nid = self._node_ref(req.node)
        if self.nodes.get(nid).state is not NodeState.READY:
            self.event(nid, "uncordoned", by=p.user, reason=req.reason or f"uncordoned by {p.user}")
        self._poke()
        return self.nodes.get(nid).public()

    def node_drain(self, p: Principal, req: api.NodeDrain) -> Dict[str, Any]:
        """Cordon the node and preempt what runs there gracefully (checkpoint, requeue, resume elsewhere); the
        node is ``drained`` once no lease is left (``node_list`` shows it)."""
        nid = self._node_ref(req.node)
        if self.nodes.get(nid).state in (NodeState.READY, NodeState.CORDONED):
            self.event(nid, "draining", by=p.user, reason=req.reason or f"drained by {p.user}")
        self.service(self.clock())
        return self.nodes.get(nid).public()
