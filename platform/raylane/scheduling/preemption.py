"""The preemption axis: which running leases may be stopped to make room for a waiting workload, and which are.

A preemption policy only *nominates* candidates, cheapest first. ``find_victims`` (shared by every policy) searches
them on the cycle's working copies with remove-and-undo: it removes candidates until the preemptor fits (its quota
and a placement of its whole gang), then puts back every victim that turns out not to be needed, so the set is
small. Nothing is chosen unless the preemptor then fits. The snapshot is never changed.

Rules every policy keeps (enforced here, not by each policy):
- non-preemptible work is never a candidate; neither is work younger than its class's minimum runtime, nor a lease
  that is already terminating;
- another team's work is touched only while that team borrows, when the admission policy protects in-quota work.

Policies: ``default`` (Kueue-like: within a team a higher class preempts a lower one; a team that stays within its
nominal quota reclaims what others borrowed), ``ordering`` (any lease that ranks after the preemptor under the
ordering policy: LAS demotion, SRTF), ``none``.

Cost of a victim, smallest first: class priority, then GPU-seconds of work since its last checkpoint (what a stop
loses), then the most recently started.
"""
from __future__ import annotations

from typing import Callable, List, Optional, Protocol, Sequence, Tuple

from raylane.scheduling.admission import AdmissionPolicy, QuotaLedger
from raylane.scheduling.capacity import Capacity
from raylane.scheduling.registry import Registry
from raylane.scheduling.types import Lease, LeaseState, SchedulerConfig, Workload


class PreemptionContext:
    """What a preemption policy may read: leases, the ledger, the admission and ordering policies, ``now``."""

    def __init__(self, leases: Sequence[Lease], ledger: QuotaLedger, admission: AdmissionPolicy, ordering,
                 cfg: SchedulerConfig, now: float):
        self.leases = leases
        self.ledger = ledger
        self.admission = admission
        self.ordering = ordering
        self.cfg = cfg
        self.now = now
        self._eligible: Optional[List[Lease]] = None

    def eligible(self) -> List[Lease]:
        """Running, preemptible leases past their minimum runtime (computed once per cycle)."""
        if self._eligible is None:
            now = self.now
            self._eligible = [
                l for l in self.leases
                if l.state is LeaseState.RUNNING and l.workload.cls.preemptible
                and now - l.start_time >= l.workload.cls.min_runtime_s
            ]
        return self._eligible

    def attained(self, lease: Lease) -> float:
        return lease.workload.attained_gpu_s + max(0.0, self.now - lease.start_time) * lease.workload.gang.total.gpu


def victim_cost(lease: Lease, now: float) -> Tuple:
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
        out = [
            l for l in ctx.eligible()
            if (l.team == preemptor.team and l.workload.cls.priority < preemptor.cls.priority)
            or (reclaim and l.team != preemptor.team)
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
    ledger = ctx.ledger
    protects = ctx.admission.protects_in_quota
    removed: List[Lease] = []
    cap.begin()
    found = False
    for lease in candidates:
        if protects and lease.team != preemptor.team and not ledger.borrowing(lease.team):
            continue  # that team is back within its quota: its remaining work is protected
        cap.give_placement(lease.placement, lease.workload.gang.per_worker)
        ledger.remove(lease.team, lease.workload.gang.total)
        removed.append(lease)
        if fits():
            found = True
            break
    if found:
        # Fill back: return every victim the preemptor can do without, most expensive first.
        for lease in sorted(removed, key=lambda l: victim_cost(l, ctx.now), reverse=True):
            cap.take_placement(lease.placement, lease.workload.gang.per_worker)
            ledger.add(lease.team, lease.workload.gang.total)
            if fits():
                removed.remove(lease)
            else:
                cap.give_placement(lease.placement, lease.workload.gang.per_worker)
                ledger.remove(lease.team, lease.workload.gang.total)
    cap.undo()
    for lease in removed:
        ledger.add(lease.team, lease.workload.gang.total)
    return removed if found else None
