"""Conformance: invariants every registered policy keeps, on every axis, on small random clusters and queues.

Each scenario is drawn from a seeded ``random.Random`` and driven to completion by ``driver.Driver``; every cycle of
the run is checked (``check_cycle``). Whatever the policies, a cycle must never over-commit a node or one of its GPU
devices (fractional workloads: ``fractional=True``; the snapshot's device books must balance too), split a gang,
exceed a quota under ``quota`` admission, stop work it may not stop, leave an examined workload without a reason,
depend on anything but its input, or change its input, or place anything on a cordoned (unschedulable) node; under
a cohort tree, no cohort may pass its limits and reclaim may not reach into a cohort within its nominal; and a
small finite scenario must run to the end, also when a node is lost under running work (its leases go back to the
queue) or cordoned for a while.
"""
from __future__ import annotations

import contextlib
import copy
import itertools
import random
from collections import Counter
from dataclasses import dataclass, replace
from typing import Dict, List

import pytest

from raylane.errors import UnknownNameError
from raylane.scheduling import (
    ADMISSIONS,
    BACKFILLS,
    ORDERINGS,
    PLACEMENTS,
    PREEMPTIONS,
    ClusterState,
    Cohort,
    CycleResult,
    Gang,
    LeaseState,
    Node,
    Quota,
    Resources,
    SchedulerConfig,
    Snapshot,
    Team,
    Workload,
    check_feasible,
    cycle,
    team_usage,
)
from raylane.scheduling.types import node_devices

from .builders import CRITICAL, ELASTIC, FINETUNE, PRETRAIN, PROD, SLOW_START, SWEEP
from .driver import Driver

CLASSES = [CRITICAL, PROD, FINETUNE, PRETRAIN, SWEEP, SLOW_START]
AXES = {
    "ordering": ORDERINGS,
    "admission": ADMISSIONS,
    "backfill": BACKFILLS,
    "preemption": PREEMPTIONS,
}
EPS = 1e-6


# ----------------------------------------------------------------------------------------------- scenarios


@dataclass
class Scenario:
    nodes: List[Node]
    teams: Dict[str, Team]
    workloads: List[Workload]
    durations: Dict[str, float]
    config: SchedulerConfig


def random_scenario(seed: int, config: SchedulerConfig, strategy: str | None = None, n_workloads: int = 18,
                    fractional: bool = False, elastic: bool = False, tree: bool = False) -> Scenario:
    """``fractional``: workers ask shares of a GPU too (0.25 to 0.6), beside whole GPUs. ``elastic``: about a third
    of the workloads are elastic gangs (a resizable class, 1 to 5 workers between their bounds). ``tree``: the
    teams are nested under a random cohort tree (``random_tree``)."""
    rng = random.Random(seed)
    nodes = []
    for i in range(rng.randint(2, 5)):
        g = rng.choice([4, 8, 8])
        feats = frozenset({"h100"}) if i % 3 == 1 else frozenset()
        cap = Resources(gpu=g, cpu=8 * g, memory=64 * g)
        nodes.append(Node(f"n{i}", cap, cap, feats, {"rack": f"r{i % 2}"}, "", frozenset({"c4"}) if i % 2 else
                          frozenset()))
    total = sum(n.capacity.gpu for n in nodes)
    names = ["nlp", "cv", "rl", "speech"][: rng.randint(2, 4)]
    shares = [rng.randint(1, 4) for _ in names]
    teams = {}
    for name, s in zip(names, shares):
        nominal = float(round(total * s / sum(shares)))
        borrow = rng.choice([None, 0.0, float(rng.randint(1, 8))])
        lend = rng.choice([None, None, float(rng.randint(0, int(nominal)))])
        teams[name] = Team(name, {"gpu": Quota(nominal, borrow, lend)}, weight=rng.choice([1.0, 2.0]),
                           decayed_usage=rng.choice([0.0, 5000.0]))
    if tree:
        teams = random_tree(rng, teams)
    workloads, durations = [], {}
    strategies = PLACEMENTS.names()
    i = 0
    while len(workloads) < n_workloads:
        i += 1
        workers = rng.choice([1, 1, 2, 3])
        gpus = rng.choice([0.25, 0.5, 0.5, 0.6, 1, 2] if fractional else [1, 1, 2, 4])
        w = Workload(
            id=f"w{i:02d}", team=rng.choice(names), cls=rng.choice(CLASSES),
            gang=Gang(workers, Resources(gpu=gpus, cpu=gpus, memory=8 * gpus), strategy or rng.choice(strategies),
                      frozenset({"h100"}) if rng.random() < 0.15 else frozenset(), "rack"),
            submit_time=float(rng.choice([0, 0, 0, rng.randint(1, 300)])),
            runtime_estimate_s=rng.choice([None, float(rng.randint(10, 400))]),
            data_snapshot=rng.choice([None, "c4"]),
        )
        if elastic and rng.random() < 0.35:
            lo = rng.choice([1, 1, 2])
            hi = lo + rng.randint(1, 3)
            w = replace(w, cls=ELASTIC, gang=replace(w.gang, workers=lo, min_workers=lo, max_workers=hi))
        if check_feasible(w, nodes, teams, config.admission) is not None:
            continue
        workloads.append(w)
        durations[w.id] = float(rng.randint(5, 300))
    return Scenario(nodes, teams, workloads, durations, config)


def random_tree(rng: random.Random, teams: Dict[str, Team]) -> Dict[str, Team]:
    """``teams`` nested under 1 to 4 cohorts, 1 to 3 levels deep, each with a random own nominal, borrowing and
    lending limit (or none); a team stays under the root now and then, but at least one is in a cohort."""
    cohorts: List[Cohort] = []
    for i in range(rng.randint(1, 4)):
        parent = rng.choice([None] + [c for c in cohorts if _depth(c) < 3])
        q = rng.choice([None, Quota(float(rng.choice([0, 0, 2])), rng.choice([None, 0.0, float(rng.randint(1, 6))]),
                                    rng.choice([None, 0.0, float(rng.randint(1, 8))]))])
        cohorts.append(Cohort(f"c{i}", {"gpu": q} if q else {}, parent, rng.choice([1.0, 2.0])))
    out = {}
    for k, (name, t) in enumerate(teams.items()):
        c = rng.choice(cohorts) if k == 0 or rng.random() < 0.8 else None
        out[name] = replace(t, cohort=c)
    return out


def _depth(c: Cohort) -> int:
    return 1 if c.parent is None else 1 + _depth(c.parent)


def random_config(rng: random.Random, **fixed) -> SchedulerConfig:
    kw = {axis: rng.choice(reg.names()) for axis, reg in AXES.items()}
    kw.update(fixed)
    cfg = SchedulerConfig(**kw, max_admissions_per_cycle=rng.choice([1, 3, 64]), las_thresholds=(60.0, 600.0),
                          fair_share_half_life_s=600.0, default_runtime_s=200.0)
    # The ordering policy's hysteresis (leases settle at different times: the settle order a driver keeps).
    return replace(cfg, hysteresis_min_run_s=rng.choice([0.0, 0.0, 20.0, 90.0]),
                   hysteresis_service_fraction=rng.choice([0.0, 0.0, 0.5]))


# ------------------------------------------------------------------------------------------------ invariants


@contextlib.contextmanager
def no_memo():
    """Every preemption policy without its ``memo_key``: every search is done."""
    saved = {}
    for name in PREEMPTIONS.names():
        pol = PREEMPTIONS.get(name)
        if hasattr(pol, "memo_key"):
            saved[name] = pol
            pol.memo_key = lambda preemptor, ctx: None
    try:
        yield
    finally:
        for pol in saved.values():
            del pol.memo_key


def quota_ok(teams, usage) -> bool:
    if any(t.cohort is not None for t in teams.values()):
        return tree_quota_ok(teams, usage)
    pool_cap = pool_used = 0.0
    for t in teams.values():
        q = t.quotas.get("gpu")
        if q is None:
            continue
        u = usage.get(t.name, Resources()).gpu
        if u > q.ceiling + EPS:
            return False
        pool_cap += q.nominal - q.guaranteed
        pool_used += max(0.0, u - q.guaranteed)
    return pool_used <= pool_cap + EPS


def tree_quota_ok(teams, usage) -> bool:
    """No team and no cohort over its limits, worked out from the definitions (``raylane.scheduling.cohorts``)
    rather than by the ledger: per node n, S(n) (subtree quota), G(n) (the part it never lends) and U(n) (its use
    beyond its children's guaranteed parts); every team within its ceiling, every cohort with a borrowing limit B
    using no more than S - G + B of its parent's pool beyond G (what it puts in plus what it may borrow), and the
    root's pool not overdrawn."""
    kids: Dict[object, list] = {}  # cohort name (None: the root) -> its children
    name_of = lambda c: None if c is None else c.name  # noqa: E731
    for t in teams.values():
        if "gpu" not in t.quotas:
            continue
        kids.setdefault(name_of(t.cohort), []).append(t)
        c = t.cohort
        while c is not None:
            sibs = kids.setdefault(name_of(c.parent), [])
            if all(not isinstance(k, Cohort) or k.name != c.name for k in sibs):
                sibs.append(c)
            c = c.parent
    ok = True

    def node(n):
        """(S, G, U) of team or cohort ``n``; checks its limits."""
        nonlocal ok
        if isinstance(n, Team):
            q = n.quotas["gpu"]
            u = usage.get(n.name, Resources()).gpu
            ok &= u <= q.ceiling + EPS
            return q.nominal, q.guaranteed, u
        q = n.quotas.get("gpu")
        s = q.nominal if q else 0.0
        u = 0.0
        for k in kids.get(n.name, []):
            ks, kg, ku = node(k)
            s, u = s + ks - kg, u + max(0.0, ku - kg)
        g = max(0.0, s - q.lending_limit) if q and q.lending_limit is not None else 0.0
        if q and q.borrowing_limit is not None:
            ok &= max(0.0, u - g) <= s - g + q.borrowing_limit + EPS
        return s, g, u

    s = u = 0.0
    for k in kids.get(None, []):
        ks, kg, ku = node(k)
        s, u = s + ks - kg, u + max(0.0, ku - kg)
    return ok and u <= s + EPS


def crosses_to(snap: Snapshot, usage, team: str, preemptor: str) -> bool:
    """Whether every cohort of ``team`` that ``preemptor`` is not under holds more than its subtree's nominal."""
    teams = snap.teams
    mine = set()
    c = teams[preemptor].cohort if preemptor in teams else None
    while c is not None:
        mine.add(c.name)
        c = c.parent
    c = teams[team].cohort
    while c is not None and c.name not in mine:
        under = [t for t in teams.values() if "gpu" in t.quotas and _under(t, c.name)]
        nominal = (c.quotas["gpu"].nominal if "gpu" in c.quotas else 0.0) + sum(t.quotas["gpu"].nominal
                                                                                 for t in under)
        nominal += sum(o.quotas["gpu"].nominal for o in _cohorts_under(teams, c.name) if "gpu" in o.quotas)
        if sum(usage.get(t.name, Resources()).gpu for t in under) <= nominal + EPS:
            return False
        c = c.parent
    return True


def _under(t: Team, cohort: str) -> bool:
    c = t.cohort
    while c is not None:
        if c.name == cohort:
            return True
        c = c.parent
    return False


def _cohorts_under(teams, cohort: str) -> list:
    """The cohorts strictly below ``cohort`` that some team is under."""
    out = {}
    for t in teams.values():
        chain, c = [], t.cohort
        while c is not None and c.name != cohort:
            chain.append(c)
            c = c.parent
        if c is not None:
            out.update((x.name, x) for x in chain)
    return list(out.values())


def check_cycle(snap: Snapshot, res: CycleResult, now: float, max_examined: int = 500) -> None:
    cfg = snap.config
    before = copy.deepcopy(snap)
    again = cycle(snap, now, max_examined=max_examined)
    # Deterministic: the same input gives the same decisions.
    assert again == res
    # The snapshot is not changed by a cycle.
    assert snap == before
    # What a driver may leave out (usage, leases by team, the leases in end and settle order) is derived to the
    # same effect.
    assert cycle(replace(snap, usage=None, leases_by_team=None, lease_order=None), now,
                 max_examined=max_examined) == res
    # Remembering failed preemption searches within a cycle is only a shortcut: without it, the same decisions.
    with no_memo():
        assert cycle(snap, now, max_examined=max_examined) == res

    nodes = {n.id: n for n in snap.nodes}
    queued = {w.id: w for q in snap.queues.values() for w in q}
    leases = {l.id: l for l in snap.leases}

    # No workload decided twice; all decided ones were waiting.
    decided = [a.workload.id for a in res.admitted] + [p.workload.id for p in res.pending]
    assert len(decided) == len(set(decided)), Counter(decided).most_common(3)
    assert set(decided) <= set(queued)

    # No over-commit of any node; gangs whole, on nodes with the required features.
    free = {nid: n.free for nid, n in nodes.items()}
    for a in res.admitted:
        g = a.workload.gang
        assert len(a.placement) == g.workers
        for nid in a.placement:
            assert nid in nodes and g.features <= nodes[nid].features
            assert nodes[nid].schedulable, f"{a.workload.id} placed on cordoned {nid}"
            free[nid] = free[nid] - g.per_worker
    for nid, f in free.items():
        assert f.gpu >= -EPS and f.cpu >= -EPS and f.memory >= -EPS, (nid, f)
    check_devices(snap, res)

    # Quota never exceeded under `quota` admission (if it held before the cycle).
    usage = dict(snap.usage if snap.usage is not None else team_usage(snap.leases))
    if ADMISSIONS.get(cfg.admission).protects_in_quota and quota_ok(snap.teams, usage):
        for a in res.admitted:
            usage[a.workload.team] = usage.get(a.workload.team, Resources()) + a.workload.gang.total
        assert quota_ok(snap.teams, usage), usage

    # Victims: running, preemptible, past their minimum runtime, chosen once, and not another team's in-quota work.
    seen = set()
    protects = ADMISSIONS.get(cfg.admission).protects_in_quota
    snap_usage = snap.usage if snap.usage is not None else team_usage(snap.leases)
    for p in res.preempted:
        assert p.victims and p.preemptor.id in queued
        for v in p.victims:
            assert v not in seen
            seen.add(v)
            lease = leases[v]
            assert lease.state is LeaseState.RUNNING
            assert lease.workload.cls.preemptible
            assert now - lease.start_time >= lease.workload.cls.min_runtime_s
            if protects and lease.team != p.preemptor.team:
                q = snap.teams[lease.team].quotas["gpu"]
                assert snap_usage[lease.team].gpu > q.nominal + EPS, f"{v} of {lease.team} was in quota"
                # Under a cohort tree: nor work whose cohort, below the one shared with the preemptor, is in quota.
                assert crosses_to(snap, snap_usage, lease.team, p.preemptor.team), \
                    f"{v} of {lease.team}: its cohort was in quota"

    check_resizes(snap, res, now, free, usage if protects else None)

    # Every examined pending workload has a reason and a distinct, increasing position.
    positions = [p.position for p in res.pending]
    assert positions == sorted(positions) and len(set(positions)) == len(positions)
    assert all(p.position >= 1 and p.reason is not None for p in res.pending)
    # Nothing skipped silently: fewer decided than waiting only when a cycle limit was hit.
    if len(decided) < len(queued):
        assert len(res.admitted) >= cfg.max_admissions_per_cycle or len(decided) >= max_examined


def check_resizes(snap: Snapshot, res: CycleResult, now: float, free: Dict[str, Resources], usage) -> None:
    """Resizes: of running gangs of resizable classes only, within their bounds, from their size now, keeping
    their workers where they are, once a cycle and never beside a stop of the same gang; a shrink keeps the rules
    of a stop; growth over-commits no node (``free``: what is left after this cycle's admissions) and, under
    protecting admission (``usage``: with them), no quota."""
    leases = {l.id: l for l in snap.leases}
    stopped = {v for p in res.preempted for v in p.victims}
    seen = set()
    for rz in res.resized:
        lease = leases[rz.workload.id]
        g = lease.workload.gang
        assert rz.workload.id not in seen and rz.workload.id not in stopped, rz
        seen.add(rz.workload.id)
        assert lease.state is LeaseState.RUNNING and lease.workload.cls.resizable and g.elastic, rz
        assert rz.from_workers == g.workers == len(lease.placement) and rz.to_workers != rz.from_workers, rz
        assert g.lo <= rz.to_workers <= g.hi and len(rz.placement) == rz.to_workers, rz
        keep = min(rz.from_workers, rz.to_workers)
        assert tuple(rz.placement[:keep]) == tuple(lease.placement[:keep]), rz
        if rz.to_workers < rz.from_workers:
            assert lease.workload.cls.preemptible and now - lease.start_time >= lease.workload.cls.min_runtime_s
            continue
        assert now - lease.start_time >= snap.config.resize_interval_s, rz
        for nid in rz.placement[rz.from_workers:]:
            free[nid] = free[nid] - g.per_worker
        if usage is not None:
            usage[lease.team] = usage.get(lease.team, Resources()) + g.per_worker.scale(rz.to_workers - g.workers)
    for nid, f in free.items():
        assert f.gpu >= -EPS and f.cpu >= -EPS and f.memory >= -EPS, (nid, f)
    if usage is not None and quota_ok(snap.teams, dict(snap.usage if snap.usage is not None else
                                                       team_usage(snap.leases))):
        assert quota_ok(snap.teams, usage), usage


def _worker_devices_ok(g: float, idx) -> bool:
    if g <= 0:
        return not idx
    if g < 1:
        return len(idx) == 1
    return len(idx) == round(g) and len(set(idx)) == len(idx)


def check_devices(snap: Snapshot, res: CycleResult) -> None:
    """The snapshot's device books balance (a device's free share is 1 less what leases hold of it), and no
    admission over-commits a device: a share of a GPU on one device, whole GPUs on as many fully free ones."""
    nodes = {n.id: n for n in snap.nodes}
    held: Dict[str, List[float]] = {nid: [0.0] * len(node_devices(n)) for nid, n in nodes.items()}
    for l in snap.leases:
        g = l.workload.gang.per_worker.gpu
        if g <= 0:
            continue
        assert len(l.devices) == len(l.placement), f"{l.id} holds no named devices"
        for nid, idx in zip(l.placement, l.devices):
            assert _worker_devices_ok(g, idx), (l.id, g, idx)
            for i in idx:
                held[nid][i] += g if g < 1 else 1.0
    free = {}
    for nid, n in nodes.items():
        devs = node_devices(n)
        if n.free.gpu == n.capacity.gpu - sum(held[nid]) or abs(n.free.gpu - (n.capacity.gpu - sum(held[nid]))) < EPS:
            for i, d in enumerate(devs):
                assert abs(d - (1.0 - held[nid][i])) < EPS, (nid, i, devs, held[nid])
        free[nid] = list(devs) if n.schedulable else [0.0] * len(devs)
    for a in res.admitted:
        g = a.workload.gang.per_worker.gpu
        if g <= 0:
            continue
        assert len(a.devices) == len(a.placement), a
        for nid, idx in zip(a.placement, a.devices):
            assert _worker_devices_ok(g, idx), (a.workload.id, g, idx)
            for i in idx:
                free[nid][i] -= g if g < 1 else 1.0
                assert free[nid][i] >= -EPS, f"{a.workload.id} over-commits device {i} of {nid}: {free[nid]}"


# ---------------------------------------------------------------------------------------------------- tests

SEEDS = [1, 2, 3]


def drive(scn: Scenario) -> Driver:
    st = ClusterState(scn.nodes, scn.teams, scn.config)
    return Driver(st, scn.workloads, scn.durations, check=check_cycle).run(max_cycles=3000)


def assert_all_ran(scn: Scenario, d: Driver) -> None:
    assert sorted(d.finished) == sorted(w.id for w in scn.workloads)
    assert d.state.usage == {} or all(r.is_zero() or abs(r.gpu) < EPS for r in d.state.usage.values())
    assert {n.id: n.free for n in d.state.nodes.values()} == {n.id: n.capacity for n in scn.nodes}


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("axis,name", [(a, n) for a, reg in AXES.items() for n in reg.names()])
def test_every_policy_runs_random_scenarios_to_completion(axis, name, seed):
    rng = random.Random(f"{axis}/{name}/{seed}")
    cfg = random_config(rng, **{axis: name})
    scn = random_scenario(rng.randint(0, 10**6), cfg)
    assert_all_ran(scn, drive(scn))


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("axis,name", [(a, n) for a, reg in AXES.items() for n in reg.names()])
def test_every_policy_runs_elastic_gangs_to_completion(axis, name, seed):
    """Elastic gangs among fixed ones: admitted within their bounds, grown into free capacity, shrunk as a
    preemption option; every cycle keeps the invariants, resizes included (``check_resizes``), and everything
    runs to the end with the books balanced."""
    rng = random.Random(f"elastic/{axis}/{name}/{seed}")
    cfg = replace(random_config(rng, **{axis: name}), resize_interval_s=rng.choice([0.0, 30.0]))
    scn = random_scenario(rng.randint(0, 10**6), cfg, elastic=True)
    assert any(w.gang.elastic for w in scn.workloads)
    assert_all_ran(scn, drive(scn))


def test_elastic_scenarios_do_resize():
    """The elastic conformance runs are not vacuous: across a dozen scenarios under the default policies, running
    gangs both grow and shrink (and each scenario runs to the end)."""
    resizes = shrinks = 0
    for seed in range(12):
        rng = random.Random(f"elastic-resizes/{seed}")
        cfg = replace(random_config(rng, preemption="default", admission="quota"), resize_interval_s=0.0)
        scn = random_scenario(rng.randint(0, 10**6), cfg, elastic=True, n_workloads=24)
        # Arrivals spread over 15 minutes, so higher classes arrive while grown gangs run.
        scn.workloads = [replace(w, submit_time=float(rng.randint(0, 900))) for w in scn.workloads]
        d = drive(scn)
        assert_all_ran(scn, d)
        resizes, shrinks = resizes + d.resizes, shrinks + d.shrunk
    assert resizes > shrinks > 0, (resizes, shrinks)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("axis,name", [(a, n) for a, reg in AXES.items() for n in reg.names()]
                         + [("placement", n) for n in PLACEMENTS.names()])
def test_every_policy_keeps_devices_whole_on_fractional_workloads(axis, name, seed):
    """Shares of a GPU beside whole GPUs, with preemption and finishes: no device over-committed in any cycle
    (``check_devices``), and every device whole again at the end."""
    rng = random.Random(f"devices/{axis}/{name}/{seed}")
    cfg = random_config(rng, **({} if axis == "placement" else {axis: name}))
    scn = random_scenario(rng.randint(0, 10**6), cfg, strategy=name if axis == "placement" else None,
                          fractional=True)
    assert any(0 < w.gang.per_worker.gpu < 1 for w in scn.workloads)
    d = drive(scn)
    assert_all_ran(scn, d)
    for n in d.state.nodes.values():
        assert all(abs(x - 1.0) < EPS for x in node_devices(n)), (n.id, n.devices)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("strategy", PLACEMENTS.names())
def test_every_placement_runs_random_scenarios_to_completion(strategy, seed):
    rng = random.Random(f"placement/{strategy}/{seed}")
    cfg = random_config(rng)
    scn = random_scenario(rng.randint(0, 10**6), cfg, strategy=strategy)
    assert_all_ran(scn, drive(scn))


@pytest.mark.parametrize("combo", list(itertools.product(*(reg.names() for reg in AXES.values()))),
                         ids=lambda c: "-".join(c))
def test_every_combination_keeps_the_invariants(combo):
    """Every policy combination, a few cycles each on one busy scenario (the invariants are checked each cycle)."""
    cfg = SchedulerConfig(**dict(zip(AXES, combo)), las_thresholds=(60.0, 600.0), default_runtime_s=200.0)
    scn = random_scenario(7, cfg, n_workloads=14)
    st = ClusterState(scn.nodes, scn.teams, cfg)
    d = Driver(st, scn.workloads, scn.durations, check=check_cycle)
    for _ in range(8):
        d.step()
        if not d.advance():
            break


def test_max_examined_bounds_the_examined_set():
    cfg = SchedulerConfig(backfill="none")
    scn = random_scenario(3, cfg, n_workloads=20)
    st = ClusterState(scn.nodes, scn.teams, cfg)
    for w in scn.workloads:
        st.enqueue(replace(w, submit_time=0.0))
    snap = st.snapshot()
    res = cycle(snap, 0.0, max_examined=5)
    check_cycle(snap, res, 0.0, max_examined=5)
    assert len(res.admitted) + len(res.pending) <= 5


@pytest.mark.parametrize("axis", list(AXES) + ["placement"])
def test_unknown_names_list_the_known_ones(axis):
    reg = AXES.get(axis, PLACEMENTS)
    with pytest.raises(UnknownNameError) as e:
        reg.get("no-such-policy")
    for known in reg.names():
        assert known in str(e.value)
    assert "no-such-policy" in str(e.value)


@pytest.mark.parametrize("axis", list(AXES))
def test_cycle_refuses_an_unknown_policy_name(axis):
    snap = Snapshot((), (), {}, {}, SchedulerConfig(**{axis: "bogus"}))
    with pytest.raises(UnknownNameError):
        cycle(snap, 0.0)


def test_registries_have_defaults_that_exist():
    for reg in list(AXES.values()) + [PLACEMENTS]:
        assert reg.default in reg.names()
        assert reg.get() is reg.get(reg.default)


# ----------------------------------------------------------------------------------------- nodes lost, cordoned


class NodeDriver(Driver):
    """``Driver`` with node events: ``fail`` removes a node now (its leases go back to their queue) and adds it back,
    empty, ``down_for`` later; ``cordon`` makes a node unschedulable now and schedulable again ``for_s`` later."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.node_events: List[tuple] = []  # (time, action, node)

    def fail(self, nid: str, down_for: float) -> list:
        st = self.state
        node = st.nodes[nid]
        before = {l.id: l for l in st.leases.values()}
        lost = st.remove_node(nid, self.now)
        # Exactly the leases with a worker there, none other.
        assert sorted(l.id for l in lost) == sorted(i for i, l in before.items() if nid in l.placement)
        for lease in lost:
            self.ends.pop(lease.id, None)
            self.stops.pop(lease.id, None)
            w = st.requeue(lease, self.now)
            # Back in its queue at its old place: the submit time is kept.
            assert st.is_pending(w.id) and w.submit_time == lease.workload.submit_time
        assert nid not in {n.id for n in st.snapshot().nodes}
        assert_books_balance(st)
        self.node_events.append((self.now + down_for, "add", replace(node, free=node.capacity)))
        return lost

    def cordon(self, nid: str, for_s: float) -> None:
        self.state.set_schedulable(nid, False)
        self.node_events.append((self.now + for_s, "uncordon", nid))

    def advance(self) -> bool:
        moved = super().advance()
        if not self.node_events:
            return moved
        nxt = min(t for t, _, _ in self.node_events)
        if moved and self.now < nxt:
            return True
        self.now = max(self.now, nxt)
        for ev in [e for e in self.node_events if e[0] <= self.now]:
            self.node_events.remove(ev)
            _, action, what = ev
            if action == "add":
                self.state.add_node(what)
            else:
                self.state.set_schedulable(what, True)
        return True

    def done(self) -> bool:
        return super().done() and not self.node_events


def assert_books_balance(st: ClusterState) -> None:
    """Every node's free resources are its capacity less what the leases on it hold; usage is what leases hold."""
    held: Dict[str, Resources] = {}
    for lease in st.leases.values():
        for nid in lease.placement:
            held[nid] = held.get(nid, Resources()) + lease.workload.gang.per_worker
    for nid, n in st.nodes.items():
        want = n.capacity - held.get(nid, Resources())
        assert abs(n.free.gpu - want.gpu) < EPS and abs(n.free.cpu - want.cpu) < EPS, (nid, n.free, want)
    assert set(held) <= set(st.nodes), "a lease holds a removed node"
    usage = team_usage(st.leases.values())
    for team, u in st.usage.items():
        assert abs(u.gpu - usage.get(team, Resources()).gpu) < EPS, team


def busiest_node(st: ClusterState) -> str | None:
    counts = Counter(nid for lease in st.leases.values() for nid in set(lease.placement))
    return counts.most_common(1)[0][0] if counts else None


def _outage_scenario(label: str, seed: int, **fixed):
    rng = random.Random(f"{label}/{seed}")
    cfg = random_config(rng, **{k: v for k, v in fixed.items() if k != "strategy"})
    scn = random_scenario(rng.randint(0, 10**6), cfg, strategy=fixed.get("strategy"))
    return rng, scn, NodeDriver(ClusterState(scn.nodes, scn.teams, cfg), scn.workloads, scn.durations,
                                check=check_cycle)


OUTAGE_CASES = [(a, n) for a, reg in AXES.items() for n in reg.names()] + [("strategy", s) for s in PLACEMENTS.names()]


@pytest.mark.parametrize("seed", [1, 2])
@pytest.mark.parametrize("axis,name", OUTAGE_CASES, ids=[f"{a}={n}" for a, n in OUTAGE_CASES])
def test_a_lost_node_requeues_its_leases_and_the_rest_runs_to_completion(axis, name, seed):
    """A node is lost under running work: its leases (whole gangs, wherever their other workers ran) go back to
    their queues with their submit time; the books balance; no cycle places anything on the missing node or
    over-commits the rest (check_cycle); once the node is back, everything runs to the end."""
    rng, scn, d = _outage_scenario(f"lost/{axis}/{name}", seed, **{axis: name})
    victim = None
    for _ in range(rng.randint(1, 4)):
        d.step()
        victim = busiest_node(d.state) or victim
        if not d.advance():
            break
    victim = busiest_node(d.state)
    if victim is None:  # nothing runs at this point of this scenario: lose any node
        victim = rng.choice(sorted(d.state.nodes))
    d.fail(victim, down_for=rng.choice([30.0, 400.0]))
    d.run(max_cycles=3000)
    assert_all_ran(scn, d)


@pytest.mark.parametrize("seed", [1, 2])
@pytest.mark.parametrize("strategy", PLACEMENTS.names())
def test_a_cordoned_node_gets_no_new_lease_under_every_placement(strategy, seed):
    """Some nodes are cordoned, one of them under running work: what runs there runs on, nothing new is placed
    there while cordoned (check_cycle), and after the uncordon everything runs to the end."""
    rng, scn, d = _outage_scenario(f"cordon/{strategy}", seed, strategy=strategy)
    d.step()
    d.advance()
    ids = sorted(d.state.nodes)
    cordoned = {busiest_node(d.state) or ids[0], rng.choice(ids)}
    running_there = {l.id for l in d.state.leases.values() if cordoned & set(l.placement)}
    for nid in cordoned:
        d.cordon(nid, for_s=rng.choice([100.0, 500.0]))
    assert all(l in d.state.leases for l in running_there)
    d.run(max_cycles=3000)
    assert_all_ran(scn, d)


# ------------------------------------------------------------------------------------------------ cohort trees


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("axis,name", [(a, n) for a, reg in AXES.items() for n in reg.names()])
def test_every_policy_keeps_cohort_limits_on_random_trees(axis, name, seed):
    """Teams nested under random cohort trees: every cycle keeps the invariants (``check_cycle``), among them no
    team or cohort over its limits (``tree_quota_ok``) and no reclaim from a team within its nominal quota or from
    a cohort within its subtree's nominal (``crosses_to``), and everything runs to the end."""
    rng = random.Random(f"tree/{axis}/{name}/{seed}")
    cfg = random_config(rng, **{axis: name})
    scn = random_scenario(rng.randint(0, 10**6), cfg, tree=True)
    assert any(t.cohort is not None for t in scn.teams.values())
    assert_all_ran(scn, drive(scn))


def test_tree_invariants_can_fail():
    """The tree checks are not vacuous: a cohort over its borrowing limit, a root pool overdrawn through a cohort
    that lends nothing, and a victim whose cohort was within its nominal are each caught."""
    dept = Cohort("d", {"gpu": Quota(0.0, 1.0, 0.0)})
    teams = {"a": Team("a", {"gpu": Quota(4.0)}, cohort=dept), "b": Team("b", {"gpu": Quota(4.0)}, cohort=dept),
             "c": Team("c", {"gpu": Quota(4.0)})}
    assert tree_quota_ok(teams, {"a": Resources(gpu=9)})
    assert not tree_quota_ok(teams, {"a": Resources(gpu=10)})  # d may take 1 beyond its 8
    assert not tree_quota_ok(teams, {"c": Resources(gpu=5)})  # d lends nothing: c has nothing to borrow
    snap = Snapshot((), (), {}, teams)
    assert not crosses_to(snap, {"a": Resources(gpu=6)}, "a", "c")  # a borrows b's quota, inside d
    assert crosses_to(snap, {"a": Resources(gpu=9)}, "a", "c")
    assert crosses_to(snap, {"a": Resources(gpu=6)}, "a", "b")  # siblings: no boundary between them


def test_tree_scenarios_do_reclaim_across_cohorts():
    """The tree conformance runs are not vacuous: across a dozen scenarios under the default policies, teams reclaim
    from teams of another cohort (whose borrowing crossed into theirs), with every cycle checked."""
    across = 0

    def check(snap, res, now):
        nonlocal across
        check_cycle(snap, res, now)
        team_of = {l.id: l.team for l in snap.leases}
        for p in res.preempted:
            mine = snap.teams[p.preemptor.team].cohort
            for v in p.victims:
                theirs = snap.teams[team_of[v]].cohort
                across += theirs is not None and (mine is None or theirs.name != mine.name)

    for seed in range(12):
        rng = random.Random(f"tree-reclaim/{seed}")
        cfg = random_config(rng, preemption="default", admission="quota")
        scn = random_scenario(rng.randint(0, 10**6), cfg, tree=True, n_workloads=24)
        d = Driver(ClusterState(scn.nodes, scn.teams, cfg), scn.workloads, scn.durations, check=check)
        assert_all_ran(scn, d.run(max_cycles=3000))
    assert across > 0
