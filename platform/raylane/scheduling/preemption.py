"""The preemption axis: which running leases may be stopped to make room for a waiting workload, and which are.

A preemption policy only *nominates* candidates, cheapest first. ``find_victims`` (shared by every policy) searches
them on the cycle's working snapshot (``raylane.scheduling.working``): it removes candidates until the preemptor
fits (its quota and a placement of its whole gang), then adds back every victim that turns out not to be needed, so
the set is small, and reverts the lot. Nothing is chosen unless the preemptor then fits. The snapshot is never
changed.

Rules every policy keeps (enforced here, not by each policy):
- non-preemptible work is never a candidate; neither is work younger than its class's minimum runtime, nor a lease
  that is already terminating;
- another team's work is touched only while that team's running leases hold more than its nominal quota, when the
  admission policy protects in-quota work (``PreemptionContext.protected``); with cohorts, only while each cohort
  between that team and the lowest cohort it shares with the preemptor's team holds more than its subtree's nominal
  quota too: a borrowing that stays inside another cohort is that cohort's business (``reclaimable``).

Policies: ``default`` (Kueue-like: within a team a higher class preempts a lower one, and work of equal priority
takes back what the team's elastic gangs of that priority grew into, by shrinking them, never by stopping them; a team
that stays within its nominal quota reclaims what others borrowed), ``ordering`` (any lease that ranks after the
preemptor under the ordering policy: LAS demotion, SRTF; but none (re)started too recently for the config's hysteresis,
``settled_after``, so that no workload is stopped over and over), ``none``.

Cost of a victim, smallest first (``VICTIM_COSTS``, chosen by the config's ``victim_cost``): class priority, then,
under ``lost_work`` (the default), the GPU-seconds of work since its last checkpoint, or since its start when it has
none (what a stop loses: a lease that just checkpointed is the cheap one), then the most recently started; under
``recency`` (Kueue's order, the baseline it is measured against) the most recently started, checkpoints ignored;
under ``remaining`` the longest predicted remaining time first (runtimes learned from history), then as
``lost_work``.
Cheaper than any of them: a workload admitted earlier in the same cycle (*fresh*), which has not started; the cycle
gives its place back (``Displaced``) instead of stopping it next cycle. The cost orders the ``default`` policy's
candidates and, for every policy, which victims ``find_victims`` gives back (the most expensive first), so the set
chosen is the cheapest the search finds that frees enough.
"""
from __future__ import annotations

import bisect
import heapq
import itertools
from dataclasses import replace
from typing import Callable, Dict, Iterable, List, Mapping, Optional, Protocol, Sequence, Tuple

from raylane.scheduling.admission import AdmissionPolicy, QuotaLedger
from raylane.scheduling.cohorts import crosses
from raylane.scheduling.working import Holdings, Working
from raylane.scheduling.registry import Registry
from raylane.scheduling.types import Lease, LeaseState, Resources, SchedulerConfig, Workload


class PreemptionContext:
    """What a preemption policy may read: leases, the ledger, the admission and ordering policies, ``now``.

    ``ledger`` is the quota as it will be once what is already stopping is gone. *Fresh* leases are workloads
    admitted earlier in this cycle, not started yet: displacing one loses nothing, so ``cost`` puts them before any
    running lease. ``held`` and ``fresh_held`` (per team) count running leases not chosen as victims, and fresh ones;
    they decide whether another team's work is in quota. Per-team candidate lists and costs are computed once per
    cycle, on first use, so that a cycle with many preemption attempts over thousands of leases stays short.
    """

    def __init__(self, leases: Sequence[Lease], ledger: QuotaLedger, admission: AdmissionPolicy, ordering,
                 cfg: SchedulerConfig, now: float, held: Optional[Dict[str, Resources]] = None,
                 leases_by_team: Optional[Mapping[str, Sequence[Lease]]] = None, lease_order=None):
        self.leases = leases
        self.ledger = ledger
        self.admission = admission
        self.ordering = ordering
        self.cfg = cfg
        self.now = now
        # What each team's running and fresh leases hold; changed with the cycle's working view (find_victims).
        self.holdings = Holdings(leases, held)
        self.fresh: Dict[str, Lease] = self.holdings.fresh_leases  # the same dict: read on every candidate
        self.fresh_by_team: Dict[str, List[Lease]] = {}
        self._grouped = leases_by_team
        self._by_class: Dict[str, Dict[int, List[Lease]]] = {}  # team -> class priority -> leases
        self._unsorted: set = set()  # (team, class priority) lists not sorted yet
        self._cost: Dict[str, Tuple] = {}
        self._victim_key = VICTIM_COSTS.get(cfg.victim_cost).key
        # ``ranked`` lists, all and settled only (see ``ranked``); the driver's lease order, when it keeps one.
        self._ranked: Dict[bool, List[Tuple[Tuple, Lease]]] = {}
        self._order = lease_order
        # Shrink options of running elastic gangs (see ``shrink_option``): option id -> (the whole lease, its size
        # after the shrink); and each whole lease's option down to its minimum.
        self.shrinks: Dict[str, Tuple[Lease, int]] = {}
        self._shrink_of: Dict[str, Lease] = {}
        self._options: Dict[str, Lease] = {}

    # -- candidates ------------------------------------------------------------------------------------------
    def teams(self) -> Iterable[str]:
        """Teams that hold leases."""
        if self._grouped is None:
            grouped: Dict[str, List[Lease]] = {}
            for l in self.leases:
                grouped.setdefault(l.team, []).append(l)
            self._grouped = grouped
        return self._grouped.keys()

    def team_eligible(self, team: str) -> List[Lease]:
        """The team's running, preemptible leases past their minimum runtime (computed once per cycle)."""
        return [l for ls in self._classes(team).values() for l in ls]

    def _classes(self, team: str) -> Dict[int, List[Lease]]:
        """The team's eligible leases by class priority, ascending (grouped once per cycle, sorted when read)."""
        classes = self._by_class.get(team)
        if classes is None:
            self.teams()
            now, classes = self.now, {}
            for l in self._grouped.get(team, ()):
                c = l.workload.cls
                if l.state is LeaseState.RUNNING and c.preemptible and now - l.start_time >= c.min_runtime_s:
                    ls = classes.setdefault(c.priority, [])
                    ls.append(l)
                    if c.resizable and l.workload.gang.workers > l.workload.gang.lo and self.cfg.resize_running:
                        ls.append(self.shrink_option(l, l.workload.gang.lo))
            classes = self._by_class[team] = dict(sorted(classes.items()))
            self._unsorted.update((team, p) for p in classes)
        return classes

    def team_candidates(self, team: str, below: Optional[int] = None) -> Iterable[Lease]:
        """The team's eligible running leases, cheapest first; only classes of priority below ``below`` if given.

        Lazy: the cost starts with the class priority, so the classes in ascending priority, one after the other,
        are in cost order, and a class is sorted (once per cycle) only when the search gets to it.
        """
        for prio, ls in self._classes(team).items():
            if below is not None and prio >= below:
                return
            if (team, prio) in self._unsorted:
                ls.sort(key=self.cost)
                self._unsorted.discard((team, prio))
            yield from ls

    def team_shrinks(self, team: str, prio: int) -> Iterable[Lease]:
        """The shrink options (to their minimum) of the team's eligible elastic gangs of class priority ``prio``,
        cheapest first; never a whole lease. Lazy, like ``team_candidates``, whose class list it reads."""
        ls = self._classes(team).get(prio)
        if not ls:
            return
        if (team, prio) in self._unsorted:
            ls.sort(key=self.cost)
            self._unsorted.discard((team, prio))
        shrinks = self.shrinks
        yield from (l for l in ls if l.id in shrinks)

    def by_team(self) -> Dict[str, List[Lease]]:
        return {t: self.team_eligible(t) for t in list(self.teams())}

    def eligible(self) -> List[Lease]:
        """Every running candidate, then the fresh ones."""
        out = [l for ls in self.by_team().values() for l in ls]
        return out + [l for l in self.fresh.values() if l.workload.cls.preemptible]

    def cost(self, lease: Lease) -> Tuple:
        """The config's victim cost (``VICTIM_COSTS``), fresh leases first; cached for the cycle. A shrink option
        costs less than stopping any lease of its class: the gang saves a checkpoint and goes on with fewer workers,
        nothing is lost."""
        c = self._cost.get(lease.id)
        if c is None:
            if lease.id in self.shrinks:
                c = (True, lease.workload.cls.priority, _SHRINK, -lease.start_time, lease.id)
            else:
                c = (lease.id not in self.fresh,) + self._victim_key(lease, self.now)
            self._cost[lease.id] = c
        return c

    # -- elastic gangs: shrinking as a preemption option -------------------------------------------------------
    def shrink_option(self, lease: Lease, to: int) -> Lease:
        """The part of running elastic ``lease`` that a shrink to ``to`` workers stops (its last workers), as a
        candidate of its own: removing it frees exactly what the shrink frees, and its id is its own."""
        oid = f"{lease.id}/shrink-to-{to}"
        got = self.shrinks.get(oid)
        if got is not None:
            return self._options[oid]
        w = lease.workload
        part = replace(w, id=oid, gang=w.gang.at(w.gang.workers - to))
        opt = Lease(part, lease.placement[to:], lease.start_time, lease.last_checkpoint_time, lease.state,
                    lease.devices[to:] if lease.devices else ())
        self.shrinks[oid] = (lease, to)
        self._options[oid] = opt
        if to == w.gang.lo:
            self._shrink_of[lease.id] = opt
        return opt

    def shrink_of(self, lease: Lease) -> Optional[Lease]:
        """``lease``'s option to shrink to its minimum, when it has one."""
        return self._shrink_of.get(lease.id)

    def whole(self, lease: Lease) -> Lease:
        """The lease a candidate stands for: itself, or the gang a shrink option shrinks."""
        got = self.shrinks.get(lease.id)
        return lease if got is None else got[0]

    def ranked(self, settled: bool = False) -> List[Tuple[Tuple, Lease]]:
        """Running candidates (and their shrink options) with their rank under the ordering policy, ascending; a
        shrink option has its gang's rank. ``settled``: only those the hysteresis lets the ``ordering`` policy stop
        (``settled_after``). Once per cycle each. When the driver keeps its leases in settle order
        (``Snapshot.lease_order``) only the settled ones are read: a cycle does not rank thousands of leases that
        have all (re)started within the hour."""
        got = self._ranked.get(settled)
        if got is None:
            rank, cfg, now, running = self.ordering.rank, self.cfg, self.now, LeaseState.RUNNING
            pool = self._order.settled(now) if settled and self._order is not None else self.leases
            shrink = cfg.resize_running
            got = []
            for l in pool:
                w = l.workload
                c = w.cls
                if l.state is not running or not c.preemptible or now - l.start_time < c.min_runtime_s:
                    continue
                r = rank(w, self.attained(l), cfg)
                if not settled or now >= settled_after(l, cfg):
                    got.append((r, l))
                if shrink and c.resizable and w.gang.workers > w.gang.lo:
                    o = self.shrink_option(l, w.gang.lo)
                    if not settled or now >= settled_after(o, cfg):
                        got.append((r, o))
            got.sort(key=_rank_of)  # stable: a gang before its shrink option
            self._ranked[settled] = got
        return got

    def attained(self, lease: Lease) -> float:
        return lease.workload.attained_gpu_s + max(0.0, self.now - lease.start_time) * lease.workload.gang.total.gpu

    # -- who holds what ----------------------------------------------------------------------------------------
    def team_borrows(self, team: str, with_fresh: bool = False) -> bool:
        """Whether the team holds more than its nominal quota: by its running leases (and fresh ones, if asked).
        A team with no quota entry, or not known, never borrows. A team with flavor quotas also borrows while it
        holds more than the nominal of one of them (by the ledger: ``raylane.scheduling.flavors``), so its work
        can be reclaimed by a team whose flavor quota it took; a search keeps only victims that free that flavor."""
        t = self.ledger.teams.get(team)
        if t is None:
            return False
        u = self.holdings.of(team, with_fresh)
        if any(u.get(r) > q.nominal + 1e-9 for r, q in t.quotas.items()):
            return True
        lim = self.ledger.flimits.get(team)
        return lim is not None and any(self.ledger.flavor_used(team, k) > q[0] + 1e-9 for k, q in lim.items())

    def reclaimable(self, team: str, preemptor_team: str, with_fresh: bool = False) -> bool:
        """Whether ``preemptor_team`` may reclaim from ``team``: ``team`` borrows (``team_borrows``) and, under a
        cohort tree, its borrowing of some resource crosses every cohort boundary up to the lowest cohort the two
        share (``cohorts.crosses``). For a flat policy, ``team_borrows``."""
        tree = self.ledger.tree
        if tree is None or not tree.below_common(team, preemptor_team):
            return self.team_borrows(team, with_fresh)
        t = self.ledger.teams.get(team)
        if t is None:
            return False
        held = self.holdings.of
        u = held(team, with_fresh)
        over = [r for r, q in t.quotas.items() if u.get(r) > q.nominal + 1e-9]
        return bool(over) and crosses(tree, team, preemptor_team, over, lambda x: held(x, with_fresh))

    def tier(self, team: str, preemptor_team: str) -> int:
        """How far ``team`` is from the preemptor's in the cohort tree (``CohortTree.distance``; 0 for a flat
        policy): reclaim takes from the nearest borrowers first, as lending lends the nearest quota first."""
        tree = self.ledger.tree
        return 0 if tree is None else tree.distance(preemptor_team, team)

    def borrowed(self, lease: Lease) -> bool:
        """Whether ``lease``'s team borrows; for a fresh lease, counting the team's fresh admissions too."""
        return self.team_borrows(lease.team, lease.id in self.fresh)

    def protects(self) -> bool:
        """Whether other teams' in-quota work is protected (by the admission policy)."""
        return self.admission.protects_in_quota

    def protected(self, lease: Lease, preemptor: Workload) -> bool:
        """Another team's lease while that team is within its nominal quota, when the admission policy protects
        in-quota work. For a running lease the team's running work counts: what it was admitted in this cycle does
        not make it look borrowing (the fresh admissions are displaced first). For a fresh one, that counts too."""
        if not self.admission.protects_in_quota or lease.team == preemptor.team:
            return False
        if self.ledger.tree is not None:
            return not self.reclaimable(lease.team, preemptor.team, lease.id in self.fresh)
        return not self.borrowed(lease)

    # -- changes made by the cycle -----------------------------------------------------------------------------
    def admit(self, lease: Lease) -> None:
        """``lease`` was admitted in this cycle: a fresh candidate from now on."""
        self.holdings.admit(lease)
        self.fresh_by_team.setdefault(lease.team, []).append(lease)
        self._cost.pop(lease.id, None)

    def stop(self, lease: Lease) -> None:
        """``lease`` was chosen as a victim or displaced in this cycle (or, a shrink option, its gang shrinks): no
        candidate any more, nor is the gang it belongs to, and it holds nothing."""
        was_fresh = lease.id in self.fresh
        self.holdings.stop(lease)
        if was_fresh:
            self.fresh_by_team[lease.team].remove(lease)
            return
        whole = self.whole(lease)
        gone = {whole.id} | {oid for oid, (l, _) in self.shrinks.items() if l.id == whole.id}
        ls = self._by_class.get(lease.team, {}).get(lease.workload.cls.priority)
        if ls is not None:
            ls[:] = [l for l in ls if l.id not in gone]
        for k, ranked in self._ranked.items():
            self._ranked[k] = [e for e in ranked if e[1].id not in gone]


def _rank_of(entry):
    return entry[0]


# A shrink option's place after its class priority: before any stop of its class, under every victim cost.
_SHRINK = float("-inf")


class VictimCost(Protocol):
    """How much stopping a running lease costs, as a sort key: smaller is cheaper.

    Contract: the key starts with the lease's class priority (``PreemptionContext.team_candidates`` reads the classes
    in ascending priority, lazily, and a shrink option goes right after it), ends with the lease id (a total order,
    the same on every run), and reads nothing but the lease and ``now``."""

    def key(self, lease: Lease, now: float) -> Tuple: ...


VICTIM_COSTS: Registry[VictimCost] = Registry("victim cost", default="lost_work")


@VICTIM_COSTS.register("lost_work")
class LostWork:
    """Class priority, then the GPU-seconds a stop loses (since the last checkpoint, or since the start when there is
    none or it is older than this start), then the most recently started."""

    def key(self, lease, now):
        w = lease.workload
        gpus = max(w.gang.per_worker.gpu * w.gang.workers, 1e-3)
        return (w.cls.priority, lease.progress_at_risk_s(now) * gpus, -lease.start_time, lease.id)


@VICTIM_COSTS.register("recency")
class Recency:
    """Kueue's order: class priority, then the most recently started; checkpoints ignored."""

    def key(self, lease, now):
        return (lease.workload.cls.priority, -lease.start_time, lease.id)


@VICTIM_COSTS.register("remaining")
class Remaining:
    """Class priority, then the longest predicted remaining time first (``Workload.predicted``, given the service it
    has had by ``now``: what would end last goes, as shortest-remaining-first would have it), then as ``lost_work``.
    A lease with no prediction ranks after every predicted one of its class, by ``lost_work``."""

    def key(self, lease, now):
        w = lease.workload
        gpus = max(w.gang.per_worker.gpu * w.gang.workers, 1e-3)
        p = w.predicted
        left = -p.remaining(w.ran_s + max(0.0, now - lease.start_time)) if p is not None else 0.0
        return (w.cls.priority, left, lease.progress_at_risk_s(now) * gpus, -lease.start_time, lease.id)


def victim_cost(lease: Lease, now: float, kind: str = "lost_work") -> Tuple:
    """The cost of stopping ``lease`` at ``now`` under the victim cost named ``kind``; smaller is cheaper."""
    return VICTIM_COSTS.get(kind).key(lease, now)


class PreemptionPolicy(Protocol):
    def candidates(self, preemptor: Workload, ctx: PreemptionContext) -> Iterable[Lease]:
        """Leases that may be preempted for ``preemptor``, cheapest first, fresh ones (``ctx.fresh``) before any
        running one; may be lazy, as ``find_victims`` usually needs only the first few. Must not change ``ctx``."""

    # Optional: ``memo_key(preemptor, ctx) -> (key, reads_other_teams, bound) | None``, so that the cycle does not
    # repeat a search that cannot succeed. Contract: for two preemptors of one team, gang and data with equal keys,
    # while nothing changes, the one with the greater (or equal) ``bound`` gets a subset of the other's candidates.
    # ``reads_other_teams``: the candidates may include other teams' leases. None: always search.


PREEMPTIONS: Registry[PreemptionPolicy] = Registry("preemption", default="default")


@PREEMPTIONS.register("default")
class DefaultPreemption:
    def memo_key(self, preemptor, ctx):
        """Whether it reclaims (then other teams' leases count); a lower class gets a subset of the candidates.

        Still so with the shrink options of the preemptor's own priority: a preemptor of priority p gets classes
        below p whole and the shrinks of class p; one of priority q > p gets class p whole (its shrink options
        included) among the classes below q. Equal priorities get equal candidates."""
        reclaim = ctx.ledger.within_nominal(preemptor.team, preemptor.gang.total)
        return reclaim, reclaim, -preemptor.cls.priority

    def candidates(self, preemptor, ctx):
        team, prio = preemptor.team, preemptor.cls.priority
        reclaim = ctx.ledger.within_nominal(team, preemptor.gang.total)
        # Within the team: its lower classes; then what its elastic gangs of the preemptor's own priority grew into
        # (their shrink options only). Growth is opportunistic, taken while nothing of that priority waited: work
        # of equal priority that arrives later takes it back rather than wait for the whole gang to end, but never
        # stops such a gang (its whole lease is no candidate, so find_victims cannot turn the shrink into a stop).
        # A shrink option costs more than any stop of a lower class (cost is class first), so chaining keeps the
        # stream cheapest first, and lazy.
        streams = [itertools.chain(ctx.team_candidates(team, below=prio), ctx.team_shrinks(team, prio))]
        fresh = [l for l in ctx.fresh_by_team.get(team, ())
                 if l.workload.cls.preemptible and l.workload.cls.priority < prio]
        # Reclaim takes only from teams that borrow, whatever the admission policy: two teams both under their
        # nominal quota would otherwise take the same GPUs from each other in turn.
        if reclaim and ctx.ledger.tree is not None:
            return self._reclaim_in_tree(team, streams[0], fresh, ctx)
        if reclaim:
            streams += [ctx.team_candidates(t) for t in ctx.teams() if t != team and ctx.team_borrows(t)]
            fresh += [l for t, ls in ctx.fresh_by_team.items() if t != team and ls and ctx.team_borrows(t, True)
                      for l in ls if l.workload.cls.preemptible]
        if not fresh and len(streams) == 1:
            return streams[0]  # lazy: find_victims usually needs only the first few
        fresh.sort(key=ctx.cost)
        return itertools.chain(fresh, heapq.merge(*streams, key=ctx.cost))

    @staticmethod
    def _reclaim_in_tree(team, own, fresh, ctx):
        """Reclaim under a cohort tree: the nearest borrowers first (``ctx.tier``: those under the team's own
        cohort, then under its parent's, ...), each tier cheapest first, the team's own candidates in the first;
        fresh admissions before any running lease, in the same order. Only teams ``ctx.reclaimable`` by it."""
        tiers: Dict[int, List] = {0: [own]}
        for t in ctx.teams():
            if t != team and ctx.reclaimable(t, team):
                tiers.setdefault(ctx.tier(t, team), []).append(ctx.team_candidates(t))
        fresh += [l for t, ls in ctx.fresh_by_team.items() if t != team and ls and ctx.reclaimable(t, team, True)
                  for l in ls if l.workload.cls.preemptible]
        fresh.sort(key=lambda l: (ctx.tier(l.team, team), ctx.cost(l)))
        return itertools.chain(fresh, *(heapq.merge(*tiers[k], key=ctx.cost) for k in sorted(tiers)))


@PREEMPTIONS.register("ordering")
class OrderingPreemption:
    # Ranks only the leases its hysteresis lets go, read in settle order when a driver keeps it (``ranked``).
    reads_lease_order = True

    def memo_key(self, preemptor, ctx):
        """A preemptor that ranks later gets a subset of the candidates."""
        return None, True, ctx.ordering.rank(preemptor, preemptor.attained_gpu_s, ctx.cfg)

    def candidates(self, preemptor, ctx):
        rank, cfg = ctx.ordering.rank, ctx.cfg
        mine = rank(preemptor, preemptor.attained_gpu_s, cfg)
        # Hysteresis: a lease (re)started too recently is not stopped again by the ordering (see settled_after).
        ranked = ctx.ranked(settled=cfg.hysteresis_min_run_s > 0 or cfg.hysteresis_service_fraction > 0)
        after = bisect.bisect_right(ranked, mine, key=_rank_of)
        fresh = [(rank(l.workload, ctx.attained(l), cfg), l) for l in ctx.fresh.values()
                 if l.workload.cls.preemptible]
        fresh = sorted((e for e in fresh if e[0] > mine), key=lambda e: e[0], reverse=True)
        # Leases of teams that are within their quota now stay protected throughout the search (a search only
        # takes away): leave them out rather than have find_victims step over each.
        team = preemptor.team
        open_ = {t: t == team or not ctx.protects() or ctx.reclaimable(t, team) for t in ctx.teams()}
        # The worst-ranked go first: under LAS the most-served, under SRTF the longest remaining.
        return itertools.chain((l for _, l in fresh),
                               (ranked[i][1] for i in range(len(ranked) - 1, after - 1, -1)
                                if open_[ranked[i][1].team]))


def settled_after(lease: Lease, cfg: SchedulerConfig) -> float:
    """The instant from which the ``ordering`` policy may nominate a running ``lease`` (its hysteresis): its last
    (re)start plus max(``hysteresis_min_run_s``, ``hysteresis_service_fraction`` x the wall time it had run before
    that start, i.e. its attained GPU-seconds over its GPUs). A floor of one hour bounds every job to one
    ordering-driven preemption per hour it runs; the fraction lets a job that ran long keep its GPUs longer each
    time it gets them back, so long jobs are not stopped over and over by a stream of short arrivals."""
    w = lease.workload
    gpus = w.gang.total.gpu
    ran_before = w.attained_gpu_s / gpus if gpus > 0 else 0.0
    return lease.start_time + max(cfg.hysteresis_min_run_s, cfg.hysteresis_service_fraction * ran_before)


@PREEMPTIONS.register("none")
class NoPreemption:
    def candidates(self, preemptor, ctx):
        return []


def find_victims(
    preemptor: Workload,
    candidates: Iterable[Lease],
    work: Working,
    ctx: PreemptionContext,
    fits: Callable[[], bool],
) -> Optional[List[Lease]]:
    """Smallest prefix-then-pruned set of ``candidates`` after whose removal ``fits()`` holds, or None.

    Runs on ``work`` (capacity, ledger and the context's holdings, which ``fits`` and ``ctx`` read), removing and
    adding candidates, and leaves it exactly as it was.
    """
    revert = work.checkpoint()
    removed: List[Lease] = []
    found = False
    now, fresh, shrinks = ctx.now, ctx.fresh, ctx.shrinks
    for lease in candidates:
        c = lease.workload.cls
        if not c.preemptible or lease.id not in fresh and (
                lease.state is not LeaseState.RUNNING or now - lease.start_time < c.min_runtime_s):
            continue  # the rules of every policy, whatever a policy nominates
        if ctx.protected(lease, preemptor):
            continue  # that team is (back) within its quota: its remaining work is protected
        if lease.id in shrinks and shrinks[lease.id][0] in removed:
            continue  # the whole gang is out already
        opt = ctx.shrink_of(lease)
        if opt is not None and opt in removed:
            # Shrinking it was not enough: it stops whole (its place in the cost order), not on top of the shrink.
            work.add(opt)
            removed.remove(opt)
        work.remove(lease)
        removed.append(lease)
        if fits():
            found = True
            break
    if found:
        # Fill back: return every victim the preemptor can do without, most expensive first (running before fresh);
        # a whole elastic gang that need not stop may only shrink.
        for lease in sorted(removed, key=ctx.cost, reverse=True):
            work.add(lease)
            if fits():
                removed.remove(lease)
                continue
            opt = ctx.shrink_of(lease)
            if opt is not None:
                work.remove(opt)
                if fits():
                    removed[removed.index(lease)] = opt
                    continue
                work.add(opt)
            work.remove(lease)
        # Each shrink stops as few workers as the preemptor needs: the largest size that still lets it fit.
        for i, lease in enumerate(removed):
            got = shrinks.get(lease.id)
            if got is None:
                continue
            whole, to = got
            for size in range(whole.workload.gang.workers - 1, to, -1):
                opt = ctx.shrink_option(whole, size)
                work.add(lease)
                work.remove(opt)
                if fits():
                    removed[i] = opt
                    break
                work.add(opt)
                work.remove(lease)
    revert()
    return removed if found else None
