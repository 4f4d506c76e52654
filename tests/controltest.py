"""Drive the control plane's state machine (``raylane.control.state.ControlState``) without Ray.

- ``FakeClock``: the time, set by the test (``advance(s)``); what the state machine reads as ``clock``.
- ``FakeHost``: Ray's tables as the state machine reads them (``raylane.control.state.Host``): nodes added by name
  (``add_node``) and shown in ``ray.nodes()``'s shape, drain notices, a job table and the placement groups that exist.
- ``Harness``: a ``ControlState`` on a journal in a temp dir, fed calls (``call``), ticks (``tick``) and the events
  the actor would feed it, with its effects settled the way the actor settles them (``raylane.control.actor``):
  commit the journal, then each effect in order, recorded in ``effects`` for the test to read. A ``Reserve`` is
  placed at once by default (the host lists the group ``CREATED`` and ``reservation_ready`` follows); ``placing``
  ``"later"`` leaves it ``PENDING`` until the test calls ``place``, ``"fail"`` fails it (``reservation_failed``). A
  checkpoint's pinned copy is made and removed on disk as the actor does (``PinCheckpoint``, ``DropPin``).

Words: a node's *name* is the test's (``gpu-a``); its *id* is a 56-hex-digit id derived from the name, as Ray's are.
"""
from __future__ import annotations

import hashlib
from typing import Any, Dict, List, Optional

from raylane.control import checkpoints as ckrefs
from raylane.control import effects as fx
from raylane.control.journal import Journal
from raylane.control.state import ControlState, Host
from raylane.control.state_nodes import FEATURE_LABEL_PREFIX, GiB, NODE_TYPE_LABEL

T0 = 1_700_000_000.0  # the fake clock's start (seconds since the epoch)

# The Ray tests' cluster (tests/raytest.start_cluster): a head with no GPU and two nodes of 2 GPUs with features.
TWO_NODES = (("gpu-a", {"gpus": 2, "features": ["gpu-sim", "nvlink"]}),
             ("gpu-b", {"gpus": 2, "features": ["gpu-sim", "ssd"]}))


class FakeClock:
    def __init__(self, t: float = T0):
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, s: float) -> float:
        self.t += s
        return self.t


def node_id(name: str) -> str:
    """The id of the node the test calls ``name`` (hex, the length of Ray's)."""
    return hashlib.sha224(name.encode()).hexdigest()


class FakeHost(Host):
    def __init__(self):
        self.ray_nodes: Dict[str, Dict[str, Any]] = {}  # node id -> its row of ``ray.nodes()``
        self.drains: Dict[str, int] = {}  # node id -> drain deadline (ms since the epoch)
        self.jobs: Optional[Dict[str, str]] = {}  # submission id -> status; None: Ray does not answer
        self.pgs: Dict[str, str] = {}  # placement group name -> state

    def add_node(self, name: str, *, gpus: float = 2, cpus: float = 4, memory_gib: float = 16, features=(),
                 node_type: str = "") -> str:
        nid = node_id(name)
        labels = {f"{FEATURE_LABEL_PREFIX}{f}": "true" for f in features}
        if node_type:
            labels[NODE_TYPE_LABEL] = node_type
        res = {"CPU": float(cpus), "memory": float(memory_gib * GiB)}
        if gpus:
            res["GPU"] = float(gpus)
        self.ray_nodes[nid] = {"NodeID": nid, "Alive": True, "Resources": res, "Labels": labels,
                               "NodeManagerAddress": f"10.0.0.{len(self.ray_nodes) + 1}"}
        return nid

    def kill_node(self, name: str) -> str:
        """Ray lists the node as dead."""
        nid = node_id(name)
        self.ray_nodes[nid]["Alive"] = False
        return nid

    def nodes(self) -> List[Dict[str, Any]]:
        return [dict(n) for n in self.ray_nodes.values()]

    def draining(self) -> Dict[str, int]:
        return dict(self.drains)

    def job_table(self) -> Optional[Dict[str, str]]:
        return None if self.jobs is None else dict(self.jobs)

    def placement_groups(self) -> Dict[str, str]:
        return dict(self.pgs)


class Harness:
    """``placing``: what becomes of a ``Reserve``: ``"now"`` (placed at once), ``"later"`` (``PENDING`` until
    ``place``), ``"fail"`` (``reservation_failed``)."""

    def __init__(self, path: str, policy: Dict[str, Any], *, nodes=TWO_NODES, head: bool = True,
                 auth: Optional[Dict[str, Any]] = None, placing: str = "now"):
        self.path, self.policy, self.auth, self.placing = path, policy, auth or {"enabled": False}, placing
        self.clock = FakeClock()
        self.host = FakeHost()
        if head:
            self.host.add_node("head", gpus=0, cpus=2)
        for name, kw in nodes:
            self.host.add_node(name, **kw)
        self.effects: List[fx.Effect] = []  # every effect carried out, in order
        self._seen = 0
        self.unplaced: Dict[str, fx.Reserve] = {}  # pg name -> a Reserve left PENDING ("later")
        self._start()

    def _start(self) -> None:
        self.cs = ControlState(self.policy, Journal(self.path, batched=True), self.host, self.clock, 1.0, self.auth)
        self.settle()  # what recovery decided

    # ------------------------------------------------------------------------------------------ events in
    def call(self, name: str, credential: Any = None, **args) -> Any:
        """A call as the actor's ``request`` runs it: checked, handled, then committed and its effects carried out."""
        try:
            p, req = self.cs.check(credential, name, args)
            return self.cs.handle(p, req)
        finally:
            self.settle()

    def tick(self, full: bool = True) -> None:
        self.cs.tick(full=full)
        self.settle()

    def probed(self, verdicts: Dict[str, Any]) -> None:
        self.cs.probed(verdicts)
        self.settle()

    def run_closed(self, wid: str, note: Optional[str]) -> None:
        self.cs.run_closed(wid, note)
        self.settle()

    def place(self, pg_name: str) -> None:
        """A reservation left ``PENDING`` is placed now."""
        e = self.unplaced.pop(pg_name)
        self.host.pgs[pg_name] = "CREATED"
        self.cs.reservation_ready(e.workload_id, e.pg_name)
        self.settle()

    # ----------------------------------------------------------------------------------------- effects out
    def settle(self) -> None:
        """Commit what was journaled, then carry out the effects in order (and those they lead to)."""
        self.cs.journal.commit()
        while True:
            effects = self.cs.take_effects()
            if not effects:
                return
            self.cs.journal.commit()
            for e in effects:
                self.effects.append(e)
                self._do(e)
            self.cs.journal.commit()

    def _do(self, e: fx.Effect) -> None:
        if isinstance(e, fx.Reserve):
            if self.placing == "now":
                self.host.pgs[e.pg_name] = "CREATED"
                self.cs.reservation_ready(e.workload_id, e.pg_name)
            elif self.placing == "later":
                self.host.pgs[e.pg_name] = "PENDING"
                self.unplaced[e.pg_name] = e
            else:
                self.cs.reservation_failed(e.workload_id, e.pg_name, "test: the group could not be placed")
        elif isinstance(e, fx.RemoveReservation):
            self.host.pgs.pop(e.pg_name, None)
            self.unplaced.pop(e.pg_name, None)
        elif isinstance(e, fx.PinCheckpoint):
            self.cs.pin_copied(e.workload_id, e.path, ckrefs.copy_pin(e.source, e.path))
        elif isinstance(e, fx.DropPin):
            ckrefs.drop_copy(e.path)

    def take(self, kind: Optional[type] = None) -> List[fx.Effect]:
        """The effects carried out since the last ``take`` (of type ``kind`` only, if given)."""
        new, self._seen = self.effects[self._seen:], len(self.effects)
        return [e for e in new if kind is None or isinstance(e, kind)]

    # ------------------------------------------------------------------------------------------- reading
    def record(self, wid: str):
        return self.cs.records[wid]

    def journal(self, wid: str) -> List[tuple]:
        """``(kind, data)`` of each journal entry of ``wid``, oldest first."""
        return [(e.kind, e.data) for e in self.cs.journal.entries_for(wid)]

    def kinds(self, wid: str) -> List[str]:
        return [k for k, _ in self.journal(wid) if k != "audit"]

    # ------------------------------------------------------------------------------------------- restart
    def restart(self) -> None:
        """The control plane restarts: a new ``ControlState`` replays the same journal, with the same host (placement
        groups are detached: they outlive it) and clock."""
        self.cs.journal.close()
        self.unplaced = {}
        self._start()

    def close(self) -> None:
        self.cs.journal.close()
