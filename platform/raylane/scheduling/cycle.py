"""One scheduling cycle: from a snapshot and ``now`` to typed decisions. Pure: no Ray, no clock, no randomness.

The control actor and the simulator both call ``cycle``; neither has a copy of this logic. ``check_feasible`` is the
submit-time test that refuses a workload no node set and no quota could ever hold.

Words: *head* is the first workload of a team queue; *examined* workloads are those the cycle looked at, in queue
order, and get a position; the rest keep their previous reason (``NotReached``) until a later cycle reaches them.
A *borrower* is a workload whose admission would take its team past its nominal quota. The *future* is the cluster
as it will be once every terminating lease (and every victim chosen in this cycle) is gone, less what the
workloads waiting for those leases have *claimed* of it. A *fresh* admission is one made earlier in this cycle.

Rules that keep the room a preemption makes for the workload it was made for (each once a livelock):
- Work within its team's nominal quota is examined before borrowers (Kueue's rule), so reclaimed capacity is not
  lent out again first, and a borrower admitted in this cycle never makes its team's older work look borrowed.
- When borrowers fill the window of ``max_examined``, the work within its team's nominal quota past it (among each
  team's first ``max_examined``) takes the places of the window's last borrowers, which are not reached: such work
  would reclaim a borrower admitted now as soon as that admission let it into the window, and the borrower, requeued
  ahead of it, would push it out again.
- Nothing starts now on what a waiting workload has claimed of the future (capacity or quota).
- A workload that preempted and still waits for what it freed (*nominated*: ``Snapshot.nominated``, kept by the
  driver's ``raylane.scheduling.apply.Applier``) is examined in every cycle, past the window too, and never waits
  for the borrowers' pass, even while what it waits for still counts against its team's quota now: a cycle of a
  smaller window than the one that chose its victims (the control plane's cycles between full ticks) would
  otherwise give what they freed to other work first, the victim first when it stopped at once (requeued within
  its team's quota), to be preempted again by the next full cycle.
- A preemptor takes back fresh admissions before it stops running work: they have not started, so nothing is lost
  (``Displaced``), where starting them would only have them preempted in the next cycle. Never behind a
  reservation, where the preemptor itself might not be allowed to start.

Speed (a cycle over 10,000 pending and 8,000 leases stays within milliseconds; none of this changes a decision):
a preemption search that failed is not repeated for the same kind of workload while nothing that could make it
succeed has changed (the policy's ``memo_key``), and a search whose preemptor's team would stay over its quota
ceiling even without all of its own candidates is known to fail without trying each.
"""
from __future__ import annotations

from dataclasses import replace
from itertools import compress
from operator import attrgetter
from typing import Dict, List, Optional, Tuple

from raylane.scheduling import ordering as _ordering  # noqa: F401  (registers the orderings)
from raylane.scheduling.admission import ADMISSIONS, QuotaLedger
from raylane.scheduling.backfill import BACKFILLS, Reservation
from raylane.scheduling.capacity import Capacity, partial
from raylane.scheduling.flavors import flavor_usage, flavored, restrict
from raylane.scheduling.leaseorder import InEndOrder
from raylane.scheduling.ordering import ORDERINGS
from raylane.scheduling.placement import PLACEMENTS, place
from raylane.scheduling.preemption import PREEMPTIONS, PreemptionContext, find_victims
from raylane.scheduling.queuewalk import HeldByUser, QueueWalk
from raylane.scheduling.users import cap_reason, held_by_user, user_cap
from raylane.scheduling.working import Working
from raylane.scheduling.types import (
    SPOT_LABEL,
    Admit,
    BehindHead,
    BlockedByReservation,
    CycleResult,
    Displaced,
    Infeasible,
    Lease,
    LeaseState,
    NoCapacity,
    Node,
    NotReached,
    Pending,
    Preempt,
    Reserved,
    Resize,
    Resources,
    Snapshot,
    Team,
    WaitingForPreemption,
    Workload,
    ZERO,
    gpu_request_error,
)

# Slurm's bf_max_job_test: how many pending workloads one cycle looks at, at most. Keeps a cycle short when the
# queue is long and the cluster full; the rest are looked at in later cycles.
MAX_EXAMINED = 500


def team_usage(leases) -> Dict[str, Resources]:
    usage: Dict[str, Resources] = {}
    for l in leases:
        usage[l.team] = usage.get(l.team, Resources()) + l.workload.gang.total
    # Rounded as ClusterState rounds what it keeps: fractional sums then agree whatever the order.
    return {t: u.rounded() for t, u in usage.items()}


def cycle(snapshot: Snapshot, now: float, *, max_examined: int = MAX_EXAMINED, stops: bool = True) -> CycleResult:
    """Decide what to admit, what to preempt and why the rest waits. ``stops``: whether it may stop running leases
    for a preemptor (False: it only gives back admissions of its own, ``Displaced``; the control plane's cycles
    between full ticks, which see a window of the queues: what a stop loses is decided on the full one)."""
    # 0. The policies, by name, and the working copies of capacity and quota (only those change from here on).
    cfg = snapshot.config
    order = ORDERINGS.get(cfg.ordering)
    admission = ADMISSIONS.get(cfg.admission)
    w8 = _Walk(snapshot, now, admission, BACKFILLS.get(cfg.backfill), PREEMPTIONS.get(cfg.preemption), order, stops)
    teams = snapshot.teams

    # 1. The team queues merged by the ordering's head key (``raylane.scheduling.queuewalk``); a team with a user
    #    rule first orders its own queue by its users' shares (``raylane.scheduling.users``).
    ledger = w8.ledger
    ruled = [t for t in teams.values() if t.users is not None]
    walk = QueueWalk(snapshot.queues, teams, ledger, order, cfg, held=w8.user_rules(ruled) if ruled else None)

    # 2. Walk the merged queue: admit, preempt or explain (``_Walk.decide``). Borrowers wait for a second pass
    #    (Kueue's rule: work within its nominal quota goes first), so capacity that a team reclaims is not lent out
    #    again before that team gets it, and no team borrows in this cycle what another team's in-quota work needs.
    defer = admission.protects_in_quota
    deferred: List[Tuple[Workload, int, Resources]] = []
    nominated = {w.id: w for w in snapshot.nominated}
    claimed = frozenset(nominated)  # never deferred as borrowers: they preempted for their room already
    position = 0
    while walk and position < max_examined and w8.budget > 0:
        team, w = walk.next()
        position += 1
        if nominated:
            nominated.pop(w.id, None)
        w = _at_minimum(w)
        need = w.gang.total
        if defer and not ledger.within_nominal(team, need) and w.id not in claimed:
            deferred.append((w, position, need))
            continue
        if w8.decide(w, position, need):
            walk.took(team)  # what it holds changed, and a head key may read that (fair share)

    # 2b. The window is full and borrowers wait: in-quota work past it takes the last borrowers' places.
    skipped: List[Workload] = []  # borrowers the walk passed over without examining them
    if deferred and walk and position >= max_examined:
        skipped = _in_quota_past_window(w8, walk, max_examined, position, deferred, nominated)

    # 2c. Workloads that preempted and still wait (nominated) that the window did not reach: examined now, in queue
    #     order, before the borrowers, so that what they freed is not given to the work the window holds while
    #     they are out of its sight.
    for w in sorted(nominated.values(), key=lambda w: order.queue_key(w, cfg)):
        if w8.budget <= 0:
            break
        position += 1
        w = _at_minimum(w)
        if w8.decide(w, position, w.gang.total):
            walk.took(w.team)

    # 3. The borrowers, in queue order, while the admission budget lasts.
    for w, pos, need in deferred:
        if w8.budget > 0:
            w8.decide(w, pos, need)
        else:
            w8.pending.append(Pending(w, NotReached(), pos))

    # 4. Elastic gangs grow into what is left free, while nothing of their priority or higher waits.
    if w8.budget > 0 and w8.cap.total_free().gpu > 0:
        def waiting_priority() -> Optional[int]:
            """The highest class priority of any workload still waiting (examined or not)."""
            prios = [p.workload.cls.priority for p in w8.pending]
            prios += [w.cls.priority for w in walk.rest()]
            prios += [w.cls.priority for w in skipped]
            return max(prios, default=None)
        w8.grow(waiting_priority)

    # 5. Everything examined has a decision; pending ones are reported in queue order.
    w8.pending.sort(key=lambda p: p.position)
    return CycleResult(tuple(w8.admitted), tuple(w8.preempted), tuple(w8.pending), tuple(w8.resized))


def _in_quota_past_window(w8: "_Walk", walk: QueueWalk, limit: int, position: int, deferred: List,
                          nominated: Dict[str, Workload]) -> List[Workload]:
    """Decide, in queue order, the workloads past the window that are within their team's nominal quota, among each
    team's first ``limit`` (which every snapshot a cycle of that depth is given holds), each in the place of the last
    borrower still ``deferred`` (taken out: not reached in this cycle, so no more than ``limit`` are examined); the
    borrowers past the window are not reached either. ``walk``: where step 2 left it. Returns the borrowers taken
    out or passed over: they still wait.

    Cost: a team over its nominal quota is passed over whole; another's queue is read from its cursor to its next
    workload within quota (``_next_within``), each workload once in the step."""
    ledger, skipped = w8.ledger, []
    while walk and deferred and w8.budget > 0:
        team = walk.head()
        q, i = walk.queues[team], walk.cursor[team]
        end = min(len(q), limit)
        j = _next_within(ledger, team, q, i, end)
        if j >= end:
            walk.drop()
        elif j > i:
            skipped += q[i:j]
            walk.skip_to(j)  # its next in-quota workload may come after another team's: order by that one
        else:
            w = walk.next(end)[1]
            nominated.pop(w.id, None)
            w = _at_minimum(w)
            skipped.append(deferred.pop()[0])
            position += 1
            w8.decide(w, position, w.gang.total)
    return skipped


def _next_within(ledger, team: str, q, i: int, end: int) -> int:
    """The index of ``team``'s first workload from ``i`` on (before ``end``) that its nominal quota still holds
    (``QuotaLedger.within_nominal`` of the gang at its minimum), ``end`` when none: the room is worked out once and
    each gang compared with it, the step's inner loop."""
    lim = ledger.limits.get(team)
    if lim is None:
        return end
    used = ledger.usage.get(team, ZERO)
    room = tuple((r, nominal - getattr(used, r) + 1e-9) for r, nominal, _, _ in lim)
    if any(left < 0 for _, left in room):  # over its nominal already: none of its work is within it
        return end
    for j in range(i, end):
        g = q[j].gang
        lo = g.lo if g.max_workers is not None and q[j].cls.resizable else g.workers
        pw = g.per_worker
        for r, left in room:
            if getattr(pw, r) * lo > left:
                break
        else:
            return j
    return end


_STATE = attrgetter("state")
_IS_STOPPING = LeaseState.TERMINATING.__eq__


class _Future:
    """Capacity and quota once every terminating lease is gone, less what waiting workloads have claimed.

    ``work`` is that view (a working snapshot of its own); ``avail`` is, per node, the lesser of what is free now
    and what is free in the future: what may start now without taking anything a waiting workload has claimed.
    """

    __slots__ = ("present", "work", "cap", "ledger", "avail", "stopping", "claims")

    def __init__(self, present: Working, stopping: List[Lease]):
        self.present = present.cap
        self.work = present.copy()
        self.cap, self.ledger = self.work.cap, self.work.ledger
        self.avail = present.cap.copy()
        self.stopping: List[Lease] = []
        # What each waiting or admitted workload claimed here (its placement and the devices it took), by id, so
        # that giving a claim back returns exactly that.
        self.claims: Dict[str, Lease] = {}
        for l in stopping:
            self.release(l)

    def _sync(self, nodes) -> None:
        now, then, avail = self.present.free, self.cap.free, self.avail
        dnow, dthen = self.present.dev, self.cap.dev
        for nid in set(nodes):
            if nid in avail.free:
                a, b = now[nid], then[nid]
                dn, dt = dnow[nid], dthen[nid]
                if partial(dn) or partial(dt):
                    # Shares of GPUs: per device, what is free both now and then.
                    d = tuple(map(min, dn, dt))
                    m = Resources(round(sum(d), 9), min(a.cpu, b.cpu), min(a.memory, b.memory))
                else:
                    # Whole GPUs are interchangeable: as many as are free both now and then, on devices free now
                    # (which devices the waiting work takes later is chosen then).
                    m = Resources(min(a.gpu, b.gpu), min(a.cpu, b.cpu), min(a.memory, b.memory))
                    k, out = int(m.gpu + 1e-9), []
                    for x in dn:
                        out.append(1.0 if x == 1.0 and k > 0 else 0.0)
                        k -= x == 1.0
                    d = tuple(out)
                if m != avail.free[nid] or d != avail.dev[nid]:
                    avail.assign(nid, m, d)

    def release(self, lease: Lease) -> None:
        """``lease`` is stopping (or chosen as a victim): gone in the future."""
        self.work.remove(lease)
        self.stopping.append(lease)
        self._sync(lease.placement)

    def claim(self, w: Workload, plan: Tuple[str, ...], devices=()) -> None:
        """``w`` will hold ``plan`` (it starts now, or once what it waits for is gone): on ``devices`` when they are
        free then too (the same shares of GPUs), else on what Ray's rule picks then (whole GPUs)."""
        if devices and not self.cap.holds(plan, w.gang.per_worker, devices):
            devices = ()
        taken = self.work.take(w, plan, devices)
        self.claims[w.id] = Lease(w, plan, 0.0, devices=taken)
        self._sync(plan)

    def unclaim(self, lease: Lease) -> None:
        """Give back what ``lease``'s workload claimed here (or, admitted before this future was made from the
        present, what it took there)."""
        self.work.remove(self.claims.pop(lease.id, lease))
        self._sync(lease.placement)

    def waited_for(self, plan: Tuple[str, ...]) -> Tuple[str, ...]:
        """The stopping leases on the claimed nodes; all of them when the wait is for quota only."""
        on = set(plan)
        ids = tuple(l.id for l in self.stopping if on.intersection(l.placement))
        return ids or tuple(l.id for l in self.stopping)


class _Walk:
    """The working state of one cycle: only this changes while the cycle decides; the snapshot never does."""

    def __init__(self, snapshot: Snapshot, now: float, admission, backfill, preemption, order, stops: bool = True):
        cfg = snapshot.config
        self.snapshot, self.now, self.cfg = snapshot, now, cfg
        self.stops = stops  # whether running leases may be chosen as victims (``cycle``'s ``stops``)
        self.scale_wait = snapshot.scale_wait
        self.admission, self.backfill, self.preemption = admission, backfill, preemption
        self.cap = Capacity(snapshot.nodes)
        usage = snapshot.usage if snapshot.usage is not None else team_usage(snapshot.leases)
        self.ledger = QuotaLedger(snapshot.teams, usage, flavor_usage(snapshot.leases, snapshot.nodes, snapshot.teams)
                                  if flavored(snapshot.teams) else None)
        self._types: Optional[Tuple[str, ...]] = None  # the cluster's node types, once a flavor quota asks
        # The present: what is free and used now. Admissions change it; the holdings are changed once, by pctx.
        self.present = Working(self.cap, self.ledger)
        # (a C-speed filter: this runs over every lease, every cycle)
        self.stopping = list(compress(snapshot.leases, map(_IS_STOPPING, map(_STATE, snapshot.leases))))
        self.future: Optional[_Future] = _Future(self.present, self.stopping) if self.stopping else None
        held = dict(usage)  # what running leases hold: all usage but the stopping leases'
        for l in self.stopping:
            held[l.team] = held.get(l.team, Resources()) - l.workload.gang.total
        self.pctx = PreemptionContext(snapshot.leases, self.ledger, admission, order, cfg, now, held,
                                      snapshot.leases_by_team, snapshot.lease_order)
        if self.future is not None:
            self.pctx.ledger = self.future.ledger
        self.reservation: Optional[Reservation] = None
        self.head_position = 0  # the reserved head's position: only workloads after it in queue order must yield
        self.admitted: List[Admit] = []
        self.admitted_leases: List[Lease] = []
        self.preempted: List[Preempt] = []
        self.resized: List[Resize] = []
        self.pending: List[Pending] = []
        self.budget = cfg.max_admissions_per_cycle
        self.positions: Dict[str, int] = {}  # admitted in this cycle -> its position, should it be displaced
        # Failed preemption searches, and versions of what could make a repeat succeed: room freed anywhere
        # (victims chosen, admissions given back), a team's fresh admissions, fresh admissions of borrowing teams.
        self.failed: Dict[Tuple, Tuple[Tuple[int, int, int], object]] = {}
        self.version = 0
        self.team_version: Dict[str, int] = {}
        self.borrow_version = 0
        self.touched: set = set()  # leases shrunk or stopped in this cycle: they do not grow
        # Gang shapes with no room: (gang, data snapshot, the capacity asked) -> its ``grown`` then.
        self.no_room: Dict[Tuple, int] = {}
        # Gang shapes' reasons for no capacity: (workers, per worker, features) -> (``cap.changes`` then, reason).
        self.reasons: Dict[Tuple, Tuple[int, NoCapacity]] = {}
        # Quota answers: (ledger, team, need) -> (``ledger.changes`` then, the answer).
        self.checks: Dict[Tuple, Tuple[int, object]] = {}
        # Teams whose users are capped: team -> (the team, its cap in GPUs, GPUs per user held now and admitted in
        # this cycle). None: no team has a cap (``user_rules``).
        self.user_caps: Optional[Dict[str, Tuple[Team, float, Dict]]] = None

    def user_rules(self, ruled: List[Team]) -> HeldByUser:
        """For the teams of ``ruled`` (those with a user rule): the caps of those with ``max_share``, kept for
        ``decide``; returns what the walk asks to order a ``fair`` team's queue by its users' shares (GPUs each of
        the team's users holds now, the same book the caps count on)."""
        snap, held = self.snapshot, {}
        by_team = snap.leases_by_team

        def held_of(name: str):
            got = held.get(name)
            if got is None:
                leases = by_team.get(name, ()) if by_team is not None else [l for l in snap.leases if l.team == name]
                got = held[name] = held_by_user(leases)
            return got

        for t in ruled:
            cap = user_cap(t)
            if cap is not None:
                if self.user_caps is None:
                    self.user_caps = {}
                self.user_caps[t.name] = (t, cap, held_of(t.name))
        return held_of

    def _over_user_cap(self, w: Workload, gpus: float):
        """``UserShareExceeded`` when ``w``'s user may not take ``gpus`` more GPUs of its team, else None."""
        got = self.user_caps.get(w.team)
        if got is None:
            return None
        team, cap, held = got
        return cap_reason(team, cap, w.user, held.get(w.user, 0.0), gpus)

    def _user_holds(self, w: Workload, gpus: float) -> None:
        """``w``'s user takes (or, negative, gives back) ``gpus`` GPUs in this cycle."""
        got = self.user_caps.get(w.team)
        if got is not None:
            got[2][w.user] = got[2].get(w.user, 0.0) + gpus

    def decide(self, w: Workload, position: int, need: Resources) -> bool:
        """Admit ``w`` (which needs ``need`` in all), choose victims for it or say why it waits. True when admitted."""
        cap, future = self.cap, self.future
        # A borrower examined in the second pass may come before the reserved head in queue order: it does not
        # yield to it (it would have been decided before the head was even looked at).
        res = self.reservation if position > self.head_position else None
        if self.user_caps is not None:
            # Over its user's cap it waits whatever else is free: no victim could lift a cap.
            why = self._over_user_cap(w, need.gpu)
            if why is not None:
                self.pending.append(Pending(w, why, position))
                return False
        quota_reason = self._quota_now(w, need)
        plan = None if quota_reason is not None else self._place_now(w, need)

        if quota_reason is None and plan is not None:
            if res is not None and not self.backfill.allows(w, plan, res, self.now, self._pick(w, plan)):
                self.pending.append(Pending(w, _blocked(res), position))
                return False
            self._admit(w, plan, position)
            return True

        # a. It does not fit now. Will it fit once what is already stopping is gone (and what others waiting for
        #    that have claimed is taken)? Then it waits for them and no more victims are chosen for it.
        if future is not None:
            fplan = self._fits(w, need, future.cap, future.ledger)
            if fplan is not None:
                future.claim(w, fplan)
                self.pending.append(Pending(w, WaitingForPreemption(future.waited_for(fplan)), position))
                return False

        # b. Preemption: victims chosen (it waits for them), or only this cycle's admissions given back (it starts).
        #    Not while it waits for a node being added for it (``Snapshot.scale_wait``): a new node may give it room
        #    with nothing stopped. Quota is not capacity: a new node does not change it.
        if (res is None or quota_reason is not None) and not (
                quota_reason is None and self.scale_wait and self.scale_wait.get(w.id, 0.0) > self.now):
            outcome = self._preempt_for(w, need, position, quota_reason, res)
            if outcome is not None:
                return outcome

        # c. Blocked by quota.
        if quota_reason is not None:
            self.pending.append(Pending(w, quota_reason, position))
            return False

        # d. Blocked by capacity: the first such workload gets a reservation; later ones must respect it.
        inner = self._no_capacity(w)
        if self.reservation is None:
            self.reservation = self.backfill.reserve(w, cap, self._leases_ending(), self.now, self.cfg)
            if self.reservation is not None:
                self.head_position = position
                start = self.reservation.shadow_time
                self.pending.append(Pending(w, Reserved(start, inner) if start is not None else inner, position))
                return False
        self.pending.append(Pending(w, inner, position))
        return False

    def _no_capacity(self, w: Workload) -> NoCapacity:
        """Why ``w`` finds no room now. The same for every gang of its shape while the capacity has not changed
        (``Capacity.changes``): on a full cluster most examined workloads get the reason an earlier one got."""
        cap, g = self.cap, w.gang
        key = (g.workers, g.per_worker, g.features)
        got = self.reasons.get(key)
        if got is not None and got[0] == cap.changes:
            return got[1]
        best, best_free = cap.best_node_for(g.per_worker, g.features)
        devs = cap.dev.get(best, ()) if best is not None else ()
        inner = NoCapacity(g.workers, g.per_worker, best, best_free, cap.total_free(), devs if partial(devs) else ())
        self.reasons[key] = (cap.changes, inner)
        return inner

    def _leases_ending(self):
        """Every lease and this cycle's admissions, for the backfill policy: in expected-end order without sorting
        when the driver keeps its leases in that order (``Snapshot.lease_order``)."""
        order = self.snapshot.lease_order
        if order is None:
            return list(self.snapshot.leases) + self.admitted_leases
        return InEndOrder(order.ending(self.now, self.stopping, self.admitted_leases, self.cfg))

    def _memo_key(self, w: Workload, res):
        """(what a preemption search for ``w`` depends on, the versions of the state now, its bound), or None."""
        key_of = getattr(self.preemption, "memo_key", None)
        k = key_of(w, self.pctx) if key_of is not None else None
        if k is None:
            return None
        pkey, other_teams, bound = k
        stamp = (self.version, self.team_version.get(w.team, 0), self.borrow_version if other_teams else 0)
        return (pkey, w.team, w.gang, w.data_snapshot, res is None), stamp, bound

    def _failed_before(self, key, stamp, bound) -> bool:
        got = self.failed.get(key)
        return got is not None and got[0] == stamp and bound >= got[1]

    def _remember_failure(self, key, stamp, bound) -> None:
        got = self.failed.get(key)
        if got is None or got[0] != stamp or bound < got[1]:
            self.failed[key] = (stamp, bound)

    def _over_ceiling(self, w: Workload, need: Resources, ledger: QuotaLedger):
        """(resource, by how much) for each resource where the team would pass its quota ceiling."""
        u = ledger.usage.get(w.team, ZERO)
        return [(r, getattr(u, r) + getattr(need, r) - ceiling) for r, _, _, ceiling in ledger.limits.get(w.team, ())
                if getattr(u, r) + getattr(need, r) > ceiling + 1e-9]

    def _preempt_for(self, w: Workload, need: Resources, position: int, quota_reason, res) -> Optional[bool]:
        """Choose victims for ``w``; None when none would make it fit, else whether it was admitted at once.

        The search runs on the future's working snapshot (or the present's, when nothing is stopping), which it
        leaves as it was: victims must make room beyond what is already being made for others. Workloads admitted
        earlier in this cycle are the first candidates: giving their place back loses nothing.
        """
        future, pctx = self.future, self.pctx
        base = future.work if future is not None else self.present
        pctx.ledger = base.ledger
        memo = self._memo_key(w, res)
        if memo is not None and self._failed_before(*memo):
            return None  # failed for the same kind of workload, with nothing changed since that could help
        work = base.with_holdings(pctx.holdings)
        chosen = self._search(w, need, res, work, memo)
        if not chosen:
            return None
        if res is not None and not self._allowed_after(w, chosen, work, res):
            # Behind the reserved head and not allowed to start even once its victims are gone: stopping them
            # would only let them (ahead of it in the queue) start again, and be stopped again.
            return None
        self.version += 1
        victims = [v for v in chosen if v.id not in pctx.fresh]
        for v in chosen:
            if v.id in pctx.fresh:
                self._displace(v, w)
        if not victims:
            # Only admissions of this cycle were given back (never behind a reservation): it may start now, unless
            # it also needs what is still stopping.
            plan = self._place_now(w, need) if self._quota_now(w, need) is None else None
            if plan is not None:
                self._admit(w, plan, position)
                return True
        if future is None:
            future = self.future = _Future(self.present, [])
            pctx.ledger = future.ledger
        for v in victims:
            future.release(v)
            pctx.stop(v)
        fplan = self._fits(w, need, future.cap, future.ledger)
        future.claim(w, fplan)  # find_victims only returns a set after whose removal w fits
        # A victim is stopped whole, or (a shrink option of an elastic gang) shrinks to the size it stands for.
        stops = [v for v in victims if v.id not in pctx.shrinks]
        if stops:
            self.preempted.append(Preempt(w, tuple(v.id for v in stops), _preempt_reason(w, stops, quota_reason)))
        for v in victims:
            if v.id in pctx.shrinks:
                whole, to = pctx.shrinks[v.id]
                g = whole.workload.gang
                self.resized.append(Resize(
                    whole.workload, g.workers, to, whole.placement[:to], whole.devices[:to],
                    f"shrinks from {g.workers} to {to} workers (minimum {g.lo}) to free "
                    f"{'quota' if quota_reason is not None else 'capacity'} for {w.id} ({w.team}/{w.cls.name}, "
                    f"priority {w.cls.priority}), which needs {need}; costs less than stopping a gang"))
                self.touched.add(whole.id)
        ids = tuple(pctx.whole(v).id for v in victims)
        self.pending.append(Pending(w, WaitingForPreemption(ids or future.waited_for(fplan)), position))
        return False

    def _allowed_after(self, w: Workload, victims: List[Lease], work: Working, res: Reservation) -> bool:
        """Whether the backfill policy would let ``w`` start where it would go once ``victims`` are gone."""
        revert = work.trial_removal(victims)
        plan = place(w.gang, work.cap, w.data_snapshot)
        devices = work.cap.pick(plan, w.gang.per_worker) if plan is not None else ()
        revert()
        # On a copy: asking must not use up what the head leaves spare.
        return plan is not None and self.backfill.allows(w, plan, res.copy(), self.now, devices)

    def _search(self, w: Workload, need: Resources, res, work: Working, memo):
        """``find_victims`` over the policy's candidates, short-cut where the outcome is known to be a failure.
        ``memo``: the search's ``_memo_key``; a failure is remembered under it (most of a long queue waits on the
        same few quotas, and a search that failed for the same kind of workload, with nothing changed since that
        could make it succeed, fails again)."""
        pctx, team = self.pctx, w.team
        candidates = self.preemption.candidates(w, pctx)
        if not self.stops:
            if not pctx.fresh:
                return None
            candidates = (c for c in candidates if c.id in pctx.fresh)  # only this cycle's admissions go back
        if res is not None and pctx.fresh:
            # Behind a reservation the preemptor may not be allowed to start now; giving back an admission for it
            # could then leave both waiting.
            candidates = (c for c in candidates if c.id not in pctx.fresh)
        fcap, fledger = work.cap, work.ledger
        deficit = self._over_ceiling(w, need, fledger)
        if deficit:
            # Only its own team's victims lower what the team holds: if all of them cannot bring it under its
            # ceiling, no search can succeed; say so without trying each candidate.
            candidates = list(candidates)
            own = [c.workload.gang.total for c in candidates if c.team == team]
            if any(sum(getattr(t, r) for t in own) + 1e-9 < d for r, d in deficit):
                candidates = ()
        chosen = find_victims(w, candidates, work, pctx, lambda: self._fits(w, need, fcap, fledger) is not None)
        if not chosen and memo is not None:
            self._remember_failure(*memo)
        return chosen

    def _admit(self, w: Workload, plan: Tuple[str, ...], position: int) -> None:
        need = w.gang.total
        borrowing = self.admission.protects_in_quota and not self.ledger.within_nominal(w.team, need)
        # The devices are chosen where the plan was found (what is free now and stays free for the waiting work),
        # then taken there and in the future alike.
        devices = self.present.take(w, plan, self._pick(w, plan) if self.future is not None else ())
        if self.future is not None:
            self.future.claim(w, plan, devices)
        admit = Admit(w, plan, borrowing, devices)
        lease = Lease(w, plan, self.now, devices=devices)
        self.admitted.append(admit)
        self.admitted_leases.append(lease)
        self.positions[w.id] = position
        self.pctx.admit(lease)
        self.budget -= 1
        if self.user_caps is not None:
            self._user_holds(w, need.gpu)
        # A new candidate for its team's preemptors, and, when its team now borrows, for other teams' reclaim.
        self.team_version[w.team] = self.team_version.get(w.team, 0) + 1
        if self.pctx.team_borrows(w.team, True):
            self.borrow_version += 1

    def _displace(self, lease: Lease, by: Workload) -> None:
        """Take back an admission of this cycle: ``by`` would preempt it as soon as it started."""
        w = lease.workload
        self.admitted = [a for a in self.admitted if a.workload.id != w.id]
        self.admitted_leases = [l for l in self.admitted_leases if l.id != w.id]
        self.present.remove(lease)
        if self.future is not None:
            self.future.unclaim(lease)
        self.pctx.stop(lease)
        self.budget += 1
        if self.user_caps is not None:
            self._user_holds(w, -w.gang.total.gpu)
        self.version += 1
        self.pending.append(Pending(w, Displaced(by.id), self.positions.pop(w.id)))

    # -- elastic growth -----------------------------------------------------------------------------------------
    def grow(self, waiting_priority) -> None:
        """Grow elastic gangs into the capacity and quota left free, highest class first: this cycle's admissions
        (before they start: no restart) and running gangs that have run ``resize_interval_s`` since their last
        (re)start. Only while no workload of the gang's class priority or higher waits."""
        fresh = [(a.workload.cls.priority, 1, a.workload.submit_time, a.workload.id, a) for a in self.admitted
                 if _growable(a.workload) and len(a.placement) < a.workload.gang.hi]
        now, interval = self.now, self.cfg.resize_interval_s
        order = self.snapshot.lease_order  # the elastic gangs only, when the driver keeps them apart
        running = [(l.workload.cls.priority, 0, l.start_time, l.id, l)
                   for l in (order.elastic if order is not None else self.snapshot.leases)
                   if l.workload.gang.max_workers is not None and l.state is LeaseState.RUNNING
                   and _growable(l.workload) and l.workload.gang.workers < l.workload.gang.hi
                   and now - l.start_time >= interval and l.id not in self.touched] if self.cfg.resize_running else []
        if not fresh and not running:
            return
        bar = waiting_priority()
        for prio, _, _, _, item in sorted(fresh + running, key=lambda e: (-e[0], e[1], e[2], e[3])):
            if self.budget <= 0:
                return
            if bar is not None and prio <= bar:
                continue
            if isinstance(item, Admit):
                self._grow_admission(item)
            else:
                self._grow_lease(item)

    def _extra(self, w: Workload, have: Tuple[str, ...]):
        """The most workers ``w`` (now on ``have``) can add up to its maximum: (how many, where, their devices)."""
        cap = self.future.avail if self.future is not None else self.cap
        g = w.gang
        # The new workers beside the ones it has where they fit (the strategy decides otherwise).
        prefer = tuple(dict.fromkeys(have))
        for k in range(g.hi - len(have), 0, -1):
            if self._quota_now(w, g.per_worker.scale(k)) is not None:
                continue
            if self.user_caps is not None and self._over_user_cap(w, g.per_worker.gpu * k) is not None:
                continue
            gk = g.at(k)
            if w.team in self.ledger.flimits:
                gk = self._flavored(replace(w, gang=gk), self._ledgers_now(), g.per_worker.gpu * k)[0].gang
            plan = place(replace(gk, prefer=prefer), cap, w.data_snapshot)
            if plan is not None:
                return k, plan, cap.pick(plan, g.per_worker)
        return 0, (), ()

    def _take_more(self, w: Workload, k: int, plan, devices):
        part = _at_size(w, k)
        devices = self.present.take(part, plan, devices)
        if self.user_caps is not None:
            self._user_holds(w, part.gang.total.gpu)
        if self.future is not None:
            self.future.claim(part, plan, devices)
        self.budget -= 1
        return devices

    def _grow_admission(self, a: Admit) -> None:
        k, plan, devices = self._extra(a.workload, a.placement)
        if not k:
            return
        devices = self._take_more(a.workload, k, plan, devices)
        w2 = _at_size(a.workload, len(a.placement) + k)
        i = next(i for i, x in enumerate(self.admitted) if x is a)
        self.admitted[i] = Admit(w2, a.placement + tuple(plan), a.borrowing, a.devices + tuple(devices))
        self.admitted_leases = [Lease(w2, self.admitted[i].placement, self.now, devices=self.admitted[i].devices)
                                if l.id == w2.id else l for l in self.admitted_leases]

    def _grow_lease(self, lease: Lease) -> None:
        w = lease.workload
        k, plan, devices = self._extra(w, lease.placement)
        if not k:
            return
        devices = self._take_more(w, k, plan, devices)
        to = w.gang.workers + k
        self.resized.append(Resize(
            w, w.gang.workers, to, lease.placement + tuple(plan),
            lease.devices + tuple(devices) if lease.devices else (),
            f"grows from {w.gang.workers} to {to} workers (maximum {w.gang.hi}) into free capacity: no workload "
            f"of priority {w.cls.priority} or higher waits"))
        self.touched.add(lease.id)

    def _quota_now(self, w: Workload, need: Resources):
        reason = self._check(self.ledger, w.team, need)
        if reason is None and self.future is not None:
            # What waiting workloads have claimed of the future is spoken for: starting now must not take it, or
            # they would have to preempt again once their victims are gone.
            reason = self._check(self.future.ledger, w.team, need)
        if reason is None and w.team in self.ledger.flimits:
            reason = self._flavored(w, self._ledgers_now(), need.gpu)[1]
        return reason

    def _ledgers_now(self) -> Tuple[QuotaLedger, ...]:
        return (self.ledger,) if self.future is None else (self.ledger, self.future.ledger)

    def _flavored(self, w: Workload, ledgers, need_gpu: float):
        """``flavors.restrict``: ``w`` kept to the node types its team's flavor quotas have room for on ``ledgers``,
        and the reason when there is none."""
        if self._types is None:
            self._types = tuple(sorted({n.node_type for n in self.cap.nodes.values()}
                                       | self.snapshot.growable_types))
        return restrict(ledgers, w, need_gpu, self._types)

    def _check(self, ledger: QuotaLedger, team: str, need: Resources):
        """The admission policy's answer for ``team`` taking ``need`` more on ``ledger``: the same as last time it
        was asked while the ledger has not changed since (``QuotaLedger.changes``; most of a long queue asks for
        the same few teams and sizes between two admissions)."""
        key = (ledger, team, need)  # (a QuotaLedger hashes by identity)
        got = self.checks.get(key)
        if got is not None and got[0] == ledger.changes:
            return got[1]
        reason = self.admission.check(ledger, team, need)
        self.checks[key] = (ledger.changes, reason)
        return reason

    def _pick(self, w: Workload, plan: Tuple[str, ...]):
        """The devices each worker of ``plan`` takes if it starts now (Ray's rule, where the plan was found)."""
        return (self.future.avail if self.future is not None else self.cap).pick(plan, w.gang.per_worker)

    def _place_now(self, w: Workload, need: Resources) -> Optional[Tuple[str, ...]]:
        """Where ``w`` (which takes ``need``) starts now, or None."""
        if w.team in self.ledger.flimits:
            w = self._flavored(w, self._ledgers_now(), need.gpu)[0]
        return self._room(w, self.future.avail if self.future is not None else self.cap)

    def _room(self, w: Workload, cap: Capacity) -> Optional[Tuple[str, ...]]:
        """``place`` on ``cap``. A gang of the same shape that found no room on the same capacity, with nothing
        given back there since (``Capacity.grown``), finds none again: on a full cluster with thousands waiting,
        most examined workloads ask what an earlier one of their shape was told."""
        key = (w.gang, w.data_snapshot, cap)  # (a Capacity hashes by identity)
        seen = self.no_room.get(key)
        if seen is not None and seen == cap.grown:
            return None
        plan = place(w.gang, cap, w.data_snapshot)
        if plan is None:
            self.no_room[key] = cap.grown
        return plan

    def _fits(self, w: Workload, need: Resources, cap: Capacity, ledger: QuotaLedger) -> Optional[Tuple[str, ...]]:
        if self._check(ledger, w.team, need) is not None:
            return None
        if w.team in ledger.flimits:
            w, why = self._flavored(w, (ledger,), need.gpu)
            if why is not None:
                return None
        return self._room(w, cap)


def _growable(w: Workload) -> bool:
    return w.cls.resizable and w.gang.max_workers is not None and w.gang.elastic


def _at_minimum(w: Workload) -> Workload:
    """An elastic gang as it is admitted: at its minimum (it grows when nothing waits)."""
    if w.gang.max_workers is not None and w.cls.resizable and w.gang.workers != w.gang.lo:
        return _at_size(w, w.gang.lo)
    return w


def _at_size(w: Workload, n: int) -> Workload:
    """``w`` with its gang at ``n`` workers (bounds kept)."""
    return w if n == w.gang.workers else replace(w, gang=w.gang.at(n))


def _blocked(res: Reservation):
    if res.shadow_time is None:
        return BehindHead(res.head)
    return BlockedByReservation(res.head, res.shadow_time)


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
    why = gpu_request_error(w.gang.per_worker.gpu)
    if why is not None:
        return Infeasible("gang.per_worker.gpu", f"{w.gang.per_worker.gpu:g} GPUs per worker; allowed: {why}")
    cap = user_cap(teams[w.team]) if w.team in teams else None
    if cap is not None and w.gang.total.gpu > cap + 1e-9:
        return Infeasible("gang", f"needs {w.gang.total.gpu:g} GPUs in all but a user of team {w.team} may hold at "
                          f"most {cap:g} (users.max_share {teams[w.team].users.max_share:g} of its nominal GPUs)")
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
        if teams[w.team].flavors:
            types = {n.node_type for n in nodes}
            _, why = restrict((ledger,), w, w.gang.total.gpu, types)
            if why is not None:
                where = "node type " + ", ".join((why.flavor,) + why.also)
                return Infeasible(
                    "gang.node_types" if w.gang.node_types else "gang",
                    f"needs {why.needed:g} GPU in all but team {w.team}'s flavor quotas let it hold at most "
                    f"{why.nominal + why.borrowable:g} on {where} (teams.{w.team}.flavors) of the node types it may "
                    f"use ({', '.join(w.gang.node_types or sorted(types))})")
    empty = [Node(n.id, n.capacity, n.capacity, n.features, n.labels, n.node_type, n.datasets) for n in nodes]
    missing = set(w.gang.features) - set().union(*(n.features for n in empty)) if empty else set(w.gang.features)
    if missing:
        return Infeasible("gang.features", f"no node has {', '.join(sorted(missing))}")
    if w.gang.node_types and not {n.node_type for n in empty} & set(w.gang.node_types):
        there = sorted({n.node_type for n in empty if n.node_type})
        return Infeasible("gang.node_types", f"no node of node type {', '.join(w.gang.node_types)}; the node types "
                                             f"there are: {', '.join(there) or '(none)'}")
    if w.gang.spot == "never" and empty and all(n.labels.get(SPOT_LABEL) == "true" for n in empty):
        return Infeasible("class.spot", "its class never runs on spot nodes, and every node is a spot node")
    cap = Capacity(empty)
    if place(w.gang, cap, w.data_snapshot) is None:
        best, free = cap.best_node_for(w.gang.per_worker, w.gang.features)
        largest = f"largest matching node {best} has {free}" if best else "no node matches"
        return Infeasible("gang", f"{w.gang.workers} x ({w.gang.per_worker}) with strategy {w.gang.strategy} "
                          f"and features [{', '.join(sorted(w.gang.features))}] fits no set of nodes; {largest}")
    return None
