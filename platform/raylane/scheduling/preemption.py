"""The preemption axis: which running leases may be stopped to make room for a waiting workload, and which are.

A preemption policy only *nominates* candidates, cheapest first. ``find_victims`` (shared by every policy) searches
them on the cycle's working copies with remove-and-undo: it removes candidates until the preemptor fits (its quota
and a placement of its whole gang), then puts back every victim that turns out not to be needed, so the set is
small. Nothing is chosen unless the preemptor then fits. The snapshot is never changed.

Rules every policy keeps (enforced here, not by each policy):
- non-preemptible work is never a candidate; neither is work younger than its class's minimum runtime, nor a lease
  that is already terminating;
- another team's work is touched only while that team's running leases hold more than its nominal quota, when the
  admission policy protects in-quota work (``PreemptionContext.protected``).

Policies: ``default`` (Kueue-like: within a team a higher class preempts a lower one; a team that stays within its
nominal quota reclaims what others borrowed), ``ordering`` (any lease that ranks after the preemptor under the
ordering policy: LAS demotion, SRTF), ``none``.

Cost of a victim, smallest first: class priority, then GPU-seconds of work since its last checkpoint (what a stop
loses), then the most recently started. Cheaper than any of them: a workload admitted earlier in the same cycle
(*fresh*), which has not started; the cycle gives its place back (``Displaced``) instead of stopping it next cycle.
"""
from __future__ import annotations

from typing import Callable, Dict, List, Optional, Protocol, Sequence, Tuple

from raylane.scheduling.admission import AdmissionPolicy, QuotaLedger
from raylane.scheduling.capacity import Capacity
from raylane.scheduling.registry import Registry
from raylane.scheduling.types import ZERO, Lease, LeaseState, Resources, SchedulerConfig, Workload


class PreemptionContext:
    """What a preemption policy may read: leases, the ledger, the admission and ordering policies, ``now``.

    ``ledger`` is the quota as it will be once what is already stopping is gone. ``eligible()`` also holds the
    *fresh* leases: workloads admitted earlier in this cycle, not started yet, so displacing one loses nothing and
    ``find_victims`` is handed them first. ``held`` and ``fresh_held`` (per team) count running leases not chosen as
    victims, and fresh ones; they decide whether another team's work is in quota.
    """

    def __init__(self, leases: Sequence[Lease], ledger: QuotaLedger, admission: AdmissionPolicy, ordering,
                 cfg: SchedulerConfig, now: float):
        self.leases = leases
        self.ledger = ledger
        self.admission = admission
        self.ordering = ordering
        self.cfg = cfg
        self.now = now
        self.fresh: Dict[str, Lease] = {}
        self.fresh_held: Dict[str, Resources] = {}
        self._eligible: Optional[List[Lease]] = None
        self._held: Optional[Dict[str, Resources]] = None

    def eligible(self) -> List[Lease]:
        """Running, preemptible leases past their minimum runtime (computed once per cycle), then fresh ones."""
        if self._eligible is None:
            now = self.now
            self._eligible = [
                l for l in self.leases
                if l.state is LeaseState.RUNNING and l.workload.cls.preemptible
                and now - l.start_time >= l.workload.cls.min_runtime_s
            ]
        if not self.fresh:
            return self._eligible
        return self._eligible + [l for l in self.fresh.values() if l.workload.cls.preemptible]

    def attained(self, lease: Lease) -> float:
        return lease.workload.attained_gpu_s + max(0.0, self.now - lease.start_time) * lease.workload.gang.total.gpu

    @property
    def held(self) -> Dict[str, Resources]:
        if self._held is None:
            held: Dict[str, Resources] = {}
            for l in self.leases:
                if l.state is LeaseState.RUNNING:
                    held[l.team] = held.get(l.team, ZERO) + l.workload.gang.total
            self._held = held
        return self._held

    def protected(self, lease: Lease, preemptor: Workload) -> bool:
        """Another team's lease while that team is within its nominal quota, when the admission policy protects
        in-quota work. For a running lease the team's running work counts: what it was admitted in this cycle does
        not make it look borrowing (the fresh admissions are displaced first). For a fresh one, that counts too."""
        if not self.admission.protects_in_quota or lease.team == preemptor.team:
            return False
        return not self.borrowed(lease)

    def borrowed(self, lease: Lease) -> bool:
        """Whether ``lease``'s team holds more than its nominal quota: by its running leases, and for a fresh
        lease by those and its fresh ones. A team with no quota entry, or not known, never borrows."""
        t = self.ledger.teams.get(lease.team)
        if t is None:
            return False
        u = self.held.get(lease.team, ZERO)
        if lease.id in self.fresh:
            u = u + self.fresh_held.get(lease.team, ZERO)
        return any(u.get(r) > q.nominal + 1e-9 for r, q in t.quotas.items())

    def _hold(self, lease: Lease, sign: int) -> None:
        held = self.fresh_held if lease.id in self.fresh else self.held
        total = lease.workload.gang.total
        held[lease.team] = held.get(lease.team, ZERO) + (total if sign > 0 else total.scale(-1))

    def admit(self, lease: Lease) -> None:
        """``lease`` was admitted in this cycle: a fresh candidate from now on."""
        self.fresh[lease.id] = lease
        self._hold(lease, +1)

    def stop(self, lease: Lease) -> None:
        """``lease`` was chosen as a victim or displaced in this cycle: no candidate any more, and holds nothing."""
        self._hold(lease, -1)
        if self.fresh.pop(lease.id, None) is None:
            self.eligible()
            self._eligible = [l for l in self._eligible if l.id != lease.id]


def victim_cost(lease: Lease, now: float) -> Tuple:
    """Smaller is cheaper to stop: lower class priority, then less work lost since the last checkpoint."""
    gpus = max(lease.workload.gang.total.gpu, 1e-3)
    return (lease.workload.cls.priority, lease.progress_at_risk_s(now) * gpus, -lease.start_time, lease.id)


class PreemptionPolicy(Protocol):
    def candidates(self, preemptor: Workload, ctx: PreemptionContext) -> List[Lease]:
        """Leases that may be preempted for ``preemptor``, cheapest first. Must not change ``ctx``."""


PREEMPTIONS: Registry[PreemptionPolicy] = Registry("preemption", default="default")


@PREEMPTIONS.register("default")
class DefaultPreemption:
    def candidates(self, preemptor, ctx):
        reclaim = ctx.ledger.within_nominal(preemptor.team, preemptor.gang.total)
        # Reclaim takes only from teams that borrow, whatever the admission policy: two teams both under their
        # nominal quota would otherwise take the same GPUs from each other in turn.
        out = [
            l for l in ctx.eligible()
            if (l.team == preemptor.team and l.workload.cls.priority < preemptor.cls.priority)
            or (reclaim and l.team != preemptor.team and ctx.borrowed(l))
        ]
        out.sort(key=lambda l: victim_cost(l, ctx.now))
        return out


@PREEMPTIONS.register("ordering")
class OrderingPreemption:
    def candidates(self, preemptor, ctx):
        mine = ctx.ordering.rank(preemptor, preemptor.attained_gpu_s, ctx.cfg)
        out = [l for l in ctx.eligible() if ctx.ordering.rank(l.workload, ctx.attained(l), ctx.cfg) > mine]
        # The worst-ranked go first: under LAS the most-served, under SRTF the longest remaining.
        out.sort(key=lambda l: (ctx.ordering.rank(l.workload, ctx.attained(l), ctx.cfg), victim_cost(l, ctx.now)),
                 reverse=True)
        return out


@PREEMPTIONS.register("none")
class NoPreemption:
    def candidates(self, preemptor, ctx):
        return []


def find_victims(
    preemptor: Workload,
    candidates: Sequence[Lease],
    cap: Capacity,
    ctx: PreemptionContext,
    fits: Callable[[], bool],
) -> Optional[List[Lease]]:
    """Smallest prefix-then-pruned set of ``candidates`` after whose removal ``fits()`` holds, or None.

    Leaves ``cap`` and ``ctx.ledger`` exactly as they were.
    """
    if not candidates:
        return None
    if ctx.fresh:
        # Displacing a workload admitted in this cycle loses nothing: those go before any running lease.
        candidates = [l for l in candidates if l.id in ctx.fresh] + [l for l in candidates if l.id not in ctx.fresh]
    ledger = ctx.ledger
    removed: List[Lease] = []

    def take_out(lease: Lease) -> None:
        cap.give_placement(lease.placement, lease.workload.gang.per_worker)
        ledger.remove(lease.team, lease.workload.gang.total)
        ctx._hold(lease, -1)

    def put_back(lease: Lease) -> None:
        cap.take_placement(lease.placement, lease.workload.gang.per_worker)
        ledger.add(lease.team, lease.workload.gang.total)
        ctx._hold(lease, +1)

    cap.begin()
    found = False
    for lease in candidates:
        if ctx.protected(lease, preemptor):
            continue  # that team is (back) within its quota: its remaining work is protected
        take_out(lease)
        removed.append(lease)
        if fits():
            found = True
            break
    if found:
        # Fill back: return every victim the preemptor can do without, most expensive first (running before fresh).
        for lease in sorted(removed, key=lambda l: (l.id not in ctx.fresh, victim_cost(l, ctx.now)), reverse=True):
            put_back(lease)
            if fits():
                removed.remove(lease)
            else:
                take_out(lease)
    cap.undo()
    for lease in removed:
        ledger.add(lease.team, lease.workload.gang.total)
        ctx._hold(lease, +1)
    return removed if found else None
