"""What each pending workload shows of why it waits (a role of ``raylane.control.state.ControlState``).

After every cycle, each pending workload the cycle examined gets its queue position and, when it changed, the
core's reason in words and as data (``Record.reason``, ``reason_data``). A full tick's cycle gives the reason of
every workload it examined; a shorter one's, those of the heads it looked at, the others keeping theirs until the
next full tick. A workload requeued because a node it ran on was lost says so where the nodes in service could
never hold it (``capacity_lost``).

Owns the reasons shown now (``shown``: the core's reason objects, so that an unchanged one is not formatted again)
and the workloads requeued off a lost node. Handed the records and the ``ClusterState`` (getter: a policy reload
replaces it).
"""
from __future__ import annotations

from typing import Any, Callable, Dict

from raylane.scheduling import check_feasible


def _fields(reason) -> Dict[str, Any]:
    fields = getattr(reason, "__dataclass_fields__", {})
    out = {}
    for k in fields:
        v = getattr(reason, k)
        out[k] = str(v) if hasattr(v, "__dataclass_fields__") else v
    return out


class Reasons:
    """The pending workloads' reasons (module docstring)."""

    def __init__(self, *, records, state: Callable[[], Any]):
        self.records, self._state = records, state
        self._reason_of: Dict[str, Any] = {}  # pending workload id -> the core's reason its record shows
        # Workloads requeued because a node they ran on was lost: their pending reason says the capacity is gone
        # while the nodes in service could never hold them.
        self._lost_capacity: set = set()

    @property
    def state(self):
        return self._state()

    def capacity_lost(self, wid: str) -> None:
        """``wid`` went back to the queue because a node it ran on was lost."""
        self._lost_capacity.add(wid)

    def shown(self, wid: str):
        """The core's reason ``wid``'s record shows (None: none yet)."""
        return self._reason_of.get(wid)

    def show(self, result, full: bool, potential_nodes: Callable[[], list]) -> None:
        """The positions and reasons of a cycle's ``result`` on the records. ``potential_nodes``: the nodes
        scale-up could add (``ScaleUp.potential_nodes``), which a workload off a lost node is judged against too."""
        for a in result.admitted:  # admitted again: it no longer waits for the capacity it lost
            self._lost_capacity.discard(a.workload.id)
        in_service = None
        shown = self._reason_of
        for p in result.pending:
            rec = self.records[p.workload.id]
            rec.position = p.position
            if shown.get(rec.id) == p.reason and rec.id not in self._lost_capacity:
                continue  # the reason it already shows (formatting thousands of them a cycle is most of its cost)
            rec.reason = str(p.reason)
            rec.reason_data = {"type": type(p.reason).__name__, **_fields(p.reason)}
            if rec.id in self._lost_capacity:
                in_service = in_service if in_service is not None else [
                    n for n in self.state.nodes.values() if n.schedulable] + potential_nodes()
                why = check_feasible(p.workload, in_service, self.state.teams, self.state.config.admission)
                if why is not None:
                    rec.reason = (f"the capacity it ran on is gone (a node was lost) and the nodes in service "
                                  f"could never hold it: {why.detail}; it "
                                  f"waits for nodes to join or return to service")
                    rec.reason_data = {"type": "CapacityLost", "detail": str(why)}
        # The reasons shown now: a full tick's cycle gives every examined workload's; a shorter one's, those of the
        # heads it looked at (the others keep theirs until the next full tick).
        reasons = {p.workload.id: p.reason for p in result.pending}
        if full:
            self._reason_of = reasons
        else:
            shown.update(reasons)
            for a in result.admitted:
                shown.pop(a.workload.id, None)
