"""One scheduling cycle: from a snapshot and ``now`` to typed decisions. Pure: no Ray, no clock, no randomness.

The control actor and the simulator both call ``cycle``; neither has a copy of this logic. ``check_feasible`` is the
submit-time test that refuses a workload no node set and no quota could ever hold.

Words: *head* is the first workload of a team queue; *examined* workloads are those the cycle looked at, in queue
order, and get a position; the rest keep their previous reason (``NotReached``) until a later cycle reaches them.
"""
from __future__ import annotations

import heapq
from typing import Dict, List, Optional, Tuple

from raylane.scheduling import ordering as _ordering  # noqa: F401  (registers the orderings)
from raylane.scheduling.admission import ADMISSIONS, QuotaLedger
from raylane.scheduling.backfill import BACKFILLS, Reservation
from raylane.scheduling.capacity import Capacity
from raylane.scheduling.ordering import ORDERINGS
from raylane.scheduling.placement import PLACEMENTS, place
from raylane.scheduling.preemption import PREEMPTIONS, PreemptionContext, find_victims
from raylane.scheduling.types import (
    Admit,
    BehindHead,
    BlockedByReservation,
    CycleResult,
    Infeasible,
    Lease,
    LeaseState,
    NoCapacity,
    Node,
    Pending,
    Preempt,
    Reserved,
    Resources,
    Snapshot,
    Team,
    WaitingForPreemption,
    Workload,
)

# Slurm's bf_max_job_test: how many pending workloads one cycle looks at, at most. Keeps a cycle short when the
# queue is long and the cluster full; the rest are looked at in later cycles.
MAX_EXAMINED = 500


class _TeamView:
    __slots__ = ("team", "usage")

    def __init__(self, team: Team, usage: Resources):
        self.team, self.usage = team, usage


def team_usage(leases) -> Dict[str, Resources]:
    usage: Dict[str, Resources] = {}
    for l in leases:
        usage[l.team] = usage.get(l.team, Resources()) + l.workload.gang.total
    return usage


def cycle(snapshot: Snapshot, now: float, *, max_examined: int = MAX_EXAMINED) -> CycleResult:
    """Decide what to admit, what to preempt and why the rest waits."""
    cfg = snapshot.config
    order = ORDERINGS.get(cfg.ordering)
    admission = ADMISSIONS.get(cfg.admission)
    backfill = BACKFILLS.get(cfg.backfill)
    preemption = PREEMPTIONS.get(cfg.preemption)

    # 1. Working copies: free capacity per node and team usage. Only these change during the cycle.
    cap = Capacity(snapshot.nodes)
    usage = snapshot.usage if snapshot.usage is not None else team_usage(snapshot.leases)
    ledger = QuotaLedger(snapshot.teams, usage)
    pctx = PreemptionContext(snapshot.leases, ledger, admission, order, cfg, now)

    # Preemptions already under way: their preemptors wait for them instead of choosing more victims.
    terminating = [l for l in snapshot.leases if l.state is LeaseState.TERMINATING]

    # 2. Merge the team queues by the ordering's head key.
    heap: List[Tuple[Tuple, int, str]] = []
    cursor: Dict[str, int] = {}
    seq = 0
    for team, q in snapshot.queues.items():
        if q:
            cursor[team] = 0
            heap.append((order.head_key(q[0], _TeamView(snapshot.teams.get(team, _NO_TEAM), ledger.used(team)),
                                        cfg), seq, team))
            seq += 1
    heapq.heapify(heap)

    admitted: List[Admit] = []
    preempted: List[Preempt] = []
    pending: List[Pending] = []
    reservation: Optional[Reservation] = None
    admitted_leases: List[Lease] = []
    budget = cfg.max_admissions_per_cycle
    position = 0

    # 3. Walk the merged queue: admit, preempt or explain.
    while heap and position < max_examined:
        _, _, team = heapq.heappop(heap)
        q = snapshot.queues[team]
        i = cursor[team]
        w = q[i]
        cursor[team] = i + 1
        if i + 1 < len(q):
            seq += 1
            heapq.heappush(heap, (order.head_key(q[i + 1], _TeamView(snapshot.teams.get(team, _NO_TEAM),
                                                                     ledger.used(team)), cfg), seq, team))
        position += 1

        if budget <= 0:
            break

        need = w.gang.total
        quota_reason = admission.check(ledger, team, need)
        plan = None if quota_reason is not None else place(w.gang, cap, w.data_snapshot)

        if quota_reason is None and plan is not None:
            if reservation is not None and not backfill.allows(w, plan, reservation, now):
                pending.append(Pending(w, _blocked(reservation, cap, w), position))
                continue
            cap.take_placement(plan, w.gang.per_worker)
            borrowing = not ledger.within_nominal(team, need) and admission.protects_in_quota
            ledger.add(team, need)
            admitted.append(Admit(w, plan, borrowing))
            admitted_leases.append(Lease(w, plan, now))
            budget -= 1
            # Re-key this team: its share changed (fair share).
            if i + 1 < len(q):
                heap = [(order.head_key(q[cursor[t]], _TeamView(snapshot.teams.get(t, _NO_TEAM), ledger.used(t)),
                                        cfg), s, t) if t == team else (k, s, t) for k, s, t in heap]
                heapq.heapify(heap)
            continue

        # 4. It does not fit. Is room already being made for it?
        waiting = [l.id for l in terminating]
        if waiting and _fits_after(w, terminating, cap, ledger, admission):
            pending.append(Pending(w, WaitingForPreemption(tuple(waiting)), position))
            continue

        # 5. Try preemption, on the working copies, with undo.
        def fits() -> bool:
            return admission.check(ledger, team, need) is None and place(w.gang, cap, w.data_snapshot) is not None

        victims = find_victims(w, preemption.candidates(w, pctx), cap, pctx, fits) if reservation is None or \
            quota_reason is not None else None
        if victims:
            ids = tuple(v.id for v in victims)
            preempted.append(Preempt(w, ids, _preempt_reason(w, victims, quota_reason)))
            pending.append(Pending(w, WaitingForPreemption(ids), position))
            # The victims still hold their resources until they stop; nobody else may be admitted into them.
            terminating.extend(Lease(v.workload, v.placement, v.start_time, v.last_checkpoint_time,
                                     LeaseState.TERMINATING) for v in victims)
            pctx._eligible = [l for l in pctx.eligible() if l.id not in ids]
            continue

        if quota_reason is not None:
            pending.append(Pending(w, quota_reason, position))
            continue

        # 6. Blocked by capacity: the first such workload gets a reservation; later ones must respect it.
        best, best_free = cap.best_node_for(w.gang.per_worker, w.gang.features)
        inner = NoCapacity(w.gang.workers, w.gang.per_worker, best, best_free, cap.total_free())
        if reservation is None:
            reservation = backfill.reserve(w, cap, list(snapshot.leases) + admitted_leases, now, cfg)
            if reservation is not None:
                start = reservation.shadow_time
                reason = Reserved(start, inner) if start is not None else inner
                pending.append(Pending(w, reason, position))
                continue
        pending.append(Pending(w, inner, position))

    return CycleResult(tuple(admitted), tuple(preempted), tuple(pending))


_NO_TEAM = Team("", {})


def _blocked(res: Reservation, cap: Capacity, w: Workload):
    if res.shadow_time is None:
        return BehindHead(res.head)
    return BlockedByReservation(res.head, res.shadow_time)


def _fits_after(w: Workload, terminating, cap: Capacity, ledger: QuotaLedger, admission) -> bool:
    """Whether ``w`` fits once every lease that is already stopping is gone."""
    cap.begin()
    gone = terminating
    for l in gone:
        cap.give_placement(l.placement, l.workload.gang.per_worker)
        ledger.remove(l.team, l.workload.gang.total)
    ok = admission.check(ledger, w.team, w.gang.total) is None and place(w.gang, cap, w.data_snapshot) is not None
    cap.undo()
    for l in gone:
        ledger.add(l.team, l.workload.gang.total)
    return ok


def _preempt_reason(w: Workload, victims, quota_reason) -> str:
    what = "quota" if quota_reason is not None else "capacity"
    return (f"{w.id} ({w.team}/{w.cls.name}, priority {w.cls.priority}) needs {w.gang.total}; "
            f"freeing {what} held by " + ", ".join(f"{v.id} ({v.team}/{v.workload.cls.name})" for v in victims))


def check_feasible(w: Workload, nodes, teams, admission_name: str = "quota") -> Optional[Infeasible]:
    """Why ``w`` could never run on ``nodes`` under ``teams``' quotas, even on an empty cluster; None if it could."""
    admission = ADMISSIONS.get(admission_name)
    if w.gang.strategy not in PLACEMENTS:
        return Infeasible("gang.placement", f"unknown strategy {w.gang.strategy!r}; known: "
                          + ", ".join(PLACEMENTS.names()))
    if admission.protects_in_quota:
        if w.team not in teams:
            return Infeasible("team", f"unknown team {w.team!r}; known: {', '.join(sorted(teams))}")
        ledger = QuotaLedger(teams, {})
        for r, q in teams[w.team].quotas.items():
            n = w.gang.total.get(r)
            room = ledger.headroom(w.team, r)
            if n > room + 1e-9:
                return Infeasible(
                    "gang", f"needs {n:g} {r.upper()} in all but team {w.team} can hold at most {room:g} "
                    f"(nominal {q.nominal:g}, borrowing limit "
                    f"{'none' if q.borrowing_limit is None else format(q.borrowing_limit, 'g')}, "
                    f"and what other teams lend)")
    empty = [Node(n.id, n.capacity, n.capacity, n.features, n.labels, n.node_type, n.datasets) for n in nodes]
    missing = set(w.gang.features) - set().union(*(n.features for n in empty)) if empty else set(w.gang.features)
    if missing:
        return Infeasible("gang.features", f"no node has {', '.join(sorted(missing))}")
    cap = Capacity(empty)
    if place(w.gang, cap, w.data_snapshot) is None:
        best, free = cap.best_node_for(w.gang.per_worker, w.gang.features)
        largest = f"largest matching node {best} has {free}" if best else "no node matches"
        return Infeasible("gang", f"{w.gang.workers} x ({w.gang.per_worker}) with strategy {w.gang.strategy} "
                          f"and features [{', '.join(sorted(w.gang.features))}] fits no set of nodes; {largest}")
    return None
