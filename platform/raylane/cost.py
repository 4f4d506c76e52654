"""Cost accounting: what leased and idle GPUs cost, read from the control plane's journal. Pure: no Ray, no clock.

This module owns how journal entries become *spans* (a lease's workers on their nodes, a node's presence) and how
spans, clipped to a window, become sums. The control actor feeds its journal to a ``Ledger`` (``feed``, entries in
journal order, each at most once) and asks it for reports (``report``) and for the spend it exports to Prometheus;
tests build entries by hand. Nothing here changes the journal or decides anything about scheduling.

Words
- *lease*: one admission of a workload, from its ``admitted`` entry to the entry that ends it (``requeued``,
  ``finished``, ``cancelled``, ``rejected``), or to ``now`` while it is held. Worker ``i`` holds the spec's
  ``gang.resources.gpu`` GPUs on node ``placement[i]``.
- *node span*: a node's presence, from its ``node`` entry of event ``joined`` to its ``lost`` one (or ``now``), with
  its node type and GPU capacity. A cordoned, draining, drained or quarantined node is present: it still costs.
- *price*: the policy's ``prices[node type]``, per GPU-hour; for a node with no GPUs, per node-hour. A node type with
  no price, and a node the journal never described, are *unpriced*: their GPU-hours are counted at no cost and the
  report names them (``unpriced``).
- *idle*: GPUs of present nodes that no lease held, over time: per node, capacity x presence minus leased GPU time.
  Nodes with no GPUs are not idle or leased; their node-hours x price are the report's ``cpu_node_cost``.
- *window*: ``[since, until)``; every span is clipped to it. ``until`` is at most ``now`` (no cost in the future).
- *groups* (``GROUPS``): ``workload`` (its id), ``sweep`` (a ``kind: tune`` slot's sweep: its name without the
  ``-slot-<i>`` suffix, raylane.launchers.tune), ``pipeline`` (a spec's ``pipeline`` name, when it has one),
  ``team``, ``class``.
- *run*: the MLflow run a workload's driver named in the journal (``mlflow_run_id`` of its ``running`` or ``event``
  entries); a sweep's slots all name the sweep's parent run, so a run's cost is its sweep's, across drivers.
- *month*: a calendar month in UTC; budgets are per month (``month_start``).
"""
from __future__ import annotations

import calendar
import math
import re
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from typing import Any, Callable, Collection, Dict, Iterable, List, Mapping, Optional, Tuple

__all__ = ["GROUPS", "KINDS", "Ledger", "CostRow", "NodeTypeCost", "TeamBudget", "CostReport", "month_start",
           "sweep_of", "pipeline_of", "UNTYPED", "UNKNOWN_NODE"]

GROUPS: Tuple[str, ...] = ("workload", "sweep", "pipeline", "team", "class")
ENDS = ("requeued", "finished", "cancelled", "rejected")
# The journal kinds a ledger reads (the actor selects these when it feeds one); ``running`` and ``event`` entries
# may name the workload's MLflow run (``mlflow_run_id``). Values of ``raylane.control.journal.Kind``, written out:
# the control plane imports this module, not the other way round (tests/control/test_journal_kinds.py checks them).
KINDS: Tuple[str, ...] = ("submitted", "admitted", "running", "event", *ENDS, "node")
# How reports name a node with no node-type label, and a node the journal never described.
UNTYPED = "(no type)"
UNKNOWN_NODE = "(unknown node)"
_SLOT = re.compile(r"-slot-\d+$")  # raylane.launchers.tune.SLOT_SUFFIX ("-slot-{i}")
HOUR = 3600.0


def sweep_of(spec: Mapping[str, Any]) -> Optional[str]:
    """The sweep a workload belongs to: a ``kind: tune`` slot's spec name without ``-slot-<i>``; None otherwise."""
    if spec.get("kind") != "tune":
        return None
    return _SLOT.sub("", str(spec.get("name", ""))) or None


def pipeline_of(spec: Mapping[str, Any]) -> Optional[str]:
    """The pipeline a workload belongs to: a spec's ``pipeline`` (a name, or a mapping with a ``name``); None if
    it names none."""
    p = spec.get("pipeline")
    if isinstance(p, Mapping):
        p = p.get("name")
    return p if isinstance(p, str) and p else None


def month_start(ts: float) -> float:
    """The start (UTC) of the calendar month that holds ``ts``."""
    d = datetime.fromtimestamp(ts, tz=timezone.utc)
    return float(calendar.timegm((d.year, d.month, 1, 0, 0, 0)))


# ------------------------------------------------------------------------------------------------ spans


@dataclass(frozen=True)
class WorkloadInfo:
    id: str
    team: str
    cls: str
    kind: str
    gpu_per_worker: float
    sweep: Optional[str] = None
    pipeline: Optional[str] = None

    @classmethod
    def from_spec(cls, wid: str, spec: Mapping[str, Any]) -> "WorkloadInfo":
        gang = spec.get("gang") or {}
        gpu = (gang.get("resources") or {}).get("gpu", 0.0)
        return cls(wid, str(spec.get("team", "")), str(spec.get("class", "")), str(spec.get("kind", "train")),
                   float(gpu) if isinstance(gpu, (int, float)) and math.isfinite(gpu) else 0.0,
                   sweep_of(spec), pipeline_of(spec))


@dataclass
class LeaseSpan:
    workload: str
    placement: Tuple[str, ...]
    start: float
    end: Optional[float] = None  # None: held now


@dataclass
class NodeSpan:
    node: str
    node_type: str
    gpus: float
    start: float
    end: Optional[float] = None  # None: present now
    spot: bool = False  # a spot node (labelled raylane.io/spot=true when it joined)


def _overlap(a0: float, a1: float, b0: float, b1: float) -> float:
    return max(0.0, min(a1, b1) - max(a0, b0))


# ------------------------------------------------------------------------------------------------ reports


@dataclass
class CostRow:
    """One group's spend in the window: GPU-hours leased, their cost, and the GPU-hours on unpriced nodes (counted
    in ``gpu_hours``, at no cost). Workload rows also name the workload's team, class and kind."""

    key: str
    gpu_hours: float = 0.0
    cost: float = 0.0
    unpriced_gpu_hours: float = 0.0
    team: Optional[str] = None
    cls: Optional[str] = None
    kind: Optional[str] = None


@dataclass
class NodeTypeCost:
    """One node type in the window. ``price`` is None when the policy has none (unpriced). GPU node types:
    ``capacity_gpu_hours`` = ``leased_gpu_hours`` + ``idle_gpu_hours``; nodes with no GPUs: ``node_hours`` and
    ``node_cost``."""

    node_type: str
    price: Optional[float]
    nodes: int = 0
    # Its nodes are spot nodes (reclaimable): cost reports split spot and on-demand (``CostReport.by_market``).
    spot: bool = False
    capacity_gpu_hours: float = 0.0
    leased_gpu_hours: float = 0.0
    idle_gpu_hours: float = 0.0
    leased_cost: float = 0.0
    idle_cost: float = 0.0
    node_hours: float = 0.0
    node_cost: float = 0.0


@dataclass
class TeamBudget:
    """A team's spend in the current calendar month (UTC) against its monthly budget (None: it has none)."""

    team: str
    budget: Optional[float]
    spent: float
    alert_share: float

    @property
    def share(self) -> Optional[float]:
        return self.spent / self.budget if self.budget else None

    @property
    def alerting(self) -> bool:
        return self.budget is not None and self.spent >= self.alert_share * self.budget


@dataclass
class CostReport:
    """Spend in ``[since, until)``. ``groups[g]`` holds one row per member of group ``g`` (``GROUPS``), most
    expensive first. ``leased_cost`` covers the leases of the ``teams`` in scope (None: all teams); ``idle_cost`` and
    ``cpu_node_cost`` are the whole cluster's. ``unpriced``: node types (or ``UNKNOWN_NODE``) with GPU-hours and no
    price."""

    since: Optional[float]
    until: float
    teams: Optional[List[str]]
    leased_gpu_hours: float = 0.0
    leased_cost: float = 0.0
    idle_gpu_hours: float = 0.0
    idle_cost: float = 0.0
    cpu_node_cost: float = 0.0
    groups: Dict[str, List[CostRow]] = field(default_factory=dict)
    node_types: List[NodeTypeCost] = field(default_factory=list)
    unpriced: List[str] = field(default_factory=list)
    budgets: List[TeamBudget] = field(default_factory=list)

    def by_market(self) -> Dict[str, Dict[str, float]]:
        """GPU-hours and cost on spot nodes and on on-demand nodes (every node type's, leased and idle), the
        markets with any GPU-hours only: ``{"spot": {...}, "on-demand": {...}}``."""
        out: Dict[str, Dict[str, float]] = {}
        for nt in self.node_types:
            if not (nt.capacity_gpu_hours or nt.leased_gpu_hours):
                continue
            m = out.setdefault("spot" if nt.spot else "on-demand",
                               {"gpu_hours": 0.0, "leased_cost": 0.0, "idle_cost": 0.0, "cost": 0.0})
            m["gpu_hours"] += nt.capacity_gpu_hours
            m["leased_cost"] += nt.leased_cost
            m["idle_cost"] += nt.idle_cost
            m["cost"] += nt.leased_cost + nt.idle_cost
        return out

    @property
    def total_cost(self) -> float:
        return self.leased_cost + self.idle_cost + self.cpu_node_cost

    def row(self, group: str, key: str) -> Optional[CostRow]:
        return next((r for r in self.groups.get(group, []) if r.key == key), None)

    def to_dict(self) -> Dict[str, Any]:
        out = asdict(self)
        out["total_cost"] = self.total_cost
        for rows in out["groups"].values():
            for r in rows:
                r["class"] = r.pop("cls")
        out["budgets"] = [{**asdict(b), "share": b.share, "alerting": b.alerting} for b in self.budgets]
        out["by_market"] = self.by_market()
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "CostReport":
        groups = {g: [CostRow(**{("cls" if k == "class" else k): v for k, v in r.items()}) for r in rows]
                  for g, rows in d.get("groups", {}).items()}
        return cls(since=d.get("since"), until=d["until"], teams=d.get("teams"),
                   leased_gpu_hours=d["leased_gpu_hours"], leased_cost=d["leased_cost"],
                   idle_gpu_hours=d["idle_gpu_hours"], idle_cost=d["idle_cost"], cpu_node_cost=d["cpu_node_cost"],
                   groups=groups, node_types=[NodeTypeCost(**n) for n in d.get("node_types", [])],
                   unpriced=list(d.get("unpriced", [])),
                   budgets=[TeamBudget(b["team"], b["budget"], b["spent"], b["alert_share"])
                            for b in d.get("budgets", [])])


# ------------------------------------------------------------------------------------------------- ledger


@dataclass(frozen=True)
class Piece:
    """One worker of a lease on its node, for the part of the lease inside a window, priced (None: unpriced)."""

    workload: WorkloadInfo
    node: str
    node_type: str  # UNTYPED / UNKNOWN_NODE when the journal gives none
    start: float
    end: float
    price: Optional[float]

    @property
    def gpu_s(self) -> float:
        return self.workload.gpu_per_worker * (self.end - self.start)

    @property
    def cost(self) -> float:
        return self.gpu_s * self.price / HOUR if self.price is not None else 0.0


class Ledger:
    """Leases and node presence, from journal entries (``feed``), and what they cost (``report``, ``spend``).

    Entries are applied once, in journal order (an entry whose ``seq`` is not above the last one applied is
    skipped), so the actor may feed it whatever the journal holds after ``seq`` at any time. Not thread-safe: the
    control actor's event loop owns it.

    ``history``: where the workloads the journal archived are read (``Journal.archived_entries(since)``: the entries
    of those that ended at or after ``since``, workload by workload). A report or spend over a window reads those
    that ended in it, once, the first time a window reaches back that far; a workload the ledger knows already (fed
    live before it was archived) is not read again."""

    def __init__(self, history: Optional[Callable[[Optional[float]], Iterable[Any]]] = None) -> None:
        self.workloads: Dict[str, WorkloadInfo] = {}
        self.leases: List[LeaseSpan] = []
        self.nodes: Dict[str, List[NodeSpan]] = {}
        self.runs: Dict[str, str] = {}  # workload id -> MLflow run id
        self.seq = 0
        self._open: Dict[str, LeaseSpan] = {}
        self._history = history
        self._history_from: Optional[float] = None  # the archive is read for workloads that ended since then
        self._history_all = history is None

    # -- reading the journal

    def feed(self, entries: Iterable[Any]) -> None:
        for e in entries:
            self.apply(e)

    def apply(self, e: Any) -> None:
        """One journal entry (``seq``, ``ts``, ``kind``, ``workload_id``, ``data``); kinds not in ``KINDS`` are
        skipped."""
        if e.seq <= self.seq:
            return
        self.seq = e.seq
        self._take(e)

    def node_spans(self, forget_before: float) -> List[List[Any]]:
        """Every node's presence as data (``load_node_spans`` takes it back), without the spans that ended before
        ``forget_before``: what a compaction keeps of the node entries it archives."""
        return [[sp.node, sp.node_type, sp.gpus, sp.start, sp.end, sp.spot]
                for spans in self.nodes.values() for sp in spans if sp.end is None or sp.end >= forget_before]

    def load_node_spans(self, data: Iterable[List[Any]]) -> None:
        """Node presence from a compaction's snapshot (``node_spans``), before the live tail is fed."""
        for node, node_type, gpus, start, end, spot in data:
            self.nodes.setdefault(node, []).append(NodeSpan(node, node_type, float(gpus), float(start),
                                                            None if end is None else float(end), bool(spot)))

    def forget(self, workloads: Iterable[str], nodes_before: Optional[float] = None) -> None:
        """Drop ``workloads`` (archived: ended, no open lease) from memory, and the node spans that ended before
        ``nodes_before``: what a long-running control plane holds stays bounded (the compaction calls this). A
        later report reads the archived workloads its window needs again (``history``)."""
        gone = set(workloads)
        if gone:
            for wid in gone:
                self.workloads.pop(wid, None)
                self.runs.pop(wid, None)
            self.leases = [sp for sp in self.leases if sp.workload not in gone]
            if self._history is not None:
                self._history_all, self._history_from = False, None
        if nodes_before is not None:
            for node in list(self.nodes):
                kept = [sp for sp in self.nodes[node] if sp.end is None or sp.end >= nodes_before]
                if kept:
                    self.nodes[node] = kept
                else:
                    del self.nodes[node]

    def _read_history(self, since: Optional[float]) -> None:
        """The archived workloads that ended at or after ``since`` (None: all), those not known yet."""
        if self._history_all or (since is not None and self._history_from is not None and since >= self._history_from):
            return
        known = set(self.workloads)
        for e in self._history(since):
            if e.workload_id not in known and e.kind in KINDS:
                self._take(e)
        if since is None:
            self._history_all = True
        else:
            self._history_from = since if self._history_from is None else min(since, self._history_from)

    def _take(self, e: Any) -> None:
        d = e.data
        if e.kind == "submitted":
            self.workloads[e.workload_id] = WorkloadInfo.from_spec(e.workload_id, d.get("spec") or {})
        elif e.kind == "admitted":
            self._end(e.workload_id, e.ts)
            span = LeaseSpan(e.workload_id, tuple(d.get("placement") or ()), e.ts)
            self.leases.append(span)
            self._open[e.workload_id] = span
        elif e.kind in ENDS:
            self._end(e.workload_id, e.ts)
        elif e.kind in ("running", "event"):
            if isinstance(d.get("mlflow_run_id"), str):
                self.runs[e.workload_id] = d["mlflow_run_id"]
        elif e.kind == "node":
            node = d.get("node", "")
            spans = self.nodes.setdefault(node, [])
            present = bool(spans) and spans[-1].end is None
            if d.get("event") == "joined" and not present:
                spans.append(NodeSpan(node, d.get("node_type") or "", float(d.get("gpus") or 0.0), e.ts,
                                      spot=bool(d.get("spot"))))
            elif d.get("event") == "lost" and present:
                spans[-1].end = e.ts

    def _end(self, wid: str, ts: float) -> None:
        span = self._open.pop(wid, None)
        if span is not None:
            span.end = ts

    # -- sums

    def node_type(self, node: str) -> str:
        spans = self.nodes.get(node)
        if not spans:
            return UNKNOWN_NODE
        return spans[-1].node_type or UNTYPED

    def pieces(self, prices: Mapping[str, float], *, now: float, since: Optional[float] = None,
               until: Optional[float] = None) -> List[Piece]:
        """Every worker's GPU time within the window, on its node, priced."""
        self._read_history(since)
        lo, hi = _window(now, since, until)
        out = []
        for lease in self.leases:
            a, b = max(lease.start, lo), min(now if lease.end is None else lease.end, hi)
            info = self.workloads.get(lease.workload)
            if b <= a or info is None or info.gpu_per_worker <= 0:
                continue
            for node in lease.placement:
                ntype = self.node_type(node)
                out.append(Piece(info, node, ntype, a, b, prices.get(ntype)))
        return out

    def spend(self, prices: Mapping[str, float], *, now: float, since: Optional[float] = None,
              until: Optional[float] = None) -> Tuple[Dict[Tuple[str, str, str], float], Dict[str, float]]:
        """What the window cost, as the actor's counters take it: leased cost by (team, class, node type) and idle
        cost by node type; unpriced node types are left out."""
        pieces = self.pieces(prices, now=now, since=since, until=until)
        leased: Dict[Tuple[str, str, str], float] = {}
        for p in pieces:
            if p.price is not None:
                key = (p.workload.team, p.workload.cls, p.node_type)
                leased[key] = leased.get(key, 0.0) + p.cost
        idle = {nt.node_type: nt.idle_cost for nt in self._node_types(prices, pieces, now=now, since=since,
                                                                        until=until)
                if nt.price is not None and nt.capacity_gpu_hours > 0}
        return leased, idle

    def report(self, prices: Mapping[str, float], *, now: float, since: Optional[float] = None,
               until: Optional[float] = None, teams: Optional[Collection[str]] = None,
               workloads: Optional[Collection[str]] = None, runs: Optional[Collection[str]] = None,
               groups: Collection[str] = GROUPS,
               budgets: Optional[Mapping[str, Optional[float]]] = None, alert_share: float = 0.8) -> CostReport:
        """The window's spend. ``teams``: the teams whose leases are reported (None: all); ``workloads``: only these
        workloads' leases (None: all); ``runs``: only the leases of workloads that named one of these MLflow runs
        (None: all); ``groups``: which of ``GROUPS`` to sum; ``budgets``: team -> monthly budget
        (None: no budget), for the ``budgets`` section: each team's spend in the month of ``until``, whatever the
        window. Idle and CPU-node cost are always the whole cluster's."""
        lo, hi = _window(now, since, until)
        rep = CostReport(since=since, until=hi, teams=sorted(teams) if teams is not None else None)
        pieces = self.pieces(prices, now=now, since=since, until=until)
        rows: Dict[str, Dict[str, CostRow]] = {g: {} for g in groups}
        seen: Dict[str, Tuple[float, float]] = {}  # node type -> GPU-hours, cost of the leases in scope
        unpriced = set()
        for p in pieces:
            w = p.workload
            if not self._in_scope(w, teams, workloads, runs):
                continue
            hours, cost = p.gpu_s / HOUR, p.cost
            rep.leased_gpu_hours += hours
            rep.leased_cost += cost
            h, c = seen.get(p.node_type, (0.0, 0.0))
            seen[p.node_type] = (h + hours, c + cost)
            if p.price is None:
                unpriced.add(p.node_type)
            for g, key in (("workload", w.id), ("sweep", w.sweep), ("pipeline", w.pipeline), ("team", w.team),
                           ("class", w.cls)):
                if g not in rows or key is None:
                    continue
                r = rows[g].get(key)
                if r is None:
                    extra = {"team": w.team, "cls": w.cls, "kind": w.kind} if g == "workload" else {}
                    r = rows[g][key] = CostRow(key, **extra)
                r.gpu_hours += hours
                r.cost += cost
                if p.price is None:
                    r.unpriced_gpu_hours += hours
        rep.groups = {g: sorted(r.values(), key=lambda r: (-r.cost, -r.gpu_hours, r.key)) for g, r in rows.items()}
        per_type = {nt.node_type: nt for nt in self._node_types(prices, pieces, now=now, since=since, until=until)}
        for ntype, (h, c) in seen.items():
            nt = per_type.setdefault(ntype, NodeTypeCost(ntype, prices.get(ntype)))  # e.g. UNKNOWN_NODE
            # Of the leased side a caller sees its own teams' work; the idle side is the cluster's.
            nt.leased_gpu_hours, nt.leased_cost = h, c
        for nt in per_type.values():
            if nt.node_type not in seen:
                nt.leased_gpu_hours, nt.leased_cost = 0.0, 0.0
            rep.idle_gpu_hours += nt.idle_gpu_hours
            rep.idle_cost += nt.idle_cost
            rep.cpu_node_cost += nt.node_cost
            if nt.price is None and nt.idle_gpu_hours > 0:
                unpriced.add(nt.node_type)
        rep.node_types = sorted(per_type.values(), key=lambda n: n.node_type)
        rep.unpriced = sorted(unpriced)
        if budgets is not None:
            month = self.report(prices, now=now, since=month_start(hi), until=hi, teams=teams, groups=("team",))
            spent = {r.key: r.cost for r in month.groups["team"]}
            rep.budgets = [TeamBudget(t, b, spent.get(t, 0.0), alert_share) for t, b in sorted(budgets.items())
                           if teams is None or t in teams]
        return rep

    def _in_scope(self, w: WorkloadInfo, teams, workloads, runs) -> bool:
        return ((teams is None or w.team in teams) and (workloads is None or w.id in workloads)
                and (runs is None or self.runs.get(w.id) in runs))

    def _node_types(self, prices: Mapping[str, float], pieces: List[Piece], *, now: float,
                    since: Optional[float], until: Optional[float]) -> List[NodeTypeCost]:
        """Per node type: nodes present in the window, GPU capacity-hours, GPU-hours leased (every team's), idle
        GPU-hours and their cost; node-hours and cost of nodes with no GPUs."""
        lo, hi = _window(now, since, until)
        leased_present: Dict[str, float] = {}  # node -> leased GPU-seconds while it was present
        for p in pieces:
            for s in self.nodes.get(p.node, ()):
                held = _overlap(p.start, p.end, s.start, now if s.end is None else s.end)
                leased_present[p.node] = leased_present.get(p.node, 0.0) + p.workload.gpu_per_worker * held
        out: Dict[str, NodeTypeCost] = {}
        for node, spans in self.nodes.items():
            ntype = self.node_type(node)
            cap_s = node_s = 0.0
            for s in spans:
                present = _overlap(s.start, now if s.end is None else s.end, lo, hi)
                if s.gpus > 0:
                    cap_s += s.gpus * present
                else:
                    node_s += present
            if cap_s <= 0 and node_s <= 0:
                continue
            price = prices.get(ntype)
            nt = out.setdefault(ntype, NodeTypeCost(ntype, price))
            nt.nodes += 1
            nt.spot = nt.spot or any(sp.spot for sp in spans)
            leased_s = leased_present.get(node, 0.0)
            idle_s = max(0.0, cap_s - leased_s)
            nt.capacity_gpu_hours += cap_s / HOUR
            nt.leased_gpu_hours += leased_s / HOUR
            nt.idle_gpu_hours += idle_s / HOUR
            nt.node_hours += node_s / HOUR
            if price is not None:
                nt.leased_cost += leased_s * price / HOUR
                nt.idle_cost += idle_s * price / HOUR
                nt.node_cost += node_s * price / HOUR
        return list(out.values())


def _window(now: float, since: Optional[float], until: Optional[float]) -> Tuple[float, float]:
    hi = now if until is None else min(until, now)
    lo = -math.inf if since is None else since
    return lo, hi
