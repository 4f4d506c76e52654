"""Scale-up demand: which node groups should grow, and by which bundles, for the gangs that wait for capacity.

This module owns one decision: given what the scheduling cycle left pending and why, the cluster's node groups and
each team's monthly spend, which new nodes to ask the cluster autoscaler for (``compute_demand``), and how that ask
differs from the previous one (``diff_requests``), so the control plane can journal each request and withdrawal
before it calls the autoscaler. It changes no state and asks nothing: the control actor and the simulator drive it
as they drive ``cycle``. Pure: no Ray, no clock, no randomness.

Words
- *node group*: nodes of one shape that the autoscaler adds or removes together (``ScaleGroup``): per-node
  resources, features, labels and node type, how many exist now (``count``) and may exist at most (``max``), a
  price, whether they are spot nodes and how long one typically takes to start.
- *capacity wait*: a pending gang whose cycle reason is ``NoCapacity`` or ``Reserved`` (the head of the queue,
  waiting for room): the reasons ``raylane.forecast`` reads as waiting for room. Every other reason (quota, its
  turn behind a reservation, preemption under way, not reached) makes no demand: a new node would not let it start.
- *request*: the new nodes of one group that one gang needs, with the gang's bundles (``NodeRequest``). The gang
  is placed whole on empty nodes of that group by the placement code the cycle uses (``place``), so a request never
  counts on room on the nodes that exist: those are full for it, or it would not wait.
- *headroom*: of a group, ``max`` less ``count`` less the nodes requested for gangs earlier in this computation.
  The demand is declarative, as Ray's ``request_resources`` is: each computation is the whole of what the queue
  needs now and replaces the previous one, so nodes still starting for an earlier request are asked for again by
  the gangs that still wait for them, not counted twice.
- *node-hour price*: a group's ``price`` is per GPU-hour (per node-hour for a node with no GPUs), as the policy's
  ``prices`` are (``raylane.cost``); one node of ``g`` GPUs costs ``g x price`` an hour.
- *budget share*: a team's spend this calendar month over its monthly budget (``raylane.cost.TeamBudget``); from
  ``stop_share`` on, its gangs make no demand. A team with no budget is not limited.

Rules
- Gangs are taken in queue order (the cycle's ``position``, then workload id); earlier gangs take headroom first.
- The group for a gang: among the groups whose empty nodes can hold it within the group's ``max`` (of its node
  types, when it names some, and not spot groups when its class never runs on spot nodes: ``place`` decides), the
  one it was given in the previous request while that one still holds it and has headroom (a request that moves to
  another node type would waste the nodes already starting); otherwise the first of its node types in its order
  (flavors), spot groups first when its class prefers spot, then the cheapest per hour for the nodes it needs
  (nodes x node-hour price), unpriced groups last, then fewer nodes, then on-demand before spot at an equal price,
  then the group name. A group without headroom is passed over for the next.
- Per-flavor quotas (``raylane.scheduling.flavors``): a group whose node type the gang's team has a flavor quota
  for is passed over when that quota's room (``ScaleSnapshot.flavor_room``, less what earlier gangs of the team
  were given nodes of that type for in this computation) cannot take the gang's GPUs: a node it could not use
  under its quota would be bought for nothing.
- Why a gang gets no request, in this order: it does not wait for capacity; no group can ever hold it; its team's
  flavor quotas of every node type that could hold it are full; its team's budget share is at or over
  ``stop_share``; every group that could hold it is at its maximum.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Collection, Dict, Iterable, List, Mapping, Optional, Tuple, Union

from raylane.scheduling.capacity import Capacity
from raylane.scheduling.placement import place
from raylane.scheduling.types import (
    SPOT_LABEL,
    BehindHead,
    BlockedByReservation,
    Displaced,
    Gang,
    Infeasible,
    NoCapacity,
    Node,
    NotReached,
    Pending,
    QuotaExceeded,
    Reason,
    Reserved,
    Resources,
    UserShareExceeded,
    WaitingForPreemption,
    Workload,
)

__all__ = [
    "DEFAULT_STOP_SHARE", "ScaleGroup", "TeamSpend", "ScaleSnapshot", "NodeRequest", "NotWaitingForCapacity",
    "NoGroupFits", "FlavorQuotaFull", "BudgetSpent", "GroupRoom", "GroupsAtMax", "NoDemandReason", "Withheld",
    "Demand", "Admitted",
    "LeftQueue", "Replaced", "WithdrawReason", "Withdrawal", "RequestChanges", "capacity_wait", "nodes_needed",
    "compute_demand", "diff_requests",
]

# The budget share from which a team's gangs make no scale-up demand, when the policy names none.
DEFAULT_STOP_SHARE = 0.9


# ------------------------------------------------------------------------------------------------------- inputs


@dataclass(frozen=True, slots=True)
class ScaleGroup:
    """One node group as the demand reads it: the shape of one node, how many exist and may exist, and what one
    costs. ``price`` is per GPU-hour (per node-hour for a node with no GPUs), None when unpriced; ``startup_s`` is
    a typical start-up time in seconds, None when not known. A fixed group has ``max == count``."""

    name: str
    capacity: Resources
    count: int
    max: int
    node_type: str = ""
    features: frozenset = frozenset()
    labels: Mapping[str, str] = field(default_factory=dict)
    price: Optional[float] = None
    spot: bool = False
    startup_s: Optional[float] = None

    @property
    def node_hour_price(self) -> Optional[float]:
        """What one node costs an hour, None when unpriced."""
        if self.price is None:
            return None
        return self.price * self.capacity.gpu if self.capacity.gpu > 0 else self.price

    def empty_nodes(self, n: int) -> List[Node]:
        """``n`` new, empty nodes of this group, ids ``<group>+<i>`` (zero-padded: id order is creation order)."""
        width = len(str(max(0, n - 1)))
        labels = {**self.labels, SPOT_LABEL: "true"} if self.spot else dict(self.labels)
        return [Node(f"{self.name}+{i:0{width}d}", self.capacity, self.capacity, self.features, labels,
                     self.node_type) for i in range(n)]


@dataclass(frozen=True, slots=True)
class TeamSpend:
    """A team's spend this calendar month against its monthly budget (None: no budget), in the currency of the
    prices: the part of ``raylane.cost.TeamBudget`` the demand reads, frozen."""

    team: str
    budget: Optional[float]
    spent: float

    @property
    def share(self) -> Optional[float]:
        return self.spent / self.budget if self.budget else None

    @classmethod
    def of(cls, budget: Any) -> "TeamSpend":
        """From anything with ``team``, ``budget`` and ``spent`` (a ``raylane.cost.TeamBudget`` of a report)."""
        return cls(budget.team, budget.budget, float(budget.spent))


@dataclass(frozen=True)
class ScaleSnapshot:
    """Everything one demand computation reads. ``pending``: the cycle's ``Pending`` decisions (workload, reason,
    queue position); ``groups``: every node group, fixed ones included; ``budgets``: the teams with a spend figure
    (a team not named has no budget); ``stop_share``: the budget share from which a team's gangs make no demand;
    ``previous``: the requests of the last computation, whose groups a gang keeps while they still serve;
    ``flavor_room``: (team, node type, GPUs) for each flavor quota of a team, what more it may hold of that type
    now (``QuotaLedger.flavor_room``; a pair not named is not limited)."""

    pending: Tuple[Pending, ...]
    groups: Tuple[ScaleGroup, ...]
    budgets: Tuple[TeamSpend, ...] = ()
    stop_share: float = DEFAULT_STOP_SHARE
    previous: Tuple["NodeRequest", ...] = ()
    flavor_room: Tuple[Tuple[str, str, float], ...] = ()

    def __post_init__(self) -> None:
        if not (self.stop_share > 0 and math.isfinite(self.stop_share)):
            raise ValueError(f"stop_share {self.stop_share!r}: allowed: a share of the budget > 0, like 0.9")
        names = [g.name for g in self.groups]
        if len(set(names)) != len(names):
            raise ValueError(f"node group names {names}: allowed: each name once")


# ------------------------------------------------------------------------------------------------------ outputs


@dataclass(frozen=True, slots=True)
class NodeRequest:
    """The new nodes of one group that one gang needs. ``bundles``: the gang's workers, one bundle each, in worker
    order; ``per_node``: what the gang takes of each new node it is placed on; ``hourly_cost``: what the ``nodes``
    cost an hour (None: unpriced). ``position`` is the gang's queue position, which moves as the queue does: it is
    not part of what is asked (two requests that differ only there are equal)."""

    workload: str
    team: str
    group: str
    node_type: str
    nodes: int
    bundles: Tuple[Resources, ...]
    per_node: Tuple[Resources, ...]
    spot: bool = False
    hourly_cost: Optional[float] = None
    startup_s: Optional[float] = None
    position: int = field(default=0, compare=False)

    def __str__(self) -> str:
        spot = " spot" if self.spot else ""
        return (f"{self.workload}: {self.nodes} new {self.group}{spot} node{'s' if self.nodes != 1 else ''}"
                f" ({self.node_type or 'no node type'}) for {len(self.bundles)} x ({self.bundles[0]})")


# What a pending reason that makes no demand waits for, in words.
_WAITS_FOR = (
    (QuotaExceeded, "its team's quota"),
    (UserShareExceeded, "its user's share of its team's quota"),
    (WaitingForPreemption, "preempted work to stop"),
    ((BehindHead, BlockedByReservation, Displaced), "its turn"),
    (NotReached, "the scheduler to look at it"),
    (Infeasible, "nothing: it can never run"),
)


@dataclass(frozen=True, slots=True)
class NotWaitingForCapacity:
    """Its cycle reason (``inner``) is not a wait for room: a new node would not let it start."""

    inner: Reason

    def __str__(self) -> str:
        what = next((w for t, w in _WAITS_FOR if isinstance(self.inner, t)), "something other than capacity")
        return f"no new node asked for: it waits for {what}, not for capacity ({self.inner})"


@dataclass(frozen=True, slots=True)
class NoGroupFits:
    """No node group can ever hold the gang: ``why`` gives, per group, what stops it."""

    workers: int
    per_worker: Resources
    why: Tuple[Tuple[str, str], ...]

    def __str__(self) -> str:
        groups = "; ".join(f"{g}: {w}" for g, w in self.why) or "the cluster has no node groups"
        return f"no node group can hold {self.workers} x ({self.per_worker}): {groups}"


@dataclass(frozen=True, slots=True)
class BudgetSpent:
    """The team has spent ``spent`` of its monthly ``budget``: at or over ``stop_share``, it gets no new node."""

    team: str
    spent: float
    budget: float
    stop_share: float

    @property
    def share(self) -> float:
        return self.spent / self.budget

    def __str__(self) -> str:
        return (f"team {self.team}'s monthly budget is {self.share:.0%} spent ({self.spent:g} of {self.budget:g});"
                f" the policy stops scale-up at {self.stop_share:.0%}")


@dataclass(frozen=True, slots=True)
class FlavorQuotaFull:
    """Groups could hold the gang, but its team's flavor quota of each of their node types has less room than the
    gang's ``gpus``: ``room`` gives (node type, GPUs it may still take)."""

    team: str
    gpus: float
    room: Tuple[Tuple[str, float], ...]

    def __str__(self) -> str:
        rooms = ", ".join(f"{t} {r:g}" for t, r in self.room)
        return (f"team {self.team}'s flavor quotas have no room for its {self.gpus:g} GPUs on any node type a group "
                f"could add (room left: {rooms}; teams.{self.team}.flavors)")


@dataclass(frozen=True, slots=True)
class GroupRoom:
    """A group that could hold the gang: its nodes, those requested for earlier gangs, its maximum, and how many
    new nodes the gang needs."""

    group: str
    count: int
    requested: int
    max: int
    needed: int

    def __str__(self) -> str:
        return (f"{self.group} has {self.count} node{'s' if self.count != 1 else ''} and {self.requested} requested"
                f" of max {self.max}; this gang needs {self.needed} more")


@dataclass(frozen=True, slots=True)
class GroupsAtMax:
    """Every group that could hold the gang lacks the headroom for it (in the order they would be chosen)."""

    groups: Tuple[GroupRoom, ...]

    def __str__(self) -> str:
        return "every node group that could hold it is at its maximum: " + "; ".join(map(str, self.groups))


NoDemandReason = Union[NotWaitingForCapacity, NoGroupFits, FlavorQuotaFull, BudgetSpent, GroupsAtMax]


@dataclass(frozen=True, slots=True)
class Withheld:
    """A pending gang that gets no request, and why."""

    workload: str
    team: str
    reason: NoDemandReason
    position: int = 0


@dataclass(frozen=True)
class Demand:
    """What to ask the autoscaler for (``requests``) and why the other pending gangs ask nothing (``withheld``),
    both in queue order."""

    requests: Tuple[NodeRequest, ...]
    withheld: Tuple[Withheld, ...]

    def nodes_by_group(self) -> Dict[str, int]:
        """New nodes asked for per group, groups in name order."""
        out: Dict[str, int] = {}
        for r in sorted(self.requests, key=lambda r: r.group):
            out[r.group] = out.get(r.group, 0) + r.nodes
        return out

    def bundles_by_node_type(self) -> Dict[str, Tuple[Resources, ...]]:
        """Every requested bundle per node type (the label selector of the ask), node types in name order and the
        bundles in queue order."""
        out: Dict[str, List[Resources]] = {}
        for r in self.requests:
            out.setdefault(r.node_type, []).extend(r.bundles)
        return {t: tuple(out[t]) for t in sorted(out)}

    def request(self, workload: str) -> Optional[NodeRequest]:
        return next((r for r in self.requests if r.workload == workload), None)

    def reason(self, workload: str) -> Optional[NoDemandReason]:
        return next((w.reason for w in self.withheld if w.workload == workload), None)


@dataclass(frozen=True, slots=True)
class Admitted:
    """The gang was admitted: it needs no new node."""

    workload: str

    def __str__(self) -> str:
        return f"{self.workload} was admitted"


@dataclass(frozen=True, slots=True)
class LeftQueue:
    """The gang is no longer pending and was not admitted: cancelled (or rejected)."""

    workload: str

    def __str__(self) -> str:
        return f"{self.workload} left the queue (cancelled)"


@dataclass(frozen=True, slots=True)
class Replaced:
    """The gang still needs new nodes, but others than before (another group, or another count or shape)."""

    by: NodeRequest

    def __str__(self) -> str:
        return f"replaced by {self.by}"


WithdrawReason = Union[Admitted, LeftQueue, Replaced, NotWaitingForCapacity, NoGroupFits, BudgetSpent, GroupsAtMax]


@dataclass(frozen=True, slots=True)
class Withdrawal:
    request: NodeRequest
    reason: WithdrawReason


@dataclass(frozen=True)
class RequestChanges:
    """From one demand to the next: requests to add (queue order), to withdraw with why (the previous queue order),
    and those kept as they were (with their new queue position)."""

    add: Tuple[NodeRequest, ...]
    withdraw: Tuple[Withdrawal, ...]
    keep: Tuple[NodeRequest, ...]

    def __bool__(self) -> bool:
        return bool(self.add or self.withdraw)


# ------------------------------------------------------------------------------------------------------ deciding


def capacity_wait(reason: Reason) -> Optional[NoCapacity]:
    """The capacity shortfall a cycle reason reports, or None when the workload waits for something else."""
    if isinstance(reason, NoCapacity):
        return reason
    if isinstance(reason, Reserved):
        return reason.inner
    return None


def _per_node(gang: Gang, group: ScaleGroup) -> int:
    """How many of the gang's workers one empty node of ``group`` holds (devices counted as placement counts them)."""
    probe = group.empty_nodes(1)[0]
    return Capacity([probe]).slots(probe.id, gang.per_worker)


def nodes_needed(gang: Gang, group: ScaleGroup, data_snapshot: Optional[str] = None
                 ) -> Optional[Tuple[int, Tuple[str, ...]]]:
    """The fewest empty nodes of ``group`` (at most its ``max``) that hold the whole gang under its placement, with
    the placement on ``group.empty_nodes(n)``; None when no such number exists.

    On identical empty nodes more nodes never make a placement fail (every strategy only gains candidates), so the
    fewest is found by bisection between the nodes the gang's workers fill and one node per worker."""
    per_node = _per_node(gang, group)
    if per_node <= 0:
        return None
    lo = max(1, math.ceil(gang.workers / per_node))
    hi = min(gang.workers, group.max)
    if lo > hi:
        return None

    def fit(n: int) -> Optional[Tuple[str, ...]]:
        return place(gang, Capacity(group.empty_nodes(n)), data_snapshot)

    best = fit(hi)
    if best is None:
        return None
    best_n = hi
    while lo < best_n:
        mid = (lo + best_n) // 2
        got = fit(mid)
        if got is None:
            lo = mid + 1
        else:
            best, best_n = got, mid
    return best_n, best


def _why_not(gang: Gang, group: ScaleGroup, data_snapshot: Optional[str]) -> str:
    """Why no number of ``group``'s nodes, up to its max, holds ``gang`` (for ``NoGroupFits``)."""
    missing = gang.features - group.features
    if missing:
        return "its nodes lack " + ", ".join(sorted(missing))
    if _per_node(gang, group) <= 0:
        return f"a worker needs {gang.per_worker}; a node has {group.capacity}"
    if group.max < gang.workers:
        unbounded = nodes_needed(gang, replace(group, max=gang.workers), data_snapshot)
        if unbounded is not None:
            return f"needs {unbounded[0]} nodes, more than its max of {group.max}"
    return f"its nodes cannot hold the gang with placement {gang.strategy}"


def _hourly(group: ScaleGroup, n: int) -> Optional[float]:
    p = group.node_hour_price
    return None if p is None else p * n


def _preference(group: ScaleGroup, n: int, gang: Gang) -> Tuple:
    """The order groups are chosen in for ``gang``: its node types in its order (flavors), spot groups first when
    its class prefers them, then the cheapest for the nodes it needs (unpriced last), fewer nodes, on-demand before
    spot at an equal price, the name."""
    cost = _hourly(group, n)
    flavor = gang.node_types.index(group.node_type) if group.node_type in gang.node_types else 0
    spot_first = (not group.spot) if gang.spot == "prefer" else False
    return (flavor, spot_first, cost is None, cost or 0.0, n, group.spot, group.name)


def _request(w: Workload, position: int, group: ScaleGroup, n: int, plan: Tuple[str, ...]) -> NodeRequest:
    loads: Dict[str, int] = {}
    for nid in plan:
        loads[nid] = loads.get(nid, 0) + 1
    pw = w.gang.per_worker
    return NodeRequest(w.id, w.team, group.name, group.node_type, n, (pw,) * w.gang.workers,
                       tuple(pw.scale(k) for _, k in sorted(loads.items())), group.spot, _hourly(group, n),
                       group.startup_s, position)


def _shape(group: ScaleGroup) -> Tuple:
    """What ``nodes_needed`` reads of a group: everything but how many nodes it has now."""
    return (group.name, group.capacity, group.max, group.node_type, group.features,
            tuple(sorted(group.labels.items())))


def compute_demand(snapshot: ScaleSnapshot, *, memo: Optional[Dict[Tuple, Any]] = None) -> Demand:
    """The requests the pending gangs of ``snapshot`` make, and why the others make none (see the module's rules).

    ``memo``: a dict the caller keeps from one computation to the next, to reuse the nodes a gang needs on a group
    (``nodes_needed``): the answer depends only on the gang, its data snapshot and the group's shape, not on the
    group's current count, and a queue asks the same questions cycle after cycle. Without it nothing is kept."""
    groups = tuple(sorted(snapshot.groups, key=lambda g: g.name))
    spend = {b.team: b for b in snapshot.budgets}
    before = {r.workload: r.group for r in snapshot.previous}
    taken: Dict[str, int] = {g.name: 0 for g in groups}
    froom: Dict[Tuple[str, str], float] = {(team, t): r for team, t, r in snapshot.flavor_room}
    requests: List[NodeRequest] = []
    withheld: List[Withheld] = []
    for p in sorted(snapshot.pending, key=lambda p: (p.position, p.workload.id)):
        w = p.workload

        def hold(reason: NoDemandReason) -> None:
            withheld.append(Withheld(w.id, w.team, reason, p.position))

        # 1. Only a gang that waits for room makes demand.
        if capacity_wait(p.reason) is None:
            hold(NotWaitingForCapacity(p.reason))
            continue
        # 2. The groups whose empty nodes can hold it, each with the nodes it needs there.
        fits = {g.name: (g, got) for g in groups if (got := _needed(w, g, memo)) is not None}
        if not fits:
            hold(NoGroupFits(w.gang.workers, w.gang.per_worker,
                             tuple((g.name, _why_not(w.gang, g, w.data_snapshot)) for g in groups)))
            continue
        # 2b. Its team's flavor quotas: only node types it may take the gang's GPUs on.
        if froom:
            gpus = w.gang.total.gpu
            usable = {n: f for n, f in fits.items()
                      if (r := froom.get((w.team, f[0].node_type))) is None or gpus <= r + 1e-9}
            if not usable:
                types = sorted({f[0].node_type for f in fits.values()})
                hold(FlavorQuotaFull(w.team, gpus, tuple((t, froom[(w.team, t)]) for t in types)))
                continue
            fits = usable
        # 3. The team's budget.
        s = spend.get(w.team)
        if s is not None and s.budget and s.spent >= snapshot.stop_share * s.budget:
            hold(BudgetSpent(w.team, s.spent, s.budget, snapshot.stop_share))
            continue
        # 4. The group it had, while that still serves; else the cheapest with headroom.
        order = sorted(fits.values(), key=lambda f: _preference(f[0], f[1][0], w.gang))
        kept = fits.get(before.get(w.id, ""))
        if kept is not None:
            order.remove(kept)
            order.insert(0, kept)
        chosen = next(((g, got) for g, got in order if g.max - g.count - taken[g.name] >= got[0]), None)
        if chosen is None:
            hold(GroupsAtMax(tuple(GroupRoom(g.name, g.count, taken[g.name], g.max, got[0]) for g, got in order)))
            continue
        g, (n, plan) = chosen
        taken[g.name] += n
        if (w.team, g.node_type) in froom:
            froom[(w.team, g.node_type)] -= w.gang.total.gpu
        requests.append(_request(w, p.position, g, n, plan))
    return Demand(tuple(requests), tuple(withheld))


def _needed(w: Workload, group: ScaleGroup, memo: Optional[Dict[Tuple, Any]]
            ) -> Optional[Tuple[int, Tuple[str, ...]]]:
    if memo is None:
        return nodes_needed(w.gang, group, w.data_snapshot)
    key = (w.gang, w.data_snapshot, _shape(group))
    if key not in memo:
        memo[key] = nodes_needed(w.gang, group, w.data_snapshot)
    return memo[key]


def diff_requests(previous: Iterable[NodeRequest], current: Demand, *, admitted: Collection[str] = ()
                  ) -> RequestChanges:
    """What changes from the ``previous`` requests to ``current``: a previous request is kept when the same gang asks
    the same again, withdrawn when its gang was ``admitted`` (ids), left the queue (neither admitted nor pending),
    now makes no demand (with that reason: budget spent, groups at max, ...) or asks for other nodes (``Replaced``,
    the new request among ``add``)."""
    prev = sorted(previous, key=lambda r: (r.position, r.workload))
    now = {r.workload: r for r in current.requests}
    why = {w.workload: w.reason for w in current.withheld}
    done = set(admitted)
    withdraw: List[Withdrawal] = []
    keep: List[NodeRequest] = []
    for r in prev:
        new = now.get(r.workload)
        if new is not None and new == r:
            keep.append(new)
        elif new is not None:
            withdraw.append(Withdrawal(r, Replaced(new)))
        elif r.workload in done:
            withdraw.append(Withdrawal(r, Admitted(r.workload)))
        elif r.workload in why:
            withdraw.append(Withdrawal(r, why[r.workload]))
        else:
            withdraw.append(Withdrawal(r, LeftQueue(r.workload)))
    kept = {r.workload for r in keep}
    add = tuple(r for r in current.requests if r.workload not in kept)
    return RequestChanges(add, tuple(withdraw), tuple(keep))
