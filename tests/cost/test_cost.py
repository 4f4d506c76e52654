"""Cost accounting (raylane.cost) on journals built by hand: two node types with known prices, sums checked exactly
against hand-computed figures (every time and price below is exact in binary floating point), idle cost when
nothing runs, windows, running leases, unpriced nodes, scopes, budgets across a month boundary, and the policy's
budget fields. Pure: no Ray."""
from __future__ import annotations

import calendar

import pytest
import yaml

from raylane.control.journal import Entry
from raylane.cost import GROUPS, UNKNOWN_NODE, UNTYPED, CostReport, Ledger, month_start, sweep_of
from raylane.errors import ValidationError
from tests.raytest import REPO

H = 3600.0
PRICES = {"big": 4.0, "small": 1.5}


class Journal:
    """Entries built by hand, handed out in time order with increasing ``seq``, as the control actor writes them."""

    def __init__(self):
        self._rows = []

    def add(self, ts, kind, wid, **data):
        self._rows.append((ts, len(self._rows), kind, wid, data))
        return self

    def node(self, ts, node, event, node_type="", gpus=0.0):
        return self.add(ts, "node", "@nodes", node=node, event=event, node_type=node_type, gpus=gpus, reason="")

    def submit(self, wid, team, cls, *, workers=1, gpu=1.0, kind="train", name=None, ts=0.0, **extra):
        spec = {"name": name or wid, "team": team, "class": cls, "kind": kind,
                "gang": {"workers": workers, "resources": {"gpu": gpu, "cpu": 1.0, "memory": 0.0}}, **extra}
        return self.add(ts, "submitted", wid, spec=spec, submit_time=ts)

    def lease(self, wid, start, end, placement, end_kind="finished"):
        self.add(start, "admitted", wid, placement=list(placement), pg_name=f"raylane-{wid}")
        self.add(start, "running", wid)
        if end is not None:
            self.add(end, end_kind, wid, note="")
        return self

    def entries(self):
        rows = sorted(self._rows, key=lambda r: (r[0], r[1]))
        return [Entry(i + 1, ts, kind, wid, data) for i, (ts, _, kind, wid, data) in enumerate(rows)]

    def ledger(self) -> Ledger:
        led = Ledger()
        led.feed(self.entries())
        return led


def cluster(j: Journal) -> Journal:
    """Node A: type big, 4 GPUs, present all along; node B: type small, 2 GPUs, lost at 2.5h; the head: no type, no
    GPUs (a CPU node with no price)."""
    return (j.node(0, "A", "joined", "big", 4).node(0, "B", "joined", "small", 2).node(0, "HEAD", "joined", "", 0)
            .node(9000, "B", "lost"))


def busy() -> Journal:
    j = cluster(Journal())
    j.submit("w1", "team-a", "pretrain", workers=2)                        # 2 x 1 GPU on A and B, 0 - 1h
    j.lease("w1", 0, H, ["A", "B"])
    j.submit("w2", "team-b", "finetune", gpu=2)                            # 1 x 2 GPUs: A 0.5h - 1.5h, then
    j.lease("w2", 1800, 5400, ["A"], end_kind="requeued")                  # B 2h - 2.5h (cancelled when B is lost)
    j.lease("w2", 7200, 9000, ["B"], end_kind="cancelled")
    j.submit("lr-slot-0", "team-a", "sweep", kind="tune", name="lr-slot-0")  # a sweep's two slots, 1 GPU each
    j.lease("lr-slot-0", 0, 1800, ["B"])
    j.submit("lr-slot-1", "team-a", "sweep", kind="tune", name="lr-slot-1")
    j.lease("lr-slot-1", 3600, 5400, ["A"])
    j.submit("etl-1", "team-b", "eval", pipeline="etl")                    # 1 GPU on A, 2.5h - 3h
    j.lease("etl-1", 9000, 10800, ["A"])
    j.submit("cpu-1", "team-a", "eval", gpu=0)                             # no GPU: costs nothing
    j.lease("cpu-1", 0, 10800, ["HEAD"])
    return j


NOW = 3 * H

# Hand-computed: cost = GPUs x hours x price. A is "big" (4.0), B is "small" (1.5).
#   w1:   A 1 x 1h x 4 = 4      B 1 x 1h x 1.5 = 1.5                        -> 5.5
#   w2:   A 2 x 1h x 4 = 8      B 2 x 0.5h x 1.5 = 1.5                      -> 9.5
#   lr:   slot-0 B 1 x 0.5h x 1.5 = 0.75, slot-1 A 1 x 0.5h x 4 = 2         -> 2.75
#   etl:  A 1 x 0.5h x 4 = 2                                                -> 2
# Idle: A 4 GPUs x 3h = 12 GPU-h, 4 leased (1 + 2 + 0.5 + 0.5) -> 8 x 4 = 32
#       B 2 GPUs x 2.5h = 5 GPU-h, 2.5 leased (1 + 1 + 0.5)    -> 2.5 x 1.5 = 3.75
WHOLE = {
    "leased_cost": 19.75, "leased_gpu_hours": 6.5, "idle_cost": 35.75, "idle_gpu_hours": 10.5, "cpu_node_cost": 0.0,
    "workload": {"w2": 9.5, "w1": 5.5, "lr-slot-1": 2.0, "etl-1": 2.0, "lr-slot-0": 0.75},
    "team": {"team-b": 11.5, "team-a": 8.25},
    "class": {"finetune": 9.5, "pretrain": 5.5, "sweep": 2.75, "eval": 2.0},
    "sweep": {"lr": 2.75},
    "pipeline": {"etl": 2.0},
    "node_types": {"big": (12.0, 4.0, 8.0, 16.0, 32.0), "small": (5.0, 2.5, 2.5, 3.75, 3.75)},
}
# [0.5h, 1.5h): w1 0.5h on A and B = 2 + 0.75; w2 1h on A = 8; slot-1 0.5h on A = 2.
# Idle: A 4 GPU-h, 3 leased -> 1 x 4 = 4; B 2 GPU-h, 0.5 leased -> 1.5 x 1.5 = 2.25.
WINDOW = {
    "leased_cost": 12.75, "leased_gpu_hours": 3.5, "idle_cost": 6.25, "idle_gpu_hours": 2.5, "cpu_node_cost": 0.0,
    "workload": {"w2": 8.0, "w1": 2.75, "lr-slot-1": 2.0},
    "team": {"team-b": 8.0, "team-a": 4.75},
    "class": {"finetune": 8.0, "pretrain": 2.75, "sweep": 2.0},
    "sweep": {"lr": 2.0},
    "pipeline": {},
    "node_types": {"big": (4.0, 3.0, 1.0, 12.0, 4.0), "small": (2.0, 0.5, 1.5, 0.75, 2.25)},
}
# Only team-a's leases; idle stays the cluster's.
TEAM_A = {
    "leased_cost": 8.25, "leased_gpu_hours": 3.0, "idle_cost": 35.75, "idle_gpu_hours": 10.5, "cpu_node_cost": 0.0,
    "workload": {"w1": 5.5, "lr-slot-1": 2.0, "lr-slot-0": 0.75},
    "team": {"team-a": 8.25},
    "class": {"pretrain": 5.5, "sweep": 2.75},
    "sweep": {"lr": 2.75},
    "pipeline": {},
    "node_types": {"big": (12.0, 1.5, 8.0, 6.0, 32.0), "small": (5.0, 1.5, 2.5, 2.25, 3.75)},
}


def figures(rep: CostReport) -> dict:
    out = {k: getattr(rep, k) for k in ("leased_cost", "leased_gpu_hours", "idle_cost", "idle_gpu_hours",
                                        "cpu_node_cost")}
    for g in GROUPS:
        out[g] = {r.key: r.cost for r in rep.groups[g]}
    out["node_types"] = {n.node_type: (n.capacity_gpu_hours, n.leased_gpu_hours, n.idle_gpu_hours, n.leased_cost,
                                       n.idle_cost) for n in rep.node_types if n.capacity_gpu_hours}
    return out


@pytest.mark.parametrize("window, scope, expected", [
    pytest.param({}, None, WHOLE, id="the whole journal"),
    pytest.param({"since": 1800, "until": 5400}, None, WINDOW, id="a window clips every span"),
    pytest.param({}, {"team-a"}, TEAM_A, id="one team's leases, the cluster's idle"),
])
def test_two_node_types_with_known_prices_sum_exactly(window, scope, expected):
    rep = busy().ledger().report(PRICES, now=NOW, teams=scope, **window)
    assert figures(rep) == expected
    # Rows come most expensive first, and every group adds up to the leased total.
    for g in ("workload", "team", "class"):
        costs = [r.cost for r in rep.groups[g]]
        assert costs == sorted(costs, reverse=True) and sum(costs) == rep.leased_cost
    assert rep.total_cost == expected["leased_cost"] + expected["idle_cost"]
    assert rep.unpriced == []


def test_idle_cost_is_counted_when_nothing_runs():
    led = cluster(Journal()).ledger()
    rep = led.report(PRICES, now=2 * H)
    # A: 4 GPUs x 2h x 4 = 32; B: 2 GPUs x 2h x 1.5 = 6; nothing leased.
    assert (rep.leased_cost, rep.idle_cost, rep.idle_gpu_hours) == (0.0, 38.0, 12.0)
    assert all(not rows for rows in rep.groups.values())
    assert {n.node_type: n.idle_cost for n in rep.node_types} == {"big": 32.0, "small": 6.0, UNTYPED: 0.0}
    # After B is lost (2.5h) only A idles: 4 GPUs x 0.5h x 4 more.
    assert led.report(PRICES, now=3 * H, since=2 * H).idle_cost == 4 * 1 * 4.0 + 2 * 0.5 * 1.5


def test_a_running_lease_costs_until_now_and_never_past_it():
    j = cluster(Journal()).submit("run", "team-a", "pretrain", workers=2, gpu=2).lease("run", 1800, None, ["A", "A"])
    led = j.ledger()
    # 2 workers x 2 GPUs on A (4.0): 1h at now = 1.5h, so 4 x 1h x 4 = 16; A is then full, B idles.
    rep = led.report(PRICES, now=1.5 * H)
    assert rep.row("workload", "run").cost == 16.0 and rep.row("workload", "run").gpu_hours == 4.0
    assert {n.node_type: n.idle_gpu_hours for n in rep.node_types} == {"big": 4 * 0.5, "small": 2 * 1.5, UNTYPED: 0}
    assert led.report(PRICES, now=1.5 * H, until=10 * H).leased_cost == 16.0  # until is at most now
    assert led.report(PRICES, now=1.5 * H, until=H).leased_cost == 4 * 0.5 * 4.0
    assert led.report(PRICES, now=2.5 * H).leased_cost == 4 * 2 * 4.0  # it goes on costing while it runs


def test_unpriced_node_types_count_hours_at_no_cost_and_are_named():
    j = (Journal().node(0, "C", "joined", "mystery", 2).node(0, "D", "joined", "", 1)
         .submit("x", "team-a", "eval").lease("x", 0, H, ["C"])
         .submit("y", "team-a", "eval").lease("y", 0, H, ["GONE"]))  # a node the journal never described
    rep = j.ledger().report(PRICES, now=H)
    x = rep.row("workload", "x")
    assert (x.gpu_hours, x.cost, x.unpriced_gpu_hours) == (1.0, 0.0, 1.0)
    assert (rep.leased_gpu_hours, rep.leased_cost, rep.idle_gpu_hours, rep.idle_cost) == (2.0, 0.0, 2.0, 0.0)
    assert rep.unpriced == sorted(["mystery", UNTYPED, UNKNOWN_NODE])
    assert {n.node_type: n.price for n in rep.node_types} == {"mystery": None, UNTYPED: None, UNKNOWN_NODE: None}


def test_a_cpu_node_costs_its_node_hours_unattributed():
    j = Journal().node(0, "CPU", "joined", "cpu", 0).submit("c", "team-a", "eval", gpu=0).lease("c", 0, H, ["CPU"])
    rep = j.ledger().report({"cpu": 0.5}, now=2 * H)
    assert (rep.cpu_node_cost, rep.leased_cost, rep.idle_cost, rep.total_cost) == (1.0, 0.0, 0.0, 1.0)
    assert rep.node_types[0].node_hours == 2.0 and rep.groups["workload"] == []


def test_only_named_workloads_or_the_workloads_of_an_mlflow_run():
    j = busy()
    # Drivers name their MLflow run in the journal; a sweep's slots (of every driver) name the sweep's parent run.
    j.add(10, "event", "lr-slot-0", mlflow_run_id="run-lr").add(3700, "event", "lr-slot-1", mlflow_run_id="run-lr")
    j.add(5, "event", "w1", mlflow_run_id="run-w1")
    led = j.ledger()
    rep = led.report(PRICES, now=NOW, workloads={"lr-slot-0", "lr-slot-1"})
    assert (rep.leased_cost, [r.key for r in rep.groups["sweep"]]) == (2.75, ["lr"])
    assert led.report(PRICES, now=NOW, runs={"run-lr"}).leased_cost == 2.75
    assert led.report(PRICES, now=NOW, runs={"run-w1"}).leased_cost == 5.5
    assert led.report(PRICES, now=NOW, runs={"run-w1"}, teams={"team-b"}).leased_cost == 0.0


def test_counters_accrue_by_window_and_add_up_to_the_whole():
    """What the control actor exports: spend per (team, class, node type) and idle per node type, window by window;
    the windows add up to the whole, whatever the cuts."""
    led = busy().ledger()
    whole_leased, whole_idle = led.spend(PRICES, now=NOW)
    assert whole_leased == {("team-a", "pretrain", "big"): 4.0, ("team-a", "pretrain", "small"): 1.5,
                            ("team-b", "finetune", "big"): 8.0, ("team-b", "finetune", "small"): 1.5,
                            ("team-a", "sweep", "small"): 0.75, ("team-a", "sweep", "big"): 2.0,
                            ("team-b", "eval", "big"): 2.0}
    assert whole_idle == {"big": 32.0, "small": 3.75}
    leased, idle = {}, {}
    cuts = [0, 900, 1800, 4000, 5400, 9000, 10000, NOW]
    for a, b in zip(cuts, cuts[1:]):
        part_leased, part_idle = led.spend(PRICES, now=NOW, since=a, until=b)
        for k, v in part_leased.items():
            leased[k] = leased.get(k, 0.0) + v
        for k, v in part_idle.items():
            idle[k] = idle.get(k, 0.0) + v
    assert leased == pytest.approx(whole_leased, abs=1e-9) and idle == pytest.approx(whole_idle, abs=1e-9)


def test_feeding_again_or_in_parts_changes_nothing():
    entries = busy().entries()
    once = Ledger()
    once.feed(entries)
    parts = Ledger()
    parts.feed(entries[:7])
    parts.feed(entries[:12])  # the overlap is skipped by seq
    parts.feed(entries[12:])
    parts.feed(entries)
    assert figures(parts.report(PRICES, now=NOW)) == figures(once.report(PRICES, now=NOW)) == WHOLE


def test_budgets_count_the_calendar_month_of_until():
    t0 = float(calendar.timegm((2024, 5, 31, 23, 0, 0)))
    assert month_start(t0) == calendar.timegm((2024, 5, 1, 0, 0, 0))
    assert month_start(t0 + 2 * H) == calendar.timegm((2024, 6, 1, 0, 0, 0))
    j = (Journal().node(t0 - H, "A", "joined", "big", 4)
         .submit("m", "team-a", "pretrain", gpu=4).lease("m", t0, t0 + 2 * H, ["A"]))
    led = j.ledger()
    # May 31 23:00 to June 1 01:00: 4 GPUs x 4.0 = 16 an hour; June holds one hour of it.
    rep = led.report(PRICES, now=t0 + 3 * H, budgets={"team-a": 20.0, "team-b": None}, alert_share=0.8)
    assert rep.leased_cost == 32.0
    a, b = rep.budgets
    assert (a.team, a.budget, a.spent, a.share, a.alerting) == ("team-a", 20.0, 16.0, 0.8, True)
    assert (b.team, b.budget, b.spent, b.share, b.alerting) == ("team-b", None, 0.0, None, False)
    may = led.report(PRICES, now=t0 + 3 * H, until=t0 + 0.5 * H, budgets={"team-a": 20.0}, alert_share=0.9)
    assert (may.budgets[0].spent, may.budgets[0].alerting) == (8.0, False)
    assert led.report(PRICES, now=t0 + 3 * H, teams={"team-b"}, budgets={"team-a": 20.0, "team-b": 5.0}
                      ).budgets[0].team == "team-b"


def test_a_report_survives_its_json_form():
    rep = busy().ledger().report(PRICES, now=NOW, budgets={"team-a": 100.0}, alert_share=0.5)
    d = rep.to_dict()
    assert d["total_cost"] == 19.75 + 35.75 and d["groups"]["workload"][0]["class"] == "finetune"
    assert d["budgets"][0] == {"team": "team-a", "budget": 100.0, "spent": 8.25, "alert_share": 0.5,
                               "share": 0.0825, "alerting": False}
    back = CostReport.from_dict(d)
    assert back == rep and figures(back) == WHOLE


def test_sweeps_are_named_as_the_sweep_launcher_names_slots():
    from raylane.launchers.tune import SLOT_SUFFIX

    assert sweep_of({"kind": "tune", "name": "lr-search" + SLOT_SUFFIX.format(i=12)}) == "lr-search"
    assert sweep_of({"kind": "train", "name": "x-slot-1"}) is None


# ------------------------------------------------------------------------------------------------ the policy


def local_policy() -> dict:
    return yaml.safe_load((REPO / "policies" / "local.yaml").read_text())


@pytest.mark.parametrize("where, value, allowed", [
    (("teams", "team-a", "budget"), 0, "a number > 0 (a month's budget, in the currency of prices) or null"),
    (("teams", "team-a", "budget"), "lots", "a number > 0"),
    (("budget_alert_share",), 1.5, "a share of the budget: a number > 0 and <= 1"),
    (("budget_alert_share",), 0, "a share of the budget"),
])
def test_budget_errors_name_the_field_the_value_and_what_is_allowed(where, value, allowed):
    from raylane.config.loader import load_policy_from_dict

    doc = local_policy()
    node = doc
    for k in where[:-1]:
        node = node[k]
    node[where[-1]] = value
    with pytest.raises(ValidationError) as info:
        load_policy_from_dict(doc, "policy")
    (path, got, text), = info.value.errors
    assert (path, got) == (".".join(where), value) and allowed in text


def test_budgets_are_optional_and_read_from_the_policy():
    from raylane.config.loader import load_policy, load_policy_from_dict

    doc = local_policy()
    del doc["teams"]["team-b"]["budget"]
    del doc["budget_alert_share"]
    p = load_policy_from_dict(doc, "policy")
    assert (p.teams["team-a"].budget, p.teams["team-b"].budget, p.budget_alert_share) == (200.0, None, 0.8)
    default = load_policy(REPO / "policies" / "default.yaml")
    assert all(t.budget for t in default.teams.values()) and set(default.prices) >= {"a100-8x", "h100-8x"}


# ------------------------------------------------------------------------------------------------ MLflow


def test_a_finished_run_records_its_cost_as_a_metric_and_a_tag(uri):
    from mlflow import MlflowClient

    from raylane.tracking import RunTracker

    spec = {"name": "w", "team": "team-a", "class": "pretrain", "run": {"intent": "cost", "code_version": "x"}}
    asked = []
    t = RunTracker(workload_id="w-1", spec=spec, tracking_uri=uri,
                   cost_of=lambda run_id: asked.append(run_id) or 12.345678)
    run_id = t.start()
    t.finish("SUCCEEDED")
    run = MlflowClient(tracking_uri=uri).get_run(run_id)
    assert asked == [run_id]
    assert (run.data.metrics["cost"], run.data.tags["raylane.cost"], run.info.status) == (12.345678, "12.345678",
                                                                                           "FINISHED")

    def unreachable(run_id):
        raise ConnectionError("control plane gone")

    t2 = RunTracker(workload_id="w-2", spec=spec, tracking_uri=uri, cost_of=unreachable)
    t2.start()
    t2.finish("FAILED")  # a cost it cannot have does not keep the run from ending
    run2 = MlflowClient(tracking_uri=uri).get_run(t2.run_id)
    assert run2.info.status == "FAILED" and "cost" not in run2.data.metrics


def test_spot_and_on_demand_nodes_are_reported_apart():
    """A spot node type (its nodes joined with ``spot``) and an on-demand one: the report's node types say which is
    which, and ``by_market`` sums each market's GPU-hours and cost (leased and idle)."""
    j = (Journal().add(0, "node", "@nodes", node="S", event="joined", node_type="a100-spot", gpus=4.0, reason="",
                       spot=True)
         .node(0, "D", "joined", "a100", 4)
         .submit("w", "team-a", "pretrain", gpu=2.0).lease("w", 0, H, ["S"]))
    rep = j.ledger().report({"a100-spot": 1.0, "a100": 4.0}, now=2 * H)
    assert {nt.node_type: nt.spot for nt in rep.node_types} == {"a100-spot": True, "a100": False}
    markets = rep.by_market()
    # Spot: 8 GPU-hours of capacity, 2 leased (2.0) and 6 idle (6.0); on-demand: 8 idle GPU-hours at 4.0.
    assert markets == {"spot": {"gpu_hours": 8.0, "leased_cost": 2.0, "idle_cost": 6.0, "cost": 8.0},
                       "on-demand": {"gpu_hours": 8.0, "leased_cost": 0.0, "idle_cost": 32.0, "cost": 32.0}}
    assert rep.to_dict()["by_market"] == markets
    assert CostReport.from_dict(rep.to_dict()).by_market() == markets
    from raylane.cli.cost import cost_tables

    lines = [x for x in cost_tables(rep, "team") if isinstance(x, str)]
    assert "by market: on-demand 32.00 (8.00 GPU-h); spot 8.00 (8.00 GPU-h)" in lines
    # A cluster with no spot node prints no market line.
    plain = cluster(Journal()).ledger().report(PRICES, now=4 * H)
    assert not any(x.startswith("by market") for x in cost_tables(plain, "team") if isinstance(x, str))
