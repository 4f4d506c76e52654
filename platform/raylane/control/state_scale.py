"""Scale-up: the control plane's side of Ray's autoscaler (a role of ``raylane.control.state.ControlState``).

On each full tick the gangs the cycle left waiting for capacity make demand (``raylane.scheduling.autoscale``): new
nodes of the cluster file's growable node groups, within each group's ``max`` and each team's monthly budget. What
changed since the last tick is journaled first (``Kind.SCALE``, under the gang's id: ``requested`` with the nodes,
``withdrawn`` with why), then the whole ask goes to Ray's autoscaler in one effect (``fx.RequestNodes``), which the
actor carries out through Ray's autoscaling coordinator. A pending gang's reason says which node it waits for, or
why none is asked for.

Words
- *ask*: what Ray's autoscaler is told. ``request_resources`` is declarative and judged against the *total*
  resources of the nodes, busy or not, so the ask holds, per node type that a gang waits for, one whole-node bundle
  for every node of that type that exists plus one for every new node requested, each with a label selector for the
  type: the existing nodes absorb their own bundles and exactly the requested nodes are added. It is renewed every
  ``RENEW_S`` while not empty (the coordinator forgets an ask after ``EXPIRE_S``) and withdrawn (no bundles) when
  no gang waits for a new node, so that idle nodes can go after the autoscaler's idle timeout. A node that holds a
  lease is not idle (its placement group's bundles are in use), so it is never removed under a gang.
- *spend*: a team's spend this calendar month from the cost ledger (``raylane.cost``), against its ``budget``;
  from the policy's ``budget_stop_share`` of it on, its gangs ask for no node.

Recovery: the requests standing when the control plane stopped are rebuilt from the journal, with the time each was
first made, so a restart neither asks twice nor forgets what it asked.
"""
from __future__ import annotations

import time as _time
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Tuple

from raylane.config.cluster import ClusterFile, NodeGroup
from raylane.control import effects as fx
from raylane.control.journal import Entry, Kind
from raylane.control.records import State
from raylane.control.state_nodes import NODE_TYPE_LABEL
from raylane.scheduling.autoscale import (
    BudgetSpent,
    Demand,
    FlavorQuotaFull,
    GroupsAtMax,
    NodeRequest,
    NoGroupFits,
    ScaleGroup,
    ScaleSnapshot,
    TeamSpend,
    compute_demand,
    diff_requests,
)
from raylane.scheduling.flavors import flavor_rooms
from raylane.scheduling import check_feasible
from raylane.scheduling.types import Infeasible, Node, Pending, Resources, Workload

# The ask is sent again this often while it is not empty, and the coordinator keeps it this long unless renewed.
RENEW_S = 30.0
EXPIRE_S = 120.0
# The most verdicts ``feasible`` remembers at once (distinct gang shapes while the nodes stay the same); past it,
# it starts again.
FEASIBLE_MEMO_MAX = 4096

__all__ = ["RENEW_S", "EXPIRE_S", "ScaleUp", "request_data", "request_from", "whole_node_ask"]


def _res(r: Resources) -> Dict[str, float]:
    return {"gpu": r.gpu, "cpu": r.cpu, "memory": r.memory}


def request_data(r: NodeRequest) -> Dict[str, Any]:
    """A request as its journal entry holds it."""
    return {"team": r.team, "group": r.group, "node_type": r.node_type, "nodes": r.nodes,
            "bundles": [_res(b) for b in r.bundles], "per_node": [_res(b) for b in r.per_node], "spot": r.spot,
            "hourly_cost": r.hourly_cost, "startup_s": r.startup_s}


def request_from(wid: str, d: Mapping[str, Any]) -> NodeRequest:
    """The request a ``requested`` entry journaled (``request_data``)."""
    return NodeRequest(wid, d["team"], d["group"], d["node_type"], int(d["nodes"]),
                       tuple(Resources(**b) for b in d["bundles"]), tuple(Resources(**b) for b in d["per_node"]),
                       bool(d.get("spot")), d.get("hourly_cost"), d.get("startup_s"))


def whole_node_ask(wanted: Mapping[str, int], groups: Mapping[str, ScaleGroup]
                   ) -> Tuple[Tuple[Dict[str, float], ...], Tuple[Dict[str, str], ...]]:
    """The ask for ``wanted`` (group -> new nodes requested: ``Demand.nodes_by_group``; module words): per group, in
    name order, one whole-node bundle per node it has and per node requested, each selecting the group's node type."""
    bundles: List[Dict[str, float]] = []
    selectors: List[Dict[str, str]] = []
    for name in sorted(wanted):
        g = groups[name]
        bundle = {"CPU": g.capacity.cpu}
        if g.capacity.gpu:
            bundle["GPU"] = g.capacity.gpu
        for _ in range(g.count + wanted[name]):
            bundles.append(dict(bundle))
            selectors.append({NODE_TYPE_LABEL: g.node_type})
    return tuple(bundles), tuple(selectors)


def _duration(s: Optional[float]) -> str:
    if s is None:
        return "unknown"
    s = int(round(s))
    return f"{s // 60} min" if s >= 60 and s % 60 == 0 else f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s} s"


class ScaleUp:
    """Scale-up for ``ControlState``: owns the groups it may grow, the requests standing, the ask last sent and the
    gangs that wait for a node before they preempt. Handed the records, the journal, the ``ClusterState`` and the
    policy (getters: a policy reload replaces both), ``emit``, ``month_spend`` (each team's spend this month:
    ``state_costs.Costs``) and ``reason_of`` (the reason the cycle gave a pending gang: ``state_reasons``)."""

    def __init__(self, cluster: Optional[Mapping[str, Any]], *, records, journal, state: Callable[[], Any],
                 policy: Callable[[], Any], emit: Callable[[fx.Effect], None],
                 month_spend: Callable[[float], Dict[str, float]], reason_of: Callable[[str], Any]):
        """``cluster``: the cluster file as a dict (None: no group can grow, and nothing is ever asked)."""
        self.records, self.journal = records, journal
        self._state, self._policy = state, policy
        self._emit, self._month_spend, self._reason_of = emit, month_spend, reason_of
        groups: Tuple[NodeGroup, ...] = ()
        if cluster is not None:
            from raylane.config.loader import _validate

            groups = tuple(g for g in _validate(ClusterFile, dict(cluster), "control cluster file", []).nodes
                           if g.growable)
        self.groups: Tuple[NodeGroup, ...] = groups
        self.requests: Dict[str, NodeRequest] = {}  # gang id -> its standing request, in queue order
        self._scale_since: Dict[str, float] = {}  # gang id -> when its request was first made
        self._scale_memo: Dict[Tuple, Any] = {}
        self._scale_sent: Optional[Tuple] = None  # the last ask sent: (bundles, selectors)
        # ``feasible``'s verdicts while what it judges against stays the same: (its key, the state whose id the key
        # holds, kept so that the id is not reused meanwhile, verdicts)
        self._feasible_memo: Optional[Tuple[Tuple, Any, Dict[Tuple, Any]]] = None
        self._scale_sent_at = float("-inf")
        self._scale_noted: set = set()  # gangs whose reason carries a scale-up note
        # Gang id -> the time until which it preempts nobody, waiting for a new node (its class's wait_for_scale_up):
        # the cycle reads it (``Snapshot.scale_wait``).
        self.hold: Dict[str, float] = {}

    @property
    def state(self):
        return self._state()

    @property
    def policy(self):
        return self._policy()

    # ---------------------------------------------------------------------------------------------- replay
    def apply(self, e: Entry) -> None:
        """Replay: a journaled ``scale`` entry."""
        event = e.data.get("event")
        if event == "requested":
            self.requests[e.workload_id] = request_from(e.workload_id, e.data)
            self._scale_since.setdefault(e.workload_id, e.ts)
        elif event == "withdrawn":
            self.requests.pop(e.workload_id, None)
            if not e.data.get("replaced"):
                self._scale_since.pop(e.workload_id, None)

    # --------------------------------------------------------------------------------------------- reading
    def live_groups(self) -> Tuple[ScaleGroup, ...]:
        """The growable groups with the nodes of their node type that exist now."""
        counts: Dict[str, int] = {}
        for n in self.state.nodes.values():
            counts[n.node_type] = counts.get(n.node_type, 0) + 1
        return tuple(g.scale_group(counts.get(g.node_type, 0)) for g in self.groups)

    def potential_nodes(self) -> List[Node]:
        """Empty nodes of every growable group up to its ``max`` beyond the nodes of its type that exist: what
        a submission is judged feasible against besides the nodes in service."""
        out: List[Node] = []
        for g in self.live_groups():
            out.extend(g.empty_nodes(max(0, g.max - g.count)))
        return out

    def feasible(self, w: Workload) -> Optional[Infeasible]:
        """Why ``w`` could never run (``check_feasible``), or None: judged against the nodes there are and what the
        growable groups may add.

        A verdict reads the gang, the team and the data snapshot, and of the nodes only what ``node_version``
        covers (not what they hold now), of the teams their quotas (the policy's; a new policy is a new state). So
        it is remembered while the state, its node version, the nodes the groups may add and the admission rule
        stay the same: a burst of one shape is judged once, not once a submission."""
        st = self.state
        potential = self.potential_nodes() if self.groups else []
        key = (id(st), st.node_version, st.config.admission,
               tuple((n.id, n.capacity, n.node_type, n.features, n.datasets, tuple(sorted(n.labels.items())))
                     for n in potential))
        memo = self._feasible_memo
        if memo is None or memo[0] != key or len(memo[2]) >= FEASIBLE_MEMO_MAX:
            memo = self._feasible_memo = (key, st, {})
        verdicts = memo[2]
        shape = (w.gang, w.team, w.data_snapshot)
        if shape not in verdicts:
            verdicts[shape] = check_feasible(w, list(st.nodes.values()) + potential, st.teams, st.config.admission)
        return verdicts[shape]

    def _scale_wait_of(self, wid: str) -> float:
        rec = self.records.get(wid)
        c = self.policy.classes.get(rec.cls) if rec is not None else None
        return c.wait_for_scale_up if c is not None else 0.0

    def hold_for_scale_up(self, wid: str, now: float) -> None:
        """A gang just queued waits for a node before it preempts (its class's ``wait_for_scale_up``), until the
        next full tick's demand says whether one is asked for it (then from when it was asked) or not (no wait)."""
        if self.groups:
            wait = self._scale_wait_of(wid)
            if wait > 0:
                self.hold[wid] = now + wait

    def _team_spend(self, now: float) -> Tuple[TeamSpend, ...]:
        budgets = {name: t.budget for name, t in self.policy.teams.items() if t.budget}
        if not budgets:
            return ()
        spent = self._month_spend(now)
        return tuple(TeamSpend(team, b, spent.get(team, 0.0)) for team, b in sorted(budgets.items()))

    # ------------------------------------------------------------------------------------------------ tick
    def plan(self, pending: Iterable[Pending], now: float) -> Optional[Demand]:
        """The demand of ``pending`` (a full tick's cycle), its changes journaled, reasons noted and the ask sent
        when it changed or is due for renewal. Nothing when no group can grow."""
        if not self.groups:
            return None
        groups = self.live_groups()
        snap = ScaleSnapshot(tuple(pending), groups, self._team_spend(now), self.policy.budget_stop_share,
                             tuple(self.requests.values()), self._flavor_room())
        demand = compute_demand(snap, memo=self._scale_memo)
        admitted = {wid for wid in self.requests
                    if (rec := self.records.get(wid)) is not None and rec.state not in (
                        State.PENDING, State.CANCELLED, State.REJECTED)}
        changes = diff_requests(self.requests.values(), demand, admitted=admitted)
        for w in changes.withdraw:
            replaced = type(w.reason).__name__ == "Replaced"
            self.requests.pop(w.request.workload, None)
            self.journal.append(Kind.SCALE, w.request.workload, event="withdrawn", group=w.request.group,
                                nodes=w.request.nodes, reason=str(w.reason), replaced=replaced)
            if not replaced:
                self._scale_since.pop(w.request.workload, None)
        for r in changes.add:
            self.journal.append(Kind.SCALE, r.workload, event="requested", **request_data(r))
            self._scale_since.setdefault(r.workload, now)
        self.requests = {r.workload: r for r in demand.requests}
        self.hold = {r.workload: self._scale_since[r.workload] + wait for r in demand.requests
                           if (wait := self._scale_wait_of(r.workload)) > 0}
        self._note_scale(demand)
        ask = whole_node_ask(demand.nodes_by_group(), {g.name: g for g in groups})
        if ask != self._scale_sent or (ask[0] and now - self._scale_sent_at >= RENEW_S):
            self._scale_sent, self._scale_sent_at = ask, now
            self._emit(fx.RequestNodes(ask[0], ask[1], EXPIRE_S))
        return demand

    def _flavor_room(self) -> Tuple[Tuple[str, str, float], ...]:
        """(team, node type, GPUs) each flavor quota still has room for, from what the leases hold now."""
        st = self.state
        return flavor_rooms(st.teams, st.usage, st.leases.values(), st.nodes.values())

    def _note_scale(self, demand: Demand) -> None:
        """Each pending gang's reason with what scale-up does for it: the node it waits for, or why none is asked
        for (budget, maxima, no group that holds it); gangs that wait for something else keep the cycle's reason."""
        notes: Dict[str, str] = {}
        for r in demand.requests:
            since = self._scale_since.get(r.workload)
            at = _time.strftime("%H:%M", _time.localtime(since)) if since is not None else "now"
            spot = " spot" if r.spot else ""
            notes[r.workload] = (f"waiting for {r.nodes} new {r.group}{spot} node{'s' if r.nodes != 1 else ''} "
                                 f"({r.node_type}): requested {at}, typical start {_duration(r.startup_s)}")
            until = self.hold.get(r.workload)
            if until is not None:
                notes[r.workload] += (f"; it preempts nobody before {_time.strftime('%H:%M:%S', _time.localtime(until))}"
                                      f" (its class waits {_duration(self._scale_wait_of(r.workload))} for scale-up)")
        for w in demand.withheld:
            if isinstance(w.reason, (BudgetSpent, GroupsAtMax, NoGroupFits, FlavorQuotaFull)):
                notes[w.workload] = f"no new node asked for: {w.reason}"
        for wid in self._scale_noted | set(notes):
            rec = self.records.get(wid)
            base = self._reason_of(wid)
            if rec is None or rec.state is not State.PENDING or base is None:
                continue
            note = notes.get(wid)
            rec.reason = f"{base}; {note}" if note else str(base)
            if note:
                rec.reason_data = {**(rec.reason_data or {}), "scale": note}
            elif rec.reason_data:
                rec.reason_data.pop("scale", None)
        self._scale_noted = set(notes)
