"""Cost accounting on a real local Ray cluster: two GPU nodes of two node types with known prices, a gang with one
worker on each. The control actor's `cost` call agrees exactly with raylane.cost over its own journal; the lease
costs what its journal timestamps say; a member sees only their teams; `raylane cost` prints the same figures; the
cost counters and the month's spend reach Prometheus' endpoint; the MLflow run the workload named gets its cost."""
import json
import time

import pytest

ray = pytest.importorskip("ray")

from raylane.control.client import State, start_control, stop_control  # noqa: E402
from raylane.control.journal import Journal  # noqa: E402
from raylane.cost import Ledger  # noqa: E402
from raylane.errors import PermissionDeniedError  # noqa: E402
from tests.raytest import local_policy, spec, start_cluster, stop_cluster, wait_for  # noqa: E402

pytestmark = pytest.mark.ray

PRICES = {"big": 4.0, "small": 1.5}


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    cluster = start_cluster(node_types={"gpu-a": "big", "gpu-b": "small"})
    ray.init(address=cluster.address, namespace="raylane", log_to_driver=False)
    journal = str(tmp_path_factory.mktemp("journal") / "journal.db")
    policy = local_policy()
    policy["prices"] = dict(PRICES)
    policy["teams"]["team-a"]["budget"] = 1000.0
    ctl = start_control(policy, journal, tick_s=0.2)
    yield {"ctl": ctl, "journal": journal, "cluster": cluster, "policy": policy}
    stop_control()
    stop_cluster(cluster)


def journal_report(path, **kw):
    """raylane.cost over the actor's journal, read from its file."""
    j = Journal(path)
    try:
        led = Ledger()
        led.feed(j.replay())
        return led, led.report(PRICES, **kw)
    finally:
        j.close()


@pytest.fixture(scope="module")
def ended(env):
    """A 2 x 1-GPU gang of team-a, one worker on each node type, held a moment and cancelled; its MLflow run named."""
    ctl = env["ctl"]
    wid = ctl.submit(spec("costly", "team-a", "pretrain", workers=2, placement="strict-spread")).id
    wait_for(lambda: ctl.status(wid).state is State.ADMITTED, what="admission")
    ctl.event(wid, "MLflow run", mlflow_run_id="run0costly")
    wait_for(lambda: (r := ctl.cost(by="workload").row("workload", wid)) and r.cost > 0, what="a running cost")
    ctl.cancel(wid)
    return wid


def test_the_cost_call_agrees_with_the_journal_exactly(env, ended):
    ctl, wid = env["ctl"], ended
    until = time.time()
    rep = ctl.cost(until=until)
    _, pure = journal_report(env["journal"], now=until, until=until,
                               budgets={t: s.get("budget") for t, s in env["policy"]["teams"].items()},
                               alert_share=0.8)
    assert rep.to_dict() == pure.to_dict()
    # What the journal's timestamps say: one GPU on each node type from admission to cancellation.
    entries = {e.kind: e.ts for e in Journal(env["journal"]).entries_for(wid)}
    held = entries["cancelled"] - entries["admitted"]
    row = rep.row("workload", wid)
    assert row.gpu_hours == pytest.approx(2 * held / 3600, rel=1e-12)
    assert row.cost == pytest.approx(held * (4.0 + 1.5) / 3600, rel=1e-12)
    assert {n.node_type for n in rep.node_types if n.capacity_gpu_hours} == {"big", "small"}
    # Each node is present from its `joined` entry on: its GPUs' time, less what the gang held, idled.
    joined = {e.data["node"]: (e.ts, e.data["gpus"]) for e in Journal(env["journal"]).replay()
              if e.kind == "node" and e.data["event"] == "joined"}
    assert sorted(g for _, g in joined.values()) == [0, 2, 2]
    capacity = sum(g * (until - ts) for ts, g in joined.values()) / 3600
    assert rep.idle_gpu_hours == pytest.approx(capacity - row.gpu_hours, rel=1e-9)
    assert rep.unpriced == [] and rep.budgets[0].team == "team-a" and rep.budgets[0].spent == row.cost


def test_a_member_sees_their_teams_and_is_refused_another(env, ended):
    ctl, wid = env["ctl"], ended
    bob = ctl.as_user(ctl.token_create("bob", ["team-b"])["token"])
    alice = ctl.as_user(ctl.token_create("alice", ["team-a"])["token"])
    until = time.time()
    ops, theirs, hers = (c.cost(until=until) for c in (ctl, bob, alice))
    assert theirs.teams == ["team-b"] and theirs.row("workload", wid) is None and theirs.leased_cost == 0
    assert theirs.idle_cost == ops.idle_cost  # idle GPUs are nobody's: everyone sees the cluster's
    assert hers.row("workload", wid) == ops.row("workload", wid) and [b.team for b in hers.budgets] == ["team-a"]
    with pytest.raises(PermissionDeniedError, match="cost-read: refused for bob"):
        bob.cost(team="team-a")
    assert [r["outcome"] for r in ctl.audit(user="bob") if r["action"] == "cost"] == ["refused"]


def test_the_cli_prints_the_same_figures(env, ended, monkeypatch):
    from typer.testing import CliRunner

    from raylane.cli import app

    monkeypatch.setenv("RAY_ADDRESS", env["cluster"].address)
    token = env["ctl"].credential.token
    r = CliRunner().invoke(app, ["cost", "--by", "workload", "--json"], env={"RAYLANE_TOKEN": token})
    assert r.exit_code == 0, r.output
    shown = json.loads(r.output)
    row = next(x for x in shown["groups"]["workload"] if x["key"] == ended)
    assert row["cost"] == env["ctl"].cost().row("workload", ended).cost  # the lease has ended: fixed
    r = CliRunner().invoke(app, ["cost", "--by", "workload", "--since", "1h"], env={"RAYLANE_TOKEN": token})
    assert r.exit_code == 0, r.output
    line = next(x for x in r.output.splitlines() if ended in x)
    assert f"{row['cost']:,.2f}" in line and "team-a" in line and "pretrain" in line
    assert "big" in r.output and "small" in r.output and "total: leased" in r.output
    r = CliRunner().invoke(app, ["cost", "--by", "node"], env={"RAYLANE_TOKEN": token})
    assert r.exit_code == 1 and "--by: got 'node'; one of workload, sweep, pipeline, team, class" in r.output


def test_cost_counters_and_the_months_spend_reach_prometheus(env, ended):
    import urllib.request

    cost = env["ctl"].cost().row("workload", ended).cost
    ports = {n["MetricsExportPort"] for n in ray.nodes() if n["Alive"]}

    def scrape():
        lines = []
        for port in ports:
            try:
                lines += urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode().splitlines()
            except OSError:
                pass
        value = {}
        for l in lines:
            if 'team="team-a"' in l and l.startswith(("ray_raylane_team_spend{", "ray_raylane_cost_total{",
                                                       "ray_raylane_team_budget{")):
                name = l.split("{")[0] + ("" if "node_type" not in l else l.split('node_type="')[1].split('"')[0])
                name += "" if "what=" not in l else l.split('what="')[1].split('"')[0]
                value[name] = float(l.rsplit(" ", 1)[1])
        spent = value.get("ray_raylane_team_spend", 0.0)
        return spent == pytest.approx(cost, rel=1e-6) and value
    value = wait_for(scrape, timeout=60, every=1.0, what="team-a's spend on /metrics")
    assert value["ray_raylane_cost_totalbig"] + value["ray_raylane_cost_totalsmall"] == pytest.approx(cost, rel=1e-6)
    assert value["ray_raylane_cost_totalbig"] == pytest.approx(cost * 4.0 / 5.5, rel=1e-6)
    assert (value["ray_raylane_team_budgetmonthly"], value["ray_raylane_team_budgetalert"]) == (1000.0, 800.0)


def test_the_workloads_mlflow_run_gets_its_cost(env, ended, uri):
    from mlflow import MlflowClient

    from raylane.tracking import RunTracker

    ctl = env["ctl"]
    assert ctl.run_cost("run0costly") == ctl.cost().row("workload", ended).cost
    t = RunTracker(workload_id=ended, spec=spec("costly", "team-a", "pretrain"), tracking_uri=uri,
                   cost_of=lambda run_id: ctl.run_cost("run0costly"))
    t.start()
    t.finish("CANCELLED")
    run = MlflowClient(tracking_uri=uri).get_run(t.run_id)
    assert run.data.metrics["cost"] == ctl.cost().row("workload", ended).cost
    assert run.data.tags["raylane.cost"] == f"{run.data.metrics['cost']:.6f}" and run.info.status == "KILLED"
