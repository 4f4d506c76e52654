"""Autoscaled node groups in a replay (raylane.sim.autoscaled): growth for gangs that wait for capacity after the
start-up delay, idle removal after the idle timeout (never below min, never a node that holds a lease), the max,
cancelled starts, spot reclaims, their cost, and a fixed cluster's report left as it was. Pure: no Ray."""
from __future__ import annotations

import json
from dataclasses import replace
from typing import Any, Dict

import pytest

from raylane.errors import FatalError, ValidationError
from raylane.scheduling.types import SchedulerConfig
from raylane.sim import SimOptions, Simulator, summarize
from raylane.sim.autoscaled import GroupNow, reclaim_rng, scale_actions
from raylane.sim.cluster import ClusterSpec, NodeGroupSpec, load_cluster
from raylane.sim.costcompare import compare_rows, peak_gpus
from tests.sim.builders import job, outcome, trace

PRICE = 2.0


def group(name: str, **kw) -> NodeGroupSpec:
    """A group of 8-GPU nodes; growable when ``max`` is given (starting at ``count``, default ``min`` or 0)."""
    kw.setdefault("gpus", 8)
    if kw.get("max") is not None:
        kw.setdefault("count", kw.get("min") or 0)
        kw.setdefault("node_type", name)
    return NodeGroupSpec(name=name, **kw)


def cluster(*groups: NodeGroupSpec) -> ClusterSpec:
    return ClusterSpec(name="t", node_groups=list(groups))


def run(tr, spec: ClusterSpec, **options):
    cfg = SchedulerConfig(ordering="fifo", admission="none", backfill="greedy", preemption="none")
    sim = Simulator(tr, spec.nodes(), {}, cfg, options=replace(SimOptions(), **options), cluster=spec)
    return sim.run()


def ledger(r, name: str):
    return next(g for g in r.capacity.groups if g.name == name)


# ------------------------------------------------------------------------------------------------ growth


def test_a_gang_no_node_fits_grows_its_group_and_runs_after_the_startup():
    spec = cluster(group("base", count=1), group("od", max=4, price=PRICE, startup=180))
    r = run(trace(job("a").gpus(8).at(0).runs(1000), job("b").gpus(16).workers(2).at(10).runs(100)), spec)
    # b needs two new nodes, asked for at 10, joined at 190; they go 300 s after b ends (290 + 300).
    assert outcome(r) == {"a": (0, 1000, 0), "b": (190, 290, 0)}
    od = ledger(r, "od")
    assert (od.launched, od.removed_idle, od.cancelled, od.peak) == (2, 2, 0, 2)
    assert od.node_s == pytest.approx(2 * (590 - 10))
    s = summarize(r)["capacity"]
    assert s["groups"]["od"]["cost"] == pytest.approx(2 * 580 / 3600 * 8 * PRICE)
    # base is unpriced and on-demand: its GPU-hours count, its cost does not.
    assert s["gpu_hours"] == pytest.approx((2 * 580 + 1000) * 8 / 3600)
    assert s["cost"] == pytest.approx(s["groups"]["od"]["cost"]) and s["cost_spot"] == 0
    assert s["gpu_hours_unpriced"] == pytest.approx(1000 * 8 / 3600)
    assert max(r.capacity.nodes) == 3 and max(r.capacity.starting) == 2


def test_the_default_startup_applies_to_a_group_that_names_none():
    from raylane.sim.types import DEFAULT_STARTUP_S

    r = run(trace(job("a").gpus(8).at(5).runs(60)), cluster(group("od", max=1)))
    assert outcome(r)["a"] == (5 + DEFAULT_STARTUP_S, 5 + DEFAULT_STARTUP_S + 60, 0)


def test_a_job_only_a_growable_group_can_hold_is_not_rejected():
    spec = cluster(group("small", count=1, gpus=4), group("big", max=2, startup=60))
    r = run(trace(job("a").gpus(8).at(0).runs(10)), spec)
    assert not r.rejected and outcome(r)["a"] == (60, 70, 0)


def test_a_group_never_exceeds_its_max():
    spec = cluster(group("od", max=2, startup=100))
    r = run(trace(*[job(f"j{i}").gpus(8).at(0).runs(1000) for i in range(4)]), spec)
    assert [outcome(r)[f"j{i}"] for i in range(4)] == [(100, 1100, 0)] * 2 + [(1100, 2100, 0)] * 2
    od = ledger(r, "od")
    assert (od.launched, od.peak) == (2, 2)
    assert max(n + s for n, s in zip(r.capacity.nodes, r.capacity.starting)) == 2


def test_a_start_no_longer_needed_is_cancelled_and_billed_until_then():
    spec = cluster(group("base", count=1), group("od", max=2, price=PRICE, startup=180))
    r = run(trace(job("a").gpus(8).at(0).runs(60), job("b").gpus(8).at(10).runs(100)), spec)
    # b waits at 10 (a node is asked for), then starts on base when a ends at 60, before the node joins.
    assert outcome(r)["b"] == (60, 160, 0)
    od = ledger(r, "od")
    assert (od.launched, od.cancelled, od.peak) == (1, 1, 0)
    assert od.node_s == pytest.approx(50)


# ------------------------------------------------------------------------------------------ idle removal


def test_idle_nodes_go_after_the_idle_timeout_never_below_min():
    spec = cluster(group("od", min=1, count=2, max=3))
    r = run(trace(job("a").gpus(8).at(0).runs(100), job("z").gpus(1).at(1000).runs(10)), spec, idle_timeout_s=300)
    od = ledger(r, "od")
    # od-001 is idle from 0 and goes at 300; od-000 is idle from 100 but is the group's last (min 1), so z runs there.
    assert (od.removed_idle, od.launched) == (1, 0)
    assert od.node_s == pytest.approx(300 + 1010)
    assert outcome(r)["z"] == (1000, 1010, 0)
    assert r.capacity.nodes[-1] == 1


def test_a_node_that_holds_a_lease_is_never_removed():
    spec = cluster(group("od", count=2, max=2))
    r = run(trace(job("a").gpus(8).at(0).runs(5000)), spec, idle_timeout_s=60)
    od = ledger(r, "od")
    assert outcome(r)["a"] == (0, 5000, 0)
    assert od.removed_idle == 1  # the other node, idle from 0, went at 60
    assert sum(r.requeues.values()) == 0 and od.node_s == pytest.approx(60 + 5000)


def test_idle_timeout_is_an_option_with_rays_default():
    from raylane.sim.types import DEFAULT_IDLE_TIMEOUT_S

    assert SimOptions().idle_timeout_s == DEFAULT_IDLE_TIMEOUT_S == 300.0
    with pytest.raises(FatalError, match="idle timeout"):
        SimOptions(idle_timeout_s=-1)
    with pytest.raises(FatalError, match="spot reclaim"):
        SimOptions(spot_reclaim_per_hour=float("nan"))


# ------------------------------------------------------------------------------------------------- spot


def _spot_run(seed: int):
    spec = cluster(group("spot", min=1, max=1, spot=True, price=1.0, startup=60))
    return run(trace(job("a").gpus(8).at(0).runs(3600)), spec, seed=seed, spot_reclaim_per_hour=4.0)


def test_spot_reclaims_requeue_the_lease_and_are_reproducible():
    r = _spot_run(7)
    spot = ledger(r, "spot")
    first = reclaim_rng(7, "spot-000").expovariate(4.0 / 3600)
    assert spot.reclaimed >= 1 and r.requeues["reclaim"] >= 1
    assert spot.launched == spot.reclaimed  # each reclaim below min is replaced
    assert r.finish[0] > 3600 and r.preemptions[0] == 0
    # The job lost what it ran since its last checkpoint (DEFAULT_CLASS: every 300 s) before the first reclaim.
    if first < 3600:
        assert r.lost_work[0] >= first % 300 - 1e-6
    again = _spot_run(7)
    assert (outcome(again), ledger(again, "spot").reclaimed, again.lost_gpu_s) == (
        outcome(r), spot.reclaimed, r.lost_gpu_s)
    other = _spot_run(8)
    assert outcome(other) != outcome(r)
    s = summarize(r)["capacity"]
    assert s["cost_spot"] == pytest.approx(s["cost"]) and s["reclaims"] == spot.reclaimed


def test_no_reclaims_at_rate_zero():
    spec = cluster(group("spot", min=1, max=1, spot=True, price=1.0))
    r = run(trace(job("a").gpus(8).at(0).runs(3600)), spec, spot_reclaim_per_hour=0.0)
    assert ledger(r, "spot").reclaimed == 0 and outcome(r)["a"] == (0, 3600, 0)


# ------------------------------------------------------------------------------------- fixed clusters


def _fixed_jobs():
    return trace(*[job(f"j{i}").gpus(4 * (1 + i % 3)).at(37 * i).runs(500 + 91 * i) for i in range(20)])


def _comparable(s: Dict[str, Any]) -> Dict[str, Any]:
    s = json.loads(json.dumps(s, default=str))
    s["replay"].pop("wall_s")
    s["replay"].pop("cycle_ms")
    s["replay"].pop("cycles")  # a priced cluster cycles once at every change to read the demand
    s["replay"].pop("pending_max")
    return s


def test_a_fixed_cluster_reports_as_before():
    spec = cluster(group("gpu", count=3))
    tr = _fixed_jobs()
    cfg = SchedulerConfig(ordering="fifo", admission="none", backfill="greedy", preemption="none")
    before = Simulator(tr, spec.nodes(), {}, cfg).run()  # no cluster file: the replay as it always was
    after = Simulator(tr, spec.nodes(), {}, cfg, cluster=spec).run()
    assert after.capacity is None and "capacity" not in summarize(after)
    a, b = summarize(before), summarize(after)
    a["replay"].pop("wall_s"), b["replay"].pop("wall_s"), a["replay"].pop("cycle_ms"), b["replay"].pop("cycle_ms")
    assert json.dumps(a, default=str) == json.dumps(b, default=str)


def test_a_priced_fixed_cluster_decides_alike_and_pays_for_every_node():
    tr = _fixed_jobs()
    plain = run(tr, cluster(group("gpu", count=3)))
    priced = run(tr, cluster(group("gpu", count=3, price=PRICE)))
    assert outcome(priced) == outcome(plain)
    s = summarize(priced)
    plain_s, priced_s = _comparable(summarize(plain)), _comparable(s)
    priced_s.pop("capacity")
    # Its outages count spot reclaims too (none here).
    assert priced_s["outages"]["requeues"].pop("reclaim") == 0
    assert priced_s["outages"]["lost_gpu_hours"].pop("reclaim") == 0
    assert priced_s == plain_s
    span = s["makespan_s"]
    assert s["capacity"]["gpu_hours"] == pytest.approx(24 * span / 3600)
    assert s["capacity"]["cost"] == pytest.approx(24 * span / 3600 * PRICE)
    assert s["capacity"]["utilization_bought"] == pytest.approx(s["utilization"]["mean"])


# ------------------------------------------------------------------------------------ the arithmetic


@pytest.mark.parametrize("name,now,wanted,expect", [
    ("launch what the demand wants", GroupNow("g", 0, 10, 2, 0, 0), 3, 3),
    ("idle nodes count first", GroupNow("g", 0, 10, 2, 0, 2), 3, 1),
    ("starting nodes count", GroupNow("g", 0, 10, 2, 1, 0), 3, 2),
    ("cancel starts no longer wanted", GroupNow("g", 0, 10, 2, 3, 0), 1, -2),
    ("never above max", GroupNow("g", 0, 4, 3, 0, 0), 5, 1),
    ("refill to min", GroupNow("g", 2, 4, 0, 0, 0), 0, 2),
    ("min counts starting nodes", GroupNow("g", 2, 4, 1, 1, 0), 0, None),
    ("nothing to do", GroupNow("g", 0, 4, 1, 0, 1), 1, None),
])
def test_scale_actions(name, now, wanted, expect):
    assert scale_actions([now], {"g": wanted}).get("g") == expect, name


# ------------------------------------------------------------------------------------- cluster files


def _load(tmp_path, text: str):
    p = tmp_path / "c.yaml"
    p.write_text(text)
    return load_cluster(p)


def test_a_growable_group_starts_at_min_and_reads_its_fields(tmp_path):
    c = _load(tmp_path, "node_groups:\n  - {name: base, count: 1, gpus: 8}\n"
                        "  - {name: od, min: 2, max: 5, gpus: 8, node_type: a100, price: 2.5, spot: true, "
                        "startup: 4m}\n")
    od = c.node_groups[1]
    assert (od.count, od.lo, od.hi, od.price, od.spot, od.startup) == (2, 2, 5, 2.5, True, 240.0)
    assert c.elastic and c.growable and c.total_gpus == 24
    assert [n.id for n in c.nodes()] == ["base-000", "od-000", "od-001"]
    assert len(c.nodes_at_max()) == 6
    assert od.scale_group(2).node_hour_price == 20.0


def test_growth_fields_are_checked_by_the_platforms_rules_all_at_once(tmp_path):
    with pytest.raises(ValidationError) as e:
        _load(tmp_path, "node_groups:\n  - {name: a, min: 2, gpus: 8, node_type: x}\n"
                        "  - {name: b, min: 1, max: 4, count: 9, gpus: 8, node_type: y}\n"
                        "  - {name: c, max: 4, gpus: 8, node_type: y, price: -1}\n"
                        "  - {name: d, gpus: 8}\n  - {name: e, max: 3, gpus: 8}\n")
    errors = {path: (value, allowed) for path, value, allowed in e.value.errors}
    assert "required when min is given" in errors["node_groups[0].max"][1]
    assert errors["node_groups[1].count"][0] == 9 and "from min (1) to max (4)" in errors["node_groups[1].count"][1]
    assert errors["node_groups[2].price"][0] == -1
    assert "required" in errors["node_groups[3].count"][1]
    assert "node type" in errors["node_groups[4].node_type"][1]


def test_a_node_type_selects_one_growable_group(tmp_path):
    with pytest.raises(ValidationError) as e:
        _load(tmp_path, "node_groups:\n  - {name: a, max: 2, gpus: 8, node_type: x}\n"
                        "  - {name: b, max: 2, gpus: 8, node_type: x}\n")
    assert [(p, v) for p, v, _ in e.value.errors] == [("node_groups[1].node_type", "x")]


def test_a_fixed_unpriced_cluster_is_not_elastic(tmp_path):
    c = _load(tmp_path, "node_groups:\n  - {name: gpu, count: 2, gpus: 8}\n")
    assert not c.elastic and c.node_groups[0].count == 2


# ------------------------------------------------------------------------------------- the comparison


def test_peak_counts_jobs_that_overlap():
    tr = trace(job("a").gpus(8).at(0).runs(100), job("b").gpus(4).at(50).runs(100), job("c").gpus(2).at(100).runs(10))
    assert peak_gpus(tr) == 12  # a ends as c starts


def test_compare_rows_take_ratios_to_the_fixed_run():
    def summary(cost: float, jct: float, finished: int = 10) -> Dict[str, Any]:
        return {"cluster": "c", "jobs": {"finished": finished, "total": 10}, "jct": {"mean": jct, "p50": jct},
                "queueing": {"mean": 0.0},
                "capacity": {"cost": cost, "submit_window": {"cost": cost, "gpu_hours": 1.0, "cost_spot": 0.0}}}

    rows = compare_rows([("fixed", summary(100, 1000)), ("ok", summary(60, 1100)), ("slow", summary(50, 1101)),
                         ("dear", summary(61, 900)), ("short", summary(10, 900, finished=9))])
    assert [r["goal_met"] for r in rows] == [None, True, False, False, False]
    assert rows[1]["cost_ratio"] == pytest.approx(0.6) and rows[1]["jct_ratio"] == pytest.approx(1.1)


# ------------------------------------------------------------------------------------------ flavor quotas


@pytest.mark.parametrize("flavored,launched", [(False, {"a100": 2, "h100": 0}), (True, {"a100": 1, "h100": 1})])
def test_a_replay_buys_only_nodes_the_teams_flavor_quota_lets_it_use(flavored, launched):
    """Two 8-GPU jobs, a100 nodes the cheaper: both get a100 nodes, unless the team's a100 quota is 8 GPUs; then
    the second is given an h100 node and runs there."""
    from raylane.scheduling.types import Quota, Team

    flavors = {"a100": Quota(8, 0)} if flavored else {}
    teams = {"default": Team("default", {"gpu": Quota(64)}, flavors=flavors)}
    spec = cluster(group("a100", max=4, price=2.0, startup=60), group("h100", max=4, price=3.0, startup=60))
    cfg = SchedulerConfig(ordering="fifo", admission="quota", backfill="greedy", preemption="none")
    tr = trace(job("one").gpus(8).at(0).runs(1000), job("two").gpus(8).at(1).runs(1000))
    r = Simulator(tr, spec.nodes(), teams, cfg, options=SimOptions(), cluster=spec).run()
    assert {g: ledger(r, g).launched for g in ("a100", "h100")} == launched
    assert outcome(r)["two"][0] == 61  # asked for at 1, joined after the 60 s start-up
